"""The warp-specialised Gluon kernel (window_prefill.gluon_kernel) and how a planned Gluon launch runs.

On the CPU: a call planned for the Gluon kernel (the launcher believing it runs on sm90) is offered
to it with the call's own window, form and LSE buffer, and its Triton fallback answers when it does
not launch; a Triton whose Gluon cannot launch the kernel warns once and runs the Triton kernel from
then on; the kernel compiles for sm90 with the installed Triton (offline, ``GPUTarget("cuda", 90,
32)``) within the shared memory of one H100/H200 program. Which calls are planned for it is
test_plan.py's. On an sm90 GPU: the kernel against the float64 reference (ragged batches, windows,
GQA, both 16-bit dtypes, heads 64, 128 and 256, LSE, strided views, the vLLM form, CUDA-graph
capture) into NaN-poisoned buffers, with a count proving it ran; the skipping proof with NaN at every
position a tile may not see; a negative control (a wrong mask is caught); no recompiles when lengths
change; and the Triton kernel where the Gluon one does not apply. Sinks and soft-capping:
test_gluon_features.py.
"""

from __future__ import annotations

import pytest
import torch
from conftest import compile_gluon_for_sm90, compiled_variants, needs_sm90, poison
from wp_util import (
    WP_COMPILE_HEAD,
    any_width_is_wide,
    check_graph_replay,
    count_gluon_launches,
    make_qkv,
    reference,
    refuse_gluon,
    run,
    tile_key_range,
)

import window_prefill.launch as wl
from attn_reference import compare
from window_prefill import context_attention_fwd, explain, window_prefill
from window_prefill.configs import Config

GLUON_CONFIG = Config(128, 128, 8, 3, True, True)  # asks for the Gluon kernel at any head 64/128/256


@pytest.fixture
def gluon_launches(monkeypatch):
    """Launches the Gluon kernel took (``wp_util.count_gluon_launches``), every window counting as
    wide (``wp_util.any_width_is_wide``)."""
    any_width_is_wide(monkeypatch)
    return count_gluon_launches(monkeypatch)


# ------------------------------------------------------------------------- CPU: the planned launch
def test_gluon_plan_is_offered_then_falls_back(monkeypatch):
    """A call whose plan names the Gluon kernel goes to ``launch._launch_gluon`` with that plan (the
    call's window flags, form and LSE in its constexprs); when it does not launch, the plan's Triton
    fallback writes the right answer. Narrow windows never reach it."""
    offered = refuse_gluon(monkeypatch)
    any_width_is_wide(monkeypatch, 24)  # the test sequences are short
    q, k, v, cu = make_qkv([30, 9], 2, 1, 64, torch.float16)
    out = run(q, k, v, cu, 30, causal=True, window=(40, -1))  # 30 keys visible: Gluon planned
    assert compare(out, reference(q, k, v, cu, causal=True, window=(40, -1)))
    assert len(offered) == 1 and offered[0].kernel == "gluon"
    consts = offered[0].consts()
    assert consts["HAS_LEFT"] and not consts["HAS_RIGHT"] and consts["IS_CAUSAL"] and not consts["RETURN_LSE"]
    assert offered[0].get("fallback").kernel == "triton"
    run(q, k, v, cu, 30, causal=True, window=(10, -1))  # 11 keys: Triton planned
    assert len(offered) == 1
    res = window_prefill(q, k, v, cu, 30, causal=False, window=(-1, -1), return_lse=True)
    assert len(offered) == 2 and offered[1].consts()["RETURN_LSE"] and not offered[1].consts()["IS_CAUSAL"]
    assert compare(res[0], reference(q, k, v, cu, causal=False))
    o = poison(torch.empty_like(q))
    context_attention_fwd(q, k, v, o, cu[:-1], cu.diff(), 30, True, sliding_window_q=40)
    assert len(offered) == 3 and offered[2].consts()["LENS_FROM_STARTS"] is False
    assert compare(o, reference(q, k, v, cu, causal=True, window=(40, -1)))


def test_gluon_launch_failure_falls_back_for_good(monkeypatch):
    """A Triton whose Gluon cannot launch the kernel: the call warns once and runs the Triton fallback
    (right answer); later calls plan the Triton kernel directly (``Problem.gluon`` is False)."""

    class Broken:
        def __getitem__(self, grid):
            raise RuntimeError("this Triton cannot build the kernel")

    monkeypatch.setattr(wl, "detect_arch", lambda device: "sm90")
    monkeypatch.setattr(wl, "_gluon_ok", True)
    monkeypatch.setenv("PREFILL_GLUON", "1")  # (offered outside the Triton allowlist too)
    monkeypatch.setattr(wl, "_gluon_fwd_kernel", Broken())
    any_width_is_wide(monkeypatch, 24)
    q, k, v, cu = make_qkv([30, 9], 2, 1, 64, torch.float16)
    assert explain(q, k, v, cu, 30).kernel == "gluon"
    with pytest.warns(RuntimeWarning, match="Gluon kernel failed"):
        out = run(q, k, v, cu, 30)
    assert compare(out, reference(q, k, v, cu))
    assert wl._gluon_ok is False
    p = explain(q, k, v, cu, 30)
    assert p.kernel == "triton" and "no Gluon kernel" in p.reason


_COMPILE_SCRIPT = """
for head_dim, lse in ((128, False), (64, True), (256, False)):
    compile_wp(head_dim, lse, IS_CAUSAL=True, HAS_LEFT=True, HAS_RIGHT=False)
"""


def test_gluon_kernel_compiles_for_sm90():
    """The kernel compiles for sm90 with the installed Triton (no GPU needed) in one program's shared
    memory (227 KiB), for the three head sizes, with and without the LSE and a status tensor, in the
    ``cu_seqlens`` and ``(starts, lens)`` forms."""
    if wl._gluon_fwd_kernel is None:
        pytest.skip("this Triton has no Gluon")
    shared, out = compile_gluon_for_sm90(WP_COMPILE_HEAD + _COMPILE_SCRIPT)
    assert len(shared) == 3 and max(shared) <= 227 * 1024, out


# ------------------------------------------------------------------------- GPU (sm90)
GPU_CASES = [
    # lens, heads, kv_heads, head_dim, dtype, causal, window, lse
    ([4096], 8, 2, 128, torch.bfloat16, True, (1023, -1), False),
    ([300, 1000, 77, 1], 4, 1, 128, torch.float16, True, (200, -1), True),
    ([513, 129, 128, 700], 4, 4, 64, torch.bfloat16, False, (100, 30), True),
    ([1000, 33], 6, 2, 128, torch.bfloat16, False, (-1, -1), False),
    ([1000, 257], 6, 2, 128, torch.bfloat16, True, (-1, -1), True),
    ([900, 1300], 2, 1, 128, torch.bfloat16, False, (-1, 0), False),
    ([900, 1300], 2, 1, 64, torch.float16, True, (0, -1), False),
    ([2000], 4, 2, 128, torch.bfloat16, False, (5, 250), False),
    ([127, 128, 129, 255, 256, 257], 3, 1, 128, torch.float16, True, (128, -1), True),
    ([1500, 70], 4, 2, 256, torch.bfloat16, True, (700, -1), True),
    ([600, 65, 64], 2, 1, 256, torch.float16, False, (100, 40), False),
    ([5, 3], 2, 1, 128, torch.bfloat16, True, (-1, -1), False),
]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: f"{c[0][:2]}-h{c[3]}-{str(c[4])[6:]}-w{c[6]}")
def test_gpu_gluon_matches_reference(case, gluon_launches):
    """The Gluon kernel against the reference."""
    lens, heads, kv_heads, d, dtype, causal, window, want_lse = case
    q, k, v, cu = make_qkv(lens, heads, kv_heads, d, dtype)
    out = poison(torch.empty_like(q))
    res = window_prefill(
        q,
        k,
        v,
        cu,
        max(lens),
        causal=causal,
        window=window,
        out=out,
        return_lse=want_lse,
        config=GLUON_CONFIG,
    )
    assert len(gluon_launches) == 1, "the Gluon kernel did not run"
    ref = reference(q, k, v, cu, causal=causal, window=window)
    got = res[0] if want_lse else res
    c = compare(got, ref)
    assert c, c
    if want_lse:
        from attn_reference import attention_varlen

        _, ref_lse = attention_varlen(q, k, v, cu, cu, causal=causal, window=window, return_lse=True)
        assert torch.isfinite(res[1]).all()
        assert (res[1].double() - ref_lse).abs().max().item() < 1e-3


@pytest.mark.gpu
@needs_sm90
def test_gpu_gluon_default_route(monkeypatch):
    """With no config given (the table) and the shipped width rule: a wide window takes the Gluon
    kernel at heads 64 and 128 (an unbounded one too, however short the sequences), a narrow one the
    Triton kernel (head 128: below 64 keys, head 64: below 1024); both right."""
    gluon_launches = count_gluon_launches(monkeypatch)
    for d in (64, 128):
        q, k, v, cu = make_qkv([2500, 300], 4, 1, d, torch.bfloat16)
        narrow = 1024 if d == 64 else 64  # keys a row
        cases = ((True, (2047, -1), 1), (False, (1500, 600), 1), (True, (narrow - 1, -1), 1),
                 (True, (narrow - 2, -1), 0))  # fmt: skip
        for causal, window, took in cases:
            before = len(gluon_launches)
            out = run(q, k, v, cu, 2500, causal=causal, window=window)
            assert len(gluon_launches) - before == took, (d, causal, window)
            assert compare(out, reference(q, k, v, cu, causal=causal, window=window))
        q, k, v, cu = make_qkv([1000, 300], 4, 1, d, torch.bfloat16)
        before = len(gluon_launches)
        out = run(q, k, v, cu, 1000, causal=True)
        assert len(gluon_launches) == before + 1, "the window alone decides: short sequences too"
        assert compare(out, reference(q, k, v, cu, causal=True))


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("causal,window", [(True, (150, -1)), (False, (40, 90)), (True, (-1, -1))])
def test_gpu_gluon_skipping_proof(causal, window, gluon_launches):
    """K/V NaN at every position no row of a 128-row tile may see (the rest of its sequence and the
    other sequence): each tile's rows stay finite and right. Edge blocks are read whole by TMA here, so
    this is what the V-row zeroing and the score mask must hold against."""
    lens = [600, 77]
    q, k, v, cu = make_qkv(lens, 2, 1, 128, torch.bfloat16)
    ref = reference(q, k, v, cu, causal=causal, window=window)
    for m0 in range(0, lens[0], 128):
        m1 = min(m0 + 128, lens[0])
        lo, hi = tile_key_range(m0, m1, lens[0], causal, window)
        k_nan, v_nan = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
        k_nan[lo:hi], v_nan[lo:hi] = k[lo:hi], v[lo:hi]
        out = run(q, k_nan, v_nan, cu, max(lens), causal=causal, window=window, config=GLUON_CONFIG)
        rows = slice(m0, m1)
        assert torch.isfinite(out[rows]).all(), f"tile [{m0}, {m1}) used a key outside [{lo}, {hi})"
        c = compare(out[rows], ref[rows])
        assert c, f"tile [{m0}, {m1}): {c}"
    assert len(gluon_launches) == -(-lens[0] // 128)


@pytest.mark.gpu
@needs_sm90
def test_gpu_gluon_negative_control(gluon_launches):
    """The harness catches a wrong kernel: the Gluon kernel run without its causal mask differs from the
    causal reference, and a NaN fill outside the window does poison rows when the window is dropped."""
    q, k, v, cu = make_qkv([500, 300], 2, 1, 128, torch.bfloat16)
    wrong = run(q, k, v, cu, 500, causal=False, window=(100, -1), config=GLUON_CONFIG)
    assert not compare(wrong, reference(q, k, v, cu, causal=True, window=(100, -1)))
    k_nan = k.clone()
    k_nan[:50] = float("nan")  # keys 0..49: outside the window of rows >= 150 of sequence 0
    out = run(q, k_nan, v, cu, 500, causal=True, window=(-1, -1), config=GLUON_CONFIG)
    assert not torch.isfinite(out[150:500]).all()
    assert len(gluon_launches) == 2


@pytest.mark.gpu
@needs_sm90
def test_gpu_gluon_strided_views_and_vllm_form(gluon_launches):
    """q/k/v as slices of one packed qkv tensor (token stride (H + 2 Hkv) * D) and the vLLM drop-in
    (starts + lengths) both take the Gluon kernel; a K whose heads are not D apart falls back."""
    lens, heads, kv_heads, d = [333, 901], 4, 2, 128
    total = sum(lens)
    qkv = torch.randn(total, heads + 2 * kv_heads, d, dtype=torch.bfloat16, device="cuda")
    q, k, v = qkv[:, :heads], qkv[:, heads : heads + kv_heads], qkv[:, heads + kv_heads :]
    cu = torch.tensor([0, lens[0], total], dtype=torch.int32, device="cuda")
    ref = reference(q, k, v, cu, causal=True, window=(200, -1))
    out = run(q, k, v, cu, max(lens), causal=True, window=(200, -1), config=GLUON_CONFIG)
    assert compare(out, ref) and len(gluon_launches) == 1
    o = poison(torch.empty_like(q))
    starts = cu[:-1].contiguous()
    seq_lens = (cu[1:] - cu[:-1]).contiguous()
    context_attention_fwd(q, k, v, o, starts, seq_lens, max(lens), is_causal=True, sliding_window_q=200)
    assert len(gluon_launches) == 2, "the vLLM form should take the Gluon kernel (default table)"
    assert compare(o, ref)
    k_gap = torch.randn(total, kv_heads, 2 * d, dtype=torch.bfloat16, device="cuda")[:, :, :d]
    k_gap.copy_(k)
    out = run(q, k_gap, v, cu, max(lens), causal=True, window=(200, -1), config=GLUON_CONFIG)
    assert len(gluon_launches) == 2, "a K whose heads are 2 D apart cannot be a TMA descriptor"
    assert compare(out, ref)


@pytest.mark.gpu
@needs_sm90
def test_gpu_gluon_falls_back_for_fp32(gluon_launches):
    """fp32 runs the Triton kernel (right answer, no Gluon launch); sinks and soft-capping take the Gluon
    kernel (test_gluon_features.py)."""
    q, k, v, cu = make_qkv([300, 200], 4, 2, 128, torch.float32)
    out = run(q, k, v, cu, 300, causal=True, window=(100, -1), config=Config(16, 16, 4, 2, False, True))
    assert not gluon_launches
    assert compare(out, reference(q, k, v, cu, causal=True, window=(100, -1)))


@pytest.mark.gpu
@needs_sm90
def test_gpu_gluon_cuda_graph_and_no_recompile(gluon_launches):
    """Captured in a CUDA graph it replays right; other lengths and batch sizes never recompile it."""
    q, k, v, cu = make_qkv([100, 1, 700], 4, 2, 128, torch.bfloat16)
    check_graph_replay(q, k, v, cu, 700, window=(63, -1))

    before = compiled_variants(wl._gluon_fwd_kernel)
    for lens in ([5], [333, 4000, 17], [2048] * 7):
        q, k, v, cu = make_qkv(lens, 4, 2, 128, torch.bfloat16)
        window_prefill(q, k, v, cu, max(lens), window=(63 + len(lens), -1))
    assert compiled_variants(wl._gluon_fwd_kernel) == before
    assert len(gluon_launches) == 5
