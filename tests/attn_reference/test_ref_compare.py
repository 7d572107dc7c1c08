"""compare() verdicts, negative controls, and the torch-only import."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from attn_ref_naive import naive_attention, visible

import attn_reference
from attn_reference import Comparison, attention_varlen, compare, negative_control, tolerance

LOW_PRECISION = [torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn]


def batch(device, heads=(4, 2), lens=((6, 6), (4, 13), (1, 1), (9, 20))):
    tq, tk = sum(a for a, _ in lens), sum(b for _, b in lens)
    q = torch.randn(tq, heads[0], 16, dtype=torch.float64, device=device)
    k = torch.randn(tk, heads[1], 16, dtype=torch.float64, device=device)
    v = torch.randn(tk, heads[1], 16, dtype=torch.float64, device=device)
    cu_q, cu_k = [0], [0]
    for a, b in lens:
        cu_q.append(cu_q[-1] + a)
        cu_k.append(cu_k[-1] + b)
    return q, k, v, torch.tensor(cu_q, device=device), torch.tensor(cu_k, device=device)


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=str)
def test_compare_verdicts(dtype, device):
    q, k, v, cq, ck = batch(device)
    ref = attention_varlen(q, k, v, cq, ck, causal=True)
    assert compare(ref, ref).ok and compare(ref, ref).max_abs == 0
    rounded = ref.to(dtype)  # an exact kernel, rounded to its output dtype
    c = compare(rounded, ref)
    assert c and c.atol == tolerance(dtype)[0] and c.rtol == tolerance(dtype)[1], str(c)
    assert str(c).endswith("OK") and "max_abs=" in str(c) and "rel_l2=" in str(c)
    if dtype.itemsize > 1:
        nan = rounded.clone()
        nan[3, 1, 2] = float("nan")
        assert not compare(nan, ref) and compare(nan, ref).nonfinite == 1
        inf = rounded.clone()
        inf[0, 0, 0] = float("inf")
        assert not compare(inf, ref)
        assert str(compare(nan, ref)).endswith("FAIL")
    wrong = (ref + 0.5 * torch.randn_like(ref)).to(dtype)  # noticeably wrong everywhere
    assert not compare(wrong, ref)
    if dtype.itemsize > 1:
        one_bad = ref.clone()
        one_bad[5, 2, 7] += 0.1  # a single wrong element, past the 16/32-bit atols
        assert not compare(one_bad.to(dtype), ref)


def test_compare_options():
    ref = torch.randn(5, 3, 8, dtype=torch.float64)
    out = (ref + 1e-3).float()
    assert compare(out, ref)
    assert not compare(out, ref, atol=1e-4)
    assert not compare(out, ref, torch.float64)  # float64 tolerances for a float32 output
    assert compare(torch.empty(0, 3, 8), torch.empty(0, 3, 8, dtype=torch.float64))
    c = compare(out, ref)
    assert isinstance(c, Comparison)
    assert c.max_abs == pytest.approx(1e-3, rel=1e-3)
    assert c.rel_l2 == pytest.approx(1e-3 * ref.numel() ** 0.5 / ref.norm().item(), rel=1e-3)
    with pytest.raises(ValueError, match="shapes differ"):
        compare(out[:4], ref)
    with pytest.raises(TypeError):
        compare(out.to(torch.int32), ref)


NC_CASES = {
    "window_shift_causal": ("window_shift", dict(causal=True)),
    "window_shift_left": ("window_shift", dict(causal=True, window=(3, -1))),
    "window_shift_both": ("window_shift", dict(window=(2, 2))),
    "window_shift_right_only": ("window_shift", dict(window=(-1, 0))),
    "diagonal": ("diagonal", dict(causal=True)),
    "diagonal_window": ("diagonal", dict(causal=True, window=(4, 0), sinks="h")),
    "scale": ("scale", dict(causal=True)),
    "scale_noncausal": ("scale", {}),
    "kv_head": ("kv_head", dict(causal=True, window=(5, -1))),
}


@pytest.mark.parametrize("name", list(NC_CASES))
def test_negative_control_differs_beyond_tolerance(name, device):
    kind, opts = NC_CASES[name]
    q, k, v, cq, ck = batch(device)
    if opts.get("sinks") == "h":
        opts = {**opts, "sinks": torch.randn(4, device=device)}
    ref = attention_varlen(q, k, v, cq, ck, **opts)
    bad = negative_control(q, k, v, cq, ck, kind, **opts)
    assert bad.shape == ref.shape and torch.isfinite(bad).all()
    for dtype in (torch.float16, torch.bfloat16):  # caught even at the loosest 16-bit tolerances
        assert not compare(bad.to(dtype), ref), f"{name}: {compare(bad.to(dtype), ref)}"


def test_negative_control_masks_are_the_described_ones(device):
    q, k, v, cq, ck = batch(device)
    cu_q, cu_k = cq.tolist(), ck.tolist()
    # strictly causal == a causal window whose right bound is "-1 key" : check against the naive loop
    strict = negative_control(q, k, v, cq, ck, "window_shift", causal=True)
    ref = _naive_with(q, k, v, cu_q, cu_k, lambda p, j: j < p)
    assert (strict.cpu() - ref).abs().max() < 1e-12
    shifted = negative_control(q, k, v, cq, ck, "window_shift", causal=True, window=(2, 0))
    ref = _naive_with(q, k, v, cu_q, cu_k, lambda p, j: j <= p and p - j <= 3 and j - p <= -1)
    assert (shifted.cpu() - ref).abs().max() < 1e-12
    diag = negative_control(q, k, v, cq, ck, "diagonal", causal=True, window=(1, -1))
    ref = _naive_with(q, k, v, cu_q, cu_k, lambda p, j: j <= p + 1 and p - j <= 1)
    assert (diag.cpu() - ref).abs().max() < 1e-12
    scaled = negative_control(q, k, v, cq, ck, "scale", causal=True, softmax_scale=0.2)
    assert torch.allclose(scaled, attention_varlen(q, k, v, cq, ck, causal=True, softmax_scale=0.25))
    swapped = negative_control(q, k, v, cq, ck, "kv_head")
    assert torch.allclose(swapped, attention_varlen(q, k.flip(1), v.flip(1), cq, ck))


def _naive_with(q, k, v, cu_q, cu_k, rule):
    """The naive loop with a custom visibility rule (patched in for one call)."""
    import attn_ref_naive

    saved = attn_ref_naive.visible
    attn_ref_naive.visible = lambda p, j, *_: rule(p, j)
    try:
        return naive_attention(q, k, v, cu_q, cu_k)
    finally:
        attn_ref_naive.visible = saved


def test_negative_control_refuses_when_inapplicable(device):
    q, k, v, cq, ck = batch(device)
    with pytest.raises(ValueError, match="does not apply"):
        negative_control(q, k, v, cq, ck, "window_shift")
    with pytest.raises(ValueError, match="does not apply"):
        negative_control(q, k, v, cq, ck, "diagonal", window=(2, 2))
    q1, k1, v1, cq1, ck1 = batch(device, heads=(4, 1))
    with pytest.raises(ValueError, match="does not apply"):
        negative_control(q1, k1, v1, cq1, ck1, "kv_head", causal=True)
    with pytest.raises(ValueError, match="kind must be one of"):
        negative_control(q, k, v, cq, ck, "bogus", causal=True)


def test_import_does_not_pull_triton():
    src = os.path.dirname(os.path.dirname(attn_reference.__file__))
    env = {**os.environ, "PYTHONPATH": src}
    code = "import attn_reference, sys; assert 'triton' not in sys.modules, 'triton imported'"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


def test_naive_visible_rule():
    # the helper itself follows the inclusive FlashAttention convention
    assert visible(5, 5, True, 0, 0) and not visible(5, 6, True, -1, -1)
    assert visible(5, 2, False, 3, -1) and not visible(5, 1, False, 3, -1)
    assert visible(5, 7, False, -1, 2) and not visible(5, 8, False, -1, 2)
