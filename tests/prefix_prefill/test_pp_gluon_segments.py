"""The prefix Gluon kernels' key segments, transcribed to Python and checked against the attention they must
compute (CPU; the kernels themselves run only on the GPU: tests/prefix_prefill/test_pp_gluon_features.py).

:func:`segments` is ``prefix_prefill.gluon_kernel._program_segments`` line for line and :func:`geometry`
is ``prefill_runtime.gluon._block_geometry``; :func:`visible` is the consumer's mask
(``prefill_runtime.gluon.softmax_step``). Over random lengths, tiles and windows, causal or not, the new
tokens' K/V given or in the cache, every row of a tile must see each key of its sequence that the
attention lets it see exactly once and no other, and a block the consumer leaves unmasked must hold only
keys every row of the tile sees (an unmasked key outside its segment would read another sequence's or
unwritten memory). A transcription one block short is the negative control.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

BLOCK_M = 128


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def segments(q_len, ctx_len, cache_len, m0, left, right, block_n, from_cache, has_left, causal, has_right,
             short=False):  # fmt: skip
    """``_program_segments`` (``short``: the negative control, segment B one block short)."""
    m1 = min(m0 + BLOCK_M, q_len)
    if causal:
        seen, seen_all = m1, m0 + 1
    elif has_right:
        seen, seen_all = min(m1 + right, q_len), min(m0 + 1 + right, q_len)
    else:
        seen, seen_all = q_len, q_len
    if from_cache:
        a_end = min(ctx_len + seen, cache_len)
        a_full = min(((ctx_len + seen_all) // block_n) * block_n, a_end)
        b_end = 0
    else:
        a_end = cache_len
        a_full = min((ctx_len // block_n) * block_n, a_end)
        b_end = seen
    if has_left:
        a_lo = min(max(ctx_len + m0 - left, 0), a_end)
        a_base = (a_lo // block_n) * block_n
        a_full_lo = ctx_len + m1 - 1 - left
        n_a = cdiv(a_end - a_base, block_n) if a_lo < a_end else 0
        b_base = b_end if from_cache else (max(m0 - left, 0) // block_n) * block_n
        b_full_lo = m1 - 1 - left
        n_blocks = n_a + cdiv(b_end - b_base, block_n)
    else:
        a_lo = a_base = a_full_lo = b_base = b_full_lo = 0
        n_a = cdiv(a_end, block_n)
        n_blocks = n_a + cdiv(b_end, block_n)
    if short and n_blocks > n_a:
        n_blocks -= 1
    b_full = (seen_all // block_n) * block_n
    return n_blocks, n_a, a_base, a_lo, a_end, ctx_len, a_full_lo, a_full, b_base, b_end, b_full_lo, b_full


def geometry(j, seg, block_n):
    """``_block_geometry`` of block ``j``: ``(n0, lo, hi, shift, masked, is_a)``."""
    _, n_a, a_base, a_lo, a_end, a_shift, a_full_lo, a_full, b_base, b_end, b_full_lo, b_full = seg
    if j < n_a:
        n0, lo, hi, shift, full_lo, full_hi = a_base + j * block_n, a_lo, a_end, a_shift, a_full_lo, a_full
    else:
        n0, lo, hi, shift, full_lo, full_hi = b_base + (j - n_a) * block_n, 0, b_end, 0, b_full_lo, b_full
    masked = n0 < full_lo or n0 + block_n > full_hi
    return n0, lo, hi, shift, masked, j < n_a


def visible(r, p, lo, hi, shift, left, right, causal, has_left, has_right):
    """The consumer's mask: whether rows ``r`` (``[R, 1]``) see key coordinates ``p`` (``[1, N]``) of a
    segment, ``[R, N]``."""
    ok = (lo <= p) & (p < hi) & (r >= 0)
    if causal:
        ok = ok & (p <= r + shift)
    if has_left:
        ok = ok & (r + shift - p <= left)
    if has_right:
        ok = ok & (p - r - shift <= right)
    return ok


def attention_keys(rows, ctx_len, q_len, left, right, causal):
    """``[R, ctx_len + q_len]``: whether row ``r`` (at position ``ctx_len + r``) attends to key position ``j``
    (the public function's definition)."""
    pos = ctx_len + rows[:, None]
    j = np.arange(ctx_len + q_len)[None, :]
    ok = (j < (pos + 1 if causal else ctx_len + q_len)) & (pos >= 0)  # [R, N]
    if left >= 0:
        ok = ok & (pos - j <= left)
    if right >= 0 and not causal:
        ok = ok & (j - pos <= right)
    return ok


def check_tile(q_len, ctx_len, m0, left, right, block_n, from_cache, causal, short=False) -> str | None:
    """None when the tile's blocks give every row exactly its keys, else what went wrong."""
    has_left, has_right = left >= 0, right >= 0 and not causal
    cache_len = ctx_len + q_len if from_cache else ctx_len
    seg = segments(q_len, ctx_len, cache_len, m0, left, right, block_n, from_cache, has_left, causal,
                   has_right, short)  # fmt: skip
    rows = np.arange(m0, min(m0 + BLOCK_M, q_len))
    count = np.zeros((len(rows), ctx_len + q_len + 2 * block_n), dtype=np.int64)  # times a row sees a key
    for j in range(seg[0]):
        n0, lo, hi, shift, masked, is_a = geometry(j, seg, block_n)
        p = np.arange(n0, n0 + block_n)
        vis = visible(rows[:, None], p[None, :], lo, hi, shift, left, right, causal, has_left, has_right)
        if not masked:
            if not vis.all():
                r, k = np.argwhere(~vis)[0]
                return f"unmasked block {j} at {n0}: row {rows[r]} must not see {p[k]}"
            vis = np.ones_like(vis)
        pos = p if is_a else ctx_len + p  # the keys' positions in the sequence
        count[:, pos] += vis
    want = attention_keys(rows, ctx_len, q_len, left, right, causal).astype(np.int64)
    got = count[:, : ctx_len + q_len]
    if count[:, ctx_len + q_len :].any():
        return "a key past the sequence's end is seen"
    if not np.array_equal(got, want):
        r = int(np.flatnonzero((got != want).any(axis=1))[0])
        missing, extra = np.flatnonzero(want[r] > got[r])[:5], np.flatnonzero(got[r] > want[r])[:5]
        return f"row {rows[r]}: missing keys {missing}, extra or repeated {extra}"
    return None


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
@pytest.mark.parametrize("from_cache", [False, True], ids=["k", "cache"])
@pytest.mark.parametrize("block_n", [64, 128])
def test_segments_give_every_row_its_keys(causal, from_cache, block_n):
    """Random contexts (0 included), query lengths (1 included) and windows (none, one side, both; 0 and
    the block-edge widths included), every tile of each."""
    rng = random.Random(1000 * block_n + 10 * from_cache + causal)
    edges = [0, 1, block_n - 2, block_n - 1, block_n, block_n + 1, 2 * block_n - 1]
    for _ in range(150):
        left = rng.choice([-1, -1, rng.choice(edges), rng.randrange(0, 700)])
        right = -1 if causal else rng.choice([-1, -1, rng.choice(edges), rng.randrange(0, 400)])
        ctx_len = rng.choice([0, rng.choice(edges), rng.randrange(0, 700)])
        q_len = rng.choice([1, rng.choice(edges[2:]), rng.randrange(1, 400)])
        for m0 in range(0, q_len, BLOCK_M):
            err = check_tile(q_len, ctx_len, m0, left, right, block_n, from_cache, causal)
            assert err is None, (left, right, ctx_len, q_len, m0, err)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
def test_negative_control_segment_short(causal):
    """The check catches a transcription whose segment B stops one block early."""
    assert check_tile(300, 200, 128, -1, -1, 64, False, causal, short=True) is not None
    assert check_tile(300, 200, 128, -1, -1, 64, False, causal) is None
