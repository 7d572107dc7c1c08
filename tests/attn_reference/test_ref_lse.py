"""The references' softmax log-sum-exp (``return_lse=True``) and :func:`compare_lse`.

The LSE is checked against a naive per-row ``log(sum(exp(logit)))`` in Python floats, for every
option that changes the logits (scale, softcap, ALiBi, both sink modes, windows), for rows without a
visible key (``-inf``, or the sink alone with a denominator sink), for the paged reference, and by
merging two partial attentions over disjoint key sets. ``compare_lse`` must reject the plausible
wrong LSEs a kernel could produce (off by log 2, log2 units, the sink left out, a shifted window,
NaN for an unwritten row, a finite value where the row is empty).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from attn_ref_naive import naive_attention

from attn_reference import (
    LSE_ATOL,
    attention_varlen,
    compare_lse,
    negative_control,
    paged_prefix_attention,
)

# (len_q, len_k) per sequence: len_q < len_k, len_q == len_k, a query longer than its keys (rows
# before the first key see nothing under causal), an empty query, a sequence without keys.
LENS = [(3, 11), (7, 7), (5, 3), (0, 4), (2, 0), (1, 1)]


def _batch(lens=LENS, heads=4, kv=2, d=8):
    tq, tk = sum(a for a, _ in lens), sum(b for _, b in lens)
    q = torch.randn(tq, heads, d, dtype=torch.float64)
    k = torch.randn(tk, kv, d, dtype=torch.float64)
    v = torch.randn(tk, kv, d, dtype=torch.float64)
    cu_q, cu_k = [0], [0]
    for a, b in lens:
        cu_q.append(cu_q[-1] + a)
        cu_k.append(cu_k[-1] + b)
    return q, k, v, cu_q, cu_k


def _t(x: list[int]) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.int32)


OPTIONS = {
    "plain": {},
    "causal": dict(causal=True),
    "window": dict(window=(2, 1)),
    "causal_left": dict(causal=True, window=(1, -1), softmax_scale=0.7),
    "softcap": dict(causal=True, softcap=2.0, softmax_scale=1.5),
    "alibi": dict(causal=True, alibi_slopes="heads"),
    "sinks_denominator": dict(causal=True, sinks="heads"),
    "sinks_bias_key0": dict(causal=True, window=(2, -1), sinks="heads", sinks_mode="bias_key0"),
    "everything": dict(
        causal=True, window=(3, -1), softmax_scale=0.6, alibi_slopes="heads", sinks="heads", softcap=3.0
    ),
}


def _opts(name: str) -> dict:
    opts = dict(OPTIONS[name])
    if opts.get("alibi_slopes") == "heads":
        opts["alibi_slopes"] = torch.rand(4) * 0.5
    if opts.get("sinks") == "heads":
        opts["sinks"] = torch.tensor([0.5, -1.0, float("-inf"), 2.0])  # one head's sink disabled
    return opts


@pytest.mark.parametrize("name", list(OPTIONS))
def test_lse_matches_naive(name):
    q, k, v, cu_q, cu_k = _batch()
    opts = _opts(name)
    out, lse = attention_varlen(q, k, v, _t(cu_q), _t(cu_k), return_lse=True, **opts)
    assert lse.shape == (q.shape[1], q.shape[0]) and lse.dtype == torch.float64 and lse.is_contiguous()
    want = naive_attention(q, k, v, cu_q, cu_k, return_lse=True, **opts)[1]
    assert torch.equal(torch.isinf(lse), torch.isinf(want))
    fin = torch.isfinite(want)
    assert (lse[fin] - want[fin]).abs().max() < 1e-12
    assert torch.equal(out, attention_varlen(q, k, v, _t(cu_q), _t(cu_k), **opts))  # out unchanged
    lse32 = attention_varlen(q, k, v, _t(cu_q), _t(cu_k), return_lse=True, dtype=torch.float32, **opts)[1]
    assert lse32.dtype == torch.float32 and compare_lse(lse32, lse, atol=1e-5)


def test_rows_without_keys():
    """Rows that see nothing get -inf; with a denominator sink their denominator is the sink alone."""
    q, k, v, cu_q, cu_k = _batch(lens=[(5, 3), (2, 0), (4, 4)])
    empty = [0, 1, 5, 6]  # the first two queries of (5, 3) sit before key 0; (2, 0) has no keys
    _, lse = attention_varlen(q, k, v, _t(cu_q), _t(cu_k), causal=True, return_lse=True)
    assert torch.isneginf(lse[:, empty]).all() and torch.isfinite(lse[:, [2, 3, 4, 7, 8, 9, 10]]).all()
    sinks = torch.tensor([0.5, -1.0, float("-inf"), 2.0])
    _, lse_s = attention_varlen(q, k, v, _t(cu_q), _t(cu_k), causal=True, sinks=sinks, return_lse=True)
    assert torch.equal(lse_s[:, empty], sinks.double()[:, None].expand(4, len(empty)))
    out_b, lse_b = attention_varlen(
        q, k, v, _t(cu_q), _t(cu_k), causal=True, sinks=sinks, sinks_mode="bias_key0", return_lse=True
    )
    assert torch.isneginf(lse_b[:, empty]).all() and (out_b[empty] == 0).all()


def test_paged_reference_lse():
    """paged_prefix_attention's LSE is the dense one over the same (dequantised) keys."""
    page, heads, kv, d = 3, 4, 2, 8
    ctx, qlen = [4, 0, 7], [2, 3, 1]
    nb = 8
    k_cache = torch.randn(nb, page, kv, d, dtype=torch.float64)
    v_cache = torch.randn(nb, page, kv, d, dtype=torch.float64)
    table = torch.tensor([[5, 1, 7], [2, 0, 0], [6, 3, 4]], dtype=torch.int32)
    q = torch.randn(sum(qlen), heads, d, dtype=torch.float64)
    k_new = torch.randn(sum(qlen), kv, d, dtype=torch.float64)
    v_new = torch.randn(sum(qlen), kv, d, dtype=torch.float64)
    seq_lens = [c + n for c, n in zip(ctx, qlen, strict=True)]
    opts = dict(window=(4, -1), sinks=torch.randn(heads), alibi_slopes=torch.rand(heads))
    out, lse = paged_prefix_attention(
        q, k_new, v_new, k_cache, v_cache, table, _t([0, 2, 5, 6]), seq_lens, return_lse=True, **opts
    )
    ks, vs, q0 = [], [], 0
    for b, (c, n) in enumerate(zip(ctx, qlen, strict=True)):
        idx = [int(table[b, t // page]) for t in range(c)]
        slots = [t % page for t in range(c)]
        ks += [k_cache[idx, slots], k_new[q0 : q0 + n]]
        vs += [v_cache[idx, slots], v_new[q0 : q0 + n]]
        q0 += n
    cu_k = [0, *torch.tensor(seq_lens).cumsum(0).tolist()]
    dense_out, dense_lse = attention_varlen(
        q, torch.cat(ks), torch.cat(vs), _t([0, 2, 5, 6]), _t(cu_k), causal=True, return_lse=True, **opts
    )
    assert torch.equal(out, dense_out) and torch.equal(lse, dense_lse)
    want = naive_attention(
        q, torch.cat(ks), torch.cat(vs), [0, 2, 5, 6], cu_k, causal=True, return_lse=True, **opts
    )[1]
    assert (lse - want).abs().max() < 1e-12


def test_merging_partial_states_by_lse():
    """Attention over keys A + B = the two partial attentions weighted by exp(lse_part - lse_all)."""
    q, k, v, cu_q, cu_k = _batch(lens=[(4, 10), (3, 6), (2, 8)])
    sinks = torch.randn(4)
    full, lse = attention_varlen(q, k, v, _t(cu_q), _t(cu_k), sinks=sinks, return_lse=True)
    # A = the first half of each sequence's keys (with the sink), B = the rest
    a_idx, b_idx, cu_a, cu_b = [], [], [0], [0]
    for s, e in itertools.pairwise(cu_k):
        mid = (s + e) // 2
        a_idx += range(s, mid)
        b_idx += range(mid, e)
        cu_a.append(cu_a[-1] + mid - s)
        cu_b.append(cu_b[-1] + e - mid)
    out_a, lse_a = attention_varlen(q, k[a_idx], v[a_idx], _t(cu_q), _t(cu_a), sinks=sinks, return_lse=True)
    out_b, lse_b = attention_varlen(q, k[b_idx], v[b_idx], _t(cu_q), _t(cu_b), return_lse=True)
    merged_lse = torch.logaddexp(lse_a, lse_b)
    wa = torch.exp(lse_a - merged_lse).T[:, :, None]
    wb = torch.exp(lse_b - merged_lse).T[:, :, None]
    assert (merged_lse - lse).abs().max() < 1e-12
    assert (wa * out_a + wb * out_b - full).abs().max() < 1e-12


def test_compare_lse_verdicts_and_negative_controls():
    q, k, v, cu_q, cu_k = _batch()
    sinks = torch.randn(4)
    opts = dict(causal=True, window=(3, -1), sinks=sinks)
    _, ref = attention_varlen(q, k, v, _t(cu_q), _t(cu_k), return_lse=True, **opts)
    empty = torch.isneginf(ref)
    assert not empty.any()  # denominator sinks: no row is empty
    _, ref_plain = attention_varlen(q, k, v, _t(cu_q), _t(cu_k), causal=True, return_lse=True)
    empty = torch.isneginf(ref_plain)
    assert empty.any() and (~empty).any()

    exact = compare_lse(ref.float(), ref)
    assert exact and exact.atol == LSE_ATOL and exact.max_abs < 1e-6, str(exact)
    assert compare_lse(ref_plain.float(), ref_plain)  # -inf rows equal -inf
    assert compare_lse(ref + 0.5 * LSE_ATOL, ref)
    wrong = {
        "off by log 2": ref + math.log(2.0),
        "log2 units": ref * math.log2(math.e),
        "sink left out": attention_varlen(
            q, k, v, _t(cu_q), _t(cu_k), causal=True, window=(3, -1), return_lse=True
        )[1],
        "window shifted": negative_control(
            q, k, v, _t(cu_q), _t(cu_k), "window_shift", return_lse=True, **opts
        )[1],
        "scale": negative_control(q, k, v, _t(cu_q), _t(cu_k), "scale", return_lse=True, **opts)[1],
    }
    for name, bad in wrong.items():
        c = compare_lse(bad.float(), ref)
        assert not c, f"{name}: {c}"
    one = ref.clone()
    one[2, 5] += 2 * LSE_ATOL
    assert not compare_lse(one, ref)
    nan = ref_plain.clone()
    nan[1, 3] = float("nan")  # a row the kernel never wrote (poisoned buffer)
    c = compare_lse(nan, ref_plain)
    assert not c and c.nonfinite == 1
    filled = ref_plain.clone()
    filled[empty] = 0.0  # an empty row written as 0 instead of -inf
    c = compare_lse(filled, ref_plain)
    assert not c and c.nonfinite == int(empty.sum())
    lost = ref_plain.clone()
    lost[~empty] = float("-inf")
    assert not compare_lse(lost, ref_plain)
    assert not compare_lse(ref_plain.clone().fill_(float("inf")), ref_plain)
    with pytest.raises(ValueError, match="shapes differ"):
        compare_lse(ref[:, 1:], ref)
    with pytest.raises(ValueError, match="NaN"):
        compare_lse(ref, nan)


def test_return_lse_must_be_a_bool():
    q, k, v, cu_q, cu_k = _batch()
    with pytest.raises(TypeError, match="return_lse must be a bool"):
        attention_varlen(q, k, v, _t(cu_q), _t(cu_k), return_lse=1)
