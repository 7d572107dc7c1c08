"""paged_kv_offsets 2.0: gathers and offsets through ``tile_blocks`` + ``tile_block_offsets`` against torch.

Every expected value here comes from plain torch, written independently of the helper's page
arithmetic: tensor indexing of the cache for the gathers, and the per-token formula
``block_table[pos // page] * stride_block + (pos % page) * stride_slot`` (padding lanes 0) for the
offsets, for every page size the project cares about against tiles of 16 and 64 positions.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from conftest import DEVICE

from paged_kv_offsets import describe_cache, describe_kv_cache, offsets_fit_int32, pages_needed
from paged_kv_offsets.kernel import dim_offsets, tile_block_offsets, tile_blocks

PAGE_SIZES = [1, 3, 16, 17, 48, 544, 1040, 1056, 2048]
BLOCKS = [16, 64]
FLAGS = [(True, False), (True, True), (False, False), (False, True)]  # (MASKED, ALIGNED)
FLAG_IDS = ["masked", "masked_aligned", "unmasked", "unmasked_aligned"]
LAYOUT_ROLES = [("split", "k"), ("split", "v"), ("nhd", "k"), ("hnd", "k")]
KV_HEADS, HEAD_SIZE, X = 2, 16, 8


def formula(row: torch.Tensor, pos: torch.Tensor, page: int, stride_block: int, stride_slot: int):
    """int64 offsets of positions ``pos`` (any shape) through one block-table row: ``row[pos // page] *
    stride_block + (pos % page) * stride_slot``; pages past the row take its last entry (mask them)."""
    blk = row.long()[(pos // page).clamp(max=row.numel() - 1)]
    return blk * stride_block + (pos % page) * stride_slot


# --- gathers: a small kernel through the helper against torch indexing of the cache ------------------


@triton.jit
def _gather_kernel(
    cache, out, offs_out, block_table, tiles, seq_lens, n_cols, stride_bt_row, stride_bt_col,
    stride_block, stride_slot, stride_head, stride_dim, stride_x, kv_head,
    PAGE_SIZE: tl.constexpr, X: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr, ALIGNED: tl.constexpr,
):  # fmt: skip
    """Program i, for ``(seq, pos0) = tiles[i]``: ``out[i, j, :] = cache[token pos0 + j of seq, kv_head,
    :]`` (0 for padding lanes), ``offs_out[i, j]`` its token offset. As in a kernel's loop, a tile wholly
    inside the sequence takes the unmasked form, the others the masked one."""
    i = tl.program_id(0)
    seq = tl.load(tiles + 2 * i)
    pos0 = tl.load(tiles + 2 * i + 1)
    n_valid = tl.load(seq_lens + seq)
    bt_row = block_table + seq.to(tl.int64) * stride_bt_row
    o_j = tl.arange(0, BLOCK)
    if pos0 + BLOCK <= n_valid:
        t_full = tile_blocks(bt_row, stride_bt_col, pos0, n_valid, n_cols, BLOCK, PAGE_SIZE, False, ALIGNED)
        b_off = tile_block_offsets(t_full, stride_block, stride_slot, BLOCK, PAGE_SIZE, False, ALIGNED)
        m_tok = o_j >= 0
    else:
        t_edge = tile_blocks(bt_row, stride_bt_col, pos0, n_valid, n_cols, BLOCK, PAGE_SIZE, True, ALIGNED)
        b_off = tile_block_offsets(t_edge, stride_block, stride_slot, BLOCK, PAGE_SIZE, True, ALIGNED)
        m_tok = t_edge[4]
    o_d = tl.arange(0, D)
    b_doff = dim_offsets(o_d, stride_dim, stride_x, X)  # [D]
    p_c = cache + b_off[:, None] + kv_head * stride_head + b_doff[None, :]  # [BLOCK, D]
    b_v = tl.load(p_c, mask=m_tok[:, None], other=0.0)  # [BLOCK, D]
    tl.store(out + (i * BLOCK + o_j)[:, None] * D + o_d[None, :], b_v)
    tl.store(offs_out + i * BLOCK + o_j, b_off)


def gather_via_helper(cache, layout, role, block_table, seq_lens, tiles, kv_head, block, aligned, page=None):
    """``[len(tiles), block, head_size]`` values and ``[len(tiles), block]`` offsets of the tiles
    ``(seq, pos0)``."""
    view = describe_cache(cache, layout, role=role)
    n_tiles = tiles.shape[0]
    out = torch.full((n_tiles, block, view.head_size), float("nan"), dtype=cache.dtype, device=DEVICE)
    offs = torch.full((n_tiles, block), -1, dtype=torch.int64, device=DEVICE)
    _gather_kernel[(n_tiles,)](
        cache, out, offs, block_table, tiles.to(DEVICE), seq_lens.to(DEVICE), block_table.shape[1],
        block_table.stride(0), block_table.stride(1), *view.kernel_args(), kv_head,
        PAGE_SIZE=view.page_size if page is None else page, X=view.x, D=view.head_size, BLOCK=block,
        ALIGNED=aligned,
    )  # fmt: skip
    return out.cpu(), offs.cpu()


def gather_via_torch(cache, layout, role, block_table, seq_lens, tiles, block, kv_head):
    """``cache[token pos0 + j of sequence seq, kv_head, :]`` for each tile ``(seq, pos0)`` by plain
    indexing, zeros for padding lanes."""
    page = cache.shape[3] if layout == "split" else (cache.shape[1] if layout == "nhd" else cache.shape[2])
    out = torch.zeros((tiles.shape[0], block, HEAD_SIZE), dtype=cache.dtype)
    for t, (b, pos0) in enumerate(tiles.tolist()):
        pos = pos0 + torch.arange(block)
        real = pos < int(seq_lens[b])
        p = pos[real]
        blk = block_table[b, p // page].long()
        slot = p % page
        if layout == "split" and role == "k":
            vals = cache[blk, kv_head, :, slot, :].reshape(p.numel(), HEAD_SIZE)
        elif layout == "split":
            vals = cache[blk, kv_head, :, slot]
        elif layout == "nhd":
            vals = cache[blk, slot, kv_head]
        else:
            vals = cache[blk, kv_head, slot]
        out[t][real] = vals
    return out


def make_cache(layout, role, num_blocks, page, dtype=torch.float16):
    """A random cache as every second element of the last dimension of a wider buffer (the last stride
    2: stride_x of a split K cache, the slot stride of a split V cache, the feature stride otherwise),
    on the CPU (for the reference) and on the device (sliced there: ``.to()`` of a view copies densely)."""
    if layout == "split" and role == "k":
        shape = (num_blocks, KV_HEADS, HEAD_SIZE // X, page, X)
    elif layout == "split":
        shape = (num_blocks, KV_HEADS, HEAD_SIZE, page)
    elif layout == "nhd":
        shape = (num_blocks, page, KV_HEADS, HEAD_SIZE)
    else:
        shape = (num_blocks, KV_HEADS, page, HEAD_SIZE)
    full = torch.randn((*shape[:-1], 2 * shape[-1]), dtype=torch.float32).to(dtype)
    return full[..., ::2], full.to(DEVICE)[..., ::2]


def make_case(page, seq_lens_list):
    """Block table exactly as wide as the longest sequence needs, with shuffled block ids, allocated
    as the head of a larger buffer whose next element is a huge (bogus) block id; entries past a
    sequence's need hold the same bogus id (a read of any of them shows as a wrong or wild address)."""
    need = [pages_needed(n, page) for n in seq_lens_list]
    width, total = max(need), sum(need)
    num_blocks = total + 3
    ids = torch.randperm(num_blocks)[:total].to(torch.int32)
    flat = torch.full((len(need) * width + 1,), 2**30, dtype=torch.int32)
    table = flat[: len(need) * width].view(len(need), width)
    k = 0
    for b, n in enumerate(need):
        table[b, :n] = ids[k : k + n]
        k += n
    return table, num_blocks


def gather_tiles(page, block, seq_lens_list, aligned):
    """``[T, 2]`` tiles ``(seq, pos0)`` at the edges: each sequence's first tile and one across its end;
    in the last (longest) sequence also a tile past its end and tiles at and across the first page
    boundary; starts rounded down to multiples of ``block`` when ``aligned`` (a kernel's loop)."""
    tiles = set()
    for b, n in enumerate(seq_lens_list):
        starts = {0, n - block // 2}
        if b == len(seq_lens_list) - 1:
            starts |= {n, page - block // 2, page}
        if aligned:
            starts = {s // block * block for s in starts}
        tiles |= {(b, s) for s in starts if s >= 0}
    return torch.tensor(sorted(tiles), dtype=torch.int32)


def check_gather(caches, layout, role, table, seq_lens_list, page, block, table_dev=None):
    """Aligned tiles (kv head 0) and unaligned ones (kv head 1) gather what torch indexing gathers,
    unmasked and masked tiles among them; padding lanes take offset 0."""
    seq_lens = torch.tensor(seq_lens_list, dtype=torch.int32)
    bt = table.to(DEVICE) if table_dev is None else table_dev
    for aligned, kv_head in ((True, 0), (False, 1)):
        tiles = gather_tiles(page, block, seq_lens_list, aligned)
        want = gather_via_torch(caches[0], layout, role, table, seq_lens, tiles, block, kv_head)
        got, offs = gather_via_helper(caches[1], layout, role, bt, seq_lens, tiles, kv_head, block, aligned)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        n = seq_lens.long()[tiles[:, 0].long()]  # [T]
        pos = tiles[:, 1:].long() + torch.arange(block)[None, :]  # [T, block]
        assert bool((tiles[:, 1] + block <= n).any()) and bool((tiles[:, 1] + block > n).any())
        pad = pos >= n[:, None]
        assert bool((offs[pad] == 0).all()), "padding lanes must not take an offset from the table"


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("page", PAGE_SIZES)
@pytest.mark.parametrize("layout,role", LAYOUT_ROLES)
def test_gather_matches_torch(layout, role, page, block):
    """Every layout and role: the kernels' path (tile_blocks + tile_block_offsets + dim_offsets + the
    head stride) reads the tokens torch indexing reads, for aligned and unaligned tiles, unmasked ones
    inside a sequence and masked ones across and past its end."""
    span = max(page, block)
    seq_lens_list = [1, page + 7, 2 * span + 3]
    table, num_blocks = make_case(page, seq_lens_list)
    caches = make_cache(layout, role, num_blocks, page)
    check_gather(caches, layout, role, table, seq_lens_list, page, block)


@pytest.mark.parametrize("page", [3, 16, 544])
def test_negative_control_wrong_page_size(page):
    """The gather's assertion fails when the helper is told a wrong page size."""
    block = 16
    seq_lens_list = [3 * page + 2, 2 * page]
    table, num_blocks = make_case(page, seq_lens_list)
    cache, cache_dev = make_cache("nhd", "k", num_blocks + 1, page)  # spare block: page + 1 reads past one
    seq_lens = torch.tensor(seq_lens_list, dtype=torch.int32)
    tiles = gather_tiles(page, block, seq_lens_list, aligned=False)
    want = gather_via_torch(cache, "nhd", "k", table, seq_lens, tiles, block, 0)
    got, _ = gather_via_helper(
        cache_dev, "nhd", "k", table.to(DEVICE), seq_lens, tiles, 0, block, False, page=page + 1
    )
    with pytest.raises(AssertionError):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_table_dtypes_and_strided_rows(dtype):
    """int32 and int64 tables, as every second column of a wider buffer (column stride 2, row stride
    twice the width, bogus ids in between), address the same tokens."""
    page, block = 17, 16
    seq_lens_list = [40, 17, 1]
    table, num_blocks = make_case(page, seq_lens_list)
    wide = torch.full((table.shape[0], table.shape[1] * 2), 2**30, dtype=dtype)
    wide[:, ::2] = table.to(dtype)
    strided = wide.to(DEVICE)[:, ::2]  # sliced on the device: .to() of a view copies densely
    assert strided.stride() == (2 * table.shape[1], 2)
    caches = make_cache("nhd", "k", num_blocks, page)
    check_gather(caches, "nhd", "k", table, seq_lens_list, page, block, table_dev=strided)


# --- offsets: tile_blocks + tile_block_offsets against the per-token formula --------------------------


@triton.jit
def _tile_kernel(
    block_table, starts, out_a, out_b, n_valid, n_cols, stride_bt_col, stride_block, stride_slot,
    PAGE_SIZE: tl.constexpr, BLOCK: tl.constexpr, MASKED: tl.constexpr, ALIGNED: tl.constexpr,
    WIDE: tl.constexpr,
):  # fmt: skip
    """Row i: tile_block_offsets of positions starts[i] + [0, BLOCK) in two caches (the second with
    strides (stride_block + 16, 2 * stride_slot)) from ONE tile_blocks call; int64 offsets, or int32
    with ``WIDE=False``."""
    i = tl.program_id(0)
    pos0 = tl.load(starts + i)
    o_j = tl.arange(0, BLOCK)
    bt, sc = block_table, stride_bt_col
    tile = tile_blocks(bt, sc, pos0, n_valid, n_cols, BLOCK, PAGE_SIZE, MASKED, ALIGNED, WIDE)
    b_a = tile_block_offsets(tile, stride_block, stride_slot, BLOCK, PAGE_SIZE, MASKED, ALIGNED)
    b_b = tile_block_offsets(tile, stride_block + 16, 2 * stride_slot, BLOCK, PAGE_SIZE, MASKED, ALIGNED)
    if WIDE:
        tl.static_assert(b_a.dtype == tl.int64)
    else:
        tl.static_assert(b_a.dtype == tl.int32)
    tl.store(out_a + i * BLOCK + o_j, b_a.to(tl.int64))
    tl.store(out_b + i * BLOCK + o_j, b_b.to(tl.int64))


def run_tile_kernel(
    table, starts, n_valid, n_cols, stride_block, stride_slot, page, block, masked, aligned, wide=True
):
    """_tile_kernel's two offset tables (CPU int64 [len(starts), block] each), outputs -1-poisoned."""
    out_a = torch.full((len(starts), block), -1, dtype=torch.int64, device=DEVICE)
    out_b = torch.full((len(starts), block), -1, dtype=torch.int64, device=DEVICE)
    _tile_kernel[(len(starts),)](
        table, starts.to(DEVICE), out_a, out_b, n_valid, n_cols, table.stride(0), stride_block, stride_slot,
        PAGE_SIZE=page, BLOCK=block, MASKED=masked, ALIGNED=aligned, WIDE=wide,
    )  # fmt: skip
    return out_a.cpu(), out_b.cpu()


def edge_starts(page, block, n_valid, n_cols, aligned):
    """Tile starts at every edge: page starts/ends, crossings, the sequence end and past it, the table
    row's end and past it."""
    s = {0, 1, page - 1, page, page + 1, 2 * page - block, 2 * page - block + 1}
    s |= {n_valid - 1, n_valid - block, n_valid, n_valid + 5, n_cols * page - 1, n_cols * page}
    s.add((n_cols + 1) * page)
    s |= {k * page + r for k in (1, n_cols - 1) for r in (page // 2, max(page - block // 2, 0))}
    if aligned:
        s = {x // block * block for x in s}
    return torch.tensor(sorted(x for x in s if x >= 0), dtype=torch.int32)


def check_against_formula(got, pos, row, page, n_valid, sb, ss, masked):
    """MASKED: exactly the formula, padding lanes 0. Unmasked (the caller promises real tokens): real
    lanes exact, the others inside block 0 or at their own mapped slot, never a wild address."""
    in_row = pos // page < row.numel()
    real = (pos < n_valid) & in_row
    exact = formula(row, pos, page, sb, ss)
    if masked:
        assert torch.equal(got, torch.where(real, exact, 0))
    else:
        assert torch.equal(got[real], exact[real])
        inside_block0 = (got >= 0) & (got < page * ss)
        assert bool((inside_block0 | (in_row & (got == exact))).all())


def strided_ids(n_cols, low):
    """``n_cols`` distinct block ids from ``low`` up, as a device table row of column stride 2 whose odd
    columns and the columns after the row (read by nothing) hold a negative bogus id: a stray read
    shows as a negative offset."""
    ids = torch.randperm(4 * n_cols)[:n_cols].to(torch.int32) + low
    buf = torch.full((2 * n_cols + 8,), -(2**30), dtype=torch.int32)
    buf[: 2 * n_cols : 2] = ids
    return ids, buf.to(DEVICE)[: 2 * n_cols : 2]  # sliced on the device (.to() of a view is dense)


@pytest.mark.parametrize("masked,aligned", FLAGS, ids=FLAG_IDS)
@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("page", [*PAGE_SIZES, 64])
def test_tile_offsets_match_formula(page, block, masked, aligned):
    """tile_blocks + tile_block_offsets (every form: one page, two pages, one read per lane, one per
    page) against the per-token formula for two caches sharing one set of table reads, block ids above
    2**20 (offsets above 2**31), a strided table row with bogus ids after it."""
    n_cols = 5
    n_valid = n_cols * page - (page // 3)  # the last page partly used
    stride_slot, stride_block = 4096, 4096 * page + 8  # not a multiple of the slot stride
    ids, table = strided_ids(n_cols, 2**20)
    st = edge_starts(page, block, n_valid, n_cols, aligned)
    args = (table, st, n_valid, n_cols, stride_block, stride_slot, page, block, masked, aligned)
    got_a, got_b = run_tile_kernel(*args)
    pos = st[:, None].long() + torch.arange(block)[None, :]
    check_against_formula(got_a, pos, ids, page, n_valid, stride_block, stride_slot, masked)
    check_against_formula(got_b, pos, ids, page, n_valid, stride_block + 16, 2 * stride_slot, masked)
    assert int(got_a.max()) > 2**31


@pytest.mark.parametrize("masked,aligned", FLAGS, ids=FLAG_IDS)
@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("page", [3, 544])
def test_lanes_past_the_table_row_read_nothing(page, block, masked, aligned):
    """A sequence longer than its table row (the host validator rejects it; the device still guards):
    lanes whose page lies past the row never read the table (bogus ids after it): masked, they give
    0; unmasked, an offset inside block 0."""
    n_cols = 3
    n_valid = (n_cols + 2) * page
    stride_slot, stride_block = 4096, 4096 * page + 8
    ids, table = strided_ids(n_cols, 2**20)
    st = {n_cols * page - block, n_cols * page - block // 2, n_cols * page, (n_cols + 1) * page - 1}
    st = torch.tensor(sorted({x // block * block if aligned else x for x in st if x >= 0}), dtype=torch.int32)
    args = (table, st, n_valid, n_cols, stride_block, stride_slot, page, block, masked, aligned)
    got, _ = run_tile_kernel(*args)
    pos = st[:, None].long() + torch.arange(block)[None, :]
    assert bool((pos // page >= n_cols).any())
    check_against_formula(got, pos, ids, page, n_valid, stride_block, stride_slot, masked)


@pytest.mark.parametrize("masked,aligned", [(True, False), (False, True)], ids=["masked", "unmasked_aligned"])
@pytest.mark.parametrize("page", [16, 1056])
def test_offsets_above_2_31_elements(page, masked, aligned):
    """Offsets are int64 all the way: block ids 2**20..2**21 times the block stride of a cache of 8 heads
    of 256 features (offsets up to ~2**36), checked without allocating such a cache."""
    block, n_cols = 16, 64
    stride_slot = 8 * 256  # NHD
    stride_block = page * stride_slot
    ids = torch.randint(2**20, 2**21, (n_cols,), dtype=torch.int32)
    n_valid = n_cols * page
    st = [0, 1, page - 1, page - 8, page, 5 * page + 3, n_valid - block]
    st = torch.tensor(sorted({x // block * block if aligned else x for x in st}), dtype=torch.int32)
    args = (ids.to(DEVICE), st, n_valid, n_cols, stride_block, stride_slot, page, block, masked, aligned)
    got, _ = run_tile_kernel(*args)
    pos = st[:, None].long() + torch.arange(block)[None, :]
    assert torch.equal(got, formula(ids, pos, page, stride_block, stride_slot))
    assert int(got.min()) > 2**31


@pytest.mark.parametrize("wide", [True, False], ids=["int64", "int32"])
@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("page", [1, 2, 4, 8, 16])
def test_whole_pages_tile(page, block, wide):
    """A tile of whole pages (page < tile, aligned, unmasked: one table read per page, each page's base
    spread over its lanes) gives the per-lane form's offsets (the same tiles unmasked but not promised
    aligned) lane by lane, for tiles inside the row, at its end and past it (block 0, never a wild
    address), the formula on the row, and a control: the ids of pages swapped pairwise give other
    offsets."""
    if block <= page:
        pytest.skip("a tile of whole pages needs pages narrower than the tile")
    n_cols = 3 * block // page + 1
    n_valid = n_cols * page
    stride_slot, stride_block = 64, 64 * page + 8
    ids = (torch.randperm(4 * n_cols)[:n_cols] + 1).to(torch.int32)
    st = torch.arange(0, n_cols * page + block, block, dtype=torch.int32)  # aligned; the last past the row
    args = (ids.to(DEVICE), st, n_valid, n_cols, stride_block, stride_slot, page, block)
    whole = run_tile_kernel(*args, masked=False, aligned=True, wide=wide)
    per_lane = run_tile_kernel(*args, masked=False, aligned=False, wide=wide)
    assert torch.equal(whole[0], per_lane[0]) and torch.equal(whole[1], per_lane[1])
    pos = st[:, None].long() + torch.arange(block)[None, :]
    in_row = pos // page < n_cols
    exact = formula(ids, pos, page, stride_block, stride_slot)
    assert torch.equal(whole[0][in_row], exact[in_row])
    assert bool(((whole[0] >= 0) & (whole[0] < page * stride_slot))[~in_row].all())
    swapped = formula(ids, (pos // page ^ 1) * page + pos % page, page, stride_block, stride_slot)
    assert not torch.equal(whole[0][in_row], swapped[in_row])


@triton.jit
def _tile_ids_kernel(
    block_table, starts, out_a, out_b, n_valid, n_cols, stride_bt_col, stride_block, stride_slot,
    PAGE_SIZE: tl.constexpr, BLOCK: tl.constexpr, WIDE: tl.constexpr, SHIFT: tl.constexpr, max_block=None,
):  # fmt: skip
    """Row i: the unmasked, aligned tile at starts[i] addressed twice: out_a from tile_blocks' own table
    reads, out_b from ``IDS`` read raw (``max_block=None``, as a loop's read-ahead) by an unmasked
    tile_blocks call for the tile ``SHIFT`` tiles further (0: the same tile; 1: a control that must
    differ); both with ``max_block``, the own reads clamped as read, ``IDS`` at use."""
    i = tl.program_id(0)
    pos0 = tl.load(starts + i)
    o_j = tl.arange(0, BLOCK)
    bt, sc = block_table, stride_bt_col
    read = tile_blocks(bt, sc, pos0 + SHIFT * BLOCK, n_valid, n_cols, BLOCK, PAGE_SIZE, False, True, WIDE)
    own = tile_blocks(bt, sc, pos0, n_valid, n_cols, BLOCK, PAGE_SIZE, False, True, WIDE, None, max_block)
    ids = (read[0], read[1])
    ahead = tile_blocks(bt, sc, pos0, n_valid, n_cols, BLOCK, PAGE_SIZE, False, True, WIDE, ids, max_block)
    b_a = tile_block_offsets(own, stride_block, stride_slot, BLOCK, PAGE_SIZE, False, True)
    b_b = tile_block_offsets(ahead, stride_block, stride_slot, BLOCK, PAGE_SIZE, False, True)
    tl.store(out_a + i * BLOCK + o_j, b_a.to(tl.int64))
    tl.store(out_b + i * BLOCK + o_j, b_b.to(tl.int64))


@pytest.mark.parametrize("wide", [True, False], ids=["int64", "int32"])
@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("page", [1, 3, 16, 17, 544, 1040])
def test_tile_blocks_ids_read_ahead(page, block, wide):
    """tile_blocks(IDS=...) with the ids of an earlier unmasked call (a loop's block ids read one tile
    ahead) addresses an unmasked aligned tile exactly as tile_blocks' own reads do, lane by lane, for
    tiles inside the row, at its end and past it (the read after a loop's last tile: masked, never
    outside the row), in every form (one page: 16/16, 544/16, 1040/16; two pages: 17/16, 544/64,
    1040/64; one read per lane: 3/*, 17/64; one per page: 1/*, 16/64); and the ids of the next tile
    (a read-ahead one step off) give other offsets."""
    n_cols = 3 * max(block // page, 1) + 2
    n_valid = n_cols * page - (page // 3)
    stride_slot, stride_block = 64, 64 * page + 8
    ids = (torch.randperm(4 * n_cols)[:n_cols] + 1).to(torch.int32)
    table = ids.to(DEVICE)
    # aligned tiles at page edges (the first and last of a page, those across one), at the row's end and
    # past it (the interior of a wide page adds nothing)
    row_end = n_cols * page
    starts = [
        s
        for s in range(0, row_end + 2 * block, block)
        if s % page < block or s // page != (s + block) // page or s >= row_end - 2 * block
    ]
    starts = torch.tensor(starts, dtype=torch.int32).to(DEVICE)
    rows = starts.shape[0]
    outs = {}
    for shift in (0, 1):
        out_a = torch.full((rows, block), -1, dtype=torch.int64, device=DEVICE)
        out_b = torch.full((rows, block), -1, dtype=torch.int64, device=DEVICE)
        _tile_ids_kernel[(rows,)](
            table, starts, out_a, out_b, n_valid, n_cols, table.stride(0), stride_block, stride_slot,
            PAGE_SIZE=page, BLOCK=block, WIDE=wide, SHIFT=shift,
        )  # fmt: skip
        outs[shift] = (out_a.cpu(), out_b.cpu())
    own, ahead = outs[0]
    assert torch.equal(own, ahead)
    pos = starts.cpu()[:, None].long() + torch.arange(block)[None, :]
    real = (pos < n_valid) & (pos // page < n_cols)
    exact = formula(ids, pos, page, stride_block, stride_slot)
    assert torch.equal(ahead[real], exact[real])
    assert bool(((ahead >= 0) & ((ahead < page * stride_slot) | (ahead == exact)))[~real].all())
    own1, off_by_one = outs[1]
    assert torch.equal(own1, own)
    assert not torch.equal(off_by_one[real], exact[real])


@pytest.mark.parametrize("masked,aligned", FLAGS, ids=FLAG_IDS)
@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("page", [1, 17, 1040])
def test_int32_offsets_match_int64(page, block, masked, aligned):
    """``WIDE=False`` (int32 block ids and offsets) gives the int64 offsets lane by lane and the formula,
    in every form (page 1: one read per page or per lane; 17: two pages or per lane; 1040: one page or
    two pages), for two caches that offsets_fit_int32 accepts, the largest offset just under 2**31."""
    n_cols = 5
    n_valid = n_cols * page - (page // 3)
    stride_slot = 64
    stride_block = (2**31 - 1) // (4 * n_cols + 1) // 16 * 16  # the largest block id's page ends below 2**31
    num_blocks = 4 * n_cols + 1
    for sb, ss in ((stride_block, stride_slot), (stride_block + 16, 2 * stride_slot)):
        cache = torch.empty_strided((num_blocks, page), (sb, ss), device="meta")
        assert offsets_fit_int32(cache)
    ids = torch.randperm(4 * n_cols)[:n_cols] + 1
    ids[0] = 4 * n_cols  # the largest block id, on the first page (position 0 is a start)
    ids = ids.to(torch.int32)
    st = edge_starts(page, block, n_valid, n_cols, aligned)
    args = (ids.to(DEVICE), st, n_valid, n_cols, stride_block, stride_slot, page, block, masked, aligned)
    wide, narrow = run_tile_kernel(*args, wide=True), run_tile_kernel(*args, wide=False)
    assert torch.equal(wide[0], narrow[0]) and torch.equal(wide[1], narrow[1])
    pos = st[:, None].long() + torch.arange(block)[None, :]
    check_against_formula(narrow[0], pos, ids, page, n_valid, stride_block, stride_slot, masked)
    assert int(narrow[1].max()) > 2**30


def test_offsets_fit_int32():
    """The host check behind ``WIDE=False``: the largest element offset of each tensor below 2**31."""
    meta = {"device": "meta", "dtype": torch.bfloat16}
    assert offsets_fit_int32(torch.empty(2**31 - 1, **meta), torch.empty(16, 4, **meta))
    assert not offsets_fit_int32(torch.empty(2**31 + 1, **meta))
    assert not offsets_fit_int32(torch.empty(4, **meta), torch.empty(2**31 + 1, **meta))  # any of them
    assert offsets_fit_int32(torch.empty(0, 2**40, **meta))  # empty: nothing to address
    big_view = torch.empty(2, 2**30 + 8, **meta)[:, :8]  # 16 elements, the second row 2**30 + 8 away
    assert offsets_fit_int32(big_view)
    assert not offsets_fit_int32(torch.empty(3, 2**30 + 8, **meta)[:, :8])  # 2 * (2**30 + 8) + 7
    with pytest.raises(TypeError, match="tensors"):
        offsets_fit_int32([1, 2])


def test_describe_rejects_wrong_rank():
    with pytest.raises(ValueError, match="k_cache"):
        describe_cache(torch.zeros(2, 3, 4), "nhd", role="k")
    with pytest.raises(ValueError, match="layout"):
        describe_cache(torch.zeros(2, 3, 4, 5), "bogus", role="k")
    with pytest.raises(TypeError, match="k_cache"):
        describe_cache([1, 2], "nhd", role="k")
    k = torch.zeros(4, 2, 2, 16, 8)
    v = torch.zeros(4, 2, 16, 32)  # page 32 != 16
    with pytest.raises(ValueError, match="page_size"):
        describe_kv_cache(k, v, "split")


@pytest.mark.parametrize("wide", [True, False], ids=["int64", "int32"])
@pytest.mark.parametrize("page,block", [(16, 16), (17, 16), (3, 16), (16, 64), (544, 64)])
def test_read_ahead_ids_are_clamped_at_use(page, block, wide):
    """Block ids read ahead raw (``max_block=None``, as a loop's read-ahead carries them) and passed as
    ``IDS`` with ``max_block`` address the tile exactly as tile_blocks' own clamped reads do, and a table
    whose ids lie outside ``[0, num_blocks)`` (negative, past the cache) gives offsets inside the cache
    (every lane's block in ``[0, max_block]``) in every tile form; the well-formed ids are unchanged."""
    num_blocks = 6
    n_cols = 3 * max(block // page, 1) + 2
    n_valid = n_cols * page
    stride_slot, stride_block = 64, 64 * page + 8
    ids = torch.randint(0, num_blocks, (n_cols,), dtype=torch.int32)
    ids[::3] = torch.tensor([-5, num_blocks, 2**30], dtype=torch.int32).repeat(n_cols)[: ids[::3].numel()]
    table = ids.to(DEVICE)
    starts = torch.arange(0, n_valid - block + 1, block, dtype=torch.int32)
    rows = starts.shape[0]
    out_a = torch.full((rows, block), -1, dtype=torch.int64, device=DEVICE)
    out_b = torch.full((rows, block), -1, dtype=torch.int64, device=DEVICE)
    _tile_ids_kernel[(rows,)](
        table, starts.to(DEVICE), out_a, out_b, n_valid, n_cols, table.stride(0), stride_block, stride_slot,
        PAGE_SIZE=page, BLOCK=block, WIDE=wide, SHIFT=0, max_block=num_blocks - 1,
    )  # fmt: skip
    own, ahead = out_a.cpu(), out_b.cpu()
    assert torch.equal(own, ahead)
    pos = starts[:, None].long() + torch.arange(block)[None, :]
    exact = formula(ids.clamp(0, num_blocks - 1), pos, page, stride_block, stride_slot)
    assert torch.equal(ahead, exact)
    assert bool(((ahead >= 0) & (ahead < num_blocks * stride_block)).all())
    good = (ids[(pos // page)] >= 0) & (ids[(pos // page)] < num_blocks)
    assert torch.equal(ahead[good], formula(ids, pos, page, stride_block, stride_slot)[good])
