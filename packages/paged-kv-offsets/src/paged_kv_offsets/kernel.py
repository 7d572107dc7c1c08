"""Triton device functions: the one place that turns (block table, position, page size) into offsets.

Every kernel in this repository that reads a paged KV cache calls :func:`token_offsets` (any
positions) or :func:`tile_offsets` (a run of consecutive positions) for the per-token part of an
address and :func:`dim_offsets` for the per-feature part, and adds ``kv_head * stride_head``.
Nothing else in the repository divides a position by a page size.

Conventions (see :mod:`paged_kv_offsets.layouts` for how a cache tensor maps to these strides):

* ``pos``      int32/int64 ``[N]`` logical token positions of ONE sequence (0 = its first token).
* ``n_valid``  scalar: how many tokens that sequence has; lanes with ``pos >= n_valid`` are padding.
* ``bt_row``   pointer to that sequence's block-table row (``block_table + seq * stride_bt_row``).
* ``n_cols``   scalar: width of the block table (entries per row). A lane whose page index is
               ``>= n_cols`` never reads the table, even if ``pos < n_valid`` (defence in depth:
               the host validator already rejects such tables).
* ``PAGE_SIZE`` constexpr >= 1, any integer (power of two or not): the division compiles to a
               multiply-and-shift, so 544 or 1056 cost what 512 or 1024 cost.

Offsets are int64 from the block id on, so caches above 2**31 elements address correctly.
Padding lanes return offset 0 (block 0, slot 0), an address inside any non-empty cache; callers
still mask their K/V loads with the same lane mask (:func:`token_mask`).
"""

import triton
import triton.language as tl


@triton.jit
def token_mask(pos, n_valid, n_cols, PAGE_SIZE: tl.constexpr):
    """[N] bool: lanes that are real tokens of the sequence AND whose page lies inside the table row."""
    return (pos < n_valid) & ((pos // PAGE_SIZE) < n_cols)


@triton.jit
def token_offsets(
    bt_row,
    stride_bt_col,
    pos,
    n_valid,
    n_cols,
    stride_block,
    stride_slot,
    PAGE_SIZE: tl.constexpr,
):
    """[N] int64 element offsets ``block * stride_block + (pos % PAGE_SIZE) * stride_slot``.

    The block-table load is masked: lanes past the sequence (``pos >= n_valid``) or past the
    table row (``pos // PAGE_SIZE >= n_cols``) read nothing and yield offset 0.
    """
    p_page = pos // PAGE_SIZE  # [N] logical page of each token
    p_slot = pos % PAGE_SIZE  # [N] slot inside that page
    m_tok = (pos < n_valid) & (p_page < n_cols)  # [N]
    b_block = tl.load(bt_row + p_page.to(tl.int64) * stride_bt_col, mask=m_tok, other=0)  # [N]
    b_off = b_block.to(tl.int64) * stride_block + p_slot.to(tl.int64) * stride_slot  # [N]
    return tl.where(m_tok, b_off, 0)


@triton.jit
def tile_pages(bt_row, stride_bt_col, pos0, n_valid, n_cols, BLOCK: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """``(block, slot)``, both [BLOCK] int64, of the consecutive positions ``pos0 + [0, BLOCK)``
    (``pos0 >= 0``; requires ``BLOCK <= PAGE_SIZE``). Padding lanes (the :func:`token_mask` rule)
    give ``(0, 0)``; the caller forms ``block * stride_block + slot * stride_slot`` for each cache
    (K and V share one pair of table reads).

    A tile no wider than a page touches at most two pages, so one scalar divide of ``pos0``, two
    scalar (masked) block-table loads and a compare/select per token replace the divide and the
    gather per token of :func:`token_offsets`: a page size that is not a power of two then costs
    what a power of two costs. The table entries read are exactly those :func:`token_offsets` reads.
    """
    tl.static_assert(BLOCK <= PAGE_SIZE, "tile_pages needs BLOCK <= PAGE_SIZE (use token_offsets)")
    offs = tl.arange(0, BLOCK)  # [BLOCK]
    pos0_64 = tl.cast(pos0, tl.int64)  # pos0 may be a Python int under the interpreter
    page0 = pos0_64 // PAGE_SIZE  # first logical page of the tile
    slot = (pos0_64 - page0 * PAGE_SIZE).to(tl.int32) + offs  # [BLOCK] may run into page0 + 1
    cross = slot >= PAGE_SIZE  # [BLOCK] lanes on the second page
    slot = tl.where(cross, slot - PAGE_SIZE, slot)  # [BLOCK]
    # each table entry is read only if some lane of its page is a real token inside the row
    m0 = (pos0_64 < n_valid) & (page0 < n_cols)
    m1 = ((page0 + 1) * PAGE_SIZE < n_valid) & (page0 + 1 < n_cols)
    blk0 = tl.load(bt_row + page0 * stride_bt_col, mask=m0, other=0).to(tl.int64)
    blk1 = tl.load(bt_row + (page0 + 1) * stride_bt_col, mask=m1, other=0).to(tl.int64)
    m_tok = ((pos0 + offs) < n_valid) & tl.where(cross, m1, m0)  # [BLOCK]
    b_block = tl.where(m_tok, tl.where(cross, blk1, blk0), 0)  # [BLOCK]
    b_slot = tl.where(m_tok, slot, 0).to(tl.int64)  # [BLOCK]
    return b_block, b_slot


@triton.jit
def tile_offsets(
    bt_row,
    stride_bt_col,
    pos0,
    n_valid,
    n_cols,
    stride_block,
    stride_slot,
    BLOCK: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
):
    """[BLOCK] int64 offsets of the consecutive positions ``pos0 + [0, BLOCK)`` (``pos0 >= 0``): the
    values and masking of :func:`token_offsets` on those positions, through :func:`tile_pages` when
    ``BLOCK <= PAGE_SIZE`` and through :func:`token_offsets` otherwise."""
    if BLOCK <= PAGE_SIZE:
        b_block, b_slot = tile_pages(bt_row, stride_bt_col, pos0, n_valid, n_cols, BLOCK, PAGE_SIZE)
        return b_block * stride_block + b_slot * stride_slot
    else:
        offs = tl.arange(0, BLOCK)
        return token_offsets(
            bt_row, stride_bt_col, pos0 + offs, n_valid, n_cols, stride_block, stride_slot, PAGE_SIZE
        )


@triton.jit
def dim_offsets(offs_d, stride_dim, stride_x, X: tl.constexpr):
    """[D] int64 offsets of feature indices ``offs_d`` inside one (block, head, slot) vector.

    ``(d // X) * stride_dim + (d % X) * stride_x``. X == 1 (NHD, HND, vLLM's V cache) reduces to
    ``d * stride_dim``; X > 1 is vLLM's split K layout ``[blocks, heads, D // X, page, X]``.
    """
    if X == 1:
        return offs_d.to(tl.int64) * stride_dim
    else:
        return (offs_d // X).to(tl.int64) * stride_dim + (offs_d % X).to(tl.int64) * stride_x
