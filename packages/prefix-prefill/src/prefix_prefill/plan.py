"""Which kernel runs a prefix-prefill call, with which settings, and why: :func:`plan`.

:class:`Problem` is what the host knows of a call without reading device memory (dtypes, head counts,
the caches' layout, page size and strides, the other tensors' strides and 16-byte alignment, options,
the architecture); it never holds a sequence length or a batch size, so one plan serves every step of
an engine. :func:`plan` maps it to a :class:`prefill_runtime.LaunchPlan` by the rules below, in this
order; the first that applies wins:

======================  =========================================================================
kernel                  when
======================  =========================================================================
``"gluon-nhd"``         Hopper (sm90) with the Gluon kernels supported (``prefill_runtime``'s Triton
                        allowlist), 16-bit q and cache of one dtype (or an
                        fp8 cache of :data:`GLUON_FP8_CACHES`, ``CACHE_FP8``), out in it or in one of
                        :data:`GLUON_FP8_OUTS` (``OUT_MAX``), head size 64/128/256, a positive
                        scale or soft-capping, a window that lets a row see at least
                        :func:`min_window` keys (or none), pages a multiple of 8
                        (:func:`gluon_page_multiple`: TMA boxes; at head 256 any page, by ``GATHER``'s
                        ``cp.async`` gathers where a page is no multiple of 8, 16-bit caches), an NHD cache
                        TMA reads as one view of rows (:func:`paged_kv_offsets.tma_rows`: unit feature
                        stride, a slot's heads adjacent, 16-byte slots, a block stride of whole slots,
                        so FlashInfer's interleaved K/V pages too; K and V of one geometry, 16-byte
                        aligned bases), and q/k/v rows TMA can read (unit feature stride, heads
                        adjacent, 16-byte aligned); ALiBi, sinks, soft-capping, the windows (a right
                        one only without causality, where it is moot), causal or not, and
                        skip_decode are its constexprs; a window of at most
                        :data:`PERSISTENT_MAX_WINDOW` keys over a 16-bit cache of boxes its
                        persistent form (``PERSISTENT``)
``"gluon-hnd"``         the same kernel over an HND cache (its view's rows: one head's slots)
``"gluon-split"``       the same over vLLM's split cache (``x = 8``, contiguous 16-byte slots; an fp8 one
                        too, gathered into fp8 staging slots), pages a multiple of 8 (fp8: of 16;
                        K and V gathered where a page is no multiple of 16)
``"triton"``            everything else: :func:`prefix_prefill.kernel._fwd_kernel` with the tiles of
                        :mod:`prefix_prefill.configs` (per architecture, head size, dtype class, page
                        class; narrow heads and fp8 caches change a few fields)
======================  =========================================================================

The Triton kernel's constexprs are derived here too (layout hints, int32 or int64 offsets, granule
edges, the merged masked loop, block ids read ahead); every one is a function of the problem. One rule
reads a call's ``max_query_len``, outside the plan, in each kernel: :func:`idle_second_warpgroup`,
:func:`pack_heads` and :func:`pair_heads` (which also weighs the batch against the device's
multiprocessors), the Gluon form a launch of the plan runs, and :func:`pack_gqa`, the Triton kernel's
(rows the same bit for bit in every form).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from paged_kv_offsets import CacheView, TmaRows, offsets_fit_int32, tma_rows
from prefill_runtime import LaunchPlan
from prefill_runtime.checks import kernel_softcap
from prefill_runtime.plan import packed_tokens
from prefix_prefill.configs import MAX_GRID_YZ, get_config

#: The plans of the NHD/HND Gluon kernel (one kernel over a cache's view of rows).
TMA_KERNELS = ("gluon-nhd", "gluon-hnd")
#: Gluon kernels: query rows per program (two consumer warpgroups of 64).
GLUON_BLOCK_M = 128
#: Gluon kernels: a window must let a row see at least this many keys (``left + 1``, or ``left + right
#: + 1`` not causal); narrower windows keep the Triton kernel. From 64 keys up the Gluon kernels are
#: the faster (a 128-row tile of a 64-key band computes mostly masked blocks, and still takes 0.57-0.83x
#: the Triton kernel's time, both layouts, heads 64 and 128; 0.5-0.8x at 128 keys, heads 64 to 256);
#: narrower bands are not measured.
GLUON_MIN_WINDOW = 64
#: ... over an fp8 cache (:data:`GLUON_FP8_CACHES`): from 512 keys up the Gluon kernels are the faster
#: (0.9x the Triton kernel's time at 512 keys, 0.8x at 1024, both layouts, head 128); at 128 keys they
#: take 1.07x its time, at 64 keys 1.22x (the Triton kernel reads the fp8 bytes directly); 256 keys are
#: not measured.
GLUON_MIN_WINDOW_FP8 = 512
#: NHD/HND Gluon kernel: windows that let a row see at most this many keys (``left + 1``, or ``left + right +
#: 1`` not causal) run its persistent form (``PERSISTENT``, 16-bit caches): a tile there has a few key
#: blocks, and one program a tile spends most of its time on its Q load, its first blocks and its epilogue,
#: which the persistent form overlaps with the previous tile's work (grid: one program a multiprocessor over
#: every sequence's tiles, so a long sequence among short ones spreads over all of them).
PERSISTENT_MAX_WINDOW = 1024
#: Key blocks of the Gluon kernels: 64 keys at head 256 (shared memory), else 128.
GLUON_BLOCK_N = {64: 128, 128: 128, 256: 64}
#: Ring slots of the Gluon kernels' K and V rings.
GLUON_STAGES = 2
#: Split-layout Gluon kernel: head sizes whose K goes by TMA boxes (faster than the gathers there).
SPLIT_K_TMA_HEADS = frozenset({128, 256})
#: ... whose V goes by TMA boxes too (with K by TMA).
SPLIT_V_TMA_HEADS = frozenset({256})
#: ... whose K ring is chunk-major (one box per 16-key run instead of D / 64).
SPLIT_K_CM_HEADS = frozenset({256})
#: ... whose consumers run as one 8-warp partition (``ONE_CONSUMER``) when the new tokens' K/V are given
#: and pages hold a key block: the consumers' two loops (one per V slot form) then exist once in the
#: code and the instruction cache holds them (two partitions' copies miss it on nearly every line). At
#: shorter pages, and at head 64, the V producer transposes the new tokens' V into the context's slot
#: form instead (``V_STAGE``: two consumer partitions, one loop); at 256 V goes by TMA.
SPLIT_ONE_CONSUMER_HEADS = frozenset({128})
#: Triton kernel: the narrowest feature tile (``tl.dot`` takes K >= 16); narrower heads are padded to it.
MIN_BLOCK_D = 16
#: Triton kernel: head buckets from which masked context tiles of a token-contiguous V load by granule
#: (at head 256 the element-wise V gather otherwise serialises every wgmma).
GRANULE_MIN_BLOCK_D = 256
#: ... except on these architectures, whose MMA (mma.sync) reads its operands from registers: there the
#: granule loads only add live registers (sm80 at head 256: 1.5 KB of spills per thread at 64/16/16/8/2).
GRANULE_OFF_ARCHS = frozenset({"sm80", "default"})
#: Triton kernel: head buckets up to which interior context tiles read the next tile's block ids ahead
#: (wider heads only for pages narrower than the tile).
PREFETCH_IDS_MAX_BLOCK_D = 128
#: Triton kernel: ptxas ``--register-usage-level`` on these architectures (0: ptxas's default).
PTXAS_REGISTER_USAGE_LEVEL = {"sm90": 3}
_FP8_DTYPES = tuple(
    getattr(torch, n)
    for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    if hasattr(torch, n)
)
#: Gluon kernels: the fp8 output dtypes they write (NVIDIA's; ``clamp(out / fp8_out_scale)``, as the
#: Triton kernel's ``OUT_FP8``).
GLUON_FP8_OUTS = (torch.float8_e4m3fn, torch.float8_e5m2)
#: NHD/HND Gluon kernel: the fp8 cache dtypes it converts (``CACHE_FP8``: NVIDIA's e4m3fn and e5m2, each
#: value exactly a float16 and a bfloat16; the fnuz types, AMD's, keep the Triton kernel).
GLUON_FP8_CACHES = (torch.float8_e4m3fn, torch.float8_e5m2)
#: ... at these head sizes, in every layout (head 256: a 2-warp converter and one staging slot a ring,
#: ``prefix_prefill.gluon_kernel.fp8_converter_warps`` / ``fp8_staging``; over vLLM's split cache a 1-warp
#: gatherer a ring, ``prefix_prefill.gluon_split_kernel.fp8_gather_warps``, so the kernel stays at 12 warps).
GLUON_FP8_CACHE_HEADS = frozenset({64, 128, 256})


@dataclass(frozen=True)
class Problem:
    """What the host knows of a call (see the module docstring). Strides are in elements; ``*_al16``:
    the tensor's data pointer is a multiple of 16 bytes. ``k_strides``/``v_strides`` are None when the
    new tokens' K/V are read from the cache. ``new_rows_fit32``: every new-token offset a program forms
    from its sequence's first row fits int32. ``softcap``: the kernel's SOFTCAP form (0 off, 1 exp2,
    2 hardware tanh, 3 hardware tanh with a cap the Gluon consumers may pin the max for:
    :func:`prefill_runtime.softcap_form`). ``wide_window``: a row may see at least :func:`min_window`
    keys (by the cache's dtype): causal, no left window or ``left + 1`` keys; not causal, a side unbounded
    or ``left + right + 1`` keys (the window-prefill package's rule). ``narrow_window``: a row sees at
    most :data:`PERSISTENT_MAX_WINDOW` keys (:func:`narrow_window`)."""

    arch: str
    gluon: bool
    q_dtype: torch.dtype
    cache_dtype: torch.dtype
    out_dtype: torch.dtype
    num_heads: int
    head_size: int
    kc: CacheView
    vc: CacheView
    q_strides: tuple[int, int, int]
    k_strides: tuple[int, int, int] | None
    v_strides: tuple[int, int, int] | None
    o_strides: tuple[int, int, int]
    q_al16: bool
    k_al16: bool
    v_al16: bool
    o_al16: bool
    kc_al16: bool
    vc_al16: bool
    bt_col_stride: int
    fits_int32: bool
    new_rows_fit32: bool
    causal: bool
    use_left: bool
    use_right: bool
    alibi: bool
    sinks: bool
    softcap: int
    scale_positive: bool
    skip_decode: bool
    lse: bool
    wide_window: bool = True
    narrow_window: bool = False

    @property
    def layout(self) -> str:
        return self.kc.layout

    @property
    def kv_from_cache(self) -> bool:
        return self.k_strides is None


def make_problem(
    q, k, v, o, k_cache, v_cache, kc, vc, block_table, *, arch, gluon, causal, left, right, scale, alibi,
    sinks, softcap_form, skip_decode, lse,
) -> Problem:  # fmt: skip
    """The :class:`Problem` of checked call arguments (tensors as :func:`prefix_prefill.prefix_prefill`
    takes them, the caches described by ``kc``/``vc``; ``left``/``right``: the window, -1 unbounded)."""
    wide_rows = max(k.stride(0), v.stride(0), 1) if k is not None else 1
    return Problem(
        arch=arch,
        gluon=gluon,
        q_dtype=q.dtype,
        cache_dtype=k_cache.dtype,
        out_dtype=o.dtype,
        num_heads=q.shape[1],
        head_size=q.shape[2],
        kc=kc,
        vc=vc,
        q_strides=tuple(q.stride()),
        k_strides=None if k is None else tuple(k.stride()),
        v_strides=None if v is None else tuple(v.stride()),
        o_strides=tuple(o.stride()),
        q_al16=q.data_ptr() % 16 == 0,
        k_al16=k is None or k.data_ptr() % 16 == 0,
        v_al16=v is None or v.data_ptr() % 16 == 0,
        o_al16=o.data_ptr() % 16 == 0,
        kc_al16=k_cache.data_ptr() % 16 == 0,
        vc_al16=v_cache.data_ptr() % 16 == 0,
        bt_col_stride=block_table.stride(1),
        fits_int32=offsets_fit_int32(k_cache, v_cache),
        # a program's new-token offsets stay below (tokens + a tile) rows of its sequence's first row
        new_rows_fit32=(q.shape[0] + 256) * wide_rows < 2**31,
        causal=bool(causal),
        use_left=left >= 0,
        use_right=right >= 0,
        alibi=alibi,
        sinks=sinks,
        softcap=softcap_form,
        scale_positive=scale > 0,
        skip_decode=bool(skip_decode),
        lse=lse,
        wide_window=wide_window(bool(causal), left, right, k_cache.dtype in GLUON_FP8_CACHES),
        narrow_window=narrow_window(bool(causal), left, right),
    )


def min_window(fp8_cache: bool) -> int:
    """The keys a row's window must hold for the Gluon kernels: :data:`GLUON_MIN_WINDOW`, over an fp8
    cache :data:`GLUON_MIN_WINDOW_FP8`."""
    return GLUON_MIN_WINDOW_FP8 if fp8_cache else GLUON_MIN_WINDOW


def window_keys(causal: bool, left: int, right: int) -> int | None:
    """The keys a window (``left``/``right``, -1 unbounded) lets a row see, None when unbounded: causal
    calls ``left + 1`` (a right window is moot); others ``left + right + 1``, unbounded when either side
    is."""
    if causal:
        return None if left < 0 else left + 1
    return None if left < 0 or right < 0 else left + right + 1


def wide_window(causal: bool, left: int, right: int, fp8_cache: bool) -> bool:
    """Whether a window lets a row see at least :func:`min_window` keys (``fp8_cache``: the cache holds
    fp8; :func:`window_keys`)."""
    keys = window_keys(causal, left, right)
    return keys is None or keys >= min_window(fp8_cache)


def narrow_window(causal: bool, left: int, right: int) -> bool:
    """Whether a window lets a row see at most :data:`PERSISTENT_MAX_WINDOW` keys (:func:`window_keys`)."""
    keys = window_keys(causal, left, right)
    return keys is not None and keys <= PERSISTENT_MAX_WINDOW


# --------------------------------------------------------------------------- the Gluon kernels' rules
def _rows_tma(strides: tuple[int, int, int] | None, aligned: bool, heads: int, d: int, elem: int) -> bool:
    """Rows ``[tokens, heads, d]`` a TMA descriptor reads as ``[tokens, heads * d]``."""
    if strides is None:
        return True
    st, sh, sd = strides
    return sd == 1 and sh == d and st >= heads * d and (st * elem) % 16 == 0 and aligned


@functools.lru_cache(maxsize=256)
def cache_views(kc: CacheView, vc: CacheView, elem: int) -> tuple[TmaRows, TmaRows] | None:
    """The K and V caches' views of rows (:func:`paged_kv_offsets.tma_rows`, elements of ``elem`` bytes)
    for the NHD/HND kernel, or None when TMA cannot read either or they differ in their geometry
    (``block_rows``, ``head_rows``, ``head_cols``: one set the kernel takes). Computed once per pair of
    cache descriptions (a plan's problem holds them), not per call."""
    kv, vv = tma_rows(kc, elem), tma_rows(vc, elem)
    if kv is None or vv is None or kv.kernel_args() != vv.kernel_args():
        return None
    return kv, vv


def tma_cache_views(p: Problem) -> bool:
    """K and V caches TMA reads as views of rows of one geometry (:func:`cache_views`) from 16-byte
    aligned bases."""
    return p.kc_al16 and p.vc_al16 and cache_views(p.kc, p.vc, p.cache_dtype.itemsize) is not None


def split_gather_ok(p: Problem) -> bool:
    """vLLM's split caches as the split Gluon kernel's 16-byte gathers read them: K ``x = 16 / element
    bytes`` features contiguous (8 for a 16-bit cache, 16 for an fp8 one) with ``x``-element slots, V keys
    contiguous, every stride and base 16-byte aligned, and the feature offsets of one page within int32
    (the kernel keeps them in 32 bits)."""
    kc, vc, d = p.kc, p.vc, p.head_size
    x = 16 // p.cache_dtype.itemsize
    strides = (kc.stride_block, kc.stride_head, kc.stride_dim, vc.stride_block, vc.stride_head, vc.stride_dim)
    return (
        kc.layout == "split"
        and kc.x == x
        and kc.stride_x == 1
        and kc.stride_slot == x
        and vc.stride_slot == 1
        and all(st % x == 0 and st > 0 for st in strides)
        and p.kc_al16
        and p.vc_al16
        and (d // x) * kc.stride_dim < 2**31
        and d * vc.stride_dim < 2**31
    )


#: Head sizes at which NHD/HND pages that are no multiple of 8 take the Gluon kernel's ``GATHER`` form (the
#: context's key rows gathered by ``cp.async``, one block-table read a key row): 256, where it ran
#: 0.29-0.35x the Triton kernel's time (H100, 4 x (8192 + 2048), 16/2 heads, pages 1 and 12); at heads 64
#: and 128 it ran 1.43-1.59x the Triton kernel's (8 x (4096 + 4096), 32/8 heads, pages 1 and 12: twice the
#: key rows a byte of head 256's), so those keep the Triton kernel (bench/results/NOTES.md).
GATHER_HEADS = (256,)


def gluon_page_multiple(layout: str, head_size: int, fp8: bool = False) -> int:
    """The page sizes the Gluon kernels take on a cache of ``layout`` at ``head_size`` (``fp8``: an fp8
    cache): multiples of this. NHD/HND: by TMA boxes of ``gcd(page_size, BLOCK_N)`` rows where that is a
    multiple of 8 (a box fills whole swizzle atoms of the rings' NVMMA layout, 8 rows; a ring slot splits
    only there), so 8; at the heads of :data:`GATHER_HEADS` any page, the others by ``cp.async`` gathers
    of key rows (``GATHER``, 16-bit caches; an fp8 cache's staging slots take boxes only). vLLM's split
    layout: 8 (its V gathers copy ``x`` keys of a feature at once, 8 for a 16-bit cache: a copy stays
    inside a page), 16 for an fp8 one (``x = 16``); its K and V boxes are 16-key runs, so pages that are no
    multiple of 16 take its gathers (:func:`_gluon_split_plan`)."""
    if layout == "split":
        return 16 if fp8 else 8
    return 1 if head_size in GATHER_HEADS and not fp8 else 8


def _gluon_unmet(p: Problem) -> str | None:
    """Why neither Gluon kernel runs ``p`` (None: one of them may, layout permitting)."""
    half = p.q_dtype in (torch.float16, torch.bfloat16)
    fp8 = p.cache_dtype in GLUON_FP8_CACHES
    checks = (
        (p.gluon, "Gluon kernels unsupported here (architecture, Triton version or PREFILL_GLUON)"),
        (p.arch == "sm90", f"architecture {p.arch} (Gluon kernels: sm90)"),
        (half, f"q dtype {p.q_dtype} (Gluon kernels: fp16/bf16)"),
        (p.head_size in GLUON_BLOCK_N, f"head size {p.head_size} (Gluon kernels: 64/128/256)"),
        (
            p.cache_dtype == p.q_dtype or p.cache_dtype in GLUON_FP8_CACHES,
            f"cache dtype {p.cache_dtype} (Gluon kernels: q's, float8_e4m3fn or float8_e5m2)",
        ),
        (
            p.cache_dtype not in GLUON_FP8_CACHES or p.head_size in GLUON_FP8_CACHE_HEADS,
            f"an fp8 cache at head size {p.head_size} (fp8 caches on Gluon: heads 64/128/256)",
        ),
        (
            p.out_dtype == p.q_dtype or p.out_dtype in GLUON_FP8_OUTS,
            f"output dtype {p.out_dtype} (Gluon kernels: q's, float8_e4m3fn or float8_e5m2)",
        ),
        (p.wide_window, f"a window narrower than {min_window(p.cache_dtype in GLUON_FP8_CACHES)} keys"),
        (p.scale_positive or p.softcap > 0, "softmax scale <= 0"),
        (
            p.kc.page_size % gluon_page_multiple(p.layout, p.head_size, fp8) == 0,
            f"page size {p.kc.page_size} (Gluon kernels on {'fp8 ' if fp8 else ''}{p.layout} caches at head "
            f"{p.head_size}: multiples of {gluon_page_multiple(p.layout, p.head_size, fp8)})",
        ),
        (p.num_heads <= MAX_GRID_YZ, "more than 65535 heads"),
        (p.bt_col_stride == 1, "block table with a non-unit column stride"),
    )
    for ok, why in checks:
        if not ok:
            return why
    return None


def _gluon_options(p: Problem) -> dict:
    """The Gluon kernels' option constexprs of ``p`` (a right window only without causality, where it
    is moot; ``OUT_MAX``: an fp8 output's largest finite value, 0.0 for an output in q's dtype;
    ``SOFTCAP`` 3, the pinned softmax max of ``prefill_runtime.gluon``, only where no sink, ALiBi slope
    or fp8 cache shifts the logits past the cap's bounds, else 2)."""
    out_max = float(torch.finfo(p.out_dtype).max) if p.out_dtype in GLUON_FP8_OUTS else 0.0
    shifted = p.sinks or p.alibi or p.cache_dtype in GLUON_FP8_CACHES  # logits past the cap's bounds
    softcap = kernel_softcap(p.softcap, gluon=True, shifted=shifted)
    return dict(HAS_LEFT=p.use_left, SOFTCAP=softcap, HAS_ALIBI=p.alibi, HAS_SINKS=p.sinks,
                SKIP_DECODE=p.skip_decode, CAUSAL=p.causal,
                HAS_RIGHT=p.use_right and not p.causal, OUT_MAX=out_max)  # fmt: skip


def _options_note(p: Problem) -> str:
    """The options a Gluon plan runs, for its reason (empty for plain attention)."""
    names = [n for n, on in (("non-causal", not p.causal), ("left window", p.use_left),
                             ("right window", p.use_right and not p.causal), ("soft-capping", p.softcap),
                             ("ALiBi", p.alibi), ("sinks", p.sinks), ("skip_decode", p.skip_decode),
                             ("fp8 output", p.out_dtype in GLUON_FP8_OUTS),
                             ("fp8 cache", p.cache_dtype in GLUON_FP8_CACHES)) if on]  # fmt: skip
    return f"; {', '.join(names)}" if names else ""


def _gluon_tma_plan(p: Problem) -> LaunchPlan | None:
    """The NHD/HND kernel's plan (``"gluon-nhd"`` or ``"gluon-hnd"`` by the cache's layout), or None
    when TMA cannot read the caches or q/k/v."""
    d, elem = p.head_size, p.q_dtype.itemsize
    hk = p.kc.num_kv_heads
    rows = (
        _rows_tma(p.q_strides, p.q_al16, p.num_heads, d, elem)
        and _rows_tma(p.k_strides, p.k_al16, hk, d, elem)
        and _rows_tma(p.v_strides, p.v_al16, hk, d, elem)
    )
    if not (rows and tma_cache_views(p)):
        return None
    block_n = GLUON_BLOCK_N[d]
    box = math.gcd(p.kc.page_size, block_n)
    gather = box % 8 != 0  # (16-bit caches: _gluon_unmet keeps an fp8 cache's pages at multiples of 8)
    consts = dict(HEAD_DIM=d, BLOCK_M=GLUON_BLOCK_M, BLOCK_N=block_n, BOX=block_n if gather else box,
                  KV_FROM_CACHE=p.kv_from_cache, RETURN_LSE=p.lse, NUM_STAGES=GLUON_STAGES,
                  # an fp8 cache converted into float16 rings (a 4-warp partition; a bf16 call as a fp16 one)
                  CACHE_FP8=p.cache_dtype in GLUON_FP8_CACHES,
                  # narrow windows: one program takes tile after tile (16-bit caches, boxes)
                  PERSISTENT=p.narrow_window and p.cache_dtype not in GLUON_FP8_CACHES and not gather,
                  # pages that are not multiples of 8: the context's key rows by cp.async gathers
                  GATHER=gather,
                  **_gluon_options(p))  # fmt: skip
    why = f"sm90, {p.layout.upper()} cache TMA can read" + _options_note(p)
    if consts["PERSISTENT"]:
        why += "; persistent (a narrow window)"
    if gather:
        why += f"; context rows gathered (page size {p.kc.page_size})"
    return LaunchPlan(f"gluon-{p.layout}", why, GLUON_BLOCK_M, LaunchPlan.items(consts))


def pack_gqa(block_m: int, queries_per_kv: int, max_query_len: int) -> bool:
    """Whether a Triton launch packs each KV head's query heads into the rows of one tile (``PACK_GQA``:
    row ``r`` is token ``r // queries_per_kv`` of query head ``r % queries_per_kv``; grid ``(kv_heads, 1,
    batch)``): with grouped heads, when every query fits one tile that way (``max_query_len *
    queries_per_kv <= block_m``: speculative decoding, decode-sized chunks). The KV head's keys are then
    read once for all its query heads, not once per query head. A row's tile bounds and arithmetic are
    those of the unpacked tile (its query is in one tile either way), so its output is the same bit for
    bit. Read per call, outside the plan, as :func:`idle_second_warpgroup`."""
    return queries_per_kv > 1 and max_query_len * queries_per_kv <= block_m


def idle_second_warpgroup(plan: LaunchPlan, max_query_len: int, full: bool = True) -> bool:
    """Whether a Gluon launch of ``plan`` runs its form whose second consumer warpgroup computes nothing
    (``IDLE_WG1``): the form has two consumer partitions (the full form, not ``ONE_CONSUMER``) and no
    query reaches past the first warpgroup's ``BLOCK_M / 2`` rows (``max_query_len``: decode-sized and
    speculative-decoding steps). The first warpgroup's code is the same in both forms, so a sequence's
    rows do not depend on the batch around it. The one rule about a call's lengths: the plan itself never
    reads one."""
    if not full or 2 * max_query_len > plan.block_m or plan.kernel not in (*TMA_KERNELS, "gluon-split"):
        return False
    return not plan.constexpr_map.get("ONE_CONSUMER", False)


def pack_heads(plan: LaunchPlan, queries_per_kv: int, max_query_len: int) -> int:
    """The query heads a KV head has (``queries_per_kv``) when a Gluon launch to which
    :func:`idle_second_warpgroup` gives an idle second warpgroup packs them all into its first
    warpgroup's rows (``PACK``; grid over KV heads), else 0: any cache the plan's kernel reads (16-bit or
    fp8; on the NHD/HND kernel by TMA, not ``GATHER``), no ALiBi (its slopes are a head's term in every
    score; a sink is each row's head's, once a row), grouped heads,
    and every query within :func:`prefill_runtime.plan.packed_tokens` rows a head (at most 8 heads a KV
    head; speculative decoding's few tokens a sequence). A packed program runs the idle form's program
    (one warpgroup's wgmmas over the same key blocks) for all its heads at once, reading the keys once
    where the idle form reads them a head and the paired form every two heads, so it is taken wherever it
    applies; each row's arithmetic is the idle form's, so the choice never changes a row. Integers and
    the plan's constexprs only: the launcher asks it per call, after :func:`idle_second_warpgroup`."""
    c = plan.constexpr_map
    if plan.kernel not in (*TMA_KERNELS, "gluon-split") or queries_per_kv < 2:
        return 0
    if any(c.get(n) for n in ("GATHER", "ONE_CONSUMER", "HAS_ALIBI")):
        return 0
    rows = packed_tokens(plan.block_m // 2, queries_per_kv)
    return queries_per_kv if rows and max_query_len <= rows else 0


def pair_heads(queries_per_kv: int, programs: int, sms: int) -> bool:
    """Whether a Gluon launch to which :func:`idle_second_warpgroup` gives an idle second warpgroup gives
    it the next query head instead (``PAIR_HEADS``): each KV head has an even number of query heads
    (``queries_per_kv``), so heads ``2i`` and ``2i + 1`` share their keys; the program computes the same
    rows of both, reading the keys once (grid over head pairs). A row's arithmetic is the same code in
    either warpgroup, so the choice never changes a row. ``programs``: the idle form's grid (heads x
    sequences: one tile each); ``sms``: the device's multiprocessors. A paired program takes about
    1.25-1.3x an idle one's time and there are half as many, so pairing pays once the idle grid needs
    more than one wave (one program a multiprocessor); within one wave it gains nothing (each program
    only gets longer). ``bench/short_forms.py`` times both forms beside this rule. Integers only: the
    launcher asks it per call, after :func:`idle_second_warpgroup`."""
    return programs > sms and queries_per_kv % 2 == 0


def _gluon_split_plan(p: Problem) -> LaunchPlan | None:
    d, elem = p.head_size, p.q_dtype.itemsize
    if not (split_gather_ok(p) and _rows_tma(p.q_strides, p.q_al16, p.num_heads, d, elem)):
        return None
    hk = p.kc.num_kv_heads
    if p.k_strides is not None and not _rows_tma(p.k_strides, p.k_al16, hk, d, elem):
        return None
    kc, vc, page, g = p.kc, p.vc, p.kc.page_size, d // 8
    fp8 = p.cache_dtype in GLUON_FP8_CACHES  # K and V gathered into fp8 staging, converted (one form)
    k_tma = (
        not fp8
        and page % 16 == 0  # (16-key runs: pages of 8 tokens or 8 times an odd number take the gathers)
        and d in SPLIT_K_TMA_HEADS
        and kc.stride_dim == page * 8
        and kc.stride_head == g * page * 8
        and kc.stride_block == hk * g * page * 8
        and kc.num_blocks * hk * g < 2**31
    )
    v_tma = (
        k_tma
        and d in SPLIT_V_TMA_HEADS
        and vc.stride_dim == page
        and vc.stride_head == d * page
        and vc.stride_block == hk * d * page
        and vc.num_blocks * hk * d < 2**31
    )
    block_n = GLUON_BLOCK_N[d]
    one = not (p.kv_from_cache or fp8) and d in SPLIT_ONE_CONSUMER_HEADS and page >= block_n
    consts = dict(
        HEAD_DIM=d, BLOCK_M=GLUON_BLOCK_M, BLOCK_N=block_n, KV_FROM_CACHE=p.kv_from_cache, RETURN_LSE=p.lse,
        NUM_STAGES=GLUON_STAGES, V_TMA=v_tma, K_TMA=k_tma,
        # K by TMA: blocks inside one page by wide boxes (1), or every block by 16-key runs (2)
        K_WIDE=(1 if page >= block_n else 2) if k_tma else 0, K_CM=k_tma and d in SPLIT_K_CM_HEADS,
        ONE_CONSUMER=one,
        # the new tokens' V transposed by the gathering V producer (head <= 128: shared memory for its stages)
        V_STAGE=not (p.kv_from_cache or v_tma or one or fp8) and d <= 128,
        # an fp8 cache gathered into staging slots and converted into float16 rings (a 4-warp partition)
        CACHE_FP8=fp8, **_gluon_options(p),
    )  # fmt: skip
    why = (
        f"sm90, vLLM split cache (K by {'TMA' if k_tma else 'gathers'}, V by {'TMA' if v_tma else 'gathers'}"
        f"{', one consumer partition' if one else ''}{', new V transposed' if consts['V_STAGE'] else ''})"
        + _options_note(p)
    )
    return LaunchPlan("gluon-split", why, GLUON_BLOCK_M, LaunchPlan.items(consts))


# --------------------------------------------------------------------------- the Triton kernel's rules
def _layout_hints(p: Problem, block_n_ctx: int) -> tuple[bool, bool, bool, int]:
    """Alignment/contiguity facts the Triton kernel may promise the compiler (kernel._tile_pointers).

    A cache is "16-byte aligned" when its data pointer and every non-unit stride are multiples of
    16 bytes: then every contiguous run of a tile (along the unit-stride dimension) starts aligned.
    In vLLM's V layout the unit-stride dimension is the page slot, so runs are ``gcd(page,
    BLOCK_N_CTX)`` tokens of one page, and only in unmasked context tiles (which start at multiples
    of BLOCK_N_CTX); the V promise then also needs runs of at least 16 bytes.
    Returns ``(k_align16, v_align16_any, v_align16_runs, v_contig)``."""
    e = p.cache_dtype.itemsize

    def aligned(view: CacheView, al16: bool) -> bool:
        strides = (view.stride_block, view.stride_slot, view.stride_head, view.stride_dim, view.stride_x)
        return al16 and all((s * e) % 16 == 0 for s in strides if s not in (0, 1))

    vc = p.vc
    k_align = aligned(p.kc, p.kc_al16)
    v_ok = aligned(vc, p.vc_al16)
    slot_runs = vc.stride_slot == 1 and vc.page_size > 1  # tokens are the contiguous dimension
    # capped at one 16-byte vector: longer runs load no faster, and the cap makes every page whose
    # runs reach 16 bytes (512, 544, 1040, ...) compile to the same loads
    v_contig = min(math.gcd(vc.page_size, block_n_ctx), max(1, 16 // e)) if slot_runs else 1
    v_align_any = v_ok and not slot_runs
    v_align_runs = v_ok and slot_runs and (v_contig * e) % 16 == 0
    return k_align, v_align_any, v_align_runs, v_contig


def _rows_al16(strides: tuple[int, int, int], al16: bool, elem: int) -> bool:
    """``[tokens, heads, D]`` rows (unit feature stride) whose pointer and strides are 16-byte multiples."""
    return al16 and all((s * elem) % 16 == 0 for s in strides[:-1])


def _merge_new(p: Problem, block_n: int, block_n_ctx: int, wide: bool) -> bool:
    """Whether the masked tiles of the context and of the new tokens run in one loop (kernel
    ``MERGE_NEW``): the new rows must load like cache rows (a K cache without an ``x`` split, a V cache
    that is not token-contiguous, unit feature strides, the cache's token stride (an NHD cache and
    contiguous k/v), the same dtype, so one pointer type, one set of feature offsets and one lane
    stride serve both), one tile width, and with int32 cache offsets new-token offsets in int32 too."""
    kc, vc = p.kc, p.vc
    if p.k_strides is None or p.v_strides is None:
        return False
    if kc.x != 1 or kc.stride_dim != 1 or vc.stride_dim != 1 or (vc.stride_slot == 1 and vc.page_size > 1):
        return False
    if p.k_strides[0] != kc.stride_slot or p.v_strides[0] != vc.stride_slot:  # HND, or k/v views with gaps
        return False
    if p.q_dtype != p.cache_dtype or p.cache_dtype in _FP8_DTYPES:
        return False
    return block_n == block_n_ctx and (wide or p.new_rows_fit32)


def triton_plan(p: Problem, config=None, reason: str = "") -> LaunchPlan:
    """The Triton kernel's plan for ``p`` (``config``: tiles other than the table's, for sweeps)."""
    if config is None:
        config = get_config(p.arch, p.head_size, p.q_dtype, p.kc.page_size, p.cache_dtype in _FP8_DTYPES)
    block_d = max(MIN_BLOCK_D, 1 << (p.head_size - 1).bit_length())  # next power of two (head_size >= 1)
    k_align, v_align_any, v_align_runs, v_contig = _layout_hints(p, config.BLOCK_N_CTX)
    granule = v_contig if block_d >= GRANULE_MIN_BLOCK_D and v_align_runs and v_contig >= 8 else 0
    granule = 0 if p.arch in GRANULE_OFF_ARCHS else granule
    wide = not p.fits_int32
    merge = _merge_new(p, config.BLOCK_N, config.BLOCK_N_CTX, wide)
    if merge:  # the layout hints now cover the new rows too
        elem = p.q_dtype.itemsize
        k_align = k_align and _rows_al16(p.k_strides, p.k_al16, elem)
        v_align_any = v_align_any and _rows_al16(p.v_strides, p.v_al16, elem)
    out_fp8 = p.out_dtype in _FP8_DTYPES
    consts = dict(
        QUERIES_PER_KV=p.num_heads // p.kc.num_kv_heads, HEAD_DIM=p.head_size, BLOCK_D=block_d,
        PAGE_SIZE=p.kc.page_size, X=p.kc.x, K_ALIGN16=k_align, V_ALIGN16_ANY=v_align_any,
        V_ALIGN16_RUNS=v_align_runs, V_CONTIG=v_contig, BLOCK_M=config.BLOCK_M, BLOCK_N=config.BLOCK_N,
        BLOCK_N_CTX=config.BLOCK_N_CTX, CAUSAL=p.causal, USE_LEFT=p.use_left, USE_RIGHT=p.use_right,
        HAS_ALIBI=p.alibi, HAS_SINKS=p.sinks, KV_FROM_CACHE=p.kv_from_cache,
        CACHE_FP8=p.cache_dtype in _FP8_DTYPES, OUT_FP8=out_fp8,
        FP8_OUT_MAX=float(torch.finfo(p.out_dtype).max) if out_fp8 else 0.0, SKIP_DECODE=p.skip_decode,
        # fp8 cache scales are positive by contract; with softcap the folded scale is softcap * log2(e)
        FOLD_SCALE=p.scale_positive or p.softcap > 0, GRANULE=granule, WIDE_OFFSETS=wide,
        DOT_PRECISION="ieee" if p.q_dtype == torch.float32 else None, MERGE_NEW=merge,
        SOFTCAP=kernel_softcap(p.softcap, gluon=False),
        RETURN_LSE=p.lse,
        PREFETCH_IDS=block_d <= PREFETCH_IDS_MAX_BLOCK_D or p.kc.page_size < config.BLOCK_N_CTX,
    )  # fmt: skip
    opts = dict(num_warps=config.num_warps, num_stages=config.num_stages,
                register_usage_level=PTXAS_REGISTER_USAGE_LEVEL.get(p.arch, 0))  # fmt: skip
    why = f"Triton kernel, {p.arch} table tiles {config.BLOCK_M}/{config.BLOCK_N}/{config.BLOCK_N_CTX}"
    return LaunchPlan("triton", why + (f" ({reason})" if reason else ""), config.BLOCK_M,
                      LaunchPlan.items(consts), LaunchPlan.items(opts))  # fmt: skip


@functools.lru_cache(maxsize=512)
def plan(p: Problem) -> LaunchPlan:
    """The launch plan of ``p``: a Gluon kernel where its rule holds (module docstring), else the Triton
    kernel. Pure and cached (at most 512 problems: an engine has a handful)."""
    unmet = _gluon_unmet(p)
    if unmet is None:
        if p.layout == "split":
            found = _gluon_split_plan(p)
            unmet = None if found else "split cache the Gluon gathers cannot read"
        else:
            found = _gluon_tma_plan(p)
            unmet = None if found else f"{p.layout.upper()} cache or q/k/v rows TMA cannot read"
        if found is not None:
            return found
    return triton_plan(p, reason=unmet or "")
