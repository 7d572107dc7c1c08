"""paged_kv_offsets: a small Triton gather kernel through the helper must match a plain torch gather.

The torch gather below is written independently of the helper (its own page arithmetic), for every
page size the project cares about and every accepted layout.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from conftest import DEVICE

from paged_kv_offsets import (
    describe_cache,
    describe_kv_cache,
    offsets_fit_int32,
    page_walk_rest_block,
    pages_needed,
)
from paged_kv_offsets.kernel import (
    dim_offsets,
    lane_offsets,
    page_walk_bounds,
    page_walk_full,
    page_walk_rest,
    page_walk_rest_group,
    page_walk_split,
    page_walk_tile,
    tile_block_offsets,
    tile_blocks,
    tile_offsets,
    token_mask,
    token_offsets,
)

PAGE_SIZES = [1, 3, 16, 17, 544, 1040, 1056, 2048]
LAYOUT_ROLES = [("split", "k"), ("split", "v"), ("nhd", "k"), ("hnd", "k")]
KV_HEADS, HEAD_SIZE, X = 2, 16, 8


@triton.jit
def _gather_kernel(
    cache,
    out,
    offs_out,
    block_table,
    positions,
    seq_lens,
    n_pos,
    n_cols,
    stride_bt_row,
    stride_bt_col,
    stride_block,
    stride_slot,
    stride_head,
    stride_dim,
    stride_x,
    kv_head,
    PAGE_SIZE: tl.constexpr,
    X: tl.constexpr,
    D: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """out[seq, i, :] = cache[token at positions[i] of sequence seq, kv_head, :] (0 for padding lanes)."""
    seq = tl.program_id(0)
    i_blk = tl.program_id(1)
    o_i = i_blk * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    m_i = o_i < n_pos
    b_pos = tl.load(positions + o_i, mask=m_i, other=0)  # [BLOCK]
    n_valid = tl.load(seq_lens + seq)
    bt_row = block_table + seq.to(tl.int64) * stride_bt_row
    b_off = token_offsets(bt_row, stride_bt_col, b_pos, n_valid, n_cols, stride_block, stride_slot, PAGE_SIZE)
    m_tok = token_mask(b_pos, n_valid, n_cols, PAGE_SIZE) & m_i  # [BLOCK]
    o_d = tl.arange(0, D)
    b_doff = dim_offsets(o_d, stride_dim, stride_x, X)  # [D]
    p_c = cache + b_off[:, None] + kv_head * stride_head + b_doff[None, :]  # [BLOCK, D]
    b_v = tl.load(p_c, mask=m_tok[:, None], other=0.0)  # [BLOCK, D]
    p_o = out + (seq * n_pos + o_i)[:, None] * D + o_d[None, :]
    tl.store(p_o, b_v, mask=m_i[:, None])
    tl.store(offs_out + seq * n_pos + o_i, b_off, mask=m_i)


def gather_via_helper(cache, layout, role, block_table, seq_lens, positions, kv_head, page_size=None):
    view = describe_cache(cache, layout, role=role)
    page = view.page_size if page_size is None else page_size
    batch, n_pos = seq_lens.numel(), positions.numel()
    out = torch.full((batch, n_pos, view.head_size), float("nan"), dtype=cache.dtype, device=cache.device)
    offs = torch.full((batch, n_pos), -1, dtype=torch.int64, device=cache.device)
    BLOCK = 32
    _gather_kernel[(batch, triton.cdiv(n_pos, BLOCK))](
        cache, out, offs, block_table, positions, seq_lens, n_pos, block_table.shape[1],
        block_table.stride(0), block_table.stride(1), *view.kernel_args(), kv_head,
        PAGE_SIZE=page, X=view.x, D=view.head_size, BLOCK=BLOCK,
    )  # fmt: skip
    return out, offs


def gather_via_torch(cache, layout, role, block_table, seq_lens, positions, kv_head):
    """Independent gather: plain indexing per token, zeros for padding lanes."""
    batch, n_pos = seq_lens.numel(), positions.numel()
    out = torch.zeros((batch, n_pos, HEAD_SIZE), dtype=cache.dtype)
    page = cache.shape[3] if layout == "split" else (cache.shape[1] if layout == "nhd" else cache.shape[2])
    for b in range(batch):
        for i, p in enumerate(positions.tolist()):
            if p >= int(seq_lens[b]):
                continue
            blk = int(block_table[b, p // page])
            slot = p % page
            if layout == "split" and role == "k":
                out[b, i] = cache[blk, kv_head, :, slot, :].reshape(-1)
            elif layout == "split":
                out[b, i] = cache[blk, kv_head, :, slot]
            elif layout == "nhd":
                out[b, i] = cache[blk, slot, kv_head]
            else:
                out[b, i] = cache[blk, kv_head, slot]
    return out


def make_cache(layout, role, num_blocks, page, dtype=torch.float16, device=DEVICE):
    if layout == "split" and role == "k":
        shape = (num_blocks, KV_HEADS, HEAD_SIZE // X, page, X)
    elif layout == "split":
        shape = (num_blocks, KV_HEADS, HEAD_SIZE, page)
    elif layout == "nhd":
        shape = (num_blocks, page, KV_HEADS, HEAD_SIZE)
    else:
        shape = (num_blocks, KV_HEADS, page, HEAD_SIZE)
    return torch.randn(shape, dtype=torch.float32, device=device).to(dtype)


def make_case(page, seq_lens_list):
    """Block table exactly as wide as the longest sequence needs, with shuffled block ids,
    allocated as the tail of a larger buffer whose next element is a huge (bogus) block id."""
    need = [pages_needed(n, page) for n in seq_lens_list]
    width = max(need)
    total = sum(need)
    num_blocks = total + 3
    ids = torch.randperm(num_blocks)[:total]
    flat = torch.full((len(seq_lens_list) * width + 1,), 2**30, dtype=torch.int32)
    table = flat[: len(seq_lens_list) * width].view(len(seq_lens_list), width)
    k = 0
    for b, n in enumerate(need):
        table[b, :n] = ids[k : k + n].to(torch.int32)
        table[b, n:] = 2**30  # entries past a sequence's need are garbage: must be ignored
        k += n
    return table, num_blocks


def positions_for(page, max_len):
    """Positions crossing page boundaries, plus padding lanes past every sequence."""
    pts = {0, max_len - 1, max_len, max_len + 5}
    for m in range(1, 4):
        for d in (-1, 0, 1):
            pts.add(m * page + d)
    pts |= set(torch.randint(0, max_len, (24,)).tolist())
    return torch.tensor(sorted(p for p in pts if p >= 0), dtype=torch.int32)


@pytest.mark.parametrize("layout,role", LAYOUT_ROLES)
@pytest.mark.parametrize("page", PAGE_SIZES)
def test_gather_matches_torch(layout, role, page):
    seq_lens_list = [1, 2 * page + 3, page, 3 * page - 1] if page < 1000 else [1, page + 7, 2 * page]
    table, num_blocks = make_case(page, seq_lens_list)
    cache = make_cache(layout, role, num_blocks, page)
    seq_lens = torch.tensor(seq_lens_list, dtype=torch.int32)
    positions = positions_for(page, max(seq_lens_list))
    for kv_head in range(KV_HEADS):
        want = gather_via_torch(cache.cpu(), layout, role, table, seq_lens, positions, kv_head)
        got, offs = gather_via_helper(
            cache, layout, role, table.to(DEVICE), seq_lens.to(DEVICE), positions.to(DEVICE), kv_head
        )
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
        pad = positions[None, :].expand(len(seq_lens_list), -1) >= seq_lens[:, None]
        assert (offs.cpu()[pad] == 0).all(), "padding lanes must not take an offset from the table"


@pytest.mark.parametrize("page", [3, 16, 544])
def test_negative_control_wrong_page_size(page):
    """The same assertion must fail when the helper is told a wrong page size."""
    seq_lens_list = [3 * page + 2, 2 * page]
    table, num_blocks = make_case(page, seq_lens_list)
    cache = make_cache("nhd", "k", num_blocks, page)
    seq_lens = torch.tensor(seq_lens_list, dtype=torch.int32)
    positions = positions_for(page, max(seq_lens_list))
    want = gather_via_torch(cache.cpu(), "nhd", "k", table, seq_lens, positions, 0)
    got, _ = gather_via_helper(
        cache, "nhd", "k", table.to(DEVICE), seq_lens.to(DEVICE), positions.to(DEVICE), 0, page_size=page + 1
    )
    with pytest.raises(AssertionError):
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_table_dtypes_and_strided_rows(dtype):
    """int64 tables and tables that are column-slices of a wider buffer address the same tokens."""
    page = 17
    seq_lens_list = [40, 17, 1]
    table, num_blocks = make_case(page, seq_lens_list)
    wide = torch.full((table.shape[0], table.shape[1] * 2), 2**30, dtype=dtype)
    wide[:, ::2] = table.to(dtype)
    strided = wide.to(DEVICE)[
        :, ::2
    ]  # stride_bt_col = 2 (sliced on the device: .to() of a view copies densely)
    cache = make_cache("nhd", "k", num_blocks, page)
    seq_lens = torch.tensor(seq_lens_list, dtype=torch.int32)
    positions = positions_for(page, max(seq_lens_list))
    want = gather_via_torch(cache.cpu(), "nhd", "k", table, seq_lens, positions, 1)
    got, _ = gather_via_helper(cache, "nhd", "k", strided, seq_lens.to(DEVICE), positions.to(DEVICE), 1)
    assert strided.stride(1) == 2
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


@triton.jit
def _offsets_only_kernel(block_table, positions, out, n_pos, n_valid, n_cols, stride_block, stride_slot,
                         PAGE_SIZE: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    o_i = tl.arange(0, BLOCK)
    m_i = o_i < n_pos
    b_pos = tl.load(positions + o_i, mask=m_i, other=0)
    b_off = token_offsets(block_table, 1, b_pos, n_valid, n_cols, stride_block, stride_slot, PAGE_SIZE)
    tl.store(out + o_i, b_off, mask=m_i)


@pytest.mark.parametrize("page", [16, 1056])
def test_offsets_above_2_31_elements(page):
    """Offset arithmetic is int64 all the way: block ids above 2**20 times a big block stride,
    positions near int32 limits of pages, checked without allocating such a cache."""
    heads, head = 8, 256
    stride_slot = heads * head  # NHD
    stride_block = page * stride_slot
    n_cols = 64
    table = torch.randint(2**20, 2**21, (n_cols,), dtype=torch.int32)
    positions = torch.tensor([0, 1, page - 1, page, 5 * page + 3, n_cols * page - 1], dtype=torch.int32)
    out = torch.zeros(positions.numel(), dtype=torch.int64)
    _offsets_only_kernel[(1,)](
        table.to(DEVICE), positions.to(DEVICE), out_d := out.to(DEVICE), positions.numel(), n_cols * page,
        n_cols, stride_block, stride_slot, PAGE_SIZE=page, BLOCK=8,
    )  # fmt: skip
    want = [int(table[p // page]) * stride_block + (p % page) * stride_slot for p in positions.tolist()]
    assert out_d.cpu().tolist() == want
    assert max(want) > 2**31


@triton.jit
def _tile_vs_token_kernel(
    block_table, starts, out_tile, out_token, n_valid, n_cols, stride_bt_col, stride_block, stride_slot,
    PAGE_SIZE: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Row i: tile_offsets and token_offsets of positions starts[i] + [0, BLOCK)."""
    i = tl.program_id(0)
    pos0 = tl.load(starts + i)
    o_j = tl.arange(0, BLOCK)
    b_tile = tile_offsets(block_table, stride_bt_col, pos0, n_valid, n_cols, stride_block, stride_slot,
                          BLOCK, PAGE_SIZE)  # fmt: skip
    b_tok = token_offsets(block_table, stride_bt_col, pos0 + o_j, n_valid, n_cols, stride_block, stride_slot,
                          PAGE_SIZE)  # fmt: skip
    tl.store(out_tile + i * BLOCK + o_j, b_tile)
    tl.store(out_token + i * BLOCK + o_j, b_tok)


@pytest.mark.parametrize("page", [1, 3, 16, 17, 48, 544, 1040, 1056, 2048])
@pytest.mark.parametrize("block", [16, 64])
def test_tile_offsets_match_token_offsets(page, block):
    """tile_offsets (one divide, two table reads per tile when block <= page) equals token_offsets and
    an independent torch formula for tiles starting at every edge: page starts/ends, tiles that
    cross a page, the sequence end, past it, and past the table row (exact width, bad ids after it)."""
    n_cols = 5
    n_valid = n_cols * page - (page // 3)  # the last page is partly used
    stride_slot, stride_block = 4096, 4096 * page + 8  # not a multiple of the slot stride
    ids = torch.randperm(4 * n_cols)[:n_cols].to(torch.int32) + 2**20  # block ids above 2**20
    buf = torch.full((2 * n_cols,), -(2**30), dtype=torch.int32)  # bad ids after the row...
    buf[::2] = ids
    table = buf.to(DEVICE)[
        ::2
    ]  # ...and a column stride of 2 (sliced on the device: .to() of a view is dense)
    starts = {0, 1, page - 1, page, page + 1, 2 * page - block, 2 * page - block + 1}
    starts |= {n_valid - 1, n_valid - block, n_valid, n_valid + 5, n_cols * page - 1, n_cols * page}
    starts.add((n_cols + 1) * page)
    starts |= {k * page + r for k in range(n_cols) for r in (0, page // 2, max(page - block // 2, 0))}
    starts = sorted(s for s in starts if s >= 0)
    st = torch.tensor(starts, dtype=torch.int32)
    out_tile = torch.full((len(starts), block), -1, dtype=torch.int64)
    out_tok = torch.full((len(starts), block), -2, dtype=torch.int64)
    o_tile, o_tok = out_tile.to(DEVICE), out_tok.to(DEVICE)
    _tile_vs_token_kernel[(len(starts),)](
        table, st.to(DEVICE), o_tile, o_tok, n_valid, n_cols, table.stride(0), stride_block,
        stride_slot, PAGE_SIZE=page, BLOCK=block,
    )  # fmt: skip
    pos = st[:, None].long() + torch.arange(block)[None, :]
    valid = (pos < n_valid) & (pos // page < n_cols)
    want = ids.long()[(pos // page).clamp(max=n_cols - 1)] * stride_block + (pos % page) * stride_slot
    want = torch.where(valid, want, 0)
    assert torch.equal(o_tok.cpu(), want)
    assert torch.equal(o_tile.cpu(), want)
    assert want.max() > 2**31


@triton.jit
def _tile_blocks_kernel(
    block_table, starts, out_a, out_b, n_valid, n_cols, stride_bt_col, stride_block, stride_slot, page_size,
    PAGE_SIZE: tl.constexpr, BLOCK: tl.constexpr, MASKED: tl.constexpr, ALIGNED: tl.constexpr,
    BRANCH: tl.constexpr, BASES: tl.constexpr, WIDE: tl.constexpr = True, PAGE_VECTOR: tl.constexpr = False,
):  # fmt: skip
    """Row i: tile_block_offsets of positions starts[i] + [0, BLOCK) for two caches (the second with
    strides (stride_block + 16, 2 * stride_slot)) from ONE tile_blocks call (``WIDE``: int64 or int32;
    ``PAGE_VECTOR``: one table read per page)."""
    i = tl.program_id(0)
    pos0 = tl.load(starts + i)
    o_j = tl.arange(0, BLOCK)
    tile = tile_blocks(
        block_table,
        stride_bt_col,
        pos0,
        n_valid,
        n_cols,
        page_size,
        BLOCK,
        PAGE_SIZE,
        MASKED,
        ALIGNED,
        False,
        WIDE,
        PAGE_VECTOR,
    )
    b_a = tile_block_offsets(
        tile, stride_block, stride_slot, BLOCK, PAGE_SIZE, MASKED, ALIGNED, BRANCH, BASES, False, PAGE_VECTOR
    )
    b_b = tile_block_offsets(
        tile, stride_block + 16, 2 * stride_slot, BLOCK, PAGE_SIZE, MASKED, ALIGNED, BRANCH, BASES, False,
        PAGE_VECTOR,
    )  # fmt: skip
    tl.store(out_a + i * BLOCK + o_j, b_a)
    tl.store(out_b + i * BLOCK + o_j, b_b)


@pytest.mark.parametrize("page", [1, 3, 16, 17, 48, 64, 544, 1040, 2048])
@pytest.mark.parametrize("block", [16, 64])
@pytest.mark.parametrize("masked,aligned", [(True, False), (True, True), (False, False), (False, True)])
@pytest.mark.parametrize("runtime_page", [False, True], ids=["const_page", "runtime_page"])
@pytest.mark.parametrize(
    "branch,bases", [(False, False), (True, False), (False, True)], ids=["selects", "branch", "bases"]
)
def test_tile_blocks_match_formula(page, block, masked, aligned, runtime_page, branch, bases):
    """tile_blocks + tile_block_offsets (the kernels' path) against an independent torch formula, for
    two caches sharing one set of table reads, tiles at every edge (page starts/ends, crossings, the
    sequence end, past the table row). MASKED: padding lanes give 0. Unmasked (tiles the caller
    promises are all real tokens): real lanes exact, the others still inside block 0 or their own
    mapped page, never a wild address. ALIGNED: tiles starting at multiples of ``block`` only.
    runtime_page: the page size as a runtime argument (``PAGE_SIZE=0``; needs block <= page)."""
    if runtime_page and block > page:
        pytest.skip("a runtime page size needs tiles no wider than a page")
    n_cols = 5
    n_valid = n_cols * page - (page // 3)
    stride_slot, stride_block = 4096, 4096 * page + 8
    ids = torch.randperm(4 * n_cols)[:n_cols].to(torch.int32) + 2**20
    buf = torch.full((2 * n_cols,), -(2**30), dtype=torch.int32)
    buf[::2] = ids
    table = buf.to(DEVICE)[::2]  # column stride 2, sliced on the device (.to() of a view is dense)
    starts = {0, 1, page - 1, page, page + 1, 2 * page - block, 2 * page - block + 1}
    starts |= {n_valid - 1, n_valid - block, n_valid, n_cols * page - 1, n_cols * page}
    starts |= {k * page + r for k in range(n_cols) for r in (0, page // 2, max(page - block // 2, 0))}
    if aligned:
        starts = {(x // block) * block for x in starts}
    starts = sorted(x for x in starts if x >= 0)
    st = torch.tensor(starts, dtype=torch.int32)
    out_a = torch.full((len(starts), block), -1, dtype=torch.int64).to(DEVICE)
    out_b = torch.full((len(starts), block), -1, dtype=torch.int64).to(DEVICE)
    _tile_blocks_kernel[(len(starts),)](
        table, st.to(DEVICE), out_a, out_b, n_valid, n_cols, table.stride(0), stride_block,
        stride_slot, page, PAGE_SIZE=0 if runtime_page else page, BLOCK=block, MASKED=masked, ALIGNED=aligned,
        BRANCH=branch, BASES=bases,
    )  # fmt: skip
    pos = st[:, None].long() + torch.arange(block)[None, :]
    in_row = pos // page < n_cols
    valid = (pos < n_valid) & in_row
    blk = ids.long()[(pos // page).clamp(max=n_cols - 1)]
    for got, (sb, ss) in (
        (out_a.cpu(), (stride_block, stride_slot)),
        (out_b.cpu(), (stride_block + 16, 2 * stride_slot)),
    ):
        exact = blk * sb + (pos % page) * ss
        if masked:
            assert torch.equal(got, torch.where(valid, exact, 0))
        else:
            assert torch.equal(got[valid], exact[valid])
            inside_block0 = (got >= 0) & (got < page * ss)
            assert bool((inside_block0 | (in_row & (got == exact))).all())
    assert int(out_a.max()) > 2**31


def _tile_offsets_pair(table, st, n_valid, n_cols, stride_block, stride_slot, page, block, **flags):
    """_tile_blocks_kernel's two offset tables (CPU int64 [len(st), block] each), outputs -1-poisoned."""
    out_a = torch.full((len(st), block), -1, dtype=torch.int64).to(DEVICE)
    out_b = torch.full((len(st), block), -1, dtype=torch.int64).to(DEVICE)
    _tile_blocks_kernel[(len(st),)](
        table, st, out_a, out_b, n_valid, n_cols, table.stride(0), stride_block, stride_slot, page,
        PAGE_SIZE=page, BLOCK=block, **flags,
    )  # fmt: skip
    return out_a.cpu(), out_b.cpu()


@pytest.mark.parametrize("page", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("block", [16, 64])
@pytest.mark.parametrize("wide", [True, False])
def test_tile_blocks_page_vector(page, block, wide):
    """``PAGE_VECTOR`` (unmasked aligned tiles of whole pages narrower than the tile: one table read
    per page, each page's base spread over its lanes) gives the per-lane form's offsets lane by lane,
    for tiles inside the row, at its end and past it (block 0, never a wild address), and for a
    control: a tile whose pages' ids are swapped must differ."""
    if block <= page:
        pytest.skip("one block id per page needs pages narrower than the tile")
    n_cols = 3 * block // page + 1
    n_valid = n_cols * page
    stride_slot, stride_block = 64, 64 * page + 8
    ids = (torch.randperm(4 * n_cols)[:n_cols] + 1).to(torch.int32)
    table = ids.to(DEVICE)
    starts = list(range(0, n_cols * page + block, block))  # aligned; the last ones run past the row
    st = torch.tensor(starts, dtype=torch.int32).to(DEVICE)
    flags = {"MASKED": False, "ALIGNED": True, "BRANCH": False, "BASES": False, "WIDE": wide}
    outs = [
        _tile_offsets_pair(table, st, n_valid, n_cols, stride_block, stride_slot, page, block, **flags,
                           PAGE_VECTOR=pv)
        for pv in (False, True)
    ]  # fmt: skip
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    pos = torch.tensor(starts)[:, None].long() + torch.arange(block)[None, :]
    in_row = pos // page < n_cols
    exact = ids.long()[(pos // page).clamp(max=n_cols - 1)] * stride_block + (pos % page) * stride_slot
    assert torch.equal(outs[1][0][in_row], exact[in_row])
    assert bool(((outs[1][0] >= 0) & (outs[1][0] < page * stride_slot))[~in_row].all())
    swapped = (
        ids.long()[((pos // page) ^ 1).clamp(max=n_cols - 1)] * stride_block + (pos % page) * stride_slot
    )
    assert not torch.equal(outs[1][0][in_row], swapped[in_row])


@triton.jit
def _tile_ids_kernel(
    block_table, starts, out_a, out_b, n_valid, n_cols, stride_bt_col, stride_block, stride_slot, page_size,
    PAGE_SIZE: tl.constexpr, BLOCK: tl.constexpr, BASES: tl.constexpr, WIDE: tl.constexpr,
    PAGE_VECTOR: tl.constexpr, SHIFT: tl.constexpr,
):  # fmt: skip
    """Row i: the unmasked, aligned tile at starts[i] addressed twice: out_a from tile_blocks' own table
    reads, out_b from ``IDS`` read by an unmasked tile_blocks call for the tile ``SHIFT`` tiles further
    (0: the same tile, the read-ahead of a loop; 1: a control that must differ)."""
    i = tl.program_id(0)
    pos0 = tl.load(starts + i)
    o_j = tl.arange(0, BLOCK)
    ahead_read = tile_blocks(
        block_table, stride_bt_col, pos0 + SHIFT * BLOCK, n_valid, n_cols, page_size, BLOCK, PAGE_SIZE, False,
        True, False, WIDE, PAGE_VECTOR,
    )  # fmt: skip
    ids = (ahead_read[0], ahead_read[1])
    own = tile_blocks(
        block_table, stride_bt_col, pos0, n_valid, n_cols, page_size, BLOCK, PAGE_SIZE, False, True, False,
        WIDE, PAGE_VECTOR,
    )  # fmt: skip
    ahead = tile_blocks(
        block_table, stride_bt_col, pos0, n_valid, n_cols, page_size, BLOCK, PAGE_SIZE, False, True, False,
        WIDE, PAGE_VECTOR, ids,
    )  # fmt: skip
    b_a = tile_block_offsets(own, stride_block, stride_slot, BLOCK, PAGE_SIZE, False, True, False, BASES,
                             False, PAGE_VECTOR)  # fmt: skip
    b_b = tile_block_offsets(ahead, stride_block, stride_slot, BLOCK, PAGE_SIZE, False, True, False, BASES,
                             False, PAGE_VECTOR)  # fmt: skip
    tl.store(out_a + i * BLOCK + o_j, b_a)
    tl.store(out_b + i * BLOCK + o_j, b_b)


@pytest.mark.parametrize("page", [1, 3, 16, 17, 64, 544, 1040])
@pytest.mark.parametrize("block", [16, 64])
@pytest.mark.parametrize("page_vector", [False, True])
@pytest.mark.parametrize("wide", [True, False])
def test_tile_blocks_ids_read_ahead(page, block, page_vector, wide):
    """tile_blocks(IDS=...) with the ids of an earlier unmasked call (a loop's block ids read one
    tile ahead, prefix-prefill's ``PREFETCH_IDS``) address an unmasked aligned tile exactly as
    tile_blocks' own reads do, lane by lane, for tiles inside the row, at its end and past it (the
    read after a loop's last tile: masked, never outside the row), in every form (one page, two pages
    (``BASES``), per lane, one id per page); and the ids of the next tile (a read-ahead one step off)
    give other offsets."""
    n_cols = 3 * max(block // page, 1) + 2
    n_valid = n_cols * page - (page // 3)
    stride_slot, stride_block = 64, 64 * page + 8
    ids = (torch.randperm(4 * n_cols)[:n_cols] + 1).to(torch.int32)
    table = ids.to(DEVICE)
    last = n_cols * page + 2 * block
    starts = torch.tensor(list(range(0, last, block)), dtype=torch.int32).to(DEVICE)
    rows = starts.shape[0]
    outs = {}
    for shift in (0, 1):
        out_a = torch.full((rows, block), -1, dtype=torch.int64).to(DEVICE)
        out_b = torch.full((rows, block), -1, dtype=torch.int64).to(DEVICE)
        _tile_ids_kernel[(rows,)](
            table, starts, out_a, out_b, n_valid, n_cols, table.stride(0), stride_block, stride_slot, page,
            PAGE_SIZE=page, BLOCK=block, BASES=True, WIDE=wide, PAGE_VECTOR=page_vector, SHIFT=shift,
        )  # fmt: skip
        outs[shift] = (out_a.cpu(), out_b.cpu())
    own, ahead = outs[0]
    assert torch.equal(own, ahead)
    pos = starts.cpu()[:, None].long() + torch.arange(block)[None, :]
    real = (pos < n_valid) & (pos // page < n_cols)
    exact = ids.long()[(pos // page).clamp(max=n_cols - 1)] * stride_block + (pos % page) * stride_slot
    assert torch.equal(ahead[real], exact[real])
    assert bool(((ahead >= 0) & ((ahead < page * stride_slot) | (ahead == exact)))[~real].all())
    own1, off_by_one = outs[1]
    assert torch.equal(own1, own)
    assert not torch.equal(off_by_one[real], exact[real])


@pytest.mark.parametrize("page", [3, 17, 544, 1040])
@pytest.mark.parametrize("block", [16, 64])
@pytest.mark.parametrize("masked,aligned", [(True, False), (False, True)])
@pytest.mark.parametrize("branch,bases", [(False, False), (False, True)], ids=["selects", "bases"])
def test_tile_blocks_int32_offsets_match_int64(page, block, masked, aligned, branch, bases):
    """``WIDE=False`` (int32 block ids and offsets, for caches under 2**31 elements) gives the int64
    offsets lane by lane, largest offset just under 2**31."""
    n_cols = 5
    n_valid = n_cols * page - (page // 3)
    stride_slot = 64
    stride_block = (2**31 - 1) // (4 * n_cols + 1) // 16 * 16  # the largest block id's page ends below 2**31
    ids = torch.randperm(4 * n_cols)[:n_cols] + 1
    ids[0] = 4 * n_cols  # the largest block id, on the first page (position 0 is a start)
    table = ids.to(torch.int32).to(DEVICE)
    starts = sorted(
        {0, 1, page - 1, page, page + 1, n_valid - 1, n_valid - block, n_valid, n_cols * page - 1}
    )
    starts = [(x // block) * block if aligned else x for x in starts if x >= 0]
    st = torch.tensor(starts, dtype=torch.int32).to(DEVICE)
    flags = {"MASKED": masked, "ALIGNED": aligned, "BRANCH": branch, "BASES": bases}
    outs = [
        _tile_offsets_pair(
            table, st, n_valid, n_cols, stride_block, stride_slot, page, block, **flags, WIDE=wide
        )
        for wide in (True, False)
    ]
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert int(outs[1][1].max()) > 2**30


def test_offsets_fit_int32():
    """The host check behind ``WIDE=False``: the largest element offset of each tensor below 2**31."""
    meta = {"device": "meta", "dtype": torch.bfloat16}
    assert offsets_fit_int32(torch.empty(2**31 - 1, **meta), torch.empty(16, 4, **meta))
    assert not offsets_fit_int32(torch.empty(2**31 + 1, **meta))
    assert offsets_fit_int32(torch.empty(0, 2**40, **meta))  # empty: nothing to address
    big_view = torch.empty(2, 2**30 + 8, **meta)[:, :8]  # 16 elements, the second row 2**30 + 8 away
    assert offsets_fit_int32(big_view)
    assert not offsets_fit_int32(torch.empty(3, 2**30 + 8, **meta)[:, :8])  # 2 * (2**30 + 8) + 7
    with pytest.raises(TypeError, match="tensors"):
        offsets_fit_int32([1, 2])


@triton.jit
def _page_walk_kernel(
    ranges, bounds, g_pos, t_pos, p_pos, n_idx, BLOCK: tl.constexpr, PAGE_SIZE: tl.constexpr
):
    """Program i < len(ranges): the walk of ranges[i] = (need_lo, need_hi, full_lo, full_hi) as
    8 numbers (g_lo, g_a, g_b, g_hi, t_a, t_b, p_a, p_b). Every program also maps index i of each
    index space to positions: walk tile i -> (pos0, page_end), full tile i -> pos0, rest of page i ->
    (pos0, page_end)."""
    i = tl.program_id(0)
    need_lo = tl.load(ranges + 4 * i)
    need_hi = tl.load(ranges + 4 * i + 1)
    full_lo = tl.load(ranges + 4 * i + 2)
    full_hi = tl.load(ranges + 4 * i + 3)
    g_lo, g_a, g_b, g_hi = page_walk_bounds(need_lo, need_hi, full_lo, full_hi, BLOCK, PAGE_SIZE)
    t_a, t_b, p_a, p_b = page_walk_split(g_a, g_b, BLOCK, PAGE_SIZE)
    o = bounds + 8 * i
    tl.store(o + 0, g_lo)
    tl.store(o + 1, g_a)
    tl.store(o + 2, g_b)
    tl.store(o + 3, g_hi)
    tl.store(o + 4, t_a)
    tl.store(o + 5, t_b)
    tl.store(o + 6, p_a)
    tl.store(o + 7, p_b)
    if i < n_idx:
        pos0, page_end = page_walk_tile(i, BLOCK, PAGE_SIZE)
        tl.store(g_pos + 2 * i, pos0)
        tl.store(g_pos + 2 * i + 1, page_end)
        tl.store(t_pos + i, page_walk_full(i, BLOCK, PAGE_SIZE))
        pos0, page_end = page_walk_rest(i, BLOCK, PAGE_SIZE)
        tl.store(p_pos + 2 * i, pos0)
        tl.store(p_pos + 2 * i + 1, page_end)


@pytest.mark.parametrize(
    "page,block",
    [(17, 16), (40, 16), (48, 32), (544, 64), (544, 128), (1040, 128), (1056, 64), (1000, 128), (48, 16),
     (512, 128), (16, 16)],  # the last three: pages that are multiples of the tile (no rest tiles)
)  # fmt: skip
def test_page_walk_covers_each_needed_key_once(page, block):
    """page_walk_*: against a walk enumerated here page by page (Q full tiles then the rest): the
    tiles a range needs are exactly those that meet it, each key of the range lies in exactly one of
    them, no tile crosses a page, and the unmasked ones (full tiles t_a..t_b, rests p_a..p_b) are
    exactly the needed tiles that lie wholly inside [full_lo, full_hi)."""
    q_full = page // block
    n_pages = 7
    walk = []  # (start, end) per walk index, independent of the helpers
    fulls = []  # start of each full tile, in order
    for p in range(n_pages):
        walk += [(p * page + w * block, p * page + (w + 1) * block) for w in range(q_full)]
        fulls += [p * page + w * block for w in range(q_full)]
        if page % block:
            walk.append((p * page + q_full * block, (p + 1) * page))
    gen = torch.Generator().manual_seed(page * 1000 + block)
    span = (n_pages - 1) * page
    ranges = []
    edges = [0, 1, block - 1, block, q_full * block, page - 1, page, page + 1, 2 * page + q_full * block - 1]
    for a in edges:
        for b in edges:
            ranges.append((a, a + b + 1, a + b // 2, a + b))
    for _ in range(200):
        a, b = sorted(torch.randint(0, span, (2,), generator=gen).tolist())
        c, d = sorted(torch.randint(a, b + 1, (2,), generator=gen).tolist())
        ranges.append((a, b, c, d))
    ranges.append((5, 5, 5, 5))  # empty
    ranges.append((page, 2, 0, 0))  # empty (need_hi < need_lo)
    n_idx = len(walk)
    rt = torch.tensor(ranges, dtype=torch.int32)
    bounds = torch.zeros(len(ranges), 8, dtype=torch.int32).to(DEVICE)
    g_pos = torch.zeros(n_idx, 2, dtype=torch.int32).to(DEVICE)
    t_pos = torch.zeros(n_idx, dtype=torch.int32).to(DEVICE)
    p_pos = torch.zeros(n_idx, 2, dtype=torch.int32).to(DEVICE)
    _page_walk_kernel[(max(len(ranges), n_idx),)](
        rt.to(DEVICE), bounds, g_pos, t_pos, p_pos, n_idx, BLOCK=block, PAGE_SIZE=page
    )
    assert [tuple(x) for x in g_pos.cpu().tolist()] == [(s, (s // page + 1) * page) for s, _ in walk]
    assert t_pos.cpu().tolist()[: len(fulls)] == fulls
    if page % block:
        assert [tuple(x) for x in p_pos.cpu().tolist()] == [
            (p * page + q_full * block, (p + 1) * page) for p in range(n_idx)
        ]
    assert page_walk_rest_block(page, block) >= page % block
    for (need_lo, need_hi, full_lo, full_hi), bd in zip(ranges, bounds.cpu().tolist(), strict=True):
        g_lo, g_a, g_b, g_hi, t_a, t_b, p_a, p_b = bd
        needed = [g for g, (s, e) in enumerate(walk) if s < need_hi and e > need_lo and need_hi > need_lo]
        unmasked = [g for g in needed if s_in(walk[g], full_lo, full_hi)]
        assert list(range(g_lo, g_hi)) == needed, (need_lo, need_hi)
        assert list(range(g_a, g_b)) == unmasked, (full_lo, full_hi)
        assert set(range(g_lo, g_a)) | set(range(g_b, g_hi)) == set(needed) - set(unmasked)
        # the two unmasked loops: full tiles t_a..t_b and rest tiles p_a..p_b, the same tiles
        rests = [p * page + q_full * block for p in range(p_a, p_b)]
        got = sorted([fulls[t] for t in range(t_a, t_b)] + rests)
        assert got == sorted(walk[g][0] for g in unmasked)
        covered = [0] * (span + 2 * page)
        for g in needed:
            s, e = walk[g]
            assert s // page == (e - 1) // page  # one page per tile
            for x in range(max(s, need_lo), min(e, need_hi)):
                covered[x] += 1
        assert all(covered[x] == 1 for x in range(need_lo, need_hi))


@triton.jit
def _rest_group_kernel(bt, page0s, page_ends, out_pos, out_off, out_valid, stride_block, stride_slot,
                       BLOCK: tl.constexpr, PAGE_SIZE: tl.constexpr):  # fmt: skip
    """Program i: the rest group of pages [page0s[i], page_ends[i]) -> positions, offsets, valid."""
    i = tl.program_id(0)
    pos, blk, slot, valid = page_walk_rest_group(
        bt, 1, tl.load(page0s + i), tl.load(page_ends + i), BLOCK, PAGE_SIZE
    )
    offs = tl.arange(0, BLOCK)
    tl.store(out_pos + i * BLOCK + offs, pos)
    tl.store(out_off + i * BLOCK + offs, lane_offsets(blk, slot, stride_block, stride_slot))
    tl.store(out_valid + i * BLOCK + offs, valid.to(tl.int32))


@pytest.mark.parametrize("page,block", [(544, 128), (544, 64), (1040, 128), (1056, 64), (48, 32), (80, 64)])
def test_page_walk_rest_group(page, block):
    """page_walk_rest_group: lane i of the group at page0 is slot page - R + i % R of page
    page0 + i // R (R = page % block); lanes of pages at or past page_end repeat page_end - 1's
    lanes and are flagged invalid (so every lane addresses a slot of a needed page); the valid lanes
    hold each rest slot of the group's pages exactly once."""
    r = page % block
    group = block // r
    n_pages = 3 * group + 1
    gen = torch.Generator().manual_seed(page + block)
    table = torch.randperm(10 * n_pages, generator=gen)[:n_pages].to(torch.int32)
    ends = {p0: range(p0 + 1, min(p0 + group, n_pages) + 1) for p0 in range(0, n_pages, group)}
    cases = [(p0, pe) for p0, pes in ends.items() for pe in pes]
    cases += [(1, n_pages), (n_pages - 1, n_pages)]
    p0s = torch.tensor([c[0] for c in cases], dtype=torch.int32)
    pes = torch.tensor([c[1] for c in cases], dtype=torch.int32)
    out_pos = torch.full((len(cases), block), -1, dtype=torch.int32)
    out_off = torch.full((len(cases), block), -1, dtype=torch.int64)
    out_valid = torch.full((len(cases), block), -1, dtype=torch.int32)
    sb, ss = 1000 * page, 3
    bufs = [t.to(DEVICE) for t in (table, p0s, pes, out_pos, out_off, out_valid)]
    _rest_group_kernel[(len(cases),)](*bufs, sb, ss, BLOCK=block, PAGE_SIZE=page)
    out_pos, out_off, out_valid = (t.cpu() for t in bufs[3:])
    for c, (p0, pe) in enumerate(cases):
        for i in range(block):
            p = p0 + i // r
            slot = page - r + i % r
            valid = p < pe
            q = min(p, pe - 1)
            assert int(out_valid[c, i]) == int(valid), (p0, pe, i)
            assert int(out_pos[c, i]) == q * page + slot, (p0, pe, i)
            assert int(out_off[c, i]) == int(table[q]) * sb + slot * ss, (p0, pe, i)
    # every rest slot of pages [p0, pe) appears exactly once among the valid lanes
    for c, (p0, pe) in enumerate(cases):
        got = sorted(out_pos[c][out_valid[c] == 1].tolist())
        assert got == [p * page + page - r + w for p in range(p0, min(pe, p0 + group)) for w in range(r)]


def s_in(tile: tuple[int, int], lo: int, hi: int) -> bool:
    return tile[0] >= lo and tile[1] <= hi


def test_page_walk_rest_block():
    """Rest-tile width: 0 where no walk is needed, else the rest rounded up to a power of two >= 16."""
    assert page_walk_rest_block(512, 128) == 0
    assert page_walk_rest_block(16, 128) == 0
    assert page_walk_rest_block(128, 128) == 0
    assert page_walk_rest_block(544, 128) == 32
    assert page_walk_rest_block(544, 64) == 32
    assert page_walk_rest_block(1040, 128) == 16
    assert page_walk_rest_block(1056, 64) == 32
    assert page_walk_rest_block(17, 16) == 16
    assert page_walk_rest_block(1000, 128) == 128  # rest 104
    assert page_walk_rest_block(600, 64) == 32  # rest 24
    with pytest.raises(ValueError, match="page_size"):
        page_walk_rest_block(0, 16)


def test_describe_rejects_wrong_rank():
    with pytest.raises(ValueError, match="k_cache"):
        describe_cache(torch.zeros(2, 3, 4), "nhd", role="k")
    with pytest.raises(ValueError, match="layout"):
        describe_cache(torch.zeros(2, 3, 4, 5), "bogus", role="k")
    k = torch.zeros(4, 2, 2, 16, 8)
    v = torch.zeros(4, 2, 16, 32)  # page 32 != 16
    with pytest.raises(ValueError, match="page_size"):
        describe_kv_cache(k, v, "split")
