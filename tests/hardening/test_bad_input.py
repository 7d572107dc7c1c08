"""Malformed calls to all four public functions raise ValueError/TypeError naming the argument.

One table across both kernels (``window_prefill``, ``prefix_prefill``) and both API forms (Pythonic and
vLLM drop-in ``context_attention_fwd``). Each row: the call (a mutation of a valid base call), the
exception type, the argument name that must appear in the message and a piece of text saying what
was expected. Rows the current code does not reject are ``xfail(strict=True)`` with the reason: they
document a gap for the package owners (and fail loudly once it is fixed, so the mark gets removed).
Device-value rows set ``validate=True`` (the checks that need a host sync are opt-in).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from conftest import DEVICE, ON_GPU
from hd_util import FP8, cu_of, paged_case

from prefix_prefill import context_attention_fwd as pp_caf
from prefix_prefill import prefix_prefill
from window_prefill import context_attention_fwd as wp_caf
from window_prefill import window_prefill

T, H, HKV, D = 24, 4, 2, 32
FP8_E5M2 = torch.float8_e5m2
LENS = [10, 14]
PAGED_SEQS = [(20, 9), (0, 5), (33, 12)]  # (context, query) -> 26 query rows, page 16


def _t(*shape: int, dtype: torch.dtype = torch.float16, device: str = DEVICE) -> torch.Tensor:
    return torch.randn(shape, device="cpu").to(device=device, dtype=dtype)


def _last_stride_2(t: torch.Tensor) -> torch.Tensor:
    """The same values with a last-dimension stride of 2 (a strided view of a wider tensor)."""
    wide = torch.empty((*t.shape[:-1], 2 * t.shape[-1]), dtype=t.dtype, device=t.device)
    wide[..., ::2] = t
    return wide[..., ::2]


def _meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype, device="meta")


def _strided_1d(t: torch.Tensor) -> torch.Tensor:
    """``t`` (1-D) as a stride-2 view of a buffer whose other entries are garbage."""
    buf = torch.full((2 * t.shape[0],), 7, dtype=t.dtype, device=t.device)
    buf[::2] = t
    return buf[::2]


# ----------------------------------------------------------------------------------- base calls
def _wbase() -> dict:
    return {
        "q": _t(T, H, D),
        "k": _t(T, HKV, D),
        "v": _t(T, HKV, D),
        "cu_seqlens": cu_of(LENS),
        "max_seqlen": max(LENS),
    }


def _cbase() -> dict:
    q = _t(T, H, D)
    return {
        "q": q,
        "k": _t(T, HKV, D),
        "v": _t(T, HKV, D),
        "o": torch.empty_like(q),
        "b_start_loc": cu_of(LENS)[:-1],
        "b_seq_len": torch.tensor(LENS, dtype=torch.int32, device=DEVICE),
        "max_input_len": max(LENS),
    }


def _pbase(layout: str = "nhd") -> dict:
    c = paged_case(PAGED_SEQS, heads=H, kv_heads=HKV, head=D, page=16, dtype=torch.float16, layout=layout,
                   table_pad=0)  # fmt: skip
    return {
        "q": c.q,
        "k": c.k,
        "v": c.v,
        "k_cache": c.k_cache,
        "v_cache": c.v_cache,
        "block_table": c.block_table,
        "cu_seqlens_q": c.cu_q,
        "seq_lens": c.seq_lens,
        "max_query_len": c.max_query_len,
        "kv_layout": layout,
    }


def _vbase() -> dict:
    b = _pbase("split")
    return {
        "q": b["q"],
        "k": b["k"],
        "v": b["v"],
        "o": torch.empty_like(b["q"]),
        "kv_cache_dtype": "auto",
        "k_cache": b["k_cache"],
        "v_cache": b["v_cache"],
        "b_loc": b["block_table"],
        "b_start_loc": b["cu_seqlens_q"],
        "b_seq_len": b["seq_lens"],
        "max_seq_len": None,
        "max_input_len": b["max_query_len"],
        "k_scale": torch.ones(1, device=DEVICE),
        "v_scale": torch.ones(1, device=DEVICE),
    }


Mut = Callable[[dict], None]


def _set(**changes: object) -> Mut:
    """Replace arguments; a callable value is called with the argument dict first."""

    def f(a: dict) -> None:
        a.update({k: (v(a) if callable(v) else v) for k, v in changes.items()})

    return f


def _val(**changes: object) -> Mut:
    """Like :func:`_set`, plus ``validate=True``."""
    return _set(**changes, validate=True)


def _both(*muts: Mut) -> Mut:
    def f(a: dict) -> None:
        for m in muts:
            m(a)

    return f


def _caches(fn: Callable[[torch.Tensor], torch.Tensor]) -> Mut:
    """Apply ``fn`` to both caches (whatever the API form calls them)."""
    return _set(k_cache=lambda a: fn(a["k_cache"]), v_cache=lambda a: fn(a["v_cache"]))


def _fp8_cache(a: dict) -> None:
    a["kv_cache_dtype"] = "fp8"
    a["k_cache"] = a["k_cache"].float().to(FP8).view(torch.uint8)
    a["v_cache"] = a["v_cache"].float().to(FP8).view(torch.uint8)


def _table_entry(value: int, key: str) -> Mut:
    def f(a: dict) -> None:
        t = a[key].clone()
        t[2, 1] = value  # sequence 2 (context 33) reads pages 0..2
        a[key] = t
        a["validate"] = True

    return f


def _call_wp(a: dict) -> object:
    return window_prefill(a.pop("q"), a.pop("k"), a.pop("v"), a.pop("cu_seqlens"), a.pop("max_seqlen"), **a)


def _call_pp(a: dict) -> object:
    pos = [a.pop(n) for n in ("q", "k", "v", "k_cache", "v_cache", "block_table", "cu_seqlens_q",
                              "seq_lens", "max_query_len")]  # fmt: skip
    return prefix_prefill(*pos, **a)


FORMS: dict[str, tuple[Callable[[], dict], Callable[[dict], object]]] = {
    "wp": (_wbase, _call_wp),
    "wcaf": (_cbase, lambda a: wp_caf(**a)),
    "pp": (_pbase, _call_pp),
    "pcaf": (_vbase, lambda a: pp_caf(**a)),
}

# (id, form, mutation, exception, argument name in the message, expected-text in the message, xfail)
# fmt: off
CASES: list[tuple[str, str, Mut, type[Exception], str, str, str | None]] = [
    # ---------------------------------------------------------------- window_prefill (Pythonic)
    ("q-rank-2", "wp", _set(q=lambda a: a["q"][:, 0]), ValueError, "q", "3-D", None),
    ("k-head-size", "wp", _set(k=_t(T, HKV, 16), v=_t(T, HKV, 16)), ValueError, "k", "head_dim", None),
    ("v-head-size", "wp", _set(v=_t(T, HKV, 16)), ValueError, "v", "shape", None),
    ("heads-not-multiple", "wp", _set(k=_t(T, 3, D), v=_t(T, 3, D)), ValueError, "num_kv_heads", "multiple",
     None),
    ("kv-heads-above-q", "wp", _set(k=_t(T, 8, D), v=_t(T, 8, D)), ValueError, "num_kv_heads", "multiple",
     None),
    ("zero-heads", "wp", _set(q=_t(T, 0, D)), ValueError, "q", "head", None),
    ("k-dtype", "wp", _set(k=lambda a: a["k"].float()), TypeError, "k", "q dtype", None),
    ("q-int-dtype", "wp", _set(q=lambda a: a["q"].to(torch.int32)), TypeError, "q", "float16", None),
    ("out-dtype", "wp", _set(out=_t(T, H, D, dtype=torch.float32)), TypeError, "out", "q dtype", None),
    ("out-shape", "wp", _set(out=_t(T, H, D + 1)), ValueError, "out", "shape", None),
    ("k-on-meta", "wp", _set(k=lambda a: _meta(a["k"])), ValueError, "k", "q is on", None),
    ("cu-seqlens-on-meta", "wp", _set(cu_seqlens=lambda a: _meta(a["cu_seqlens"])), ValueError, "cu_seqlens",
     "q is on", None),
    ("sinks-on-meta", "wp", _set(sinks=torch.zeros(H, device="meta")), ValueError, "sinks", "q is on", None),
    ("q-last-stride", "wp", _set(q=lambda a: _last_stride_2(a["q"])), ValueError, "q", "unit stride", None),
    ("head-size-288", "wp", _set(q=_t(T, H, 288), k=_t(T, HKV, 288), v=_t(T, HKV, 288)), ValueError,
     "head_dim", "256", None),
    ("window-left-below-1", "wp", _set(window=(-2, 3)), ValueError, "window", "-1", None),
    ("window-right-below-1", "wp", _set(window=(3, -7)), ValueError, "window", "-1", None),
    ("sinks-length", "wp", _set(sinks=torch.zeros(H + 1, device=DEVICE)), ValueError, "sinks", "num_heads",
     None),
    ("sinks-dtype", "wp", _set(sinks=torch.zeros(H, dtype=torch.int32, device=DEVICE)), TypeError, "sinks",
     "float32", None),
    ("alibi-length", "wp", _set(alibi_slopes=torch.zeros(H + 1, device=DEVICE)), ValueError, "alibi_slopes",
     "num_heads", None),
    ("alibi-dtype", "wp", _set(alibi_slopes=torch.zeros(H, dtype=torch.int32, device=DEVICE)), TypeError,
     "alibi_slopes", "float32", None),
    ("alibi-list", "wp", _set(alibi_slopes=[0.5] * H), TypeError, "alibi_slopes", "Tensor", None),
    ("alibi-on-meta", "wp", _set(alibi_slopes=torch.zeros(H, device="meta")), ValueError, "alibi_slopes",
     "q is on", None),
    ("fp8-out-no-scale", "wp", _set(out=torch.empty(T, H, D, dtype=torch.float8_e4m3fn, device=DEVICE)),
     TypeError, "out", "fp8_out_scale", None),
    ("fp8-out-scale-no-out", "wp", _set(fp8_out_scale=0.5), ValueError, "fp8_out_scale", "needs out", None),
    ("fp8-out-scale-16-bit-out", "wp", _set(out=_t(T, H, D), fp8_out_scale=0.5), TypeError, "out", "fp8",
     None),
    ("fp8-out-scale-negative", "wp", _set(out=torch.empty(T, H, D, dtype=torch.float8_e5m2, device=DEVICE),
     fp8_out_scale=-1.0), ValueError, "fp8_out_scale", "positive", None),
    ("fp8-out-scale-two", "wp", _set(out=torch.empty(T, H, D, dtype=torch.float8_e5m2, device=DEVICE),
     fp8_out_scale=torch.ones(2, device=DEVICE)), ValueError, "fp8_out_scale", "one value", None),
    ("cu-seqlens-dtype", "wp", _set(cu_seqlens=lambda a: a["cu_seqlens"].to(torch.int16)), TypeError,
     "cu_seqlens", "int32", None),
    ("cu-seqlens-decreasing", "wp", _val(cu_seqlens=torch.tensor([0, 14, 10], device=DEVICE)), ValueError,
     "cu_seqlens", "non-decreasing", None),
    ("cu-seqlens-beyond-tokens", "wp", _val(cu_seqlens=torch.tensor([0, 10, 25], device=DEVICE)), ValueError,
     "cu_seqlens", "24 tokens", None),
    ("max-seqlen-too-small", "wp", _val(max_seqlen=13), ValueError, "max_seqlen", "longest", None),
    ("return-lse-int", "wp", _set(return_lse=1), TypeError, "return_lse", "bool", None),
    ("return-lse-str", "wp", _set(return_lse="yes"), TypeError, "return_lse", "bool", None),
    ("lse-without-return-lse", "wp", _set(lse=torch.empty(H, T, device=DEVICE)), ValueError, "lse",
     "return_lse=True", None),
    ("lse-dtype", "wp", _set(return_lse=True, lse=torch.empty(H, T, dtype=torch.float16, device=DEVICE)),
     TypeError, "lse", "float32", None),
    ("lse-token-major", "wp", _set(return_lse=True, lse=torch.empty(T, H, device=DEVICE)), ValueError, "lse",
     "[num_heads, total_tokens]", None),
    ("lse-on-meta", "wp", _set(return_lse=True, lse=torch.empty(H, T, device="meta")), ValueError, "lse",
     "q is on", None),
    ("lse-last-stride", "wp", _set(return_lse=True, lse=torch.empty(T, H, device=DEVICE).t()), ValueError,
     "lse", "unit stride", None),
    # ---------------------------------------------------------- window context_attention_fwd (vLLM)
    ("k-rank-4", "wcaf", _set(k=lambda a: a["k"][None]), ValueError, "k", "3-D", None),
    ("heads-not-multiple", "wcaf", _set(k=_t(T, 3, D), v=_t(T, 3, D)), ValueError, "num_kv_heads", "multiple",
     None),
    ("o-dtype", "wcaf", _set(o=_t(T, H, D, dtype=torch.float32)), TypeError, "o", "q dtype", None),
    ("v-dtype", "wcaf", _set(v=lambda a: a["v"].to(torch.bfloat16)), TypeError, "v", "q dtype", None),
    ("o-on-meta", "wcaf", _set(o=lambda a: _meta(a["o"])), ValueError, "o", "q is on", None),
    ("b-seq-len-on-meta", "wcaf", _set(b_seq_len=lambda a: _meta(a["b_seq_len"])), ValueError, "b_seq_len",
     "q is on", None),
    ("v-last-stride", "wcaf", _set(v=lambda a: _last_stride_2(a["v"])), ValueError, "v", "unit stride", None),
    ("head-size-288", "wcaf", _set(q=_t(T, H, 288), k=_t(T, HKV, 288), v=_t(T, HKV, 288), o=_t(T, H, 288)),
     ValueError, "head_dim", "256", None),
    ("b-start-loc-length", "wcaf", _set(b_start_loc=torch.zeros(5, dtype=torch.int32, device=DEVICE)),
     ValueError, "b_start_loc", "batch", None),
    ("b-start-loc-overlap", "wcaf", _val(b_start_loc=torch.tensor([10, 4], dtype=torch.int32, device=DEVICE)),
     ValueError, "b_start_loc", "overlap", None),
    ("b-seq-len-beyond-tokens", "wcaf", _val(b_seq_len=torch.tensor([10, 15], device=DEVICE)), ValueError,
     "b_seq_len", "beyond", None),
    ("b-seq-len-negative", "wcaf", _val(b_seq_len=torch.tensor([10, -1], device=DEVICE)), ValueError,
     "b_seq_len", "negative", None),
    ("b-start-loc-negative", "wcaf", _val(b_start_loc=torch.tensor([-1, 10], device=DEVICE)), ValueError,
     "b_start_loc", "negative", None),
    ("max-input-len-too-small", "wcaf", _val(max_input_len=12), ValueError, "max_input_len", "longest", None),
    ("sinks-length", "wcaf", _set(sinks=torch.zeros(H - 1, device=DEVICE)), ValueError, "sinks", "num_heads",
     None),
    ("sliding-window-type", "wcaf", _set(sliding_window_q=2.5), TypeError, "sliding_window_q", "int", None),
    # ---------------------------------------------------------------- prefix_prefill (Pythonic)
    ("q-rank-2", "pp", _set(q=lambda a: a["q"][:, 0]), ValueError, "q", "3-D", None),
    ("k-head-size", "pp", _set(k=lambda a: a["k"][..., :16], v=lambda a: a["v"][..., :16]), ValueError, "k",
     "head_size", None),
    ("v-head-size", "pp", _set(v=lambda a: a["v"][..., :16]), ValueError, "v", "head_size", None),
    ("heads-not-multiple", "pp", _set(q=lambda a: a["q"][:, :3]), ValueError, "k_cache", "multiple", None),
    ("k-cache-head-size", "pp", _set(q=lambda a: a["q"][..., :16], k=lambda a: a["k"][..., :16],
                                     v=lambda a: a["v"][..., :16]), ValueError, "k_cache", "head size", None),
    ("k-dtype", "pp", _set(k=lambda a: a["k"].float()), TypeError, "k", "q's dtype", None),
    ("k-cache-dtype", "pp", _caches(lambda t: t.float()), TypeError, "k_cache", "q's dtype", None),
    ("cache-dtypes-differ", "pp", _set(v_cache=lambda a: a["v_cache"].to(FP8)), TypeError, "v_cache",
     "share a dtype", None),
    ("uint8-with-fp16-cache", "pp", _set(k_cache=lambda a: a["k_cache"].to(FP8).view(torch.uint8)), TypeError,
     "k_cache", "share a dtype", None),
    ("out-fp8", "pp", _set(out=lambda a: torch.empty(a["q"].shape, dtype=FP8, device=DEVICE)), TypeError,
     "out", "q's dtype", None),
    ("k-on-meta", "pp", _set(k=lambda a: _meta(a["k"])), ValueError, "k", "q is on", None),
    ("k-cache-on-meta", "pp", _set(k_cache=lambda a: _meta(a["k_cache"])), ValueError, "k_cache", "q is on",
     None),
    ("block-table-on-meta", "pp", _set(block_table=lambda a: _meta(a["block_table"])), ValueError,
     "block_table", "q is on", None),
    ("alibi-on-meta", "pp", _set(alibi_slopes=torch.zeros(H, device="meta")), ValueError, "alibi_slopes",
     "q is on", None),
    ("q-last-stride", "pp", _set(q=lambda a: _last_stride_2(a["q"])), ValueError, "q", "unit stride", None),
    ("k-cache-last-stride", "pp", _set(k_cache=lambda a: _last_stride_2(a["k_cache"])), ValueError, "k_cache",
     "unit stride", None),
    ("head-size-288", "pp", _set(q=_t(26, H, 288)), ValueError, "q", "256", None),
    ("k-without-v", "pp", _set(v=None), ValueError, "v", "both", None),
    ("kv-layout", "pp", _set(kv_layout="nchw"), ValueError, "kv_layout", "'hnd'", None),
    ("window-below-1", "pp", _set(window=(-3, -1)), ValueError, "window", "-1", None),
    ("cu-seqlens-q-length", "pp", _set(cu_seqlens_q=lambda a: a["cu_seqlens_q"][:-1]), ValueError,
     "cu_seqlens_q", "batch + 1", None),
    ("cu-seqlens-q-decreasing", "pp", _val(cu_seqlens_q=torch.tensor([0, 9, 6, 26], device=DEVICE)),
     ValueError, "cu_seqlens_q", "non-decreasing", None),
    ("seq-lens-below-query", "pp", _val(seq_lens=torch.tensor([29, 4, 45], device=DEVICE)), ValueError,
     "seq_lens", "query length", None),
    ("block-table-too-narrow", "pp", _val(block_table=lambda a: a["block_table"][:, :2]), ValueError,
     "block_table", "narrow", None),
    ("block-table-negative", "pp", _table_entry(-1, "block_table"), ValueError, "block_table", "outside",
     None),
    ("block-table-outside", "pp", _table_entry(10_000, "block_table"), ValueError, "block_table", "outside",
     None),
    ("sinks-length", "pp", _set(sinks=torch.zeros(H + 2, device=DEVICE)), ValueError, "sinks", "num_heads",
     None),
    ("alibi-length", "pp", _set(alibi_slopes=torch.zeros(1, device=DEVICE)), ValueError, "alibi_slopes",
     "num_heads", None),
    ("return-lse-int", "pp", _set(return_lse=0), TypeError, "return_lse", "bool", None),
    ("return-lse-tensor", "pp", _set(return_lse=torch.tensor(True)), TypeError, "return_lse", "bool", None),
    ("lse-without-return-lse", "pp", _set(lse=torch.empty(H, 26, device=DEVICE)), ValueError, "lse",
     "return_lse=True", None),
    ("lse-dtype", "pp", _set(return_lse=True, lse=torch.empty(H, 26, dtype=torch.float64, device=DEVICE)),
     TypeError, "lse", "float32", None),
    ("lse-shape", "pp", _set(return_lse=True, lse=torch.empty(H, 25, device=DEVICE)), ValueError, "lse",
     "[num_heads, total_q]", None),
    ("lse-on-meta", "pp", _set(return_lse=True, lse=torch.empty(H, 26, device="meta")), ValueError, "lse",
     "q is on", None),
    ("lse-last-stride", "pp", _set(return_lse=True, lse=torch.empty(26, H, device=DEVICE).t()), ValueError,
     "lse", "unit stride", None),
    # --------------------------------------------------------- prefix context_attention_fwd (vLLM)
    ("k-rank-4", "pcaf", _set(k=lambda a: a["k"][None]), ValueError, "k", "shape", None),
    ("v-head-size", "pcaf", _set(v=lambda a: a["v"][..., :16]), ValueError, "v", "head_size", None),
    ("o-dtype", "pcaf", _set(o=lambda a: a["o"].float()), TypeError, "o", "q's dtype", None),
    ("unknown-kv-cache-dtype", "pcaf", _set(kv_cache_dtype="int8"), ValueError, "kv_cache_dtype", "'fp8'",
     None),
    ("fp8-kv-cache-dtype-on-fp16-cache", "pcaf", _set(kv_cache_dtype="fp8"), TypeError, "k_cache", "uint8",
     None),
    ("auto-on-uint8-cache", "pcaf", _both(_fp8_cache, _set(kv_cache_dtype="auto")), ValueError,
     "kv_cache_dtype", "'fp8'", None),
    ("e4m3-name-on-e5m2-cache", "pcaf", _both(_fp8_cache, _caches(lambda t: t.view(FP8_E5M2))), TypeError,
     "k_cache", "kv_cache_dtype", None),
    ("k-cache-dtype", "pcaf", _caches(lambda t: t.float()), TypeError, "k_cache", "q's dtype", None),
    ("v-cache-on-meta", "pcaf", _set(v_cache=lambda a: _meta(a["v_cache"])), ValueError, "v_cache", "q is on",
     None),
    ("b-seq-len-on-meta", "pcaf", _set(b_seq_len=lambda a: _meta(a["b_seq_len"])), ValueError, "b_seq_len",
     "q is on", None),
    ("v-cache-last-stride", "pcaf", _set(v_cache=lambda a: _last_stride_2(a["v_cache"])), ValueError,
     "v_cache", "unit stride", None),
    ("head-size-288", "pcaf", _set(q=_t(26, H, 288)), ValueError, "q", "256", None),
    ("b-start-loc-length", "pcaf", _set(b_start_loc=lambda a: a["b_start_loc"][:-1]), ValueError,
     "b_start_loc", "batch + 1", None),
    ("b-start-loc-decreasing", "pcaf", _val(b_start_loc=torch.tensor([0, 9, 6, 26], device=DEVICE)),
     ValueError, "b_start_loc", "non-decreasing", None),
    ("b-seq-len-below-query", "pcaf", _val(b_seq_len=torch.tensor([29, 4, 45], device=DEVICE)), ValueError,
     "b_seq_len", "query length", None),
    ("b-loc-too-narrow", "pcaf", _val(b_loc=lambda a: a["b_loc"][:, :1]), ValueError, "b_loc", "narrow",
     None),
    ("b-loc-outside", "pcaf", _table_entry(10_000, "b_loc"), ValueError, "b_loc", "outside", None),
    ("alibi-length", "pcaf", _set(alibi_slopes=torch.zeros(H + 1, device=DEVICE)), ValueError,
     "alibi_slopes", "num_heads", None),
    ("sinks-length", "pcaf", _set(sinks=torch.zeros(H - 2, device=DEVICE)), ValueError, "sinks", "num_heads",
     None),
    ("fp8-out-scale-with-fp16-o", "pcaf", _set(fp8_out_scale=0.5), TypeError, "o", "fp8", None),
    ("fp8-o-without-out-scale", "pcaf", _set(o=lambda a: torch.empty(a["q"].shape, dtype=FP8, device=DEVICE)),
     TypeError, "o", "q's dtype", None),
    ("k-scale-shape", "pcaf", _both(_fp8_cache, _set(k_scale=torch.ones(2, device=DEVICE))), ValueError,
     "k_scale", "one value", None),
    ("sliding-window-type", "pcaf", _set(sliding_window=4.0), TypeError, "sliding_window", "int", None),
]
# fmt: on


def _params() -> list:
    out = []
    for cid, form, mut, exc, name, expect, gap in CASES:
        # only "DID NOT RAISE" is expected: a fix whose message misses the argument name still fails
        marks = [pytest.mark.xfail(strict=True, raises=pytest.fail.Exception, reason=gap)] if gap else []
        out.append(pytest.param(form, mut, exc, name, expect, id=f"{form}-{cid}", marks=marks))
    return out


@pytest.mark.parametrize(("form", "mutate", "exc", "name", "expect"), _params())
def test_bad_input(form, mutate, exc, name, expect):
    base, call = FORMS[form]
    args = base()
    mutate(args)
    outs = [args[n] for n in ("o", "out") if isinstance(args.get(n), torch.Tensor)]
    before = [o.clone() for o in outs if o.device.type != "meta"]
    with pytest.raises(exc) as info:
        call(args)
    msg = str(info.value)
    assert name in msg, f"message does not name {name!r}: {msg}"
    assert expect in msg, f"message does not say {expect!r}: {msg}"
    for o, b in zip(outs, before, strict=False):  # nothing was launched: the output is untouched
        assert torch.equal(o.view(torch.uint8), b.view(torch.uint8))


def test_table_covers_both_kernels_and_forms():
    forms = [c[1] for c in CASES]
    assert len(CASES) >= 30
    assert all(forms.count(f) >= 10 for f in FORMS), {f: forms.count(f) for f in FORMS}
    ids = [f"{c[1]}-{c[0]}" for c in CASES]
    assert len(set(ids)) == len(ids)


STRIDED_1D = [
    ("wp", "cu_seqlens", None),
    ("wp", "sinks", None),
    ("wp", "alibi_slopes", None),
    ("wcaf", "b_seq_len", None),
    ("wcaf", "b_start_loc", None),
    ("pp", "cu_seqlens_q", None),
    ("pp", "seq_lens", None),
    ("pp", "sinks", None),
    ("pp", "alibi_slopes", None),
    ("pp", "block_table", None),
]


def _strided_params() -> list:
    out = []
    for form, name, gap in STRIDED_1D:
        marks = [pytest.mark.xfail(strict=True, raises=AssertionError, reason=gap)] if gap else []
        out.append(pytest.param(form, name, id=f"{form}-{name}", marks=marks))
    return out


@pytest.mark.parametrize(("form", "name"), _strided_params())
def test_strided_small_tensors_read_correctly_or_rejected(form, name):
    """A 1-D index/per-head tensor given as a stride-2 view (or a block table whose rows are strided):
    either rejected with a message naming it, or read correctly (same bits as the contiguous call)."""
    base, call = FORMS[form]
    a = base()
    if name in ("sinks", "alibi_slopes"):
        a[name] = torch.rand(H, device=DEVICE) * (0.5 if name == "alibi_slopes" else 2.0)
    out_key = "o" if "o" in a else "out"
    if out_key == "out":
        a["out"] = torch.empty(a["q"].shape, dtype=a["q"].dtype, device=DEVICE)
    want = dict(a, **{out_key: torch.full_like(a[out_key], float("nan"))})
    if name == "block_table":
        wide = torch.full(
            (a[name].shape[0], 2 * a[name].shape[1]), 10_000, dtype=a[name].dtype, device=DEVICE
        )
        wide[:, ::2] = a[name]
        strided = wide[:, ::2]
    else:
        strided = _strided_1d(a[name])
    got = dict(a, **{out_key: torch.full_like(a[out_key], float("nan")), name: strided})
    call(want)
    try:
        call(got)
    except (ValueError, TypeError) as e:
        assert name in str(e), str(e)
        return
    same = torch.equal(got[out_key].nan_to_num(7.0), want[out_key].nan_to_num(7.0))
    assert same, f"a strided {name} was read as if contiguous"


@pytest.mark.gpu
@pytest.mark.parametrize("what", ["o", "k_cache"])
def test_gpu_fp8_without_hardware_support(what, monkeypatch):
    """fp8 e4m3fn output/cache on a device below compute capability 8.9 is rejected (simulated by
    patching the capability query; H200 itself supports fp8)."""
    if getattr(torch.version, "hip", None):
        pytest.skip("NVIDIA capability check")
    a = _vbase()
    if what == "o":
        a["o"] = torch.empty(a["q"].shape, dtype=FP8, device=DEVICE)
        a["fp8_out_scale"] = 1.0
    else:
        _fp8_cache(a)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args, **kw: (8, 0))
    with pytest.raises(ValueError) as info:
        pp_caf(**a)
    assert what in str(info.value) and "8.9" in str(info.value), str(info.value)


@pytest.mark.skipif(ON_GPU, reason="meta-device rows are the CPU stand-in for a second device")
def test_meta_device_rows_exist():
    assert sum("meta" in c[0] for c in CASES) >= 8
