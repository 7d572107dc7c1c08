"""Unit test of the kernel's tile arithmetic (`_key_bounds`, `_tile_bounds`) against brute force."""

from __future__ import annotations

import random

import pytest
import torch
import triton
import triton.language as tl
from conftest import DEVICE

from prefix_prefill.kernel import _key_bounds, _tile_bounds


@triton.jit
def _bounds_probe(
    P,
    Out,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    USE_LEFT: tl.constexpr,
    USE_RIGHT: tl.constexpr,
):
    i = tl.program_id(0)
    q_lo = tl.load(P + i * 6 + 0)
    q_hi = tl.load(P + i * 6 + 1)
    k_base = tl.load(P + i * 6 + 2)
    k_len = tl.load(P + i * 6 + 3)
    left = tl.load(P + i * 6 + 4)
    right = tl.load(P + i * 6 + 5)
    need_lo, need_hi, full_lo, full_hi = _key_bounds(
        q_lo, q_hi, k_base, k_len, left, right, CAUSAL, USE_LEFT, USE_RIGHT
    )
    lo, mid_lo, mid_hi, hi = _tile_bounds(need_lo, need_hi, full_lo, full_hi, BLOCK_N, USE_LEFT)
    tl.store(Out + i * 4 + 0, lo)
    tl.store(Out + i * 4 + 1, mid_lo)
    tl.store(Out + i * 4 + 2, mid_hi)
    tl.store(Out + i * 4 + 3, hi)


def _visible(p, j, causal, left, right):
    return (not causal or j <= p) and (left < 0 or p - j <= left) and (right < 0 or j - p <= right)


def _random_problems(rng: random.Random, n: int, block_m: int, causal: bool, use_left: bool, use_right: bool):
    out = []
    for _ in range(n):
        ctx, qlen = rng.choice([0, 1, 5, 16, 31, 33, 70]), rng.randint(1, 70)
        # tile starts as the kernel makes them, and arbitrary ones (the helper must hold for any range)
        m0 = rng.randrange(0, qlen, block_m)
        if rng.random() < 0.5:  # just around a tile boundary
            m0 = min(qlen - 1, max(0, rng.randrange(0, qlen + 16, 16) + rng.choice([-2, -1, 1])))
        q_lo, q_hi = ctx + m0, ctx + min(m0 + block_m, qlen) - 1
        left = rng.choice([0, 1, 7, 16, 40]) if use_left else -1
        right = rng.choice([0, 3, 16, 33]) if use_right else -1
        if rng.random() < 0.5:  # the cached context segment
            out.append((q_lo, q_hi, 0, ctx, left, right))
        else:  # the new-token segment
            out.append((q_lo, q_hi, ctx, qlen, left, right))
    return out


@pytest.mark.parametrize("block_n", [16, 32])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("use_left", [True, False])
@pytest.mark.parametrize("use_right", [True, False])
def test_tile_bounds_match_brute_force(block_n, causal, use_left, use_right):
    rng = random.Random(hash((block_n, causal, use_left, use_right)) & 0xFFFF)
    probs = _random_problems(rng, 32, 16, causal, use_left, use_right)
    params = torch.tensor(probs, dtype=torch.int32, device=DEVICE).flatten()
    out = torch.full((len(probs) * 4,), -7, dtype=torch.int32, device=DEVICE)
    _bounds_probe[(len(probs),)](params, out, block_n, causal, use_left, use_right)
    res = out.view(-1, 4).tolist()
    for (q_lo, q_hi, k_base, k_len, left, right), (lo, mid_lo, mid_hi, hi) in zip(probs, res, strict=True):
        where = f"q=[{q_lo},{q_hi}] keys=[{k_base},+{k_len}) w=({left},{right}) -> {lo, mid_lo, mid_hi, hi}"
        assert all(x % block_n == 0 for x in (lo, mid_lo, mid_hi, hi)), where
        assert 0 <= lo <= mid_lo <= mid_hi <= hi, where
        vis = [
            j
            for j in range(k_len)
            if any(_visible(p, k_base + j, causal, left, right) for p in range(q_lo, q_hi + 1))
        ]
        if not vis:
            assert lo == hi, where
            continue
        # every visible key is inside [lo, hi), and the first and last tiles are needed
        assert lo <= vis[0] and vis[-1] < hi, where
        assert vis[0] < lo + block_n and vis[-1] >= hi - block_n, where
        # interior tiles need no mask at all
        for n0 in range(mid_lo, mid_hi, block_n):
            for j in range(n0, n0 + block_n):
                assert j < k_len, where
                for p in range(q_lo, q_hi + 1):
                    assert _visible(p, k_base + j, causal, left, right), where


def test_install_hooks_marks_itself_done_and_hooks_the_kernels(monkeypatch):
    """The first launch's setup (``launch.install_hooks``: Triton's setup side by side, a speed hint that
    never raises, with or without a GPU driver) marks itself done and leaves the compile hook on the
    Triton kernel."""
    from prefix_prefill import launch

    monkeypatch.setattr(launch, "_PRIMED", False)
    launch.install_hooks()
    assert launch._PRIMED
    if hasattr(launch._fwd_kernel, "_do_compile"):  # (compiled JIT functions; not the interpreter's)
        assert getattr(launch._fwd_kernel._do_compile, "_prefill_hooked", False)
