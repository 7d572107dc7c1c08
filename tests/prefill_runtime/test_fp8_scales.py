"""``prefill_runtime.fp8``'s scale arguments as the kernels read them: a ``[1]`` tensor passes as itself (a
warm call makes no view of it), other one-element tensors as ``[1]`` views, floats as cached float32
tensors; bad scales are refused."""

import pytest
import torch

from prefill_runtime.fp8 import scale_of, scale_tensor


def test_one_element_tensor_passes_as_itself():
    s = torch.tensor([0.5])
    assert scale_of(s, "k_scale", s.device) is s
    assert scale_tensor(s, "k_scale", s.device) is s


@pytest.mark.parametrize("shape", [(), (1, 1), (1, 1, 1)])
def test_other_one_element_shapes_become_views(shape):
    s = torch.full(shape, 0.25)
    got = scale_of(s, "v_scale", s.device)
    assert got.shape == (1,) and got.data_ptr() == s.data_ptr() and got.item() == 0.25


def test_float_scales_are_cached_tensors():
    dev = torch.device("cpu")
    a, b = scale_of(0.125, "k_scale", dev), scale_of(0.125, "k_scale", dev)
    assert a is b and a.dtype == torch.float32 and a.shape == (1,) and a.item() == 0.125
    assert scale_of(None, "k_scale", dev).item() == 1.0


@pytest.mark.parametrize(
    ("value", "error"),
    [(torch.ones(2), ValueError), (torch.ones(1, dtype=torch.int32), TypeError), (0.0, ValueError),
     (float("inf"), ValueError), (-1.0, ValueError), ("1", TypeError), (True, TypeError)],
)  # fmt: skip
def test_bad_scales_are_refused(value, error):
    with pytest.raises(error, match="k_scale"):
        scale_of(value, "k_scale", torch.device("cpu"))
