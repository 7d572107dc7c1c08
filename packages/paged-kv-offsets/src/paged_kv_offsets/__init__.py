"""paged-kv-offsets: (block table, token position, page size) -> int64 KV-cache offsets, any page size.

Device side (``@triton.jit``, import from :mod:`paged_kv_offsets.kernel`): ``tile_blocks`` (the
block-table reads of a tile of positions; ``IDS``: a tile's block ids read ahead),
``tile_block_offsets`` (its per-lane offsets in one cache), ``dim_offsets`` (the per-feature part),
``bad_block_ids`` (whether a sequence's table row names a block outside the cache).
Gluon (Triton >= 3.5, import from :mod:`paged_kv_offsets.gluon`): ``page_row`` (the row of a TMA copy
of one page run in the view of :func:`tma_rows`), ``slot_offset`` (a token's slot offset, for gathers),
``bad_block_ids``. Host side: :func:`describe_cache` / :func:`describe_kv_cache` (layouts as strides),
:func:`tma_rows` (an NHD or HND cache as the 2-D view of rows a TMA descriptor takes),
:func:`validate_block_table` and :func:`offsets_fit_int32` (when the device functions may take
``WIDE=False``: int32 offsets).

Versioned on its own: kernels pin ``paged-kv-offsets>=3,<4``; the device-function signatures
only change with a major version.
"""

__version__ = "3.1.0"

from paged_kv_offsets.index import offsets_fit_int32
from paged_kv_offsets.layouts import (
    LAYOUTS,
    CacheView,
    TmaRows,
    describe_cache,
    describe_kv_cache,
    infer_layout,
    tma_rows,
)
from paged_kv_offsets.validate import pages_needed, validate_block_table

__all__ = [
    "LAYOUTS",
    "CacheView",
    "TmaRows",
    "__version__",
    "describe_cache",
    "describe_kv_cache",
    "infer_layout",
    "offsets_fit_int32",
    "pages_needed",
    "tma_rows",
    "validate_block_table",
]
