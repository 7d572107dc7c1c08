"""Gluon device functions (Triton >= 3.5, ``triton.experimental.gluon``): paged addressing for TMA
copies (``page_row``) and for gathers (``slot_offset``).

A TMA copy reads a box of rows from a 2-D view of the cache, ``[num_blocks * page_size, kv_heads *
head_size]`` (pages contiguous, one token's heads contiguous: the host checks the strides). A run of
``BOX`` tokens that stays inside one page (``BOX`` divides ``page_size`` and the run starts at a multiple
of ``BOX``) is one box at the row this module computes. Import only where Gluon exists; the kernel
packages guard it.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def page_row(p_table_row, pos, seq_end, page_size, oob_row):
    """Row of token position ``pos`` of one sequence in the ``[num_blocks * page_size, ...]`` view:
    ``block_table[page] * page_size + pos % page_size`` with ``page = pos // page_size``, read from the
    sequence's block-table row ``p_table_row`` (int32 or int64 entries; rows are int32: the host keeps
    ``num_blocks * page_size < 2**31``); ``oob_row`` (a row past the view's end: the TMA copy reads
    zeros) when ``pos >= seq_end``, and then no block-table entry is read."""
    ok = pos < seq_end
    page = pos // page_size
    block = gl.load(p_table_row + page, mask=ok, other=0).to(gl.int32)  # int32 or int64 tables
    return gl.where(ok, block * page_size + (pos - page * page_size), oob_row)


@gluon.jit
def slot_offset(p_table_row, pos, seq_end, page_size, stride_block, stride_slot):
    """int64 element offset of token position ``pos``'s slot in a paged cache, for gathers (``cp.async``)
    rather than TMA boxes: ``block_table[page] * stride_block + (pos % page_size) * stride_slot`` with
    ``page = pos // page_size`` (any layout: add the head's and the feature's offsets). ``pos`` may be a
    tensor; where ``pos >= seq_end`` no block-table entry is read and the offset is that of block 0."""
    ok = pos < seq_end
    page = pos // page_size
    block = gl.load(p_table_row + page, mask=ok, other=0)  # int32 or int64 tables
    return block.to(gl.int64) * stride_block + (pos - page * page_size).to(gl.int64) * stride_slot
