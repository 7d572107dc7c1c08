"""Features against the reference: windows, ALiBi, sinks, fp8 caches, k=None, skip_decode,
causal=False, empty contexts, short queries, both API forms, window skipping, negative controls."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE, DTYPES, ON_GPU, compiled_variants, poison
from pp_cases import (
    FP8_E4M3,
    FP8_E5M2,
    alibi_slopes,
    make_case,
    problem_of,
    random_seqs,
    reference,
    run_cfg,
    run_py,
    run_vllm,
)

from attn_reference import compare, gather_paged, negative_control
from prefix_prefill import explain, plan, prefix_prefill
from prefix_prefill.configs import KernelConfig

SEQS = [(37, 29), (0, 18), (50, 1), (9, 40)]


# the default case's heads: GQA at the smallest grid the interpreter runs (other group sizes: the
# explicit cases below and the other test files)
HEADS, KV_HEADS = 2, 1


def _case(**kw):
    args = {"num_heads": HEADS, "num_kv_heads": KV_HEADS, "head_size": 64, "page": 16, "dtype": torch.float16}
    args.update(kw)
    seqs = args.pop("seqs", SEQS)
    return make_case(seqs, device=DEVICE, **args)


# ------------------------------------------------------------------------------------ windows
@pytest.mark.parametrize(
    ("causal", "window"),
    [
        (True, (8, -1)),  # vLLM sliding window 9
        (True, (0, -1)),  # only itself
        (False, (5, 3)),  # FA two-sided
        (False, (-1, 4)),  # right bound only
        (False, (20, 0)),  # left window, no look-ahead, via causal=False
    ],
)
def test_windows(causal, window):
    case = _case(layout="nhd", dtype=torch.float32)
    c = compare(run_py(case, causal=causal, window=window), reference(case, causal=causal, window=window))
    assert c, c


def test_vllm_sliding_window_and_scale():
    case = _case()
    out = run_vllm(case, sliding_window=12, sm_scale=0.3)
    assert compare(out, reference(case, window=(11, -1), softmax_scale=0.3))


def test_window_skip_never_reads_pages_behind_the_window():
    """Pages no query can see are filled with NaN and their table entries point at the poisoned
    blocks: the output stays finite and exact, so the kernel never loaded them."""
    window = 20
    seqs = [(150, 12), (97, 30), (64, 5)]
    case = _case(seqs=seqs, page=16, layout="split", dtype=torch.float32)
    ref = reference(case, window=(window - 1, -1))
    k_cache, v_cache = case.k_cache.clone(), case.v_cache.clone()
    poisoned = 0
    for b, (ctx, _) in enumerate(seqs):
        first_visible = ctx - (window - 1)  # the first query (position ctx) sees keys >= ctx - 19
        for pg in range(first_visible // case.page):  # pages entirely before that key
            blk = int(case.block_table[b, pg])
            k_cache[blk] = float("nan")
            v_cache[blk] = float("nan")
            poisoned += 1
    assert poisoned >= 8
    case.k_cache, case.v_cache = k_cache, v_cache
    out = run_vllm(case, sliding_window=window)
    assert torch.isfinite(out).all()
    c = compare(out, ref)
    assert c, c
    # the same with context tiles of two pages that straddle the window edge
    out = run_cfg(case, KernelConfig(16, 16, 64, 1, 1), window=(window - 1, -1))
    assert compare(out, ref)


def _poison_slot(case, blk: int, slot: int) -> None:
    """NaN into every head and feature of one cache slot, whatever the layout."""
    if case.layout == "split":
        case.k_cache[blk, :, :, slot, :] = float("nan")
        case.v_cache[blk, :, :, slot] = float("nan")
    elif case.layout == "nhd":
        case.k_cache[blk, slot] = float("nan")
        case.v_cache[blk, slot] = float("nan")
    else:
        case.k_cache[blk, :, slot] = float("nan")
        case.v_cache[blk, :, slot] = float("nan")


@pytest.mark.parametrize(
    ("config", "page", "layout", "window"),
    [
        (KernelConfig(16, 16, 16, 1, 1), 40, "split", (-1, -1)),  # tiles straddle pages
        (KernelConfig(16, 16, 32, 1, 1), 48, "nhd", (30, -1)),
        (KernelConfig(16, 32, 64, 1, 1), 544, "hnd", (-1, -1)),
        (KernelConfig(16, 16, 64, 1, 1), 80, "split", (30, -1)),
        (KernelConfig(16, 16, 16, 1, 1), 40, "split", (30, -1)),
    ],
)
def test_edge_tiles_discard_what_they_load(config, page, layout, window):
    """Masked edge tiles (tiles that straddle pages, the context's last partial tile, the window's
    first) never use a cache slot that no query may see: every such slot (past the context, where the
    new tokens' copies live, and before the window) is NaN, and the output is still finite and exact."""
    seqs = [(page + 37, 29), (2 * page - 5, 3), (25, 40), (3 * page, 17)]
    case = _case(seqs=seqs, page=page, layout=layout, dtype=torch.float32, kv_from_cache=False)
    ref = reference(case, window=window)
    case.k_cache, case.v_cache = case.k_cache.clone(), case.v_cache.clone()
    poisoned = 0
    for b, (ctx, _) in enumerate(seqs):
        first = max(0, ctx - window[0]) if window[0] >= 0 else 0  # the first query sees keys >= first
        for pos in range(-(-(ctx + 1) // page) * page):
            if pos >= ctx or pos < first:
                col = pos // page
                blk = int(case.block_table[b, col]) if col < case.block_table.shape[1] else -1
                if 0 <= blk < case.k_cache.shape[0]:
                    _poison_slot(case, blk, pos % page)
                    poisoned += 1
    assert poisoned >= 20
    out = run_cfg(case, config, window=window)
    assert torch.isfinite(out).all()
    c = compare(out, ref)
    assert c, c


@pytest.mark.parametrize(
    ("config", "page", "window"),
    [
        (KernelConfig(16, 16, 16, 1, 1), 16, (-1, -1)),
        (KernelConfig(16, 16, 32, 1, 1), 48, (30, -1)),
        (KernelConfig(16, 32, 64, 1, 1), 544, (13, 5)),
        (KernelConfig(16, 16, 32, 1, 1), 48, (-1, -1)),
    ],
)
def test_granule_edges(config, page, window):
    """Granule edges (kernel ``GRANULE``; vLLM's split layout, fp16: V runs of 8 tokens; the plan takes
    them at head buckets of 256): masked context tiles attend to whole 8-key granules with V masked per
    granule, narrow tiles to the keys of partial granules. Contexts end at every offset modulo 8 and
    windows start at many; every cache slot no query may see is NaN; the output must be finite and
    match the reference, and so must the form without them."""
    seqs = [(13, 9), (16, 1), (21, 30), (40, 7), (47, 17), (page + 3, 12), (2 * page + 6, 5)]
    seqs += [(2 * page + 7, 40), (0, 11)]
    case = _case(seqs=seqs, page=page, layout="split", dtype=torch.float16, kv_from_cache=False)
    ref = reference(case, window=window)
    case.k_cache, case.v_cache = case.k_cache.clone(), case.v_cache.clone()
    for b, (ctx, _) in enumerate(seqs):
        first = max(0, ctx - window[0]) if window[0] >= 0 else 0
        for pos in range(-(-(ctx + 1) // page) * page):
            col = pos // page
            if (pos >= ctx or pos < first) and col < case.block_table.shape[1]:
                blk = int(case.block_table[b, col])
                if 0 <= blk < case.k_cache.shape[0]:
                    _poison_slot(case, blk, pos % page)
    for granule in (8, 0):
        out = run_cfg(case, config, {"GRANULE": granule}, window=window)
        assert torch.isfinite(out).all(), granule
        c = compare(out, ref)
        assert c, (granule, c)


# ------------------------------------------------------------------------------- ALiBi, sinks
def test_alibi():
    case = _case()
    slopes = alibi_slopes(HEADS, DEVICE)
    assert compare(run_vllm(case, alibi_slopes=slopes), reference(case, alibi_slopes=slopes))


def test_alibi_window_sinks_noncausal():
    case = _case(layout="hnd", dtype=torch.float32, page=17)
    slopes = alibi_slopes(HEADS, DEVICE)
    sinks = torch.randn(HEADS, device=DEVICE) * 2
    kw = {"alibi_slopes": slopes, "sinks": sinks, "window": (13, 6), "causal": False}
    c = compare(run_py(case, **kw), reference(case, **kw))
    assert c, c


def test_alibi_window_sinks_vllm():
    case = _case(num_heads=4, num_kv_heads=1)  # MQA, a group of 4
    slopes = alibi_slopes(4, DEVICE)
    sinks = torch.randn(4, device=DEVICE)
    out = run_vllm(case, alibi_slopes=slopes, sinks=sinks, sliding_window=10)
    assert compare(out, reference(case, alibi_slopes=slopes, sinks=sinks, window=(9, -1)))


def test_sinks():
    case = _case(dtype=torch.float32)
    sinks = torch.randn(HEADS, device=DEVICE) * 3
    assert compare(run_vllm(case, sinks=sinks), reference(case, sinks=sinks))


# ------------------------------------------------------------------------------------ fp8
@pytest.mark.parametrize(
    ("cache_dtype", "api"),
    [
        (torch.uint8, "vllm"),  # uint8 storage, kv_cache_dtype="fp8"
        (FP8_E5M2, "vllm"),  # kv_cache_dtype="fp8_e5m2"
        (FP8_E4M3, "py"),
    ],
)
def test_fp8_cache(cache_dtype, api):
    case = _case(cache_dtype=cache_dtype, k_scale=0.45, v_scale=1.7, dtype=torch.float16)
    if api == "vllm":
        out = run_vllm(case, sliding_window=30)
    else:
        out = run_py(case, window=(29, -1))
    c = compare(out, reference(case, window=(29, -1)))
    assert c, c


def test_fp8_cache_kv_from_cache_alibi_noncausal():
    case = _case(cache_dtype=FP8_E4M3, k_scale=0.8, v_scale=0.6, kv_from_cache=True, layout="nhd")
    slopes = alibi_slopes(HEADS, DEVICE)
    kw = {"alibi_slopes": slopes, "causal": False}
    assert compare(run_py(case, **kw), reference(case, **kw))


def test_fp8_output():
    """o in fp8 gets clamp(out / fp8_out_scale). The interpreter rounds fp32 -> fp8 wrongly (7.98 -> 4),
    so on CPU only finiteness, sign and the magnitude bucket are checked; the GPU checks values."""
    case = _case(dtype=torch.float16)
    o = torch.empty(case.q.shape, dtype=FP8_E4M3, device=DEVICE)
    poison(o)
    run_vllm(case, o=o, fp8_out_scale=0.25)
    ref = reference(case).float()
    got = o.float() * 0.25
    assert torch.isfinite(got).all()
    if ON_GPU:
        c = compare(got, ref.double(), FP8_E4M3)
        assert c, c
    else:
        assert ((got - ref).abs() <= 0.55 * ref.abs() + 0.05).all()


@pytest.mark.parametrize("layout", ["nhd", "hnd"])
def test_fp8_output_pythonic(layout):
    """``prefix_prefill(..., out=<fp8>, fp8_out_scale=s)`` writes ``clamp(out / s)`` on NHD/HND caches too,
    the same bits as without it divided and rounded (the Triton kernel on CPU; the GPU suite's
    ``test_pp_gluon_fp8_out`` checks the Gluon forms); warm calls take each call's scale; an fp8
    ``out`` without its scale, or the scale without ``out``, is refused by name."""
    case = _case(dtype=torch.float16, layout=layout)
    args = (case.q, case.k, case.v, case.k_cache, case.v_cache, case.block_table, case.cu_seqlens_q,
            case.seq_lens, case.max_query_len)  # fmt: skip
    ref = reference(case).float()
    for scale in (0.25, 0.5, 0.25):  # the third call repeats the first's signature (the warm path)
        o = poison(torch.empty(case.q.shape, dtype=FP8_E4M3, device=DEVICE))
        assert prefix_prefill(*args, kv_layout=layout, out=o, fp8_out_scale=scale) is o
        got = o.float() * scale
        assert torch.isfinite(got).all()
        if ON_GPU:
            c = compare(got, ref.double(), FP8_E4M3)
            assert c, c
        else:  # (the interpreter's fp32 -> fp8 rounding: see test_fp8_output)
            assert ((got - ref).abs() <= 0.55 * ref.abs() + 0.05 * scale / 0.25).all(), scale
    o = torch.empty(case.q.shape, dtype=FP8_E4M3, device=DEVICE)
    with pytest.raises(TypeError, match="out must be an fp8"):
        prefix_prefill(*args, kv_layout=layout, out=torch.empty_like(case.q), fp8_out_scale=0.5)
    with pytest.raises(TypeError, match="out must have q's dtype"):
        prefix_prefill(*args, kv_layout=layout, out=o)
    with pytest.raises(ValueError, match="fp8_out_scale needs out"):
        prefix_prefill(*args, kv_layout=layout, fp8_out_scale=0.5)
    with pytest.raises(ValueError, match="fp8_out_scale"):
        prefix_prefill(*args, kv_layout=layout, out=o, fp8_out_scale=-1.0)
    assert explain(*args, kv_layout=layout, out=o, fp8_out_scale=0.5).kernel


# ------------------------------------------------------------------------ k=None, short, empty
@pytest.mark.parametrize(("layout", "dtype"), [("split", torch.float16), ("hnd", torch.float32)])
def test_kv_from_cache(layout, dtype):
    case = _case(kv_from_cache=True, layout=layout, dtype=dtype, page=17)
    kw = {"window": (25, -1)} if layout == "hnd" else {}
    c = compare(run_py(case, **kw), reference(case, **kw))
    assert c, c


def _both_forms(name: str, case, config, ref, **kw) -> None:
    """``run_cfg`` with the Triton kernel's constexpr ``name`` True, then False (both forms of a choice
    the plan makes per problem): finite and close to ``ref``."""
    for on in (True, False):
        out = run_cfg(case, config, {name: on}, **kw)
        assert torch.isfinite(out).all(), (name, on)
        c = compare(out, ref)
        assert c, (name, on, c)


@pytest.mark.parametrize(
    ("config", "page", "layout", "kv_from_cache", "kw"),
    [
        (KernelConfig(16, 32, 32, 1, 1), 8, "nhd", False, {}),
        (KernelConfig(16, 32, 32, 1, 1), 16, "split", False, {"window": (40, -1)}),
        (KernelConfig(16, 16, 64, 1, 1), 4, "nhd", True, {"causal": False, "window": (30, 9)}),
        (KernelConfig(32, 16, 32, 1, 1), 1, "hnd", False, {}),
    ],
)
def test_whole_page_tiles(config, page, layout, kv_from_cache, kw):
    """Unmasked context tiles of whole pages narrower than the tile read one block id per page
    (paged_kv_offsets.tile_blocks). Contexts of many tiles, k given or read back from the cache."""
    seqs = [(5 * 64 + 3, 20), (128, 33), (0, 9), (200, 1)]
    case = _case(seqs=seqs, page=page, layout=layout, kv_from_cache=kv_from_cache)
    c = compare(run_cfg(case, config, **kw), reference(case, **kw))
    assert c, c


@pytest.mark.parametrize(
    ("config", "page", "layout", "kv_from_cache", "kw"),
    [
        (KernelConfig(16, 32, 32, 1, 1), 8, "nhd", False, {}),  # one id per page, merged masked loops
        (KernelConfig(16, 16, 32, 1, 1), 24, "split", False, {"window": (40, -1)}),  # ids per lane
        (KernelConfig(16, 16, 16, 1, 1), 40, "nhd", True, {"causal": False, "window": (30, 9)}),  # 2 pages
        (KernelConfig(32, 16, 16, 1, 1), 1, "hnd", False, {}),
        (KernelConfig(16, 16, 16, 1, 1), 32, "split", True, {}),  # one page per tile, one segment
    ],
)
def test_prefetch_ids(config, page, layout, kv_from_cache, kw):
    """``PREFETCH_IDS``: interior context tiles read the next tile's block ids one iteration ahead
    (paged_kv_offsets.tile_blocks ``IDS``, carried by the loop). Contexts of many tiles in every
    addressing form (one id per page, per lane, one or two pages per tile), k given or read back
    from the cache, sequences with no context; must match the reference and the form without."""
    seqs = [(3 * 64 + 3, 20), (96, 33), (0, 9), (130, 1), (64, 17)]
    case = _case(seqs=seqs, page=page, layout=layout, kv_from_cache=kv_from_cache)
    _both_forms("PREFETCH_IDS", case, config, reference(case, **kw), **kw)


@pytest.mark.parametrize(
    ("config", "page", "layout", "kv_from_cache", "v_pad", "kw"),
    [
        (KernelConfig(16, 32, 32, 1, 1), 8, "nhd", False, None, {}),  # one id per page, merged masked loops
        (KernelConfig(16, 16, 16, 1, 1), 24, "hnd", True, None, {"causal": False, "window": (30, 9)}),
        (KernelConfig(32, 16, 16, 1, 1), 1, "nhd", False, None, {}),
        (KernelConfig(16, 16, 32, 1, 1), 16, "nhd", False, "slot", {"window": (40, -1)}),  # V rows padded
        (KernelConfig(16, 16, 16, 1, 1), 16, "hnd", True, "block", {}),  # V pages padded
        (KernelConfig(16, 16, 16, 1, 1), 16, "split", False, None, {}),  # split: never the same strides
    ],
)
def test_kv_strides_differ(config, page, layout, kv_from_cache, v_pad, kw):
    """K and V caches with the same strides, and (``v_pad``) a V cache that is a view of a padded tensor,
    so its slot (or block) stride differs from K's: the kernel addresses each cache with its own
    strides (one shared set would read V rows at K's strides: wrong rows, which the comparison
    catches)."""
    seqs = [(5 * 64 + 3, 20), (128, 33), (0, 9), (200, 1)]
    case = _case(seqs=seqs, page=page, layout=layout, kv_from_cache=kv_from_cache)
    if v_pad is not None:
        v = case.v_cache
        if v_pad == "slot":  # NHD [blocks, page, H, D] rows of D + 8 features
            big = torch.zeros(*v.shape[:-1], v.shape[-1] + 8, dtype=v.dtype, device=v.device)
            big[..., : v.shape[-1]] = v
            case.v_cache = big[..., : v.shape[-1]]
        else:  # HND [blocks, H, page, D] blocks of page + 2 rows
            n, h, pg, d = v.shape
            big = torch.zeros(n, h, pg + 2, d, dtype=v.dtype, device=v.device)
            big[:, :, : v.shape[2]] = v
            case.v_cache = big[:, :, : v.shape[2]]
        assert case.v_cache.stride() != case.k_cache.stride() and torch.equal(case.v_cache, v)
    c = compare(run_cfg(case, config, **kw), reference(case, **kw))
    assert c, c


@pytest.mark.parametrize(
    ("config", "page", "layout", "kw"),
    [
        (KernelConfig(16, 16, 16, 1, 1), 16, "split", {}),
        (KernelConfig(16, 16, 32, 1, 1), 24, "split", {"window": (20, -1)}),  # granule edges, 2-page tiles
        (KernelConfig(16, 32, 64, 1, 1), 40, "nhd", {"causal": False, "window": (9, 13)}),
        (KernelConfig(32, 16, 16, 1, 1), 17, "hnd", {"window": (0, -1)}),
    ],
)
def test_one_segment_from_cache(config, page, layout, kw):
    """k=None: keys [0, seq_len) as one cached segment (kernel ``KV_FROM_CACHE``), tiles at multiples
    of the context tile across the context/new-token boundary; every slot past each sequence's end is
    NaN. Must match the reference, with and without granule edges."""
    seqs = [(13, 9), (0, 21), (page - 1, 2), (page, 17), (2 * page + 5, 30), (3 * page + 1, 1)]
    case = _case(seqs=seqs, page=page, layout=layout, kv_from_cache=True)
    ref = reference(case, **kw)
    case.k_cache, case.v_cache = case.k_cache.clone(), case.v_cache.clone()
    for b, (ctx, new) in enumerate(seqs):
        for pos in range(ctx + new, -(-(ctx + new) // page) * page):  # the last page's unused slots
            blk = int(case.block_table[b, pos // page])
            _poison_slot(case, blk, pos % page)
    for granule in (0, 8) if layout == "split" else (0,):
        out = run_cfg(case, config, {"GRANULE": granule}, **kw)
        c = compare(out, ref)
        assert c, (granule, c)


@pytest.mark.parametrize(
    ("config", "page", "layout", "dtype", "kw"),
    [
        (KernelConfig(16, 16, 16, 1, 1), 16, "nhd", torch.float16, {}),
        (KernelConfig(16, 32, 32, 1, 1), 24, "nhd", torch.float16, {"window": (20, -1)}),  # 2-page tiles
        (KernelConfig(32, 16, 16, 1, 1), 40, "nhd", torch.float32, {"causal": False, "window": (9, 13)}),
        (KernelConfig(16, 16, 16, 1, 1), 17, "nhd", torch.float16, {"window": (0, -1)}),
        (KernelConfig(16, 32, 32, 1, 1), 8, "nhd", torch.float16, {"causal": False}),  # tiles over pages
    ],
)
def test_merge_new_tokens(config, page, layout, dtype, kw):
    """k/v given with ``MERGE_NEW``: the masked tiles of the context and of the new tokens in one loop,
    each segment's interior tiles in its own. Every cache slot past each context's end is NaN (the new
    tokens must come from k/v, not from the cache) and the table is only as wide as the contexts need
    (its padding entries are out-of-range block ids). Must match the reference and the form with two
    pairs of loops, and the plan must really take the merged path for these caches."""
    seqs = [(13, 9), (0, 21), (page - 1, 2), (page, 17), (2 * page + 5, 30), (3 * page + 1, 1), (0, 1)]
    case = _case(seqs=seqs, page=page, layout=layout, dtype=dtype)
    assert plan.triton_plan(problem_of(case), config).consts()["MERGE_NEW"]
    ref = reference(case, **kw)
    case.k_cache, case.v_cache = case.k_cache.clone(), case.v_cache.clone()
    for b, (ctx, _new) in enumerate(seqs):
        for pos in range(ctx, -(-ctx // page) * page):  # the last context page's other slots
            _poison_slot(case, int(case.block_table[b, pos // page]), pos % page)
    sinks = torch.randn(case.q.shape[1], device=DEVICE)
    _both_forms("MERGE_NEW", case, config, ref, **kw)
    if not kw:  # sinks: a different running max from the start (causal, unbounded: both such cases)
        _both_forms("MERGE_NEW", case, config, reference(case, sinks=sinks, **kw), sinks=sinks, **kw)


def test_merge_new_tokens_refused():
    """Caches whose tiles do not load like the new rows keep two pairs of loops: vLLM's split layout
    (x groups, token-contiguous V), HND (another token stride), two tile widths, k=None, fp8 caches."""

    def decide(case, cfg=None):
        cfg = cfg or KernelConfig(16, 16, 16, 1, 1)
        return plan.triton_plan(problem_of(case), cfg).consts()["MERGE_NEW"]

    def gqa(**kw):  # two kv heads: HND's token stride (D) then differs from k/v's (heads * D)
        return _case(num_heads=4, num_kv_heads=2, **kw)

    assert decide(gqa(layout="nhd"))
    assert not decide(gqa(layout="hnd"))  # token stride D in the cache, heads * D in k/v
    assert not decide(gqa(layout="split"))
    assert not decide(gqa(layout="nhd"), KernelConfig(16, 16, 32, 1, 1))
    assert not decide(gqa(layout="nhd", kv_from_cache=True))
    assert not decide(_case(layout="nhd", cache_dtype=FP8_E4M3, k_scale=0.5, v_scale=0.5))


def test_kv_from_cache_vllm():
    case = _case(kv_from_cache=True)
    assert compare(run_vllm(case), reference(case))


def test_empty_contexts_zero_width_table():
    case = _case(seqs=[(0, 20), (0, 1), (0, 33)])
    assert case.block_table.shape[1] == 0
    assert compare(run_vllm(case), reference(case))


def test_short_queries_below_every_tile():
    """Query lengths 1..7 (below every tile) with contexts across page edges, default and big tiles."""
    seqs = [(0, 1), (16, 1), (17, 3), (31, 7), (5, 2), (48, 5)]
    case = _case(seqs=seqs, page=16)
    ref = reference(case)
    assert compare(run_py(case), ref)
    assert compare(run_cfg(case, KernelConfig(64, 64, 64, 1, 1)), ref)


def test_skip_decode_leaves_decode_rows_untouched():
    seqs = [(30, 1), (12, 20), (0, 1), (40, 9)]
    case = _case(seqs=seqs)
    out = run_vllm(case, skip_decode=True)
    ref = reference(case)
    decode_rows = torch.tensor([0, 21], device=DEVICE)  # rows of the query-length-1 sequences
    keep = torch.ones(case.q.shape[0], dtype=torch.bool, device=DEVICE)
    keep[decode_rows] = False
    assert torch.isnan(out[decode_rows].float()).all()
    assert compare(out[keep], ref[keep])


def test_causal_false():
    case = _case(dtype=torch.float32)
    assert compare(run_vllm(case, causal=False), reference(case, causal=False))


def test_both_api_forms_agree_exactly():
    case = _case(layout="split")
    slopes = alibi_slopes(HEADS, DEVICE)
    a = run_vllm(case, sliding_window=16, alibi_slopes=slopes)
    b = run_py(case, window=(15, -1), alibi_slopes=slopes)
    assert torch.equal(a, b)
    assert compare(a, reference(case, window=(15, -1), alibi_slopes=slopes))


def test_validate_env_variable(monkeypatch):
    """PREFILL_VALIDATE=1 turns on the device-value checks without validate=True."""
    case = _case()
    case.block_table[1, 0] = 10_000  # sequence 1 has no context: entry never needed, ignored
    case.block_table[0, 1] = case.num_blocks + 5  # needed by sequence 0's context
    monkeypatch.setenv("PREFILL_VALIDATE", "1")
    with pytest.raises(ValueError, match="block_table"):
        run_py(case, validate=False)


# -------------------------------------------------------------------------- negative controls
def test_negative_control_harness_catches_wrong_kernels():
    """The harness (compare against the float64 reference) rejects plausible wrong answers: a
    kernel run with the window off by one, and attn_reference's own negative controls."""
    # (two kv heads: the kv_head control needs more than one)
    case = _case(dtype=torch.float32, seqs=[(40, 24), (20, 30)], num_heads=4, num_kv_heads=2)
    ref = reference(case, window=(10, -1))
    good = run_py(case, window=(10, -1))
    assert compare(good, ref)
    wrong = run_py(case, window=(9, -1))
    assert not compare(wrong, ref)
    # reference-side controls on the gathered (context + new) keys
    ctx_k = gather_paged(case.k_cache, case.block_table, case.ctx_lens, layout="split", role="k")
    ctx_v = gather_paged(case.v_cache, case.block_table, case.ctx_lens, layout="split", role="v")
    ks, vs, at, at_c = [], [], 0, 0
    for c_len, q_len in zip(case.ctx_lens, case.q_lens, strict=True):
        ks += [ctx_k[at_c : at_c + c_len], case.k[at : at + q_len]]
        vs += [ctx_v[at_c : at_c + c_len], case.v[at : at + q_len]]
        at, at_c = at + q_len, at_c + c_len
    k_all, v_all = torch.cat(ks).to(torch.float64), torch.cat(vs).to(torch.float64)
    cu_k = torch.tensor([0, 64, 114], dtype=torch.int32, device=DEVICE)
    for kind in ("window_shift", "diagonal", "scale", "kv_head"):
        bad = negative_control(
            case.q, k_all, v_all, case.cu_seqlens_q, cu_k, kind, causal=True, window=(10, -1)
        )
        assert not compare(bad.to(torch.float32), ref), kind


# ----------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("cache_dtype", [FP8_E4M3, FP8_E5M2, torch.uint8])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page", [16, 544, 1056])
def test_gpu_fp8(cache_dtype, dtype, page):
    _check_fp8(cache_dtype, dtype, page, 128)


@pytest.mark.gpu
@pytest.mark.parametrize("cache_dtype", [FP8_E4M3, FP8_E5M2, torch.uint8])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("page", [16, 544, 1056])
def test_gpu_fp8_head256(cache_dtype, dtype, page):
    """The fp8-cache tile of 16-bit q at head 256 (sm90: ``configs._FP8_CACHE_OVERRIDES``, 128/64/64;
    fp32 q keeps its table entry, the tile of its other head-256 calls)."""
    _check_fp8(cache_dtype, dtype, page, 256)


def _check_fp8(cache_dtype, dtype, page, head_size):
    """fp8 caches (e4m3, e5m2, vLLM's uint8) against the reference, plain and with ALiBi and a window."""
    seqs = random_seqs(4, 2000, 400)
    case = make_case(
        seqs,
        num_heads=8,
        num_kv_heads=2,
        head_size=head_size,
        page=page,
        dtype=dtype,
        device=DEVICE,
        cache_dtype=cache_dtype,
        k_scale=0.3,
        v_scale=2.0,
    )
    assert compare(run_vllm(case), reference(case))
    slopes = alibi_slopes(8, DEVICE)
    assert compare(
        run_vllm(case, alibi_slopes=slopes, sliding_window=300),
        reference(case, alibi_slopes=slopes, window=(299, -1)),
    )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kv_from_cache", [False, True, "merge", "no_merge"])
@pytest.mark.parametrize("causal", [True, False])
def test_gpu_features(dtype, kv_from_cache, causal):
    """Windows, ALiBi and sinks at page 1056 with k/v given, read back from the cache (k=None), or given
    with an NHD cache, the masked tiles of the context and new tokens in one loop (``MERGE_NEW``, what
    the plan takes there) or in two."""
    consts = {"no_merge": {"MERGE_NEW": False}}.get(kv_from_cache)
    layout = "nhd" if kv_from_cache in ("merge", "no_merge") else "split"
    kv_from_cache = kv_from_cache is True
    seqs = [*random_seqs(6, 3000, 900), (0, 1), (5000, 1)]
    case = make_case(
        seqs,
        num_heads=16,
        num_kv_heads=4,
        head_size=128,
        page=1056,
        dtype=dtype,
        device=DEVICE,
        kv_from_cache=kv_from_cache,
        layout=layout,
    )
    slopes = alibi_slopes(16, DEVICE)
    sinks = torch.randn(16, device=DEVICE)
    for kw in ({}, {"window": (511, -1)}, {"alibi_slopes": slopes, "sinks": sinks, "window": (100, -1)}):
        out = (
            run_py(case, causal=causal, **kw)
            if consts is None
            else run_cfg(case, None, consts, causal=causal, **kw)
        )
        c = compare(out, reference(case, causal=causal, **kw))
        assert c, (kw.keys(), c)


def test_launch_forwards_ptxas_options(monkeypatch):
    """The launcher asks ``prefill_runtime.ptxas_launch_options`` with the plan's register usage level
    (``plan.PTXAS_REGISTER_USAGE_LEVEL`` on its architectures, 0 elsewhere) and the query's device, and
    passes what it answers to the kernel launch untouched (the launch itself is recorded here)."""
    from prefix_prefill import launch
    from prefix_prefill.configs import detect_arch

    asked, launched = [], []

    def fake_options(level, device):
        asked.append((level, device))
        return {"ptx_options": f"--register-usage-level={level}"}

    class FakeKernel:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launched.append(kwargs)

    monkeypatch.setattr(launch, "ptxas_launch_options", fake_options)
    monkeypatch.setattr(launch, "_fwd_kernel", FakeKernel())
    case = make_case(
        [(40, 9)], num_heads=4, num_kv_heads=2, head_size=32, page=16, dtype=torch.float16, device=DEVICE
    )
    monkeypatch.setitem(plan.PTXAS_REGISTER_USAGE_LEVEL, detect_arch(case.q.device), 7)
    plan.plan.cache_clear()
    run_py(case)
    monkeypatch.delitem(plan.PTXAS_REGISTER_USAGE_LEVEL, detect_arch(case.q.device))
    plan.plan.cache_clear()
    run_py(case)
    plan.plan.cache_clear()
    assert asked == [(7, case.q.device), (0, case.q.device)]
    assert [kw["ptx_options"] for kw in launched] == ["--register-usage-level=7", "--register-usage-level=0"]


@pytest.mark.gpu
@pytest.mark.parametrize("page", [16, 512, 1056])
@pytest.mark.parametrize("kv_from_cache", [False, True])
def test_gpu_ptxas_register_usage_level(page, kv_from_cache, monkeypatch):
    """The plan's ptxas ``--register-usage-level`` (the same kernel source) keeps the answers, NHD cache,
    k given or read back; the kernel it compiled carries the flag when this Triton and ptxas take it. The
    Triton kernel runs every call (on sm90 the Gluon kernel would take these calls)."""
    from prefill_runtime import ptxas_launch_options
    from prefix_prefill import launch

    monkeypatch.setenv("PREFIX_PREFILL_GLUON", "0")

    case = make_case(
        [*random_seqs(5, 2500, 700), (0, 1), (3000, 1)],
        num_heads=16,
        num_kv_heads=4,
        head_size=128,
        page=page,
        dtype=torch.bfloat16,
        device=DEVICE,
        kv_from_cache=kv_from_cache,
        layout="nhd",
    )
    for kw in ({}, {"window": (300, -1)}):
        c = compare(run_py(case, **kw), reference(case, **kw))
        assert c, (kw, c)
    if ptxas_launch_options(3, torch.device(DEVICE)):
        compiled = [k for cache in launch._fwd_kernel.device_caches.values() for k in cache[0].values()]
        assert any("--register-usage-level=3" in (k.metadata.ptx_options or "") for k in compiled)


@pytest.mark.gpu
def test_gpu_no_host_sync_and_cuda_graph():
    """The default path never synchronises (sync debug mode errors) and replays in a CUDA graph."""
    from prefix_prefill import context_attention_fwd, prefix_prefill

    case = make_case(
        [(3000, 500), (0, 700), (1500, 1)],
        num_heads=8,
        num_kv_heads=2,
        head_size=128,
        page=544,
        dtype=torch.bfloat16,
        device=DEVICE,
    )
    ref = reference(case)
    args = (case.q, case.k, case.v, case.k_cache, case.v_cache, case.block_table, case.cu_seqlens_q)
    out = torch.empty_like(case.q)
    o = torch.empty_like(case.q)
    one = torch.ones(1, device=DEVICE)
    vllm_args = (case.q, case.k, case.v, o, "auto", case.k_cache, case.v_cache, case.block_table)
    vllm_args += (case.cu_seqlens_q, case.seq_lens, None, case.max_query_len, one, one)
    prefix_prefill(*args, case.seq_lens, case.max_query_len, out=out)  # compile outside the checks
    context_attention_fwd(*vllm_args, sliding_window=64)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        prefix_prefill(*args, case.seq_lens, case.max_query_len, out=out)
        context_attention_fwd(*vllm_args, sliding_window=64)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert compare(out, ref)
    assert compare(o, reference(case, window=(63, -1)))

    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        prefix_prefill(*args, case.seq_lens, case.max_query_len, out=out)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        prefix_prefill(*args, case.seq_lens, case.max_query_len, out=out)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert compare(out, ref)


@pytest.mark.gpu
def test_gpu_compiled_variants_do_not_depend_on_lengths():
    from prefix_prefill.kernel import _fwd_kernel

    for i, seqs in enumerate([[(10, 5)], [(3000, 700), (0, 1)], [(17, 33)] * 9, [(100000, 16)]]):
        case = make_case(
            seqs, num_heads=4, num_kv_heads=1, head_size=64, page=16, dtype=torch.float16, device=DEVICE
        )
        run_py(case, validate=False)
        if i == 0:
            first = compiled_variants(_fwd_kernel)
    assert compiled_variants(_fwd_kernel) == first


# ---------------------------------------------------------------------------- logit soft-capping
@pytest.mark.parametrize(
    ("layout", "extra"),
    [("nhd", "plain"), ("split", "alibi_window"), ("nhd", "kv_from_cache_sinks"), ("split", "fp8")],
)
def test_softcap(layout, extra):
    """``softcap``: logits ``c * tanh(logit / c)`` (the logit including an fp8 cache's ``k_scale``),
    ALiBi subtracted after the cap, sinks uncapped; logits large enough that the cap bites. The
    reference caps independently (torch.tanh), and the uncapped reference is far off (negative
    control)."""
    kw_case: dict = {"layout": layout, "page": 16}
    kw: dict = {"softmax_scale": 0.5}
    if extra == "fp8":
        kw_case.update(cache_dtype=FP8_E4M3, k_scale=0.7, v_scale=1.3)
    if extra == "kv_from_cache_sinks":
        kw_case["kv_from_cache"] = True
        kw["sinks"] = torch.randn(HEADS, device=DEVICE)
    if extra == "alibi_window":
        kw.update(alibi_slopes=alibi_slopes(HEADS, DEVICE), window=(30, -1))
    case = _case(seqs=[(70, 40), (0, 48), (33, 65)], **kw_case)
    case.q = case.q * 3  # logits of ~10-20: a cap of 6 bends most of them
    got = run_py(case, softcap=6.0, **kw)
    c = compare(got, reference(case, softcap=6.0, **kw))
    assert c, (layout, extra, c)
    assert not compare(got, reference(case, **kw)), "the cap changed nothing: the test proves nothing"


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["split", "nhd"])
@pytest.mark.parametrize("head_size", [128, 256])
@pytest.mark.parametrize("page", [16, 544])
def test_gpu_bf16_softcap(layout, head_size, page):
    """Soft-capped logits in bf16 on the shipped configs, with a window, ALiBi and sinks."""
    seqs = [*random_seqs(5, 2000, 600), (0, 1)]
    case = make_case(seqs, num_heads=8, num_kv_heads=2, head_size=head_size, page=page,
                     dtype=torch.bfloat16, device=DEVICE, layout=layout)  # fmt: skip
    case.q = case.q * 3
    kw = {"softcap": 20.0, "window": (300, -1), "alibi_slopes": alibi_slopes(8, DEVICE),
          "sinks": torch.randn(8, device=DEVICE)}  # fmt: skip
    c = compare(run_py(case, **kw), reference(case, **kw))
    assert c, (layout, head_size, page, c)
