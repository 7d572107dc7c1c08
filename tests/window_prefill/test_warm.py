"""window-prefill's warm calls on the CPU: a call signature seen before skips the full checks and, once
its variant launches directly, launches through a frame (:class:`prefill_runtime.compiled_launch.Frame`)
that hands the C launcher exactly what the generic direct launch would; the per-call checks a warm call
still runs raise as the full checks do. The kernel is a stand-in (``launch_stubs``): these tests check
the launch arguments, not the attention (the correctness tests do)."""

from __future__ import annotations

import pytest
import torch
from conftest import ON_GPU
from launch_stubs import Jit, fake_raw_launchers, pointers
from wp_util import make_qkv

import prefill_runtime.compiled_launch as cl
import window_prefill.api as wp_api
import window_prefill.launch as wp_launch
from prefill_runtime.signatures import Seen
from window_prefill import context_attention_fwd, window_prefill

# (CPU tensors through the public API: the interpreter's machines; on a GPU the real frames are tested by
# tests/hardening/test_direct_launch.py)
pytestmark = pytest.mark.skipif(ON_GPU, reason="stand-in kernels on CPU tensors (the interpreter)")


@pytest.fixture
def stub_triton(monkeypatch):
    """The Triton kernel replaced by a stand-in launched directly, the signature table empty."""
    jit = Jit(wp_launch._fwd_kernel.arg_names)
    fake_raw_launchers(monkeypatch, jit)
    monkeypatch.setattr(wp_launch, "_fwd_kernel", jit)
    monkeypatch.setattr(wp_launch, "_TRITON", cl.CompiledLaunches(jit))
    monkeypatch.setattr(wp_launch, "_gluon_ok", False)
    monkeypatch.setattr(wp_api, "SEEN", Seen())
    return jit


def _generic(prep, q, k, v, out, cu, max_len, status=None, alibi_slopes=None, out_scale=None) -> None:
    """``prep``'s call launched as forward() launches it (the direct launch without a frame)."""
    wp_launch._run(prep.plan, prep.kw, q, k, v, out, cu, None, max_len, cu.shape[0] - 1, prep.window_left,
                   prep.window_right, prep.softmax_scale, None, prep.softcap, None, status,
                   alibi_slopes, out_scale)  # fmt: skip


def test_frame_call_is_the_generic_launch(stub_triton):
    """Calls of one signature with new lengths, batches and token counts: after the first (through
    Triton) and the second (direct, making the frame), each is a frame's call whose C arguments are
    the generic launch's; a signature that differs only in the scale or the window gets its own frame, and
    one with a ``status=`` tensor its own variant (whose frame passes each call's status)."""
    c_calls = stub_triton.compiled.run.c_calls
    for lens, scale, window, st in (([100], 0.1, (31, -1), None), ([7, 1, 200], 0.1, (31, -1), None),
                                    ([3], 0.2, (31, -1), None), ([50, 60], 0.1, (15, -1), None),
                                    ([9, 90, 1, 33], 0.1, (31, -1), None),
                                    ([5, 8], 0.1, (31, -1), torch.zeros(1, dtype=torch.int32)),
                                    ([40], 0.1, (31, -1), torch.zeros(1, dtype=torch.int32))):  # fmt: skip
        q, k, v, cu = make_qkv(lens, 4, 2, 64, torch.float16, "cpu")
        out = torch.empty_like(q)
        for _ in range(3):
            window_prefill(q, k, v, cu, max(lens), window=window, softmax_scale=scale, out=out, status=st)
        framed = c_calls[-1]
        assert not any(isinstance(x, torch.Tensor) for x in framed)  # a frame's call: pointers only
        assert st is None or st.data_ptr() in framed
        signature = (scale, window[0], st is not None)  # (a key's ninth tensor spec: the status)
        (prep,) = [
            p for p in wp_api.SEEN.entries.values()
            if (p.softmax_scale, p.window_left, p.key[-2][8] is not None) == signature
        ]  # fmt: skip
        _generic(prep, q, k, v, out, cu, max(lens), st)
        assert framed == pointers(c_calls[-1]), (lens, scale, window)
    assert len(stub_triton.triton_calls) == 2  # two compiles (with and without status): the rest direct
    assert len(wp_launch._TRITON._frames) == 4  # one frame per (variant, scale, window)


def _frames_take_each_calls(stub_triton, q, k, v, cu, out, arg: str, make) -> None:
    """Four calls of one signature, each passing a new tensor ``make(step)`` as ``arg``: from the third on,
    a frame's call (pointers only) holding that tensor's pointer, whose C arguments are the generic
    launch's (the tensor passed to it as the launch's ``alibi_slopes`` / ``out_scale``)."""
    c_calls = stub_triton.compiled.run.c_calls
    launch_arg = {"alibi_slopes": "alibi_slopes", "fp8_out_scale": "out_scale"}[arg]
    for step in range(4):
        t = make(step)
        window_prefill(q, k, v, cu, 30, window=(15, -1), out=out, **{arg: t})
        if step >= 2:
            framed = c_calls[-1]
            assert not any(isinstance(x, torch.Tensor) for x in framed)
            assert t.data_ptr() in framed
            (prep,) = wp_api.SEEN.entries.values()
            _generic(prep, q, k, v, out, cu, 30, **{launch_arg: t})
            assert framed == pointers(c_calls[-1])


def test_frame_takes_each_calls_slopes(stub_triton):
    """Warm calls with ALiBi slopes: a frame's call passes each call's own slopes tensor (a per-call slot,
    as the sinks'), and its C arguments are the generic launch's."""
    q, k, v, cu = make_qkv([30, 7], 4, 2, 64, torch.float16, "cpu")
    _frames_take_each_calls(stub_triton, q, k, v, cu, torch.empty_like(q), "alibi_slopes",
                            lambda step: torch.rand(4) * (step + 1))  # fmt: skip
    assert len(stub_triton.triton_calls) == 1


def test_frame_takes_each_calls_fp8_out_scale(stub_triton):
    """Warm calls with an fp8 output: a frame's call passes each call's own scale tensor (a per-call slot),
    and its C arguments are the generic launch's; a float scale's tensor is made once (the same pointer
    each call)."""
    c_calls = stub_triton.compiled.run.c_calls
    q, k, v, cu = make_qkv([30, 7], 4, 2, 64, torch.float16, "cpu")
    out = torch.empty(q.shape, dtype=torch.float8_e4m3fn)
    _frames_take_each_calls(stub_triton, q, k, v, cu, out, "fp8_out_scale", lambda step: torch.rand(1) + step)
    floats = set()
    for step in range(4):  # a new signature (the float is part of it), then its frame's calls
        window_prefill(q, k, v, cu, 30, window=(15, -1), out=out, fp8_out_scale=0.75)
        if step >= 1:
            floats.add(tuple(c_calls[-1]))
    assert len(floats) == 1 and len(stub_triton.triton_calls) == 1  # one variant for both forms


def test_warm_calls_check_what_the_signature_leaves_open(stub_triton):
    """A warm call (its signature seen before) still rejects what the signature does not fix: token counts
    that differ, ``b_start_loc`` and ``b_seq_len`` of different lengths, a ``max_input_len`` that is not an
    int, with the full checks' errors."""
    q, k, v, cu = make_qkv([20, 12], 4, 2, 64, torch.float16, "cpu")
    o = torch.empty_like(q)
    starts, lens = cu[:-1].clone(), (cu[1:] - cu[:-1]).clone()
    for _ in range(3):
        context_attention_fwd(q, k, v, o, starts, lens, 20)
        window_prefill(q, k, v, cu, 20, out=o)
    assert len(wp_api.SEEN) == 2
    with pytest.raises(ValueError, match="b_start_loc and b_seq_len"):
        context_attention_fwd(q, k, v, o, starts[:1].clone(), lens, 20)
    with pytest.raises(ValueError, match="tokens"):
        context_attention_fwd(q, k[:5], v[:5], o, starts, lens, 20)
    with pytest.raises(ValueError, match="tokens"):
        window_prefill(q, k[:5], v[:5], cu, 20, out=o)
    with pytest.raises(TypeError, match="max_input_len"):
        context_attention_fwd(q, k, v, o, starts, lens, 20.0)
    with pytest.raises(ValueError, match="out"):
        window_prefill(q, k, v, cu, 20, out=o[:5])
