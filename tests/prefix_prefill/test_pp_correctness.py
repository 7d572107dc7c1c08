"""prefix_prefill against the float64 reference: page sizes, layouts, head sizes, GQA, tiles.

CPU (interpreter) cases use tiny contexts; the GPU-marked cases cover the full grid.
"""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE, DTYPES, ON_GPU
from pp_cases import make_case, random_seqs, reference, run_cfg, run_py, run_vllm

from attn_reference import compare
from prefix_prefill.configs import KernelConfig

# (page, layout, dtype, max_ctx): every CPU page size at least once, every layout, both CPU dtypes.
CPU_PAGES = [
    (1, "split", torch.float16, 24),
    (16, "nhd", torch.float32, 40),
    (17, "hnd", torch.float16, 40),
    (17, "split", torch.float32, 40),
    (544, "split", torch.float16, 90),
    (544, "nhd", torch.float32, 90),
]


@pytest.mark.parametrize(("page", "layout", "dtype", "max_ctx"), CPU_PAGES)
def test_ragged_batch_pages_layouts(page, layout, dtype, max_ctx):
    seqs = [*random_seqs(3, max_ctx, 40), (0, 7)]
    case = make_case(
        seqs, num_heads=2, num_kv_heads=1, head_size=64, page=page, dtype=dtype, device=DEVICE, layout=layout
    )
    out = run_py(case)
    c = compare(out, reference(case))
    assert c, f"{seqs}: {c}"


@pytest.mark.parametrize(
    ("head_size", "num_heads", "num_kv_heads", "dtype", "seqs"),
    [
        (64, 4, 4, torch.float16, [(33, 17), (0, 20), (5, 1)]),  # MHA
        (80, 4, 1, torch.float32, [(19, 21), (40, 3)]),  # MQA, padded head size
        (256, 2, 1, torch.float16, [(20, 9), (3, 2)]),  # largest head size, tiny
        (8, 2, 1, torch.float16, [(20, 9), (0, 5)]),  # narrower than one dot's K: a padded 16-wide tile
    ],
)
def test_head_sizes_gqa(head_size, num_heads, num_kv_heads, dtype, seqs):
    case = make_case(
        seqs,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        page=16,
        dtype=dtype,
        device=DEVICE,
    )
    c = compare(run_vllm(case), reference(case))
    assert c, c


@pytest.mark.parametrize(
    ("config", "page", "window"),
    [
        (KernelConfig(32, 16, 64, 1, 1), 17, (-1, -1)),  # context tile spans pages, BM > BN
        (KernelConfig(16, 32, 16, 1, 1), 16, (11, -1)),  # BN > BM, windowed edges
        (KernelConfig(32, 32, 32, 1, 1), 544, (40, -1)),
    ],
)
def test_tile_shapes(config, page, window):
    """Tile sizes that do not divide one another or the page: edge/interior split stays exact."""
    seqs = [(70, 45), (33, 64), (0, 31), (90, 1)]
    case = make_case(
        seqs, num_heads=2, num_kv_heads=1, head_size=64, page=page, dtype=torch.float32, device=DEVICE
    )
    c = compare(run_cfg(case, config, window=window), reference(case, window=window))
    assert c, c


def test_seed_shape_tiny():
    """One of the seed's shapes, (8 heads, 4 queries per kv, head 256, page 1040), tiny lengths."""
    case = make_case(
        [(21, 10), (0, 5)],
        num_heads=8,
        num_kv_heads=2,
        head_size=256,
        page=1040,
        dtype=torch.float16,
        device=DEVICE,
    )
    assert compare(run_vllm(case), reference(case))


# ----------------------------------------------------------------------------------------- GPU
GPU_PAGES = [1, 16, 128, 512, 544, 1040, 1056, 2048]
GPU_HEADS = [8, 32, 64, 80, 96, 112, 128, 192, 256]


@pytest.mark.gpu
@pytest.mark.parametrize("page", GPU_PAGES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["split", "nhd", "hnd"])
def test_gpu_pages(page, dtype, layout):
    seqs = [*random_seqs(5, 3000, 700), (0, 300), (2500, 1)]
    case = make_case(
        seqs, num_heads=8, num_kv_heads=2, head_size=128, page=page, dtype=dtype, device=DEVICE, layout=layout
    )
    c = compare(run_py(case), reference(case))
    assert c, c


@pytest.mark.gpu
@pytest.mark.parametrize("page", [16, 128, 544, 1040, 1056, 2048])
@pytest.mark.parametrize("head_size", [128, 256])
@pytest.mark.parametrize("layout", ["split", "nhd"])
@pytest.mark.parametrize("variant", ["default", "granule_flip", "wide"])
def test_gpu_tile_page_addressing(page, head_size, layout, variant):
    """The Triton kernel's paged addressing with the shipped table configs, compiled, and the other
    form of each choice its plan makes: granule-masked context edges (the split layout) flipped from
    what ships for this head size (off at 128, on at 256), and int64 cache offsets where the plan
    takes int32."""
    if variant == "granule_flip" and layout != "split":
        pytest.skip("granule edges exist only in token-contiguous-V caches")
    seqs = [*random_seqs(4, 2500, 600), (0, 200), (2 * page + 3, 1), (page, 129)]
    case = make_case(
        seqs, num_heads=8, num_kv_heads=2, head_size=head_size, page=page, dtype=torch.bfloat16,
        device=DEVICE, layout=layout,
    )  # fmt: skip
    consts = None
    if variant == "granule_flip":
        consts = {"GRANULE": 8 if head_size <= 128 else 0}
    elif variant == "wide":
        consts = {"WIDE_OFFSETS": True}
    out = run_py(case) if consts is None else run_cfg(case, None, consts)
    c = compare(out, reference(case))
    assert c, c


@pytest.mark.gpu
@pytest.mark.parametrize("head_size", GPU_HEADS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("queries_per_kv", [1, 4, 16])
def test_gpu_head_sizes(head_size, dtype, queries_per_kv):
    seqs = random_seqs(4, 1500, 500)
    case = make_case(
        seqs,
        num_heads=16,
        num_kv_heads=16 // queries_per_kv,
        head_size=head_size,
        page=544,
        dtype=dtype,
        device=DEVICE,
    )
    c = compare(run_vllm(case), reference(case))
    assert c, c


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("num_heads", "queries_per_kv", "head_size", "page"),
    [(64, 1, 128, 544), (8, 4, 256, 1040), (8, 4, 256, 1056)],
)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_seed_shapes(num_heads, queries_per_kv, head_size, page, dtype):
    seqs = [(1500, 600), (0, 1024), (3000, 17), (700, 1)]
    case = make_case(
        seqs,
        num_heads=num_heads,
        num_kv_heads=num_heads // queries_per_kv,
        head_size=head_size,
        page=page,
        dtype=dtype,
        device=DEVICE,
    )
    assert compare(run_vllm(case), reference(case))
    assert compare(run_vllm(case, sliding_window=700), reference(case, window=(699, -1)))


@pytest.mark.gpu
@pytest.mark.parametrize("chunk", range(20))
def test_gpu_many_random_batches(chunk):
    """200 random problems (20 chunks of 10, so xdist spreads their compiles): shapes, pages,
    layouts, dtypes, windows, ALiBi, sinks, k=None, causal."""
    gen = torch.Generator().manual_seed(1234 + chunk)

    def pick(xs):
        return xs[int(torch.randint(0, len(xs), (1,), generator=gen))]

    failures = []
    for i in range(10):
        hkv = pick([1, 2, 4, 8])
        qpk = pick([1, 2, 4, 8])
        d = pick(GPU_HEADS)
        page = pick([1, 16, 17, 128, 544, 1040, 1056])
        layout = pick(["split", "nhd", "hnd"])
        dtype = pick(DTYPES)
        seqs = random_seqs(int(torch.randint(1, 9, (1,), generator=gen)), pick([0, 50, 600, 3000]), 600, gen)
        kvc = bool(torch.randint(0, 4, (1,), generator=gen) == 0)
        case = make_case(
            seqs,
            num_heads=hkv * qpk,
            num_kv_heads=hkv,
            head_size=d,
            page=page,
            dtype=dtype,
            device=DEVICE,
            layout=layout,
            kv_from_cache=kvc,
        )
        kw = {"causal": pick([True, True, False])}
        if pick([0, 1]):
            kw["window"] = (pick([0, 7, 100, 1000]), pick([-1, -1, 0, 50]) if not kw["causal"] else -1)
        if pick([0, 0, 1]):
            kw["alibi_slopes"] = torch.rand(hkv * qpk, device=DEVICE) * 0.2
        if pick([0, 0, 1]):
            kw["sinks"] = torch.randn(hkv * qpk, device=DEVICE)
        c = compare(run_py(case, **kw), reference(case, **kw))
        if not c:
            failures.append((i, seqs, d, page, layout, dtype, kvc, kw.keys(), str(c)))
    assert not failures, failures[:5]


def test_gpu_marker_consistency():
    """DTYPES holds bf16 exactly when a GPU runs the suite (the interpreter cannot do bf16 dots)."""
    assert (torch.bfloat16 in DTYPES) == ON_GPU


@pytest.mark.parametrize("fold", [True, False])
@pytest.mark.parametrize("scale", [0.09, -0.11])
def test_scale_fold_both_forms(fold, scale):
    """Interior tiles fold a positive logit scale into the exp2 FMA (``FOLD_SCALE``); the unfolded
    form (what a negative scale takes) gives the same answer."""
    if fold and scale < 0:
        pytest.skip("a negative scale does not commute with the row max")
    seqs = [(70, 45), (33, 64), (0, 31)]
    case = make_case(
        seqs, num_heads=2, num_kv_heads=1, head_size=64, page=17, dtype=torch.float32, device=DEVICE
    )
    out = run_cfg(case, KernelConfig(16, 16, 16, 1, 1), {"FOLD_SCALE": fold}, softmax_scale=scale)
    c = compare(out, reference(case, softmax_scale=scale))
    assert c, c


@pytest.mark.parametrize(
    ("config", "page", "layout", "window", "kv_from_cache"),
    [
        (KernelConfig(16, 16, 16, 1, 1), 17, "split", (-1, -1), False),  # tiles straddle pages
        (KernelConfig(16, 16, 16, 1, 1), 64, "nhd", (23, -1), False),  # page = 4 tiles
        (KernelConfig(16, 16, 16, 1, 1), 16, "nhd", (23, -1), True),  # tile == page; new K/V in the cache
        (KernelConfig(32, 16, 32, 1, 1), 48, "hnd", (-1, -1), True),  # non-pow2 page, k=None
        (KernelConfig(16, 32, 64, 1, 1), 544, "split", (40, -1), False),  # windowed edges
        (KernelConfig(16, 16, 32, 1, 1), 16, "split", (-1, -1), False),  # tile > page, aligned pages
        (KernelConfig(16, 32, 32, 1, 1), 3, "nhd", (-1, -1), True),  # tile > page, pages cut tiles
    ],
)
@pytest.mark.parametrize("wide", [False, True], ids=["int32_offsets", "int64_offsets"])
def test_tile_page_addressing(config, page, layout, window, kv_from_cache, wide):
    """Every cache-addressing form gives the reference answer: tiles at multiples of the tile width
    with shared block-table reads (paged_kv_offsets.tile_blocks), tiles that straddle two pages (the
    two-scalar-bases form), tiles of whole pages narrower than the tile (one block id per page), with
    int32 and int64 cache offsets: sequences that end at every kind of page offset, block tables
    exactly as wide as needed, tiles wider and narrower than a page."""
    seqs = [(70, 45), (page + 1, 19), (0, 31), (2 * page - 1, 1), (3 * page, 17)]
    case = make_case(
        seqs, num_heads=2, num_kv_heads=1, head_size=64, page=page, dtype=torch.float32, device=DEVICE,
        layout=layout, kv_from_cache=kv_from_cache,
    )  # fmt: skip
    out = run_cfg(case, config, {"WIDE_OFFSETS": wide}, window=window)
    c = compare(out, reference(case, window=window))
    assert c, c
