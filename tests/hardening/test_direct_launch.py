"""Repeat calls launch the compiled kernel directly (``prefill_runtime.compiled_launch``), keyed by what
each package computes per call. With ``CompiledLaunches.verify`` every direct launch first asks Triton
which variant it would pick for those very arguments and fails where the key's kernel is another: the
key must capture every specialisation (strides, alignment, dtypes, descriptors). Calls of one signature
with new lengths, batches, pointers (misaligned views) and token counts follow each other, and every
answer is compared with the reference (GPU only: the interpreter never launches directly)."""

from __future__ import annotations

import pytest
import torch
from conftest import ON_GPU
from hd_util import dense_case, dense_ref, paged_case, paged_ref, run_pcaf, run_pp, run_wcaf, run_wp

from attn_reference import compare
from prefill_runtime.compiled_launch import CompiledLaunches
from prefill_runtime.signatures import Seen

pytestmark = pytest.mark.skipif(not ON_GPU, reason="direct launches run on NVIDIA GPUs only")


@pytest.fixture(autouse=True)
def _verify(monkeypatch):
    monkeypatch.setattr(CompiledLaunches, "verify", True)


def _shifted(t: torch.Tensor, elems: int) -> torch.Tensor:
    """``t``'s values at ``elems`` elements into a new buffer (another pointer; 16-byte aligned or not)."""
    buf = torch.empty(t.numel() + elems, dtype=t.dtype, device=t.device)
    out = buf[elems:].view(t.shape)
    out.copy_(t)
    return out


@pytest.mark.parametrize("head", [64, 128])
@pytest.mark.parametrize("window", [(-1, -1), (255, -1), (4095, -1)])
def test_window_repeat_calls(head, window):
    """window_prefill and its vLLM form over lengths, batches and shifted q (16-byte aligned or not);
    (4095, -1) on 2300-token sequences runs the Gluon kernel on sm90 for 16-bit heads."""
    for lens in ([100], [300, 2300], [7, 1, 2300], [2300, 40, 5, 1]):
        c = dense_case(lens, 8, 2, head, torch.bfloat16)
        for shift in (0, 0, 1, 8):
            if shift:
                c.q = _shifted(c.q, shift)
            want = dense_ref(c, window=window)
            got = run_wp(c, window=window)
            assert compare(got, want), (lens, shift)
            if window[0] != 4095:
                assert compare(run_wcaf(c, window=window), want), (lens, shift)


@pytest.mark.parametrize(("layout", "head", "page"), [("split", 128, 16), ("nhd", 128, 544), ("hnd", 64, 16),
                                                      ("split", 256, 16), ("nhd", 64, 16)])  # fmt: skip
def test_prefix_repeat_calls(layout, head, page):
    """prefix_prefill (and vLLM's form on the split layout) over contexts, batches and token counts,
    k given and read from the cache: the Gluon kernels (sm90, 16-bit; HND caches on the NHD/HND one)."""
    for seqs in ([(30, 20)], [(600, 100), (0, 33)], [(17, 1), (1000, 300), (5, 5)]):
        for from_cache in (False, True):
            c = paged_case(seqs, heads=8, kv_heads=2, head=head, page=page, dtype=torch.bfloat16,
                           layout=layout, kv_from_cache=from_cache)  # fmt: skip
            want = paged_ref(c)
            for _ in range(2):
                assert compare(run_pp(c), want), (seqs, from_cache)
                if layout == "split":
                    assert compare(run_pcaf(c), want), (seqs, from_cache)


@pytest.mark.parametrize("layout", ["nhd", "split"])
def test_prefix_fp8_cache_repeat_calls(layout):
    """A bfloat16 call over an fp8 cache runs on float16 copies of q, k and v (``prefix_prefill.
    float16_copies``), whose kernel launches directly after its first call: over token counts, k given
    or read from the cache and q, k, v shifted (16-byte aligned or not), every launch is the variant
    Triton picks and every answer matches the reference."""
    for seqs in ([(300, 20)], [(600, 100), (0, 33)], [(17, 1), (1000, 300), (5, 5)]):
        for from_cache in (False, True):
            c = paged_case(seqs, heads=8, kv_heads=2, head=128, page=16, dtype=torch.bfloat16,
                           layout=layout, kv_from_cache=from_cache, fp8=True)  # fmt: skip
            want = paged_ref(c)
            for shift in (0, 0, 1, 8):
                if shift:
                    c.q = _shifted(c.q, shift)
                    if c.k is not None:
                        c.k, c.v = _shifted(c.k, shift), _shifted(c.v, shift)
                assert compare(run_pp(c), want), (seqs, from_cache, shift)


@pytest.mark.parametrize(("entry", "layout", "head", "fp8"), [("pp", "split", 128, False),
                                                              ("pp", "nhd", 128, False),
                                                              ("pp", "hnd", 128, False),
                                                              ("pp", "split", 256, False),
                                                              ("pp", "nhd", 128, True),
                                                              ("pp", "split", 128, True),
                                                              ("wp", None, 128, False)])  # fmt: skip
def test_warm_calls_match_the_first(entry, layout, head, fp8, monkeypatch):
    """The warm path as shipped (no verify: per-call descriptors made light, the caches' descriptors kept
    in a frame per (key, cache pointers), Triton 3.6's C launcher called directly; over an fp8 cache the
    float16 copies of q, k and v through their own frame too): a signature's first call goes through
    Triton, and later calls of other tensors (another layer's caches) and of the first tensors again
    (their kept descriptors) give the reference's answer, the first tensors' bit for bit what Triton's
    path gave."""
    from prefix_prefill import gluon_launch, signatures
    from window_prefill import launch as wp_launch

    monkeypatch.setattr(CompiledLaunches, "verify", False)
    monkeypatch.setattr(signatures, "SEEN", Seen())
    for fast in (gluon_launch._NHD, gluon_launch._SPLIT, wp_launch._GLUON):
        if fast is not None:
            fast.clear()
    window = (4095, -1)
    if entry == "pp":
        make = lambda: paged_case([(600, 100), (0, 33), (17, 1)], heads=8, kv_heads=2, head=head, page=16,  # noqa: E731
                                  dtype=torch.bfloat16, layout=layout, fp8=fp8)  # fmt: skip
        run, ref = run_pp, paged_ref
    else:
        make = lambda: dense_case([300, 2300, 7], 8, 2, head, torch.bfloat16)  # noqa: E731
        run, ref = (lambda c: run_wp(c, window=window)), (lambda c: dense_ref(c, window=window))
    a, b = make(), make()
    first = run(a).clone()
    assert compare(first, ref(a))
    assert gluon_launch.finish_compiles(timeout=300)  # (then the full form's first call: through Triton)
    assert torch.equal(run(a), first)
    fast = {"wp": wp_launch._GLUON, "split": gluon_launch._SPLIT, "nhd": gluon_launch._NHD,
            "hnd": gluon_launch._NHD}[layout or entry]  # fmt: skip
    assert len(fast) == 1  # compiled: the calls below launch it directly
    assert torch.equal(run(a), first)
    assert compare(run(b), ref(b))
    assert torch.equal(run(a), first)


def _fewer_tokens(c, keep: list[int], new: list[int]):
    """``c``'s sequences ``keep`` over the same caches and block table rows, each with ``new[i]`` new
    tokens (at most its own; their K/V fresh, or, read from the cache, the first ones written there)."""
    import dataclasses

    rows = torch.tensor(keep, device=c.q.device)
    total, heads, head = sum(new), c.q.shape[1], c.q.shape[2]
    q = torch.randn(total, heads, head, device=c.q.device).to(c.q.dtype)
    k = v = None
    if c.k is not None:
        k = torch.randn(total, c.k.shape[1], head, device=c.q.device).to(c.k.dtype)
        v = torch.randn_like(k)
    ctx = [c.ctx_lens[i] for i in keep]
    ends = torch.tensor(new).cumsum(0).tolist()
    cu = torch.tensor([0, *ends], dtype=c.cu_seqlens_q.dtype, device=q.device)
    lens = [a + b for a, b in zip(ctx, new, strict=True)]
    seq_lens = torch.tensor(lens, dtype=c.seq_lens.dtype, device=q.device)
    table = c.block_table[rows].contiguous()
    return dataclasses.replace(c, q=q, k=k, v=v, block_table=table, cu_seqlens_q=cu, seq_lens=seq_lens,
                               max_query_len=max(new), ctx_lens=ctx, q_lens=list(new))  # fmt: skip


@pytest.mark.parametrize(
    ("layout", "head", "from_cache"),
    [
        ("split", 128, False),
        ("split", 128, True),
        ("nhd", 128, False),
        ("hnd", 128, True),
        ("split", 256, False),
    ],
)
def test_frames_follow_new_tokens(layout, head, from_cache, monkeypatch):
    """The shipped warm path (no verify) over one layer's caches, step after step: a frame made by one
    call serves calls of other token counts, batches, lengths and block tables over the same caches (the
    per-call slots), and another scale (its own frame); each answer is the reference's."""
    from prefix_prefill import gluon_launch

    monkeypatch.setattr(CompiledLaunches, "verify", False)
    a = paged_case([(600, 100), (0, 33), (17, 9)], heads=8, kv_heads=2, head=head, page=16,
                   dtype=torch.bfloat16, layout=layout, kv_from_cache=from_cache)  # fmt: skip
    for _ in range(3):
        run_pp(a)
    assert gluon_launch.finish_compiles(timeout=300)
    for _ in range(3):  # (the full form: through Triton, then directly, making the frame)
        assert compare(run_pp(a), paged_ref(a))
    for keep, new in (([0], [1]), ([2, 0], [9, 57]), ([1, 2, 0], [33, 1, 100]), ([0, 0, 0, 1], [4, 5, 6, 7])):
        b = _fewer_tokens(a, keep, new)
        assert compare(run_pp(b), paged_ref(b)), (keep, new)
        assert compare(run_pp(b, softmax_scale=0.05), paged_ref(b, softmax_scale=0.05)), (keep, new)
        if layout == "split":
            assert compare(run_pcaf(b), paged_ref(b)), (keep, new)
