"""Malformed device metadata on the default path (no ``validate``): never a read or write outside the
tensors, every row written, the status flagged; and ``validate=True`` raises on the same calls.

Each case takes a well-formed call and breaks one piece of its device metadata: block ids outside the
cache (too large, negative), a table too narrow for ``seq_lens``, ``cu_seqlens`` decreasing, negative
or past the tokens, a max length smaller than a sequence (and 0), ``seq_lens`` shorter than the query,
vLLM's start/length form with negative or overlong entries. The call runs into a NaN-poisoned output
with a ``status=`` tensor: every row a sequence spans (after clamping into the tensors) is finite,
rows past the grid are exactly 0, sequences the malformation does not touch still match the float64
reference, and the status holds the case's bit (:mod:`prefill_runtime.status`). Under the interpreter
an out-of-bounds access raises, so a pass here also says "in bounds"; on the GPU
``bench/malformed_calls.py`` runs the same kinds of calls on every plan under compute-sanitizer. The
status also reaches the kernels through the custom ops, under ``torch.compile`` and (GPU) in a CUDA
graph whose metadata buffers are overwritten between replays.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import DEVICE, poison
from hd_util import cu_of, dense_case, dense_ref, paged_case, paged_ref

from attn_reference import compare
from prefill_runtime import new_status, status
from prefix_prefill import context_attention_fwd as pp_caf
from prefix_prefill import explain as pp_explain
from prefix_prefill import prefix_prefill
from window_prefill import context_attention_fwd as wp_caf
from window_prefill import explain as wp_explain
from window_prefill import window_prefill

PP_SEQS = [(20, 9), (0, 5), (33, 12)]  # (context, query): 26 query rows, page 16
WP_LENS = [10, 14]  # 24 tokens


# ------------------------------------------------------------------------------------ prefix-prefill
def _pp_case(layout: str = "nhd"):
    return paged_case(PP_SEQS, heads=1, kv_heads=1, head=32, page=16, dtype=torch.float16, layout=layout)


def _bad_id(c, value):
    bt = c.block_table.clone()
    bt[0, 1] = value  # sequence 0's second page (its context has two)
    return {"block_table": bt}


def _narrow(c):
    return {"block_table": c.block_table[:, :1].clone()}  # sequence 2 needs 3 pages, 0 needs 2


def _cu(c, values):
    return {"cu_seqlens_q": torch.tensor(values, dtype=torch.int32, device=DEVICE)}


def _seq_len(c, b, value):
    sl = c.seq_lens.clone()
    sl[b] = value
    return {"seq_lens": sl}


# (id, mutation, status bit, sequences the mutation leaves correct)
PP_CASES = [
    ("block-id-past-cache", lambda c: _bad_id(c, c.num_blocks + 7), status.BLOCK_ID, [1, 2]),
    ("block-id-negative", lambda c: _bad_id(c, -3), status.BLOCK_ID, [1, 2]),
    ("block-id-huge", lambda c: _bad_id(c, 2**31 - 1), status.BLOCK_ID, [1, 2]),
    ("table-too-narrow", _narrow, status.TABLE_WIDTH, [1]),
    ("seq-len-past-table", lambda c: _seq_len(c, 1, 5 + 200), status.TABLE_WIDTH, [0, 2]),
    ("cu-decreasing", lambda c: _cu(c, [0, 9, 4, 26]), status.ROWS, []),
    ("cu-past-tokens", lambda c: _cu(c, [0, 9, 14, 40]), status.ROWS, [0, 1]),
    ("cu-negative", lambda c: _cu(c, [-6, 9, 14, 26]), status.ROWS, [1, 2]),
    ("seq-len-short", lambda c: _seq_len(c, 2, 3), status.SEQ_LEN, [0, 1]),
    ("seq-len-negative", lambda c: _seq_len(c, 0, -50), status.SEQ_LEN, [1, 2]),
    ("max-query-len-small", lambda c: {"max_query_len": 4}, status.MAX_LEN, []),
    ("max-query-len-zero", lambda c: {"max_query_len": 0}, status.MAX_LEN, []),
]


def _spans(cu: torch.Tensor, total: int) -> list[tuple[int, int]]:
    """Each sequence's rows as the kernels clamp them: ``[s, e)`` inside ``[0, total]``."""
    c = cu.tolist()
    spans = []
    for a, b in itertools.pairwise(c):
        s = min(max(a, 0), total)
        spans.append((s, min(max(b, s), total)))
    return spans


def _check_written(out: torch.Tensor, cu: torch.Tensor, max_len: int, block_m: int) -> None:
    """Every row of every clamped span finite; rows past a span's grid (``cdiv(max_len, block_m)`` tiles,
    at least one) exactly 0 where no other span's tiles cover them (malformed spans may overlap)."""
    grid_rows = max(-(-max_len // block_m), 1) * block_m
    spans = _spans(cu, out.shape[0])
    computed = torch.zeros(out.shape[0], dtype=torch.bool)
    for s, e in spans:
        computed[s : min(e, s + grid_rows)] = True
    for s, e in spans:
        assert torch.isfinite(out[s:e].float()).all(), f"rows [{s}, {e}) not all written"
        past = ~computed[s + grid_rows : e].to(out.device)
        assert (out[s + grid_rows : e][past].float() == 0).all(), "rows past the grid are not 0"


def _pp_call(c, args: dict, form: str, **kw) -> torch.Tensor:
    out = poison(torch.empty_like(c.q))
    bt, cu, sl, mq = args["block_table"], args["cu_seqlens_q"], args["seq_lens"], args["max_query_len"]
    if form == "vllm":
        one = torch.ones(1, device=DEVICE)
        pp_caf(c.q, c.k, c.v, out, "auto", c.k_cache, c.v_cache, bt, cu, sl, None, mq, one, one, **kw)
    else:
        prefix_prefill(c.q, c.k, c.v, c.k_cache, c.v_cache, bt, cu, sl, mq, kv_layout=c.layout, out=out, **kw)
    return out


# the vLLM form (split cache) for one case of each kind
VLLM_FORM = ("block-id-negative", "table-too-narrow", "cu-decreasing", "seq-len-short", "max-query-len-small")


@pytest.mark.parametrize(
    ("mutate", "bit", "intact", "form"),
    [pytest.param(*c[1:], form, id=f"{c[0]}-{form}") for c in PP_CASES for form in ("py", "vllm")
     if form == "py" or c[0] in VLLM_FORM],
)  # fmt: skip
def test_prefix_malformed(mutate, bit, intact, form):
    c = _pp_case("split" if form == "vllm" else "nhd")
    args = {"block_table": c.block_table, "cu_seqlens_q": c.cu_q, "seq_lens": c.seq_lens,
            "max_query_len": c.max_query_len}  # fmt: skip
    args.update(mutate(c))
    st = new_status(DEVICE)
    out = _pp_call(c, args, form, status=st)
    block_m = pp_explain(c.q, c.k, c.v, c.k_cache, c.v_cache, c.block_table, c.cu_q, c.seq_lens,
                         c.max_query_len, kv_layout=c.layout).block_m  # fmt: skip
    _check_written(out, args["cu_seqlens_q"], args["max_query_len"], block_m)
    assert int(st) & bit, f"status {status.status_names(int(st))} lacks {status.status_names(bit)}"
    if intact:
        ref = paged_ref(c)
        cu = c.cu_q.tolist()
        for b in intact:
            assert compare(out[cu[b] : cu[b + 1]], ref[cu[b] : cu[b + 1]]), f"sequence {b}"
    with pytest.raises(ValueError):
        _pp_call(c, args, form, validate=True)


def test_prefix_empty_cache_and_kv_from_cache():
    """A cache of no blocks with sequences that claim a context, and the new tokens' K/V read from a
    cache whose table names blocks outside it: finite rows, flagged."""
    c = _pp_case()
    empty_k, empty_v = c.k_cache[:0], c.v_cache[:0]
    st = new_status(DEVICE)
    out = poison(torch.empty_like(c.q))
    prefix_prefill(c.q, c.k, c.v, empty_k, empty_v, c.block_table, c.cu_q, c.seq_lens, c.max_query_len,
                   kv_layout="nhd", out=out, status=st)  # fmt: skip
    assert torch.isfinite(out.float()).all() and int(st) & status.BLOCK_ID
    kc = paged_case(PP_SEQS, heads=1, kv_heads=1, head=32, page=16, dtype=torch.float16, kv_from_cache=True)
    bt = kc.block_table.clone()
    bt[2, -1] = -1  # sequence 2's last page (its new tokens)
    st.zero_()
    out = poison(torch.empty_like(kc.q))
    prefix_prefill(kc.q, None, None, kc.k_cache, kc.v_cache, bt, kc.cu_q, kc.seq_lens, 4, out=out, status=st)
    _check_written(out, kc.cu_q, 4, pp_explain(kc.q, None, None, kc.k_cache, kc.v_cache, bt, kc.cu_q,
                                               kc.seq_lens, 4).block_m)  # fmt: skip
    assert int(st) == status.BLOCK_ID | status.MAX_LEN


def test_prefix_status_untouched_when_well_formed():
    """A well-formed call writes nothing into ``status`` (a set bit stays, nothing is added)."""
    c = _pp_case()
    st = torch.full((1,), status.SEQ_LEN, dtype=torch.int32, device=DEVICE)
    out = poison(torch.empty_like(c.q))
    prefix_prefill(c.q, c.k, c.v, c.k_cache, c.v_cache, c.block_table, c.cu_q, c.seq_lens, c.max_query_len,
                   out=out, status=st)  # fmt: skip
    assert int(st) == status.SEQ_LEN
    assert compare(out, paged_ref(c))


# ------------------------------------------------------------------------------------ window-prefill
WP_CASES = [
    ("cu-decreasing", {"cu": [0, 16, 12, 24]}, status.ROWS),
    ("cu-past-tokens", {"cu": [0, 10, 30]}, status.ROWS),
    ("cu-negative", {"cu": [-4, 10, 24]}, status.ROWS),
    ("max-seqlen-small", {"max_len": 5}, status.MAX_LEN),
    ("max-seqlen-zero", {"max_len": 0}, status.MAX_LEN),
]


@pytest.mark.parametrize(("change", "bit"), [c[1:] for c in WP_CASES], ids=[c[0] for c in WP_CASES])
def test_window_malformed(change, bit):
    d = dense_case(WP_LENS, 1, 1, 32, torch.float16)
    cu = torch.tensor(change.get("cu", d.cu.tolist()), dtype=torch.int32, device=DEVICE)
    max_len = change.get("max_len", d.max_len)
    st = new_status(DEVICE)
    out = poison(torch.empty_like(d.q))
    window_prefill(d.q, d.k, d.v, cu, max_len, window=(5, -1), out=out, status=st)
    _check_written(out, cu, max_len, wp_explain(d.q, d.k, d.v, cu, max_len, window=(5, -1)).block_m)
    assert int(st) & bit, status.status_names(int(st))
    with pytest.raises(ValueError):
        window_prefill(d.q, d.k, d.v, cu, max_len, window=(5, -1), validate=True)


# (id, starts, lens, status bit): vLLM's b_start_loc / b_seq_len form, 24 tokens
WP_VLLM_CASES = [
    ("start-negative", [-3, 10], [10, 14], status.ROWS),
    ("len-negative", [0, 10], [10, -5], status.ROWS),
    ("past-tokens", [0, 10], [10, 40], status.ROWS),
    ("start-past-tokens", [0, 50], [10, 14], status.ROWS),
    ("max-len-small", [0, 10], [10, 14], status.MAX_LEN),
]


@pytest.mark.parametrize(("starts", "lens", "bit"), [c[1:] for c in WP_VLLM_CASES],
                         ids=[c[0] for c in WP_VLLM_CASES])  # fmt: skip
def test_window_vllm_malformed(starts, lens, bit):
    d = dense_case(WP_LENS, 1, 1, 32, torch.float16)
    s = torch.tensor(starts, dtype=torch.int32, device=DEVICE)
    n = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    max_len = 5 if bit == status.MAX_LEN else 14
    st = new_status(DEVICE)
    o = poison(torch.empty_like(d.q))
    wp_caf(d.q, d.k, d.v, o, s, n, max_len, True, None, 6, status=st)
    total = d.q.shape[0]
    block_m = wp_explain(d.q, d.k, d.v, d.cu, max_len, window=(5, -1)).block_m
    for a, m in zip(starts, lens, strict=True):  # each clamped span written
        lo = min(max(a, 0), total)
        hi = min(max(a + m, lo), total)
        _check_written(o, torch.tensor([lo, hi]), max_len, block_m)
    if bit != status.MAX_LEN:  # the well-formed sequence is still right
        ok = [
            b
            for b, (a, m) in enumerate(zip(starts, lens, strict=True))
            if a >= 0 and m >= 0 and a + m <= total
        ]
        ref = dense_ref(d, window=(6, -1))  # (vLLM's sliding_window_q=6: i - j <= 6)
        for b in ok:
            assert compare(o[starts[b] : starts[b] + lens[b]], ref[starts[b] : starts[b] + lens[b]])
    assert int(st) & bit, status.status_names(int(st))
    with pytest.raises(ValueError):
        wp_caf(d.q, d.k, d.v, torch.empty_like(d.q), s, n, max_len, True, None, 6, validate=True)


def test_status_argument_checked():
    """``status=`` must be an int32 tensor of one element on q's device (host checks, every function)."""
    d = dense_case(WP_LENS, 1, 1, 32, torch.float16)
    for bad, exc in ((torch.zeros(1, dtype=torch.int64, device=DEVICE), TypeError),
                     (torch.zeros(2, dtype=torch.int32, device=DEVICE), ValueError),
                     ([0], TypeError)):  # fmt: skip
        with pytest.raises(exc, match="status"):
            window_prefill(d.q, d.k, d.v, d.cu, d.max_len, status=bad)
        with pytest.raises(exc, match="status"):
            wp_caf(d.q, d.k, d.v, torch.empty_like(d.q), d.cu[:-1], d.cu.diff(), 14, status=bad)
    c = _pp_case()
    with pytest.raises(TypeError, match="status"):
        bad = torch.zeros(1, dtype=torch.float32, device=DEVICE)
        prefix_prefill(c.q, c.k, c.v, c.k_cache, c.v_cache, c.block_table, c.cu_q, c.seq_lens,
                       c.max_query_len, status=bad)  # fmt: skip
    assert status.status_names(status.ROWS | status.MAX_LEN) == ["ROWS", "MAX_LEN"]
    assert cu_of([1]).tolist() == [0, 1]


# ------------------------------------------------------------------- the custom ops and torch.compile
def test_status_through_the_custom_ops():
    """``torch.ops.window_prefill.fwd`` / ``torch.ops.prefix_prefill.fwd`` (the path the public functions
    take under ``torch.compile`` or a dispatch mode) pass the status tensor on to the kernel."""
    d = dense_case(WP_LENS, 1, 1, 32, torch.float16)
    st = new_status(DEVICE)
    out = poison(torch.empty_like(d.q))
    torch.ops.window_prefill.fwd(d.q, d.k, d.v, out, d.cu, None, 5, True, 5, -1, 0.2, None, False, status=st)
    assert int(st) == status.MAX_LEN and torch.isfinite(out.float()).all()
    c = _pp_case()
    st.zero_()
    out = poison(torch.empty_like(c.q))
    bt = c.block_table[:, :1]  # too narrow
    torch.ops.prefix_prefill.fwd(c.q, c.k, c.v, out, c.k_cache, c.v_cache, 1, bt, c.cu_q, c.seq_lens,
                                 c.max_query_len, True, -1, -1, None, None, None, None, None, None, False,
                                 status=st)  # fmt: skip
    assert int(st) == status.TABLE_WIDTH and torch.isfinite(out.float()).all()


def test_status_under_torch_compile():
    """``torch.compile(fullgraph=True)`` (aot_eager: the op's third mutable argument functionalised):
    one graph, and the caller's status tensor written in place as in eager mode."""
    d = dense_case(WP_LENS, 1, 1, 32, torch.float16)
    bad_cu = torch.tensor([0, 16, 12, 24], dtype=torch.int32, device=DEVICE)

    def call(q, k, v, cu, st):
        return window_prefill(q, k, v, cu, 14, window=(5, -1), status=st)

    torch._dynamo.reset()
    compiled = torch.compile(call, fullgraph=True, backend="aot_eager")
    st_c, st_e = new_status(DEVICE), new_status(DEVICE)
    out_c = compiled(d.q, d.k, d.v, bad_cu, st_c)
    out_e = call(d.q, d.k, d.v, bad_cu, st_e)
    assert int(st_c) == int(st_e) == status.ROWS | status.MAX_LEN
    assert torch.equal(out_c, out_e)


@pytest.mark.gpu
@pytest.mark.parametrize("pkg", ["window", "prefix"])
def test_gpu_status_under_cuda_graph(pkg):
    """A call with ``status=`` captured in a CUDA graph: a replay over well-formed metadata leaves the
    status 0; after the metadata buffers are overwritten with malformed values (``cu_seqlens`` past the
    tokens, a block id past the cache), a replay writes every row finite and flags the status."""
    import prefix_prefill as pp

    st = new_status(DEVICE)
    if pkg == "window":
        d = dense_case([300, 17], 4, 2, 128, torch.bfloat16)
        cu = d.cu.clone()

        def call():
            return window_prefill(d.q, d.k, d.v, cu, 300, window=(63, -1), status=st)

        def malform():
            cu[-1] = d.q.shape[0] + 1000

        bit = status.ROWS
    else:
        c = paged_case([(40, 9), (0, 200), (130, 17)], heads=4, kv_heads=2, head=128, page=16,
                       dtype=torch.bfloat16)  # fmt: skip
        bt = c.block_table.clone()

        def call():
            return prefix_prefill(c.q, c.k, c.v, c.k_cache, c.v_cache, bt, c.cu_q, c.seq_lens,
                                  c.max_query_len, status=st)  # fmt: skip

        def malform():
            bt[0, 1] = c.num_blocks + 5

        bit = status.BLOCK_ID
    call()  # compile outside the capture
    pp.finish_compiles()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    st.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert int(st) == 0
    malform()
    poison(out)
    graph.replay()
    torch.cuda.synchronize()
    assert int(st) & bit and torch.isfinite(out.float()).all()
