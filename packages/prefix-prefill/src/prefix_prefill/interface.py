"""Public launchers: :func:`context_attention_fwd` (vLLM 0.33 drop-in) and :func:`prefix_prefill`.

Both validate their arguments on the host (shapes, dtypes, devices, strides; no device reads),
translate to one convention and call :func:`_launch_fwd`, which picks a config from the static
table (:mod:`prefix_prefill.configs`) and launches :func:`prefix_prefill.kernel._fwd_kernel`.
The default path never synchronises with the device and is CUDA-graph capturable; checks that
read device values (block-table contents, lengths) run only with ``validate=True`` or the
environment variable ``PREFILL_VALIDATE=1``.
"""

from __future__ import annotations

import math
import os
from typing import Union

import torch

import prefill_runtime as runtime  # runtime.gluon_*: the Gluon kernel's host side
from paged_kv_offsets import (
    CacheView,
    describe_kv_cache,
    offsets_fit_int32,
    page_walk_rest_block,
    validate_block_table,
)
from prefill_runtime import check_lse, hook_compiles, prime_triton, ptxas_launch_options, softcap_form
from prefix_prefill import autotune, ops  # ops registers torch.ops.prefix_prefill.fwd
from prefix_prefill.configs import MAX_HEAD_SIZE, KernelConfig, config_key, detect_arch, get_config
from prefix_prefill.kernel import LOG2E, _fwd_kernel

try:  # Gluon (triton >= 3.5) with its Hopper module; without it the Triton kernel runs everywhere
    from prefix_prefill.gluon_kernel import _gluon_fwd_kernel, _gluon_split_kernel
except Exception:  # pragma: no cover - any import failure means "no Gluon"
    _gluon_fwd_kernel = _gluon_split_kernel = None

_Q_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_FP8_DTYPES = tuple(
    getattr(torch, n)
    for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    if hasattr(torch, n)
)
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
_MAX_GRID_YZ = 65535

Scale = Union[float, torch.Tensor, None]


# --------------------------------------------------------------------------- host-side checks
def _is_tensor(t: object, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def _check_device(t: torch.Tensor, name: str, device: torch.device) -> None:
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but q is on {device}; all tensors must share a device")


def _check_last_stride(t: torch.Tensor, name: str) -> None:
    if t.numel() > 0 and t.stride(-1) != 1:
        raise ValueError(
            f"{name} must have unit stride in its last dimension, got strides {tuple(t.stride())} "
            f"(call .contiguous())"
        )


def _check_index_tensor(t: object, name: str, ndim: int, device: torch.device) -> torch.Tensor:
    t = _is_tensor(t, name)
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
    if t.dim() != ndim:
        shape = "[batch, max_pages]" if ndim == 2 else "[n]"
        raise ValueError(f"{name} must be {ndim}-D {shape}, got shape {tuple(t.shape)}")
    _check_device(t, name, device)
    return t


def _e4m3_dtype(device: torch.device) -> torch.dtype:
    """The platform's fp8 e4m3 type: fnuz on MI300 (gfx942), OCP e4m3fn elsewhere."""
    if device.type == "cuda" and getattr(torch.version, "hip", None) and detect_arch(device) == "gfx942":
        return torch.float8_e4m3fnuz
    return torch.float8_e4m3fn


def _check_fp8_supported(dtype: torch.dtype, device: torch.device, name: str) -> None:
    if device.type != "cuda" or getattr(torch.version, "hip", None):
        return
    if dtype in (torch.float8_e4m3fn,) and torch.cuda.get_device_capability(device) < (8, 9):
        cap = torch.cuda.get_device_capability(device)
        raise ValueError(
            f"{name} is {dtype}, which Triton supports only on compute capability >= 8.9 "
            f"(this device is {cap[0]}.{cap[1]}); use fp8_e5m2 or a 16-bit dtype"
        )


def _scale_tensor(s: Scale, name: str, device: torch.device) -> torch.Tensor | None:
    """A per-tensor scale as a 1-element device tensor (no host sync; None stays None)."""
    if s is None:
        return None
    if isinstance(s, torch.Tensor):
        if s.numel() != 1:
            raise ValueError(f"{name} must hold one value (per-tensor scale), got shape {tuple(s.shape)}")
        if not s.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point tensor, got {s.dtype}")
        _check_device(s, name, device)
        return s.reshape(1)
    if isinstance(s, (int, float)) and not isinstance(s, bool):
        if not (math.isfinite(float(s)) and float(s) > 0):
            raise ValueError(f"{name} must be a finite positive fp8 dequantisation scale, got {s}")
        return torch.full((1,), float(s), dtype=torch.float32, device=device)
    raise TypeError(f"{name} must be a float or a 1-element tensor, got {type(s).__name__}")


def _check_per_head(t: object, name: str, num_heads: int, device: torch.device) -> torch.Tensor | None:
    if t is None:
        return None
    t = _is_tensor(t, name)
    if not t.dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if t.dim() != 1 or t.shape[0] != num_heads:
        raise ValueError(f"{name} must have shape [num_heads] = [{num_heads}], got {tuple(t.shape)}")
    _check_device(t, name, device)
    return t


def _validate_enabled(validate: bool) -> bool:
    return bool(validate) or os.environ.get("PREFILL_VALIDATE", "0") == "1"


def _check_inputs(
    q: object,
    k: object,
    v: object,
    o: object,
    k_cache: object,
    v_cache: object,
    kv_layout: str,
    block_table: object,
    cu_seqlens_q: object,
    seq_lens: object,
    max_query_len: object,
    *,
    names: dict[str, str],
    out_fp8: bool,
) -> tuple[CacheView, CacheView]:
    """Every host-side check shared by both API forms; ``names`` maps roles to argument names."""
    q = _is_tensor(q, "q")
    if q.dim() != 3:
        raise ValueError(f"q must be 3-D [total_q, num_heads, head_size], got shape {tuple(q.shape)}")
    if q.dtype not in _Q_DTYPES:
        raise TypeError(f"q must be float16, bfloat16 or float32, got {q.dtype}")
    _check_last_stride(q, "q")
    total_q, num_heads, head_size = q.shape
    if head_size > MAX_HEAD_SIZE:
        raise ValueError(f"q head size must be <= {MAX_HEAD_SIZE}, got {head_size}")
    if head_size < 1 or num_heads < 1:
        raise ValueError(f"q must have at least one head of at least one feature, got {tuple(q.shape)}")
    device = q.device

    if (k is None) != (v is None):
        raise ValueError("k and v must both be tensors or both be None (new tokens read from the cache)")
    num_kv_heads = None
    if k is not None:
        for name, t in (("k", k), ("v", v)):
            t = _is_tensor(t, name)
            if t.dim() != 3 or t.shape[0] != total_q or t.shape[2] != head_size:
                raise ValueError(
                    f"{name} must have shape [total_q, num_kv_heads, head_size] = "
                    f"[{total_q}, *, {head_size}], got {tuple(t.shape)}"
                )
            if t.dtype != q.dtype:
                raise TypeError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
            _check_last_stride(t, name)
            _check_device(t, name, device)
        assert isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)
        if v.shape != k.shape:
            raise ValueError(f"v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
        num_kv_heads = k.shape[1]

    k_cache = _is_tensor(k_cache, "k_cache")
    v_cache = _is_tensor(v_cache, "v_cache")
    kc, vc = describe_kv_cache(k_cache, v_cache, kv_layout)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != q.dtype and t.dtype not in _FP8_DTYPES:
            raise TypeError(f"{name} must have q's dtype {q.dtype} or an fp8 dtype, got {t.dtype}")
        _check_last_stride(t, name)
        _check_device(t, name, device)
        _check_fp8_supported(t.dtype, device, name)
    if k_cache.dtype != v_cache.dtype:
        raise TypeError(f"k_cache and v_cache must share a dtype, got {k_cache.dtype} and {v_cache.dtype}")
    if kc.head_size != head_size:
        raise ValueError(f"k_cache head size {kc.head_size} does not match q head size {head_size}")
    if num_kv_heads is not None and kc.num_kv_heads != num_kv_heads:
        raise ValueError(f"k_cache has {kc.num_kv_heads} kv heads but k has {num_kv_heads}")
    num_kv_heads = kc.num_kv_heads
    if num_kv_heads < 1 or num_heads % num_kv_heads != 0:
        raise ValueError(
            f"q has {num_heads} heads, which is not a multiple of the {num_kv_heads} kv heads of k_cache"
        )

    oname = names["o"]
    o = _is_tensor(o, oname)
    if tuple(o.shape) != tuple(q.shape):
        raise ValueError(f"{oname} must have q's shape {tuple(q.shape)}, got {tuple(o.shape)}")
    if out_fp8:
        if o.dtype not in _FP8_DTYPES:
            raise TypeError(f"{oname} must be an fp8 tensor when fp8_out_scale is given, got {o.dtype}")
        _check_fp8_supported(o.dtype, device, oname)
    elif o.dtype != q.dtype:
        raise TypeError(f"{oname} must have q's dtype {q.dtype}, got {o.dtype}")
    _check_last_stride(o, oname)
    _check_device(o, oname, device)

    bt = _check_index_tensor(block_table, names["block_table"], 2, device)
    cu = _check_index_tensor(cu_seqlens_q, names["cu_seqlens_q"], 1, device)
    sl = _check_index_tensor(seq_lens, names["seq_lens"], 1, device)
    batch = sl.shape[0]
    if cu.shape[0] != batch + 1:
        raise ValueError(
            f"{names['cu_seqlens_q']} must have batch + 1 = {batch + 1} entries "
            f"({names['seq_lens']} has {batch}), got {cu.shape[0]}"
        )
    if bt.shape[0] < batch:
        raise ValueError(f"{names['block_table']} has {bt.shape[0]} rows for {batch} sequences")
    if batch > _MAX_GRID_YZ:
        raise ValueError(f"{names['seq_lens']}: at most {_MAX_GRID_YZ} sequences per launch, got {batch}")
    mq = names["max_query_len"]
    if isinstance(max_query_len, bool) or not isinstance(max_query_len, int):
        raise TypeError(f"{mq} must be a Python int, got {type(max_query_len).__name__}")
    if max_query_len < 0:
        raise ValueError(f"{mq} must be >= 0, got {max_query_len}")
    return kc, vc


def _check_device_values(
    q: torch.Tensor,
    kv_from_cache: bool,
    kc: CacheView,
    block_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    max_query_len: int,
    skip_decode: bool,
    names: dict[str, str],
) -> None:
    """The checks that read device values (one device-to-host copy each): opt-in."""
    cu = cu_seqlens_q.detach().to("cpu", torch.int64)
    sl = seq_lens.detach().to("cpu", torch.int64)
    cn, sn = names["cu_seqlens_q"], names["seq_lens"]
    if cu.numel() and int(cu[0]) < 0:
        raise ValueError(f"{cn}[0] must be >= 0, got {int(cu[0])}")
    q_lens = cu[1:] - cu[:-1]
    if bool((q_lens < 0).any()):
        b = int(torch.nonzero(q_lens < 0)[0])
        raise ValueError(f"{cn} must be non-decreasing, but {cn}[{b + 1}] < {cn}[{b}]")
    if cu.numel() and int(cu[-1]) > q.shape[0]:
        raise ValueError(f"{cn}[-1] = {int(cu[-1])} exceeds the {q.shape[0]} query rows of q")
    if bool((sl < q_lens).any()):
        b = int(torch.nonzero(sl < q_lens)[0])
        raise ValueError(
            f"{sn}[{b}] = {int(sl[b])} is smaller than the query length {int(q_lens[b])} of sequence {b}"
        )
    if q_lens.numel() and int(q_lens.max()) > max_query_len:
        raise ValueError(
            f"{names['max_query_len']} = {max_query_len} is smaller than the longest query "
            f"({int(q_lens.max())})"
        )
    need = sl.clone() if kv_from_cache else sl - q_lens  # cached tokens each sequence reads
    if skip_decode:
        need[q_lens == 1] = 0
    validate_block_table(block_table, need, kc.page_size, kc.num_blocks, name=names["block_table"])


# --------------------------------------------------------------------------- launch
def _layout_hints(
    k_cache: torch.Tensor, v_cache: torch.Tensor, kc: CacheView, vc: CacheView, block_n_ctx: int
) -> tuple[bool, bool, bool, int]:
    """Alignment/contiguity facts the kernel may promise the compiler (see kernel._cache_tile).

    A cache is "16-byte aligned" when its data pointer and every non-unit stride are multiples of
    16 bytes: then every contiguous run of a tile (along the unit-stride dimension) starts aligned.
    In vLLM's V layout the unit-stride dimension is the page slot, so runs are ``gcd(page,
    BLOCK_N_CTX)`` tokens of one page, and only in unmasked context tiles (which start at multiples
    of BLOCK_N_CTX); the V promise then also needs runs of at least 16 bytes.
    Returns ``(k_align16, v_align16_any, v_align16_runs, v_contig)``.
    """
    e = k_cache.element_size()

    def aligned(t: torch.Tensor, view: CacheView) -> bool:
        strides = (view.stride_block, view.stride_slot, view.stride_head, view.stride_dim, view.stride_x)
        return t.data_ptr() % 16 == 0 and all((s * e) % 16 == 0 for s in strides if s not in (0, 1))

    k_align = aligned(k_cache, kc)
    v_ok = aligned(v_cache, vc)
    slot_runs = vc.stride_slot == 1 and vc.page_size > 1  # tokens are the contiguous dimension
    # capped at one 16-byte vector: longer runs load no faster, and the cap makes every page whose
    # runs reach 16 bytes (512, 544, 1040, ...) compile to the same kernel (see _page_constexpr)
    v_contig = min(math.gcd(vc.page_size, block_n_ctx), max(1, 16 // e)) if slot_runs else 1
    v_align_any = v_ok and not slot_runs
    v_align_runs = v_ok and slot_runs and (v_contig * e) % 16 == 0
    return k_align, v_align_any, v_align_runs, v_contig


def _rows_aligned(t: torch.Tensor) -> bool:
    """``[tokens, heads, D]`` rows (unit feature stride) whose pointer and strides are 16-byte multiples."""
    e = t.element_size()
    return t.data_ptr() % 16 == 0 and all((s * e) % 16 == 0 for s in t.stride()[:-1])


def _merge_new_tokens(
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kc: CacheView,
    vc: CacheView,
    config: KernelConfig,
    max_query_len: int,
    wide: bool,
    walk: bool,
    k_chunk: int,
) -> bool:
    """Whether the kernel runs the context and the new tokens in one pair of loops, or one masked loop
    (``MERGE_NEW``, see ``_MERGE_NEW_TOKENS`` and ``_MERGE_MASKED_TILES``): the new rows must load
    like cache rows (a K cache without an ``x`` split, a V cache that is not token-contiguous, unit
    feature strides, the cache's token stride (an NHD cache and contiguous k/v), the same dtype, so
    one pointer type, one set of feature offsets and one lane stride serve both), one tile width, no
    page walk or K chunks, and, with int32 cache offsets, new-token offsets that fit int32 too."""
    if not (_MERGE_NEW_TOKENS or _MERGE_MASKED_TILES) or k is None or v is None:
        return False
    if kc.x != 1 or kc.stride_dim != 1 or vc.stride_dim != 1 or (vc.stride_slot == 1 and vc.page_size > 1):
        return False
    if k.stride(0) != kc.stride_slot or v.stride(0) != vc.stride_slot:  # HND, or k/v views with gaps
        return False
    if k.dtype != k_cache.dtype or v.dtype != v_cache.dtype or k_cache.dtype in _FP8_DTYPES:
        return False
    if walk or k_chunk or config.BLOCK_N != config.BLOCK_N_CTX:
        return False
    return wide or (max_query_len + config.BLOCK_N) * max(k.stride(0), v.stride(0), 1) < 2**31


def _page_constexpr(page_size: int, config: KernelConfig, kv_from_cache: bool) -> int:
    """The kernel's ``PAGE_SIZE`` constexpr: 0 (the page size passed at runtime) when every cache tile
    fits in a page and tiles are addressed per tile, else the page size itself (per-lane addressing
    with a compile-time divisor). With 0, pages 512, 544, 1024, 1040, 1056, 2048... share one compiled
    kernel, so a page that is not a power of two runs the same instructions as one that is."""
    widest = max(config.BLOCK_N_CTX, config.BLOCK_N if kv_from_cache else 0)
    return 0 if _TILE_PAGES and _RUNTIME_PAGE and page_size >= widest else page_size


# Fold the logit scale into the exponent's FMA in interior tiles (kernel.py, ``_attend``). A switch
# only so that benchmarks can time the unfolded form; both forms are tested.
_FOLD_SCALE = True
# Address cache tiles with paged_kv_offsets.tile_blocks/tile_block_offsets (one set of block-table
# reads per tile for K and V; one divide and two scalar reads when the tile is no wider than a page)
# instead of token_offsets per token and cache. On since the H200 A/B of 2026-11-29 (session 3,
# bench/results/NOTES.md step 10); the per-token path stays for A/B runs and both are tested.
_TILE_PAGES = True
# With per-tile addressing, pass a page at least as wide as every cache tile at runtime (one kernel for
# all such pages, _page_constexpr) instead of as a constexpr. Off: on the H200 (2026-11-29, NOTES step
# 10) it made every page as slow as the slowest constexpr page (llama 10.2-10.4 ms vs 9.4-10.2, qwen
# NHD 3.20 vs 2.71-2.90). A switch for A/B runs; both forms are tested.
_RUNTIME_PAGE = False
# With per-tile addressing, give tiles that do not straddle a page the one-page offsets through a
# branch uniform over the program (paged_kv_offsets.tile_block_offsets BRANCH). Off: slower on the
# H200 (NOTES step 12: llama split 544 10.26 -> 10.55 ms; ptxas serialises the wgmma, C7515); both
# forms are tested.
_STRADDLE_BRANCH = False
# With per-tile addressing, compute the two-page offsets as a per-lane choice between two scalar bases
# (tile_block_offsets BASES) instead of per-lane block/slot selects and a 64-bit multiply. On since
# the H200 A/B of 2026-11-29 (session 5, NOTES step 12: llama split without page walks, 544 10.29 ->
# 10.00 ms, 1040 10.21 -> 9.81, 1056 10.25 -> 9.96); both forms are tested.
_TWO_PAGE_BASES = True
# With per-tile addressing and a constexpr page wider than the context tile but not a multiple of it
# (544, 1040, 1056 against tiles of 64/128), walk the context page by page: full tiles at page
# offsets 0, BLOCK_N_CTX, ... and one narrow rest tile per page, so no tile crosses a page and every
# address takes the one-page form a power-of-two page gets (paged_kv_offsets page walks). On since
# the H200 A/B of 2026-11-29 (session 4, NOTES step 11). Off since int32 offsets made the unwalked
# two-page tiles cheaper (session 6, NOTES step 17: llama NHD page spread 1.050 walked, 1.035 not;
# qwen NHD 1.029 either way; 544 7.84 -> 7.55 ms); both forms are tested.
_PAGE_WALK = False
# Also walk pages that ARE multiples of the context tile (512, 1024, 2048), i.e. index the aligned
# context tiles per tile instead of per position. Candidate, off and untimed: on the H200 the walked
# non-power-of-two qwen-hybrid pages ran faster than the power-of-two ones (NOTES step 11).
_WALK_ALIGNED = False
# Walk caches whose V is token-contiguous (vLLM's split layout, V ``[blocks, heads, D, page]``) too.
# Off since the H200 A/Bs of 2026-11-29 (session 5, NOTES step 12): in that layout a masked or narrow
# context tile is expensive (a masked V tile is a synchronous 2-byte gather: the one masked tile a
# 4096-token context gets at page 544 costs ~1.8 interior tiles, a 32-token rest tile ~0.5), so
# tiles at multiples of BLOCK_N_CTX with the two-page offsets (_TWO_PAGE_BASES) run faster there;
# with an NHD/HND cache (V rows contiguous, masked tiles still async copies) the walk wins.
_WALK_SLOT_CONTIG_V = False
# Compute block ids and per-token cache offsets in int32 instead of int64 when every element of both
# caches lies less than 2**31 elements from its start (paged_kv_offsets.offsets_fit_int32; a layer's
# cache up to 4 GiB in bf16): half the integer work per lane of every cache tile. On since the H200
# A/B of 2026-11-29 (session 5, NOTES step 13: 1-14% faster on every shape, layout and page, outputs
# bitwise equal); both forms are tested, and caches past 2**31 elements always take int64.
_OFFSETS_32 = True
# In caches whose V is token-contiguous (vLLM's split layout), masked context tiles attend to whole
# granules of V_CONTIG keys only, with V masked per granule so that it stays an async copy, and the
# keys of the at most two partial granules follow in narrow masked tiles (kernel._segment). Offline
# (triton 3.6, NOTES step 12/"Next GPU session"): the masked context loop's 2-byte V gather is what
# makes ptxas serialise every wgmma of the hd256 kernel (C7515); this form compiles without it.
# On for head buckets of at least _GRANULE_EDGES_MIN_BLOCK_D since the H200 A/B of 2026-11-29
# (session 6, NOTES step 17): qwen-hybrid (head 256) split layout 4.36-4.70 -> 3.74-4.22 ms on every
# page; llama (head 128, no C7515 without it) 2-3% slower on pages with masked context tiles, so off
# there. Head 192 pads to 256 and compiles like it (C7515 without, none with). Both forms are tested.
_GRANULE_EDGES = True
_GRANULE_EDGES_MIN_BLOCK_D = 256
# The q.k dot in feature chunks of _K_CHUNK (kernel._qk) instead of one dot over the whole head.
# Split K caches ([blocks, heads, D // x, page, x], _K_CHUNKS_SPLIT): ncu on the H200 (NOTES step 22)
# puts the split layout's 26-57% gap to NHD in its K tiles' async copies: each 128-byte line of one
# x-group (8 keys x 8 features) scatters to 8 rows of the swizzled shared tile (~31 shared
# wavefronts per copy against 4 in NHD), and warps stall reusing the copies' address registers.
# Chunks coalesce the global side (4 lines per warp copy instead of 16) but not the shared side, and
# add a wgmma wait per chunk: 2-7% slower on every page (step 22), so off. Chunked kernels take
# granule edges at every head size: offline (triton 3.6) the masked context tiles' 2-byte V gather
# otherwise makes ptxas serialise every wgmma (C7515) once the dot is chunked.
# NHD/HND caches with head buckets up to _K_CHUNKS_NHD_MAX_BLOCK_D (_K_CHUNKS_NHD): candidate, off.
# Step 22: llama NHD pages 544/1040 1.9-2.2% faster chunked (page spread 1.033 -> 1.003), pages
# 16/512 0-0.7% slower; qwen-hybrid (head 256) 8-11% slower everywhere, hence the head bound.
_K_CHUNK = 32
_K_CHUNKS_SPLIT = False
_K_CHUNKS_NHD = False
_K_CHUNKS_NHD_MAX_BLOCK_D = 128
# With k=None (the new tokens' K/V read back from the cache), attend to keys [0, seq_len) as one
# cached segment (kernel ONE_SEGMENT): every tile sits at a multiple of BLOCK_N_CTX, so the tiles over
# the new tokens keep the page-aligned addressing and V-run hints the context gets, and the kernel
# compiles one masked and one interior loop instead of two of each. On since the H200 A/B of session 8
# (NOTES step 28, k=None): split layout 14-18% faster (llama) and 8-12% (qwen-hybrid), NHD 0-10%;
# cold first call 5.6 -> 3.1 s (head 128) and 5.6 -> 3.4 s (head 256) on one host.
_ONE_SEGMENT_FROM_CACHE = True
# With k and v given and a cache whose tiles load like them (NHD with the new rows' token stride, the
# activations' dtype; no page walk or granule edges; BLOCK_N == BLOCK_N_CTX; no K chunks),
# run the context and the new tokens through one masked and one interior loop (kernel MERGE_NEW,
# _segments_merged): a runtime branch picks each tile's addresses, so the tile step compiles twice
# instead of four times (NOTES step 28: the first call's compile time). Candidate until timed.
_MERGE_NEW_TOKENS = False
# The same merge for the masked loops only (kernel MERGE_NEW with MERGE_INTERIOR=False): the masked
# tiles of the context and of the new tokens in one loop, each segment's interior tiles in its own
# loop as before (three compiled copies of the tile step instead of four; the masked copies are the
# big ones: offline sm_90a head 128 page 16 NHD 5656 -> 4160 SASS). On since the H200 A/B of session
# 10 (NOTES step 35, 7c0ec58): NHD llama and qwen-hybrid, 7 pages, 0-5% faster (total 70.4 -> 68.5
# ms); cold first call with k given 3.83-3.88 -> 2.54 s (head 128), 3.41-3.44 -> 2.85-2.99 s (256).
# _MERGE_NEW_TOKENS, when also on, merges the interior loops too.
_MERGE_MASKED_TILES = True
# Lazy rescaling of interior tiles (kernel LAZY_RESCALE, _attend): acc [BM, BD] is rescaled only when
# some row's running max grows by more than this many log2 units in a tile (0: every tile). The max
# only stabilises exp2, so a stale one changes no result beyond rounding (p <= 2**_LAZY_RESCALE); it
# saves BM * BD / threads multiplies per tile (128 per thread at head 256: 26% of the interior loop's
# SASS offline) for one tile-wide max (two barriers). Candidate (NOTES step 29), off until timed.
_LAZY_RESCALE = 0
# In a page walk whose rest (page % BLOCK_N_CTX tokens) is a power of two of at least 16 (544, 1056:
# 32 against tiles of 128; 1040: 16), attend to the rest tiles of BLOCK_N_CTX // rest pages at once in
# one full-width tile (paged_kv_offsets.page_walk_rest_group) instead of one narrow tile per page
# (544 with a 4096-token context: 2 iterations instead of 7). Candidate for the llama split-layout
# page spread (NOTES step 12), off until timed on a GPU; both forms are tested.
_REST_GROUP = False
# Context tiles of whole pages narrower than the tile (page 16 against 128 keys; aligned, unmasked):
# one block-table read per page instead of per lane (paged_kv_offsets.tile_blocks PAGE_VECTOR). Timed
# on the H200 (NOTES steps 37-38, three runs): page 16 llama NHD 7.54-7.73 -> 7.30-7.33 ms (-3 to -5%),
# k=None 8.20-8.24 -> 7.50-7.61 ms, qwen-hybrid (head 256) unchanged within 1%, other pages unchanged
# (same code). A form with one scalar row bound per tile (fewer SASS: 525 -> 494 at head 256) ran
# qwen page 16 10% slower: not taken.
_PAGE_VECTOR = True
# Interior context tiles read the next tile's block ids one iteration ahead and carry them (kernel
# PREFETCH_IDS, paged_kv_offsets.tile_blocks IDS): ncu of qwen-hybrid (head 256) NHD on the H200
# (NOTES step 43) put ~5% of page 16's loop stalls on the block-id read and its first use, right
# before the next tile's K/V copies. H200 A/B (same process, 620a98a): head 128 faster on every
# page and layout (NHD 1-6%, split 2-8%, k=None 4-8%); head 256 faster where a context tile spans
# several pages (page 16: NHD -2%, k=None -3%, split -1%) but mixed on wide pages (NHD 512/1024
# +3/+5%, others within +-1%; session 13 repeated it: +3% on 512/1024/2048, 544/1040/1056 within
# 1%), so wider heads take it only for pages narrower than the tile. On; both forms are tested.
_PREFETCH_IDS = True
_PREFETCH_IDS_MAX_BLOCK_D = 128
# When the V cache's block and slot strides equal the K cache's (NHD/HND caches as two tensors of one
# shape, or the two halves of one [blocks, 2, ...] tensor; not vLLM's split layout), compute one set of
# per-lane cache offsets for both (kernel KV_SAME_STRIDES). Offline (sm_90a, NOTES step 44): context
# interior loop 569 -> 543 SASS (head 128 page 16), 574 -> 544 (1056), 495 -> 474 (head 256 page 16),
# 494 -> 484 (512). Timed on the H200 (NOTES step 46, 99b5569): slower, llama NHD +1 to +10% and
# qwen-hybrid +5 to +8% on every page (fewer instructions, a worse schedule). Off; both forms are tested.
_KV_SAME_STRIDES = False
# ptxas's --register-usage-level for this kernel (prefill_runtime.ptxas_launch_options; 0: not passed,
# ptxas's default 5). Offline (ptxas 12.8, sm_90a, NOTES step 47): at 3 or below the head-128 context
# loop of pages 16 and 512 issues the next tile's address work before the q.k wgmma and its K/V copies
# back to back, the order pages 544/1056 get at the default. H200 A/B (5 rounds, medians): llama NHD
# page 16 -3.9%, 1024 -2.7%, 512 -1.7%, the others -1.6 to +0.5%, page spread 1.080 -> 1.052;
# qwen-hybrid NHD within +-1% (spread 1.026 -> 1.012); k=None within +-2%; split llama -0.2 to -3%.
# Compile time unchanged. On (3) for the architectures it was timed on; 0 restores ptxas's default.
_PTXAS_REGISTER_USAGE_LEVEL = 3
_PTXAS_REGISTER_USAGE_ARCHS = ("sm90",)
# Soft-capping on NVIDIA GPUs through the hardware tanh (PTX tanh.approx.f32, kernel SOFTCAP=2: one
# MUFU op per logit instead of exp2 + a divide; relative error ~2**-11, as FlashAttention's and
# FlashInfer's soft-capping). The interpreter and AMD take the exp2 form (SOFTCAP=1). NOTES step 41.
_FAST_TANH = True
# Triton's one-time process setup, run side by side before the first launch (_prime_triton).
_TRITON_PRIMED = False
# Build the kernel's launcher (a C module Triton compiles with gcc, 0.25-0.35 s) in a thread while the
# kernel itself compiles (prefill_runtime.hook_compiles). H200, NOTES step 49: cold first call (k
# given, bf16) 2.70 / 2.89 -> 2.16 / 2.42 s at head 128 with the (dropped) line-table shortcut too.
# The Gluon kernel's too (its descriptors are all TMA: step 56, 3.58 / 3.27 -> 3.08 / 2.97 s).
_PREBUILD_LAUNCHER = True
# The warp-specialised Gluon kernel (prefix_prefill.gluon_kernel: a TMA producer warp filling K/V rings
# page box by page box, two consumer warpgroups overlapping softmax and wgmma) where it applies
# (_gluon_launch: sm90, 16-bit q/cache/out, NHD cache with contiguous pages, page size % 16 == 0,
# head 64/128/256, causal, no window, ALiBi, sinks, soft-capping or skip_decode, TMA-able q/k/v) and
# no config is given. H200 (NOTES step 53): llama NHD 6.79-7.15 -> 5.65-6.06 ms, qwen NHD 2.50-2.55 ->
# 1.86-2.06 ms over the seven pages. Env PREFIX_PREFILL_GLUON=0 turns it off for a process.
_GLUON = os.environ.get("PREFIX_PREFILL_GLUON", "1") != "0"
# Set when the Gluon kernel failed to build or launch once (another Triton's Gluon): Triton from then on.
_GLUON_FAILED = False
# Gluon kernel, context blocks across pages (pages 16, 1040 at 128-key blocks): the producer reads the
# block ids of a block's page runs as one vector instead of one scalar read per TMA copy (kernel
# VECTOR_IDS). Offline (sm_90a, NOTES step 55): the eight dependent load -> copy steps become one load
# and a 3-shuffle reduction per copy. H200 (step 56, round-robin): page 16 -0.7% (llama) / +0.8%
# (qwen), the rest unchanged: the copies, not the id loads, pace page 16. Off.
_GLUON_VECTOR_IDS = False
# Gluon kernel: every context block as BLOCK_N / 16 TMA copies of 16 tokens, wherever it lies (kernel
# BOX=16, IN_PAGE_COPY=False), so every page size (a multiple of 16) runs one instruction stream and
# one compiled variant. H200, NOTES step 56 (round-robin timing): page spread llama 1.021 -> 1.000,
# qwen 1.017 -> 1.008, but the one-copy pages 1.5% (llama) / 1% (qwen) slower. Off: both forms keep
# every page within 3%, and the default is the faster.
_GLUON_UNIFORM_BOX = False
# vLLM's split layout through the Gluon kernel too (kernel _gluon_split_kernel: the producer warps gather
# context blocks with 16-byte cp.async copies into the rings, K as [BLOCK_N, D], V as [D, BLOCK_N];
# new tokens by TMA, V from a transposed copy). Env PREFIX_PREFILL_GLUON_SPLIT=0 turns it off.
_GLUON_SPLIT = os.environ.get("PREFIX_PREFILL_GLUON_SPLIT", "1") != "0"
# Split-layout Gluon kernel, pages shorter than a key block (16, 32, 64): the V gathers put a page's
# key run per feature row on page_size / 8 threads (kernel V_TPR) and gather the block page by page,
# so one warp copy reads the back-to-back feature rows of one page (whole 128-byte lines) instead of a
# 32-byte piece of several pages per row; producers stay at 32 registers (one page's block id live at
# a time; session 17's first form held one per page and needed 48). H200 (NOTES step 62): the L2
# requests stay the same (ncu), llama page 16 10% slower, qwen-hybrid equal; with K by wide TMA boxes
# (session 20, step 66): page 16 6.90 -> 8.75 ms (llama), 2.29 -> 2.55 (qwen-hybrid). Candidate.
_GLUON_SPLIT_PAGE_ROWS = False
# Split-layout Gluon kernel with one warp per producer at 56 registers (the first form) instead of two
# at 32: the setmaxnreg budget is per warpgroup, so one-warp producers cost the default consumer
# warpgroup 48 registers (208 left; spills at head 256). Candidate (A/B).
_GLUON_SPLIT_ONE_WARP = False
# Split-layout Gluon kernel at head <= 128: three ring slots instead of two (224 KiB of shared memory
# with Q), so the gathers of two blocks can be in flight while the consumers work on a third. Test of
# whether page 16's gap is latency the ring does not hide. Candidate (A/B).
_GLUON_SPLIT_STAGES3 = False
# Split-layout Gluon kernel: V by TMA instead of cp.async gathers (kernel V_TMA): a V slot [D, BLOCK_N]
# in a 32-byte-swizzled layout is BLOCK_N / 16 column blocks [D, 16], each one box of 16 keys of a
# page from the V cache seen as [num_blocks * kv_heads * D, page_size] (blocks contiguous), so V's
# short page runs leave the load/store unit (page 16's gap, NOTES step 60). H200 (NOTES step 62):
# correct, 1-15% slower on every page (page 16 too: its spread shrinks only because the others
# slow down) while K was gathered. With K by TMA (session 20, NOTES step 66, round-robin, outputs
# bitwise equal): qwen-hybrid (head 256) faster on every page (2.264-2.272 -> 2.157-2.172 ms at pages
# >= 512, page 16 2.336 -> 2.297), llama (head 128) page 16 4% slower and the rest within 0.5%.
# None: on for the head sizes in _GLUON_SPLIT_V_TMA_HEADS where K goes by TMA; True / False: on / off
# for every head size (A/Bs, tests). Needs a contiguous V cache.
_GLUON_SPLIT_V_TMA: bool | None = None
_GLUON_SPLIT_V_TMA_HEADS = frozenset({256})
# Split-layout Gluon kernel: K by TMA instead of cp.async gathers (kernel K_TMA): every 8-key chunk of a
# block is D/64 boxes [8, 64] of the K cache seen as [num_blocks * kv_heads * D/8, page_size * 8] (a
# feature group's 8 keys x 8 features: one whole 128-byte line of vLLM's split layout, at any page size)
# into a no-swizzle K ring that wgmma reads as K-major core matrices, 64 features per wgmma; the new
# tokens' K from a per-call copy of k in the same layout. Needs contiguous caches. H200 (NOTES step 62):
# the split kernel was bound by the L2 tag lookups of its 16-byte gathers (ncu: 74-82% of peak, page 16
# +28-31% requests); with K by TMA, head 256 (qwen-hybrid) runs 2.46-2.49 ms on every page (was
# 2.70-3.23; max/min 1.012), head 128 (llama) 8.35-8.49 ms (was 6.67-7.33: step 64's ncu found the
# producer's per-chunk reads and boxes starving the consumers; see _GLUON_SPLIT_K_WIDE). None: on for
# the head sizes in _GLUON_SPLIT_K_TMA_HEADS, and with _GLUON_SPLIT_K_WIDE for
# _GLUON_SPLIT_K_WIDE_HEADS; True / False: on / off for every head size (A/Bs, tests).
_GLUON_SPLIT_K_TMA: bool | None = None
_GLUON_SPLIT_K_TMA_HEADS = frozenset({256})
# With K by TMA: a one-warp K producer that reads a block's block-table entries as one vector (kernel
# K_LEAN). The SASS of the two-warp producer (session 18) issues each 8-key chunk's boxes after a
# dependent scalar block-table load, with a partition-wide barrier before every box: 16 serial loads
# per block at head 128 (8 at 256), a suspect for head 128's slowdown (NOTES step 62). Its chunks run
# in a loop, not unrolled: offline the kernel compiles ~0.3-0.4 s faster than K by TMA as shipped.
# H200 (NOTES step 64, round-robin, outputs bitwise equal): slower still, llama 8.88-9.19 ms and qwen
# 2.79-2.89 ms with it against 8.35-8.49 / 2.46-2.49 for K by TMA (session 18): the producer is not
# what slows head 128. Candidate.
_GLUON_SPLIT_K_TMA_LEAN = False
# With K by TMA: a context block that lies inside one page (pages >= the key block) as D/64 boxes
# [BLOCK_N/8, 8, 64] of the K cache seen as [page/8, blocks * kv_heads * D/8, 64] (kernel K_WIDE; a 3-D
# view whose strides are not in decreasing order), one block-table read per block instead of one per
# 8-key chunk and 2 boxes instead of 32 at head 128. ncu of session 19 (NOTES step 64): with K by TMA
# llama's consumers wait 7x longer for ready K slots (the producer's 16 dependent block-id loads and 32
# boxes per block, each behind a partition barrier). Other blocks (across pages; all of them at pages
# shorter than a block) as 16-key runs: a read and D/64 boxes [2, 8, 64] per run. Pages % 16 == 0.
# H200 (step 64, round-robin against the gathers, outputs bitwise equal): llama 7.02-7.58 -> 6.51-6.56
# ms (page 16 7.20), qwen-hybrid 2.78-3.28 -> 2.23-2.30 ms: every page faster in both.
# With it, K by TMA's default (_GLUON_SPLIT_K_TMA = None) also covers _GLUON_SPLIT_K_WIDE_HEADS.
_GLUON_SPLIT_K_WIDE = True
_GLUON_SPLIT_K_WIDE_HEADS = frozenset({128, 256})
# With the wide boxes: the 16-key runs of a block (every block at page 16) read all their block-table
# entries before the first box (kernel K_IDS_FIRST). Offline SASS (session 19, NOTES step 64): without
# it each run's read sits right after the partition barrier that follows the previous run's boxes and
# its id feeds the next box, so page 16 waits for 8 serial block-table reads a block (one at the
# pages that hold a whole block); with it the 8 reads issue back to back. H200 (session 20, NOTES step
# 66, round-robin 30, outputs bitwise equal): llama page 16 6.86 -> 7.06 ms (slower), other pages and
# qwen-hybrid unchanged: the serial reads are not page 16's limit. Candidate.
_GLUON_SPLIT_K_IDS_FIRST = False
# Split-layout Gluon kernel: three V slots instead of two (kernel V_STAGES; the K ring keeps two, so
# K by TMA still applies): 224 KiB of shared memory with Q at heads 128 and 256. ncu of session 20
# (llama, K by wide TMA boxes, NOTES step 66): at page 16 the consumers' waits for ready V slots retry
# 2.1x as often as at page 512 (89 M vs 42 M), K's alike (4.5 M vs 3.9 M), and the tensor pipe is
# active 62.8% against 68.7%: page 16's V gathers (a warp copy touches 16 32-byte pieces of 8 pages
# instead of 4 whole lines) land too late for two slots? H200 (same step, round-robin 30): no: llama
# page 16 6.97 -> 7.04 ms, every other page within 0.3%: the V copy rate, not the ring's depth, sets
# page 16's pace. Candidate.
_GLUON_SPLIT_V_STAGES3 = False
# Split-layout Gluon kernel, V gathered (not by TMA), pages shorter than a block that divide it: V
# gathered page by page (as _GLUON_SPLIT_PAGE_ROWS: a warp copy reads one page's back-to-back feature
# rows, whole lines, instead of 32-byte pieces of 8 pages) with the block's block-table entries read
# first, all at once (kernel V_IDS_FIRST). Why: page 16 is V-bound (NOTES step 66) and
# _GLUON_SPLIT_PAGE_ROWS alone ran 27% slower there, plausibly because each run's copies waited for its
# own block-table read (eight dependent reads per block). H200 (NOTES step 71, robin 20): no: llama
# page 16 6.83 -> 8.80 ms, page 32 6.86 -> 7.72 (the page-by-page mapping itself is slow). Candidate.
_GLUON_SPLIT_V_IDS_FIRST = False
# Split-layout Gluon kernel, V gathered: threads along a feature row's keys in the V gathers (kernel
# V_TPR; 0: BLOCK_N / 8, a warp copy then reads 2 features x 128 keys). The block is gathered in runs of
# V_TPR * 8 keys with the default per-8-key-group mapping (any page). Why: at page 16 a warp copy of
# the default reads 2 features of 8 pages, eight 64-byte halves of 128-byte lines; with 8 threads
# along the keys it reads 4 features of 4 pages, four whole lines (a page's 4 feature rows are one
# line), as at the large pages, and the shared-memory side writes whole 128-byte swizzle rows.
# Candidate (int, A/B with ab_prefix --on-value).
_GLUON_SPLIT_V_TPR = 0
# Split-layout Gluon kernel, K by wide TMA boxes: the blocks that are not inside one page (all of them at
# pages shorter than a block) gathered by 16-byte cp.async copies into the same chunk ring instead of
# 16-key runs of D/64 boxes (kernel K_RUN_GATHER): a warp copy is one 8-key chunk's 4 feature groups,
# four whole 128-byte lines landing as four whole wgmma core matrices. Why: at page 16 the runs are 16
# boxes of 2 KB per block (8 pages x D/64 at head 128, 4 x 4 at head 256) against 2-4 boxes of 16-32 KB
# at the large pages; if the TMA unit's per-box cost sets page 16's K pace, gathers of whole lines
# avoid it (qwen-hybrid's page 16 with V by TMA too is then K-bound). Candidate.
_GLUON_SPLIT_K_RUN_GATHER = False
# Diagnostic, not a candidate: with K by wide TMA boxes, every context block as 16-key runs (K_WIDE=2) at
# every page, to time what page 16's K runs cost at the large pages.
_GLUON_SPLIT_K_RUNS_ONLY = False
# Split-layout Gluon kernel, K by TMA: a one-warp K producer (kernel K_ONE_WARP; the shipped boxes, not
# K_LEAN's vector ids). Why (NOTES step 72): page 16's gap is its K runs, 16 boxes a block, and the
# two-warp producer's SASS puts a partition barrier (BAR.SYNC 0x40) after every box; one warp needs
# none (kernel BAR.SYNC count 97 -> 47 offline). H200 (step 72, robin 20, outputs bitwise equal): llama
# page 16 7.011 -> 6.619 ms, the other pages 0.3-0.6% faster, max/min over pages 1.076 -> 1.019;
# qwen-hybrid page 16 2.368 -> 2.276, max/min 1.073 -> 1.033. On.
_GLUON_SPLIT_K_ONE_WARP = True
# Split-layout Gluon kernel, K by TMA: three K slots beside two V slots (kernel NUM_STAGES=3, V_STAGES=2;
# 224 KiB of shared memory with Q at head 256, 192 KiB at head 128). Why (session 23, NOTES step 74):
# with the one-warp K producer, 16-key runs forced at page 512 still cost 1.7% (qwen-hybrid) / 1.3%
# (llama), half of page 16's remaining gap: if a run's cost is fill latency the two-slot ring does not
# hide, a third K slot hides it. H200 (robin): no, 0.4-1.6% slower at every page. Candidate.
_GLUON_SPLIT_K_STAGES3 = False
# Split-layout Gluon kernel with V by TMA (head 256 by default): a one-warp V producer too (kernel
# V_ONE_WARP), for the same reason (its 16-key boxes, 4 a block at head 256, each followed by a
# partition barrier in the two-warp producer; offline BAR.SYNC 45 -> 36). H200 (session 23, NOTES step
# 74, qwen-hybrid, round-robin 30, outputs bitwise equal): pages 512-2048 2.180-2.189 -> 2.167-2.173 ms
# (0.6-0.9% faster), page 16 2.252 -> 2.247. On.
_GLUON_SPLIT_V_ONE_WARP = True
# Split-layout Gluon kernel, K by wide TMA boxes: a chunk-major K ring (kernel K_CM; a slot = BLOCK_N / 8
# chunks of all D / 8 feature groups, one wgmma core matrix each) read by the consumers as one [BLOCK_N,
# D] view (stride byte offset D / 8 * 128), so a one-page block is one box [BLOCK_N / 8, D / 8, 64] and
# a 16-key run one box [2, D / 8, 64], instead of D / 64 boxes each. Why (NOTES step 72): the runs alone
# cost page 16's gap (runs forced at page 512: llama 6.36 -> 6.80 ms, page 16's 6.87); runs then issue
# 8 (head 128) / 4 (head 256) boxes a block instead of 16. It faulted on the H200 (step 72): Triton 3.6
# gives no-swizzle wgmma descriptors a matrix-base offset (view offset / 128 % 8) that the H200 honours
# once the stride byte offset is not 1024 (step 74, bench/probe_wgmma_kview.py); with it the kernel's
# PTX goes through prefill_runtime.host.clear_noswizzle_base_offsets (hook_compiles' desc_fix_flag).
# H200 (session 23, step 74, round-robin, outputs bitwise equal): qwen-hybrid (head 256) page 16 2.272
# -> 2.212 ms, pages 512-2048 2.183-2.187 -> 2.168-2.171, max/min over the 7 pages 1.041 -> 1.020;
# llama (head 128) page 16 6.649 -> 6.675, the others -0.2% to +0.8%. None: the per-head rule, on at
# _GLUON_SPLIT_K_CHUNK_MAJOR_HEADS; True / False: every head with K by wide boxes / none (A/Bs).
_GLUON_SPLIT_K_CHUNK_MAJOR = None
_GLUON_SPLIT_K_CHUNK_MAJOR_HEADS = frozenset({256})
# The per-head rule only where the base-offset fix is verified on a GPU: Triton 3.6 (another version may
# write its descriptors in a form the PTX pass does not see, and the one view would read wrong data).
_GLUON_SPLIT_K_CHUNK_MAJOR_TRITON = ("3.6",)


def _cm_triton_verified() -> bool:
    """Whether this Triton's version is one where the chunk-major form was verified on a GPU."""
    try:
        import triton

        return ".".join(triton.__version__.split(".")[:2]) in _GLUON_SPLIT_K_CHUNK_MAJOR_TRITON
    except Exception:  # pragma: no cover
        return False


# Both Gluon prefix kernels: their two consumer warpgroups as one 8-warp partition (kernel ONE_CONSUMER,
# launched with 8 warps, Q as one [BLOCK_M, D] box), so the consumer code is compiled once instead of
# inlined twice. H200 (NOTES step 62): cold first call 1.5-2.0 s (2.7-3.1 s), but 30-42% slower
# (head 256 split: equal): Triton puts a partition-wide barrier before each wait on a ready slot, so
# the two warpgroups run in lockstep and lose their ping-pong over the tensor cores. With
# _GLUON_FREE_WAITS (always, in this form; step 68): 2-7% slower. True: this form for every call (no
# tiers); the first calls of _GLUON_TIERED run it.
_GLUON_ONE_CONSUMER = False
# Both Gluon prefix kernels, tiered compiles: the first call of a (kernel, constexprs, dtype) runs the
# one-consumer form (_GLUON_ONE_CONSUMER's, with _GLUON_FREE_WAITS: it compiles the consumer once, in
# about half the time), while a daemon thread compiles the two-consumer form; once compiled, calls run
# that (the outputs are bit for bit the same). H200 (NOTES step 68): cold first call 1.76-1.93 s against
# 4.18 s on the same host; the one-consumer form runs 2-7% slower. Inside a CUDA graph capture a full
# form never launched before is not loaded: the quick form runs (call finish_compiles() before capture).
# Env PREFIX_PREFILL_GLUON_TIERED=0: the full form from the first call.
_GLUON_TIERED = os.environ.get("PREFIX_PREFILL_GLUON_TIERED", "1") != "0"
_TIERS = runtime.CompileTiers()
# Both Gluon prefix kernels: the consumers' waits for Q and ready slots without the partition-wide
# barrier Triton puts before each (its shared-memory analysis counts a wait as a write to the barrier),
# kernel FREE_WAITS: prefill_runtime.hook_compiles drops those barriers from the PTX (see
# prefill_runtime.gluon.free_wait for why the consumer does not need them). This is what held
# _GLUON_ONE_CONSUMER's two warpgroups in lockstep (NOTES step 68: 30-42% slower before, 2-7% after).
# H200, two consumers, round-robin 20, outputs bitwise equal: 0.2-1% faster on every page and shape.
# The quick form of _GLUON_TIERED always has it.
_GLUON_FREE_WAITS = True
# Both Gluon prefix kernels: compiled with LLVM's module optimisation at O0 instead of Triton's O3
# (kernel constexpr LLVM_O0, read by prefill_runtime.hook_compiles, which keeps the two forms apart in
# Triton's cache). The IR reaches LLVM already simplified by MLIR and ptxas does the machine-level
# work. Offline (sm_90a, Triton 3.6, NOTES step 64): compile 0.3-0.5 s shorter (LLVM's pipeline
# 0.35-0.5 -> 0.04 s), the same instruction mix within 1-3%, no new spills (split head 128: 24 -> 0 B).
# H200 (step 64, round-robin 20, outputs bitwise equal): split llama 6.82-7.42 -> 7.55-7.89 ms (+6-11%),
# qwen-hybrid and NHD within -1%..+1.3%; single cold first calls 2.4-4.2 s either way (noise > gain).
# Candidate.
_GLUON_LLVM_O0 = False
# The quick form of _GLUON_TIERED (first calls only) compiled with LLVM at O0, as _GLUON_LLVM_O0 does
# (its speed matters for seconds, its compile for the first call). Offline (NOTES step 70): the
# one-consumer split kernel's compile 1.58 -> 1.36 s at head 128; H200: split 128 cold 2.03 -> 1.74 s on
# one host, the llir stage 0.5 -> 0.35 s; both forms still bit for bit equal.
_GLUON_QUICK_LLVM_O0 = True


def _prime_triton() -> None:
    """Triton's one-time process setup side by side before this package's first launch
    (:func:`prefill_runtime.prime_triton`, NOTES step 35); ``_TRITON_PRIMED`` marks it done here."""
    global _TRITON_PRIMED
    _TRITON_PRIMED = True
    prime_triton()
    hook_compiles(_fwd_kernel, lambda: _PREBUILD_LAUNCHER)
    for gluon_kernel in (_gluon_fwd_kernel, _gluon_split_kernel):
        if gluon_kernel is not None:  # Gluon lowers every descriptor argument to a TMA descriptor
            hook_compiles(
                gluon_kernel,
                lambda: _PREBUILD_LAUNCHER,
                tma_descriptors=True,
                llvm_o0_flag="LLVM_O0",
                free_waits_flag="FREE_WAITS",
                desc_fix_flag="K_CM" if gluon_kernel is _gluon_split_kernel else None,
            )


def _quick_o0(full: bool) -> bool:
    """The ``LLVM_O0`` constexpr of a Gluon prefix launch: ``_GLUON_LLVM_O0``, or the quick form of
    compile tiers with ``_GLUON_QUICK_LLVM_O0`` (not when ``_GLUON_ONE_CONSUMER`` runs it for good)."""
    return _GLUON_LLVM_O0 or (not full and _GLUON_TIERED and _GLUON_QUICK_LLVM_O0 and not _GLUON_ONE_CONSUMER)


def _run_tiers(key: tuple, launch) -> None:
    """Launch a Gluon prefix kernel in its full form (two consumer warpgroups) or its quick-compiling
    form (one 8-warp consumer partition, ``_GLUON_ONE_CONSUMER``'s), per ``_GLUON_TIERED`` (see there)."""
    if _GLUON_ONE_CONSUMER:
        launch(False, False)
    elif not _GLUON_TIERED:
        launch(True, False)
    else:
        try:
            hash(key)
        except TypeError:
            key = repr(key)
        _TIERS.run(key, launch)


def finish_compiles(timeout: float | None = None) -> bool:
    """Wait (at most ``timeout`` seconds) for the Gluon kernels' full forms that are compiling in the
    background (``_GLUON_TIERED``: a first call runs a quick-compiling form and compiles the full one in
    a thread). Call it before capturing CUDA graphs, or before timing. True when none is left."""
    return _TIERS.finish(timeout)


def _try_gluon(launch) -> bool:
    """Run a Gluon kernel's launch (``prefill_runtime.gluon_try_launch``); when it cannot build or launch,
    stop offering the Gluon kernels for this process (``_GLUON_FAILED``) and return False."""
    global _GLUON_FAILED
    if runtime.gluon_try_launch(launch, "prefix_prefill"):
        return True
    _GLUON_FAILED = True
    return False


def _gluon_cache(cache: torch.Tensor, cv: CacheView, rows: int) -> object | None:
    """A Gluon TMA descriptor over an NHD cache seen as [num_blocks * page_size, kv_heads * head_size]
    (pages contiguous, one token's heads contiguous, 16-byte rows), block [rows, head_size]; None when
    the strides do not allow it or a row index would not fit in int32."""
    d, hk, page = cv.head_size, cv.num_kv_heads, cv.page_size
    if not (
        cv.layout == "nhd"
        and cv.stride_dim == 1
        and cv.stride_head == d
        and cv.stride_slot == hk * d
        and cv.stride_block == page * cv.stride_slot
        and (cv.stride_slot * cache.element_size()) % 16 == 0
        and cache.data_ptr() % 16 == 0
        and cv.num_blocks * page < 2**31
    ):
        return None
    return runtime.gluon_descriptor(cache, [cv.num_blocks * page, hk * d], cv.stride_slot, rows, d)


def _gluon_launch(
    q, k, v, o, k_cache, v_cache, kc, vc, block_table, cu_seqlens_q, seq_lens, max_query_len, *, causal, left,
    right, scale, alibi_slopes, sinks, skip_decode, softcap, lse, arch,
) -> bool:  # fmt: skip
    """Run :func:`prefix_prefill.gluon_kernel._gluon_fwd_kernel` when it applies (see ``_GLUON``);
    False when it does not (the caller then runs the Triton kernel)."""
    global _GLUON_FAILED
    head = q.shape[2]
    if (
        _gluon_fwd_kernel is None
        or _GLUON_FAILED
        or not runtime.gluon_applies(q, arch, sinks=sinks, softcap=softcap, scale=scale)
        or k_cache.dtype != q.dtype
        or v_cache.dtype != q.dtype
        or o.dtype != q.dtype
        or not causal
        or left >= 0
        or right >= 0
        or alibi_slopes is not None
        or skip_decode
        or kc.page_size % 16
        or seq_lens.shape[0] > _MAX_GRID_YZ
        or q.shape[1] > _MAX_GRID_YZ
    ):
        return False
    block_m, block_n = 128, (64 if head == 256 else 128)
    if kc.layout == "split":
        return _gluon_split_launch(
            q, k, v, o, k_cache, v_cache, kc, vc, block_table, cu_seqlens_q, seq_lens, max_query_len, scale,
            lse, block_m, block_n,
        )  # fmt: skip
    box = 16 if _GLUON_UNIFORM_BOX else math.gcd(kc.page_size, block_n)
    kcb, vcb = _gluon_cache(k_cache, kc, block_n), _gluon_cache(v_cache, vc, block_n)
    descs = [
        runtime.gluon_token_rows(q, block_m // 2),
        _gluon_cache(k_cache, kc, box),
        _gluon_cache(v_cache, vc, box),
        kcb,
        vcb,
    ]
    if k is None:  # the new tokens' K/V come from the cache: K_desc/V_desc only give the rings' layout
        descs += [kcb, vcb]
    else:
        descs += [runtime.gluon_token_rows(k, block_n), runtime.gluon_token_rows(v, block_n)]
    if any(d is None for d in descs):
        return False
    q_desc, kc_desc, vc_desc, kcb_desc, vcb_desc, k_desc, v_desc = descs
    grid = (-(-max_query_len // block_m), q.shape[1], seq_lens.shape[0])

    consts = dict(
        HEAD_DIM=head, BLOCK_M=block_m, BLOCK_N=block_n, BOX=box, KV_FROM_CACHE=k is None,
        RETURN_LSE=lse is not None, NUM_STAGES=2, VECTOR_IDS=_GLUON_VECTOR_IDS,
        IN_PAGE_COPY=not _GLUON_UNIFORM_BOX, LLVM_O0=_GLUON_LLVM_O0,
    )  # fmt: skip

    def launch(full: bool, warmup: bool) -> None:
        # the full form: two consumer warpgroups; the quick one: one 8-warp consumer partition, Q in one box
        q_arg = q_desc if full else runtime.gluon_token_rows(q, block_m)
        args = (q_arg, k_desc, v_desc, kc_desc, vc_desc, kcb_desc, vcb_desc, o, block_table, cu_seqlens_q,
                seq_lens, scale * LOG2E, q.shape[1] // kc.num_kv_heads, o.stride(0), o.stride(1),
                block_table.stride(0), kc.page_size, kc.num_blocks * kc.page_size, lse,
                lse.stride(0) if lse is not None else None)  # fmt: skip
        kw = dict(consts, ONE_CONSUMER=not full, FREE_WAITS=_GLUON_FREE_WAITS or not full,
                  LLVM_O0=_quick_o0(full), num_warps=4 if full else 8)  # fmt: skip
        if warmup:  # (a background thread: its CUDA device is not the caller's)
            with torch.cuda.device(q.device):
                _gluon_fwd_kernel.warmup(*args, grid=grid, **kw)
        else:
            _gluon_fwd_kernel[grid](*args, **kw)

    return _try_gluon(lambda: _run_tiers(("nhd", q.dtype, *consts.items()), launch))


def _split_gather_strides(k_cache: torch.Tensor, v_cache: torch.Tensor, kc: CacheView, vc: CacheView):
    """``(kc_block, kc_head, kc_group, vc_block, vc_head, vc_dim)`` for the Gluon split-layout kernel's
    16-byte gathers, or None when vLLM's split caches do not allow them: K ``x = 8`` features contiguous
    with 8-element slots, V keys contiguous, every stride and base 16-byte aligned, and the feature
    offsets of one page within int32 (the kernel keeps them in 32 bits)."""
    d = kc.head_size
    strides = (kc.stride_block, kc.stride_head, kc.stride_dim, vc.stride_block, vc.stride_head, vc.stride_dim)
    if not (
        kc.layout == "split"
        and vc.layout == "split"
        and kc.x == 8
        and kc.stride_x == 1
        and kc.stride_slot == 8
        and vc.stride_slot == 1
        and all(st % 8 == 0 and st > 0 for st in strides)
        and k_cache.data_ptr() % 16 == 0
        and v_cache.data_ptr() % 16 == 0
        and (d // 8) * kc.stride_dim < 2**31
        and d * vc.stride_dim < 2**31
    ):
        return None
    return strides


_V_COL_ALIGN = 64  # elements: each sequence's new-token V starts 128-byte aligned in its transposed copy


def _new_token_columns(cu_seqlens_q: torch.Tensor, tokens: int, device) -> tuple:
    """``(dst, col0, width)`` of the split kernel's per-call copies of the new tokens: token ``t``'s
    column ``dst[t]`` (int64 ``[tokens]``), each sequence from column ``col0[s]`` (int32 ``[batch]``, a
    multiple of ``_V_COL_ALIGN``: a TMA box whose inner start is not 16-byte aligned faulted on the
    H200, "illegal instruction"), ``width`` columns (a multiple of 8). Device ops only (no host sync)."""
    batch = cu_seqlens_q.shape[0] - 1
    cu = cu_seqlens_q.to(torch.int64)
    lens = cu[1:] - cu[:-1]
    padded = (lens + _V_COL_ALIGN - 1) // _V_COL_ALIGN * _V_COL_ALIGN
    col0 = torch.cumsum(padded, 0) - padded  # [batch]
    tok = torch.arange(tokens, device=device)
    seq = torch.searchsorted(cu[1:], tok, right=True).clamp_(max=max(batch - 1, 0))  # [tokens]
    dst = col0[seq] + (tok - cu[seq])  # [tokens] each token's column
    width = -(-tokens // 8) * 8 + _V_COL_ALIGN * batch
    return dst, col0.to(torch.int32), width


def _transposed_new_v(v: torch.Tensor, cu_seqlens_q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The new tokens' V ``[tokens, kv_heads, D]`` as ``[kv_heads * D, columns]`` (keys along the rows)
    for the split-layout Gluon kernel's TMA copies, columns as :func:`_new_token_columns` (``col0`` is
    returned). Device ops only (no host sync: CUDA graphs); the columns between sequences are left
    unwritten (the kernel zeroes V past a sequence's keys)."""
    tokens, hk, d = v.shape
    dst, col0, width = _new_token_columns(cu_seqlens_q, tokens, v.device)
    v_t = v.new_empty(hk, d, width)
    v_t.index_copy_(2, dst, v.permute(1, 2, 0))
    return v_t.view(hk * d, width), col0


def _split_new_k(k: torch.Tensor, cu_seqlens_q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The new tokens' K ``[tokens, kv_heads, D]`` in vLLM's split K layout with one page per KV head,
    ``[kv_heads, D/8, columns, 8]`` seen as ``[kv_heads * D/8, columns * 8]``, for the split kernel's K
    boxes (``_GLUON_SPLIT_K_TMA``); columns as :func:`_new_token_columns` (``col0`` is returned). The
    columns between sequences are left unwritten (their keys are masked, never multiplied)."""
    tokens, hk, d = k.shape
    dst, col0, width = _new_token_columns(cu_seqlens_q, tokens, k.device)
    k_t = k.new_empty(hk, d // 8, width, 8)
    k_t.index_copy_(2, dst, k.view(tokens, hk, d // 8, 8).permute(1, 2, 0, 3))
    return k_t.view(hk * (d // 8), width * 8), col0


def _k_full_view(block_n: int, head: int):
    """``_GLUON_SPLIT_K_CHUNK_MAJOR``'s consumer view of a K slot: ``[block_n, head]`` stored as ``block_n
    / 8`` chunks of ``[head / 8 feature groups, 8 keys, 8 features]`` dense, i.e. element offset ``d % 8 +
    (n % 8) * 8 + (d // 8) * 64 + (n // 8) * head * 8``: wgmma's no-swizzle K-major core matrices (leading
    byte offset 128, stride byte offset ``head * 16``)."""
    from triton.experimental.gluon import language as gl

    bits = [[0, 1], [0, 2], [0, 4], [1, 0], [2, 0], [4, 0]]  # d % 8, n % 8
    bits += [[0, 8 << i] for i in range((head // 8).bit_length() - 1)]  # d // 8
    bits += [[8 << i, 0] for i in range((block_n // 8).bit_length() - 1)]  # n // 8
    return gl.SharedLinearLayout(offset_bases=bits)


def _k_chunk_view(block_n: int):
    """How the split kernel's consumers read 64 features of a K slot with ``_GLUON_SPLIT_K_TMA``:
    ``[block_n, 64]`` stored as ``block_n / 8`` chunks of ``[8 feature groups, 8 keys, 8 features]``
    dense, i.e. element offset ``d % 8 + (n % 8) * 8 + (d // 8) * 64 + (n // 8) * 512``: wgmma's
    no-swizzle K-major core matrices (leading byte offset 128, stride byte offset 1024). One such view
    per 64 features (``prefill_runtime.gluon._scores_by_parts``); one view of all D features
    (``_k_full_view``, the chunk-major ring) reads right only with its PTX's no-swizzle descriptor base
    offsets cleared (NOTES step 74)."""
    from triton.experimental.gluon import language as gl

    bits = [[0, 1], [0, 2], [0, 4], [1, 0], [2, 0], [4, 0]]  # d % 8, n % 8
    bits += [[0, 8], [0, 16], [0, 32]]  # d // 8
    bits += [[8 << i, 0] for i in range((block_n // 8).bit_length() - 1)]  # n // 8
    return gl.SharedLinearLayout(offset_bases=bits)


def _k_wide_descriptor(k_cache: torch.Tensor, rows: int, page: int, block_n: int, groups: int = 8):
    """``_GLUON_SPLIT_K_WIDE``'s descriptor: vLLM's contiguous split K cache (``rows`` = num_blocks *
    kv_heads * D/8 feature groups of ``page * 8`` elements) seen as ``[page / 8, rows, 64]`` with strides
    ``[64, page * 8, 1]`` (a page's key groups of 8, the feature groups, one group's 8 keys x 8
    features), block ``[block_n / 8, 8, 64]`` in the no-swizzle layout: a box lands as ``block_n / 8``
    dense ``[8, 64]`` chunks, the K ring's layout (:func:`_k_chunk_view`). The strides are not in
    decreasing order (TMA asks only that they be multiples of 16 bytes); the box stays inside its page
    (the kernel uses it only for blocks that do). ``groups``: feature groups a box spans (8: 64 features,
    one part of the part-major ring; D / 8: every feature, ``_GLUON_SPLIT_K_CHUNK_MAJOR``)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=k_cache.element_size() * 8, rank=3)
    box = [block_n // 8, groups, 64]
    return TensorDescriptor(k_cache, [page // 8, rows, 64], [64, page * 8, 1], box, layout)


def _gluon_split_launch(
    q, k, v, o, k_cache, v_cache, kc, vc, block_table, cu_seqlens_q, seq_lens, max_query_len, scale, lse,
    block_m, block_n,
) -> bool:  # fmt: skip
    """:func:`prefix_prefill.gluon_kernel._gluon_split_kernel` over vLLM's split caches (see
    ``_GLUON_SPLIT``); False when it does not apply. The new tokens' V goes to the kernel transposed
    (:func:`_transposed_new_v`, a copy made here), so its TMA copies land as the ``[D, BLOCK_N]`` tiles
    the context's gathers write."""
    global _GLUON_FAILED
    strides = _split_gather_strides(k_cache, v_cache, kc, vc) if _GLUON_SPLIT else None
    if strides is None or _gluon_split_kernel is None:
        return False
    head, hk = q.shape[2], kc.num_kv_heads
    page = kc.page_size
    stages = 3 if _GLUON_SPLIT_STAGES3 and head <= 128 else 2
    g = head // 8
    k_tma_on = _GLUON_SPLIT_K_TMA
    if k_tma_on is None:  # the per-head rule: K by TMA where the H200 measured it faster than the gathers
        wide = _GLUON_SPLIT_K_WIDE and page % 16 == 0 and head in _GLUON_SPLIT_K_WIDE_HEADS
        k_tma_on = head in _GLUON_SPLIT_K_TMA_HEADS or wide
    k_tma = (
        k_tma_on
        and stages == 2
        and kc.stride_dim == page * 8
        and kc.stride_head == g * page * 8
        and kc.stride_block == hk * g * page * 8
        and kc.num_blocks * hk * g < 2**31
    )
    v_tma_on = _GLUON_SPLIT_V_TMA
    if v_tma_on is None:  # the per-head rule: V by TMA where the H200 measured it faster, with K by TMA
        v_tma_on = k_tma and head in _GLUON_SPLIT_V_TMA_HEADS
    v_tma = (
        v_tma_on
        and vc.stride_dim == page
        and vc.stride_head == head * page
        and vc.stride_block == hk * head * page
        and vc.num_blocks * hk * head < 2**31
    )
    v_cols = 16 if v_tma else block_n  # V_desc's block: [D, 16] boxes (32-byte swizzle) or [D, BLOCK_N]
    v_cache_arg = v_cache
    if v_tma:  # the V cache as [num_blocks * kv_heads * D, page_size], one box per 16-key run
        v_cache_arg = runtime.gluon_descriptor(v_cache, [vc.num_blocks * hk * head, page], page, head, 16)
    q_desc = runtime.gluon_token_rows(q, block_m // 2)
    # with k = None, K_desc/V_desc only give the rings' layouts
    k_desc = runtime.gluon_token_rows(q[:, :1] if k is None else k, block_n)
    if q_desc is None or k_desc is None:
        return False
    v_col0 = cu_seqlens_q  # (with k given: each sequence's first column in the transposed V)
    if k is None:
        v_desc = runtime.gluon_descriptor(q.new_empty(head, v_cols), [head, v_cols], v_cols, head, v_cols)
    else:
        v_t, v_col0 = _transposed_new_v(v, cu_seqlens_q)
        v_desc = runtime.gluon_descriptor(v_t, list(v_t.shape), v_t.shape[1], head, v_cols)
    # Q [BLOCK_M, D] + K [2, BLOCK_N, D] + V [3, D, BLOCK_N], 16-bit: 224 KiB at heads 128 and 256
    q_bytes, slot_bytes = block_m * head * 2, block_n * head * 2
    v_stages = 3 if _GLUON_SPLIT_V_STAGES3 and stages == 2 and q_bytes + 5 * slot_bytes <= 224 * 1024 else 0
    if k_tma and _GLUON_SPLIT_K_STAGES3 and not v_stages and q_bytes + 5 * slot_bytes <= 224 * 1024:
        stages, v_stages = 3, 2  # candidate: three K slots, two V slots
    k_cache_arg, k_view, kw_desc, kr_desc, k_wide = k_cache, None, None, None, 0
    k_cm_on = _GLUON_SPLIT_K_CHUNK_MAJOR
    if k_cm_on is None:  # the per-head rule: where the H200 measured the chunk-major ring faster
        k_cm_on = head in _GLUON_SPLIT_K_CHUNK_MAJOR_HEADS and _cm_triton_verified()
    k_cm = k_tma and _GLUON_SPLIT_K_WIDE and page % 16 == 0 and k_cm_on
    groups = g if k_cm else 8  # feature groups a box spans
    if k_tma and _GLUON_SPLIT_K_WIDE and page % 16 == 0:  # D/64 boxes a block inside a page, 16-key runs
        kr_desc = _k_wide_descriptor(k_cache, kc.num_blocks * hk * g, page, 16, groups)
        k_wide = 2  # pages shorter than a block: runs only
        if page >= block_n and not _GLUON_SPLIT_K_RUNS_ONLY:
            kw_desc, k_wide = _k_wide_descriptor(k_cache, kc.num_blocks * hk * g, page, block_n, groups), 1
    if k_tma:  # the K cache as [num_blocks * kv_heads * D/8, page_size * 8], one box per 8-key chunk
        k_cache_arg = runtime.gluon_descriptor(k_cache, [kc.num_blocks * hk * g, page * 8], page * 8, 8, 64,
                                               swizzle=False)  # fmt: skip
        k_view = _k_full_view(block_n, head) if k_cm else _k_chunk_view(block_n)
        if k is None:
            k_desc = k_cache_arg  # (the ring's layout; the kernel reads no new tokens)
        else:
            k_t, _ = _split_new_k(k, cu_seqlens_q)  # the same columns as v_t's
            k_desc = runtime.gluon_descriptor(k_t, list(k_t.shape), k_t.shape[1], 8, 64, swizzle=False)
        if k_wide and _GLUON_SPLIT_K_RUN_GATHER and not k_cm:  # runs gathered from the cache's pointer
            k_cache_arg = k_cache
    grid = (-(-max_query_len // block_m), q.shape[1], seq_lens.shape[0])
    v_tpr = block_n // 8
    short = kc.page_size < block_n and block_n % kc.page_size == 0  # a block = whole pages
    v_ids_first = _GLUON_SPLIT_V_IDS_FIRST and not v_tma and short
    if (_GLUON_SPLIT_PAGE_ROWS or v_ids_first) and kc.page_size < block_n:
        v_tpr = max(kc.page_size // 8, 2)  # one page's key run per feature row (a multiple of 16 keys)
    elif _GLUON_SPLIT_V_TPR:  # candidate: shorter key runs per warp copy, default mapping
        if _GLUON_SPLIT_V_TPR not in (2, 4, 8, 16):
            raise ValueError(f"_GLUON_SPLIT_V_TPR must be 0, 2, 4, 8 or 16, got {_GLUON_SPLIT_V_TPR}")
        v_tpr = min(_GLUON_SPLIT_V_TPR, v_tpr)
    warps = 1 if _GLUON_SPLIT_ONE_WARP else 2  # per producer (the two share one warpgroup's registers)
    regs = 56 if warps == 1 else 32
    tpd = max(head // 128, 1)  # the K gathers' threads along the features (gluon_kernel._gather_k_block)
    k_sub = 32 * warps if tpd == 1 else 32 // tpd  # one layout tile of keys
    v_sub = max(16, warps * 32 // v_tpr)

    consts = dict(
        HEAD_DIM=head, BLOCK_M=block_m, BLOCK_N=block_n, KV_FROM_CACHE=k is None, RETURN_LSE=lse is not None,
        NUM_STAGES=stages, K_SUB=k_sub, V_SUB=v_sub, PRODUCER_REGS=regs, V_TPR=v_tpr, PRODUCER_WARPS=warps,
        V_TMA=v_tma, K_TMA=k_tma, K_VIEW=k_view, K_LEAN=k_tma and _GLUON_SPLIT_K_TMA_LEAN,
        LLVM_O0=_GLUON_LLVM_O0, K_WIDE=k_wide, K_IDS_FIRST=_GLUON_SPLIT_K_IDS_FIRST and k_wide > 0,
        V_STAGES=v_stages, V_IDS_FIRST=v_ids_first, K_ONE_WARP=k_tma and _GLUON_SPLIT_K_ONE_WARP,
        K_RUN_GATHER=bool(k_wide) and _GLUON_SPLIT_K_RUN_GATHER and not k_cm,
        V_ONE_WARP=v_tma and _GLUON_SPLIT_V_ONE_WARP, K_CM=k_cm,
    )  # fmt: skip

    def launch(full: bool, warmup: bool) -> None:
        # the full form: two consumer warpgroups; the quick one: one 8-warp consumer partition, Q in one box
        q_arg = q_desc if full else runtime.gluon_token_rows(q, block_m)
        args = (q_arg, k_desc, v_desc, k_cache_arg, v_cache_arg, o, block_table, cu_seqlens_q, v_col0,
                seq_lens, scale * LOG2E, q.shape[1] // hk, o.stride(0), o.stride(1), block_table.stride(0),
                kc.page_size, *strides, lse, lse.stride(0) if lse is not None else None)  # fmt: skip
        kw = dict(consts, KW_desc=kw_desc, KR_desc=kr_desc, ONE_CONSUMER=not full,
                  FREE_WAITS=_GLUON_FREE_WAITS or not full, LLVM_O0=_quick_o0(full),
                  num_warps=4 if full else 8)  # fmt: skip
        if warmup:  # (a background thread: its CUDA device is not the caller's)
            with torch.cuda.device(q.device):
                _gluon_split_kernel.warmup(*args, grid=grid, **kw)
        else:
            _gluon_split_kernel[grid](*args, **kw)

    key = ("split", q.dtype, kw_desc is None, kr_desc is None, *consts.items())
    return _try_gluon(lambda: _run_tiers(key, launch))


def _page_walk(page_constexpr: int, config: KernelConfig, v_slot_runs: bool) -> tuple[bool, int, int]:
    """The kernel's ``(PAGE_WALK, REST_BLOCK, REST_GROUP)``: walk the context page by page, with rest
    tiles ``REST_BLOCK`` wide (0: the page is a multiple of the context tile), ``REST_GROUP`` pages'
    rest tiles per iteration. ``v_slot_runs``: the V cache is token-contiguous (``_WALK_SLOT_CONTIG_V``)."""
    bnc = config.BLOCK_N_CTX
    if not (_TILE_PAGES and _PAGE_WALK) or page_constexpr == 0 or page_constexpr <= bnc:
        return False, 0, 1
    if v_slot_runs and not _WALK_SLOT_CONTIG_V:
        return False, 0, 1
    rest = page_walk_rest_block(page_constexpr, bnc)
    exact = rest > 0 and page_constexpr % bnc == rest  # the rest tile holds no padding lanes
    group = bnc // rest if _REST_GROUP and exact and bnc // rest > 1 else 1
    return (rest > 0 or _WALK_ALIGNED), rest, group


def _launch_fwd(
    q: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    o: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kc: CacheView,
    vc: CacheView,
    block_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    max_query_len: int,
    *,
    causal: bool = True,
    window: tuple[int, int] = (-1, -1),
    softmax_scale: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    out_scale: torch.Tensor | None = None,
    skip_decode: bool = False,
    config: KernelConfig | None = None,
    softcap: float = 0.0,
    lse: torch.Tensor | None = None,
) -> None:
    """Launch :func:`_fwd_kernel` on already-checked arguments (see :func:`prefix_prefill`).

    ``kc``/``vc`` describe the caches (``paged_kv_offsets.describe_kv_cache``); scales are
    1-element device tensors or None; ``config`` overrides the table (tests, benchmark sweeps);
    ``softcap`` > 0: logits ``softcap * tanh(softmax_scale * q.k / softcap)``; ``lse``: a float32
    ``[H, total_q]`` buffer (unit token stride) for each row's softmax log-sum-exp (kernel
    ``RETURN_LSE``; rows skipped by ``skip_decode`` get ``-inf``), or None (compiled without it).
    """
    total_q, num_heads, head_size = q.shape
    batch = seq_lens.shape[0]
    if batch == 0 or total_q == 0 or max_query_len == 0:
        return
    # The kernel reads these 1-D tensors as ``ptr + index``: strided views must be made contiguous
    # (a no-op, without a copy, for the usual contiguous tensors).
    cu_seqlens_q, seq_lens = cu_seqlens_q.contiguous(), seq_lens.contiguous()
    sinks = sinks.contiguous() if sinks is not None else None
    alibi_slopes = alibi_slopes.contiguous() if alibi_slopes is not None else None
    num_kv_heads = kc.num_kv_heads
    cache_fp8 = k_cache.dtype in _FP8_DTYPES
    out_fp8 = o.dtype in _FP8_DTYPES
    kv_from_cache = k is None
    dummy = q  # never dereferenced: stands in for absent optional tensors
    if cache_fp8:
        one = None
        if k_scale is None or v_scale is None:
            one = torch.ones(1, dtype=torch.float32, device=q.device)
        k_scale = one if k_scale is None else k_scale
        v_scale = one if v_scale is None else v_scale
    if out_fp8 and out_scale is None:
        out_scale = torch.ones(1, dtype=torch.float32, device=q.device)
    left, right = int(window[0]), int(window[1])
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(head_size)

    arch = detect_arch(q.device)
    if config is None and _GLUON and block_table.stride(1) == 1:
        if not _TRITON_PRIMED and q.is_cuda:
            _prime_triton()
        if _gluon_launch(
            q, k, v, o, k_cache, v_cache, kc, vc, block_table, cu_seqlens_q, seq_lens, max_query_len,
            causal=causal, left=left, right=right, scale=scale, alibi_slopes=alibi_slopes, sinks=sinks,
            skip_decode=skip_decode, softcap=softcap, lse=lse, arch=arch,
        ):  # fmt: skip
            return
    if config is None:
        config = get_config(arch, head_size, q.dtype, kc.page_size)
        if autotune.autotune_enabled() and arch != "interpreter":
            key = config_key(arch, head_size, q.dtype, kc.page_size)
            default_cfg = config

            def run(cfg: KernelConfig) -> None:
                _launch_fwd(
                    q, k, v, o, k_cache, v_cache, kc, vc, block_table, cu_seqlens_q, seq_lens,
                    max_query_len, causal=causal, window=window, softmax_scale=softmax_scale,
                    alibi_slopes=alibi_slopes, sinks=sinks, k_scale=k_scale, v_scale=v_scale,
                    out_scale=out_scale, skip_decode=skip_decode, config=cfg, softcap=softcap, lse=lse,
                )  # fmt: skip

            cands = autotune.candidates(arch, head_size, q.element_size())
            config = autotune.tuned_config(q.device, key, run, default_cfg, cands)

    grid = (num_heads, -(-max_query_len // config.BLOCK_M), batch)  # plain ints: triton.cdiv costs ~2 us
    if grid[1] > _MAX_GRID_YZ:
        raise ValueError(f"max query length {max_query_len} needs more than {_MAX_GRID_YZ} query tiles")
    k_align, v_align_any, v_align_runs, v_contig = _layout_hints(k_cache, v_cache, kc, vc, config.BLOCK_N_CTX)
    page_constexpr = _page_constexpr(kc.page_size, config, kv_from_cache)
    block_d = 1 << (head_size - 1).bit_length()  # next power of two (head_size >= 1)
    walk, rest_block, rest_group = _page_walk(
        page_constexpr, config, vc.stride_slot == 1 and vc.page_size > 1
    )
    if kc.x > 1:
        chunked = _K_CHUNKS_SPLIT
    else:
        chunked = _K_CHUNKS_NHD and block_d <= _K_CHUNKS_NHD_MAX_BLOCK_D
    k_chunk = _K_CHUNK if chunked and block_d > _K_CHUNK else 0
    granule = _TILE_PAGES and _GRANULE_EDGES and (block_d >= _GRANULE_EDGES_MIN_BLOCK_D or k_chunk > 0)
    wide = not (_TILE_PAGES and _OFFSETS_32 and offsets_fit_int32(k_cache, v_cache))
    merge_new = _merge_new_tokens(k, v, k_cache, v_cache, kc, vc, config, max_query_len, wide, walk, k_chunk)
    if merge_new:  # the layout hints now cover the new rows too
        k_align = k_align and _rows_aligned(k)
        v_align_any = v_align_any and _rows_aligned(v)
    kc_strides = kc.kernel_args()  # (block, slot, head, dim, x)
    vc_strides = vc.kernel_args()
    if not _TRITON_PRIMED and q.is_cuda:
        _prime_triton()
    _fwd_kernel[grid](
        q,
        dummy if kv_from_cache else k,
        dummy if kv_from_cache else v,
        o,
        k_cache,
        v_cache,
        block_table,
        cu_seqlens_q,
        seq_lens,
        sinks if sinks is not None else dummy,
        alibi_slopes if alibi_slopes is not None else dummy,
        k_scale if cache_fp8 else dummy,
        v_scale if cache_fp8 else dummy,
        out_scale if out_fp8 else dummy,
        scale * LOG2E,
        softcap * LOG2E if softcap > 0 else 1.0,
        left,
        right,
        block_table.shape[1],
        kc.page_size,
        q.stride(0),
        q.stride(1),
        0 if kv_from_cache else k.stride(0),
        0 if kv_from_cache else k.stride(1),
        0 if kv_from_cache else v.stride(0),
        0 if kv_from_cache else v.stride(1),
        o.stride(0),
        o.stride(1),
        block_table.stride(0),
        block_table.stride(1),
        kc_strides[0],
        kc_strides[1],
        kc_strides[2],
        kc_strides[3],
        kc_strides[4],
        vc_strides[0],
        vc_strides[1],
        vc_strides[2],
        vc_strides[3],
        lse,  # None without return_lse: a constexpr, so the kernel keeps today's signature
        lse.stride(0) if lse is not None else None,
        QUERIES_PER_KV=num_heads // num_kv_heads,
        HEAD_DIM=head_size,
        BLOCK_D=block_d,
        PAGE_SIZE=page_constexpr,
        X=kc.x,
        K_ALIGN16=k_align,
        V_ALIGN16_ANY=v_align_any,
        V_ALIGN16_RUNS=v_align_runs,
        V_CONTIG=v_contig,
        BLOCK_M=config.BLOCK_M,
        BLOCK_N=config.BLOCK_N,
        BLOCK_N_CTX=config.BLOCK_N_CTX,
        CAUSAL=bool(causal),
        USE_LEFT=left >= 0,
        USE_RIGHT=right >= 0,
        HAS_ALIBI=alibi_slopes is not None,
        HAS_SINKS=sinks is not None,
        KV_FROM_CACHE=kv_from_cache,
        ONE_SEGMENT=kv_from_cache and _ONE_SEGMENT_FROM_CACHE,
        MERGE_NEW=merge_new,
        MERGE_INTERIOR=_MERGE_NEW_TOKENS,
        LAZY_RESCALE=_LAZY_RESCALE,
        CACHE_FP8=cache_fp8,
        OUT_FP8=out_fp8,
        FP8_OUT_MAX=float(torch.finfo(o.dtype).max) if out_fp8 else 0.0,
        SKIP_DECODE=bool(skip_decode),
        # fp8 cache scales are positive by contract (see the public docstrings)
        FOLD_SCALE=_FOLD_SCALE and (scale > 0 or softcap > 0),  # softcap: the scale folded is softcap*log2(e)
        SOFTCAP=softcap_form(softcap, q, _FAST_TANH),
        PAGE_VECTOR=_TILE_PAGES and _PAGE_VECTOR,
        TILE_PAGES=_TILE_PAGES,
        STRADDLE_BRANCH=_STRADDLE_BRANCH,
        TWO_PAGE_BASES=_TWO_PAGE_BASES,
        PAGE_WALK=walk,
        REST_BLOCK=rest_block,
        REST_GROUP=rest_group,
        WIDE_OFFSETS=wide,
        GRANULE_EDGES=granule,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else None,
        K_CHUNK=k_chunk,
        RETURN_LSE=lse is not None,
        PREFETCH_IDS=_TILE_PAGES
        and _PREFETCH_IDS
        and (block_d <= _PREFETCH_IDS_MAX_BLOCK_D or kc.page_size < config.BLOCK_N_CTX),
        KV_SAME_STRIDES=_KV_SAME_STRIDES and kc_strides[:2] == vc_strides[:2],
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        **ptxas_launch_options(
            _PTXAS_REGISTER_USAGE_LEVEL if arch in _PTXAS_REGISTER_USAGE_ARCHS else 0,
            q.device,
        ),
    )


# --------------------------------------------------------------------------- public API
_VLLM_NAMES = {
    "o": "o",
    "block_table": "b_loc",
    "cu_seqlens_q": "b_start_loc",
    "seq_lens": "b_seq_len",
    "max_query_len": "max_input_len",
}
_PY_NAMES = {
    "o": "out",
    "block_table": "block_table",
    "cu_seqlens_q": "cu_seqlens_q",
    "seq_lens": "seq_lens",
    "max_query_len": "max_query_len",
}


def _check_window(window: object) -> tuple[int, int]:
    if (
        not isinstance(window, (tuple, list))
        or len(window) != 2
        or not all(isinstance(w, int) and not isinstance(w, bool) for w in window)
    ):
        raise TypeError(f"window must be a pair of ints (left, right), got {window!r}")
    left, right = int(window[0]), int(window[1])
    if left < -1 or right < -1:
        raise ValueError(f"window entries must be >= -1 (-1 = unbounded), got {window!r}")
    return left, right


def _check_softcap(softcap: object) -> float:
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise TypeError(f"softcap must be a float (0 = off), got {type(softcap).__name__}")
    if not math.isfinite(float(softcap)) or float(softcap) < 0:
        raise ValueError(f"softcap must be a finite float >= 0 (0 = off), got {softcap}")
    return float(softcap)


def _check_softmax_scale(s: object, name: str) -> float | None:
    if s is None:
        return None
    if isinstance(s, bool) or not isinstance(s, (int, float)):
        raise TypeError(f"{name} must be a float or None, got {type(s).__name__}")
    if not math.isfinite(float(s)):
        raise ValueError(f"{name} must be finite, got {s}")
    return float(s)


def context_attention_fwd(
    q: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    o: torch.Tensor,
    kv_cache_dtype: str,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    b_loc: torch.Tensor,
    b_start_loc: torch.Tensor,
    b_seq_len: torch.Tensor,
    max_seq_len: int | None,
    max_input_len: int,
    k_scale: Scale,
    v_scale: Scale,
    alibi_slopes: torch.Tensor | None = None,
    sliding_window: int | None = None,
    sm_scale: float | None = None,
    skip_decode: bool = False,
    fp8_out_scale: Scale = None,
    sinks: torch.Tensor | None = None,
    causal: bool = True,
    *,
    validate: bool = False,
) -> None:
    """Prefix prefill attention, drop-in for vLLM 0.33's ``context_attention_fwd`` (writes ``o``).

    Each sequence ``b`` has ``ctx_len = b_seq_len[b] - query_len`` cached tokens (positions
    ``[0, ctx_len)``) and ``query_len = b_start_loc[b + 1] - b_start_loc[b]`` new tokens at positions
    ``[ctx_len, b_seq_len[b])``; query ``i`` sits at position ``ctx_len + i`` and attends to the
    context and (causally, unless ``causal=False``) to the new tokens.

    Args:
        q: ``[total_q, H, D]`` fp16/bf16/fp32, the new tokens' queries (rows of sequence ``b`` are
            ``b_start_loc[b]:b_start_loc[b + 1]``); any token/head strides, unit feature stride.
            ``D <= 256`` (any value; padded to a power of two inside the kernel).
        k, v: ``[total_q, Hkv, D]`` in ``q``'s dtype, the new tokens' keys/values, or both ``None``:
            then they are read from the cache at positions ``[ctx_len, b_seq_len[b])``.
            ``H % Hkv == 0`` (GQA/MQA: query head ``h`` reads kv head ``h // (H // Hkv)``).
        o: ``[total_q, H, D]`` output, ``q``'s dtype (an fp8 dtype with ``fp8_out_scale``). Rows of
            sequences skipped by ``skip_decode`` are left untouched.
        kv_cache_dtype: ``"auto"`` (cache in ``q``'s dtype, or an fp8 dtype), ``"fp8"`` /
            ``"fp8_e4m3"`` (the platform's e4m3) or ``"fp8_e5m2"``: uint8/fp8 caches are viewed as
            that type and dequantised as ``value * k_scale`` / ``value * v_scale``.
        k_cache: ``[num_blocks, Hkv, D // x, page_size, x]`` (vLLM layout), any strides with a unit
            last stride; ``page_size`` any integer >= 1 (544, 1056 ... run like powers of two).
        v_cache: ``[num_blocks, Hkv, D, page_size]``.
        b_loc: ``[batch, max_pages]`` int32/int64 block table; token ``t`` of sequence ``b`` lives in
            block ``b_loc[b, t // page_size]``, slot ``t % page_size``. Only the pages a sequence
            reads are ever loaded (entries past them may hold anything).
        b_start_loc: ``[batch + 1]`` int32/int64 cumulative query lengths (``cu_seqlens_q``).
        b_seq_len: ``[batch]`` int32/int64 context + query length of each sequence.
        max_seq_len: unused (kept for signature compatibility).
        max_input_len: Python int >= the longest query length: sizes the grid only.
        k_scale, v_scale: per-tensor fp8 dequantisation scales (1-element tensors or floats),
            finite and > 0 (the kernel folds them into the logit scale); ignored unless the cache
            is fp8.
        alibi_slopes: ``[H]`` float: adds ``-slope[h] * |p - j|`` to every logit.
        sliding_window: ``W > 0``: a query at ``p`` sees keys ``j`` with ``p - j < W``; None/<= 0: off.
        sm_scale: logit scale, default ``1 / sqrt(D)``.
        skip_decode: skip sequences whose query length is 1.
        fp8_out_scale: with an fp8 ``o``: ``o = clamp(out / fp8_out_scale)`` to the fp8 range.
        sinks: ``[H]`` float (fp32): one extra logit ``sinks[h]`` in each row's softmax denominator.
        causal: False makes the new tokens attend to each other bidirectionally.
        validate: also run the checks that read device values (one host sync); also enabled by
            the environment variable ``PREFILL_VALIDATE=1``.
    """
    if not isinstance(kv_cache_dtype, str) or kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}")
    q = _is_tensor(q, "q")
    k_cache = _is_tensor(k_cache, "k_cache")
    v_cache = _is_tensor(v_cache, "v_cache")
    if kv_cache_dtype == "auto":
        for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
            if t.dtype == torch.uint8:
                raise ValueError(
                    f"kv_cache_dtype='auto' cannot interpret the uint8 {name}; pass kv_cache_dtype="
                    f"'fp8', 'fp8_e4m3' or 'fp8_e5m2'"
                )
    else:
        target = torch.float8_e5m2 if kv_cache_dtype == "fp8_e5m2" else _e4m3_dtype(q.device)
        for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
            if t.dtype != torch.uint8 and t.dtype != target:
                raise TypeError(
                    f"{name} must be uint8 or {target} for kv_cache_dtype={kv_cache_dtype!r}, "
                    f"got {t.dtype} (its bits would be misread as {target})"
                )
        k_cache = k_cache.view(target)
        v_cache = v_cache.view(target)
    if sliding_window is not None and (
        isinstance(sliding_window, bool) or not isinstance(sliding_window, int)
    ):
        raise TypeError(f"sliding_window must be an int or None, got {type(sliding_window).__name__}")
    window = (sliding_window - 1, -1) if sliding_window is not None and sliding_window > 0 else (-1, -1)
    scale = _check_softmax_scale(sm_scale, "sm_scale")
    kc, _ = _check_inputs(
        q, k, v, o, k_cache, v_cache, "split", b_loc, b_start_loc, b_seq_len, max_input_len,
        names=_VLLM_NAMES, out_fp8=fp8_out_scale is not None,
    )  # fmt: skip
    num_heads = q.shape[1]
    alibi_slopes = _check_per_head(alibi_slopes, "alibi_slopes", num_heads, q.device)
    sinks = _check_per_head(sinks, "sinks", num_heads, q.device)
    cache_fp8 = k_cache.dtype in _FP8_DTYPES
    ks = _scale_tensor(k_scale, "k_scale", q.device) if cache_fp8 else None
    vs = _scale_tensor(v_scale, "v_scale", q.device) if cache_fp8 else None
    os_ = _scale_tensor(fp8_out_scale, "fp8_out_scale", q.device)
    if _validate_enabled(validate):
        _check_device_values(
            q, k is None, kc, b_loc, b_start_loc, b_seq_len, max_input_len, skip_decode, _VLLM_NAMES
        )
    torch.ops.prefix_prefill.fwd(
        q, k, v, o, k_cache, v_cache, ops.layout_code(kc.layout), b_loc, b_start_loc, b_seq_len,
        max_input_len, bool(causal), window[0], window[1], scale, alibi_slopes, sinks, ks, vs, os_,
        bool(skip_decode),
    )  # fmt: skip


def prefix_prefill(
    q: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    max_query_len: int,
    *,
    causal: bool = True,
    window: tuple[int, int] = (-1, -1),
    softmax_scale: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    k_scale: Scale = None,
    v_scale: Scale = None,
    kv_layout: str | None = None,
    softcap: float = 0.0,
    out: torch.Tensor | None = None,
    return_lse: bool = False,
    lse: torch.Tensor | None = None,
    validate: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Prefix prefill attention over a paged KV cache; returns ``out`` ``[total_q, H, D]`` (and the
    softmax log-sum-exp with ``return_lse=True``).

    Same semantics as :func:`context_attention_fwd` (see it for ``q``, ``k``, ``v``, the block
    table, ALiBi and sinks) with these differences:

    * ``k_cache``/``v_cache`` in any layout of :mod:`paged_kv_offsets`: ``"split"`` (vLLM, K
      ``[num_blocks, Hkv, D // x, page, x]``, V ``[num_blocks, Hkv, D, page]``), ``"nhd"``
      (``[num_blocks, page, Hkv, D]``) or ``"hnd"`` (``[num_blocks, Hkv, page, D]``); ``kv_layout``
      None infers ``"split"`` for a 5-D K cache, else ``"nhd"`` (pass ``"hnd"`` explicitly). A
      cache in ``q``'s dtype or fp8 (uint8 is read as the platform's e4m3), dequantised with
      ``k_scale``/``v_scale`` (default 1).
    * ``block_table`` ``[batch, max_pages]``, ``cu_seqlens_q`` ``[batch + 1]``, ``seq_lens``
      ``[batch]`` (context + query length), ``max_query_len`` (Python int, sizes the grid).
    * ``window = (left, right)``: FlashAttention's inclusive convention, a query at ``p`` sees key
      ``j`` iff ``left < 0 or p - j <= left`` and ``right < 0 or j - p <= right`` (and ``j <= p``
      when ``causal``); vLLM's ``sliding_window=W`` is ``(W - 1, -1)``.
    * ``softcap`` > 0: logit soft-capping (Gemma 2, FlashAttention's ``softcap``): the logit
      ``softmax_scale * q.k`` (times ``k_scale`` for an fp8 cache) becomes ``softcap * tanh(logit /
      softcap)`` before ALiBi is subtracted; sinks are not capped. 0 (default) = off.
    * ``out``: optional output buffer (``q``'s shape and dtype); allocated when None.
    * ``return_lse``: return ``(out, lse)`` (FlashAttention's ``return_softmax_lse``, FlashInfer's
      ``return_lse``: serving engines merge partial attention states, e.g. cascade or split-KV
      attention, with it). ``lse`` is float32 ``[H, total_q]`` (heads first, FlashAttention's varlen
      layout), natural log: ``lse[h, i] = log(sum_j exp(s_ij))`` over the keys (context and new tokens)
      query row ``i`` sees, ``s_ij`` the logit the softmax normalises (after ``softmax_scale``,
      ``k_scale`` for fp8 caches, ``softcap`` and ALiBi); a sink is part of the denominator, so
      ``exp(sinks[h])`` is one more term of the sum. Every query sees at least its own position, so
      every row of a sequence gets a finite value (a row without any visible key would get ``-inf``,
      its ``out`` row 0). Tokens past ``cu_seqlens_q[-1]`` are not written (like ``out``).
    * ``lse``: optional preallocated float32 ``[H, total_q]`` buffer with a unit last stride, written
      in place (only with ``return_lse=True``); allocated when None.
    """
    q = _is_tensor(q, "q")
    k_cache = _is_tensor(k_cache, "k_cache")
    v_cache = _is_tensor(v_cache, "v_cache")
    if kv_layout is None:
        kv_layout = "split" if k_cache.dim() == 5 else "nhd"
    elif not isinstance(kv_layout, str) or kv_layout not in ("split", "nhd", "hnd"):
        raise ValueError(f"kv_layout must be 'split', 'nhd', 'hnd' or None, got {kv_layout!r}")
    if k_cache.dtype == torch.uint8 or v_cache.dtype == torch.uint8:
        if k_cache.dtype != v_cache.dtype:
            raise TypeError(
                f"k_cache and v_cache must share a dtype, got {k_cache.dtype} and {v_cache.dtype}"
            )
        target = _e4m3_dtype(q.device)
        k_cache, v_cache = k_cache.view(target), v_cache.view(target)
    window = _check_window(window)
    scale = _check_softmax_scale(softmax_scale, "softmax_scale")
    cap = _check_softcap(softcap)
    if out is None:
        if q.dim() != 3:
            raise ValueError(f"q must be 3-D [total_q, num_heads, head_size], got shape {tuple(q.shape)}")
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    kc, _ = _check_inputs(
        q, k, v, out, k_cache, v_cache, kv_layout, block_table, cu_seqlens_q, seq_lens, max_query_len,
        names=_PY_NAMES, out_fp8=False,
    )  # fmt: skip
    lse = check_lse(return_lse, lse, q, "total_q")
    num_heads = q.shape[1]
    alibi_slopes = _check_per_head(alibi_slopes, "alibi_slopes", num_heads, q.device)
    sinks = _check_per_head(sinks, "sinks", num_heads, q.device)
    cache_fp8 = k_cache.dtype in _FP8_DTYPES
    ks = _scale_tensor(k_scale, "k_scale", q.device) if cache_fp8 else None
    vs = _scale_tensor(v_scale, "v_scale", q.device) if cache_fp8 else None
    if _validate_enabled(validate):
        _check_device_values(
            q, k is None, kc, block_table, cu_seqlens_q, seq_lens, max_query_len, False, _PY_NAMES
        )
    torch.ops.prefix_prefill.fwd(
        q, k, v, out, k_cache, v_cache, ops.layout_code(kc.layout), block_table, cu_seqlens_q,
        seq_lens, max_query_len, bool(causal), window[0], window[1], scale, alibi_slopes, sinks, ks,
        vs, None, False, cap, lse,
    )  # fmt: skip
    if return_lse:
        return out, lse
    return out
