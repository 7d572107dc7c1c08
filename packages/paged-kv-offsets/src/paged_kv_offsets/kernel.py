"""Triton device functions: the one place that turns (block table, position, page size) into offsets.

Every kernel in this repository that reads a paged KV cache calls :func:`token_offsets` for the
per-token part of an address and :func:`dim_offsets` for the per-feature part, and adds
``kv_head * stride_head``. Nothing else in the repository divides a position by a page size.

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
def dim_offsets(offs_d, stride_dim, stride_x, X: tl.constexpr):
    """[D] int64 offsets of feature indices ``offs_d`` inside one (block, head, slot) vector.

    ``(d // X) * stride_dim + (d % X) * stride_x``. X == 1 (NHD, HND, vLLM's V cache) reduces to
    ``d * stride_dim``; X > 1 is vLLM's split K layout ``[blocks, heads, D // X, page, X]``.
    """
    if X == 1:
        return offs_d.to(tl.int64) * stride_dim
    else:
        return (offs_d // X).to(tl.int64) * stride_dim + (offs_d % X).to(tl.int64) * stride_x
