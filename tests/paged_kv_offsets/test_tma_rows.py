"""paged_kv_offsets.tma_rows: the 2-D view of rows a TMA descriptor takes of an NHD or HND cache.

Every slot of real tensors (contiguous NHD and HND, FlashInfer's interleaved ``[num_blocks, 2, ...]`` K/V
halves, vLLM's ``[2, num_blocks, ...]`` halves, padded blocks, padded slots, fp8) is read through the
view as a descriptor would read it (shape ``[rows, row_elems]``, strides ``[row_stride, 1]`` over the
tensor's storage from its first element) at row ``b * block_rows + h * head_rows + s``, column ``h *
head_cols``, and compared with ``cache[b, ...]``; the view ends inside the storage; what TMA cannot read
is None.
"""

from __future__ import annotations

import pytest
import torch

from paged_kv_offsets import CacheView, TmaRows, describe_cache, tma_rows

NB, PAGE, HEADS, D = 5, 16, 3, 32


def _flat(cache: torch.Tensor, view: TmaRows) -> torch.Tensor:
    """``cache``'s storage as the descriptor sees it: ``[rows, row_elems]`` with strides ``[row_stride,
    1]`` from the tensor's first element (as_strided checks the view stays inside the storage)."""
    return cache.as_strided((view.rows, view.row_elems), (view.row_stride, 1), cache.storage_offset())


def _check_every_slot(cache: torch.Tensor, layout: str) -> TmaRows:
    cv = describe_cache(cache, layout)
    view = tma_rows(cv, cache.element_size())
    assert view is not None, cv
    flat = _flat(cache, view)
    for b in range(cv.num_blocks):
        for h in range(cv.num_kv_heads):
            for s in range(cv.page_size):
                row = b * view.block_rows + h * view.head_rows + s
                col = h * view.head_cols
                want = cache[b, s, h] if layout == "nhd" else cache[b, h, s]
                assert torch.equal(
                    flat[row, col : col + cv.head_size].view(torch.uint8), want.view(torch.uint8)
                )
    # the storage the view spans ends at the cache's last element (+1): a descriptor over it is in bounds
    last = sum((n - 1) * st for n, st in zip(cache.shape, cache.stride(), strict=True))
    end = (view.rows - 1) * view.row_stride + view.row_elems
    assert end == last + 1, (end, last)
    return view


def _fill(shape, dtype=torch.bfloat16) -> torch.Tensor:
    t = torch.randn(shape)
    return t.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn])
@pytest.mark.parametrize("layout", ["nhd", "hnd"])
def test_contiguous(layout, dtype):
    """Contiguous caches: NHD rows are one slot's heads (``block_rows = page``, ``head_cols = D``), HND
    rows one head's slot (``block_rows = heads * page``, ``head_rows = page``); the view is the whole
    tensor."""
    shape = (NB, PAGE, HEADS, D) if layout == "nhd" else (NB, HEADS, PAGE, D)
    view = _check_every_slot(_fill(shape, dtype), layout)
    if layout == "nhd":
        assert view == TmaRows(NB * PAGE, HEADS * D, HEADS * D, PAGE, 0, D)
    else:
        assert view == TmaRows(NB * HEADS * PAGE, D, D, HEADS * PAGE, PAGE, 0)
    assert view.kernel_args() == (view.block_rows, view.head_rows, view.head_cols)


@pytest.mark.parametrize("layout", ["nhd", "hnd"])
def test_flashinfer_interleaved_halves(layout):
    """FlashInfer's ``kv = [num_blocks, 2, ...]`` with ``k_cache = kv[:, 0]``, ``v_cache = kv[:, 1]``:
    blocks twice a page apart; V's view starts one page later; neither reaches past the tensor."""
    inner = (PAGE, HEADS, D) if layout == "nhd" else (HEADS, PAGE, D)
    kv = _fill((NB, 2, *inner))
    k, v = kv[:, 0], kv[:, 1]
    kview, vview = _check_every_slot(k, layout), _check_every_slot(v, layout)
    span = PAGE if layout == "nhd" else HEADS * PAGE
    assert kview.block_rows == vview.block_rows == 2 * span
    assert kview.kernel_args() == vview.kernel_args()
    assert kview.rows == (NB - 1) * 2 * span + span  # ends at the last K page, not at the tensor's end


@pytest.mark.parametrize("layout", ["nhd", "hnd"])
def test_vllm_halves_and_padding(layout):
    """vLLM's ``[2, num_blocks, ...]`` halves (each contiguous), blocks padded by a few slots, NHD slots
    padded past their heads, HND heads padded past their pages."""
    inner = (PAGE, HEADS, D) if layout == "nhd" else (HEADS, PAGE, D)
    kv = _fill((2, NB, *inner))
    for half in (kv[0], kv[1]):
        _check_every_slot(half, layout)
    if layout == "nhd":
        padded_block = _fill((NB, PAGE + 3, HEADS, D))[:, :PAGE]
        padded_slot = _fill((NB, PAGE, HEADS + 1, D))[:, :, :HEADS]  # row stride (heads + 1) * D
        view = _check_every_slot(padded_slot, layout)
        assert view.row_stride == (HEADS + 1) * D and view.row_elems == HEADS * D
    else:
        padded_block = _fill((NB, HEADS + 1, PAGE, D))[:, :HEADS]
        padded_slot = _fill((NB, HEADS, PAGE + 2, D))[:, :, :PAGE]  # head stride (page + 2) rows
        view = _check_every_slot(padded_slot, layout)
        assert view.head_rows == PAGE + 2
    view = _check_every_slot(padded_block, layout)
    assert view.block_rows == (PAGE + 3 if layout == "nhd" else (HEADS + 1) * PAGE)


def test_one_block_and_one_head():
    """A single block and a single head (their strides arbitrary in torch): the view is the block."""
    for layout, shape in (("nhd", (1, PAGE, 1, D)), ("hnd", (1, 1, PAGE, D))):
        view = _check_every_slot(_fill(shape), layout)
        assert view.rows == PAGE


def test_rejections():
    """None where TMA cannot read the cache as one view of rows."""

    def rows(cache, layout="nhd"):
        return tma_rows(describe_cache(cache, layout), cache.element_size())

    assert rows(_fill((NB, PAGE, HEADS, D))) is not None  # the control
    assert rows(_fill((NB, PAGE, HEADS, 2 * D))[..., ::2]) is None  # feature stride 2
    assert rows(_fill((NB, PAGE, HEADS, 2 * D))[..., :D]) is None  # NHD heads not adjacent
    assert rows(_fill((NB, HEADS, PAGE, D + 4))[..., :D], "hnd") is None  # 72-byte rows
    assert rows(_fill((NB, PAGE, 1, 12))[..., :4]) is None  # a slot of 12 bf16 = 24 bytes: not 16-byte rows
    assert rows(_fill((NB, 3 * PAGE + 1, HEADS, D))[:, :PAGE]) is not None  # whole rows: padded blocks
    odd = torch.empty(NB * (PAGE * HEADS * D + 8), dtype=torch.bfloat16).as_strided(
        (NB, PAGE, HEADS, D), (PAGE * HEADS * D + 8, HEADS * D, D, 1)
    )
    assert rows(odd) is None  # a block stride that is not a whole number of rows
    assert rows(_fill((NB, PAGE, HEADS, D)).transpose(0, 1).contiguous().transpose(0, 1)) is None  # overlap
    hnd = _fill((NB, HEADS, PAGE, D)).transpose(1, 2)  # HND data described as NHD: rows overlap heads
    assert rows(hnd) is None
    small_head = torch.empty(NB * HEADS * PAGE * D, dtype=torch.bfloat16).as_strided(
        (NB, HEADS, PAGE, D), (HEADS * PAGE * D, (PAGE // 2) * D, D, 1)
    )
    assert rows(small_head, "hnd") is None  # heads' rows overlap
    assert rows(_fill((0, PAGE, HEADS, D))) is None  # no blocks
    split = _fill((NB, HEADS, D // 8, PAGE, 8))
    assert tma_rows(describe_cache(split, "split", role="k"), 2) is None

    def nhd(num_blocks):  # a contiguous NHD cache of one head, described without its storage
        return CacheView("nhd", num_blocks, PAGE, 1, D, PAGE * D, D, D, 1, 0, 1)

    assert tma_rows(nhd(2**27), 2) is None  # 2**31 rows: past int32
    assert tma_rows(nhd(2**27 - 1), 2).rows == 2**31 - PAGE


def test_bad_arguments():
    """A tensor instead of its description, or an element size that is not a positive integer."""
    cache = _fill((NB, PAGE, HEADS, D))
    with pytest.raises(TypeError, match="CacheView"):
        tma_rows(cache, 2)
    for elem in (0, -2, 2.0):
        with pytest.raises(ValueError, match="elem_size"):
            tma_rows(describe_cache(cache, "nhd"), elem)
