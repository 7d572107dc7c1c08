"""prefill_runtime.gluon_host: what the Gluon kernels need of a call, their TMA descriptors, and a
launch that falls back to the Triton kernel."""

from __future__ import annotations

import pytest
import torch

import prefill_runtime


def test_gluon_applies():
    """The conditions both Gluon kernels share: sm90, 16-bit, head 64/128/256, a positive scale or
    soft-capping; each one alone turns the answer to False. Sinks and soft-capping are taken."""
    q = torch.empty(8, 2, 128, dtype=torch.bfloat16)
    ok = dict(sinks=None, softcap=0.0, scale=0.1)
    assert prefill_runtime.gluon_applies(q, "sm90", **ok)
    assert not prefill_runtime.gluon_applies(q, "sm80", **ok)
    assert not prefill_runtime.gluon_applies(q, "interpreter", **ok)
    assert not prefill_runtime.gluon_applies(q.float(), "sm90", **ok)
    assert not prefill_runtime.gluon_applies(torch.empty(8, 2, 96, dtype=torch.float16), "sm90", **ok)
    assert prefill_runtime.gluon_applies(q, "sm90", **{**ok, "sinks": torch.zeros(2)})
    assert prefill_runtime.gluon_applies(q, "sm90", **{**ok, "softcap": 30.0})
    assert not prefill_runtime.gluon_applies(q, "sm90", **{**ok, "scale": 0.0})
    assert prefill_runtime.gluon_applies(q, "sm90", **{**ok, "scale": 0.0, "softcap": 30.0})


def test_gluon_token_rows_and_descriptor():
    """TMA descriptors of the Gluon kernels: ``[tokens, heads, D]`` seen as ``[tokens, heads * D]``; None
    for strides TMA cannot take (heads not D apart, a feature stride, unaligned rows)."""
    try:
        import triton.experimental.gluon.nvidia.hopper  # noqa: F401
    except Exception:
        pytest.skip("this Triton has no Gluon")
    packed = torch.randn(10, 6, 64, dtype=torch.float16)  # q, k, v heads of one packed tensor
    q = packed[:, :4]
    d = prefill_runtime.gluon_token_rows(q, 64)
    assert (
        list(d.shape) == [10, 4 * 64] and list(d.strides) == [6 * 64, 1] and list(d.block_shape) == [64, 64]
    )
    assert d.layout.swizzle_byte_width == 128 and d.base is q
    assert (
        prefill_runtime.gluon_token_rows(torch.randn(10, 2, 128, dtype=torch.bfloat16)[:, :, :64], 64) is None
    )
    assert (
        prefill_runtime.gluon_token_rows(torch.randn(10, 2, 64, 2, dtype=torch.float16)[..., 0], 64) is None
    )
    assert prefill_runtime.gluon_token_rows(torch.randn(10, 1, 36, dtype=torch.float16)[:, :, :4], 16) is None
    cache = torch.randn(5, 16, 2, 128, dtype=torch.bfloat16)
    c = prefill_runtime.gluon_descriptor(cache, [5 * 16, 2 * 128], 2 * 128, 16, 128)
    assert list(c.shape) == [80, 256] and list(c.block_shape) == [16, 128]
    flat = prefill_runtime.gluon_descriptor(cache, [5 * 16, 2 * 128], 2 * 128, 8, 64, swizzle=False)
    assert flat.layout.swizzle_byte_width == 0 and list(flat.block_shape) == [8, 64]


def test_gluon_try_launch():
    """A launch that raises: False and one RuntimeWarning naming the package (the caller then runs its
    Triton kernel); one that runs: True."""
    ran = []
    assert prefill_runtime.gluon_try_launch(lambda: ran.append(1), "pkg") is True and ran == [1]

    def boom():
        raise RuntimeError("no such Gluon op")

    with pytest.warns(RuntimeWarning, match="pkg: the Gluon kernel failed"):
        assert prefill_runtime.gluon_try_launch(boom, "pkg") is False


def test_tile_counter_off_cuda():
    """A persistent launch's tile counter: none for the CPU tests' stand-in kernels (device index -1)."""
    from prefill_runtime.gluon_host import tile_counter

    assert tile_counter(-1) is None
    assert tile_counter(-1, 12345) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_tile_counter_one_a_stream():
    """One int32 ``[2]`` zero counter a (device, stream), the same tensor on every call there."""
    from prefill_runtime.gluon_host import tile_counter

    index = torch.cuda.current_device()
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    a, b = tile_counter(index, s1.cuda_stream), tile_counter(index, s2.cuda_stream)
    assert a is not b and a is tile_counter(index, s1.cuda_stream)
    assert a.dtype == torch.int32 and a.shape == (2,) and a.tolist() == [0, 0]
    with torch.cuda.stream(s2):
        assert tile_counter(index) is b
