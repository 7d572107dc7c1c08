"""Rows with no visible key are 0, never NaN/Inf, under every mask combination, for both kernels.

With the FlashAttention window convention a query always sees its own position, so a whole row is
empty only when a ``bias_key0`` sink of ``-inf`` removes key 0 from a row that sees nothing else
(window-prefill). What every combination does produce are rows that see nothing *within a tile*
(causal + window edges, right-window-only rows at a sequence end, queries longer than their window,
tiles past a sequence end) while their running max is still ``-inf`` -- the case a missing
``m = -inf`` guard turns into NaN; ``sinks = -inf`` starts that running max at ``-inf`` on purpose.
Padding tokens that belong to no sequence must stay untouched (NaN-poisoned).
"""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE, poison
from hd_util import cu_of, dense_case, dense_ref, paged_case, paged_ref, run_pcaf, run_pp, run_wcaf, run_wp

from attn_reference import attention_varlen, compare
from prefix_prefill import prefix_prefill
from window_prefill import context_attention_fwd, window_prefill

NEG_INF = float("-inf")
H, HKV = 4, 2


def _sinks(kind: str | None) -> torch.Tensor | None:
    if kind is None:
        return None
    if kind == "-inf":
        return torch.full((H,), NEG_INF, device=DEVICE)
    return torch.tensor([NEG_INF, 1.5, NEG_INF, -0.5], device=DEVICE)  # "mixed"


def _visible(i: int, j: int, causal: bool, window: tuple[int, int]) -> bool:
    left, right = window
    return (not causal or j <= i) and (left < 0 or i - j <= left) and (right < 0 or j - i <= right)


# (causal, window, sinks, sinks_mode)
WINDOW_CASES = [
    (True, (-1, -1), "-inf", "denominator"),
    (True, (0, -1), "-inf", "bias_key0"),  # every row sees only itself: row 0 of each sequence is empty
    (True, (3, -1), "mixed", "denominator"),
    (True, (5, 0), "-inf", "bias_key0"),
    (False, (0, 0), "mixed", "bias_key0"),  # diagonal only, key 0 removed for two heads
    (False, (-1, 2), "-inf", "denominator"),  # right-window-only rows at each sequence end
    (False, (2, 7), None, "denominator"),
    (False, (-1, 0), "-inf", "bias_key0"),
]


@pytest.mark.parametrize(("causal", "window", "sinks_kind", "mode"), WINDOW_CASES)
def test_window_prefill_rows(causal, window, sinks_kind, mode):
    lens = [1, 17, 40, 3]
    pad = 5  # tokens after the last sequence belong to none
    total = sum(lens) + pad
    q = torch.randn(total, H, 32, device=DEVICE).half()
    k = torch.randn(total, HKV, 32, device=DEVICE).half()
    v = torch.randn(total, HKV, 32, device=DEVICE).half()
    cu = cu_of(lens)
    sinks = _sinks(sinks_kind)
    out = poison(torch.empty_like(q))
    window_prefill(
        q,
        k,
        v,
        cu,
        max(lens),
        causal=causal,
        window=window,
        sinks=sinks,
        sinks_mode=mode,
        out=out,
        validate=True,
    )
    n = sum(lens)
    assert torch.isfinite(out[:n]).all(), "NaN/Inf in a sequence row"
    assert torch.isnan(out[n:]).all(), "a padding token was written"
    ref = attention_varlen(
        q[:n], k[:n], v[:n], cu, cu, causal=causal, window=window, sinks=sinks, sinks_mode=mode
    )
    res = compare(out[:n], ref)
    assert res, res
    if mode == "bias_key0" and sinks is not None:
        empty = 0
        for s, length in zip(cu[:-1].tolist(), lens, strict=True):
            for i in range(length):
                if not any(_visible(i, j, causal, window) for j in range(1, length)):
                    heads = torch.isinf(sinks)  # key 0 removed for these heads: nothing left
                    assert (out[s + i, heads] == 0).all(), f"empty row {s + i} is not 0"
                    assert (ref[s + i, heads] == 0).all()
                    empty += 1
        assert empty > 0 or window[0] != 0, "the case was meant to have empty rows"


def test_window_context_attention_fwd_gaps_untouched():
    """vLLM form with gaps between sequences and -inf sinks: gap tokens stay untouched, rows finite."""
    lens, starts, total = [12, 1, 30], [2, 20, 25], 60
    q = torch.randn(total, H, 32, device=DEVICE).half()
    k = torch.randn(total, HKV, 32, device=DEVICE).half()
    v = torch.randn(total, HKV, 32, device=DEVICE).half()
    o = poison(torch.empty_like(q))
    sinks = _sinks("-inf")
    context_attention_fwd(
        q,
        k,
        v,
        o,
        torch.tensor(starts, device=DEVICE),
        torch.tensor(lens, device=DEVICE),
        30,
        True,
        None,
        3,
        None,
        sinks,
        validate=True,
    )
    written = torch.zeros(total, dtype=torch.bool)
    for s, n in zip(starts, lens, strict=True):
        written[s : s + n] = True
        ref = attention_varlen(
            q[s : s + n],
            k[s : s + n],
            v[s : s + n],
            cu_of([n]),
            cu_of([n]),
            causal=True,
            window=(3, -1),
            sinks=sinks,
        )
        res = compare(o[s : s + n], ref)
        assert res, res
    assert torch.isfinite(o[written]).all()
    assert torch.isnan(o[~written]).all()


def test_window_short_sequences_both_forms():
    """Sequences shorter than the window and than one tile, with a window that sees nothing but the diagonal
    on the right: the vLLM form agrees bit for bit with the Pythonic one."""
    c = dense_case([1, 2, 1, 5], H, HKV, 48, torch.float32)
    sinks = _sinks("-inf")
    a = run_wp(c, causal=True, window=(30, -1), sinks=sinks)
    b = run_wcaf(c, causal=True, window=(30, -1), sinks=sinks)
    assert torch.equal(a, b)
    res = compare(a, dense_ref(c, window=(30, -1), sinks=sinks))
    assert res, res


# (causal, window, sinks, layout, kv_from_cache)
PREFIX_CASES = [
    (True, (-1, -1), "-inf", "nhd", False),
    (True, (0, -1), "-inf", "hnd", False),  # each row sees itself only: the whole context is skipped
    (True, (5, -1), "mixed", "split", False),  # query longer than its window, partial context tiles
    (False, (-1, 3), "-inf", "nhd", True),  # right-window-only rows at the end
    (False, (4, 4), "mixed", "hnd", True),
    (False, (0, 0), "-inf", "split", False),
]


@pytest.mark.parametrize(("causal", "window", "sinks_kind", "layout", "from_cache"), PREFIX_CASES)
def test_prefix_prefill_rows(causal, window, sinks_kind, layout, from_cache):
    seqs = [(0, 1), (37, 20), (0, 23), (5, 1), (64, 2)]
    c = paged_case(
        seqs,
        heads=H,
        kv_heads=HKV,
        head=32,
        page=7,
        dtype=torch.float16,
        layout=layout,
        kv_from_cache=from_cache,
    )
    sinks = _sinks(sinks_kind)
    pad = 6  # query rows after the last sequence belong to none
    n = c.q.shape[0]
    q = torch.cat([c.q, torch.randn(pad, H, 32, device=DEVICE).half()])
    k = v = None
    if not from_cache:
        k = torch.cat([c.k, torch.randn(pad, HKV, 32, device=DEVICE).half()])
        v = torch.cat([c.v, torch.randn(pad, HKV, 32, device=DEVICE).half()])
    out = poison(torch.empty_like(q))
    prefix_prefill(
        q,
        k,
        v,
        c.k_cache,
        c.v_cache,
        c.block_table,
        c.cu_q,
        c.seq_lens,
        c.max_query_len,
        causal=causal,
        window=window,
        sinks=sinks,
        kv_layout=layout,
        out=out,
        validate=True,
    )
    assert torch.isfinite(out[:n]).all(), "NaN/Inf in a sequence row"
    assert torch.isnan(out[n:]).all(), "a padding row was written"
    res = compare(out[:n], paged_ref(c, causal=causal, window=window, sinks=sinks))
    assert res, res


def test_prefix_context_attention_fwd_sinks_and_window():
    """vLLM form, -inf sinks, sliding window 1 (only itself), an fp8 cache."""
    c = paged_case(
        [(40, 9), (0, 1), (3, 17)],
        heads=H,
        kv_heads=HKV,
        head=32,
        page=16,
        dtype=torch.float16,
        layout="split",
        fp8=True,
    )
    sinks = _sinks("-inf")
    out = run_pcaf(c, window=(0, -1), sinks=sinks, validate=True)
    assert torch.isfinite(out).all()
    res = compare(out, paged_ref(c, window=(0, -1), sinks=sinks))
    assert res, res
    # the same rows through the Pythonic form, with a mixed sink
    sinks = _sinks("mixed")
    out = run_pp(c, window=(0, -1), sinks=sinks, validate=True)
    assert torch.isfinite(out).all()
    res = compare(out, paged_ref(c, window=(0, -1), sinks=sinks))
    assert res, res
