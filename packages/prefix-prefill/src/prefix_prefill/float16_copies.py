"""The float16 copies a bfloat16 call over an fp8 cache runs on (``gluon_launch._float16_operands``): q
times a power of two, and the new tokens' k and v, in one kernel launch.

Why: every fp8 value is a float16, so the Gluon kernel's converter turns an fp8 pair into float16 in one
instruction where bfloat16 would take an integer sequence; the call then computes in float16 and q, k and
v must be float16 too. One launch (:func:`float16_copies`) writes all three, where torch's ``mul`` and
``to`` take one or two kernels each.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _copy_rows(src, dst, rows, heads, stride0, stride1, mul, p, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr):
    """Rows ``[p * ROWS, (p + 1) * ROWS)`` of ``rows`` (row ``r``: token ``r // heads``, head ``r % heads``
    of ``src``, strides in elements, unit feature stride) times ``mul`` into row ``r`` of the contiguous
    float16 ``dst``; rounding to nearest even, through float32."""
    feats = tl.arange(0, HEAD_DIM)  # [D]
    r = p.to(tl.int64) * ROWS + tl.arange(0, ROWS)  # [ROWS]
    inside = (r < rows)[:, None]  # [ROWS, 1]
    at = (r // heads) * stride0 + (r % heads) * stride1  # [ROWS] element offsets of the source rows
    x = tl.load(src + at[:, None] + feats[None, :], mask=inside, other=0.0)  # [ROWS, D]
    tl.store(
        dst + r[:, None] * HEAD_DIM + feats[None, :], (x.to(tl.float32) * mul).to(tl.float16), mask=inside
    )


@triton.jit(do_not_specialize=["q_rows", "kv_rows", "q_heads", "kv_heads", "stride_q0", "stride_q1",
                               "stride_k0", "stride_k1", "stride_v0", "stride_v1"])  # fmt: skip
def _float16_copies_kernel(
    Q, K, V, Q16, K16, V16, q_rows, kv_rows, q_heads, kv_heads, stride_q0, stride_q1, stride_k0, stride_k1,
    stride_v0, stride_v1, q_mul, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    """Grid ``cdiv(q_rows, ROWS) + 2 * cdiv(kv_rows, ROWS)``: q's rows first (``q_rows`` = tokens *
    ``q_heads``, times ``q_mul``), then k's, then v's (``kv_rows`` each), ``ROWS`` a program
    (:func:`_copy_rows`)."""
    pid = tl.program_id(0)
    n_q = tl.cdiv(q_rows, ROWS)
    n_kv = tl.cdiv(kv_rows, ROWS)
    if pid < n_q:
        _copy_rows(Q, Q16, q_rows, q_heads, stride_q0, stride_q1, q_mul, pid, HEAD_DIM, ROWS)
    elif pid < n_q + n_kv:
        _copy_rows(K, K16, kv_rows, kv_heads, stride_k0, stride_k1, 1.0, pid - n_q, HEAD_DIM, ROWS)
    else:
        _copy_rows(V, V16, kv_rows, kv_heads, stride_v0, stride_v1, 1.0, pid - n_q - n_kv, HEAD_DIM, ROWS)


def float16_copies(q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, q_mul: float) -> tuple:
    """``(q16, k16, v16)``: contiguous float16 copies of q ``[tokens, heads, D]`` times ``q_mul`` (a power of
    two) and of k, v ``[tokens, kv_heads, D]`` (None: None), each with a unit feature stride and D a power
    of two (the fp8-cache Gluon forms' heads 64 and 128), in one launch."""
    rows_block = 32
    q16 = torch.empty(q.shape, dtype=torch.float16, device=q.device)
    tokens, heads, d = q.shape
    if k is None:
        k16 = v16 = None
        kv_rows, kv_heads, ks, vs, kv_args = 0, 1, (0, 0), (0, 0), (q, q, q16, q16)
    else:
        k16 = torch.empty(k.shape, dtype=torch.float16, device=k.device)
        v16 = torch.empty(v.shape, dtype=torch.float16, device=v.device)
        kv_rows, kv_heads = k.shape[0] * k.shape[1], k.shape[1]
        ks, vs, kv_args = (k.stride(0), k.stride(1)), (v.stride(0), v.stride(1)), (k, v, k16, v16)
    q_rows = tokens * heads
    grid = (triton.cdiv(q_rows, rows_block) + 2 * triton.cdiv(kv_rows, rows_block),)
    if grid[0] > 0:
        _float16_copies_kernel[grid](
            q, kv_args[0], kv_args[1], q16, kv_args[2], kv_args[3], q_rows, kv_rows, heads, kv_heads,
            q.stride(0), q.stride(1), *ks, *vs, q_mul, HEAD_DIM=d, ROWS=rows_block,
        )  # fmt: skip
    return q16, k16, v16
