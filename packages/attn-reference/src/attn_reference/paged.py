"""Paged-KV-cache reference: gather a paged cache into contiguous tokens with plain torch indexing
(its own addressing, independent of ``paged_kv_offsets``), dequantise fp8, then run the dense reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Union

import torch

from .dense import _check_cu_seqlens, _check_tensor, attention_varlen

LAYOUTS = ("split", "nhd", "hnd")
FP8_DTYPES = tuple(
    getattr(torch, n)
    for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    if hasattr(torch, n)
)

Scale = Union[float, torch.Tensor]


def _cache_dims(cache: torch.Tensor, layout: str, role: str, name: str) -> tuple[int, int, int, int]:
    """``(num_blocks, page_size, num_kv_heads, head_size)`` of a cache tensor, checking its rank."""
    if not isinstance(cache, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(cache).__name__}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if role not in ("k", "v"):
        raise ValueError(f"role must be 'k' or 'v', got {role!r}")
    if layout == "split" and role == "k":
        if cache.dim() != 5:
            raise ValueError(
                f"{name} in the 'split' layout must be 5-D [num_blocks, kv_heads, head_size // x, page, x], "
                f"got shape {tuple(cache.shape)}"
            )
        nb, h, dx, page, x = cache.shape
        return nb, page, h, dx * x
    if layout == "split":
        if cache.dim() != 4:
            raise ValueError(
                f"{name} in the 'split' layout must be 4-D [num_blocks, kv_heads, head_size, page], "
                f"got shape {tuple(cache.shape)}"
            )
        nb, h, d, page = cache.shape
        return nb, page, h, d
    if cache.dim() != 4:
        dims = "page, kv_heads" if layout == "nhd" else "kv_heads, page"
        raise ValueError(
            f"{name} in the {layout!r} layout must be 4-D [num_blocks, {dims}, head_size], "
            f"got shape {tuple(cache.shape)}"
        )
    if layout == "nhd":
        nb, page, h, d = cache.shape
    else:
        nb, h, page, d = cache.shape
    return nb, page, h, d


def _lengths(seq_lens: object, name: str) -> list[int]:
    if isinstance(seq_lens, torch.Tensor):
        if seq_lens.dim() != 1:
            raise ValueError(f"{name} must be 1-D [batch], got shape {tuple(seq_lens.shape)}")
        if seq_lens.dtype.is_floating_point or seq_lens.dtype.is_complex or seq_lens.dtype == torch.bool:
            raise TypeError(f"{name} must be an integer tensor, got {seq_lens.dtype}")
        vals = [int(x) for x in seq_lens.tolist()]
    elif isinstance(seq_lens, Sequence) and all(
        isinstance(x, int) and not isinstance(x, bool) for x in seq_lens
    ):
        vals = list(seq_lens)
    else:
        raise TypeError(f"{name} must be an integer tensor [batch] or a sequence of ints")
    if any(x < 0 for x in vals):
        raise ValueError(f"{name} must be >= 0, got {vals}")
    return vals


def _check_block_table(block_table: object, lens: list[int], num_blocks: int, page: int) -> list[list[int]]:
    bt = _check_tensor(block_table, "block_table", 2, "[batch, max_blocks_per_seq]")
    if bt.dtype.is_floating_point or bt.dtype.is_complex or bt.dtype == torch.bool:
        raise TypeError(f"block_table must be an integer tensor, got {bt.dtype}")
    if bt.shape[0] != len(lens):
        raise ValueError(f"block_table has {bt.shape[0]} rows but there are {len(lens)} sequences")
    rows = bt.tolist()
    for b, n in enumerate(lens):
        need = -(-n // page)
        if need > bt.shape[1]:
            raise ValueError(
                f"sequence {b} needs {need} blocks of {page} tokens for {n} tokens, "
                f"but block_table has only {bt.shape[1]} columns"
            )
        bad = [x for x in rows[b][:need] if not 0 <= x < num_blocks]
        if bad:
            raise ValueError(f"block_table[{b}] references blocks {bad} outside [0, {num_blocks})")
    return rows


def _as_token_major(cache: torch.Tensor, layout: str, role: str) -> torch.Tensor:
    """A view ``[num_blocks, page, Hkv, ...]`` whose trailing dims flatten to ``head_size``."""
    if layout == "split" and role == "k":
        return cache.permute(0, 3, 1, 2, 4)  # [nb, page, H, D // x, x]
    if layout == "split":
        return cache.permute(0, 3, 1, 2)  # [nb, page, H, D]
    if layout == "hnd":
        return cache.permute(0, 2, 1, 3)  # [nb, page, H, D]
    return cache  # nhd: [nb, page, H, D]


def gather_paged(
    cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: Union[torch.Tensor, Sequence[int]],
    *,
    layout: str,
    role: str = "k",
) -> torch.Tensor:
    """Gather the first ``seq_lens[b]`` tokens of every sequence from a paged cache.

    Token ``t`` of sequence ``b`` lives in block ``block_table[b, t // page]``, slot ``t % page``.

    Args:
        cache: a K cache (``role="k"``) or V cache (``role="v"``) in ``layout``:
            ``"split"``: K ``[num_blocks, Hkv, D // x, page, x]``, V ``[num_blocks, Hkv, D, page]``;
            ``"nhd"``: ``[num_blocks, page, Hkv, D]``; ``"hnd"``: ``[num_blocks, Hkv, page, D]``.
            Any strides and any dtype (fp8 / uint8 are returned as they are, not dequantised).
        block_table: int ``[B, max_blocks]``; only the first ``ceil(seq_lens[b] / page)`` entries of
            row ``b`` are read (they must be in ``[0, num_blocks)``).
        seq_lens: int ``[B]`` (tensor or sequence of ints).

    Returns:
        ``[sum(seq_lens), Hkv, D]`` contiguous, in ``cache.dtype``, sequences packed in order.
    """
    nb, page, heads, d = _cache_dims(cache, layout, role, f"{role}_cache")
    lens = _lengths(seq_lens, "seq_lens")
    rows = _check_block_table(block_table, lens, nb, page)
    # Index through a same-size integer view: advanced indexing is not implemented for every fp8 dtype.
    raw = cache.view(torch.uint8) if cache.element_size() == 1 and cache.dtype != torch.uint8 else cache
    tm = _as_token_major(raw, layout, role)
    parts = []
    for b, n in enumerate(lens):
        t = torch.arange(n)
        blk = torch.tensor(rows[b][: -(-n // page)], dtype=torch.long)[t // page] if n else t
        idx_b, idx_s = blk.to(cache.device), (t % page).to(cache.device)
        parts.append(tm[idx_b, idx_s].reshape(n, heads, d))
    out = torch.cat(parts) if parts else raw.new_zeros(0, heads, d)
    return out.view(cache.dtype) if out.dtype != cache.dtype else out.contiguous()


def dequantize(
    x: torch.Tensor,
    scale: Scale = 1.0,
    *,
    fp8_dtype: torch.dtype | None = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """``x`` in ``dtype``; fp8 (and uint8, viewed as ``fp8_dtype``, default float8_e4m3fn) values are
    multiplied by ``scale`` (a float or a 1-element tensor). Wider dtypes ignore ``scale``, like vLLM."""
    if fp8_dtype is not None and fp8_dtype not in FP8_DTYPES:
        raise TypeError(f"fp8_dtype must be one of {FP8_DTYPES}, got {fp8_dtype}")
    if x.dtype == torch.uint8:
        x = x.view(fp8_dtype or torch.float8_e4m3fn)
    elif x.dtype.is_floating_point and fp8_dtype is not None and x.dtype != fp8_dtype:
        if x.element_size() == 1:
            raise TypeError(f"cache dtype {x.dtype} disagrees with fp8_dtype={fp8_dtype}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"cache must be a floating-point, fp8 or uint8 tensor, got {x.dtype}")
    if x.dtype not in FP8_DTYPES:
        return x.to(dtype)
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1:
            raise ValueError(f"a scale tensor must have exactly 1 element, got shape {tuple(scale.shape)}")
        s = scale.to(device=x.device, dtype=dtype).reshape(())
    elif isinstance(scale, (int, float)) and not isinstance(scale, bool):
        s = float(scale)
    else:
        raise TypeError(f"scale must be a float or a 1-element tensor, got {type(scale).__name__}")
    return x.to(dtype) * s


def paged_prefix_attention(
    q: torch.Tensor,
    k_new: torch.Tensor | None,
    v_new: torch.Tensor | None,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: Union[torch.Tensor, Sequence[int]],
    *,
    layout: str = "nhd",
    causal: bool = True,
    window: tuple[int, int] = (-1, -1),
    softmax_scale: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    sinks_mode: str = "denominator",
    softcap: float = 0.0,
    k_scale: Scale = 1.0,
    v_scale: Scale = 1.0,
    fp8_dtype: torch.dtype | None = None,
    dtype: torch.dtype = torch.float64,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Reference prefill with a paged prefix: context from the cache, new tokens from ``k_new``/``v_new``.

    Args:
        q: ``[total_q, H, D]`` queries (the new tokens), packed by ``cu_seqlens_q``.
        k_new: ``[total_q, Hkv, D]`` keys of the new tokens, or ``None`` to read them from the cache
            at positions ``[ctx_len, seq_len)`` (then ``v_new`` must be ``None`` too).
        v_new: ``[total_q, Hkv, Dv]`` values of the new tokens, or ``None``.
        k_cache, v_cache: paged caches in ``layout`` (see :func:`gather_paged`).
        block_table: int ``[B, max_blocks]``.
        cu_seqlens_q: int ``[B + 1]``; ``len_q[b] = cu_seqlens_q[b + 1] - cu_seqlens_q[b]``.
        seq_lens: int ``[B]``, context length + query length; ``ctx_len[b] = seq_lens[b] - len_q[b] >= 0``.
        k_scale, v_scale: dequantisation scales (float or 1-element tensor) for fp8 / uint8 caches:
            a cache value ``c`` means ``float(c) * scale``. Ignored for 16/32-bit caches.
        fp8_dtype: how a uint8 cache is read (default ``torch.float8_e4m3fn``).
        Other keyword arguments: as :func:`attn_reference.attention_varlen` (query ``i`` of sequence
        ``b`` sits at key position ``ctx_len[b] + i``; ``causal`` defaults to True here).
        return_lse: also return each row's softmax log-sum-exp, as :func:`attention_varlen` does
            (logits of fp8 caches include ``k_scale``).

    Returns:
        ``[total_q, H, Dv]`` in ``dtype``; with ``return_lse``, ``(out, lse)``, ``lse`` ``[H, total_q]``
        in ``dtype`` (see :func:`attn_reference.attention_varlen`).
    """
    q = _check_tensor(q, "q", 3, "[total_q, num_heads, head_size]")
    if (k_new is None) != (v_new is None):
        raise ValueError("k_new and v_new must both be tensors or both be None")
    nb, page, hkv, d = _cache_dims(k_cache, layout, "k", "k_cache")
    nbv, pagev, hkvv, dv = _cache_dims(v_cache, layout, "v", "v_cache")
    if (nb, page, hkv) != (nbv, pagev, hkvv):
        raise ValueError(
            f"k_cache and v_cache disagree on (num_blocks, page_size, kv_heads): {(nb, page, hkv)} vs "
            f"{(nbv, pagev, hkvv)}"
        )
    if d != q.shape[2]:
        raise ValueError(f"k_cache head size ({d}) must equal q head size ({q.shape[2]})")
    cu_q = _check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", q.shape[0])
    lens = _lengths(seq_lens, "seq_lens")
    if len(lens) != len(cu_q) - 1:
        raise ValueError(
            f"seq_lens has {len(lens)} entries but cu_seqlens_q describes {len(cu_q) - 1} sequences"
        )
    q_lens = [cu_q[b + 1] - cu_q[b] for b in range(len(lens))]
    bad = [b for b, (n, lq) in enumerate(zip(lens, q_lens, strict=True)) if n < lq]
    if bad:
        raise ValueError(f"seq_lens must be >= the query length of each sequence; sequences {bad} are not")
    ctx_lens = [n - lq for n, lq in zip(lens, q_lens, strict=True)]
    if k_new is not None:
        k_new = _check_tensor(k_new, "k_new", 3, "[total_q, num_kv_heads, head_size]")
        v_new = _check_tensor(v_new, "v_new", 3, "[total_q, num_kv_heads, head_size_v]")
        if tuple(k_new.shape) != (q.shape[0], hkv, d):
            raise ValueError(f"k_new must have shape {(q.shape[0], hkv, d)}, got {tuple(k_new.shape)}")
        if tuple(v_new.shape) != (q.shape[0], hkv, dv):
            raise ValueError(f"v_new must have shape {(q.shape[0], hkv, dv)}, got {tuple(v_new.shape)}")
    from_cache = ctx_lens if k_new is not None else lens
    kc = gather_paged(k_cache, block_table, from_cache, layout=layout, role="k")
    vc = gather_paged(v_cache, block_table, from_cache, layout=layout, role="v")
    kc = dequantize(kc, k_scale, fp8_dtype=fp8_dtype, dtype=dtype).to(q.device)
    vc = dequantize(vc, v_scale, fp8_dtype=fp8_dtype, dtype=dtype).to(q.device)
    if k_new is None:
        k_all, v_all = kc, vc
    else:
        assert v_new is not None
        kn, vn = k_new.to(device=q.device, dtype=dtype), v_new.to(device=q.device, dtype=dtype)
        ks, vs, c0 = [], [], 0
        for b, n in enumerate(ctx_lens):
            ks += [kc[c0 : c0 + n], kn[cu_q[b] : cu_q[b + 1]]]
            vs += [vc[c0 : c0 + n], vn[cu_q[b] : cu_q[b + 1]]]
            c0 += n
        k_all = torch.cat(ks) if ks else kc
        v_all = torch.cat(vs) if vs else vc
    cu_k = torch.zeros(len(lens) + 1, dtype=torch.long)
    cu_k[1:] = torch.cumsum(torch.tensor(lens, dtype=torch.long), 0)
    return attention_varlen(
        q,
        k_all,
        v_all,
        torch.tensor(cu_q, dtype=torch.long),
        cu_k,
        causal=causal,
        window=window,
        softmax_scale=softmax_scale,
        alibi_slopes=alibi_slopes,
        sinks=sinks,
        sinks_mode=sinks_mode,
        softcap=softcap,
        dtype=dtype,
        return_lse=return_lse,
    )
