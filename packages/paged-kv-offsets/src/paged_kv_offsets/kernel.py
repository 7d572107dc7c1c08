"""Triton device functions: the one place that turns (block table, position, page size) into offsets.

Every kernel in this repository that reads a paged KV cache calls :func:`token_offsets` (any
positions) or :func:`tile_blocks` + :func:`tile_block_offsets` (a run of consecutive positions; one
set of table reads for K and V) for the per-token part of an address and :func:`dim_offsets` for the
per-feature part, and adds ``kv_head * stride_head``.
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

Offsets are int64 from the block id on, so caches above 2**31 elements address correctly; the tile
functions (:func:`tile_blocks`, :func:`page_walk_rest_group`) take ``WIDE=False`` for int32 block ids
and per-token offsets instead, which a caller may pass only when every element of the cache lies
less than 2**31 elements from its start (checked on the host:
:func:`paged_kv_offsets.offsets_fit_int32`), to save the 64-bit integer work per lane (the caller
then adds them to its int64 head and feature offsets).
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
def tile_blocks(
    bt_row,
    stride_bt_col,
    pos0,
    n_valid,
    n_cols,
    page_size,
    BLOCK: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    MASKED: tl.constexpr,
    ALIGNED: tl.constexpr,
    IN_PAGE: tl.constexpr = False,
    WIDE: tl.constexpr = True,
    PAGE_VECTOR: tl.constexpr = False,
    IDS=None,
):
    """The block-table reads of the consecutive positions ``pos0 + [0, BLOCK)`` (``0 <= pos0 < 2**31 -
    BLOCK``, as every position of a sequence with an int32 length), as a
    tuple ``tile`` for :func:`tile_block_offsets` (one call per cache: K and V share these reads).

    The page size is the constexpr ``PAGE_SIZE`` or, with ``PAGE_SIZE == 0``, the runtime
    ``page_size`` (then ``BLOCK <= page_size`` is required: the caller checks it on the host). A
    runtime page size compiles one kernel for every page at least as wide as the tile, so a page of
    544 or 1040 runs the very instructions a page of 512 or 1024 runs (and nothing recompiles when a
    model with another page size arrives). The price: one scalar divide per tile, and every tile takes
    the two-page form of :func:`tile_block_offsets` (on the H200 that made pages 512/1024/2048 as slow
    as 544/1040/1056 with a constexpr page: bench/results/NOTES.md, step 10).

    * tile no wider than a page (``PAGE_SIZE == 0`` or ``BLOCK <= PAGE_SIZE``): the tile touches at
      most two pages, so one scalar divide of ``pos0`` and two scalar (masked) table loads serve the
      whole tile. ``tile = (blk0, blk1, slot0, n_first, m_tok)``: the blocks of the two pages, the
      slot of ``pos0`` in the first, how many lanes lie on the first page, the lane mask.
    * ``BLOCK > PAGE_SIZE > 0``: one table load per lane (shared by K and V). ``tile = (blk, blk,
      slot, 0, m_tok)`` with ``blk``/``slot`` [BLOCK]. With ``PAGE_VECTOR`` (and ``MASKED=False``,
      ``ALIGNED``, ``BLOCK % PAGE_SIZE == 0``: a tile of whole pages) one table load per page instead:
      ``blk`` is [BLOCK // PAGE_SIZE] and :func:`tile_block_offsets` (same ``PAGE_VECTOR``) spreads
      each page's base over its lanes (the kernels' per-lane table gathers, one per cache layout, and
      their shared-memory reads become one small gather).

    ``MASKED=False`` is for tiles whose lanes are all real tokens (``pos < n_valid``): the lane mask
    is then the table-row bound alone (``page < n_cols``), and with a tile no wider than a page not
    even that (a lane past the row reads block 0: an address inside any non-empty cache, never
    outside). ``ALIGNED`` promises ``pos0 % BLOCK == 0``: with a constexpr ``PAGE_SIZE % BLOCK == 0``
    a tile then never crosses a page (one table load), with ``BLOCK % PAGE_SIZE == 0`` the page and
    slot of every lane are a constant vector plus ``pos0 // PAGE_SIZE``. ``IN_PAGE`` (needs ``BLOCK <=
    PAGE_SIZE``) promises that every lane below ``n_valid`` lies on the page of ``pos0`` (the tiles of
    a :func:`page_walk_bounds` walk): one table load, and the one-page offsets. The table entries read
    are those :func:`token_offsets` reads for the same lanes; padding lanes (``MASKED``) give offset 0.
    Block ids come back int64, or int32 with ``WIDE=False`` (module docstring); the offsets of
    :func:`tile_block_offsets` take their type.

    ``IDS`` (``MASKED=False`` only): ``(tile[0], tile[1])`` of an earlier call for this same tile,
    same arguments (a loop reads the next tile's ids one iteration ahead and carries them, so no
    iteration waits on the table right before its copies; the read for the tile after the loop's
    last stays masked, never outside the row): no table read here, the rest of the tuple as without.
    """
    offs = tl.arange(0, BLOCK)  # [BLOCK]
    if IN_PAGE:
        tl.static_assert(BLOCK <= PAGE_SIZE, "IN_PAGE needs a tile no wider than a constexpr page")
    if PAGE_SIZE == 0 or BLOCK <= PAGE_SIZE:
        if PAGE_SIZE == 0:
            page = page_size
        else:
            page = PAGE_SIZE
        # int32 on purpose: a 64-bit divide by a runtime page size is a slow software routine (seen
        # on the H200: 8-17% of the whole kernel), a 32-bit one a short inline sequence
        pos0_32 = tl.cast(pos0, tl.int32)  # pos0 may be a Python int under the interpreter
        page0 = pos0_32 // page  # first logical page of the tile
        slot0 = pos0_32 - page0 * page
        n_first = page - slot0  # lanes [0, n_first) lie on page0, the rest on page0 + 1
        if IDS is None:
            page0_64 = page0.to(tl.int64)
            # each table entry is read only if some lane of its page is a real token inside the row
            m0 = (pos0_32 < n_valid) & (page0 < n_cols)
            blk0 = _index(tl.load(bt_row + page0_64 * stride_bt_col, mask=m0, other=0), WIDE)
            if IN_PAGE or (ALIGNED and PAGE_SIZE > 0 and PAGE_SIZE % BLOCK == 0):
                m1 = m0
                blk1 = blk0
            else:
                m1 = ((page0_64 + 1) * page < n_valid) & (page0 + 1 < n_cols)
                blk1 = _index(tl.load(bt_row + (page0_64 + 1) * stride_bt_col, mask=m1, other=0), WIDE)
        else:
            tl.static_assert(not MASKED, "IDS: block ids read ahead are for unmasked tiles")
            blk0, blk1 = IDS
        if MASKED:
            m_tok = ((pos0_32 + offs) < n_valid) & tl.where(offs < n_first, m0, m1)  # [BLOCK]
        else:
            m_tok = offs >= 0  # [BLOCK] unused
        return blk0, blk1, slot0, n_first, m_tok
    else:
        if PAGE_VECTOR and (not MASKED) and ALIGNED and BLOCK % PAGE_SIZE == 0:
            # whole pages, every lane real: one table read per page ([BLOCK // PAGE_SIZE]
            # lanes, not [BLOCK]); tile_block_offsets spreads each page's base over its lanes
            if IDS is None:
                pages = pos0 // PAGE_SIZE + tl.arange(0, BLOCK // PAGE_SIZE)  # [NP]
                b_blk = _index(
                    tl.load(bt_row + pages.to(tl.int64) * stride_bt_col, mask=pages < n_cols, other=0), WIDE
                )  # [NP]
            else:
                b_blk = IDS[0]  # [NP]
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
                b_blk = _index(
                    tl.load(bt_row + p_page.to(tl.int64) * stride_bt_col, mask=m_tok, other=0), WIDE
                )
            else:
                tl.static_assert(not MASKED, "IDS: block ids read ahead are for unmasked tiles")
                b_blk = IDS[0]  # [BLOCK]
        return b_blk, b_blk, p_slot, 0, m_tok


@triton.jit
def _index(x, WIDE: tl.constexpr):
    """Block ids as the offsets' integer type: int64, or int32 with ``WIDE=False``."""
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
    BRANCH: tl.constexpr,
    BASES: tl.constexpr,
    IN_PAGE: tl.constexpr = False,
    PAGE_VECTOR: tl.constexpr = False,
):
    """[BLOCK] offsets ``block * stride_block + slot * stride_slot`` (the block ids' type) of a :func:`tile_blocks`
    tile (same ``BLOCK``, ``PAGE_SIZE``, ``MASKED``, ``ALIGNED``) in one cache.

    A tile no wider than a page that lies in one page (always, with ``ALIGNED`` and a constexpr page
    that is a multiple of the tile) costs ``blk0 * stride_block + (slot0 + lane) * stride_slot`` per
    lane; one that may cross into the next page selects block and slot per lane (a compare, three
    selects and a 64-bit multiply more). ``BRANCH`` tests the scalar ``n_first >= BLOCK`` (does this
    tile cross?) and takes the one-page form when it does not: a branch uniform over the program, so
    only tiles that straddle a page boundary pay for the selects. ``BASES`` computes the two-page form
    as a per-lane choice between two scalar bases plus ``lane * stride_slot`` (a compare, a 64-bit
    select and an add per lane instead of three selects and a 64-bit multiply). ``IN_PAGE`` (as for
    :func:`tile_blocks`) always takes the one-page form. ``PAGE_VECTOR``: as :func:`tile_blocks` (one
    block id per page; each page's base ``blk * stride_block`` is computed once and broadcast)."""
    blk0, blk1, slot0, n_first, m_tok = tile
    if PAGE_SIZE == 0 or BLOCK <= PAGE_SIZE:
        offs = tl.arange(0, BLOCK)  # [BLOCK]
        # (slot0 + lane) * stride_slot per lane, not a hoisted lane * stride_slot vector: the
        # multiply is cheaper than the registers a loop-invariant [BLOCK] int64 would hold
        if IN_PAGE or (ALIGNED and PAGE_SIZE > 0 and PAGE_SIZE % BLOCK == 0):
            b_off = blk0 * stride_block + (slot0 + offs).to(blk0.dtype) * stride_slot  # [BLOCK]
        elif BRANCH:
            if n_first >= BLOCK:  # the whole tile lies on page0
                b_off = blk0 * stride_block + (slot0 + offs).to(blk0.dtype) * stride_slot  # [BLOCK]
            else:
                b_off = _two_page_offsets(blk0, blk1, slot0, n_first, offs, stride_block, stride_slot, BASES)
        else:
            b_off = _two_page_offsets(blk0, blk1, slot0, n_first, offs, stride_block, stride_slot, BASES)
    elif PAGE_VECTOR and (not MASKED) and ALIGNED and BLOCK % PAGE_SIZE == 0:
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
def _two_page_offsets(blk0, blk1, slot0, n_first, offs, stride_block, stride_slot, BASES: tl.constexpr):
    """[BLOCK] offsets (the block ids' type) of lanes ``offs`` of a tile whose lanes ``>= n_first`` lie on
    the next page."""
    second = offs >= n_first  # [BLOCK] lanes on the second page
    if BASES:
        # lane i on page0: blk0*sb + (slot0 + i)*ss; on page0 + 1: blk1*sb + (i - n_first)*ss
        base0 = blk0 * stride_block + slot0.to(blk0.dtype) * stride_slot
        base1 = blk1 * stride_block - n_first.to(blk0.dtype) * stride_slot
        return tl.where(second, base1, base0) + offs.to(blk0.dtype) * stride_slot  # [BLOCK]
    else:
        b_blk = tl.where(second, blk1, blk0)  # [BLOCK]
        b_slot = tl.where(second, offs - n_first, slot0 + offs)  # [BLOCK] (page = n_first + slot0)
        return b_blk * stride_block + b_slot.to(blk0.dtype) * stride_slot  # [BLOCK]


# ---- page walks: tiles that never cross a page, for any page at least as wide as the tile ----
#
# A page of PAGE_SIZE = Q * BLOCK + R tokens (Q = PAGE_SIZE // BLOCK >= 1) is walked as Q full tiles
# of BLOCK tokens at page offsets 0, BLOCK, ..., (Q - 1) * BLOCK and, when R > 0, one rest tile of the
# last R tokens. "Walk index" g numbers all of them in position order, G = ceil(PAGE_SIZE / BLOCK)
# per page: g = page * G + w, the rest tile of a page being w = Q. A kernel walks the full tiles
# (index t = page * Q + w) and the rest tiles (index = page) in two loops of fixed-width tiles, each
# tile on one page, so every address takes the one-page form (tile_blocks IN_PAGE). With R == 0 the
# walk is the plain aligned tiling (no rest tiles), indexed per tile instead of per position.
# See walk.page_walk_rest_block for the rest tile's width.


@triton.jit
def _walk_index(x, BLOCK: tl.constexpr, PAGE_SIZE: tl.constexpr, ROUND_UP: tl.constexpr):
    """Walk index of the first tile that starts at or after position ``x`` (``ROUND_UP``), or of
    the first tile that ends after ``x`` (= how many tiles end at or before ``x``); ``x >= 0``."""
    G: tl.constexpr = (PAGE_SIZE + BLOCK - 1) // BLOCK
    page = x // PAGE_SIZE
    off = x - page * PAGE_SIZE  # [0, PAGE_SIZE)
    if ROUND_UP:
        w = (off + (BLOCK - 1)) // BLOCK  # Q + 1 inside the rest: the next page's first tile
    else:
        w = off // BLOCK  # Q inside the rest: the rest tile itself
    return page * G + w


@triton.jit
def page_walk_bounds(need_lo, need_hi, full_lo, full_hi, BLOCK: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """Walk indices ``(g_lo, g_a, g_b, g_hi)`` of the tiles a reader of positions ``[need_lo,
    need_hi)`` needs (``g_lo <= g < g_hi``), of which ``[g_a, g_b)`` lie wholly inside ``[full_lo,
    full_hi)`` (tiles a kernel may read without masks). Scalars, ``0 <= need_lo``, ``0 <= full_lo``,
    int32 positions; needs ``PAGE_SIZE >= BLOCK`` (both constexpr)."""
    tl.static_assert(PAGE_SIZE >= BLOCK, "page walks need a page at least as wide as the tile")
    g_lo = _walk_index(need_lo, BLOCK, PAGE_SIZE, False)
    g_hi = tl.where(need_hi > need_lo, _walk_index(tl.maximum(need_hi, 0), BLOCK, PAGE_SIZE, True), g_lo)
    g_a = tl.minimum(tl.maximum(_walk_index(full_lo, BLOCK, PAGE_SIZE, True), g_lo), g_hi)
    g_b = tl.minimum(tl.maximum(_walk_index(tl.maximum(full_hi, 0), BLOCK, PAGE_SIZE, False), g_a), g_hi)
    return g_lo, g_a, g_b, g_hi


@triton.jit
def page_walk_tile(g, BLOCK: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """``(pos0, page_end)`` of walk tile ``g``: its first position and the end of its page (a
    full tile holds ``[pos0, pos0 + BLOCK)``, a rest tile ``[pos0, page_end)``)."""
    G: tl.constexpr = (PAGE_SIZE + BLOCK - 1) // BLOCK
    page = g // G
    return page * PAGE_SIZE + (g - page * G) * BLOCK, (page + 1) * PAGE_SIZE


@triton.jit
def page_walk_split(g_a, g_b, BLOCK: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """The walk tiles ``[g_a, g_b)`` as ``(t_a, t_b, p_a, p_b)``: full tiles ``t_a <= t < t_b``
    (:func:`page_walk_full`) and the rest tiles of pages ``p_a <= p < p_b`` (:func:`page_walk_rest`;
    none when the page is a multiple of the tile)."""
    Q: tl.constexpr = PAGE_SIZE // BLOCK
    if PAGE_SIZE % BLOCK == 0:
        t_a = g_a
        t_b = g_b
        p_a = g_a * 0
        p_b = g_a * 0
    else:
        G: tl.constexpr = Q + 1
        p_a = g_a // G
        p_b = g_b // G
        t_a = p_a * Q + tl.minimum(g_a - p_a * G, Q)
        t_b = p_b * Q + tl.minimum(g_b - p_b * G, Q)
    return t_a, t_b, p_a, p_b


@triton.jit
def page_walk_full(t, BLOCK: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """First position of full tile ``t`` of a walk (``BLOCK`` tokens, all on one page)."""
    Q: tl.constexpr = PAGE_SIZE // BLOCK
    page = t // Q
    return page * PAGE_SIZE + (t - page * Q) * BLOCK


@triton.jit
def page_walk_rest(page, BLOCK: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """``(pos0, page_end)`` of the rest tile of ``page``: the page's last ``PAGE_SIZE % BLOCK`` tokens."""
    Q: tl.constexpr = PAGE_SIZE // BLOCK
    return page * PAGE_SIZE + Q * BLOCK, (page + 1) * PAGE_SIZE


@triton.jit
def page_walk_rest_group(
    bt_row,
    stride_bt_col,
    page0,
    page_end,
    BLOCK: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    WIDE: tl.constexpr = True,
):
    """The rest tiles of pages ``page0, page0 + 1, ...`` (those below ``page_end``; ``page0 <
    page_end``) side by side in ONE tile of ``BLOCK`` lanes: ``R = PAGE_SIZE % BLOCK`` lanes per page,
    ``BLOCK // R`` pages per tile (needs ``R`` to divide ``BLOCK``, e.g. pages 544/1056 with tiles of
    128: 4 pages of 32 lanes; 1040: 8 pages of 16). A walk then takes ``ceil(rests / (BLOCK // R))``
    full-width iterations for its rest tiles instead of one narrow iteration per page.

    Returns ``(pos, blk, slot, valid)``, all ``[BLOCK]``: lane ``i`` holds slot ``Q * BLOCK + i % R``
    (``Q = PAGE_SIZE // BLOCK``) of page ``page0 + i // R``, at position ``pos``, in cache block
    ``blk`` (int64; int32 with ``WIDE=False``). Lanes of pages at or past ``page_end`` (``valid`` False) repeat the lanes of page
    ``page_end - 1``: every lane addresses a slot of a page the walk needs, so the K/V loads need no
    mask and keep their ``R``-token runs (a caller masks those lanes' logits), and the block table is
    read only for needed pages. Offsets: :func:`lane_offsets`."""
    R: tl.constexpr = PAGE_SIZE % BLOCK
    tl.static_assert(R > 0 and BLOCK % R == 0, "rest groups need PAGE_SIZE % BLOCK to divide BLOCK")
    offs = tl.arange(0, BLOCK)  # [BLOCK]
    page = page0 + offs // R  # [BLOCK]
    valid = page < page_end  # [BLOCK]
    page = tl.minimum(page, page_end - 1)  # [BLOCK]
    slot = (PAGE_SIZE - R) + offs % R  # [BLOCK]
    blk = _index(tl.load(bt_row + page.to(tl.int64) * stride_bt_col), WIDE)  # [BLOCK]
    return page * PAGE_SIZE + slot, blk, slot, valid


@triton.jit
def lane_offsets(blk, slot, stride_block, stride_slot):
    """[N] offsets ``blk * stride_block + slot * stride_slot`` (the type of ``blk``) of per-lane blocks
    and slots (:func:`page_walk_rest_group`)."""
    return blk * stride_block + slot.to(blk.dtype) * stride_slot


@triton.jit
def tile_pages(bt_row, stride_bt_col, pos0, n_valid, n_cols, BLOCK: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """``(block, slot)``, both [BLOCK] int64, of the consecutive positions ``pos0 + [0, BLOCK)``
    (``pos0 >= 0``; requires ``BLOCK <= PAGE_SIZE``). Padding lanes (the :func:`token_mask` rule)
    give ``(0, 0)``. The per-lane form of :func:`tile_blocks` (kept from 1.1; kernels should prefer
    :func:`tile_blocks` + :func:`tile_block_offsets`, which never forms a per-lane block id)."""
    tl.static_assert(BLOCK <= PAGE_SIZE, "tile_pages needs BLOCK <= PAGE_SIZE (use token_offsets)")
    blk0, blk1, slot0, n_first, m_tok = tile_blocks(
        bt_row, stride_bt_col, pos0, n_valid, n_cols, PAGE_SIZE, BLOCK, PAGE_SIZE, True, False
    )
    offs = tl.arange(0, BLOCK)  # [BLOCK]
    second = offs >= n_first  # [BLOCK]
    slot = (slot0 + offs).to(tl.int64)  # [BLOCK]
    b_block = tl.where(m_tok, tl.where(second, blk1, blk0), 0)  # [BLOCK]
    b_slot = tl.where(m_tok, tl.where(second, slot - PAGE_SIZE, slot), 0)  # [BLOCK]
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
    values and masking of :func:`token_offsets` on those positions, for any ``BLOCK`` and page size
    (:func:`tile_blocks` + :func:`tile_block_offsets`, masked, no alignment promised)."""
    tile = tile_blocks(bt_row, stride_bt_col, pos0, n_valid, n_cols, PAGE_SIZE, BLOCK, PAGE_SIZE, True, False)
    return tile_block_offsets(tile, stride_block, stride_slot, BLOCK, PAGE_SIZE, True, False, False, False)


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
