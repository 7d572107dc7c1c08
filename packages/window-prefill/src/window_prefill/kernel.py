"""Triton kernels: varlen sliding-window prefill attention whose cost grows as O(N * W), not O(N^2).

One program handles one query tile (``BLOCK_M`` rows) of one query head of one sequence. Before the
key loop it computes the key range ``[lo, hi)`` that ANY row of the tile may see (window, causality
and sequence end folded in) and splits it into masked edge blocks and an unmasked interior where
every (row, key) pair is visible, so K/V blocks wholly outside ``[lo, hi)`` are never loaded and only
the edge blocks pay for masks. Edge-block loads are additionally masked to ``[lo, hi)``, so no key
position outside the tile's visible range is ever read.

Conventions (host side documents tensors; here only what the kernel assumes):

* positions are relative to the sequence start: query row ``i`` and key ``j`` in ``[0, seq_len)``;
  query ``i`` sits at key position ``i`` (self-attention, ``len_q == len_k``).
* key ``j`` is visible to row ``i`` iff ``(not IS_CAUSAL or j <= i)`` and
  ``(not HAS_LEFT or i - j <= window_left)`` and ``(not HAS_RIGHT or j - i <= window_right)``.
* scores are kept in the log2 domain: ``s2 = (q . k) * qk_scale`` with ``qk_scale = scale * log2(e)``;
  the sink logit is multiplied by ``log2(e)`` once. With ``SOFTCAP``: ``s2 = tanh(q . k * tanh_scale)
  * qk_scale``, ``tanh_scale = scale / softcap``, ``qk_scale = softcap * log2(e)`` (``SOFTCAP=2``: the
  hardware tanh of NVIDIA GPUs, ``tanh.approx.f32``; 1: tanh through exp2, every backend).
* all token * stride products are int64, or int32 with ``WIDE_OFFSETS=False`` (the host passes it
  only when every element of K and V lies less than 2**31 elements from the tensor's start).
* ``HAS_ALIBI``: ``- slope * |i - j|`` (``slope`` = ``Alibi[head]``, times log2(e)) joins each score after
  the scale and cap, before the key-0 sink; the scale is then not folded into exp2's FMA.
* ``OutScale`` (an fp8 ``O``): the epilogue stores ``clamp(out / OutScale[0], -FP8_OUT_MAX, FP8_OUT_MAX)``
  in O's fp8 format (vLLM's fused output quantisation); rows that see no key stay 0.
* ``RETURN_LSE``: the epilogue also stores each row's softmax log-sum-exp. The running max ``m_i``
  and sum ``l_i`` are in the log2 domain above (``l_i = sum_j exp2(s2_j - m_i)``, the denominator sink
  included), so the natural-log LSE is ``(m_i + log2(l_i)) * ln(2)``; ``-inf`` where ``l_i == 0``.
* bounds, whatever the metadata holds (no host sync): each sequence's span is clamped into the
  ``n_tokens`` rows of the tensors (:func:`program_tile`), so every load and store stays inside them;
  the rows of a sequence longer than the grid covers (``max_len`` too small) are written as 0 (``-inf``
  LSE) by each head's program of its last query tile; ``Status`` (the caller's ``status=``) gets the
  bits of :mod:`prefill_runtime.status` from head 0's program of that tile, on the malformed path only.
"""

import triton
import triton.language as tl

from prefill_runtime.bounds import MAX_LEN, ROWS, clamp_span, report, zero_rows
from prefill_runtime.device import tanh


@triton.jit
def _load_rows(p, m, USE_MASK: tl.constexpr):
    """A [BN, BD] K or V tile; with ``USE_MASK`` lanes outside ``m`` (broadcast to the tile) read 0."""
    if USE_MASK:
        return tl.load(p, mask=m, other=0.0)
    else:
        return tl.load(p)


@triton.jit
def _attn_block(
    acc, l_i, m_i, b_q, p_k_base, p_v_base, tok0, stride_kt, stride_vt, offs_m, offs_n, offs_d, m_d, n0,
    key_lo, key_hi, window_left, window_right, qk_scale, sink2,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, BIAS_KEY0: tl.constexpr, MASKED: tl.constexpr,
    IEEE_FP32: tl.constexpr, WIDE_OFFSETS: tl.constexpr, FOLD: tl.constexpr, k_desc, v_desc, kv_col,
    TMA: tl.constexpr, tanh_scale, SOFTCAP: tl.constexpr, slope2, HAS_ALIBI: tl.constexpr,
):  # fmt: skip
    """Online-softmax update of (acc, l_i, m_i) with the key block at ``n0`` (see :func:`_attn_blocks`).
    ``FOLD`` (``qk_scale > 0``, no key-0 bias): the row max is taken on the raw ``q . k`` and scaled
    once per row, and the scale folds into the exponent's FMA (one op per score, not two).
    Masked blocks of a two-sided band (a left window and a causal or right bound) test visibility as
    one unsigned compare of ``q - k`` against the band's width (one subtract and one compare per score
    instead of two of each and an and).
    ``TMA`` (interior blocks only): K and V come through the tensor descriptors ``k_desc``/``v_desc``
    ([total_tokens, kv_heads * HEAD_DIM] views, block [BLOCK_N, HEAD_DIM]) at column ``kv_col``: one
    bulk copy per tile, no per-lane address arithmetic.
    ``SOFTCAP``: the raw ``q . k`` becomes ``tanh(q . k * tanh_scale)`` first (``tanh_scale`` =
    softmax_scale / softcap) and ``qk_scale`` is softcap * log2(e): logits ``softcap * tanh(scale *
    q . k / softcap)`` in log2 units, with everything after (fold, masks, bias) unchanged.
    ``HAS_ALIBI``: ``- slope2 * |q - k|`` joins each score after the scale and cap (``slope2`` = the
    head's slope * log2(e); no folded scale: the bias is in log2 units)."""
    n0 = tl.multiple_of(n0, BLOCK_N)
    offs_k = n0 + offs_n  # [BN] key positions
    if WIDE_OFFSETS:
        p_tok = (tok0 + offs_k).to(tl.int64)  # [BN]
        p_k = p_k_base + p_tok[:, None] * stride_kt + offs_d[None, :]  # [BN, BD]
        p_v = p_v_base + p_tok[:, None] * stride_vt + offs_d[None, :]  # [BN, BD]
    else:
        p_k = (p_k_base + tok0 * stride_kt) + (offs_k * stride_kt)[:, None] + offs_d[None, :]  # [BN, BD]
        p_v = (p_v_base + tok0 * stride_vt) + (offs_k * stride_vt)[:, None] + offs_d[None, :]  # [BN, BD]
    if MASKED:
        m_key = (offs_k >= key_lo) & (offs_k < key_hi)  # [BN]
        m_kv = m_key[:, None] & m_d[None, :]  # [BN, BD]
    else:
        m_kv = m_d[None, :]  # [1, BD] padded features only
    LOAD_MASK: tl.constexpr = MASKED or HEAD_DIM != BLOCK_D
    USE_TMA: tl.constexpr = TMA and not MASKED
    if USE_TMA:
        tl.static_assert(HEAD_DIM == BLOCK_D, "descriptor loads need an unpadded head dim")
        row = (tok0 + n0).to(tl.int32)  # the host keeps total_tokens < 2**31
        b_k = k_desc.load([row, kv_col])  # [BN, BD]
    else:
        b_k = _load_rows(p_k, m_kv, LOAD_MASK)  # [BN, BD]
    if IEEE_FP32:
        b_s = tl.dot(b_q, tl.trans(b_k), input_precision="ieee")  # [BM, BN] raw q . k
    else:
        b_s = tl.dot(b_q, tl.trans(b_k))  # [BM, BN] raw q . k
    if SOFTCAP:
        b_s = tanh(b_s * tanh_scale, SOFTCAP >= 2)  # [BM, BN] in (-1, 1); times qk_scale = softcap * log2(e)
    if not FOLD:
        b_s = b_s * qk_scale  # [BM, BN] log2 units
    if HAS_ALIBI:
        tl.static_assert(not FOLD, "the ALiBi bias is in log2 units: no folded scale")
        # positions as float32 (exact below 2**24): a subtract and an FMA a score, no conversion per score
        q_f = offs_m.to(tl.float32)  # [BM]
        k_f = offs_k.to(tl.float32)  # [BN]
        b_s = b_s - slope2 * tl.abs(q_f[:, None] - k_f[None, :])  # [BM, BN]
    if MASKED:
        if (IS_CAUSAL or HAS_RIGHT) and HAS_LEFT:
            # visible iff lo <= q - k <= window_left, lo = 0 (causal) or -window_right: one unsigned
            # compare of q - k - lo against window_left - lo (a negative difference wraps to a huge one)
            if IS_CAUSAL:
                d_lo = window_right * 0
            else:
                d_lo = -window_right
            # keys at or past key_hi are never visible to a real row: raise each row's lower bound on
            # q - k to q - (key_hi - 1), so the one compare also keeps the block inside the sequence
            # (for a real row q < key_hi, so the bound stays <= 0 and window_left - lo_q >= 0)
            lo_q = tl.maximum(d_lo, offs_m - (key_hi - 1))  # [BM]
            b_d = (offs_m - lo_q)[:, None] - offs_k[None, :]  # [BM, BN] q - k - lo_q
            m_vis = (
                b_d.to(tl.uint32, bitcast=True) <= (window_left - lo_q).to(tl.uint32, bitcast=True)[:, None]
            )
        else:
            m_vis = m_key[None, :] & (offs_m[:, None] >= 0)  # [BM, BN]
            if IS_CAUSAL:
                m_vis = m_vis & (offs_k[None, :] <= offs_m[:, None])  # [BM, BN]
            if HAS_LEFT:
                m_vis = m_vis & (offs_m[:, None] - offs_k[None, :] <= window_left)  # [BM, BN]
            if HAS_RIGHT:
                m_vis = m_vis & (offs_k[None, :] - offs_m[:, None] <= window_right)  # [BM, BN]
        if BIAS_KEY0:
            tl.static_assert(not FOLD, "the key-0 bias is in log2 units: no folded scale")
            b_s = tl.where(offs_k[None, :] == 0, b_s + sink2, b_s)  # [BM, BN]
        b_s = tl.where(m_vis, b_s, float("-inf"))  # [BM, BN]
        if FOLD:
            m_new = tl.maximum(m_i, tl.max(b_s, 1) * qk_scale)  # [BM]
        else:
            m_new = tl.maximum(m_i, tl.max(b_s, 1))  # [BM]
        # A row with nothing visible so far keeps m = -inf; shift by 0 so exp2 gives 0, not NaN.
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # [BM]
    else:
        if FOLD:
            m_new = tl.maximum(m_i, tl.max(b_s, 1) * qk_scale)  # [BM]
        else:
            m_new = tl.maximum(m_i, tl.max(b_s, 1))  # [BM]
        m_shift = m_new  # [BM] finite: every key of an interior block is visible
    if FOLD:
        s_mul = qk_scale  # exp2(b_s * s_mul - m): one FMA per score
    else:
        s_mul = 1.0
    b_p = tl.math.exp2(b_s * s_mul - m_shift[:, None])  # [BM, BN]
    alpha = tl.math.exp2(m_i - m_shift)  # [BM]
    l_i = l_i * alpha + tl.sum(b_p, 1)  # [BM]
    acc = acc * alpha[:, None]  # [BM, BD]
    if USE_TMA:
        b_v = v_desc.load([row, kv_col])  # [BN, BD]
    else:
        b_v = _load_rows(p_v, m_kv, LOAD_MASK)  # [BN, BD]
    if IEEE_FP32:
        acc = tl.dot(b_p.to(b_v.dtype), b_v, acc, input_precision="ieee")  # [BM, BD]
    else:
        acc = tl.dot(b_p.to(b_v.dtype), b_v, acc)  # [BM, BD]
    m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attn_blocks(
    acc,
    l_i,
    m_i,
    b_q,
    p_k_base,
    p_v_base,
    tok0,
    stride_kt,
    stride_vt,
    offs_m,
    offs_n,
    offs_d,
    n_first,
    n_split,
    n_second,
    n_blocks,
    key_lo,
    key_hi,
    window_left,
    window_right,
    qk_scale,
    sink2,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    BIAS_KEY0: tl.constexpr,
    MASKED: tl.constexpr,
    IEEE_FP32: tl.constexpr,
    WIDE_OFFSETS: tl.constexpr,
    FOLD: tl.constexpr,
    k_desc,
    v_desc,
    kv_col,
    TMA: tl.constexpr,
    tanh_scale,
    SOFTCAP: tl.constexpr,
    slope2,
    HAS_ALIBI: tl.constexpr,
):
    """Online-softmax update of (acc, l_i, m_i) over ``n_blocks`` key blocks. MASKED: block ``t`` starts
    at ``n_first + t * BLOCK_N`` for ``t < n_split``, else at ``n_second + (t - n_split) * BLOCK_N``
    (both multiples of BLOCK_N), so one loop walks both edge segments of a tile. MASKED=False: blocks
    ``n_first, n_first + BLOCK_N, ...`` (the key position is the loop variable, which keeps the hot
    loop's address arithmetic incremental: 597 SASS instructions per iteration instead of 684 with
    the two-segment form, hd128 on sm_90a); the caller guarantees every key of every block is inside
    [key_lo, key_hi) and visible to every row of the tile, so no mask is built and no load is masked
    (except padded D)."""
    m_d = offs_d < HEAD_DIM  # [BD]
    if MASKED:  # the loop counts blocks
        i_lo = 0
        i_hi = n_blocks
        STEP: tl.constexpr = 1
    else:  # the loop variable is the key position itself
        i_lo = n_first
        i_hi = n_first + n_blocks * BLOCK_N
        STEP: tl.constexpr = BLOCK_N
    for i in tl.range(i_lo, i_hi, STEP):
        if MASKED:
            n0 = tl.where(i < n_split, n_first + i * BLOCK_N, n_second + (i - n_split) * BLOCK_N)
        else:
            n0 = i
        acc, l_i, m_i = _attn_block(
            acc, l_i, m_i, b_q, p_k_base, p_v_base, tok0, stride_kt, stride_vt, offs_m, offs_n, offs_d, m_d, n0,
            key_lo, key_hi, window_left, window_right, qk_scale, sink2, HEAD_DIM, BLOCK_D, BLOCK_N, IS_CAUSAL,
            HAS_LEFT, HAS_RIGHT, BIAS_KEY0, MASKED, IEEE_FP32, WIDE_OFFSETS, FOLD, k_desc, v_desc, kv_col, TMA,
            tanh_scale, SOFTCAP, slope2, HAS_ALIBI,
        )  # fmt: skip
    return acc, l_i, m_i


@triton.jit
def program_tile(
    Starts, Lens, n_tokens, max_len, Status, BLOCK_M: tl.constexpr, IS_CAUSAL: tl.constexpr,
    LENS_FROM_STARTS: tl.constexpr, TOK_I64: tl.constexpr,
):  # fmt: skip
    """This program's ``(pid_m, head, tok0, seq_len)`` on the grid ``(cdiv(max_len, BLOCK_M), num_heads,
    batch)``: query tile, head, the sequence's first token (int64 with ``TOK_I64``, else int32) and its
    length (int32): the span ``[Starts[b], Starts[b + 1])`` with ``LENS_FROM_STARTS``, else ``[Starts[b],
    Starts[b] + Lens[b])``, clamped into the ``n_tokens`` rows of the tensors
    (:func:`prefill_runtime.bounds.clamp_span`: a decreasing span is empty), so no load or store leaves
    them whatever the metadata says. Head 0's program of the sequence's last query tile reports into
    ``Status`` (None: no report) ``ROWS`` when the clamp changed the span and ``MAX_LEN`` when the
    sequence is longer than ``max_len`` (:mod:`prefill_runtime.status`). Causal grids run
    backwards: the latest query tiles carry the most keys, so they start first. Shared by this Triton
    kernel and the Gluon one (``window_prefill.gluon_kernel``)."""
    if IS_CAUSAL:
        pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    else:
        pid_m = tl.program_id(0)
    head = tl.program_id(1)
    tok0, seq_len, moved = sequence_span(Starts, Lens, tl.program_id(2), n_tokens, LENS_FROM_STARTS)
    if Status is not None:
        if (head == 0) & (pid_m == tl.num_programs(0) - 1):
            report(Status, tl.where(moved, ROWS, 0) | tl.where(seq_len > max_len, MAX_LEN, 0))
    if not TOK_I64:
        tok0 = tok0.to(tl.int32)
    return pid_m, head, tok0, seq_len


@triton.jit
def sequence_span(Starts, Lens, seq, n_tokens, LENS_FROM_STARTS: tl.constexpr, mask=None):
    """``(tok0, seq_len, moved)`` of sequence ``seq``: its span ``[Starts[seq], Starts[seq + 1])`` (with
    ``LENS_FROM_STARTS``, else ``[Starts[seq], Starts[seq] + Lens[seq])``) clamped into the ``n_tokens``
    rows of the tensors (:func:`prefill_runtime.bounds.clamp_span`), ``tok0`` int64, ``seq_len`` int32,
    ``moved`` whether the clamp changed it. ``seq`` may be a tensor of sequences, those outside ``mask``
    read as empty spans. Shared by :func:`program_tile` and the Gluon kernel's persistent form."""
    if mask is None:
        start = tl.load(Starts + seq).to(tl.int64)
        if LENS_FROM_STARTS:
            end = tl.load(Starts + seq + 1).to(tl.int64)
        else:
            end = start + tl.load(Lens + seq).to(tl.int64)
    else:
        start = tl.load(Starts + seq, mask=mask, other=0).to(tl.int64)
        if LENS_FROM_STARTS:
            end = tl.load(Starts + seq + 1, mask=mask, other=0).to(tl.int64)
        else:
            end = start + tl.load(Lens + seq, mask=mask, other=0).to(tl.int64)
    tok0, tok_end, moved = clamp_span(start, end, n_tokens.to(tl.int64))
    return tok0, (tok_end - tok0).to(tl.int32), moved


@triton.jit
def tile_key_range(m0, m1, seq_len, window_left, window_right, IS_CAUSAL: tl.constexpr, HAS_LEFT: tl.constexpr,
                   HAS_RIGHT: tl.constexpr):  # fmt: skip
    """Key range of the query tile ``[m0, m1)`` (``m1`` one past its last real row) of a sequence of
    ``seq_len`` tokens: ``(key_lo, key_hi, full_lo, full_hi)``, int32 scalars whichever flags are set.
    ``[key_lo, key_hi)`` holds every key some row of the tile sees; ``[full_lo, full_hi)`` the keys every
    real row sees (empty when ``full_lo >= full_hi``). Shared by this Triton kernel and the Gluon one
    (``window_prefill.gluon_kernel``, which calls it as a Gluon function), so both skip the same blocks."""
    key_lo = m0 * 0
    key_hi = seq_len
    if HAS_LEFT:
        key_lo = tl.maximum(m0 - window_left, 0)
    if HAS_RIGHT:
        key_hi = tl.minimum(key_hi, m1 + window_right)
    if IS_CAUSAL:
        key_hi = tl.minimum(key_hi, m1)
    full_lo = key_lo
    full_hi = key_hi
    if HAS_LEFT:
        full_lo = tl.maximum(full_lo, m1 - 1 - window_left)
    if HAS_RIGHT:
        full_hi = tl.minimum(full_hi, m0 + window_right + 1)
    if IS_CAUSAL:
        full_hi = tl.minimum(full_hi, m0 + 1)
    return key_lo, key_hi, full_lo, full_hi


@triton.jit(do_not_specialize=["window_left", "window_right", "stride_lse_h", "n_tokens", "max_len"])
def _fwd_kernel(
    Q,
    K,
    V,
    O,
    Sinks,
    Starts,
    Lens,
    qk_scale,
    window_left,
    window_right,
    group_size,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    K_desc,
    V_desc,
    tanh_scale,
    Lse,  # [num_heads, total_tokens] float32 with RETURN_LSE, else None
    stride_lse_h,  # Lse's head stride (its token stride is 1) with RETURN_LSE, else None
    n_tokens,  # total_tokens: every sequence's rows are clamped into [0, n_tokens)
    max_len,  # the caller's (sizes the grid): a longer sequence is reported
    Status,  # [1] int32 (the caller's status=): malformed metadata ORs its bits in; else None
    Alibi,  # [num_heads] float ALiBi slopes with HAS_ALIBI, else None
    OutScale,  # [1] float: an fp8 O's quantisation scale (O = clamp(out / scale)), else None
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    BIAS_KEY0: tl.constexpr,
    LENS_FROM_STARTS: tl.constexpr,
    IEEE_FP32: tl.constexpr,
    WIDE_OFFSETS: tl.constexpr,  # int64 token offsets; False: int32 (K/V within 2**31 elements, host-checked)
    FOLD_SCALE: tl.constexpr,  # qk_scale > 0 and no key-0 bias: scale folded into exp2's FMA
    TMA_KV: tl.constexpr,  # interior K/V blocks through the descriptors K_desc/V_desc (else None), run first
    SOFTCAP: tl.constexpr,  # logits softcap * tanh(scale * q.k / softcap): qk_scale = softcap * log2(e); 2: tanh.approx
    RETURN_LSE: tl.constexpr,  # also store each row's softmax log-sum-exp (natural log) in Lse
    HAS_ALIBI: tl.constexpr,  # - Alibi[head] * |q - k| on every logit (FOLD_SCALE off)
    FP8_OUT_MAX: tl.constexpr,  # an fp8 O: its format's largest finite value (with OutScale); else 0.0
):
    """Grid (cdiv(max_len, BLOCK_M), num_heads, batch). Starts[b] = first token of sequence b; its
    length is Lens[b], or Starts[b + 1] - Starts[b] when LENS_FROM_STARTS (cu_seqlens form).
    With TMA_KV, K_desc/V_desc are host tensor descriptors over K/V viewed as
    [total_tokens, kv_heads * HEAD_DIM] with block [BLOCK_N, HEAD_DIM] (used by interior blocks only:
    masked blocks keep lane-masked loads, so no key outside a tile's range is read), and the interior
    blocks run before the edges (edges first, ptxas serialises the interior's wgmma).
    With RETURN_LSE, row ``i`` of head ``h`` also writes ``Lse[h * stride_lse_h + token]`` (float32).
    Metadata past the tensors is clamped and reported (:func:`program_tile`); the rows of a sequence
    longer than the grid covers (``max_len`` too small) are written as 0 by each head's program of the
    last query tile."""
    pid_m, head, tok0, seq_len = program_tile(Starts, Lens, n_tokens, max_len, Status, BLOCK_M, IS_CAUSAL,
                                              LENS_FROM_STARTS, True)  # fmt: skip
    m0 = pid_m * BLOCK_M
    if m0 >= seq_len:
        return
    grid_rows = tl.num_programs(0) * BLOCK_M
    if (pid_m == tl.num_programs(0) - 1) & (seq_len > grid_rows):  # rows past the grid: 0
        zero_rows(O, stride_ot, stride_oh, tok0, grid_rows, seq_len, head, Lse, stride_lse_h, BLOCK_M, BLOCK_D,
                  HEAD_DIM)  # fmt: skip
    m1 = tl.minimum(m0 + BLOCK_M, seq_len)  # one past the tile's last real row

    key_lo, key_hi, full_lo, full_hi = tile_key_range(
        m0, m1, seq_len, window_left, window_right, IS_CAUSAL, HAS_LEFT, HAS_RIGHT
    )
    if BIAS_KEY0:
        full_lo = tl.maximum(full_lo, 1)  # key 0 carries the sink bias: it must take the masked path
    n_lo = (key_lo // BLOCK_N) * BLOCK_N
    n_full_lo = tl.cdiv(full_lo, BLOCK_N) * BLOCK_N
    n_full_hi = tl.maximum((full_hi // BLOCK_N) * BLOCK_N, n_full_lo)
    n_edge_hi = tl.minimum(n_full_lo, key_hi)  # end of the leading masked segment

    offs_m = m0 + tl.arange(0, BLOCK_M)  # [BM] query rows
    offs_n = tl.arange(0, BLOCK_N)  # [BN]
    offs_d = tl.arange(0, BLOCK_D)  # [BD]
    m_d = offs_d < HEAD_DIM  # [BD]
    m_row = offs_m < seq_len  # [BM]
    kv_head = head // group_size

    p_q = (
        Q
        + head.to(tl.int64) * stride_qh
        + (tok0 + offs_m.to(tl.int64))[:, None] * stride_qt
        + offs_d[None, :]
    )  # [BM, BD]
    b_q = tl.load(p_q, mask=m_row[:, None] & m_d[None, :], other=0.0)  # [BM, BD]
    p_k_base = K + kv_head.to(tl.int64) * stride_kh
    p_v_base = V + kv_head.to(tl.int64) * stride_vh

    sink2 = 0.0
    if HAS_SINKS:
        sink2 = tl.load(Sinks + head).to(tl.float32) * 1.4426950408889634  # log2(e)
    if HAS_SINKS and not BIAS_KEY0:
        # The sink is an extra logit in the denominator only: start the softmax from it.
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + sink2  # [BM]
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + tl.where(sink2 == float("-inf"), 0.0, 1.0)  # [BM]
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # [BM]
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # [BM]
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)  # [BM, BD]
    slope2 = 0.0
    if HAS_ALIBI:
        slope2 = tl.load(Alibi + head).to(tl.float32) * 1.4426950408889634  # log2(e)

    # masked edges: leading [n_lo, n_edge_hi) and trailing [n_full_hi, key_hi), one loop (one compiled
    # copy of the masked step: a cold first call compiles less); and the interior [n_full_lo, n_full_hi),
    # after the edges or, with TMA_KV, before them (the online softmax takes blocks in any order)
    n_lead = tl.maximum(tl.cdiv(n_edge_hi - n_lo, BLOCK_N), 0)
    n_trail = tl.maximum(tl.cdiv(key_hi - n_full_hi, BLOCK_N), 0)
    n_mid = tl.maximum((n_full_hi - n_full_lo) // BLOCK_N, 0)
    for part in tl.static_range(2):
        if (part == 0) != TMA_KV:
            acc, l_i, m_i = _attn_blocks(
                acc, l_i, m_i, b_q, p_k_base, p_v_base, tok0, stride_kt, stride_vt, offs_m, offs_n, offs_d,
                n_lo, n_lead, n_full_hi, n_lead + n_trail, key_lo, key_hi, window_left, window_right, qk_scale,
                sink2, HEAD_DIM, BLOCK_D, BLOCK_N, IS_CAUSAL, HAS_LEFT, HAS_RIGHT, BIAS_KEY0, True, IEEE_FP32,
                WIDE_OFFSETS, FOLD_SCALE, None, None, 0, False, tanh_scale, SOFTCAP, slope2, HAS_ALIBI,
            )  # fmt: skip
        else:
            acc, l_i, m_i = _attn_blocks(
                acc, l_i, m_i, b_q, p_k_base, p_v_base, tok0, stride_kt, stride_vt, offs_m, offs_n, offs_d,
                n_full_lo, n_mid, n_full_lo, n_mid, key_lo, key_hi, window_left, window_right, qk_scale, sink2,
                HEAD_DIM, BLOCK_D, BLOCK_N, IS_CAUSAL, HAS_LEFT, HAS_RIGHT, BIAS_KEY0, False, IEEE_FP32,
                WIDE_OFFSETS, FOLD_SCALE, K_desc, V_desc, kv_head * HEAD_DIM, TMA_KV, tanh_scale, SOFTCAP,
                slope2, HAS_ALIBI,
            )  # fmt: skip

    # Rows that saw no key (l == 0) have acc == 0: write 0, never NaN.
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)  # [BM]
    l_o = l_safe  # [BM] the output's divisor
    if OutScale is not None:  # an fp8 O: the caller's scale folds into the row's reciprocal
        l_o = l_safe * tl.load(OutScale).to(tl.float32)  # [BM]
    b_o = acc * (1.0 / l_o)[:, None]  # [BM, BD] one reciprocal per row, a multiply per element
    if OutScale is not None:  # clamped to the fp8 format's range
        b_o = tl.minimum(tl.maximum(b_o, -FP8_OUT_MAX), FP8_OUT_MAX)  # [BM, BD]
    p_o = (
        O
        + head.to(tl.int64) * stride_oh
        + (tok0 + offs_m.to(tl.int64))[:, None] * stride_ot
        + offs_d[None, :]
    )  # [BM, BD]
    tl.store(p_o, b_o.to(O.dtype.element_ty), mask=m_row[:, None] & m_d[None, :])
    if RETURN_LSE:
        # m_i, l_i are log2-domain (scale * log2(e) folded into the logits): ln(sum exp) = ln(2) *
        # (m + log2(l)); a row that saw no key (l == 0) gets -inf.
        b_lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)  # [BM]
        p_lse = Lse + head.to(tl.int64) * stride_lse_h + (tok0 + offs_m.to(tl.int64))  # [BM]
        tl.store(p_lse, b_lse, mask=m_row)
