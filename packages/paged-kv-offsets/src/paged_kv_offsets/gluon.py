"""Gluon device functions (Triton >= 3.5, ``triton.experimental.gluon``): paged addressing for TMA
copies (``page_row``; a run of boxes without a division a box: ``page_row_at`` and ``next_box``) and for
gathers (``slot_offset``), and the check of a sequence's block ids (``bad_block_ids``).

A TMA copy reads a box of rows from a 2-D view of the cache (:func:`paged_kv_offsets.tma_rows`: NHD
rows are one slot's heads, HND rows one head's slot; slot ``s`` of block ``b`` and KV head ``h`` at
row ``b * block_rows + h * head_rows + s``). A run of ``BOX`` tokens that stays inside one page
(``BOX`` divides ``page_size`` and the run starts at a multiple of ``BOX``) is one box at the row this
module computes. Import only where Gluon exists; the kernel packages guard it.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def page_row(p_table_row, pos, seq_end, page_size, oob_row, block_rows, head_row):
    """Row of token position ``pos`` of one sequence in a cache's view of rows
    (:func:`paged_kv_offsets.tma_rows`): ``block_table[page] * block_rows + head_row + pos % page_size``
    with ``page = pos // page_size``, read from the sequence's block-table row ``p_table_row`` (int32 or
    int64 entries; rows are int32: ``tma_rows`` keeps the view under ``2**31`` rows); ``block_rows`` the
    view's rows a block, ``head_row`` the KV head times the view's ``head_rows`` (0 for NHD). ``oob_row``
    (a row past the view's end: the TMA copy reads zeros) when ``pos >= seq_end``, and then no
    block-table entry is read."""
    page = pos // page_size
    return page_row_at(p_table_row, page, pos - page * page_size, pos, seq_end, oob_row, block_rows, head_row)


@gluon.jit
def page_row_at(p_table_row, page, slot, pos, seq_end, oob_row, block_rows, head_row):
    """:func:`page_row` of position ``pos`` where its page (``pos // page_size``) and slot in the page
    (``pos % page_size``) are known: no division. A run of boxes walks its pages with
    :func:`next_box`."""
    ok = pos < seq_end
    block = gl.load(p_table_row + page, mask=ok, other=0).to(gl.int32)  # int32 or int64 tables
    return gl.where(ok, block * block_rows + head_row + slot, oob_row)


@gluon.jit
def next_box(page, slot, page_size, BOX: gl.constexpr):
    """``(page, slot)`` of the box ``BOX`` tokens after the one at ``(page, slot)``, ``BOX`` dividing
    ``page_size`` (each box inside one page): the slot moves on by ``BOX``, onto the next page's first
    slot at the page's end. An add, a compare and two selects, where :func:`page_row` divides."""
    slot = slot + BOX
    wrap = slot >= page_size
    return gl.where(wrap, page + 1, page), gl.where(wrap, slot - page_size, slot)


@gluon.jit
def slot_offset(p_table_row, pos, seq_end, page_size, stride_block, stride_slot, max_block=None):
    """int64 element offset of token position ``pos``'s slot in a paged cache, for gathers (``cp.async``)
    rather than TMA boxes: ``block_table[page] * stride_block + (pos % page_size) * stride_slot`` with
    ``page = pos // page_size`` (any layout: add the head's and the feature's offsets). ``pos`` may be a
    tensor; where ``pos >= seq_end`` no block-table entry is read and the offset is that of block 0.
    ``max_block`` (``num_blocks - 1``): block ids clamped to ``[0, max_block]``, so an entry outside the
    cache gathers from a block inside it (a gather, unlike a TMA box, has no hardware bound); None: as
    read."""
    ok = pos < seq_end
    page = pos // page_size
    block = gl.load(p_table_row + page, mask=ok, other=0)  # int32 or int64 tables
    if max_block is not None:
        block = gl.maximum(gl.minimum(block, max_block), 0)
    return block.to(gl.int64) * stride_block + (pos - page * page_size).to(gl.int64) * stride_slot


@gluon.jit
def bad_block_ids(p_table_row, n_tokens, n_cols, num_blocks, page_size):
    """1 (int32) when a block id of the first ``n_tokens`` tokens of a sequence (pages ``[0,
    min(cdiv(n_tokens, page_size), n_cols))`` of its unit-stride block-table row ``p_table_row``) lies
    outside ``[0, num_blocks)``, else 0: :func:`paged_kv_offsets.kernel.bad_block_ids` for Gluon
    kernels, 4 entries a thread a step over the partition's warps."""
    L: gl.constexpr = gl.BlockedLayout([4], [32], [gl.num_warps()], [0])
    STEP: gl.constexpr = 4 * 32 * gl.num_warps()
    n_pages = gl.minimum(gl.cdiv(n_tokens, page_size), n_cols)
    bad = (n_pages * 0).to(gl.int32)
    for p0 in range(0, n_pages, STEP):
        pages = p0 + gl.arange(0, STEP, layout=L)  # [STEP]
        ids = gl.load(p_table_row + pages, mask=pages < n_pages, other=0)  # [STEP]
        bad = bad | gl.max(((ids < 0) | (ids >= num_blocks)).to(gl.int32), axis=0)
    return bad
