"""The operands a bfloat16 call over an e4m3 cache adds when its context's scores run as fp8 matrix
products (the Gluon kernel's ``QK_FP8`` forms; ``gluon_launch._fp8_score_call``), in one kernel launch:

* q as two e4m3 parts, ``q * 2**-e = hi + lo`` (``hi`` = e4m3 of ``q * 2**-e``, ``lo`` = e4m3 of the
  remainder), with one exponent ``e`` for each tile of ``block_m`` rows of a sequence and each head, so
  that the tile's largest ``|q| * 2**-e`` lies in ``(128, 256]`` (e4m3's largest finite value is 448):
  ``QScale[head, row]`` holds ``2**e`` at each row of the tile, and the kernel multiplies the tile's logits
  by it. Two parts keep 8 significant bits of each q: ``|q - (hi + lo) * 2**e| <= 2**-8 |q|``, and
  exactly a bfloat16 q (8 significant bits) of ``|q| * 2**-e >= 2**-2`` (about ``2**-9`` of the tile's
  largest and up); below it (and below e4m3's normal range, ``2**-6``) an absolute ``2**-10 * 2**e`` at
  most (``2**-17`` of the largest). The plan takes this form for bfloat16 q only (a float16 q's 11
  bits would lose 3);
* the new tokens' v as float16 (the V ring's dtype; fp8 V blocks are converted on chip). Their k stays as
  given: the new tokens' scores run in bfloat16.

Why: the context's fp8 K blocks then go from the cache into shared memory as they are and straight into
the tensor cores (``QGMMA``), where a float16 K ring needs each block converted, written and read again.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _e4m3(x):
    """``x`` (float32, ``|x| <= 448``) rounded to nearest even on e4m3's grid, as e4m3: the rounding done in
    float32 (step ``2**(max(E, -6) - 3)`` at binade ``E``: add and take away ``1.5 * 2**(step + 23)``), so
    the conversion after it is exact and every backend gives these bits (the interpreter's own fp8
    rounding rounds ties away and drops a carry: triton-lang/triton#8322 and #11897)."""
    binade = ((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    step = tl.maximum(binade, -6) - 3
    c = ((step + 150) << 23).to(tl.float32, bitcast=True) * 1.5  # 1.5 * 2**(step + 23)
    return ((x + c) - c).to(tl.float8e4nv)


@triton.jit
def _q_tile(Q, Q8, QScale, CuSeqlensQ, n_tokens, heads, stride_q0, stride_q1, pid, n_tiles,
            HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):  # fmt: skip
    """Program ``pid`` = ``(seq * n_tiles + tile) * heads + head``: rows ``[tile * BLOCK_M, +BLOCK_M)`` of
    sequence ``seq`` (tokens from ``CuSeqlensQ[seq]``, clamped into the ``n_tokens`` rows of q) of head
    ``head`` into ``Q8`` ``[tokens, heads, 2, D]`` (high part, low part) and ``QScale`` ``[heads,
    tokens]``."""
    head = pid % heads
    st = pid // heads
    tile = st % n_tiles
    seq = st // n_tiles
    start = tl.minimum(tl.load(CuSeqlensQ + seq), n_tokens)
    end = tl.minimum(tl.maximum(tl.load(CuSeqlensQ + seq + 1), start), n_tokens)
    r = start + tile * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM] token rows
    inside = r < end  # [BM]
    feats = tl.arange(0, HEAD_DIM)  # [D]
    r64 = r.to(tl.int64)
    p_x = Q + r64[:, None] * stride_q0 + head * stride_q1 + feats[None, :]  # [BM, D]
    x = tl.load(p_x, mask=inside[:, None], other=0.0).to(tl.float32)  # [BM, D]
    amax = tl.max(tl.max(tl.abs(x), axis=1), axis=0)
    # e = ceil(log2(amax)) - 8, within [-100, 100]: the tile's largest |q| * 2**-e lies in (128, 256]
    e = tl.where(amax > 0, tl.ceil(tl.log2(tl.maximum(amax, 1e-30))), 8.0).to(tl.int32) - 8
    e = tl.minimum(tl.maximum(e, -100), 100)
    down = ((127 - e) << 23).to(tl.float32, bitcast=True)  # 2**-e, exact
    up = ((127 + e) << 23).to(tl.float32, bitcast=True)  # 2**e
    xs = x * down  # [BM, D] exact
    hi = _e4m3(xs)  # [BM, D] rounded to nearest
    lo = _e4m3(xs - hi.to(tl.float32))  # [BM, D] the remainder (exact in float32), rounded
    p_8 = Q8 + (r64[:, None] * heads + head) * (2 * HEAD_DIM) + feats[None, :]  # [BM, D]
    tl.store(p_8, hi, mask=inside[:, None])
    tl.store(p_8 + HEAD_DIM, lo, mask=inside[:, None])
    tl.store(QScale + head.to(tl.int64) * n_tokens + r64, tl.zeros([BLOCK_M], tl.float32) + up, mask=inside)


@triton.jit
def _v_rows(src, dst, rows, heads, stride0, stride1, p, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr):
    """Rows ``[p * ROWS, +ROWS)`` of ``rows`` (row ``r``: token ``r // heads``, head ``r % heads`` of
    ``src``, strides in elements, unit feature stride) into row ``r`` of the contiguous float16 ``dst``."""
    feats = tl.arange(0, HEAD_DIM)  # [D]
    r = p.to(tl.int64) * ROWS + tl.arange(0, ROWS)  # [ROWS]
    inside = (r < rows)[:, None]  # [ROWS, 1]
    at = (r // heads) * stride0 + (r % heads) * stride1  # [ROWS] element offsets of the source rows
    x = tl.load(src + at[:, None] + feats[None, :], mask=inside, other=0.0)  # [ROWS, D]
    tl.store(dst + r[:, None] * HEAD_DIM + feats[None, :], x.to(tl.float16), mask=inside)


@triton.jit(do_not_specialize=["n_tokens", "v_rows", "heads", "kv_heads", "stride_q0", "stride_q1",
                               "stride_v0", "stride_v1", "n_tiles"])  # fmt: skip
def _fp8_score_operands_kernel(
    Q, V, Q8, QScale, V16, CuSeqlensQ, n_tokens, v_rows, heads, kv_heads, stride_q0, stride_q1, stride_v0,
    stride_v1, n_tiles, n_q, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    """Grid ``n_q + cdiv(v_rows, ROWS)``: the ``n_q`` q tiles first (:func:`_q_tile`; ``n_q`` = sequences
    * ``n_tiles`` * ``heads``), then v's rows as float16, ``ROWS`` a program (:func:`_v_rows`; ``v_rows``
    = tokens * ``kv_heads``, 0 without new V)."""
    pid = tl.program_id(0)
    if pid < n_q:
        _q_tile(Q, Q8, QScale, CuSeqlensQ, n_tokens, heads, stride_q0, stride_q1, pid, n_tiles, HEAD_DIM,
                BLOCK_M)  # fmt: skip
    else:
        _v_rows(V, V16, v_rows, kv_heads, stride_v0, stride_v1, pid - n_q, HEAD_DIM, ROWS)


def fp8_score_operands(q: torch.Tensor, v: torch.Tensor | None, cu_seqlens_q: torch.Tensor,
                       max_query_len: int, block_m: int) -> tuple:  # fmt: skip
    """``(q8, q_scale, v16)`` of the module docstring, in one launch: q ``[tokens, heads, D]`` (16-bit, unit
    feature stride) as ``q8`` ``[tokens, heads, 2, D]`` e4m3 and ``q_scale`` ``[heads, tokens]`` float32
    (tiles of ``block_m`` rows of each sequence of ``cu_seqlens_q``, at most ``max_query_len`` rows); v
    ``[tokens, kv_heads, D]`` (None: None) as a contiguous float16 ``v16``. D a power of two. Rows past the
    sequences' first ``max_query_len`` are left unwritten: the kernel writes no output there."""
    rows_block = 32
    tokens, heads, d = q.shape
    q8 = torch.empty((tokens, heads, 2, d), dtype=torch.float8_e4m3fn, device=q.device)
    q_scale = torch.empty((heads, tokens), dtype=torch.float32, device=q.device)
    if v is None:
        v16, v_rows, kv_heads, vs, v_args = None, 0, 1, (0, 0), (q, q8)
    else:
        v16 = torch.empty(v.shape, dtype=torch.float16, device=v.device)
        v_rows, kv_heads = v.shape[0] * v.shape[1], v.shape[1]
        vs, v_args = (v.stride(0), v.stride(1)), (v, v16)
    n_tiles = max(-(-max_query_len // block_m), 1)
    n_q = (cu_seqlens_q.shape[0] - 1) * n_tiles * heads
    grid = (n_q + triton.cdiv(v_rows, rows_block),)
    if grid[0] > 0 and tokens > 0:
        _fp8_score_operands_kernel[grid](
            q, v_args[0], q8, q_scale, v_args[1], cu_seqlens_q, tokens, v_rows, heads, kv_heads, q.stride(0),
            q.stride(1), *vs, n_tiles, n_q, HEAD_DIM=d, BLOCK_M=block_m, ROWS=rows_block,
        )  # fmt: skip
    return q8, q_scale, v16
