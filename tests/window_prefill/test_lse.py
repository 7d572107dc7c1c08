"""``window_prefill(..., return_lse=True)``: the softmax log-sum-exp against the float64 reference.

Every case runs the kernel into NaN-poisoned ``out`` and ``lse`` buffers (so a row the kernel forgets
shows up), compares ``out`` with :func:`attn_reference.compare` and ``lse`` with
:func:`attn_reference.compare_lse` (finite rows within 1e-3, ``-inf`` rows exactly ``-inf``), and checks
that tokens outside every sequence stay untouched. The cases cover every path that changes the
running max/sum the LSE is made of: causal and bidirectional windows, GQA/MQA, an empty sequence,
softcap, both sink modes (rows emptied by a ``-inf`` key-0 sink get ``-inf``), the folded/unfolded
scale, int64 token offsets and the descriptor (interior-first) form. Two partial attentions over disjoint
key sets, merged by their LSEs, must give the kernel's full attention.

CPU (interpreter): fp16/fp32, 16x16 tiles. GPU-marked: bf16 at the table's tile sizes.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import DEVICE, poison
from wp_util import cu_of, run_plan, spy_triton

from attn_reference import attention_varlen, compare, compare_lse, negative_control
from window_prefill import explain, window_prefill
from window_prefill.configs import Config

PAD = 3  # tokens after the last sequence belong to none: out and lse stay poisoned there


def _problem(lens, heads, kv_heads, head_dim, dtype, device=DEVICE):
    total = sum(lens) + PAD
    q = torch.randn(total, heads, head_dim, device=device).to(dtype)
    k = torch.randn(total, kv_heads, head_dim, device=device).to(dtype)
    v = torch.randn(total, kv_heads, head_dim, device=device).to(dtype)
    return q, k, v, cu_of(lens, device=device)


def _run(q, k, v, cu, max_len, **kw):
    """window_prefill with return_lse into NaN-poisoned out/lse buffers (both written in place)."""
    out = poison(torch.empty_like(q))
    lse = poison(torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device))
    res = window_prefill(q, k, v, cu, max_len, out=out, return_lse=True, lse=lse, **kw)
    assert isinstance(res, tuple) and res[0] is out and res[1] is lse
    return out, lse


def _reference(q, k, v, cu, n, *, causal=True, **kw):
    return attention_varlen(q[:n], k[:n], v[:n], cu, cu, causal=causal, return_lse=True, **kw)


def _check(q, k, v, cu, max_len, *, config=None, **kw):
    n = int(cu[-1])
    out, lse = _run(q, k, v, cu, max_len, config=config, **kw)
    ref_out, ref_lse = _reference(q, k, v, cu, n, **kw)
    c = compare(out[:n], ref_out)
    assert c, f"out: {c}"
    c = compare_lse(lse[:, :n], ref_lse)
    assert c, f"lse: {c}"
    assert torch.isnan(out[n:]).all() and torch.isnan(lse[:, n:]).all(), "a padding token was written"
    return lse[:, :n], ref_lse


def _sinks(heads: int, kind: str) -> torch.Tensor:
    s = torch.randn(heads, device=DEVICE) * 2
    if kind == "key0_minus_inf":
        s[0] = float("-inf")
    else:
        s[1] = float("-inf")  # a disabled sink on one head
    return s


# (id, lens, heads, kv_heads, head_dim, dtype, options)
CASES = [
    ("causal-window-gqa-empty-seq", [7, 0, 37, 1], 4, 2, 24, torch.float16, dict(window=(5, -1))),
    ("bidir-window-fp32", [19, 33], 2, 2, 32, torch.float32, dict(causal=False, window=(3, 9))),
    ("causal-full-mqa", [40, 9], 4, 1, 32, torch.float16, dict()),
    ("bidir-right-only", [21, 5], 2, 1, 16, torch.float16, dict(causal=False, window=(-1, 4))),
    ("softcap", [29, 12], 4, 2, 32, torch.float16, dict(window=(9, -1), softcap=2.0, softmax_scale=1.5)),
    ("sinks-denominator", [33, 6], 4, 2, 32, torch.float16, dict(window=(10, -1), sinks="denominator")),
    (
        "sinks-key0-empty-rows",
        [1, 18, 35],
        2,
        1,
        32,
        torch.float16,
        dict(window=(12, -1), sinks="key0_minus_inf", sinks_mode="bias_key0"),
    ),
    (
        "bidir-softcap-sinks-fp32",
        [26, 11],
        2,
        1,
        40,
        torch.float32,
        dict(causal=False, softcap=5.0, sinks="denominator", softmax_scale=0.5),
    ),
]


@pytest.mark.parametrize(
    ("lens", "heads", "kv_heads", "head_dim", "dtype", "opts"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_lse_matches_reference(lens, heads, kv_heads, head_dim, dtype, opts):
    q, k, v, cu = _problem(lens, heads, kv_heads, head_dim, dtype)
    opts = dict(opts)
    if isinstance(opts.get("sinks"), str):
        opts["sinks"] = _sinks(heads, opts["sinks"])
    lse, ref = _check(q, k, v, cu, max(lens), **opts)
    if opts.get("sinks_mode") == "bias_key0":  # row 0 of each sequence saw only key 0 (logit -inf)
        starts = cu[:-1].tolist()
        assert torch.isneginf(lse[0, starts]).all() and torch.isneginf(ref[0, starts]).all()
        assert torch.isfinite(lse[1]).all()
    else:
        assert torch.isfinite(lse).all()


@pytest.mark.parametrize("form", ["unfolded", "int64-offsets", "tma-interior-first"])
def test_lse_kernel_forms(monkeypatch, form):
    """The forms of the softmax update a plan can pick: the unfolded scale (``softmax_scale <= 0``),
    int64 token offsets (run by plan: small inputs plan int32), descriptor loads (interior blocks
    before the edges)."""
    q, k, v, cu = _problem([50, 23], 2, 1, 32, torch.float16)
    q = q * 2  # larger logits: the running max moves
    kw = dict(window=(30, -1), sinks=_sinks(2, "denominator"))
    if form == "unfolded":
        assert explain(q, k, v, cu, 50, softmax_scale=-0.3, **kw).consts()["FOLD_SCALE"] is False
        _check(q, k, v, cu, 50, softmax_scale=-0.3, **kw)
    elif form == "int64-offsets":
        n = int(cu[-1])
        p = explain(q, k, v, cu, 50, return_lse=True, **kw).replace(constexprs={"WIDE_OFFSETS": True})
        lse = poison(torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device))
        out = run_plan(p, q, k, v, cu, 50, lse=lse, **kw)
        ref_out, ref_lse = _reference(q, k, v, cu, n, **kw)
        assert compare(out[:n], ref_out) and compare_lse(lse[:, :n], ref_lse)
    else:
        spy = spy_triton(monkeypatch)
        _check(q, k, v, cu, 50, config=Config(16, 16, 1, 1, True), **kw)
        assert spy.launches[0][2]["TMA_KV"] is True, "the descriptor form did not run"


def test_lse_negative_control():
    """compare_lse on this kernel's LSE rejects the LSE of plausible wrong kernels."""
    q, k, v, cu = _problem([31, 17], 4, 2, 32, torch.float16)
    sinks = _sinks(4, "denominator")
    n = int(cu[-1])
    _, lse = _run(q, k, v, cu, 31, window=(6, -1), sinks=sinks)
    _, ref = _reference(q, k, v, cu, n, window=(6, -1), sinks=sinks)
    assert compare_lse(lse[:, :n], ref)
    nc = dict(causal=True, window=(6, -1), sinks=sinks, return_lse=True)
    wrong = {
        "log 2 off": ref + math.log(2.0),
        "log2 units": ref / math.log(2.0),
        "sink left out": _reference(q, k, v, cu, n, window=(6, -1))[1],
        "window shifted": negative_control(q[:n], k[:n], v[:n], cu, cu, "window_shift", **nc)[1],
    }
    for name, bad in wrong.items():
        assert not compare_lse(lse[:, :n], bad), name


def test_merge_partial_attentions_by_lse():
    """Two kernel calls over disjoint key sets (K1/V1 with the sinks, K2/V2 without), merged with
    their LSEs, equal one kernel call over the union (each sequence's queries twice, keys K1 then K2,
    bidirectional) and the reference."""
    lens, heads, kv, d = [19, 6], 4, 2, 32
    q, k1, v1, cu = _problem(lens, heads, kv, d, torch.float16)
    _, k2, v2, _ = _problem(lens, heads, kv, d, torch.float16)
    sinks = _sinks(heads, "denominator")
    out1, lse1 = _run(q, k1, v1, cu, max(lens), causal=False, sinks=sinks)
    out2, lse2 = _run(q, k2, v2, cu, max(lens), causal=False)
    n = sum(lens)
    lse = torch.logaddexp(lse1[:, :n], lse2[:, :n])  # [H, n]
    w1 = torch.exp(lse1[:, :n] - lse).T[:, :, None]
    w2 = torch.exp(lse2[:, :n] - lse).T[:, :, None]
    merged = w1 * out1[:n].float() + w2 * out2[:n].float()

    qs, ks, vs, rows = [], [], [], []
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        rows += range(2 * s, 2 * s + e - s)  # the first copy of the sequence's queries
        qs += [q[s:e], q[s:e]]
        ks += [k1[s:e], k2[s:e]]
        vs += [v1[s:e], v2[s:e]]
    qf, kf, vf = torch.cat(qs), torch.cat(ks), torch.cat(vs)
    cuf = cu_of([2 * n for n in lens])
    full, full_lse = window_prefill(
        qf, kf, vf, cuf, 2 * max(lens), causal=False, sinks=sinks, return_lse=True
    )
    assert compare(merged.to(q.dtype), full[rows].float())
    assert compare_lse(lse, full_lse[:, rows], atol=1e-5)
    ref = attention_varlen(qf, kf, vf, cuf, cuf, sinks=sinks)[rows]
    assert compare(merged.to(q.dtype), ref)


def test_return_lse_off_returns_the_output():
    """Without return_lse the call returns the output tensor, with the values it has with return_lse (the
    launch: tests/hardening/test_invariance.py::test_return_lse_off_launches_the_variant_of_before)."""
    q, k, v, cu = _problem([9, 14], 2, 1, 32, torch.float16)
    out = window_prefill(q, k, v, cu, 14, window=(4, -1))
    assert isinstance(out, torch.Tensor)
    out2, lse = window_prefill(q, k, v, cu, 14, window=(4, -1), return_lse=True)
    assert torch.equal(out[:23], out2[:23]), "return_lse changed the output"
    assert lse.shape == (2, q.shape[0]) and lse.dtype == torch.float32 and lse.is_contiguous()


# ----------------------------------------------------------------------------- GPU (bf16)
@pytest.mark.gpu
@pytest.mark.parametrize(
    ("head_dim", "causal", "window", "sinks_mode"),
    [
        (128, True, (-1, -1), None),  # the sm90 descriptor (TMA) form
        (128, True, (1023, -1), "denominator"),
        (64, False, (64, 64), "bias_key0"),
        (256, True, (255, -1), None),
        (80, False, (-1, -1), "denominator"),
    ],
)
def test_gpu_bf16_lse(head_dim, causal, window, sinks_mode):
    lens = [1500, 1, 777, 0, 2048]
    q, k, v, cu = _problem(lens, 8, 2, head_dim, torch.bfloat16)
    kw = dict(causal=causal, window=window)
    if sinks_mode:
        kw.update(sinks=torch.randn(8, device=DEVICE), sinks_mode=sinks_mode)
    _check(q, k, v, cu, max(lens), **kw)


@pytest.mark.gpu
def test_gpu_bf16_lse_softcap_merge():
    """bf16 at the table's tiles: softcap, and the merge of two partial attentions by their LSEs."""
    lens = [640, 333]
    q, k1, v1, cu = _problem(lens, 8, 8, 128, torch.bfloat16)
    _, k2, v2, _ = _problem(lens, 8, 8, 128, torch.bfloat16)
    _check(q, k1, v1, cu, 640, softcap=30.0, window=(127, -1))
    out1, lse1 = _run(q, k1, v1, cu, 640, causal=False)
    out2, lse2 = _run(q, k2, v2, cu, 640, causal=False)
    n = sum(lens)
    lse = torch.logaddexp(lse1[:, :n], lse2[:, :n])
    merged = (torch.exp(lse1[:, :n] - lse).T[:, :, None] * out1[:n].float()) + (
        torch.exp(lse2[:, :n] - lse).T[:, :, None] * out2[:n].float()
    )
    ks, vs, cu_k = [], [], [0]
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        ks += [k1[s:e], k2[s:e]]
        vs += [v1[s:e], v2[s:e]]
        cu_k.append(cu_k[-1] + 2 * (e - s))
    ref = attention_varlen(q[:n], torch.cat(ks), torch.cat(vs), cu, torch.tensor(cu_k, device=DEVICE))
    assert compare(merged.to(torch.bfloat16), ref)
