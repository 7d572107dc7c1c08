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
of its layout; only the sizes are checked, the strides are read from the tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LAYOUTS = ("split", "nhd", "hnd")


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
