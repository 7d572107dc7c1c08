"""Device functions (``@triton.jit``) that keep a prefill kernel's loads and stores inside the extents the
host knows whatever the device metadata says, and report what they corrected (the bits of
:mod:`prefill_runtime.status`).

:func:`clamp_span` and :func:`report` are scalar: the Gluon kernels call them too. :func:`zero_rows`
(a sequence's rows that no program of the grid computes) has a Gluon twin,
:func:`prefill_runtime.gluon_bounds.zero_rows`.
"""

import triton
import triton.language as tl

from prefill_runtime import status as _status

# the status bits (prefill_runtime.status), as the kernels use them
BLOCK_ID = tl.constexpr(_status.BLOCK_ID)
TABLE_WIDTH = tl.constexpr(_status.TABLE_WIDTH)
ROWS = tl.constexpr(_status.ROWS)
MAX_LEN = tl.constexpr(_status.MAX_LEN)
SEQ_LEN = tl.constexpr(_status.SEQ_LEN)


@triton.jit
def clamp_span(start, end, n):
    """The token span ``[start, end)`` clamped into ``[0, n]``: ``start`` into ``[0, n]``, then ``end`` into
    ``[start, n]`` (a decreasing span becomes empty). Returns ``(start, end, moved)`` in the integer type
    given, ``moved`` (int1) true when either bound changed: for a well-formed span the values as given."""
    s = tl.minimum(tl.maximum(start, 0), n)
    e = tl.minimum(tl.maximum(end, s), n)
    return s, e, (s != start) | (e != end)


@triton.jit
def report(Status, flags):
    """OR ``flags`` (int32 status bits) into ``Status[0]`` when they are not 0: one atomic on the malformed
    path only, nothing otherwise. ``Status`` None (a constexpr: the caller passed no ``status=``):
    nothing."""
    if Status is not None:
        if flags != 0:
            tl.atomic_or(Status, flags)


@triton.jit
def zero_rows(O, stride_ot, stride_oh, tok0, r_lo, r_hi, head, Lse, stride_lse_h, BLOCK_M: tl.constexpr,
              BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr):  # fmt: skip
    """Rows ``[r_lo, r_hi)`` of a sequence whose first token is ``tok0`` (int64), head ``head``, written as a
    row that sees no key: ``O`` 0 (features ``[0, HEAD_DIM)``, strides ``(stride_ot, stride_oh, 1)``) and,
    with ``Lse`` (``[heads, tokens]``, head stride ``stride_lse_h``, token stride 1; None: none), ``-inf``.
    ``BLOCK_M`` rows a step. For rows the grid does not cover (a max length smaller than a sequence)."""
    offs_r = tl.arange(0, BLOCK_M)  # [BM]
    offs_d = tl.arange(0, BLOCK_D)  # [BD]
    zero = tl.zeros([BLOCK_M, BLOCK_D], dtype=O.dtype.element_ty)  # [BM, BD]
    for r0 in tl.range(r_lo, r_hi, BLOCK_M):
        rows = r0 + offs_r  # [BM]
        m_r = rows < r_hi  # [BM]
        toks = tok0 + rows.to(tl.int64)  # [BM]
        p_o = O + head.to(tl.int64) * stride_oh + toks[:, None] * stride_ot + offs_d[None, :]  # [BM, BD]
        tl.store(p_o, zero, mask=m_r[:, None] & (offs_d < HEAD_DIM)[None, :])
        if Lse is not None:
            p_lse = Lse + head.to(tl.int64) * stride_lse_h + toks  # [BM]
            tl.store(p_lse, tl.full([BLOCK_M], float("-inf"), tl.float32), mask=m_r)
