"""Device function (``@triton.jit``, scalar: the Gluon kernels call it too) that reads a sequence's
metadata and clamps it into the extents the host knows: :func:`sequence_geometry`, the first thing every
prefix-prefill kernel program does, so that no load or store leaves the tensors whatever
``cu_seqlens_q``, ``seq_lens`` and the block table say.
"""

import triton
import triton.language as tl

from prefill_runtime.bounds import ROWS, SEQ_LEN, TABLE_WIDTH, clamp_span

# positions stay below this (every tile index past it still fits int32): a longer context is cut here
MAX_POSITION = tl.constexpr(2**31 - 2**20)


@triton.jit
def sequence_geometry(Cu_seqlens_q, Seq_lens, seq, n_tokens, n_bt_cols, num_blocks, page_size,
                      KV_FROM_CACHE: tl.constexpr):  # fmt: skip
    """Sequence ``seq``'s ``(q_start, q_len, ctx_len, need, cache_len, flags)``, read from its metadata and
    clamped into the extents the host knows (shared by the Triton kernel and the Gluon ones):

    * query rows ``[q_start, q_start + q_len)`` (int64 start, int32 length): ``cu_seqlens_q``'s span
      clamped into ``[0, n_tokens)`` (:func:`prefill_runtime.bounds.clamp_span`; a decreasing span is
      empty);
    * ``ctx_len`` (int32): ``seq_lens[seq] - q_len``, at least 0 (a sequence shorter than its query has
      no context) and at most ``MAX_POSITION - q_len``;
    * ``need`` (int32): the cached tokens the sequence reads (``ctx_len``, or ``ctx_len + q_len`` with
      ``KV_FROM_CACHE``); ``cache_len`` (int32): those the block table holds, ``min(need, n_bt_cols *
      page_size)``, 0 for a cache without blocks: no page at or past the table's width is ever read;
    * ``flags``: the status bits (:mod:`prefill_runtime.status`) ``ROWS``, ``SEQ_LEN``,
      ``TABLE_WIDTH`` where a clamp changed a value.

    For well-formed metadata every value is the one read (and ``cache_len == need``)."""
    q_start, q_end, moved = clamp_span(
        tl.load(Cu_seqlens_q + seq).to(tl.int64), tl.load(Cu_seqlens_q + seq + 1).to(tl.int64),
        n_tokens.to(tl.int64),
    )  # fmt: skip
    q_len = q_end - q_start  # int64, in [0, n_tokens]
    seq_raw = tl.load(Seq_lens + seq).to(tl.int64)
    ctx = tl.maximum(tl.minimum(seq_raw, MAX_POSITION) - q_len, 0)
    if KV_FROM_CACHE:
        need = ctx + q_len
    else:
        need = ctx
    width = n_bt_cols.to(tl.int64) * page_size  # tokens the table's columns hold
    cache_len = tl.where(num_blocks > 0, tl.minimum(need, width), 0)
    flags = (
        tl.where(moved, ROWS, 0)
        | tl.where(seq_raw < q_len, SEQ_LEN, 0)
        | tl.where(need > width, TABLE_WIDTH, 0)
    )
    return q_start, q_len.to(tl.int32), ctx.to(tl.int32), need.to(tl.int32), cache_len.to(tl.int32), flags
