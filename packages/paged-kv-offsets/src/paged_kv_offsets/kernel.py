"""Triton device functions: the one place that turns (block table, position, page size) into offsets.

Every Triton kernel in this repository that reads a paged KV cache calls :func:`tile_blocks` +
:func:`tile_block_offsets` (a tile of consecutive positions; one set of block-table reads for K and
V) for the per-token part of an address and :func:`dim_offsets` for the per-feature part, and adds
``kv_head * stride_head``; :func:`bad_block_ids` tells whether a sequence's table row names a block
outside the cache (a kernel's report of malformed metadata; the reads themselves are clamped). Nothing
else in the repository divides a position by a page size (the Gluon kernels' TMA rows and gather
offsets: :mod:`paged_kv_offsets.gluon`).

Conventions (see :mod:`paged_kv_offsets.layouts` for how a cache tensor maps to these strides):

* ``pos0``     scalar: the first logical token position of the tile in ONE sequence (0 = its first
               token); the tile holds positions ``pos0 + [0, BLOCK)``.
* ``n_valid``  scalar: how many tokens that sequence has; lanes with ``pos >= n_valid`` are padding.
* ``bt_row``   pointer to that sequence's block-table row (``block_table + seq * stride_bt_row``).
* ``n_cols``   scalar: width of the block table (entries per row). A lane whose page index is
               ``>= n_cols`` never reads the table, even if ``pos < n_valid`` (defence in depth:
               the host validator already rejects such tables).
* ``PAGE_SIZE`` constexpr >= 1, any integer (power of two or not): the division compiles to a
               multiply-and-shift, so 544 or 1056 cost what 512 or 1024 cost.

Block ids and offsets are int64, or int32 with ``WIDE=False``, which a caller may pass only when every
element of the cache lies less than 2**31 elements from its start (checked on the host:
:func:`paged_kv_offsets.offsets_fit_int32`), to save the 64-bit integer work per lane (the caller then
adds them to its int64 head and feature offsets). Padding lanes return offset 0 (block 0, slot 0), an
address inside any non-empty cache; callers still mask their K/V loads with the same lane mask.
"""

import triton
import triton.language as tl


@triton.jit
def tile_blocks(
    bt_row,
    stride_bt_col,
    pos0,
    n_valid,
    n_cols,
    BLOCK: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    MASKED: tl.constexpr,
    ALIGNED: tl.constexpr,
    WIDE: tl.constexpr = True,
    IDS=None,
    max_block=None,
):
    """The block-table reads of the consecutive positions ``pos0 + [0, BLOCK)`` (``0 <= pos0 < 2**31 -
    BLOCK``, as every position of a sequence with an int32 length), as a tuple ``tile`` for
    :func:`tile_block_offsets` (one call per cache: K and V share these reads).

    * ``BLOCK <= PAGE_SIZE`` (a tile no wider than a page): the tile touches at most two pages, so one
      scalar divide of ``pos0`` and two scalar (masked) table loads serve the whole tile. ``tile =
      (blk0, blk1, slot0, n_first, m_tok)``: the blocks of the two pages, the slot of ``pos0`` in the
      first, how many lanes lie on the first page, the lane mask.
    * ``BLOCK > PAGE_SIZE``: one table load per lane (shared by K and V), ``tile = (blk, blk, slot, 0,
      m_tok)`` with ``blk``/``slot`` [BLOCK]; for a tile of whole pages (``MASKED=False``, ``ALIGNED``,
      ``BLOCK % PAGE_SIZE == 0``) one table load per page instead: ``blk`` is [BLOCK // PAGE_SIZE] and
      :func:`tile_block_offsets` spreads each page's base over its lanes.

    ``MASKED=False`` is for tiles whose lanes are all real tokens (``pos < n_valid``): the lane mask
    is then the table-row bound alone (``page < n_cols``), and with a tile no wider than a page not
    even that (a lane past the row reads block 0: an address inside any non-empty cache, never
    outside). ``ALIGNED`` promises ``pos0 % BLOCK == 0``: with ``PAGE_SIZE % BLOCK == 0`` a tile then
    never crosses a page (one table load), with ``BLOCK % PAGE_SIZE == 0`` the page and slot of every
    lane are a constant vector plus ``pos0 // PAGE_SIZE``. Padding lanes (``MASKED``) give offset 0.
    Block ids come back int64, or int32 with ``WIDE=False`` (module docstring); the offsets of
    :func:`tile_block_offsets` take their type.

    ``IDS`` (``MASKED=False`` only): ``(tile[0], tile[1])`` of an earlier call for this same tile,
    same arguments (a loop reads the next tile's ids one iteration ahead and carries them, so no
    iteration waits on the table right before its copies; the read for the tile after the loop's
    last stays masked, never outside the row): no table read here, the rest of the tuple as without.

    ``max_block`` (a runtime int, ``num_blocks - 1`` of the caches): every block id read is clamped to
    ``[0, max_block]`` (two integer ops per id read), so a table entry outside the cache (negative, or
    ``>= num_blocks``) addresses a block inside it instead of memory outside; ``max_block < 0`` (an
    empty cache) gives block 0, which a caller must then never load. None: ids as read (a caller that
    trusts the table). Ids passed in ``IDS`` are clamped here, at their use: a read ahead passes
    ``max_block=None`` and carries the raw ids, since a clamp at the read would make its loop wait
    for the table load right away, before the tile's dots, instead of where the addresses are formed.
    """
    offs = tl.arange(0, BLOCK)  # [BLOCK]
    if BLOCK <= PAGE_SIZE:
        # int32 on purpose: a 32-bit divide by the page size is a short inline sequence
        pos0_32 = tl.cast(pos0, tl.int32)  # pos0 may be a Python int under the interpreter
        page0 = pos0_32 // PAGE_SIZE  # first logical page of the tile
        slot0 = pos0_32 - page0 * PAGE_SIZE
        n_first = PAGE_SIZE - slot0  # lanes [0, n_first) lie on page0, the rest on page0 + 1
        if IDS is None:
            page0_64 = page0.to(tl.int64)
            # each table entry is read only if some lane of its page is a real token inside the row
            m0 = (pos0_32 < n_valid) & (page0 < n_cols)
            blk0 = _read_ids(bt_row + page0_64 * stride_bt_col, m0, WIDE, max_block)
            if ALIGNED and PAGE_SIZE % BLOCK == 0:
                m1 = m0
                blk1 = blk0
            else:
                m1 = ((page0_64 + 1) * PAGE_SIZE < n_valid) & (page0 + 1 < n_cols)
                blk1 = _read_ids(bt_row + (page0_64 + 1) * stride_bt_col, m1, WIDE, max_block)
        else:
            tl.static_assert(not MASKED, "IDS: block ids read ahead are for unmasked tiles")
            blk0, blk1 = _clamp_ids(IDS[0], max_block), _clamp_ids(IDS[1], max_block)
        if MASKED:
            m_tok = ((pos0_32 + offs) < n_valid) & tl.where(offs < n_first, m0, m1)  # [BLOCK]
        else:
            m_tok = offs >= 0  # [BLOCK] unused
        return blk0, blk1, slot0, n_first, m_tok
    else:
        if (not MASKED) and ALIGNED and BLOCK % PAGE_SIZE == 0:
            # whole pages, every lane real: one table read per page ([BLOCK // PAGE_SIZE]
            # lanes, not [BLOCK]); tile_block_offsets spreads each page's base over its lanes
            if IDS is None:
                pages = pos0 // PAGE_SIZE + tl.arange(0, BLOCK // PAGE_SIZE)  # [NP]
                b_blk = _read_ids(
                    bt_row + pages.to(tl.int64) * stride_bt_col, pages < n_cols, WIDE, max_block
                )
            else:
                b_blk = _clamp_ids(IDS[0], max_block)  # [NP]
            p_slot = offs % PAGE_SIZE  # [BLOCK]
            m_tok = offs >= 0  # [BLOCK] unused
        else:
            if ALIGNED and BLOCK % PAGE_SIZE == 0:
                p_page = pos0 // PAGE_SIZE + offs // PAGE_SIZE  # [BLOCK]
                p_slot = offs % PAGE_SIZE  # [BLOCK] loop-invariant
            else:
                pos = pos0 + offs  # [BLOCK]
                p_page = pos // PAGE_SIZE  # [BLOCK]
                p_slot = pos % PAGE_SIZE  # [BLOCK]
            m_tok = p_page < n_cols  # [BLOCK]
            if MASKED:
                m_tok = m_tok & ((pos0 + offs) < n_valid)  # [BLOCK]
            if IDS is None:
                b_blk = _read_ids(bt_row + p_page.to(tl.int64) * stride_bt_col, m_tok, WIDE, max_block)
            else:
                tl.static_assert(not MASKED, "IDS: block ids read ahead are for unmasked tiles")
                b_blk = _clamp_ids(IDS[0], max_block)  # [BLOCK]
        return b_blk, b_blk, p_slot, 0, m_tok


@triton.jit
def _clamp_ids(x, max_block):
    """Block ids ``x`` clamped to ``[0, max_block]`` (one min, one max), or as given with ``max_block``
    None."""
    if max_block is not None:
        x = tl.maximum(tl.minimum(x, max_block), 0)
    return x


@triton.jit
def _read_ids(p_ids, mask, WIDE: tl.constexpr, max_block):
    """Block-table entries at ``p_ids`` (0 where ``mask`` is off), clamped to ``[0, max_block]`` unless
    ``max_block`` is None, as the offsets' integer type: int64, or int32 with ``WIDE=False``."""
    x = _clamp_ids(tl.load(p_ids, mask=mask, other=0), max_block)
    if WIDE:
        return x.to(tl.int64)
    else:
        return x.to(tl.int32)


@triton.jit
def tile_block_offsets(
    tile,
    stride_block,
    stride_slot,
    BLOCK: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    MASKED: tl.constexpr,
    ALIGNED: tl.constexpr,
):
    """[BLOCK] offsets ``block * stride_block + slot * stride_slot`` (the block ids' type) of a
    :func:`tile_blocks` tile (same ``BLOCK``, ``PAGE_SIZE``, ``MASKED``, ``ALIGNED``) in one cache.

    A tile no wider than a page that lies in one page (always, with ``ALIGNED`` and a page that is a
    multiple of the tile) costs ``blk0 * stride_block + (slot0 + lane) * stride_slot`` per lane; one
    that may cross into the next page takes a per-lane choice between two scalar bases plus ``lane *
    stride_slot`` (a compare, a select and an add per lane). A tile of whole pages (see
    :func:`tile_blocks`) computes each page's base ``blk * stride_block`` once and broadcasts it."""
    blk0, blk1, slot0, n_first, m_tok = tile
    if BLOCK <= PAGE_SIZE:
        offs = tl.arange(0, BLOCK)  # [BLOCK]
        # (slot0 + lane) * stride_slot per lane, not a hoisted lane * stride_slot vector: the
        # multiply is cheaper than the registers a loop-invariant [BLOCK] int64 would hold
        if ALIGNED and PAGE_SIZE % BLOCK == 0:
            b_off = blk0 * stride_block + (slot0 + offs).to(blk0.dtype) * stride_slot  # [BLOCK]
        else:
            b_off = _two_page_offsets(blk0, blk1, slot0, n_first, offs, stride_block, stride_slot)
    elif (not MASKED) and ALIGNED and BLOCK % PAGE_SIZE == 0:
        # tile_blocks read one block id per page ([NP]); each page's base covers its lanes
        NP: tl.constexpr = BLOCK // PAGE_SIZE
        b_base = blk0 * stride_block  # [NP] one base per page, multiplied once per page
        b_base = tl.reshape(tl.broadcast_to(b_base[:, None], (NP, PAGE_SIZE)), (BLOCK,))  # [BLOCK]
        b_off = b_base + slot0.to(blk0.dtype) * stride_slot  # [BLOCK]
    else:
        b_off = blk0 * stride_block + slot0.to(blk0.dtype) * stride_slot  # [BLOCK]
    if MASKED:
        b_off = tl.where(m_tok, b_off, 0)  # [BLOCK]
    return b_off


@triton.jit
def _two_page_offsets(blk0, blk1, slot0, n_first, offs, stride_block, stride_slot):
    """[BLOCK] offsets (the block ids' type) of lanes ``offs`` of a tile whose lanes ``>= n_first`` lie on
    the next page: a per-lane choice between two scalar bases."""
    second = offs >= n_first  # [BLOCK] lanes on the second page
    # lane i on page0: blk0*sb + (slot0 + i)*ss; on page0 + 1: blk1*sb + (i - n_first)*ss
    base0 = blk0 * stride_block + slot0.to(blk0.dtype) * stride_slot
    base1 = blk1 * stride_block - n_first.to(blk0.dtype) * stride_slot
    return tl.where(second, base1, base0) + offs.to(blk0.dtype) * stride_slot  # [BLOCK]


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


@triton.jit
def bad_block_ids(bt_row, stride_bt_col, n_tokens, n_cols, num_blocks, page_size, BLOCK: tl.constexpr = 256):
    """1 (int32) when a block id of the first ``n_tokens`` tokens of a sequence lies outside ``[0,
    num_blocks)``, else 0: the entries of pages ``[0, min(cdiv(n_tokens, page_size), n_cols))`` of its
    block-table row ``bt_row`` (``n_tokens >= 0``, ``page_size >= 1``; entries past the row's width
    ``n_cols`` are never read), ``BLOCK`` entries a step. The check
    :func:`paged_kv_offsets.validate_block_table` makes on the host, for one sequence on the device
    (a kernel's status report; :func:`tile_blocks` clamps the ids it reads whatever this says)."""
    n_pages = tl.minimum(tl.cdiv(n_tokens, page_size), n_cols)
    bad = (n_pages * 0).to(tl.int32)
    for p0 in tl.range(0, n_pages, BLOCK):
        pages = p0 + tl.arange(0, BLOCK)  # [BLOCK]
        ids = tl.load(bt_row + pages.to(tl.int64) * stride_bt_col, mask=pages < n_pages, other=0)  # [BLOCK]
        bad = bad | tl.max(((ids < 0) | (ids >= num_blocks)).to(tl.int32), 0)
    return bad
