"""Gluon device code (sm90) that keeps the warp-specialised prefill kernels' stores inside the tensors
whatever the device metadata says: :func:`zero_rows`, the Gluon twin of
:func:`prefill_runtime.bounds.zero_rows` (the scalar clamps and the status report are
:mod:`prefill_runtime.bounds`' own functions, which Gluon kernels call as they are).

Import only where ``triton.experimental.gluon`` exists (Triton >= 3.5); the kernel packages guard it.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def zero_rows(O, stride_ot, stride_oh, tok0, r_lo, r_hi, head, Lse, stride_lse_h, HEAD_DIM: gl.constexpr):
    """Rows ``[r_lo, r_hi)`` of a sequence whose first token is ``tok0``, head ``head``, written as a row
    that sees no key, by the calling partition's warps: ``O`` 0 (``HEAD_DIM`` features, strides
    ``(stride_ot, stride_oh, 1)``) and, with ``Lse`` (``[heads, tokens]``, head stride ``stride_lse_h``,
    token stride 1; None: none), ``-inf``. For the rows no program computes (a max length smaller than
    the sequence) and the tile of a program with no key block to read."""
    NW: gl.constexpr = gl.num_warps()
    L: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])
    ROWS: gl.constexpr = 4 * NW
    offs_r = gl.arange(0, ROWS, layout=gl.SliceLayout(1, L))  # [ROWS]
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, L))  # [D]
    zero = gl.zeros([ROWS, HEAD_DIM], O.dtype.element_ty, layout=L)  # [ROWS, D]
    p_head = O + head.to(gl.int64) * stride_oh
    for r0 in range(r_lo, r_hi, ROWS):
        rows = r0 + offs_r  # [ROWS]
        m_r = rows < r_hi  # [ROWS]
        toks = tok0.to(gl.int64) + rows.to(gl.int64)  # [ROWS]
        gl.store(p_head + toks[:, None] * stride_ot + offs_d[None, :], zero,
                 mask=m_r[:, None] & (offs_d < HEAD_DIM)[None, :])  # fmt: skip
        if Lse is not None:
            p_lse = Lse + head.to(gl.int64) * stride_lse_h + toks  # [ROWS]
            gl.store(p_lse, gl.full([ROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, L)), mask=m_r)
