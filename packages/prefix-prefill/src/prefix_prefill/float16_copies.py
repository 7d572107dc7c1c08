"""The float16 copies a bfloat16 call over an fp8 cache runs on (``gluon_launch._float16_operands``): q
times a power of two, and the new tokens' k and v, in one kernel launch.

Why: every fp8 value is a float16, so the Gluon kernel's converter turns an fp8 pair into float16 in one
instruction where bfloat16 would take an integer sequence; the call then computes in float16 and q, k and
v must be float16 too. One launch (:func:`float16_copies`) writes all three, where torch's ``mul`` and
``to`` take one or two kernels each, into one allocation; the launch goes straight to the compiled
variant after its first call (``prefill_runtime.compiled_launch``), not through ``kernel[grid]``, whose
binding and specialisation of 17 arguments would cost more host time than the attention's own launch.
A warm call (:func:`float16_copy_pointers`) goes one step further: it takes the copies as data pointers
into the allocation (no views: three tensor views cost more host time than the rest of the copy) and
launches through a frame (``compiled_launch.Frame``) kept per geometry, which fills only the pointers,
the row counts and the grid.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from prefill_runtime.compiled_launch import CompiledLaunches


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
    of two (the fp8-cache Gluon forms' heads 64, 128 and 256), in one launch. The three copies are views of
    one allocation (each starts at a multiple of ``D`` elements: 128-byte aligned)."""
    tokens, heads, d = q.shape
    buf, n_q, n_kv = _allocation(q, k)
    q16 = buf[:n_q].view(q.shape)
    if k is None:
        k16 = v16 = None
        kv_rows, kv_heads, ks, vs, kv_args = 0, 1, (0, 0), (0, 0), (q, q, q16, q16)
    else:
        k16 = buf[n_q : n_q + n_kv].view(k.shape)
        v16 = buf[n_q + n_kv :].view(v.shape)
        kv_rows, kv_heads = k.shape[0] * k.shape[1], k.shape[1]
        ks, vs, kv_args = (k.stride(0), k.stride(1)), (v.stride(0), v.stride(1)), (k, v, k16, v16)
    q_rows = tokens * heads
    grid = (_programs(q_rows, kv_rows), 1, 1)
    if grid[0] > 0:
        args = (q, kv_args[0], kv_args[1], q16, kv_args[2], kv_args[3], q_rows, kv_rows, heads, kv_heads,
                q.stride(0), q.stride(1), *ks, *vs, q_mul)  # fmt: skip
        key, frame_key = _keys(q, k, v, q_mul)
        _COPIES.launch(key, grid, args, {"HEAD_DIM": d, "ROWS": _ROWS}, {}, q.device)
        if _COPIES.direct_now() and _COPIES.frame(frame_key) is None:  # (a profiler's hooks: no frames)
            _COPIES.make_frame(key, frame_key, args, {"HEAD_DIM": d, "ROWS": _ROWS}, {}, _PER_CALL)
    return q16, k16, v16


def float16_copy_pointers(q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, q_mul: float,
                          stream: int) -> tuple:  # fmt: skip
    """:func:`float16_copies` for a warm call on ``stream`` (the current raw stream of q's device):
    ``(buffer, q16, k16, v16)`` with the copies as data pointers into ``buffer`` (the allocation: the
    caller holds it until its own launch is enqueued; k16 and v16 are q16's pointer with ``k=None``),
    launched through the frame kept for this geometry (sources' dtypes, alignment, heads, strides; made
    by :func:`float16_copies`' first launch of it). Where there is none yet (or a launch hook is
    installed) it runs :func:`float16_copies` and returns its tensors' pointers."""
    frame = _COPIES.frame(_keys(q, k, v, q_mul)[1])
    if frame is None:
        q16, k16, v16 = float16_copies(q, k, v, q_mul)
        qp = q16.data_ptr()
        return q16, qp, (qp if k16 is None else k16.data_ptr()), (qp if v16 is None else v16.data_ptr())
    shape = q.shape
    q_rows = shape[0] * shape[1]
    buf, n_q, n_kv = _allocation(q, k)
    qp = buf.data_ptr()
    if k is None:
        kp = vp = qp
        src_q = src_k = src_v = q.data_ptr()
        kv_rows = 0
    else:
        kp = qp + 2 * n_q  # (the views float16_copies makes, as pointers: two bytes an element)
        vp = kp + 2 * n_kv
        src_q, src_k, src_v = q.data_ptr(), k.data_ptr(), v.data_ptr()
        kv_rows = k.shape[0] * k.shape[1]
    grid0 = _programs(q_rows, kv_rows)
    if grid0 > 0:
        frame(grid0, 1, 1, stream, 0, (), (src_q, src_k, src_v, qp, kp, vp, q_rows, kv_rows))
    return buf, qp, kp, vp


def _allocation(q: torch.Tensor, k: torch.Tensor | None) -> tuple:
    """``(buffer, n_q, n_kv)``: the one float16 allocation of the copies, q's ``n_q`` elements then k's and
    v's ``n_kv`` each (0 with ``k=None``)."""
    n_q = q.numel()
    n_kv = 0 if k is None else k.numel()
    return torch.empty(n_q + 2 * n_kv, dtype=torch.float16, device=q.device), n_q, n_kv


#: Rows of the sources a program copies.
_ROWS = 32


def _programs(q_rows: int, kv_rows: int) -> int:
    """The copy kernel's grid: q's programs, then k's and v's (:data:`_ROWS` rows each)."""
    return -(-q_rows // _ROWS) + 2 * -(-kv_rows // _ROWS)


#: The copy kernel's compiled variants, launched directly after each one's first call.
_COPIES = CompiledLaunches(_float16_copies_kernel, maxsize=64)


def _keys(q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, q_mul: float) -> tuple:
    """``(variant key, frame key)`` of a :func:`float16_copies` launch. The variant key is what fixes
    Triton's specialisation: the sources' dtypes and 16-byte alignment (the float16 copies are fresh
    allocations: aligned), the head size and the device (the integers are ``do_not_specialize`` and
    ``q_mul`` a float, so no value enters it). The frame key adds every argument a frame keeps (heads,
    strides, ``q_mul``), the ones :data:`_PER_CALL` names aside."""
    dev, d = q.get_device(), q.shape[2]
    if k is None:
        key = (dev, d, True, q.dtype, q.data_ptr() % 16 == 0)
        return key, (key, q.shape[1], q.stride(0), q.stride(1), q_mul)
    key = (dev, d, False, q.dtype, q.data_ptr() % 16 == 0, k.dtype, k.data_ptr() % 16 == 0, v.dtype,
           v.data_ptr() % 16 == 0)  # fmt: skip
    return key, (key, q.shape[1], q.stride(0), q.stride(1), k.shape[1], k.stride(0), k.stride(1), v.stride(0),
                 v.stride(1), q_mul)  # fmt: skip


#: A frame's per-call arguments (:func:`float16_copy_pointers` passes them in this order).
_PER_CALL = ("Q", "K", "V", "Q16", "K16", "V16", "q_rows", "kv_rows")
