"""The visibility mask of ``prefill_runtime.gluon.softmax_step`` in int32 arithmetic, on the CPU.

Gluon kernels do not run under the Triton interpreter, so this file replays the step's mask formulas
(with a left window: each row's run of keys ``[k_min, k_max]``, then one unsigned compare of the column
index against the run; without: the segment's bounds per key, then the causal / right-window bound per
score) with numpy's wrapping int32/uint32 arrays and compares it with the float64 reference's visibility
(``attn_reference``) in int64: random geometries, positions up to ``2**31 - 2**20`` (the largest a
sequence reaches), windows of 0, 1, ``2**30`` and ``2**31 - 1``. A negative control shows the comparison
catches a run that is off by one key. The GPU tests check the compiled kernels themselves.
"""

import numpy as np
import pytest
import torch

from attn_reference.dense import _visible

TOP = 2**31 - 2**20  # prefix_prefill.sequence.MAX_POSITION: positions stay below it


def model_mask(offs_r, n0, lo, hi, shift, left, right, causal, has_left, has_right, block_n, off_by=0):
    """``softmax_step``'s mask [BM, BN] as its int32 code computes it (numpy int32 wraps like the GPU's)."""
    i32, u32 = np.int32, np.uint32
    with np.errstate(over="ignore"):
        q_pos = (offs_r + i32(shift)).astype(i32)
        if not has_left:
            offs_k = (i32(n0) + np.arange(block_n, dtype=i32)).astype(i32)
            vis = ((offs_k >= i32(lo)) & (offs_k < i32(hi) + i32(off_by)))[None, :] & (offs_r >= 0)[:, None]
            if causal:
                vis &= offs_k[None, :] <= q_pos[:, None] + i32(off_by)
            if has_right:
                vis &= (offs_k[None, :] - q_pos[:, None]).astype(i32) <= i32(right) + i32(off_by)
            return vis
        k_min = np.maximum(q_pos - i32(left), i32(lo))
        k_max = np.full_like(q_pos, hi - 1)
        if causal:
            k_max = np.minimum(q_pos, k_max)
        if has_right:
            k_max = np.where(q_pos > k_max - i32(right), k_max, q_pos + i32(right)).astype(i32)
        run = (offs_r >= 0) & (k_max >= k_min)
        first = np.where(run, k_min - i32(n0), i32(block_n)).astype(i32)
        span = np.where(run, k_max - k_min + i32(off_by), i32(0)).astype(i32).view(u32)
        cols = np.arange(block_n, dtype=i32)
        return (cols[None, :] - first[:, None]).astype(i32).view(u32) <= span[:, None]


def definition(offs_r, n0, lo, hi, shift, left, right, causal, has_left, has_right, block_n):
    """The float64 reference's visibility (``attn_reference.dense._visible``) over the block's keys, cut to
    the segment ``[lo, hi)`` and the rows in the sequence (``offs_r >= 0``)."""
    r = torch.from_numpy(offs_r.astype(np.int64))
    k = n0 + torch.arange(block_n, dtype=torch.int64)
    vis = _visible(r + shift, k, causal, left if has_left else -1, right if has_right else -1)
    return (vis & ((k >= lo) & (k < hi))[None, :] & (r >= 0)[:, None]).numpy()


def _cases(seed, count):
    rng = np.random.default_rng(seed)
    windows = [0, 1, 5, 127, 2**30, 2**31 - 1]
    for _ in range(count):
        block_n = int(rng.choice([64, 128]))
        rows = 64
        near_top = rng.random() < 0.4
        hi = int(rng.integers(1, TOP)) if near_top else int(rng.integers(1, 3000))
        lo = int(rng.integers(0, hi))
        n0 = int(rng.integers(max(lo - block_n + 1, 0), hi)) // block_n * block_n
        shift = int(rng.integers(0, TOP - 3000)) if near_top else int(rng.integers(0, 3000))
        row0 = int(rng.integers(-rows, TOP - shift - rows if near_top else 3000))
        # rows near the keys half of the time, so runs cross the block
        if rng.random() < 0.5:
            row0 = max(-rows, n0 - shift + int(rng.integers(-rows, block_n + rows)))
            row0 = min(row0, TOP - shift - rows)
        offs_r = np.arange(row0, row0 + rows, dtype=np.int32)
        causal = bool(rng.random() < 0.6)
        has_left = bool(rng.random() < 0.6)
        has_right = (not causal) and bool(rng.random() < 0.6)
        left = int(rng.choice(windows)) if has_left else -1
        # (window_right <= 2**30: the kernels' bound)
        right = int(rng.choice(windows[:5])) if has_right else -1
        yield (offs_r, n0, lo, hi, shift, left, right, causal, has_left, has_right, block_n)


@pytest.mark.parametrize("seed", range(4))
def test_mask_model_matches_definition(seed):
    seen = 0
    for case in _cases(seed, 400):
        want = definition(*case)
        got = model_mask(*case)
        assert np.array_equal(got, want), f"case {case[1:]} rows from {case[0][0]}"
        seen += int(want.any() and not want.all())
    assert seen > 50  # enough cases cut a block part way


def test_mask_model_edges():
    block_n = 128
    offs_r = np.arange(-8, 56, dtype=np.int32)
    for shift, n0 in [(0, 0), (TOP - 64, TOP - 128), (TOP - 64, 0), (2**30, 2**30 - 128)]:
        for left in [0, 1, 2**30, 2**31 - 1]:
            for causal, has_right, right in [(True, False, -1), (False, True, 0), (False, True, 2**30)]:
                case = (offs_r, n0, 0, TOP, shift, left, right, causal, True, has_right, block_n)
                assert np.array_equal(model_mask(*case), definition(*case)), (shift, n0, left, right)


def test_mask_model_negative_control():
    """A run one key too long must be caught by the same comparison."""
    wrong = 0
    for case in _cases(7, 200):
        wrong += not np.array_equal(model_mask(*case, off_by=1), definition(*case))
    assert wrong > 10  # (most random runs miss the block or end past it)
