"""The KV-cache layouts this project accepts, described once as the strides a kernel takes.

A paged cache holds ``num_blocks`` pages of ``page_size`` token slots each, for ``num_kv_heads``
heads of ``head_size`` features. Element ``(block, slot, head, d)`` of a cache lives at::

    block * stride_block + slot * stride_slot + head * stride_head
        + (d // x) * stride_dim + (d % x) * stride_x

(all in elements), of which :func:`paged_kv_offsets.kernel.tile_block_offsets` computes the block and
slot part and :func:`paged_kv_offsets.kernel.dim_offsets` the feature part on the device (the caller
adds ``head * stride_head``). Accepted layouts:

========  ===========================================  =============================================
layout    K cache                                      V cache
========  ===========================================  =============================================
"split"   ``[num_blocks, heads, head_size // x, page,  ``[num_blocks, heads, head_size, page]``
          x]`` (vLLM's paged-attention layout)         (vLLM)
"nhd"     ``[num_blocks, page, heads, head_size]``     same (FlashAttention / FlashInfer NHD)
"hnd"     ``[num_blocks, heads, page, head_size]``     same (FlashInfer HND)
========  ===========================================  =============================================

Any strides are accepted (views, padded pages), as long as the tensor has the rank and the sizes
of its layout; only the sizes are checked, the strides are read from the tensor. :func:`tma_rows`
describes an NHD or HND cache as the 2-D view of rows a TMA descriptor takes (:class:`TmaRows`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LAYOUTS = ("split", "nhd", "hnd")
_INT32_LIMIT = 2**31


@dataclass(frozen=True)
class CacheView:
    """Sizes and element strides of one paged cache tensor (K or V), whatever its layout."""

    layout: str
    num_blocks: int
    page_size: int
    num_kv_heads: int
    head_size: int
    stride_block: int
    stride_slot: int
    stride_head: int
    stride_dim: int
    stride_x: int
    x: int

    def kernel_args(self) -> tuple[int, int, int, int, int]:
        """``(stride_block, stride_slot, stride_head, stride_dim, stride_x)`` in kernel order."""
        return (self.stride_block, self.stride_slot, self.stride_head, self.stride_dim, self.stride_x)


def describe_cache(
    cache: torch.Tensor, layout: str, *, role: str = "k", name: str | None = None
) -> CacheView:
    """Describe ``cache`` (a K cache if ``role == "k"``, else a V cache) in ``layout``.

    Raises ``ValueError`` naming ``name`` (default ``"{role}_cache"``) when the rank does not fit.
    """
    name = name or f"{role}_cache"
    if not isinstance(cache, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(cache).__name__}")
    if layout not in LAYOUTS:
        raise ValueError(f"kv layout must be one of {LAYOUTS}, got {layout!r}")
    s = cache.stride()
    if layout == "split" and role == "k":
        if cache.dim() != 5:
            raise ValueError(
                f"{name} in the 'split' layout must be 5-D [num_blocks, kv_heads, head_size // x, page, x], "
                f"got shape {tuple(cache.shape)}"
            )
        nb, h, dx, page, x = cache.shape
        return CacheView(layout, nb, page, h, dx * x, s[0], s[3], s[1], s[2], s[4], x)
    if layout == "split":
        if cache.dim() != 4:
            raise ValueError(
                f"{name} in the 'split' layout must be 4-D [num_blocks, kv_heads, head_size, page], "
                f"got shape {tuple(cache.shape)}"
            )
        nb, h, d, page = cache.shape
        return CacheView(layout, nb, page, h, d, s[0], s[3], s[1], s[2], 0, 1)
    if cache.dim() != 4:
        dims = "page, kv_heads" if layout == "nhd" else "kv_heads, page"
        raise ValueError(
            f"{name} in the {layout!r} layout must be 4-D [num_blocks, {dims}, head_size], "
            f"got shape {tuple(cache.shape)}"
        )
    if layout == "nhd":
        nb, page, h, d = cache.shape
        return CacheView(layout, nb, page, h, d, s[0], s[1], s[2], s[3], 0, 1)
    nb, h, page, d = cache.shape
    return CacheView(layout, nb, page, h, d, s[0], s[2], s[1], s[3], 0, 1)


def describe_kv_cache(
    k_cache: torch.Tensor, v_cache: torch.Tensor, layout: str
) -> tuple[CacheView, CacheView]:
    """Describe a K/V cache pair and check that they agree (blocks, page size, heads, head size)."""
    kv = describe_cache(k_cache, layout, role="k")
    vv = describe_cache(v_cache, layout, role="v")
    for field in ("num_blocks", "page_size", "num_kv_heads", "head_size"):
        a, b = getattr(kv, field), getattr(vv, field)
        if a != b:
            raise ValueError(
                f"k_cache and v_cache disagree on {field}: {a} vs {b} "
                f"(shapes {tuple(k_cache.shape)} and {tuple(v_cache.shape)}, layout {layout!r})"
            )
    if kv.page_size < 1:
        raise ValueError(f"page size must be >= 1, got {kv.page_size}")
    return kv, vv


def infer_layout(k_cache: torch.Tensor, v_cache: torch.Tensor) -> str:
    """'split' for a 5-D K cache with a 4-D V cache; otherwise 'nhd' (pass 'hnd' explicitly)."""
    return "split" if k_cache.dim() == 5 else "nhd"


@dataclass(frozen=True)
class TmaRows:
    """A paged cache as the 2-D view of rows a TMA descriptor takes: shape ``[rows, row_elems]``, strides
    ``[row_stride, 1]`` (elements), over the cache tensor's first element. Feature ``f`` of slot ``s`` of
    block ``b`` and KV head ``h`` is at row ``b * block_rows + h * head_rows + s``, column ``h * head_cols
    + f``. See :func:`tma_rows`."""

    rows: int
    row_elems: int
    row_stride: int
    block_rows: int
    head_rows: int
    head_cols: int

    def kernel_args(self) -> tuple[int, int, int]:
        """``(block_rows, head_rows, head_cols)``: what a kernel addressing the view takes."""
        return (self.block_rows, self.head_rows, self.head_cols)


def tma_rows(cv: CacheView, elem_size: int) -> TmaRows | None:
    """The view of rows a TMA descriptor takes of an NHD or HND cache described by ``cv`` (elements of
    ``elem_size`` bytes), or None where TMA cannot read the cache as one such view.

    * NHD (``[num_blocks, page, heads, head_size]``, heads adjacent: ``stride_head = head_size``): a
      row is one slot's heads, ``row_stride = stride_slot``, ``head_rows = 0``, ``head_cols =
      head_size``, ``row_elems = heads * head_size`` (at most the row stride).
    * HND (``[num_blocks, heads, page, head_size]``): a row is one head's slot, ``row_stride =
      stride_slot``, ``head_rows = stride_head / stride_slot`` (at least ``page``), ``head_cols = 0``,
      ``row_elems = head_size`` (at most the row stride).

    ``block_rows = stride_block / row_stride``: any block stride that is a whole number of rows and
    leaves a block's rows apart from the next block's (FlashInfer's ``[num_blocks, 2, ...]`` tensor with
    ``k_cache = kv[:, 0]``: blocks twice a page apart; padded blocks). ``rows = (num_blocks - 1) *
    block_rows + (heads - 1) * head_rows + page``: the view ends at the last row the cache uses, so a
    descriptor over it stays inside the cache's storage, and row ``rows`` (or any later one) lies past
    its end (a TMA box there reads zeros).

    None for: the split layout, a non-unit feature stride, NHD heads that are not adjacent, a row stride
    that is not a multiple of 16 bytes, a block stride (HND: or a head stride) that is not a whole number
    of rows or whose rows overlap the next block's (head's), rows wider than the row stride, no blocks,
    or more than ``2**31 - 1`` rows (TMA coordinates and the kernels' rows are int32). The tensor's base
    address (16-byte aligned for TMA) is the caller's to check. Raises ``TypeError`` for a ``cv`` that is
    not a :class:`CacheView` and ``ValueError`` for an element size that is not a positive integer."""
    if not isinstance(cv, CacheView):
        raise TypeError(f"tma_rows takes a CacheView (describe_cache), got {type(cv).__name__}")
    if not isinstance(elem_size, int) or elem_size < 1:
        raise ValueError(f"elem_size must be a positive number of bytes, got {elem_size!r}")
    if cv.layout not in ("nhd", "hnd") or cv.stride_dim != 1 or cv.num_blocks < 1:
        return None
    d, hk, page, st = cv.head_size, cv.num_kv_heads, cv.page_size, cv.stride_slot
    if st < 1 or (st * elem_size) % 16:
        return None
    if cv.layout == "nhd":
        if hk > 1 and cv.stride_head != d:  # (a size-1 dimension's stride is arbitrary: not read)
            return None
        head_rows, head_cols = 0, d
        row_elems, span = hk * d, page
    else:
        if hk > 1 and (cv.stride_head % st or cv.stride_head // st < page):
            return None
        head_rows, head_cols = cv.stride_head // st if hk > 1 else page, 0
        row_elems, span = d, (hk - 1) * head_rows + page
    if cv.num_blocks > 1 and (cv.stride_block % st or cv.stride_block // st < span):
        return None
    block_rows = cv.stride_block // st if cv.num_blocks > 1 else span
    if row_elems > st:
        return None
    rows = (cv.num_blocks - 1) * block_rows + span
    if rows >= _INT32_LIMIT:
        return None
    return TmaRows(rows, row_elems, st, block_rows, head_rows, head_cols)
