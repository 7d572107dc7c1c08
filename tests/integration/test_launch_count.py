"""One CUDA kernel per call (issue 32): after a warm-up, ONE call of each public entry point launches
exactly one kernel on the device, for every cache layout, both sources of the new tokens' K/V, with and
without ``return_lse``, and for the kernels that dtype, head size and page pick; no memcpy/memset and
no cudaMalloc either.

Counted with torch.profiler (CUDA activity): device events that are kernels; memcpy/memset and cudaMalloc
calls separately. The first test checks the counting itself on a plain torch op. GPU only (the
interpreter launches nothing); the classifier has a CPU test on made-up events.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from paged_cases import make_case

import prefix_prefill
import window_prefill

_MEMOP_TYPES = ("gpu_memcpy", "gpu_memset")
_NOT_KERNEL_TYPES = ("gpu_user_annotation", "overhead", "external_correlation", "cpu_instant_event")
_MALLOC_APIS = (
    "cudaMalloc",
    "cudaMallocAsync",
    "cuMemAlloc",
    "cuMemAlloc_v2",
    "cuMemAllocAsync",
    "hipMalloc",
)


def classify(events) -> SimpleNamespace:
    """Kernels (names), memcpy/memset count and cudaMalloc-like calls among torch.profiler events."""
    kernels, memops, mallocs = [], 0, 0
    for e in events:
        name = str(e.name)
        act = str(getattr(e, "activity_type", None) or "").lower()
        if str(getattr(e, "device_type", "")).split(".")[-1] in ("CUDA", "PrivateUse1"):
            if act in _MEMOP_TYPES or name.lower().startswith(("memcpy", "memset")):
                memops += 1
            elif act not in _NOT_KERNEL_TYPES:
                kernels.append(name)
        elif name in _MALLOC_APIS:
            mallocs += 1
    return SimpleNamespace(kernels=kernels, memops=memops, mallocs=mallocs)


def profile_one_call(fn) -> SimpleNamespace:
    """``fn`` twice (compiles, first-launch work), prefix-prefill's background compiles finished, once
    more, then ONE call under the profiler."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    finish = getattr(prefix_prefill, "finish_compiles", None)
    if finish is not None:
        finish()
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return classify(prof.events())


def assert_one_launch(fn) -> None:
    r = profile_one_call(fn)
    assert len(r.kernels) == 1 and r.memops == 0, (
        f"{len(r.kernels)} kernels {r.kernels}, {r.memops} memcpy/memset"
    )
    assert r.mallocs == 0, f"{r.mallocs} cudaMalloc calls in a warm call"


# --------------------------------------------------------------------------------------- problems
SEQS = [(40, 24), (0, 9), (77, 1)]  # a context chunk, a prompt, a decode step


def _prefix_case(layout: str, kv: str, dtype=torch.bfloat16, head: int = 128, page: int = 16, **kw):
    return make_case(
        SEQS, num_heads=8, num_kv_heads=2, head_size=head, page=page, dtype=dtype, device="cuda",
        layout=layout, kv_from_cache=kv == "cache", gen=torch.Generator().manual_seed(3), **kw,
    )  # fmt: skip


def _pp_call(c, *, return_lse=False, **kw):
    """prefix_prefill's default path: out allocated, lse allocated when asked for."""
    return lambda: prefix_prefill.prefix_prefill(
        c.q, c.k, c.v, c.k_cache, c.v_cache, c.block_table, c.cu_seqlens_q, c.seq_lens, c.max_query_len,
        kv_layout=c.layout, return_lse=return_lse, **kw,
    )  # fmt: skip


def _dense(dtype=torch.bfloat16, head: int = 128, heads: int = 8, kv_heads: int = 2):
    lens = [37, 64, 5]
    g = torch.Generator().manual_seed(5)
    t = sum(lens)
    q, k, v = (torch.randn(t, h, head, generator=g).to("cuda", dtype) for h in (heads, kv_heads, kv_heads))
    cu = torch.tensor([0, 37, 101, 106], dtype=torch.int32, device="cuda")
    return SimpleNamespace(q=q, k=k, v=v, cu=cu, lens=cu.diff(), starts=cu[:-1], max_len=max(lens))


# ------------------------------------------------------------------------------------------ tests
def test_classify_made_up_events():
    """CPU: the classifier on events shaped like torch.profiler's (device type, activity type, name)."""

    def ev(name, dev, act):
        return SimpleNamespace(name=name, device_type=f"DeviceType.{dev}", activity_type=act)

    events = [
        ev("_fwd_kernel", "CUDA", "kernel"),
        ev("Memcpy HtoD (Pageable -> Device)", "CUDA", "gpu_memcpy"),
        ev("Memset (Device)", "CUDA", "gpu_memset"),
        ev("prefix_prefill::fwd", "CUDA", "gpu_user_annotation"),
        ev("cudaMalloc", "CPU", "cuda_runtime"),
        ev("cudaLaunchKernel", "CPU", "cuda_runtime"),
        ev("aten::empty", "CPU", "cpu_op"),
        ev("void at::native::vectorized_elementwise_kernel<...>", "CUDA", None),  # no activity type known
    ]
    r = classify(events)
    assert r.kernels == ["_fwd_kernel", "void at::native::vectorized_elementwise_kernel<...>"]
    assert (r.memops, r.mallocs) == (2, 1)


@pytest.mark.gpu
def test_counting_sees_one_torch_kernel():
    """The counting itself: an in-place add is one kernel; a copy to the host is a memcpy, no kernel."""
    x = torch.ones(1024, device="cuda")
    r = profile_one_call(lambda: x.add_(1))
    assert len(r.kernels) == 1 and r.memops == 0, r
    r = profile_one_call(lambda: x.to("cpu"))
    assert r.kernels == [] and r.memops == 1, r


@pytest.mark.gpu
@pytest.mark.parametrize("return_lse", [False, True], ids=["out", "lse"])
@pytest.mark.parametrize("kv", ["given", "cache"])
@pytest.mark.parametrize("layout", ["split", "nhd", "hnd"])
def test_prefix_prefill_one_launch(layout, kv, return_lse):
    assert_one_launch(_pp_call(_prefix_case(layout, kv), return_lse=return_lse))


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["given", "cache"])
@pytest.mark.parametrize("skip_decode", [False, True], ids=["all", "skip_decode"])
def test_prefix_context_attention_fwd_one_launch(kv, skip_decode):
    """vLLM's form on vLLM's split cache, with the 1-element scale tensors vLLM passes."""
    c = _prefix_case("split", kv)
    o = torch.empty_like(c.q)
    one = torch.ones(1, dtype=torch.float32, device="cuda")
    max_seq = int(c.seq_lens.max())
    args = (
        c.q, c.k, c.v, o, "auto", c.k_cache, c.v_cache, c.block_table, c.cu_seqlens_q, c.seq_lens, max_seq,
        c.max_query_len, one, one,
    )  # fmt: skip
    assert_one_launch(lambda: prefix_prefill.context_attention_fwd(*args, skip_decode=skip_decode))


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["split", "nhd"])
@pytest.mark.parametrize(
    "dtype, head, page",
    [
        (torch.float16, 64, 16),
        (torch.bfloat16, 256, 544),
        (torch.bfloat16, 128, 1056),
        (torch.float32, 128, 16),
    ],
    ids=["fp16-d64-p16", "bf16-d256-p544", "bf16-d128-p1056", "fp32-d128-p16"],
)
def test_prefix_prefill_kernels_one_launch(layout, dtype, head, page):
    """The kernels dtype, head size and page choose (Gluon on sm90 for 16-bit, Triton else)."""
    assert_one_launch(_pp_call(_prefix_case(layout, "given", dtype, head, page)))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "option",
    ["non_causal", "window", "softcap", "sinks", "alibi", "fp8_tensor_scales", "fp8_float_scales"],
)
def test_prefix_prefill_options_one_launch(option):
    """Options route to other kernels or forms; each call is still one launch, but a bfloat16 call over an
    fp8 cache on a Gluon kernel: two, the float16 copies of q, k and v (``prefix_prefill.float16_copies``,
    one launch) and the kernel."""
    kw: dict = {}
    case_kw: dict = {}
    if option == "non_causal":
        kw["causal"] = False
    elif option == "window":
        kw["window"] = (31, -1)
    elif option == "softcap":
        kw["softcap"] = 20.0
    elif option == "sinks":
        kw["sinks"] = torch.randn(8, device="cuda")
    elif option == "alibi":
        kw["alibi_slopes"] = torch.rand(8, device="cuda")
    else:
        case_kw["cache_dtype"] = torch.float8_e4m3fn
        if option == "fp8_tensor_scales":
            kw["k_scale"] = torch.full((1,), 0.5, device="cuda")
            kw["v_scale"] = torch.full((1,), 1.5, device="cuda")
        else:
            kw["k_scale"], kw["v_scale"] = 0.5, 1.5
    case = _prefix_case("nhd", "given", **case_kw)
    chosen = prefix_prefill.explain(case.q, case.k, case.v, case.k_cache, case.v_cache, case.block_table,
                                    case.cu_seqlens_q, case.seq_lens, case.max_query_len, **kw)  # fmt: skip
    if not (case_kw and chosen.kernel.startswith("gluon") and case.q.dtype == torch.bfloat16):
        assert_one_launch(_pp_call(case, **kw))
        return
    r = profile_one_call(_pp_call(case, **kw))
    assert len(r.kernels) == 2 and r.memops == 0 and r.mallocs == 0, r
    assert sum("float16_copies" in k for k in r.kernels) == 1, r.kernels


@pytest.mark.gpu
@pytest.mark.parametrize("return_lse", [False, True], ids=["out", "lse"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_window_prefill_one_launch(causal, return_lse):
    p = _dense()
    assert_one_launch(
        lambda: window_prefill.window_prefill(
            p.q, p.k, p.v, p.cu, p.max_len, causal=causal, return_lse=return_lse
        )
    )


@pytest.mark.gpu
@pytest.mark.parametrize(
    "dtype, head, causal, window",
    [(torch.float16, 64, True, (-1, -1)), (torch.bfloat16, 256, True, (-1, -1)),
     (torch.float32, 128, True, (-1, -1)), (torch.bfloat16, 128, True, (16, -1)),
     (torch.bfloat16, 64, False, (8, 8))],
    ids=["fp16-d64", "bf16-d256", "fp32-d128", "bf16-d128-window16", "bf16-d64-band8"],
)  # fmt: skip
def test_window_prefill_kernels_one_launch(dtype, head, causal, window):
    """The kernels dtype, head size and window choose (Gluon on sm90 for 16-bit, Triton else)."""
    p = _dense(dtype, head)
    assert_one_launch(
        lambda: window_prefill.window_prefill(p.q, p.k, p.v, p.cu, p.max_len, causal=causal, window=window)
    )


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_window_context_attention_fwd_one_launch(causal):
    """vLLM's form, ``b_start_loc`` ``[batch]`` as vLLM passes it."""
    p = _dense()
    o = torch.empty_like(p.q)
    assert_one_launch(
        lambda: window_prefill.context_attention_fwd(p.q, p.k, p.v, o, p.starts, p.lens, p.max_len, causal)
    )


@pytest.mark.gpu
def test_vision_shape_one_launch():
    """The vision-encoder form: equal lengths, non-causal, 16 heads of 64, MHA."""
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(4 * 256, 16, 64, generator=g).to("cuda", torch.bfloat16) for _ in range(3))
    cu = torch.arange(0, 4 * 256 + 1, 256, dtype=torch.int32, device="cuda")
    assert_one_launch(lambda: window_prefill.window_prefill(q, k, v, cu, 256, causal=False))
