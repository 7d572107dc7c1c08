"""``prefix_prefill(..., return_lse=True)``: the softmax log-sum-exp against the float64 reference.

Every case runs the kernel into NaN-poisoned ``out`` and ``lse`` buffers and compares ``out`` with
:func:`attn_reference.compare`, ``lse`` with :func:`attn_reference.compare_lse` (finite rows within
1e-3, ``-inf`` rows exactly ``-inf``) over the same paged problem (:func:`paged_cases.make_case`:
shuffled block ids, table entries past a sequence's need pointing outside the cache). The cases
cover the loops the launcher picks (context + new tokens, one cached segment for ``k=None``, the
merged masked loops of an NHD cache), the three layouts, a non-power-of-2 page, GQA, windows,
ALiBi, sinks, softcap, an fp8 cache with scales, lazy rescaling, ``causal=False``, rows skipped by
``skip_decode`` (through the op: ``-inf``), a negative control, and a cascade merge: the context
part (reference) and the new-token part (kernel) merged by their LSEs equal the kernel's full call.

CPU (interpreter): fp16/fp32, 16-wide tiles. GPU-marked: bf16 at the table's tiles and real pages.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from conftest import DEVICE, poison
from paged_cases import FP8_E4M3, Case, make_case

from attn_reference import attention_varlen, compare, compare_lse, gather_paged, paged_prefix_attention
from paged_kv_offsets import LAYOUTS
from prefix_prefill import prefix_prefill

H, HKV = 4, 2
SEQS = [(9, 5), (0, 17), (18, 3), (40, 1)]  # (context, query): an empty context, a one-token query


def _case(seqs=SEQS, *, layout="split", page=5, head_size=24, dtype=torch.float16, **kw) -> Case:
    return make_case(seqs, num_heads=H, num_kv_heads=HKV, head_size=head_size, page=page, dtype=dtype,
                     device=DEVICE, layout=layout, **kw)  # fmt: skip


def _run(c: Case, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    """prefix_prefill with return_lse into NaN-poisoned out/lse buffers (validate=True)."""
    out = poison(torch.empty_like(c.q))
    lse = poison(torch.empty(c.q.shape[1], c.q.shape[0], dtype=torch.float32, device=DEVICE))
    if c.fp8_dtype is not None:
        kw.update(k_scale=c.k_scale, v_scale=c.v_scale)
    res = prefix_prefill(c.q, c.k, c.v, c.k_cache, c.v_cache, c.block_table, c.cu_seqlens_q, c.seq_lens,
                         c.max_query_len, kv_layout=c.layout, out=out, return_lse=True, lse=lse,
                         validate=True, **kw)  # fmt: skip
    assert isinstance(res, tuple) and res[0] is out and res[1] is lse
    return out, lse


def _reference(c: Case, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    return paged_prefix_attention(c.q, c.k, c.v, c.k_cache, c.v_cache, c.block_table, c.cu_seqlens_q,
                                  c.seq_lens, layout=c.layout, k_scale=c.k_scale, v_scale=c.v_scale,
                                  fp8_dtype=c.fp8_dtype, return_lse=True, **kw)  # fmt: skip


def _check(c: Case, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = _run(c, **kw)
    ref_out, ref_lse = _reference(c, **kw)
    co = compare(out, ref_out, torch.float16 if c.fp8_dtype is not None else None)
    assert co, f"out: {co}"
    cl = compare_lse(lse, ref_lse)
    assert cl, f"lse: {cl}"
    return lse, ref_lse


def _sinks() -> torch.Tensor:
    s = torch.randn(H, device=DEVICE) * 2
    s[2] = float("-inf")  # a disabled sink on one head
    return s


# (id, case options, call options)
CASES = [
    ("split-page5-k-given", dict(), dict()),
    ("nhd-page16-k-given-merged-masked-loops-sinks", dict(layout="nhd", page=16), dict(sinks="h")),
    (
        "nhd-page17-kv-from-cache-window-alibi-fp32",
        dict(layout="nhd", page=17, kv_from_cache=True, dtype=torch.float32),
        dict(window=(6, -1), alibi="h"),
    ),
    (
        "split-page4-kv-from-cache-sinks-softcap",
        dict(page=4, kv_from_cache=True),
        dict(sinks="h", softcap=3.0),
    ),
    ("hnd-page8-noncausal-window", dict(layout="hnd", page=8), dict(causal=False, window=(3, 2))),
    (
        "split-page3-fp8-cache-scales",
        dict(page=3, cache_dtype=FP8_E4M3, k_scale=0.5, v_scale=2.0),
        dict(sinks="h", softmax_scale=0.3),
    ),
]


@pytest.mark.parametrize(("case_kw", "call_kw"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_lse_matches_reference(case_kw, call_kw):
    c = _case(**case_kw)
    kw = dict(call_kw)
    if kw.pop("sinks", None):
        kw["sinks"] = _sinks()
    if kw.pop("alibi", None):
        kw["alibi_slopes"] = torch.rand(H, device=DEVICE) * 0.3
    lse, _ = _check(c, **kw)
    assert torch.isfinite(lse).all(), "every query sees at least its own position"


def test_skip_decode_rows_get_minus_inf():
    """Through the op (the vLLM form has no return_lse): sequences of query length 1 are skipped, their
    out rows untouched and their LSE -inf; the other rows as without skip_decode."""
    c = _case([(30, 1), (12, 20), (0, 1), (40, 9)], page=16)
    out = poison(torch.empty_like(c.q))
    lse = poison(torch.empty(H, c.q.shape[0], dtype=torch.float32, device=DEVICE))
    torch.ops.prefix_prefill.fwd(c.q, c.k, c.v, out, c.k_cache, c.v_cache, LAYOUTS.index("split"),
                                 c.block_table, c.cu_seqlens_q, c.seq_lens, c.max_query_len, True, -1, -1,
                                 None, None, None, None, None, None, True, 0.0, lse)  # fmt: skip
    ref_out, ref_lse = _reference(c)
    decode = torch.tensor([0, 21], device=DEVICE)
    keep = torch.ones(c.q.shape[0], dtype=torch.bool, device=DEVICE)
    keep[decode] = False
    assert torch.isnan(out[decode]).all() and torch.isneginf(lse[:, decode]).all()
    assert compare(out[keep], ref_out[keep]) and compare_lse(lse[:, keep], ref_lse[:, keep])


def test_lse_negative_control():
    """compare_lse on this kernel's LSE rejects the LSE of plausible wrong kernels."""
    c = _case(layout="nhd", page=16)
    sinks = _sinks()
    _, lse = _run(c, sinks=sinks, window=(7, -1))
    _, ref = _reference(c, sinks=sinks, window=(7, -1))
    assert compare_lse(lse, ref)
    wrong = {
        "log 2 off": ref + math.log(2.0),
        "log2 units": ref / math.log(2.0),
        "sink left out": _reference(c, window=(7, -1))[1],
        "window one key wider": _reference(c, sinks=sinks, window=(8, -1))[1],
        "scale x1.25": _reference(c, sinks=sinks, window=(7, -1), softmax_scale=1.25 / math.sqrt(24))[1],
    }
    for name, bad in wrong.items():
        assert not compare_lse(lse, bad), name


@pytest.mark.parametrize("layout", ["nhd", "split"])
def test_cascade_merge_context_and_new_tokens(layout):
    """Cascade / split-KV: the attention over the cached context (reference; no mask: every context
    key precedes the queries) and over the new tokens alone (kernel, the same problem without a
    context), merged by their LSEs, equal the kernel's call over both. The sinks go with the context
    part (counted once); the sequence without a context contributes only its sink there."""
    c = _case([(23, 6), (0, 9), (11, 14)], layout=layout, page=7)
    sinks = _sinks()
    full, full_lse = _run(c, sinks=sinks)
    k_ctx = gather_paged(c.k_cache, c.block_table, c.ctx_lens, layout=layout, role="k")
    v_ctx = gather_paged(c.v_cache, c.block_table, c.ctx_lens, layout=layout, role="v")
    cu_ctx = torch.tensor([0, *itertools.accumulate(c.ctx_lens)], device=DEVICE)
    out_a, lse_a = attention_varlen(c.q, k_ctx, v_ctx, c.cu_seqlens_q, cu_ctx, sinks=sinks, return_lse=True)
    no_ctx = Case(**{**c.__dict__, "seq_lens": torch.tensor(c.q_lens, dtype=torch.int32, device=DEVICE)})
    out_b, lse_b = _run(no_ctx)
    lse = torch.logaddexp(lse_a.float(), lse_b)
    merged = (
        torch.exp(lse_a - lse).T[:, :, None] * out_a + torch.exp(lse_b - lse).T[:, :, None] * out_b.double()
    )
    assert compare(merged.to(c.q.dtype), full.double())
    assert compare_lse(lse, full_lse.double())
    assert compare(merged.to(c.q.dtype), _reference(c, sinks=sinks)[0])


def test_return_lse_off_returns_the_output():
    """Without return_lse the call returns the output tensor, with the values it has with return_lse (the
    launch: tests/hardening/test_invariance.py::test_return_lse_off_launches_the_variant_of_before)."""
    c = _case(layout="nhd", page=16)
    args = (c.q, c.k, c.v, c.k_cache, c.v_cache, c.block_table, c.cu_seqlens_q, c.seq_lens, c.max_query_len)
    out = prefix_prefill(*args)
    assert isinstance(out, torch.Tensor)
    out2, lse = prefix_prefill(*args, return_lse=True)
    assert torch.equal(out, out2), "return_lse changed the output"
    assert lse.shape == (H, c.q.shape[0]) and lse.dtype == torch.float32 and lse.is_contiguous()


# ----------------------------------------------------------------------------- GPU (bf16)
@pytest.mark.gpu
@pytest.mark.parametrize(
    ("layout", "page", "head_size", "kv_from_cache", "extra"),
    [
        ("nhd", 544, 128, False, "sinks"),  # merged masked loops
        ("split", 1056, 128, False, "window_alibi"),
        ("nhd", 16, 256, True, "softcap"),  # one cached segment
        ("split", 544, 256, True, "sinks"),  # granule edges at head 256
        ("split", 1040, 64, False, "fp8"),
    ],
)
def test_gpu_bf16_lse(layout, page, head_size, kv_from_cache, extra):
    seqs = [(3000, 512), (0, 700), (1500, 1), (4100, 333)]
    kw_case = {}
    if extra == "fp8":
        kw_case = dict(cache_dtype=FP8_E4M3, k_scale=0.7, v_scale=1.3)
    c = make_case(seqs, num_heads=16, num_kv_heads=2, head_size=head_size, page=page, dtype=torch.bfloat16,
                  device=DEVICE, layout=layout, kv_from_cache=kv_from_cache, **kw_case)  # fmt: skip
    kw: dict = {}
    if extra == "sinks":
        kw["sinks"] = torch.randn(16, device=DEVICE)
    elif extra == "window_alibi":
        kw.update(window=(1023, -1), alibi_slopes=torch.rand(16, device=DEVICE) * 0.05)
    elif extra == "softcap":
        kw["softcap"] = 30.0
    out, lse = _run(c, **kw)
    ref_out, ref_lse = _reference(c, **kw)
    assert compare(out, ref_out), compare(out, ref_out)
    cl = compare_lse(lse, ref_lse)
    assert cl, str(cl)
