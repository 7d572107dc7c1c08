"""Host side of the two Gluon kernels (:mod:`prefix_prefill.gluon_kernel`): TMA descriptors, the
split kernel's copies of the new tokens, compile tiers, the fallback when a Gluon kernel cannot run.

:func:`launch` runs a plan of kernel ``"gluon-nhd"`` or ``"gluon-split"`` (see
:mod:`prefix_prefill.plan` for when they apply); it returns False when the kernel failed to build or
launch (another Triton's Gluon): from then on :func:`available` is False and the Triton kernel runs.

Compile tiers: the first call of a (kernel, constexprs, dtype) runs the kernel's quick-compiling form
(both consumer warpgroups as one 8-warp partition, LLVM at O0: it compiles the consumer once) while a
daemon thread compiles the full form (two warpgroups ping-ponging over the tensor cores); calls after
that compile finished run the full form. The two compute the same output bit for bit. Inside a CUDA
graph capture a full form never launched before is not loaded: call :func:`finish_compiles` before
capturing. ``PREFIX_PREFILL_GLUON_TIERED=0``: the full form from the first call.
"""

from __future__ import annotations

import os

import torch

import prefill_runtime as runtime
from paged_kv_offsets import CacheView
from prefill_runtime import LaunchPlan
from prefix_prefill.kernel import LOG2E

try:  # Gluon (triton >= 3.5) with its Hopper module; without it the Triton kernel runs everywhere
    from prefix_prefill.gluon_kernel import _gluon_fwd_kernel, _gluon_split_kernel
except Exception:  # pragma: no cover - any import failure means "no Gluon"
    _gluon_fwd_kernel = _gluon_split_kernel = None

# Set when a Gluon kernel failed to build or launch once (another Triton's Gluon): Triton from then on.
_FAILED = False
_TIERS = runtime.CompileTiers()
# elements: each sequence's new-token K/V starts 128-byte aligned in the split kernel's copies of them
_V_COL_ALIGN = 64


def available() -> bool:
    """Both Gluon kernels imported, this Triton supported for them (``prefill_runtime``'s allowlist, if it
    has one) and none failed in this process."""
    if _gluon_fwd_kernel is None or _gluon_split_kernel is None or _FAILED:
        return False
    supported = getattr(runtime, "gluon_supported", None)
    return supported is None or supported()[0]


def install_hooks() -> None:
    """The Gluon kernels' compile hooks (:func:`prefill_runtime.hook_compiles`): their launchers built
    beside a cold compile (every descriptor argument is a TMA descriptor), LLVM at O0 where ``LLVM_O0``
    (the quick form), the consumers' free waits where ``FREE_WAITS``, and for the split kernel the
    no-swizzle descriptor fix where ``K_CM`` (the chunk-major K ring)."""
    for kernel in (_gluon_fwd_kernel, _gluon_split_kernel):
        if kernel is not None:
            runtime.hook_compiles(
                kernel,
                tma_descriptors=True,
                llvm_o0_flag="LLVM_O0",
                free_waits_flag="FREE_WAITS",
                desc_fix_flag="K_CM" if kernel is _gluon_split_kernel else None,
            )


def finish_compiles(timeout: float | None = None) -> bool:
    """Wait (at most ``timeout`` seconds) for the Gluon kernels' full forms compiling in the background
    (module docstring). Call it before capturing CUDA graphs, or before timing. True when none is left."""
    return _TIERS.finish(timeout)


def _tiered() -> bool:
    return os.environ.get("PREFIX_PREFILL_GLUON_TIERED", "1") != "0"


def _run_tiers(key: tuple, launch) -> None:
    """Launch a Gluon kernel in its full form, or per the compile tiers (module docstring)."""
    if not _tiered():
        launch(True, False)
    else:
        _TIERS.run(key, launch)


def launch(plan: LaunchPlan, q, k, v, o, k_cache, v_cache, kc, vc, block_table, cu_seqlens_q, seq_lens,
           max_query_len, scale, lse) -> bool:  # fmt: skip
    """Run ``plan``'s Gluon kernel; False when it failed to build or launch (then :func:`available`
    answers False for the rest of the process)."""
    global _FAILED
    fn = _launch_nhd if plan.kernel == "gluon-nhd" else _launch_split
    run = fn(plan, q, k, v, o, k_cache, v_cache, kc, vc, block_table, cu_seqlens_q, seq_lens, max_query_len,
             scale, lse)  # fmt: skip
    if runtime.gluon_try_launch(run, "prefix_prefill"):
        return True
    _FAILED = True
    return False


def _cache_rows(cache: torch.Tensor, cv: CacheView, rows: int):
    """A TMA descriptor over an NHD cache seen as [num_blocks * page_size, kv_heads * head_size] (the plan
    checked that pages are contiguous with 16-byte rows), block [rows, head_size]."""
    d, hk, page = cv.head_size, cv.num_kv_heads, cv.page_size
    return runtime.gluon_descriptor(cache, [cv.num_blocks * page, hk * d], cv.stride_slot, rows, d)


def _launch_nhd(plan, q, k, v, o, k_cache, v_cache, kc, vc, block_table, cu_seqlens_q, seq_lens,
                max_query_len, scale, lse):  # fmt: skip
    """The NHD kernel's launch as a thunk (descriptors made here)."""
    consts = plan.consts()
    block_m, block_n, box = consts["BLOCK_M"], consts["BLOCK_N"], consts["BOX"]
    kcb, vcb = _cache_rows(k_cache, kc, block_n), _cache_rows(v_cache, vc, block_n)
    q_desc = runtime.gluon_token_rows(q, block_m // 2)
    kc_desc, vc_desc = _cache_rows(k_cache, kc, box), _cache_rows(v_cache, vc, box)
    if k is None:  # the new tokens' K/V come from the cache: K_desc/V_desc only give the rings' layout
        k_desc, v_desc = kcb, vcb
    else:
        k_desc, v_desc = runtime.gluon_token_rows(k, block_n), runtime.gluon_token_rows(v, block_n)
    grid = (-(-max_query_len // block_m), q.shape[1], seq_lens.shape[0])

    def one(full: bool, warmup: bool) -> None:
        # the full form: two consumer warpgroups; the quick one: one 8-warp consumer partition, Q in one box
        q_arg = q_desc if full else runtime.gluon_token_rows(q, block_m)
        args = (q_arg, k_desc, v_desc, kc_desc, vc_desc, kcb, vcb, o, block_table, cu_seqlens_q, seq_lens,
                scale * LOG2E, q.shape[1] // kc.num_kv_heads, o.stride(0), o.stride(1), block_table.stride(0),
                kc.page_size, kc.num_blocks * kc.page_size, lse,
                lse.stride(0) if lse is not None else None)  # fmt: skip
        kw = dict(consts, ONE_CONSUMER=not full, FREE_WAITS=True, LLVM_O0=not full and _tiered(),
                  num_warps=4 if full else 8)  # fmt: skip
        if warmup:  # (a background thread: its CUDA device is not the caller's)
            with torch.cuda.device(q.device):
                _gluon_fwd_kernel.warmup(*args, grid=grid, **kw)
        else:
            _gluon_fwd_kernel[grid](*args, **kw)

    return lambda: _run_tiers(("nhd", q.dtype, *plan.constexprs), one)


# --------------------------------------------------------------------------- vLLM's split layout
def _new_token_columns(cu_seqlens_q: torch.Tensor, tokens: int, device) -> tuple:
    """``(dst, col0, width)`` of the split kernel's per-call copies of the new tokens: token ``t``'s
    column ``dst[t]`` (int64 ``[tokens]``), each sequence from column ``col0[s]`` (int32 ``[batch]``, a
    multiple of ``_V_COL_ALIGN``: a TMA box whose inner start is not 16-byte aligned faults), ``width``
    columns (a multiple of 8). Device ops only (no host sync)."""
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
    for the split kernel's TMA copies, columns as :func:`_new_token_columns` (``col0`` is returned). The
    columns between sequences are left unwritten (the kernel zeroes V past a sequence's keys)."""
    tokens, hk, d = v.shape
    dst, col0, width = _new_token_columns(cu_seqlens_q, tokens, v.device)
    v_t = v.new_empty(hk, d, width)
    v_t.index_copy_(2, dst, v.permute(1, 2, 0))
    return v_t.view(hk * d, width), col0


def _split_new_k(k: torch.Tensor, cu_seqlens_q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The new tokens' K ``[tokens, kv_heads, D]`` in vLLM's split K layout with one page per KV head,
    ``[kv_heads, D/8, columns, 8]`` seen as ``[kv_heads * D/8, columns * 8]``, for the split kernel's K
    boxes; columns as :func:`_new_token_columns` (``col0`` is returned). The columns between sequences
    are left unwritten (their keys are masked, never multiplied)."""
    tokens, hk, d = k.shape
    dst, col0, width = _new_token_columns(cu_seqlens_q, tokens, k.device)
    k_t = k.new_empty(hk, d // 8, width, 8)
    k_t.index_copy_(2, dst, k.view(tokens, hk, d // 8, 8).permute(1, 2, 0, 3))
    return k_t.view(hk * (d // 8), width * 8), col0


def _k_view(block_n: int, head: int, cm: bool):
    """How the split kernel's consumers read a K slot filled by TMA: ``[block_n, head]`` (``cm``: the
    chunk-major ring, one view of all features) or ``[block_n, 64]`` (one view per 64 features), stored as
    ``block_n / 8`` chunks of ``[feature groups, 8 keys, 8 features]`` dense, i.e. element offset ``d % 8
    + (n % 8) * 8 + (d // 8) * 64 + (n // 8) * cols * 8``: wgmma's no-swizzle K-major core matrices
    (leading byte offset 128, stride byte offset ``cols * 16``). A view whose stride byte offset is not
    1024 reads right only with its PTX's no-swizzle descriptor base offsets cleared (the compile hook's
    ``desc_fix_flag``)."""
    from triton.experimental.gluon import language as gl

    cols = head if cm else 64
    bits = [[0, 1], [0, 2], [0, 4], [1, 0], [2, 0], [4, 0]]  # d % 8, n % 8
    bits += [[0, 8 << i] for i in range((cols // 8).bit_length() - 1)]  # d // 8
    bits += [[8 << i, 0] for i in range((block_n // 8).bit_length() - 1)]  # n // 8
    return gl.SharedLinearLayout(offset_bases=bits)


def _k_wide_descriptor(k_cache: torch.Tensor, rows: int, page: int, block_n: int, groups: int):
    """vLLM's contiguous split K cache (``rows`` = num_blocks * kv_heads * D/8 feature groups of ``page * 8``
    elements) seen as ``[page / 8, rows, 64]`` with strides ``[64, page * 8, 1]`` (a page's key groups of 8,
    the feature groups, one group's 8 keys x 8 features), block ``[block_n / 8, groups, 64]`` in the
    no-swizzle layout: a box lands as ``block_n / 8`` dense chunks, the K ring's layout (:func:`_k_view`).
    The strides are not in decreasing order (TMA asks only that they be multiples of 16 bytes); the box
    stays inside its page (the kernel uses it only for blocks that do). ``groups``: feature groups a box
    spans (8: 64 features, one part of the part-major ring; D / 8: every feature, the chunk-major one)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=k_cache.element_size() * 8, rank=3)
    return TensorDescriptor(
        k_cache, [page // 8, rows, 64], [64, page * 8, 1], [block_n // 8, groups, 64], layout
    )


def _launch_split(plan, q, k, v, o, k_cache, v_cache, kc, vc, block_table, cu_seqlens_q, seq_lens,
                  max_query_len, scale, lse):  # fmt: skip
    """The split kernel's launch as a thunk (descriptors and the new tokens' copies made here)."""
    consts = plan.consts()
    head, hk, page = q.shape[2], kc.num_kv_heads, kc.page_size
    block_m, block_n = consts["BLOCK_M"], consts["BLOCK_N"]
    k_tma, v_tma, k_wide, k_cm = consts["K_TMA"], consts["V_TMA"], consts["K_WIDE"], consts["K_CM"]
    g = head // 8
    strides = (kc.stride_block, kc.stride_head, kc.stride_dim, vc.stride_block, vc.stride_head, vc.stride_dim)
    v_cols = 16 if v_tma else block_n  # V_desc's block: [D, 16] boxes (32-byte swizzle) or [D, BLOCK_N]
    v_cache_arg = v_cache
    if v_tma:  # the V cache as [num_blocks * kv_heads * D, page_size], one box per 16-key run
        v_cache_arg = runtime.gluon_descriptor(v_cache, [vc.num_blocks * hk * head, page], page, head, 16)
    q_desc = runtime.gluon_token_rows(q, block_m // 2)
    # with k = None, K_desc/V_desc only give the rings' layouts
    k_desc = runtime.gluon_token_rows(q[:, :1] if k is None else k, block_n)
    v_col0 = cu_seqlens_q  # (with k given: each sequence's first column in the transposed V)
    if k is None:
        v_desc = runtime.gluon_descriptor(q.new_empty(head, v_cols), [head, v_cols], v_cols, head, v_cols)
    else:
        v_t, v_col0 = _transposed_new_v(v, cu_seqlens_q)
        v_desc = runtime.gluon_descriptor(v_t, list(v_t.shape), v_t.shape[1], head, v_cols)
    k_cache_arg, k_view, kw_desc, kr_desc = k_cache, None, None, None
    if k_tma:  # D/64 (or one, chunk-major) boxes a block inside a page, 16-key runs elsewhere
        groups = g if k_cm else 8  # feature groups a box spans
        kr_desc = _k_wide_descriptor(k_cache, kc.num_blocks * hk * g, page, 16, groups)
        if k_wide == 1:
            kw_desc = _k_wide_descriptor(k_cache, kc.num_blocks * hk * g, page, block_n, groups)
        # the K cache as [num_blocks * kv_heads * D/8, page_size * 8] (the ring's 64-wide rows)
        k_cache_arg = runtime.gluon_descriptor(k_cache, [kc.num_blocks * hk * g, page * 8], page * 8, 8, 64,
                                               swizzle=False)  # fmt: skip
        k_view = _k_view(block_n, head, k_cm)
        if k is None:
            k_desc = k_cache_arg  # (the ring's layout; the kernel reads no new tokens)
        else:
            k_t, _ = _split_new_k(k, cu_seqlens_q)  # the same columns as v_t's
            k_desc = runtime.gluon_descriptor(k_t, list(k_t.shape), k_t.shape[1], 8, 64, swizzle=False)
    grid = (-(-max_query_len // block_m), q.shape[1], seq_lens.shape[0])

    def one(full: bool, warmup: bool) -> None:
        # the full form: two consumer warpgroups; the quick one: one 8-warp consumer partition, Q in one box
        q_arg = q_desc if full else runtime.gluon_token_rows(q, block_m)
        args = (q_arg, k_desc, v_desc, k_cache_arg, v_cache_arg, o, block_table, cu_seqlens_q, v_col0,
                seq_lens, scale * LOG2E, q.shape[1] // hk, o.stride(0), o.stride(1), block_table.stride(0),
                page, *strides, lse, lse.stride(0) if lse is not None else None)  # fmt: skip
        kw = dict(consts, K_VIEW=k_view, KW_desc=kw_desc, KR_desc=kr_desc, ONE_CONSUMER=not full,
                  FREE_WAITS=True, LLVM_O0=not full and _tiered(), num_warps=4 if full else 8)  # fmt: skip
        if warmup:  # (a background thread: its CUDA device is not the caller's)
            with torch.cuda.device(q.device):
                _gluon_split_kernel.warmup(*args, grid=grid, **kw)
        else:
            _gluon_split_kernel[grid](*args, **kw)

    key = ("split", q.dtype, kw_desc is None, kr_desc is None, *plan.constexprs)
    return lambda: _run_tiers(key, one)
