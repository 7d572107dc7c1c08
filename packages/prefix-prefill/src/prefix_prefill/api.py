"""Public functions: :func:`prefix_prefill`, :func:`context_attention_fwd` (vLLM 0.33 drop-in) and
:func:`explain` (which kernel a call runs, and why).

Both launching functions check their arguments on the host (:mod:`prefix_prefill.checks`: shapes,
dtypes, devices, strides; no device reads), translate to one convention and launch
(:func:`prefix_prefill.launch.forward`): directly in eager mode, else through the custom op
``torch.ops.prefix_prefill.fwd`` (:mod:`prefix_prefill.ops`), one opaque operator for Dynamo. The
default path never synchronises with the device (CUDA-graph capturable); checks that read device
values run only with ``validate=True`` or the environment variable ``PREFILL_VALIDATE=1``.
"""

from __future__ import annotations

import torch

from prefill_runtime import LaunchPlan, check_lse
from prefill_runtime.checks import validate_requested
from prefill_runtime.fp8 import scale_of
from prefill_runtime.signatures import bump_versions
from prefill_runtime.status import check_status
from prefill_runtime.vllm_plugin import ENV_VAR as _PLUGIN_ENV
from prefix_prefill import checks, launch, ops, signatures
from prefix_prefill.checks import FP8_DTYPES, KV_CACHE_DTYPES, Scale

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

__all__ = ["KV_CACHE_DTYPES", "context_attention_fwd", "explain", "prefix_prefill"]


def _run(
    q,
    k,
    v,
    o,
    k_cache,
    v_cache,
    kc,
    vc,
    block_table,
    cu_seqlens_q,
    seq_lens,
    max_query_len,
    causal,
    left,
    right,
    scale,
    alibi,
    sinks,
    ks,
    vs,
    os_,
    skip_decode,
    softcap,
    lse,
    key=None,
    status=None,
) -> None:
    """Launch on checked arguments: directly where
    :func:`prefill_runtime.compiled_launch.launch_directly` (remembering the call's signature
    ``key``), else through the custom op (torch.compile, a dispatch mode)."""
    if not ops.direct():
        torch.ops.prefix_prefill.fwd(
            q,
            k,
            v,
            o,
            k_cache,
            v_cache,
            ops.layout_code(kc.layout),
            block_table,
            cu_seqlens_q,
            seq_lens,
            max_query_len,
            causal,
            left,
            right,
            scale,
            alibi,
            sinks,
            ks,
            vs,
            os_,
            skip_decode,
            softcap,
            lse,
            status,
        )
        return
    prepared = [] if key is not None else None
    with ops.on_device(q.device):
        launch.forward(
            q,
            k,
            v,
            o,
            k_cache,
            v_cache,
            kc,
            vc,
            block_table,
            cu_seqlens_q,
            seq_lens,
            max_query_len,
            causal=causal,
            window=(left, right),
            softmax_scale=scale,
            alibi_slopes=alibi,
            sinks=sinks,
            k_scale=ks,
            v_scale=vs,
            out_scale=os_,
            skip_decode=skip_decode,
            softcap=softcap,
            lse=lse,
            status=status,
            prepared=prepared,
        )
    bump_versions(o, lse, status)
    if prepared:
        signatures.SEEN.remember(key, prepared[0])


def _vllm_caches(kv_cache_dtype: object, q: torch.Tensor, k_cache, v_cache):
    """The caches as the kernel reads them for vLLM's ``kv_cache_dtype`` (uint8 viewed as the fp8 type)."""
    if not isinstance(kv_cache_dtype, str) or kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}")
    k_cache = checks.is_tensor(k_cache, "k_cache")
    v_cache = checks.is_tensor(v_cache, "v_cache")
    if kv_cache_dtype == "auto":
        for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
            if t.dtype == torch.uint8:
                raise ValueError(
                    f"kv_cache_dtype='auto' cannot interpret the uint8 {name}; pass kv_cache_dtype="
                    f"'fp8', 'fp8_e4m3' or 'fp8_e5m2'"
                )
        return k_cache, v_cache
    target = torch.float8_e5m2 if kv_cache_dtype == "fp8_e5m2" else checks.e4m3_dtype(q.device)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != torch.uint8 and t.dtype != target:
            raise TypeError(
                f"{name} must be uint8 or {target} for kv_cache_dtype={kv_cache_dtype!r}, "
                f"got {t.dtype} (its bits would be misread as {target})"
            )
    return k_cache.view(target), v_cache.view(target)


def _block_ids(b_loc: object, k_cache: object) -> torch.Tensor:
    """The block ids of a table of block addresses (``is_block_table_ptr=True``), computed as vLLM does:
    ``(address - k_cache.data_ptr()) // (k_cache.stride(0) * k_cache.element_size())`` where the entry is
    > 0, the entry itself elsewhere (0 pads a row)."""
    b_loc = checks.is_tensor(b_loc, "b_loc")
    k_cache = checks.is_tensor(k_cache, "k_cache")
    if b_loc.dtype != torch.int64:
        raise TypeError(
            f"b_loc must be int64 (block addresses) with is_block_table_ptr=True, got {b_loc.dtype}"
        )
    if k_cache.dim() < 1 or k_cache.stride(0) < 1:
        raise ValueError(
            f"k_cache must have a block dimension with a positive stride, got shape {tuple(k_cache.shape)}"
        )
    base, block_bytes = k_cache.data_ptr(), k_cache.stride(0) * k_cache.element_size()
    return torch.where(b_loc > 0, torch.div(b_loc - base, block_bytes, rounding_mode="floor"), b_loc)


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
    is_block_table_ptr: bool = False,
    interleaved_v_pack_factor: int = 0,
    causal: bool = True,
    *,
    validate: bool = False,
    status: torch.Tensor | None = None,
) -> None:
    """Prefix prefill attention, drop-in for vLLM 0.33's ``context_attention_fwd`` (writes ``o``): the
    same parameters in the same positional order with the same defaults, then this package's own
    keyword-only ``validate`` and ``status``.

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
            reads are ever loaded (entries past them may hold anything). With
            ``is_block_table_ptr=True``: int64 byte addresses of the blocks instead (below).
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
        sinks: ``[H]`` float (read as float32): one extra logit ``sinks[h]`` in each row's softmax
            denominator.
        is_block_table_ptr: ``b_loc`` holds each block's address, ``k_cache.data_ptr() + id *
            k_cache.stride(0) * k_cache.element_size()`` (entries <= 0 are taken as block ids), as
            vLLM's: converted to block ids on the device before the launch (a few elementwise torch
            operations, no host sync; they take ``k_cache.data_ptr()`` from the host, so a CUDA graph
            replays them for the captured cache only, as vLLM's does).
        interleaved_v_pack_factor: 0 only. vLLM's interleaved V cache (``> 0``) splits a token's slot
            into ``slot // x`` and ``slot % x`` strides, which the cache layouts of
            :mod:`paged_kv_offsets` (one slot stride) do not describe: ``NotImplementedError``.
        causal: False makes the new tokens attend to each other bidirectionally.
        validate: also run the checks that read device values (one host sync); also enabled by
            the environment variable ``PREFILL_VALIDATE=1``.
        status: optional int32 ``[1]`` device tensor: malformed metadata is reported there, and
            never read or written out of bounds without ``validate``, as with :func:`prefix_prefill`.
    """
    if interleaved_v_pack_factor != 0:
        raise NotImplementedError(
            f"context_attention_fwd: interleaved_v_pack_factor={interleaved_v_pack_factor!r} (vLLM's "
            f"interleaved V cache) is not supported; pass a [num_blocks, num_kv_heads, head_size, page] "
            f"V cache with interleaved_v_pack_factor=0 (under vLLM's plugin: unset {_PLUGIN_ENV} to run "
            f"vLLM's own kernel)"
        )
    if is_block_table_ptr:
        b_loc = _block_ids(b_loc, k_cache)
    fast = isinstance(q, torch.Tensor) and ops.direct() and not validate_requested(validate)
    key = None
    if fast:  # (None: not the types they must be; the full checks say so)
        key = signatures.vllm_key(kv_cache_dtype, q, k, v, o, k_cache, v_cache, b_loc, b_start_loc, b_seq_len,
                                  k_scale, v_scale, alibi_slopes, sliding_window, sm_scale, skip_decode,
                                  fp8_out_scale, sinks, causal, status)  # fmt: skip
        fast = key is not None
    prep = signatures.SEEN.lookup(key) if fast else None
    if prep is not None:
        # (the signature holds the caches' dtypes, which its first call checked against kv_cache_dtype)
        kc_, vc_ = k_cache, v_cache
        if kv_cache_dtype != "auto":
            kc_, vc_ = _vllm_caches(kv_cache_dtype, q, k_cache, v_cache)
        fp8 = kc_.dtype in FP8_DTYPES
        ks = scale_of(k_scale, "k_scale", q.device) if fp8 else None
        vs = scale_of(v_scale, "v_scale", q.device) if fp8 else None
        os_ = None if fp8_out_scale is None else scale_of(fp8_out_scale, "fp8_out_scale", q.device)
        if signatures.repeat(
            prep,
            q,
            k,
            v,
            o,
            kc_,
            vc_,
            b_loc,
            b_start_loc,
            b_seq_len,
            max_input_len,
            alibi_slopes,
            sinks,
            ks,
            vs,
            os_,
            None,
            _VLLM_NAMES,
            status,
        ):
            return
    q = checks.is_tensor(q, "q")
    status = check_status(status, q.device)
    k_cache, v_cache = _vllm_caches(kv_cache_dtype, q, k_cache, v_cache)
    if sliding_window is not None and (
        isinstance(sliding_window, bool) or not isinstance(sliding_window, int)
    ):
        raise TypeError(f"sliding_window must be an int or None, got {type(sliding_window).__name__}")
    left = sliding_window - 1 if sliding_window is not None and sliding_window > 0 else -1
    scale = checks.check_softmax_scale(sm_scale, "sm_scale")
    kc, vc = checks.check_inputs(
        q,
        k,
        v,
        o,
        k_cache,
        v_cache,
        "split",
        b_loc,
        b_start_loc,
        b_seq_len,
        max_input_len,
        names=_VLLM_NAMES,
        out_fp8=fp8_out_scale is not None,
    )
    num_heads = q.shape[1]
    alibi_slopes = checks.check_per_head(alibi_slopes, "alibi_slopes", num_heads, q.device)
    sinks = checks.check_per_head(sinks, "sinks", num_heads, q.device)
    cache_fp8 = k_cache.dtype in FP8_DTYPES
    ks = scale_of(k_scale, "k_scale", q.device) if cache_fp8 else None
    vs = scale_of(v_scale, "v_scale", q.device) if cache_fp8 else None
    os_ = None if fp8_out_scale is None else scale_of(fp8_out_scale, "fp8_out_scale", q.device)
    if validate_requested(validate):
        checks.check_device_values(
            q, k is None, kc, b_loc, b_start_loc, b_seq_len, max_input_len, skip_decode, _VLLM_NAMES
        )
    _run(
        q,
        k,
        v,
        o,
        k_cache,
        v_cache,
        kc,
        vc,
        b_loc,
        b_start_loc,
        b_seq_len,
        max_input_len,
        bool(causal),
        left,
        -1,
        scale,
        alibi_slopes,
        sinks,
        ks,
        vs,
        os_,
        bool(skip_decode),
        0.0,
        None,
        key if fast else None,
        status,
    )


def _py_args(
    q,
    k,
    v,
    k_cache,
    v_cache,
    block_table,
    cu_seqlens_q,
    seq_lens,
    max_query_len,
    causal,
    window,
    softmax_scale,
    alibi_slopes,
    sinks,
    k_scale,
    v_scale,
    kv_layout,
    softcap,
    out,
    return_lse,
    lse,
    fp8_out_scale=None,
):
    """:func:`prefix_prefill`'s arguments checked and in the launcher's convention."""
    q = checks.is_tensor(q, "q")
    k_cache = checks.is_tensor(k_cache, "k_cache")
    v_cache = checks.is_tensor(v_cache, "v_cache")
    if kv_layout is None:
        kv_layout = "split" if k_cache.dim() == 5 else "nhd"
    elif not isinstance(kv_layout, str) or kv_layout not in ("split", "nhd", "hnd"):
        raise ValueError(f"kv_layout must be 'split', 'nhd', 'hnd' or None, got {kv_layout!r}")
    if k_cache.dtype == torch.uint8 or v_cache.dtype == torch.uint8:
        if k_cache.dtype != v_cache.dtype:
            raise TypeError(
                f"k_cache and v_cache must share a dtype, got {k_cache.dtype} and {v_cache.dtype}"
            )
        target = checks.e4m3_dtype(q.device)
        k_cache, v_cache = k_cache.view(target), v_cache.view(target)
    left, right = checks.check_window(window)
    scale = checks.check_softmax_scale(softmax_scale, "softmax_scale")
    cap = checks.check_softcap(softcap)
    if out is None:
        if fp8_out_scale is not None:
            raise ValueError("fp8_out_scale needs out: an fp8 tensor of q's shape for the kernel to write")
        if q.dim() != 3:
            raise ValueError(f"q must be 3-D [total_q, num_heads, head_size], got shape {tuple(q.shape)}")
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    kc, vc = checks.check_inputs(
        q,
        k,
        v,
        out,
        k_cache,
        v_cache,
        kv_layout,
        block_table,
        cu_seqlens_q,
        seq_lens,
        max_query_len,
        names=_PY_NAMES,
        out_fp8=fp8_out_scale is not None,
    )
    lse = check_lse(return_lse, lse, q, "total_q")
    num_heads = q.shape[1]
    alibi_slopes = checks.check_per_head(alibi_slopes, "alibi_slopes", num_heads, q.device)
    sinks = checks.check_per_head(sinks, "sinks", num_heads, q.device)
    cache_fp8 = k_cache.dtype in FP8_DTYPES
    ks = scale_of(k_scale, "k_scale", q.device) if cache_fp8 else None
    vs = scale_of(v_scale, "v_scale", q.device) if cache_fp8 else None
    os_ = None if fp8_out_scale is None else scale_of(fp8_out_scale, "fp8_out_scale", q.device)
    return (
        q,
        k,
        v,
        out,
        k_cache,
        v_cache,
        kc,
        vc,
        block_table,
        cu_seqlens_q,
        seq_lens,
        max_query_len,
        bool(causal),
        left,
        right,
        scale,
        alibi_slopes,
        sinks,
        ks,
        vs,
        os_,
        False,
        cap,
        lse,
    )


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
    fp8_out_scale: Scale = None,
    return_lse: bool = False,
    lse: torch.Tensor | None = None,
    validate: bool = False,
    status: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Prefix prefill attention over a paged KV cache: new query tokens attend to their sequence's
    cached context and (causally) to each other. Returns ``out`` ``[total_q, H, D]``, or ``(out, lse)``
    with ``return_lse=True``.

    Sequence ``b`` has ``query_len = cu_seqlens_q[b + 1] - cu_seqlens_q[b]`` new tokens (rows
    ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` of ``q``/``k``/``v``/``out``) and ``ctx_len = seq_lens[b] -
    query_len`` cached tokens at positions ``[0, ctx_len)``; new token ``i`` sits at position ``ctx_len +
    i``. Query ``i`` sees key position ``j`` iff ``j < ctx_len + (i + 1 if causal else query_len)`` and
    the window holds (below).

    Args:
        q: ``[total_q, H, D]`` float16/bfloat16/float32; any token and head strides, unit feature stride.
            ``D <= 256`` (any value; padded to a power of two inside the kernel).
        k, v: ``[total_q, Hkv, D]`` in ``q``'s dtype (the new tokens' keys and values; strides as ``q``),
            or both ``None``: the new tokens' K/V are then read from the cache at positions ``[ctx_len,
            seq_lens[b])`` (already written there). ``H % Hkv == 0`` (GQA/MQA: query head ``h`` reads kv
            head ``h // (H // Hkv)``).
        k_cache, v_cache: the paged cache in ``q``'s dtype or an fp8 dtype (uint8 is read as the
            platform's e4m3: ``float8_e4m3fnuz`` on MI300, ``float8_e4m3fn`` elsewhere), any strides with
            a unit last stride, in one of the layouts of :mod:`paged_kv_offsets` (``kv_layout``):
            ``"split"`` (vLLM: K ``[num_blocks, Hkv, D // x, page_size, x]``, V ``[num_blocks, Hkv, D,
            page_size]``), ``"nhd"`` (``[num_blocks, page_size, Hkv, D]``, FlashInfer/FlashAttention) or
            ``"hnd"`` (``[num_blocks, Hkv, page_size, D]``). ``page_size`` any integer >= 1: 544 or 1056
            run the tiles and the speed of a power of two.
        block_table: ``[batch, max_pages]`` int32/int64: token ``t`` of sequence ``b`` lives in block
            ``block_table[b, t // page_size]``, slot ``t % page_size``. Only the pages a sequence reads
            are loaded (entries past them may hold anything).
        cu_seqlens_q: ``[batch + 1]`` int32/int64, cumulative query lengths (``cu_seqlens_q[0]`` = 0 in
            the usual case; rows past ``cu_seqlens_q[-1]`` are not written).
        seq_lens: ``[batch]`` int32/int64, context + query length of each sequence.
        max_query_len: Python int >= the longest query length (it sizes the grid; no recompile when it
            changes, except that on sm90 the first call with ``max_query_len <= 64`` compiles a Gluon
            short-query form: the second warpgroup idles, ``plan.idle_second_warpgroup``, or with an even
            number of query heads a KV head and more programs than one wave it takes the next head,
            ``plan.pair_heads``; rows are the same bit for bit in every form).
        causal: False: the new tokens of a sequence also see each other's later positions.
        window: ``(left, right)``, FlashAttention's inclusive convention, ``-1`` = unbounded: a query at
            position ``p`` sees key ``j`` iff ``left < 0 or p - j <= left`` and ``right < 0 or j - p <=
            right``; vLLM's ``sliding_window=W`` is ``(W - 1, -1)``.
        softmax_scale: the logit scale, default ``1 / sqrt(D)``.
        alibi_slopes: ``[H]`` float: adds ``-slope[h] * |p - j|`` to every logit.
        sinks: ``[H]`` float: one extra logit ``sinks[h]`` in each row's softmax denominator.
        k_scale, v_scale: fp8 caches only: per-tensor dequantisation scales (floats or 1-element
            tensors, finite and > 0; default 1): the kernel reads ``value * k_scale`` / ``value *
            v_scale``.
        kv_layout: ``"split"``, ``"nhd"``, ``"hnd"`` or None (``"split"`` for a 5-D K cache, else
            ``"nhd"``; pass ``"hnd"`` explicitly).
        softcap: > 0: logit soft-capping (Gemma 2): the logit ``softmax_scale * q.k`` (times ``k_scale``)
            becomes ``softcap * tanh(logit / softcap)`` before ALiBi; sinks are not capped. 0 = off.
        out: optional output buffer (``q``'s shape and dtype, unit last stride); allocated when None.
            With ``fp8_out_scale``: required, ``q``'s shape in float8_e4m3fn or float8_e5m2
            (float8_e4m3fnuz on MI300).
        fp8_out_scale: the output's fp8 quantisation scale (a float or 1-element tensor, finite and > 0):
            ``out = clamp(attention / fp8_out_scale)`` to the fp8 format's finite range, as vLLM's
            ``context_attention_fwd``; None (default): ``out`` in ``q``'s dtype.
        return_lse: also return the softmax log-sum-exp: float32 ``[H, total_q]`` (heads first,
            FlashAttention's varlen layout), natural log of each row's softmax denominator over the keys
            it sees, after ``softmax_scale``, ``k_scale``, ``softcap`` and ALiBi (a sink is one more
            term, ``exp(sinks[h])``); ``-inf`` for a row that sees no key (its ``out`` row is 0). Engines
            merge partial attention states with it (cascade or split-KV attention).
        lse: optional preallocated float32 ``[H, total_q]`` buffer with a unit last stride, written in
            place (only with ``return_lse=True``).
        validate: also run the checks that read device values (lengths, block-table entries against
            the cache: one host sync); also enabled by the environment variable ``PREFILL_VALIDATE=1``.
            Bad shapes, dtypes, devices and strides always raise ``ValueError``/``TypeError``.
        status: optional int32 ``[1]`` device tensor (:func:`prefill_runtime.status.new_status`): the
            kernel ORs the bits of :mod:`prefill_runtime.status` into it when it meets malformed device
            metadata (``BLOCK_ID`` 1: a block id outside ``[0, num_blocks)``; ``TABLE_WIDTH`` 2: a
            sequence needs more pages than the table has columns; ``ROWS`` 4: ``cu_seqlens_q``
            decreasing, negative or past ``total_q``; ``MAX_LEN`` 8: a query longer than
            ``max_query_len``; ``SEQ_LEN`` 16: ``seq_lens`` shorter than the query), with no host sync
            and nothing written on well-formed calls: read it when convenient, clear it yourself.

    Without ``validate`` no device metadata makes a kernel read or write outside the tensors (rows, pages
    and block ids are clamped) or leave a row of ``[cu_seqlens_q[0], cu_seqlens_q[-1])`` unwritten (rows
    past the grid of a too small ``max_query_len`` are 0): a malformed sequence's rows are wrong but finite.

    On Hopper a warp-specialised Gluon kernel runs where it applies (:func:`explain` says which kernel a
    call runs and why); everything else runs the Triton kernel. CPU tensors run under the Triton
    interpreter (``TRITON_INTERPRET=1`` set before import; bf16 is computed in fp32 there).

    Example::

        import torch
        from prefix_prefill import prefix_prefill

        page, kv_heads, d = 16, 2, 128
        k_cache = torch.randn(8, page, kv_heads, d, device="cuda", dtype=torch.bfloat16)  # NHD
        v_cache = torch.randn_like(k_cache)
        block_table = torch.tensor([[3, 1, 4, 0]], dtype=torch.int32, device="cuda")  # 4 pages
        cu_seqlens_q = torch.tensor([0, 20], dtype=torch.int32, device="cuda")  # 20 new tokens
        seq_lens = torch.tensor([50], dtype=torch.int32, device="cuda")  # on a 30-token context
        q = torch.randn(20, 8, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(20, kv_heads, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        out = prefix_prefill(q, k, v, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, 20)
    """
    fast = isinstance(q, torch.Tensor) and ops.direct() and not validate_requested(validate)
    key = None
    if fast:  # (None: not the types they must be; the full checks say so)
        key = signatures.py_key(q, k, v, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, causal,
                                window, softmax_scale, alibi_slopes, sinks, k_scale, v_scale, kv_layout,
                                softcap, out, return_lse, lse, status, fp8_out_scale)  # fmt: skip
        fast = key is not None
    prep = signatures.SEEN.lookup(key) if fast else None
    if prep is not None:
        kc_, vc_ = k_cache, v_cache
        if kc_.dtype == torch.uint8:
            target = checks.e4m3_dtype(q.device)
            kc_, vc_ = kc_.view(target), vc_.view(target)
        fp8 = kc_.dtype in FP8_DTYPES
        ks = scale_of(k_scale, "k_scale", q.device) if fp8 else None
        vs = scale_of(v_scale, "v_scale", q.device) if fp8 else None
        os_ = None if fp8_out_scale is None else scale_of(fp8_out_scale, "fp8_out_scale", q.device)
        o = out if out is not None else torch.empty(q.shape, dtype=q.dtype, device=q.device)
        buf = None
        if return_lse is True:
            buf = (
                lse
                if lse is not None
                else torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device)
            )
        if signatures.repeat(
            prep,
            q,
            k,
            v,
            o,
            kc_,
            vc_,
            block_table,
            cu_seqlens_q,
            seq_lens,
            max_query_len,
            alibi_slopes,
            sinks,
            ks,
            vs,
            os_,
            buf,
            _PY_NAMES,
            status,
        ):
            return (o, buf) if return_lse else o
    args = _py_args(
        q,
        k,
        v,
        k_cache,
        v_cache,
        block_table,
        cu_seqlens_q,
        seq_lens,
        max_query_len,
        causal,
        window,
        softmax_scale,
        alibi_slopes,
        sinks,
        k_scale,
        v_scale,
        kv_layout,
        softcap,
        out,
        return_lse,
        lse,
        fp8_out_scale,
    )
    q, k, v, out, k_cache, v_cache, kc = args[:7]
    status = check_status(status, q.device)
    if validate_requested(validate):
        checks.check_device_values(
            q, k is None, kc, block_table, cu_seqlens_q, seq_lens, max_query_len, False, _PY_NAMES
        )
    _run(*args, key if fast else None, status)
    if return_lse:
        return out, args[-1]
    return out


def explain(
    q: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    max_query_len: int,
    **kwargs: object,
) -> LaunchPlan:
    """The launch plan :func:`prefix_prefill` makes for these arguments (same signature; nothing is
    launched): ``.kernel`` (``"gluon-nhd"``, ``"gluon-hnd"``, ``"gluon-split"`` or ``"triton"``),
    ``.reason`` (the rule that chose it, or why a Gluon kernel did not apply), the tiles and the
    constexprs."""
    kwargs.pop("validate", None)
    kwargs.pop("status", None)
    names = (
        "causal",
        "window",
        "softmax_scale",
        "alibi_slopes",
        "sinks",
        "k_scale",
        "v_scale",
        "kv_layout",
        "softcap",
        "out",
        "return_lse",
        "lse",
        "fp8_out_scale",
    )
    defaults = dict(
        causal=True,
        window=(-1, -1),
        softmax_scale=None,
        alibi_slopes=None,
        sinks=None,
        k_scale=None,
        v_scale=None,
        kv_layout=None,
        softcap=0.0,
        out=None,
        return_lse=False,
        lse=None,
        fp8_out_scale=None,
    )
    unknown = set(kwargs) - set(names)
    if unknown:
        raise TypeError(f"explain() got unexpected keyword arguments {sorted(unknown)}")
    opts = {**defaults, **kwargs}
    args = _py_args(
        q,
        k,
        v,
        k_cache,
        v_cache,
        block_table,
        cu_seqlens_q,
        seq_lens,
        max_query_len,
        *(opts[n] for n in names),
    )
    return launch.plan_of(*args)
