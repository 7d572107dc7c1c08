"""Property-based fuzzing of both kernels against the float64 reference (Triton interpreter on CPU).

Hypothesis draws random valid problems -- batch shapes with lengths 0 and 1, contexts of 0, page sizes
that are not powers of two, head sizes {16, 32, 48, 64, 80}, GQA ratios, windows (either side, 0
included), sinks (with -inf heads), ALiBi, causal or not, split/nhd/hnd caches, k=None, fp8 caches,
fp16/fp32, both API forms, the softmax LSE output (``return_lse``, Pythonic forms), and (window-prefill)
the query/key tile sizes -- and compares each run with ``attn_reference``. CI runs ``FUZZ_EXAMPLES``
examples per kernel (default 25, deterministic: ``derandomize=True``); ``nox -s fuzz`` runs 500. Nothing
is stored on disk (``database=None``).
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch
from conftest import DEVICE, poison
from hd_util import FP8, cu_of, paged_case, paged_ref
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attn_reference import attention_varlen, compare, compare_lse, negative_control
from prefix_prefill import context_attention_fwd as pp_caf
from prefix_prefill import prefix_prefill
from window_prefill import Config, window_prefill
from window_prefill import context_attention_fwd as wp_caf

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "25"))
# GPU runs: each example is usually a new compiled variant (page size, head size and flags are
# constexprs), so the single GPU fuzz test costs ~1-2 s per example; FUZZ_GPU_EXAMPLES raises it.
GPU_EXAMPLES = int(os.environ.get("FUZZ_GPU_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
HEAD_SIZES = [16, 32, 48, 64, 80]
NEG_INF = float("-inf")

windows = st.tuples(
    st.one_of(st.just(-1), st.integers(0, 40)),
    st.one_of(st.just(-1), st.integers(0, 40)),
)


def _sinks(draw, heads: int) -> torch.Tensor:
    vals = draw(st.lists(st.one_of(st.floats(-3, 3), st.just(NEG_INF)), min_size=heads, max_size=heads))
    return torch.tensor(vals, dtype=torch.float32, device=DEVICE)


# ------------------------------------------------------------------------------------ window-prefill
@st.composite
def window_problems(draw) -> dict:
    lens = draw(st.lists(st.integers(0, 40), min_size=1, max_size=3))
    if sum(lens) == 0:  # at least one token (no filter: rejections waste the example budget)
        lens[0] = 1
    kv_heads = draw(st.integers(1, 2))
    heads = kv_heads * draw(st.sampled_from([1, 2, 3]))
    spec = {
        "lens": lens,
        "heads": heads,
        "kv_heads": kv_heads,
        "head": draw(st.sampled_from(HEAD_SIZES)),
        "dtype": draw(st.sampled_from([torch.float16, torch.float32])),
        "causal": draw(st.booleans()),
        "window": draw(windows),
        "scale": draw(st.one_of(st.none(), st.floats(0.05, 1.0))),
        "sinks_mode": draw(st.sampled_from([None, "denominator", "bias_key0"])),
        "config": Config(draw(st.sampled_from([16, 32])), draw(st.sampled_from([16, 32])), 1, 1, True),
        "softcap": draw(st.sampled_from([0.0, 0.0, 0.7, 5.0, 30.0])),
        "seed": draw(st.integers(0, 2**31 - 1)),
        "return_lse": draw(st.booleans()),  # with the Pythonic form only
        "alibi": draw(st.booleans()),  # with the Pythonic form only
    }
    spec["sinks"] = _sinks(draw, heads) if spec["sinks_mode"] else None
    # the vLLM form cannot express a window side of 0 (0 means unbounded there), a softcap nor ALiBi
    wp_only = 0 in spec["window"] or spec["softcap"] > 0 or spec["alibi"]
    spec["form"] = "wp" if wp_only else draw(st.sampled_from(["wp", "wcaf"]))
    return spec


@FUZZ
@given(p=window_problems())
def test_fuzz_window_prefill(p):
    _run_window_problem(p)


def _run_window_problem(p: dict) -> None:
    torch.manual_seed(p["seed"])
    lens, heads, kvh, d, dt = p["lens"], p["heads"], p["kv_heads"], p["head"], p["dtype"]
    total = sum(lens)
    q = torch.randn(total, heads, d, device=DEVICE).to(dt)
    k = torch.randn(total, kvh, d, device=DEVICE).to(dt)
    v = torch.randn(total, kvh, d, device=DEVICE).to(dt)
    cu = cu_of(lens)
    mode = p["sinks_mode"] or "denominator"
    slopes = (torch.rand(heads, device=DEVICE) * 0.5) if p["alibi"] else None
    out = poison(torch.empty_like(q))
    with_lse = p["form"] == "wp" and p["return_lse"]
    lse = poison(torch.empty(heads, total, dtype=torch.float32, device=DEVICE)) if with_lse else None
    if p["form"] == "wp":
        window_prefill(
            q,
            k,
            v,
            cu,
            max(lens),
            causal=p["causal"],
            window=p["window"],
            softmax_scale=p["scale"],
            sinks=p["sinks"],
            sinks_mode=mode,
            softcap=p["softcap"],
            alibi_slopes=slopes,
            out=out,
            return_lse=with_lse,
            lse=lse,
            validate=True,
            config=p["config"],
        )
    else:
        left, right = p["window"]
        wp_caf(
            q,
            k,
            v,
            out,
            cu[:-1],
            torch.tensor(lens, device=DEVICE),
            max(lens),
            p["causal"],
            p["scale"],
            None if left < 0 else left,
            None if right < 0 else right,
            p["sinks"],
            mode == "bias_key0",
            validate=True,
            config=p["config"],
        )
    ref = attention_varlen(
        q,
        k,
        v,
        cu,
        cu,
        causal=p["causal"],
        window=p["window"],
        softmax_scale=p["scale"],
        sinks=p["sinks"],
        sinks_mode=mode,
        softcap=p["softcap"],
        alibi_slopes=slopes,
        return_lse=with_lse,
    )
    if with_lse:
        ref, ref_lse = ref
        res_lse = compare_lse(lse, ref_lse)
        assert res_lse, f"lse: {res_lse} for {p}"
    res = compare(out, ref)
    assert res, f"{res} for {p}"


# ------------------------------------------------------------------------------------ prefix-prefill
@st.composite
def prefix_problems(draw) -> dict:
    seqs = draw(st.lists(st.tuples(st.integers(0, 48), st.integers(0, 24)), min_size=1, max_size=3))
    if sum(n for _, n in seqs) == 0:
        seqs[0] = (seqs[0][0], 1)
    kv_heads = draw(st.integers(1, 2))
    heads = kv_heads * draw(st.sampled_from([1, 2, 3]))
    layout = draw(st.sampled_from(["split", "nhd", "hnd"]))
    window = draw(windows)
    spec = {
        "seqs": seqs,
        "heads": heads,
        "kv_heads": kv_heads,
        "head": draw(st.sampled_from(HEAD_SIZES)),
        # tiles narrower and wider than a page, pages that are not powers of two
        "page": draw(st.sampled_from([1, 3, 5, 16, 17, 24, 32, 64, 144])),
        "layout": layout,
        "dtype": draw(st.sampled_from([torch.float16, torch.float32])),
        "causal": draw(st.booleans()),
        "window": window,
        "scale": draw(st.one_of(st.none(), st.floats(0.05, 1.0))),
        "alibi": draw(st.booleans()),
        "with_sinks": draw(st.booleans()),
        "kv_from_cache": draw(st.booleans()),
        "fp8": draw(st.booleans()),
        # the other form of the Triton kernel's plan choices that every problem may take
        "wide_offsets": draw(st.booleans()),  # int64 cache offsets where the plan takes int32
        "prefetch_ids": draw(st.booleans()),  # block ids read ahead, or not
        "no_merge": draw(st.booleans()),  # two pairs of loops where the plan merges the masked ones
        "no_granule": draw(st.booleans()),  # no granule edges where the plan takes them
        "no_fold": draw(st.booleans()),  # the logit scale not folded into exp2
        "softcap": draw(st.sampled_from([0.0, 0.0, 0.7, 5.0, 30.0])),
        "seed": draw(st.integers(0, 2**31 - 1)),
        "return_lse": draw(st.booleans()),  # with the Pythonic form only
    }
    spec["sinks"] = _sinks(draw, heads) if spec["with_sinks"] else None
    vllm_ok = layout == "split" and window[1] == -1 and spec["softcap"] == 0  # vLLM's form has no softcap
    spec["form"] = draw(st.sampled_from(["pp", "pcaf"])) if vllm_ok else "pp"
    return spec


@contextlib.contextmanager
def _triton_forms(p: dict):
    """The Triton kernel's plans with the drawn forms (``launch.plan`` wrapped for the test)."""
    from prefix_prefill import launch

    consts = {"WIDE_OFFSETS": True} if p["wide_offsets"] else {}
    consts["PREFETCH_IDS"] = p["prefetch_ids"]
    if p["no_merge"]:
        consts["MERGE_NEW"] = False
    if p["no_granule"]:
        consts["GRANULE"] = 0
    if p["no_fold"]:
        consts["FOLD_SCALE"] = False
    real = launch.plan

    def forms(problem):
        chosen = real(problem)
        return chosen.replace(constexprs=consts) if chosen.kernel == "triton" else chosen

    launch.plan = forms
    try:
        yield
    finally:
        launch.plan = real


@FUZZ
@given(p=prefix_problems())
def test_fuzz_prefix_prefill(p):
    with _triton_forms(p):
        _run_prefix_problem(p)


def _run_prefix_problem(p: dict) -> None:
    gen = torch.Generator().manual_seed(p["seed"])
    c = paged_case(
        p["seqs"],
        heads=p["heads"],
        kv_heads=p["kv_heads"],
        head=p["head"],
        page=p["page"],
        dtype=p["dtype"],
        layout=p["layout"],
        kv_from_cache=p["kv_from_cache"],
        fp8=p["fp8"],
        gen=gen,
    )
    alibi = (torch.rand(p["heads"], generator=gen) * 0.5).to(DEVICE) if p["alibi"] else None
    kw = {"causal": p["causal"], "softmax_scale": p["scale"], "alibi_slopes": alibi, "sinks": p["sinks"]}
    out = poison(torch.empty_like(c.q))
    with_lse = p["form"] == "pp" and p["return_lse"]
    shape = (c.q.shape[1], c.q.shape[0])
    lse = poison(torch.empty(shape, dtype=torch.float32, device=DEVICE)) if with_lse else None
    if p["form"] == "pp":
        prefix_prefill(
            c.q,
            c.k,
            c.v,
            c.k_cache,
            c.v_cache,
            c.block_table,
            c.cu_q,
            c.seq_lens,
            c.max_query_len,
            window=p["window"],
            kv_layout=c.layout,
            k_scale=c.k_scale,
            v_scale=c.v_scale,
            softcap=p["softcap"],
            out=out,
            return_lse=with_lse,
            lse=lse,
            validate=True,
            **kw,
        )
    else:
        left = p["window"][0]
        kc, vc = (
            (c.k_cache.view(torch.uint8), c.v_cache.view(torch.uint8)) if c.fp8 else (c.k_cache, c.v_cache)
        )
        pp_caf(
            c.q,
            c.k,
            c.v,
            out,
            "fp8" if c.fp8 else "auto",
            kc,
            vc,
            c.block_table,
            c.cu_q,
            c.seq_lens,
            None,
            c.max_query_len,
            torch.tensor([c.k_scale], device=DEVICE),
            torch.tensor([c.v_scale], device=DEVICE),
            alibi,
            left + 1 if left >= 0 else None,
            p["scale"],
            sinks=p["sinks"],
            causal=p["causal"],
            validate=True,
        )
    fp8 = FP8 if c.fp8 else None
    ref = paged_ref(c, window=p["window"], fp8_dtype=fp8, softcap=p["softcap"], return_lse=with_lse, **kw)
    if with_lse:
        ref, ref_lse = ref
        res_lse = compare_lse(lse, ref_lse)
        assert res_lse, f"lse: {res_lse} for {p}"
    res = compare(out, ref)
    assert res, f"{res} for {p}"


@pytest.mark.parametrize("kind", ["window_shift", "diagonal", "scale", "kv_head"])
def test_fuzz_harness_catches_a_wrong_kernel(kind):
    """Negative control: the comparison the fuzz tests make rejects a plausible wrong answer (rounded to
    the kernel's dtype) while accepting the kernel on the same problem."""
    torch.manual_seed(3)
    lens, window = [13, 30], (6, -1)
    q = torch.randn(sum(lens), 4, 48, device=DEVICE).half()
    k = torch.randn(sum(lens), 2, 48, device=DEVICE).half()
    v = torch.randn(sum(lens), 2, 48, device=DEVICE).half()
    cu = cu_of(lens)
    ref = attention_varlen(q, k, v, cu, cu, causal=True, window=window)
    out = window_prefill(q, k, v, cu, max(lens), causal=True, window=window)
    assert compare(out, ref)
    wrong = negative_control(q, k, v, cu, cu, kind, causal=True, window=window).to(out.dtype)
    assert not compare(wrong, ref), f"the harness accepts the {kind!r} control"


def test_fuzz_budget_is_configurable():
    assert EXAMPLES >= 1
    assert FUZZ.max_examples == EXAMPLES and FUZZ.derandomize and FUZZ.deadline is None


@pytest.mark.gpu
@settings(FUZZ, max_examples=max(EXAMPLES, GPU_EXAMPLES))
@given(p=window_problems())
def test_gpu_fuzz_window_prefill_many(p):
    test_fuzz_window_prefill.hypothesis.inner_test(p)


@pytest.mark.gpu
@settings(FUZZ, max_examples=max(EXAMPLES, GPU_EXAMPLES))
@given(p=prefix_problems())
def test_gpu_fuzz_prefix_prefill_many(p):
    test_fuzz_prefix_prefill.hypothesis.inner_test(p)
