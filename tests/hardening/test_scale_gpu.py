"""int64 addressing past 2**31 elements, on the GPU (real allocations of ~4.3 GiB per tensor).

The CPU side of this promise is ``tests/paged_kv_offsets/test_offsets.py::test_offsets_above_2_31_elements``
(the offset helper at block ids above 2**20 with a large block stride, no allocation). Here both kernels
run on tensors whose element offsets do not fit in int32, against the float64 reference:

* prefix_prefill: a bf16 KV cache ``[num_blocks, 16, 1, 128]`` (2048 = 2**11 elements per block) with
  ``num_blocks = 2**20 + 2**16`` -> 2**31 + 2**27 = 2,281,701,376 elements (4.25 GiB) per cache, and
  the sequences' pages at block ids >= 2**20 (offset = id * 2048 >= 2**31). Every block no sequence
  uses is NaN, so a wrong (wrapped) offset shows up as NaN or as a mismatch.
* window_prefill: q/k/v and the output are column slices of ``[4096, 2**19 + 2048]`` bf16 buffers
  (4.0 GiB each, 2 of them): token ``t`` starts at element ``t * 526336``, past 2**31 from token 4081.
"""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE
from hd_util import cu_of

from attn_reference import attention_varlen, compare, paged_prefix_attention
from prefix_prefill import prefix_prefill
from window_prefill import window_prefill

pytestmark = pytest.mark.gpu

PAGE, HKV, HEADS, D = 16, 1, 8, 128
NUM_BLOCKS = 2**20 + 2**16
INT32_LIMIT = 2**31


def _free_gib() -> float:
    free, _ = torch.cuda.mem_get_info()
    return free / 2**30


@pytest.mark.parametrize("layout", ["nhd", "split"])
def test_prefix_prefill_cache_above_2_31_elements(layout):
    if _free_gib() < 12:
        pytest.skip("needs ~9 GiB of free GPU memory")
    dtype = torch.bfloat16
    if layout == "nhd":
        shape_k = shape_v = (NUM_BLOCKS, PAGE, HKV, D)
    else:
        x = 8  # 16 bytes of bf16
        shape_k, shape_v = (NUM_BLOCKS, HKV, D // x, PAGE, x), (NUM_BLOCKS, HKV, D, PAGE)
    k_cache = torch.empty(shape_k, dtype=dtype, device=DEVICE).fill_(float("nan"))
    v_cache = torch.empty(shape_v, dtype=dtype, device=DEVICE).fill_(float("nan"))
    assert k_cache.numel() > INT32_LIMIT and k_cache.stride(0) * (NUM_BLOCKS - 1) > INT32_LIMIT

    seqs = [(1000, 50), (37, 3), (0, 20), (333, 129)]  # (context, query)
    pages = [-(-(c + n) // PAGE) for c, n in seqs]
    width = max(pages)
    # block ids: high ones (>= 2**20, the last one = NUM_BLOCKS - 1), plus one low id for sequence 1
    top = torch.randperm(2**16 - 1)[: sum(pages)] + 2**20  # ids in [2**20, NUM_BLOCKS - 1)
    top[0] = NUM_BLOCKS - 1
    table = torch.zeros(len(seqs), width, dtype=torch.int32)
    at = 0
    for b, p in enumerate(pages):
        table[b, :p] = top[at : at + p].to(torch.int32)
        at += p
    table[1, 0] = 5
    used = table[table > 0].unique().long().to(DEVICE)
    k_cache[used] = torch.randn((used.numel(), *shape_k[1:]), device=DEVICE).to(dtype)
    v_cache[used] = torch.randn((used.numel(), *shape_v[1:]), device=DEVICE).to(dtype)
    assert int(table.max()) >= 2**20 and int(table.max()) * PAGE * HKV * D > INT32_LIMIT

    total_q = sum(n for _, n in seqs)
    q = torch.randn(total_q, HEADS, D, device=DEVICE).to(dtype)
    k = torch.randn(total_q, HKV, D, device=DEVICE).to(dtype)
    v = torch.randn(total_q, HKV, D, device=DEVICE).to(dtype)
    cu = cu_of([n for _, n in seqs])
    seq_lens = torch.tensor([c + n for c, n in seqs], dtype=torch.int32, device=DEVICE)
    bt = table.to(DEVICE)
    out = torch.full_like(q, float("nan"))
    prefix_prefill(
        q,
        k,
        v,
        k_cache,
        v_cache,
        bt,
        cu,
        seq_lens,
        max(n for _, n in seqs),
        kv_layout=layout,
        window=(511, -1),
        out=out,
        validate=True,
    )
    ref = paged_prefix_attention(q, k, v, k_cache, v_cache, bt, cu, seq_lens, layout=layout, window=(511, -1))
    res = compare(out, ref)
    assert res, res
    # the same through the cache-only path (k=None): new tokens read back from pages >= 2**20
    for b, (c, n) in enumerate(seqs):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        for t in range(c, c + n):
            blk, slot = int(table[b, t // PAGE]), t % PAGE
            if layout == "nhd":
                k_cache[blk, slot] = k[rows][t - c]
                v_cache[blk, slot] = v[rows][t - c]
            else:
                k_cache[blk, :, :, slot, :] = k[rows][t - c].view(HKV, D // 8, 8)
                v_cache[blk, :, :, slot] = v[rows][t - c]
    out2 = torch.full_like(q, float("nan"))
    prefix_prefill(
        q,
        None,
        None,
        k_cache,
        v_cache,
        bt,
        cu,
        seq_lens,
        max(n for _, n in seqs),
        kv_layout=layout,
        window=(511, -1),
        out=out2,
        validate=True,
    )
    res = compare(out2, ref)
    assert res, res


def test_window_prefill_token_stride_above_2_31_elements():
    if _free_gib() < 12:
        pytest.skip("needs ~9 GiB of free GPU memory")
    dtype = torch.bfloat16
    tokens, width = 4096, 2**19 + 2048
    assert (tokens - 1) * width > INT32_LIMIT
    heads, kv = 8, 2
    buf = torch.empty(tokens, width, dtype=dtype, device=DEVICE)
    used = (heads + 2 * kv) * D
    buf[:, :used] = torch.randn(tokens, used, device=DEVICE).to(dtype)
    q = buf[:, : heads * D].view(tokens, heads, D)
    k = buf[:, heads * D : (heads + kv) * D].view(tokens, kv, D)
    v = buf[:, (heads + kv) * D : used].view(tokens, kv, D)
    out_buf = torch.empty(tokens, width, dtype=dtype, device=DEVICE)
    out_buf[:, : heads * D + 64] = float("nan")
    out = out_buf[:, : heads * D].view(tokens, heads, D)
    assert q.stride(0) == width and out.stride(0) == width
    lens = [1000, 3095, 1]
    cu = cu_of(lens)
    for causal, window in ((True, (255, -1)), (False, (100, 31))):
        out[:] = float("nan")
        window_prefill(q, k, v, cu, max(lens), causal=causal, window=window, out=out, validate=True)
        ref = attention_varlen(
            q.contiguous(), k.contiguous(), v.contiguous(), cu, cu, causal=causal, window=window
        )
        res = compare(out, ref)
        assert res, res
        assert torch.isnan(out_buf[:, heads * D : heads * D + 64]).all(), "wrote past the output view"
