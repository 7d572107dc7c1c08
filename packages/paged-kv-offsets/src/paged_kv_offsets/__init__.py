"""paged-kv-offsets: (block table, token position, page size) -> int64 KV-cache offsets, any page size.

Device side (``@triton.jit``, import from :mod:`paged_kv_offsets.kernel`): ``token_offsets``,
``tile_blocks`` (``IDS``: a tile's block ids read ahead), ``tile_block_offsets``,
``page_walk_bounds`` / ``page_walk_tile`` / ``page_walk_split`` / ``page_walk_full`` /
``page_walk_rest`` (tiles that never cross a page), ``page_walk_rest_group`` / ``lane_offsets`` (the
rest tiles of several pages in one tile), ``tile_pages``, ``tile_offsets``, ``token_mask``,
``dim_offsets``. Gluon (Triton >= 3.5, import from :mod:`paged_kv_offsets.gluon`): ``page_row`` (the
row of a TMA copy of one page run), ``slot_offset`` (a token's slot offset, for gathers). Host side:
:func:`describe_cache` / :func:`describe_kv_cache` (layouts as strides),
:func:`validate_block_table`, :func:`page_walk_rest_block` and :func:`offsets_fit_int32` (when the
device functions may take ``WIDE=False``: int32 offsets).

Versioned on its own: kernels pin ``paged-kv-offsets>=1.8,<2``; the device-function signatures
only change with a major version.
"""

__version__ = "1.8.0"

from paged_kv_offsets.index import offsets_fit_int32
from paged_kv_offsets.layouts import LAYOUTS, CacheView, describe_cache, describe_kv_cache, infer_layout
from paged_kv_offsets.validate import pages_needed, validate_block_table
from paged_kv_offsets.walk import page_walk_rest_block

__all__ = [
    "LAYOUTS",
    "CacheView",
    "__version__",
    "describe_cache",
    "describe_kv_cache",
    "infer_layout",
    "offsets_fit_int32",
    "page_walk_rest_block",
    "pages_needed",
    "validate_block_table",
]
