"""The Triton kernel's packed-GQA form (``PACK_GQA``): a KV head's query heads in the rows of one tile
when every query fits one tile that way (``prefix_prefill.plan.pack_gqa``).

CPU (interpreter) and GPU: the rule; the launch it makes (grid over KV heads, the constexpr); the
packed rows against the float64 reference with every option, odd groups (rows left over in the tile),
fp8 caches, skip_decode and the LSE; the same rows bit for bit as the unpacked launch; rows a too
small ``max_query_len`` leaves out written as 0 for every head of the group.
"""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE, ON_GPU, poison
from pp_cases import FP8_E4M3, alibi_slopes, make_case, reference, run_py

from attn_reference import compare
from paged_kv_offsets import describe_kv_cache
from prefix_prefill import launch, plan, prefix_prefill


def test_pack_rule():
    """Packed when heads are grouped and every query fits one tile as (token, head) rows."""
    assert plan.pack_gqa(128, 4, 32) and plan.pack_gqa(128, 4, 0) and plan.pack_gqa(16, 8, 2)
    assert not plan.pack_gqa(128, 4, 33) and not plan.pack_gqa(128, 1, 4) and not plan.pack_gqa(16, 3, 6)
    assert plan.pack_gqa(16, 3, 5)  # 15 of 16 rows used


class _Spy:
    """``launch._fwd_kernel`` with each launch's grid and constexprs recorded (the launch still runs)."""

    def __init__(self, kernel) -> None:
        self.kernel, self.calls = kernel, []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.calls.append((grid, kwargs))
            return self.kernel[grid](*args, **kwargs)

        return run


def _triton_only(monkeypatch) -> _Spy:
    """The Triton kernel for every call (no Gluon plan), its launches recorded."""
    monkeypatch.setenv("PREFIX_PREFILL_GLUON", "0")
    spy = _Spy(launch._fwd_kernel)
    monkeypatch.setattr(launch, "_fwd_kernel", spy)
    return spy


def _unpacked(monkeypatch) -> None:
    monkeypatch.setattr(launch, "pack_gqa", lambda *a: False)


def _case(seqs, heads=8, kv=2, head=64, dtype=torch.float16, **kw):
    return make_case(seqs, num_heads=heads, num_kv_heads=kv, head_size=head, page=16, dtype=dtype,
                     device=DEVICE, **kw)  # fmt: skip


def _short_seqs(block_m: int, group: int) -> list[tuple[int, int]]:
    """Ragged short queries that all fit one packed tile: empty contexts, one-token queries, the
    longest query ``block_m // group`` tokens."""
    longest = block_m // group
    return [(40, longest), (0, 1), (97, max(longest - 1, 1)), (16, 2), (0, longest)]


def _run(case, lse: bool = False, **kw):
    """prefix_prefill into NaN-poisoned buffers: the output, or ``(output, LSE)``."""
    out = poison(torch.empty_like(case.q))
    args = (case.q, case.k, case.v, case.k_cache, case.v_cache, case.block_table, case.cu_seqlens_q,
            case.seq_lens, case.max_query_len)  # fmt: skip
    if case.fp8_dtype is not None:
        kw.update(k_scale=case.k_scale, v_scale=case.v_scale)
    if not lse:
        return prefix_prefill(*args, kv_layout=case.layout, out=out, validate=True, **kw)
    buf = poison(torch.empty(case.q.shape[1], case.q.shape[0], dtype=torch.float32, device=DEVICE))
    kw.update(return_lse=True, lse=buf)
    return prefix_prefill(*args, kv_layout=case.layout, out=out, validate=True, **kw)


def _block_m(case) -> int:
    from prefix_prefill import explain

    return explain(case.q, case.k, case.v, case.k_cache, case.v_cache, case.block_table, case.cu_seqlens_q,
                   case.seq_lens, case.max_query_len, kv_layout=case.layout).block_m  # fmt: skip


OPTIONS = {
    "plain": {},
    "alibi": {"alibi_slopes": True},
    "sinks_window": {"sinks": True, "window": (37, -1)},
    "softcap_lse": {"softcap": 20.0, "return_lse": True},
    "non_causal_window": {"causal": False, "window": (20, 9)},
}


def _kw(opts: dict, heads: int) -> dict:
    kw = dict(opts)
    if kw.get("alibi_slopes"):
        kw["alibi_slopes"] = alibi_slopes(heads, DEVICE)
    if kw.get("sinks"):
        kw["sinks"] = torch.randn(heads, device=DEVICE)
    return kw


@pytest.mark.parametrize("layout", ["split", "nhd"])
@pytest.mark.parametrize("opts", list(OPTIONS))
@pytest.mark.parametrize("heads,kv", [(8, 2), (6, 2), (4, 4)])
def test_packed_rows_match_reference_and_unpacked(heads, kv, opts, layout, monkeypatch):
    """Against float64 attention (output and LSE), and bit for bit the unpacked launch's rows; a group
    of 3 leaves rows of the tile unused; no grouping (4 / 4) never packs."""
    spy = _triton_only(monkeypatch)
    probe = _case([(5, 1)], heads=heads, kv=kv, layout=layout)
    group = heads // kv
    case = _case(_short_seqs(_block_m(probe), group), heads=heads, kv=kv, layout=layout)
    kw = _kw(OPTIONS[opts], heads)
    lse = kw.pop("return_lse", False)
    res = _run(case, lse, **kw)
    out, got_lse = res if lse else (res, None)
    (grid, consts), *_ = spy.calls
    packed = group > 1
    assert consts.get("PACK_GQA", False) is packed
    assert grid[0] == (kv if packed else heads) and (grid[1] == 1 or not packed)
    want = reference(case, return_lse=lse, **kw)
    want_o, want_lse = want if lse else (want, None)
    c = compare(out, want_o)
    assert c, c
    if lse:
        finite = torch.isfinite(want_lse)
        assert torch.equal(torch.isfinite(got_lse), finite)
        assert (got_lse.double()[finite] - want_lse[finite]).abs().max().item() < 1e-3
    _unpacked(monkeypatch)
    again = _run(case, lse, **kw)
    assert "PACK_GQA" not in spy.calls[-1][1] or spy.calls[-1][1]["PACK_GQA"] is False
    assert _same_rows(again[0] if lse else again, out)


def _same_rows(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The packed and unpacked launches' rows agree: bit for bit on a GPU (one row's arithmetic is the same
    in either tile); under the interpreter, within a few roundings of the 16-bit output, since its
    ``tl.dot`` is numpy's matmul, whose BLAS may sum a row's products in another order for a taller matrix
    (OpenBLAS picks its kernel by CPU and size: bitwise with its AVX-512 kernels, not with its AVX2 ones)."""
    if ON_GPU:
        return torch.equal(a, b)
    return bool(compare(a, b, atol=1e-3, rtol=1e-3))  # (seen: 5e-4 at most)


def test_same_rows_negative_control():
    """The interpreter's comparison of packed and unpacked rows catches a row off by more than rounding."""
    a = torch.randn(16, 4, 8, dtype=torch.float16)
    assert _same_rows(a, a.clone())
    b = a.clone()
    b[3, 1, 2] += 0.01 + abs(b[3, 1, 2]) * 0.01
    assert not _same_rows(b, a)


def test_packed_fp8_cache_skip_decode_and_kv_from_cache(monkeypatch):
    """An fp8 e4m3 cache with its scales, skip_decode (one-token sequences left alone, their LSE -inf for
    every head of the group) and the new tokens' K/V read from the cache, packed."""
    spy = _triton_only(monkeypatch)
    probe = _case([(5, 1)])
    seqs = _short_seqs(_block_m(probe), 4)
    case = _case(seqs, cache_dtype=FP8_E4M3, k_scale=0.7, v_scale=1.3)
    c = compare(run_py(case), reference(case))
    assert c, c
    case = _case(seqs)
    kc, vc = describe_kv_cache(case.k_cache, case.v_cache, case.layout)
    out = poison(torch.empty_like(case.q))
    lse = poison(torch.empty(case.q.shape[1], case.q.shape[0], dtype=torch.float32, device=DEVICE))
    index = (case.block_table, case.cu_seqlens_q, case.seq_lens, case.max_query_len)
    launch.forward(case.q, case.k, case.v, out, case.k_cache, case.v_cache, kc, vc, *index, skip_decode=True,
                   lse=lse)  # fmt: skip
    decode = case.cu_seqlens_q[1].item()  # sequence 1 has one token
    assert torch.isnan(out[decode].float()).all() and (lse[:, decode] == float("-inf")).all()
    keep = torch.ones(case.q.shape[0], dtype=torch.bool, device=DEVICE)
    keep[decode] = False
    assert compare(out[keep], reference(case)[keep])
    case = _case(seqs, kv_from_cache=True)
    c = compare(run_py(case), reference(case))
    assert c, c
    assert all(kw.get("PACK_GQA") for _, kw in spy.calls)


def test_packed_rows_past_a_too_small_max_query_len_are_zero(monkeypatch):
    """``max_query_len`` smaller than a sequence (malformed): the packed grid covers ``block_m // group``
    tokens; every head's rows past them are 0 (LSE -inf), the rows before them right."""
    spy = _triton_only(monkeypatch)
    probe = _case([(5, 1)])
    tok = _block_m(probe) // 4
    case = _case([(30, tok + 5), (3, 2)])
    out = poison(torch.empty_like(case.q))
    lse = poison(torch.empty(case.q.shape[1], case.q.shape[0], dtype=torch.float32, device=DEVICE))
    prefix_prefill(case.q, case.k, case.v, case.k_cache, case.v_cache, case.block_table, case.cu_seqlens_q,
                   case.seq_lens, tok, kv_layout=case.layout, out=out, return_lse=True, lse=lse)  # fmt: skip
    assert spy.calls[-1][1].get("PACK_GQA") is True
    past = slice(tok, tok + 5)
    assert (out[past].float() == 0).all() and (lse[:, past] == float("-inf")).all()
    want = reference(case)
    assert compare(out[:tok], want[:tok]) and compare(out[tok + 5 :], want[tok + 5 :])


@pytest.mark.skipif(not ON_GPU, reason="the GPU tables' tiles (the CPU runs the interpreter's)")
@pytest.mark.gpu
@pytest.mark.parametrize("head,dtype", [(128, torch.bfloat16), (256, torch.float16), (64, torch.bfloat16)])
def test_gpu_packed_specdec_shapes(head, dtype, monkeypatch):
    """Speculative-decoding shapes on the GPU's Triton tiles (32 / 8 heads, 4 new tokens on contexts of
    up to 3000, bf16 / fp16, fp8 e4m3 cache): packed, right, and the unpacked rows bit for bit."""
    spy = _triton_only(monkeypatch)
    seqs = [(3000, 4), (17, 4), (0, 4), (1500, 3), (2047, 1)]
    for cache in (None, FP8_E4M3):
        case = make_case(seqs, num_heads=32, num_kv_heads=8, head_size=head, page=16, dtype=dtype,
                         device=DEVICE, cache_dtype=cache, k_scale=0.9, v_scale=1.1)  # fmt: skip
        out = run_py(case, validate=False)
        assert spy.calls[-1][1].get("PACK_GQA") is True
        c = compare(out, reference(case))
        assert c, c
        with monkeypatch.context() as m:
            m.setattr(launch, "pack_gqa", lambda *a: False)
            assert torch.equal(run_py(case, validate=False), out)
