"""Host side of page walks (:func:`paged_kv_offsets.kernel.page_walk_bounds` and friends)."""

from __future__ import annotations


def page_walk_rest_block(page_size: int, block: int) -> int:
    """Width of the rest tile of a page walk with full tiles of ``block`` tokens, or 0 when a walk
    buys nothing (a page no wider than the tile, or a multiple of it: tiles aligned to ``block``
    never cross such a page).

    The rest tile holds the last ``page_size % block`` tokens of each page; its width is that count
    rounded up to a power of two and to at least 16 (the narrowest ``tl.dot`` operand), so it is
    unmasked exactly when the rest is a power of two of at least 16 tokens (544, 1040 and 1056
    against tiles of 64 or 128 rest 32, 16 and 32 tokens).
    """
    if page_size < 1 or block < 1:
        raise ValueError(f"page_size and block must be >= 1, got {page_size} and {block}")
    rest = page_size % block
    if page_size <= block or rest == 0:
        return 0
    return max(16, 1 << (rest - 1).bit_length())
