"""Bad input -> ValueError/TypeError whose message names the offending argument."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE
from pp_cases import FP8_E4M3, make_case

from prefix_prefill import context_attention_fwd, prefix_prefill


def _base() -> dict:
    case = make_case(
        [(20, 9), (0, 5), (33, 12)],
        num_heads=4,
        num_kv_heads=2,
        head_size=64,
        page=16,
        dtype=torch.float16,
        device=DEVICE,
        table_pad=0,
    )
    return {
        "q": case.q,
        "k": case.k,
        "v": case.v,
        "o": torch.empty_like(case.q),
        "kv_cache_dtype": "auto",
        "k_cache": case.k_cache,
        "v_cache": case.v_cache,
        "b_loc": case.block_table,
        "b_start_loc": case.cu_seqlens_q,
        "b_seq_len": case.seq_lens,
        "max_seq_len": None,
        "max_input_len": case.max_query_len,
        "k_scale": torch.ones(1, device=DEVICE),
        "v_scale": torch.ones(1, device=DEVICE),
    }


def _set(**changes):
    def f(a):
        a.update({k: (v(a) if callable(v) else v) for k, v in changes.items()})

    return f


def _table(fn):
    def f(a):
        a["b_loc"] = fn(a["b_loc"].clone())
        a["validate"] = True

    return f


def _fp8(a):
    a["kv_cache_dtype"] = "fp8"
    a["k_cache"] = a["k_cache"].float().to(FP8_E4M3).view(torch.uint8)
    a["v_cache"] = a["v_cache"].float().to(FP8_E4M3).view(torch.uint8)


def _then(*fs):
    def f(a):
        for g in fs:
            g(a)

    return f


def _bad_table_entry(t):
    t[0, 1] = 10_000
    return t


def _bad_start_loc(a):
    cu = a["b_start_loc"].clone()
    cu[1] = cu[2] + 1
    a["b_start_loc"] = cu
    a["validate"] = True


# (id, mutation, exception type, text the message must contain)
BAD_INPUTS = [
    ("q-not-tensor", _set(q=lambda a: a["q"].tolist()), TypeError, "q"),
    ("q-rank", _set(q=lambda a: a["q"][:, 0]), ValueError, "q must be 3-D"),
    ("q-dtype", _set(q=lambda a: a["q"].to(torch.int32)), TypeError, "q must be float16"),
    (
        "q-stride",
        _set(q=lambda a: a["q"].transpose(1, 2).contiguous().transpose(1, 2)),
        ValueError,
        "q must have unit",
    ),
    ("head-size", _set(q=lambda a: torch.randn(26, 4, 288, device=DEVICE).half()), ValueError, "head size"),
    ("k-without-v", _set(v=None), ValueError, "k and v"),
    ("k-shape", _set(k=lambda a: a["k"][:, :, :32]), ValueError, "k must have shape"),
    ("k-dtype", _set(k=lambda a: a["k"].float()), TypeError, "k must have q's dtype"),
    ("v-stride", _set(v=lambda a: a["v"].transpose(1, 2).contiguous().transpose(1, 2)), ValueError, "v must"),
    ("k-cache-rank", _set(k_cache=lambda a: a["k_cache"][:, :, 0]), ValueError, "k_cache"),
    ("k-cache-dtype", _set(k_cache=lambda a: a["k_cache"].float()), TypeError, "k_cache"),
    ("v-cache-blocks", _set(v_cache=lambda a: a["v_cache"][:-1]), ValueError, "k_cache and v_cache"),
    (
        "cache-stride",
        _set(v_cache=lambda a: a["v_cache"].transpose(2, 3).contiguous().transpose(2, 3)),
        ValueError,
        "v_cache",
    ),
    ("kv-heads", _set(k=lambda a: a["k"][:, :1], v=lambda a: a["v"][:, :1]), ValueError, "kv heads"),
    ("head-multiple", _set(q=lambda a: a["q"][:, :3], o=lambda a: a["o"][:, :3]), ValueError, "multiple"),
    ("o-shape", _set(o=lambda a: a["o"][:-1]), ValueError, "o must have q's shape"),
    ("o-dtype", _set(o=lambda a: a["o"].float()), TypeError, "o must have q's dtype"),
    ("b-loc-dtype", _set(b_loc=lambda a: a["b_loc"].float()), TypeError, "b_loc"),
    ("b-loc-rank", _set(b_loc=lambda a: a["b_loc"].flatten()), ValueError, "b_loc"),
    ("b-loc-rows", _set(b_loc=lambda a: a["b_loc"][:1]), ValueError, "b_loc"),
    ("b-start-loc-len", _set(b_start_loc=lambda a: a["b_start_loc"][:-1]), ValueError, "b_start_loc"),
    ("b-seq-len-dtype", _set(b_seq_len=lambda a: a["b_seq_len"].float()), TypeError, "b_seq_len"),
    ("b-seq-len-device", _set(b_seq_len=lambda a: a["b_seq_len"].to("meta")), ValueError, "b_seq_len"),
    (
        "max-input-len-type",
        _set(max_input_len=lambda a: torch.tensor(a["max_input_len"])),
        TypeError,
        "max_input_len",
    ),
    ("sinks-len", _set(sinks=torch.zeros(3, device=DEVICE)), ValueError, "sinks"),
    ("sinks-dtype", _set(sinks=torch.zeros(4, dtype=torch.int32, device=DEVICE)), TypeError, "sinks"),
    ("alibi-len", _set(alibi_slopes=torch.zeros(5, device=DEVICE)), ValueError, "alibi_slopes"),
    ("kv-cache-dtype", _set(kv_cache_dtype="int8"), ValueError, "kv_cache_dtype"),
    ("auto-with-uint8", _then(_fp8, _set(kv_cache_dtype="auto")), ValueError, "kv_cache_dtype"),
    ("fp8-with-fp16-cache", _set(kv_cache_dtype="fp8"), TypeError, "k_cache"),
    ("fp8-out-without-fp8-o", _set(fp8_out_scale=0.5), TypeError, "o must be an fp8"),
    ("k-scale-shape", _then(_fp8, _set(k_scale=torch.ones(2, device=DEVICE))), ValueError, "k_scale"),
    ("sm-scale-type", _set(sm_scale="0.1"), TypeError, "sm_scale"),
    ("sliding-window-type", _set(sliding_window=4.0), TypeError, "sliding_window"),
    # device-value checks (validate=True)
    ("table-too-narrow", _table(lambda t: t[:, :1]), ValueError, "b_loc"),
    ("table-entry-outside", _table(_bad_table_entry), ValueError, "b_loc"),
    (
        "seq-len-below-query",
        _set(b_seq_len=lambda a: a["b_seq_len"] - 15, validate=True),
        ValueError,
        "b_seq_len",
    ),
    ("start-loc-decreasing", _bad_start_loc, ValueError, "b_start_loc"),
    ("max-input-len-small", _set(max_input_len=4, validate=True), ValueError, "max_input_len"),
]


@pytest.mark.parametrize(
    ("mutate", "exc", "text"), [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS]
)
def test_bad_inputs_vllm_form(mutate, exc, text):
    a = _base()
    mutate(a)
    o_before = a["o"].clone() if isinstance(a["o"], torch.Tensor) and a["o"].device.type != "meta" else None
    with pytest.raises(exc) as info:
        context_attention_fwd(**a)
    assert text in str(info.value), str(info.value)
    if o_before is not None:  # nothing was launched
        assert torch.equal(a["o"].view(torch.uint8), o_before.view(torch.uint8))


def test_bad_input_table_is_large_enough():
    assert len(BAD_INPUTS) >= 15


def _py_args() -> tuple[list, dict]:
    a = _base()
    pos = [a["q"], a["k"], a["v"], a["k_cache"], a["v_cache"], a["b_loc"], a["b_start_loc"], a["b_seq_len"]]
    return pos, {"max_query_len": a["max_input_len"]}


PY_BAD = [
    ("window-entry", {"window": (-2, 0)}, ValueError, "window"),
    ("window-type", {"window": 5}, TypeError, "window"),
    ("kv-layout", {"kv_layout": "nchw"}, ValueError, "kv_layout"),
    ("layout-rank", {"kv_layout": "nhd"}, ValueError, "k_cache"),
    ("out-dtype", {"out": "float32"}, TypeError, "out"),
    ("softmax-scale", {"softmax_scale": float("inf")}, ValueError, "softmax_scale"),
    ("softcap-negative", {"softcap": -0.5}, ValueError, "softcap"),
    ("softcap-inf", {"softcap": float("inf")}, ValueError, "softcap"),
    ("softcap-type", {"softcap": "30"}, TypeError, "softcap"),
    ("max-query-len-negative", {"max_query_len": -1}, ValueError, "max_query_len"),
    ("cu-seqlens-validate", {"max_query_len": 3, "validate": True}, ValueError, "max_query_len"),
]


@pytest.mark.parametrize(("kw", "exc", "text"), [c[1:] for c in PY_BAD], ids=[c[0] for c in PY_BAD])
def test_bad_inputs_pythonic_form(kw, exc, text):
    pos, base = _py_args()
    kw = dict(kw)
    if kw.get("out") == "float32":
        kw["out"] = torch.empty(pos[0].shape, dtype=torch.float32, device=DEVICE)
    base.update(kw)
    mq = base.pop("max_query_len")
    with pytest.raises(exc) as info:
        prefix_prefill(*pos, mq, **base)
    assert text in str(info.value), str(info.value)
