"""Triton kernel: prefix prefill attention over a paged KV cache (context) plus the new tokens.

One program computes one tile of ``BLOCK_M`` query rows of one sequence for one query head (with
``PACK_GQA``, for all the query heads of one KV head: the rows are (token, head) pairs, see
:func:`prefix_prefill.plan.pack_gqa`):

* the cached context (key positions ``[0, ctx_len)``) in tiles of ``BLOCK_N_CTX`` tokens at multiples
  of ``BLOCK_N_CTX``, from the first tile the sliding window can see. Every cache address comes from
  :mod:`paged_kv_offsets.kernel`: :func:`~paged_kv_offsets.kernel.tile_blocks` +
  :func:`~paged_kv_offsets.kernel.tile_block_offsets` per tile (one set of block-table reads for K and
  V; one divide and two scalar reads when the tile fits in a page) and
  :func:`~paged_kv_offsets.kernel.dim_offsets`;
* the new tokens (key positions ``[ctx_len, seq_len)``) in tiles of ``BLOCK_N``, from the contiguous
  ``k``/``v`` tensors; with ``KV_FROM_CACHE`` (``k = v = None``) keys ``[0, seq_len)`` are one cached
  segment instead; with ``MERGE_NEW`` the masked tiles of both segments run in one loop
  (:func:`_segments_merged`).

The chain is ``_fwd_kernel`` -> :func:`_segment` (tile bounds, then the loops) -> :func:`_tile`
(addresses: paged or contiguous) -> :func:`_attend` (the online-softmax update). :func:`_tile_bounds`
splits each segment, with scalar arithmetic before the loops, into edge tiles that need masks (partial
last tile, causal diagonal, window edges) and interior tiles that do not; :func:`_attend` is compiled
once with ``MASKED=True`` and once with ``MASKED=False`` per loop.

Logits are kept in log2 units: ``s = (q . k) * softmax_scale * log2(e)`` (times ``k_scale`` for an
fp8 cache), or with ``SOFTCAP`` ``tanh(that / (softcap * log2(e))) * softcap * log2(e)`` (the
soft-capped logit in log2 units; ``SOFTCAP=2`` takes NVIDIA's hardware ``tanh.approx.f32``, 1 tanh
through exp2), ALiBi adds ``-slope * log2(e) * |p - j|``, sinks start the running max/denominator at
``sink * log2(e)`` / 1, and ``exp2`` does the rest. A row that sees no key writes 0. With
``RETURN_LSE`` the epilogue also stores each row's softmax log-sum-exp in natural log: the running max
``m_i`` and denominator ``l_i = sum_j exp2(s_j - m_i)`` (sink included) are in those log2 units, so
``lse = (m_i + log2(l_i)) * ln(2)``, ``-inf`` where ``l_i == 0``.

Bounds, whatever the device metadata holds (no host sync): each program first clamps its sequence
(:func:`prefix_prefill.sequence.sequence_geometry`): query rows into ``[0, n_tokens)``, the context
to at least 0, the cached keys it reads to the ``n_bt_cols * PAGE_SIZE`` the table's width holds
(``cache_len``); every block id read is clamped into ``[0, num_blocks)`` (``max_block`` of
:func:`~paged_kv_offsets.kernel.tile_blocks`: two integer ops per id). A sequence longer than the grid
covers (``max_query_len`` too small) gets its rows past the grid written as 0 (and ``-inf`` LSE) by each
head's program of its last query tile, in ``BLOCK_M``-row steps. With ``Status`` (the caller's
``status=``), head 0's program of that tile ORs the sequence's malformations into it
(:mod:`prefill_runtime.status`; the block ids by :func:`~paged_kv_offsets.kernel.bad_block_ids`, a scan of
the pages the sequence needs), before any program of the sequence returns; well-formed calls write
nothing there. The per-tile work is unchanged but for the id clamps.
"""

import triton
import triton.language as tl

from paged_kv_offsets.kernel import bad_block_ids, dim_offsets, tile_block_offsets, tile_blocks
from prefill_runtime.bounds import BLOCK_ID, MAX_LEN, report, zero_rows
from prefill_runtime.device import tanh
from prefix_prefill.sequence import sequence_geometry

LOG2E = 1.4426950408889634  # host side
_LOG2E = tl.constexpr(LOG2E)  # device side
_LN2 = tl.constexpr(0.6931471805599453)  # ln(2): log2 units -> natural log


@triton.jit
def _key_bounds(
    q_lo,
    q_hi,
    k_base,
    k_len,
    window_left,
    window_right,
    CAUSAL: tl.constexpr,
    USE_LEFT: tl.constexpr,
    USE_RIGHT: tl.constexpr,
):
    """Keys that query positions ``[q_lo, q_hi]`` need from a segment of ``k_len`` keys at absolute
    positions ``[k_base, k_base + k_len)``, segment-relative: ``(need_lo, need_hi, full_lo,
    full_hi)``: some row sees a key in ``[need_lo, need_hi)``, every row sees every key of ``[full_lo,
    full_hi)`` (``need_lo, full_lo >= 0``)."""
    need_lo = k_len * 0  # first needed key
    full_lo = k_len * 0  # keys from here on pass every lower bound (left window)
    need_hi = k_len  # one past the last needed key
    full_hi = k_len  # keys below this pass every upper bound (segment end, causal, right window)
    if USE_LEFT:
        need_lo = tl.maximum(q_lo - window_left - k_base, 0)
        # keys at or after q_hi - window_left are inside the window of every row of the tile
        full_lo = tl.maximum(q_hi - window_left - k_base, 0)
    if CAUSAL:
        need_hi = tl.minimum(need_hi, q_hi + 1 - k_base)
        full_hi = tl.minimum(full_hi, q_lo + 1 - k_base)
    if USE_RIGHT:
        need_hi = tl.minimum(need_hi, q_hi + window_right + 1 - k_base)
        full_hi = tl.minimum(full_hi, q_lo + window_right + 1 - k_base)
    return need_lo, need_hi, full_lo, full_hi


@triton.jit
def _tile_bounds(need_lo, need_hi, full_lo, full_hi, BLOCK_N: tl.constexpr, USE_LEFT: tl.constexpr):
    """The key bounds of :func:`_key_bounds` as tiles at multiples of ``BLOCK_N``: segment-relative
    ``(lo, mid_lo, mid_hi, hi)``; tiles in ``[lo, mid_lo)`` and ``[mid_hi, hi)`` need masks, tiles
    in ``[mid_lo, mid_hi)`` are fully visible to every query row of the tile. All quantities stay
    non-negative.
    """
    lo = (need_lo // BLOCK_N) * BLOCK_N
    hi = tl.where(need_hi > need_lo, tl.cdiv(need_hi, BLOCK_N) * BLOCK_N, lo)
    mid_lo = lo
    if USE_LEFT:
        mid_lo = tl.cdiv(full_lo, BLOCK_N) * BLOCK_N
        mid_lo = tl.minimum(tl.maximum(mid_lo, lo), hi)
    mid_hi = (tl.maximum(full_hi, 0) // BLOCK_N) * BLOCK_N
    mid_hi = tl.minimum(tl.maximum(mid_hi, mid_lo), hi)
    return lo, mid_lo, mid_hi, hi


# The helpers below take their loop-invariant arguments as tuples built once in _fwd_kernel:
#
# * ``rows``  = (q_pos [BM] absolute query positions, k_start (first key any row of the tile may see,
#               with USE_LEFT), m_d [BD] valid feature lanes, window_left, window_right, slope_log2
#               (ALiBi slope in log2 units), softcap2 (softcap * log2(e), with SOFTCAP));
# * ``cache`` = (K_cache, V_cache, bt_row, stride_bt_col, n_bt_cols, stride_kc_block, stride_kc_slot,
#               stride_vc_block, stride_vc_slot, o_kc_head, o_vc_head, o_kd [BD], o_vd [BD], max_block):
#               the paged cache as paged_kv_offsets describes it, already offset to this program's KV
#               head; every block id read is clamped to [0, max_block = num_blocks - 1];
# * ``new``   = (p_k_rows, p_v_rows, stride_kt, stride_vt, offs_d [BD]): the contiguous new-token K/V
#               rows of this sequence and KV head;
# * ``CFG``   = constexpr (PAD_D 0, CAUSAL 1, USE_LEFT 2, USE_RIGHT 3, HAS_ALIBI 4, FOLD_SCALE 5,
#               DOT_PRECISION 6, PAGE_SIZE 7, K_ALIGN16 8, V_ALIGN16_ANY 9, CACHE_FP8 10, WIDE_OFFSETS 11,
#               SOFTCAP 12, PREFETCH_IDS 13), flags of the whole launch (index: position).


@triton.jit
def _qk(b_q, p_k, m_k, m_d, MASK_K: tl.constexpr, CFG: tl.constexpr):
    """[BM, BN] raw logits ``q . k`` of one key tile: ``b_q`` [BM, BD], K loaded from ``p_k`` [BD, BN]
    (lanes outside ``m_k`` [BN] read as 0 with ``MASK_K``)."""
    PAD_D: tl.constexpr = CFG[0]
    DOT_PRECISION: tl.constexpr = CFG[6]
    if MASK_K:
        b_k = tl.load(p_k, mask=m_d[:, None] & m_k[None, :], other=0.0)  # [BD, BN]
    elif PAD_D:
        b_k = tl.load(p_k, mask=m_d[:, None], other=0.0)  # [BD, BN]
    else:
        b_k = tl.load(p_k)  # [BD, BN]
    return tl.dot(b_q, b_k.to(b_q.dtype), input_precision=DOT_PRECISION)  # [BM, BN]


@triton.jit
def _attend(acc, m_i, l_i, b_q, p_k, p_v, k_pos, k_end, rows, s_scale, p_scale, MASKED: tl.constexpr,
            SCALE_P: tl.constexpr, CFG: tl.constexpr, MASK_LOADS: tl.constexpr = True,
            GRANULE: tl.constexpr = 0):  # fmt: skip
    """One online-softmax step over one key tile (the only softmax update in this kernel).

    ``p_k`` [BD, BN] / ``p_v`` [BN, BD] pointer tiles, ``k_pos`` [BN] absolute key positions, ``k_end``
    one past the last key of the segment. Keys outside ``[k_start, k_end)`` are never loaded, so pages
    a window has left behind may hold anything (NaN, a recycled block). ``s_scale`` is the logit scale
    in log2 units; ``p_scale`` (with ``SCALE_P``) multiplies the probabilities before the PV dot (the
    fp8 V-cache scale). ``MASK_LOADS=False`` (with ``MASKED``): the caller promises that every lane's
    pointers address a needed (finite) key, so only the logits are masked. ``GRANULE > 0`` (with
    ``MASKED``; a tile at a multiple of ``GRANULE`` of a cache whose V runs ``GRANULE`` tokens
    contiguous from such multiples): this tile attends only to the keys of the granules (aligned runs
    of ``GRANULE`` keys) that lie wholly inside ``[k_start, k_end)`` and masks V by granule, so the V
    load stays a vectorised async copy; the caller attends to the keys of the partial granules
    separately (:func:`_segment`). Returns the updated ``(acc, m_i, l_i)``.
    """
    PAD_D: tl.constexpr = CFG[0]
    CAUSAL: tl.constexpr = CFG[1]
    USE_LEFT: tl.constexpr = CFG[2]
    USE_RIGHT: tl.constexpr = CFG[3]
    HAS_ALIBI: tl.constexpr = CFG[4]
    FOLD_SCALE: tl.constexpr = CFG[5]
    DOT_PRECISION: tl.constexpr = CFG[6]
    SOFTCAP: tl.constexpr = CFG[12]
    q_pos, k_start, m_d, window_left, window_right, slope_log2, softcap2 = rows
    m_k = k_pos < k_end  # [BN]
    if MASKED and USE_LEFT:
        m_k = m_k & (k_pos >= k_start)  # [BN]
    if MASKED and GRANULE > 0:
        k_g = (k_pos // GRANULE) * GRANULE  # [BN] first key of each lane's granule
        m_full = k_g + GRANULE <= k_end  # [BN] constant over each granule
        if USE_LEFT:
            m_full = m_full & (k_g >= k_start)  # [BN]
        m_k = m_k & m_full  # [BN] keys of partial granules are left to the caller
    b_qk = _qk(b_q, p_k, m_k, m_d, MASKED and MASK_LOADS, CFG)  # [BM, BN] raw q.k
    if SOFTCAP:  # logits softcap * tanh(scale * q.k / softcap); softcap2 = softcap * log2(e)
        b_qk = tanh(b_qk * (s_scale / softcap2), SOFTCAP >= 2)  # [BM, BN] in (-1, 1), the logit scale inside
        s_scale = softcap2  # ... and softcap * log2(e) outside: everything below is unchanged
    Q_DTYPE: tl.constexpr = b_q.dtype
    if FOLD_SCALE and not MASKED and not HAS_ALIBI:
        # interior tile with s_scale > 0: the max commutes with the scale, so the scale folds
        # into the exponent's FMA (one op per logit instead of a multiply and a subtract)
        m_new = tl.maximum(m_i, tl.max(b_qk, 1) * s_scale)  # [BM]
        m_use = m_new  # [BM]
        b_p = tl.math.exp2(b_qk * s_scale - m_use[:, None])  # [BM, BN]
    else:
        b_s = b_qk * s_scale  # [BM, BN]
        if HAS_ALIBI:
            b_dist = tl.abs(q_pos[:, None] - k_pos[None, :]).to(tl.float32)  # [BM, BN]
            b_s = b_s - slope_log2 * b_dist  # [BM, BN]
        if MASKED:
            m_s = m_k[None, :] & (q_pos[:, None] >= 0)  # [BM, BN]
            if CAUSAL:
                m_s = m_s & (k_pos[None, :] <= q_pos[:, None])  # [BM, BN]
            if USE_LEFT:
                m_s = m_s & (q_pos[:, None] - k_pos[None, :] <= window_left)  # [BM, BN]
            if USE_RIGHT:
                m_s = m_s & (k_pos[None, :] - q_pos[:, None] <= window_right)  # [BM, BN]
            b_s = tl.where(m_s, b_s, float("-inf"))  # [BM, BN]
        m_new = tl.maximum(m_i, tl.max(b_s, 1))  # [BM]
        if MASKED:
            # a row with no visible key so far keeps m = -inf; subtract 0 so exp2 gives 0, not NaN
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # [BM]
        else:
            m_use = m_new  # [BM]
        b_p = tl.math.exp2(b_s - m_use[:, None])  # [BM, BN]
    alpha = tl.math.exp2(m_i - m_use)  # [BM]
    l_i = l_i * alpha + tl.sum(b_p, 1)  # [BM]
    if MASKED and MASK_LOADS and GRANULE > 0:
        b_v = tl.load(p_v, mask=m_full[:, None] & m_d[None, :], other=0.0)  # [BN, BD] granule mask
    elif MASKED and MASK_LOADS:
        b_v = tl.load(p_v, mask=m_k[:, None] & m_d[None, :], other=0.0)  # [BN, BD]
    elif PAD_D:
        b_v = tl.load(p_v, mask=m_d[None, :], other=0.0)  # [BN, BD]
    else:
        b_v = tl.load(p_v)  # [BN, BD]
    if SCALE_P:
        b_p = b_p * p_scale  # [BM, BN]
    acc = acc * alpha[:, None]  # [BM, BD]
    acc = tl.dot(b_p.to(Q_DTYPE), b_v.to(Q_DTYPE), acc, input_precision=DOT_PRECISION)  # [BM, BD]
    return acc, m_new, l_i


@triton.jit
def _cache_pointers(cache, o_kt, o_vt, RUNS_HOLD: tl.constexpr, V_RUNS: tl.constexpr, CFG: tl.constexpr):
    """``(p_k [BD, BN], p_v [BN, BD])``: pointer tiles of the cache keys at per-lane offsets ``o_kt`` /
    ``o_vt`` [BN] (paged_kv_offsets), with the layout hints of :func:`_tile_pointers`; ``RUNS_HOLD``:
    every lane is a real token of a mapped page and the V runs of ``V_RUNS`` hold (unmasked tiles)."""
    K_ALIGN16: tl.constexpr = CFG[8]
    V_ALIGN16_ANY: tl.constexpr = CFG[9]
    V_ALIGN16_RUNS: tl.constexpr = V_RUNS[0]
    V_CONTIG: tl.constexpr = V_RUNS[1]
    K_cache, V_cache, o_kh, o_vh, o_kd, o_vd = cache[0], cache[1], cache[9], cache[10], cache[11], cache[12]
    p_k = K_cache + o_kh + o_kt[None, :] + o_kd[:, None]  # [BD, BN]
    if K_ALIGN16:
        p_k = tl.multiple_of(p_k, [16, 16])  # [BD, BN]
    p_v = V_cache + o_vh + o_vt[:, None] + o_vd[None, :]  # [BN, BD]
    if V_ALIGN16_ANY:
        p_v = tl.multiple_of(p_v, [16, 16])  # [BN, BD]
    if RUNS_HOLD:
        if V_ALIGN16_RUNS:
            p_v = tl.multiple_of(p_v, [16, 16])  # [BN, BD]
        if V_CONTIG > 1:
            p_v = tl.max_contiguous(p_v, [V_CONTIG, 1])  # [BN, BD]
    return p_k, p_v


@triton.jit
def _cache_token_offsets(n0, k_base, k_end, cache, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
                         CFG: tl.constexpr, ALIGNED: tl.constexpr, IDS=None):  # fmt: skip
    """``(o_kt, o_vt, k_pos)``, each [BN]: the cache's per-token K/V offsets (paged_kv_offsets; int32
    without ``WIDE_OFFSETS``, else int64) and the absolute positions of the keys ``k_base + n0 + [0,
    BLOCK_N)`` (valid below ``k_end``). ``IDS``: the tile's block ids, read ahead by
    :func:`_cache_tile_ids` (unmasked tiles), else None (read here)."""
    PAGE_SIZE: tl.constexpr = CFG[7]
    pos0 = k_base + n0
    k_pos = pos0 + tl.arange(0, BLOCK_N)  # [BN]
    bt_row, stride_bt_col, n_bt_cols = cache[2], cache[3], cache[4]
    s_kb, s_ks, s_vb, s_vs = cache[5], cache[6], cache[7], cache[8]
    # one set of block-table reads for K and V; with BLOCK_N <= PAGE_SIZE one divide and two
    # scalar reads for the whole tile (a non-power-of-two page then costs what 512 costs)
    tile = tile_blocks(bt_row, stride_bt_col, pos0, k_end, n_bt_cols, BLOCK_N, PAGE_SIZE, MASKED, ALIGNED,
                       CFG[11], IDS, cache[13])  # fmt: skip
    o_kt = tile_block_offsets(tile, s_kb, s_ks, BLOCK_N, PAGE_SIZE, MASKED, ALIGNED)  # [BN]
    o_vt = tile_block_offsets(tile, s_vb, s_vs, BLOCK_N, PAGE_SIZE, MASKED, ALIGNED)  # [BN]
    return o_kt, o_vt, k_pos


@triton.jit
def _cache_tile_ids(n0, k_base, k_end, cache, BLOCK_N: tl.constexpr, CFG: tl.constexpr):
    """The block ids of the unmasked, aligned cache tile at positions ``k_base + n0 + [0, BLOCK_N)``
    (valid below ``k_end``; a tile past it reads nothing outside the table row and is never attended
    to), for :func:`_tile`'s ``IDS`` one iteration later (``PREFETCH_IDS``: :func:`_cache_tiles`). The ids
    are as read (not clamped): :func:`_tile` clamps them where it forms the addresses, so the loop does
    not wait on this read before the tile's dots."""
    tile = tile_blocks(
        cache[2], cache[3], k_base + n0, k_end, cache[4], BLOCK_N, CFG[7], False, True, CFG[11]
    )
    return tile[0], tile[1]


@triton.jit
def _cache_tiles(acc, m_i, l_i, b_q, mid_lo, mid_hi, k_base, k_end, rows, cache, s_scale, p_scale,
                 BLOCK_N: tl.constexpr, V_RUNS: tl.constexpr, CFG: tl.constexpr):  # fmt: skip
    """The unmasked, aligned cache tiles ``k_base + n0 + [0, BLOCK_N)`` for ``n0`` in ``[mid_lo,
    mid_hi)`` (multiples of ``BLOCK_N``; keys valid below ``k_end``). With ``PREFETCH_IDS`` (CFG[13])
    each iteration reads the next tile's block ids and carries them (:func:`_cache_tile_ids`): the
    software pipeline issues a tile's K/V copies one iteration ahead, and without the carry their
    block-table read sits right before them."""
    if CFG[13]:
        ids = _cache_tile_ids(mid_lo, k_base, k_end, cache, BLOCK_N, CFG)
        for n0 in tl.range(mid_lo, mid_hi, BLOCK_N):
            ids_next = _cache_tile_ids(n0 + BLOCK_N, k_base, k_end, cache, BLOCK_N, CFG)
            acc, m_i, l_i = _tile(acc, m_i, l_i, b_q, n0, k_base, k_end, rows, cache, None, s_scale, p_scale,
                                  BLOCK_N, True, False, V_RUNS, CFG, True, 0, ids)  # fmt: skip
            ids = ids_next
    else:
        for n0 in tl.range(mid_lo, mid_hi, BLOCK_N):
            acc, m_i, l_i = _tile(acc, m_i, l_i, b_q, n0, k_base, k_end, rows, cache, None, s_scale, p_scale,
                                  BLOCK_N, True, False, V_RUNS, CFG, True)  # fmt: skip
    return acc, m_i, l_i


@triton.jit
def _tile(acc, m_i, l_i, b_q, n0, k_base, k_end, rows, cache, new, s_scale, p_scale, BLOCK_N: tl.constexpr,
          FROM_CACHE: tl.constexpr, MASKED: tl.constexpr, V_RUNS: tl.constexpr, CFG: tl.constexpr,
          ALIGNED: tl.constexpr, GRANULE: tl.constexpr = 0, IDS=None):  # fmt: skip
    """Attend to the keys at absolute positions ``k_base + n0 + [0, BLOCK_N)`` (valid below ``k_end``):
    from the paged ``cache`` with ``FROM_CACHE``, else from the contiguous ``new`` rows (new token
    ``n0 + i``); addresses from :func:`_tile_pointers`, then :func:`_attend`. ``IDS``: the tile's
    block ids read ahead (:func:`_cache_tiles`), or None."""
    p_k, p_v, k_pos = _tile_pointers(n0, k_base, k_end, cache, new, BLOCK_N, FROM_CACHE, MASKED, V_RUNS, CFG,
                                     ALIGNED, GRANULE, IDS)  # fmt: skip
    SCALE_P: tl.constexpr = FROM_CACHE and CFG[10]  # CACHE_FP8: the V scale multiplies the probabilities
    return _attend(acc, m_i, l_i, b_q, p_k, p_v, k_pos, k_end, rows, s_scale, p_scale, MASKED, SCALE_P, CFG,
                   True, GRANULE)  # fmt: skip


@triton.jit
def _tile_pointers(n0, k_base, k_end, cache, new, BLOCK_N: tl.constexpr, FROM_CACHE: tl.constexpr,
                   MASKED: tl.constexpr, V_RUNS: tl.constexpr, CFG: tl.constexpr, ALIGNED: tl.constexpr,
                   GRANULE: tl.constexpr = 0, IDS=None):  # fmt: skip
    """``(p_k [BD, BN], p_v [BN, BD], k_pos [BN])`` of the keys at absolute positions ``k_base + n0 + [0,
    BLOCK_N)`` (see :func:`_tile`).

    Layout hints for the cache, each checked on the host (``prefix_prefill.plan``): ``K_ALIGN16`` /
    ``V_ALIGN16_ANY`` (CFG): every contiguous run of the K/V tile starts 16-byte aligned, whatever
    tokens the tile holds; ``V_RUNS = (V_ALIGN16_RUNS, V_CONTIG)``: with ``V_CONTIG`` > 1 (vLLM's
    ``[blocks, heads, D, page]`` V cache, tokens unit-stride), an unmasked tile starting at a
    multiple of ``BLOCK_N`` has V offsets in groups of ``V_CONTIG`` contiguous tokens of one page
    (``V_CONTIG`` divides the page and ``BLOCK_N``), 16-byte aligned with ``V_ALIGN16_RUNS``. They
    turn element-wise gathers into pipelined 16-byte copies.
    """
    if FROM_CACHE:
        o_kt, o_vt, k_pos = _cache_token_offsets(n0, k_base, k_end, cache, BLOCK_N, MASKED, CFG, ALIGNED, IDS)
        # every lane of an interior tile is a real token of a mapped page: the V runs hold
        # (granule-masked tiles load whole runs only: the runs hold for every lane they load)
        p_k, p_v = _cache_pointers(
            cache, o_kt, o_vt, not MASKED or GRANULE > 0, V_RUNS, CFG
        )  # [BD, BN], [BN, BD]
    else:
        p_k_rows, p_v_rows, stride_kt, stride_vt, offs_d = new
        offs_n = (n0 + tl.arange(0, BLOCK_N)).to(tl.int64)  # [BN] index among the new tokens
        p_k = p_k_rows + offs_n[None, :] * stride_kt + offs_d[:, None]  # [BD, BN]
        p_v = p_v_rows + offs_n[:, None] * stride_vt + offs_d[None, :]  # [BN, BD]
        k_pos = k_base + (n0 + tl.arange(0, BLOCK_N))  # [BN]
    return p_k, p_v, k_pos


@triton.jit
def _segment(m_i, l_i, acc, b_q, q_lo, q_hi, k_base, k_len, k_end, rows, cache, new, s_scale, p_scale,
             BLOCK_N: tl.constexpr, FROM_CACHE: tl.constexpr, V_RUNS: tl.constexpr, CFG: tl.constexpr,
             ALIGNED: tl.constexpr, GRANULE: tl.constexpr = 0):  # fmt: skip
    """All key tiles of one segment (absolute positions ``[k_base, k_end)``, ``k_end = k_base + k_len``)
    that query positions ``[q_lo, q_hi]`` may see: the edge tiles with masks, then the interior tiles
    without. Both bounds come from :func:`_key_bounds` / :func:`_tile_bounds` before the loops, so no
    tile outside them is loaded.

    ``GRANULE > 0`` (the cached context of a cache whose V runs ``GRANULE`` tokens contiguous, tiles
    at multiples of ``BLOCK_N``): the masked tiles attend to whole granules only (their V stays an
    async copy, see :func:`_attend`); the keys of the at most two partial granules, at ``k_start``
    (left window) and at ``k_end``, follow in narrow masked tiles of ``max(16, GRANULE)`` lanes."""
    need_lo, need_hi, full_lo, full_hi = _key_bounds(
        q_lo, q_hi, k_base, k_len, rows[3], rows[4], CFG[1], CFG[2], CFG[3]
    )  # rows[3], rows[4]: window_left, window_right
    lo, mid_lo, mid_hi, hi = _tile_bounds(need_lo, need_hi, full_lo, full_hi, BLOCK_N, CFG[2])
    n_edge = (mid_lo - lo) // BLOCK_N
    n_masked = n_edge + (hi - mid_hi) // BLOCK_N
    for t in tl.range(0, n_masked):
        n0 = tl.where(t < n_edge, lo + t * BLOCK_N, mid_hi + (t - n_edge) * BLOCK_N)
        acc, m_i, l_i = _tile(acc, m_i, l_i, b_q, n0, k_base, k_end, rows, cache, new, s_scale, p_scale,
                              BLOCK_N, FROM_CACHE, True, V_RUNS, CFG, ALIGNED, GRANULE)  # fmt: skip
    if FROM_CACHE and ALIGNED:
        acc, m_i, l_i = _cache_tiles(acc, m_i, l_i, b_q, mid_lo, mid_hi, k_base, k_end, rows, cache, s_scale,
                                     p_scale, BLOCK_N, V_RUNS, CFG)  # fmt: skip
    else:
        for n0 in tl.range(mid_lo, mid_hi, BLOCK_N):
            acc, m_i, l_i = _tile(acc, m_i, l_i, b_q, n0, k_base, k_end, rows, cache, new, s_scale, p_scale,
                                  BLOCK_N, FROM_CACHE, False, V_RUNS, CFG, ALIGNED)  # fmt: skip
    if GRANULE > 0:
        tl.static_assert(FROM_CACHE, "granule edges are for the cached context")
        NARROW: tl.constexpr = max(16, GRANULE)
        # partial granules inside the masked tiles: at the window's first key and at the context end
        if CFG[2]:  # USE_LEFT: keys from the tile's first visible key rows[1] = k_start on
            l_lo = tl.maximum(rows[1], 0)
            l_hi = tl.minimum(tl.cdiv(l_lo, GRANULE) * GRANULE, k_end)  # empty when k_start is aligned
        else:
            l_lo = k_end * 0
            l_hi = k_end * 0
        r_lo = tl.maximum((k_end // GRANULE) * GRANULE, tl.maximum(l_hi, l_lo))
        n_l = (l_hi > l_lo).to(tl.int32)
        n_r = ((r_lo < k_end) & (need_hi > need_lo)).to(tl.int32)
        n_l = n_l * (need_hi > need_lo).to(tl.int32)
        for i in tl.range(0, n_l + n_r):
            first = (i == 0) & (n_l > 0)
            n0 = tl.where(first, l_lo, r_lo)
            e = tl.where(first, l_hi, k_end)
            acc, m_i, l_i = _tile(acc, m_i, l_i, b_q, n0, k_base, e, rows, cache, new, s_scale, p_scale,
                                  NARROW, FROM_CACHE, True, V_RUNS, CFG, False)  # fmt: skip
    return acc, m_i, l_i


@triton.jit
def _merged_tile(acc, m_i, l_i, b_q, is_new, n0_ctx, n0_new, ctx_len, cache_len, seq_len, rows, cache, new,
                 s_scale, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, V_RUNS: tl.constexpr,
                 CFG: tl.constexpr):  # fmt: skip
    """One masked tile of :func:`_segments_merged`: the new tokens' tile at ``n0_new`` (positions
    ``ctx_len + n0_new + [0, BLOCK_N)``, contiguous ``new`` rows) when ``is_new``, else the context tile
    at ``n0_ctx`` (paged ``cache``, keys valid below ``cache_len``). The new rows have the cache's token
    stride and unit feature stride (host-checked), so a new-token tile is addressed as a one-page cache
    tile of "block 0" at slot ``n0_new`` from the new rows' base pointer: with tiles no wider than a page
    only the scalars of :func:`~paged_kv_offsets.kernel.tile_blocks` and the base pointer are selected,
    and the per-lane work is the context's; narrower pages select the [BN] offsets. For a new-token tile
    every block-table read is masked off (position 0 and no valid key). Feature offsets, layout hints
    and :func:`_attend` are shared: the softmax step compiles once for the loop."""
    PAGE_SIZE: tl.constexpr = CFG[7]
    p_k_rows, p_v_rows, stride_kt, stride_vt = new[0], new[1], new[2], new[3]
    c_end = tl.where(is_new, 0, cache_len)
    pos0 = tl.where(is_new, 0, n0_ctx)
    if BLOCK_N <= PAGE_SIZE:  # a tile within two pages
        bt_row, stride_bt_col, n_bt_cols = cache[2], cache[3], cache[4]
        blk0, blk1, slot0, n_first, m_tok = tile_blocks(bt_row, stride_bt_col, pos0, c_end, n_bt_cols, BLOCK_N,
                                                        PAGE_SIZE, MASKED, True, CFG[11], None, cache[13])  # fmt: skip
        zero = blk0 * 0
        tile = (tl.where(is_new, zero, blk0), tl.where(is_new, zero, blk1), tl.where(is_new, n0_new, slot0),
                tl.where(is_new, BLOCK_N, n_first), m_tok | is_new)  # fmt: skip
        o_kt = tile_block_offsets(tile, cache[5], cache[6], BLOCK_N, PAGE_SIZE, MASKED, True)
        o_vt = tile_block_offsets(tile, cache[7], cache[8], BLOCK_N, PAGE_SIZE, MASKED, True)
        k_pos = tl.where(is_new, ctx_len + n0_new, n0_ctx) + tl.arange(0, BLOCK_N)  # [BN]
    else:
        offs_n = n0_new + tl.arange(0, BLOCK_N)  # [BN] index among the new tokens
        if CFG[11]:  # WIDE_OFFSETS
            offs_n = offs_n.to(tl.int64)  # [BN]
        o_kc, o_vc, c_pos = _cache_token_offsets(pos0, 0, c_end, cache, BLOCK_N, MASKED, CFG, True)
        o_kt = tl.where(is_new, offs_n * stride_kt, o_kc)  # [BN]
        o_vt = tl.where(is_new, offs_n * stride_vt, o_vc)  # [BN]
        k_pos = tl.where(is_new, ctx_len + offs_n.to(tl.int32), c_pos)  # [BN]
    k_end = tl.where(is_new, seq_len, cache_len)
    base_k = tl.where(is_new, p_k_rows, cache[0] + cache[9])
    base_v = tl.where(is_new, p_v_rows, cache[1] + cache[10])
    p_k = base_k + o_kt[None, :] + cache[11][:, None]  # [BD, BN] (o_kd: offs_d, unit stride)
    p_v = base_v + o_vt[:, None] + cache[12][None, :]  # [BN, BD] (o_vd)
    if CFG[8]:  # K_ALIGN16 (with MERGE_NEW: the new rows host-checked too)
        p_k = tl.multiple_of(p_k, [16, 16])  # [BD, BN]
    if CFG[9]:  # V_ALIGN16_ANY
        p_v = tl.multiple_of(p_v, [16, 16])  # [BN, BD]
    return _attend(acc, m_i, l_i, b_q, p_k, p_v, k_pos, k_end, rows, s_scale, 1.0, MASKED, False, CFG)


@triton.jit
def _segments_merged(m_i, l_i, acc, b_q, q_lo, q_hi, ctx_len, cache_len, q_len, seq_len, rows, cache, new,
                     s_scale, BLOCK_N: tl.constexpr, V_RUNS: tl.constexpr, CFG: tl.constexpr):  # fmt: skip
    """The cached context (keys ``[0, cache_len)`` of the ``ctx_len`` before the new tokens) and the new
    tokens with their masked tiles in one loop (kernel ``MERGE_NEW``):
    the tile bounds of both segments as :func:`_segment` computes them, then the masked tiles of the
    context and of the new tokens (an iteration index past the context's count selects a new-token
    tile, :func:`_merged_tile`), then each segment's interior tiles in its own loop. For caches whose
    tiles have the new tokens' form (NHD/HND, the activations' dtype, no granule edges, one tile
    width): three compiled copies of the tile step instead of four."""
    USE_LEFT: tl.constexpr = CFG[2]
    c_need_lo, c_need_hi, c_full_lo, c_full_hi = _key_bounds(
        q_lo, q_hi, 0, cache_len, rows[3], rows[4], CFG[1], USE_LEFT, CFG[3]
    )
    c_lo, c_mid_lo, c_mid_hi, c_hi = _tile_bounds(
        c_need_lo, c_need_hi, c_full_lo, c_full_hi, BLOCK_N, USE_LEFT
    )
    n_need_lo, n_need_hi, n_full_lo, n_full_hi = _key_bounds(
        q_lo, q_hi, ctx_len, q_len, rows[3], rows[4], CFG[1], USE_LEFT, CFG[3]
    )
    n_lo, n_mid_lo, n_mid_hi, n_hi = _tile_bounds(
        n_need_lo, n_need_hi, n_full_lo, n_full_hi, BLOCK_N, USE_LEFT
    )
    c_edge = (c_mid_lo - c_lo) // BLOCK_N
    c_masked = c_edge + (c_hi - c_mid_hi) // BLOCK_N
    n_edge = (n_mid_lo - n_lo) // BLOCK_N
    n_masked = n_edge + (n_hi - n_mid_hi) // BLOCK_N
    for t in tl.range(0, c_masked + n_masked):
        u = t - c_masked  # index among the new tokens' masked tiles
        n0_ctx = tl.where(t < c_edge, c_lo + t * BLOCK_N, c_mid_hi + (t - c_edge) * BLOCK_N)
        n0_new = tl.where(u < n_edge, n_lo + u * BLOCK_N, n_mid_hi + (u - n_edge) * BLOCK_N)
        acc, m_i, l_i = _merged_tile(acc, m_i, l_i, b_q, u >= 0, n0_ctx, n0_new, ctx_len, cache_len, seq_len, rows,
                                     cache, new, s_scale, BLOCK_N, True, V_RUNS, CFG)  # fmt: skip
    # the interior tiles as _segment's loops (the context's: aligned tiles, V runs per V_RUNS)
    acc, m_i, l_i = _cache_tiles(acc, m_i, l_i, b_q, c_mid_lo, c_mid_hi, 0, cache_len, rows, cache, s_scale,
                                 1.0, BLOCK_N, V_RUNS, CFG)  # fmt: skip
    for n0 in tl.range(n_mid_lo, n_mid_hi, BLOCK_N):
        acc, m_i, l_i = _tile(acc, m_i, l_i, b_q, n0, ctx_len, seq_len, rows, cache, new, s_scale, 1.0,
                              BLOCK_N, False, False, (False, 1), CFG, False)  # fmt: skip
    return acc, m_i, l_i


@triton.jit(
    do_not_specialize=[
        "window_left",
        "window_right",
        "n_bt_cols",
        "page_size",
        "stride_bt_row",
        "stride_lse_h",
        "num_blocks",
        "n_tokens",
        "max_query_len",
    ]
)
def _fwd_kernel(
    Q,  # [total_q, H, D]
    K,  # [total_q, Hkv, D] (unused with KV_FROM_CACHE)
    V,  # [total_q, Hkv, D] (unused with KV_FROM_CACHE)
    O,  # [total_q, H, D]
    K_cache,  # paged, any layout paged_kv_offsets describes
    V_cache,
    Block_table,  # [batch, n_bt_cols] int32/int64
    Cu_seqlens_q,  # [batch + 1]
    Seq_lens,  # [batch] context + new tokens
    Sinks,  # [H] (HAS_SINKS)
    Alibi_slopes,  # [H] (HAS_ALIBI)
    K_scale,  # [1] (CACHE_FP8)
    V_scale,  # [1] (CACHE_FP8)
    Out_scale,  # [1] (OUT_FP8)
    qk_scale,  # softmax_scale * log2(e)
    softcap2,  # softcap * log2(e) with SOFTCAP (logit soft-capping), else unused
    window_left,  # FA left window (inclusive), used with USE_LEFT
    window_right,  # FA right window (inclusive), used with USE_RIGHT
    n_bt_cols,
    page_size,  # the cache's page size (the kernel takes it as the constexpr PAGE_SIZE)
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_bt_row,
    stride_bt_col,
    stride_kc_block,
    stride_kc_slot,
    stride_kc_head,
    stride_kc_dim,
    stride_kc_x,
    stride_vc_block,
    stride_vc_slot,
    stride_vc_head,
    stride_vc_dim,
    Lse,  # [H, total_q] float32, unit token stride (RETURN_LSE), else None
    stride_lse_h,  # Lse's head stride (RETURN_LSE), else None
    num_blocks,  # the caches' blocks: every block id read is clamped into [0, num_blocks)
    n_tokens,  # total_q: every query/new-token row is clamped into [0, n_tokens)
    max_query_len,  # the caller's (sizes the grid): a longer query is reported
    Status,  # [1] int32 (the caller's status=): malformed metadata ORs its bits in; else None
    QUERIES_PER_KV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    X: tl.constexpr,
    K_ALIGN16: tl.constexpr,
    V_ALIGN16_ANY: tl.constexpr,
    V_ALIGN16_RUNS: tl.constexpr,
    V_CONTIG: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_N_CTX: tl.constexpr,
    CAUSAL: tl.constexpr,
    USE_LEFT: tl.constexpr,
    USE_RIGHT: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    KV_FROM_CACHE: tl.constexpr,  # keys [0, seq_len) as one cached segment (k = v = None)
    CACHE_FP8: tl.constexpr,
    OUT_FP8: tl.constexpr,
    FP8_OUT_MAX: tl.constexpr,
    SKIP_DECODE: tl.constexpr,
    FOLD_SCALE: tl.constexpr,
    GRANULE: tl.constexpr,  # > 0: masked context tiles load V by granules of this many keys (see _segment)
    WIDE_OFFSETS: tl.constexpr,  # int64 per-token cache offsets; False: int32 (host-checked to fit)
    DOT_PRECISION: tl.constexpr,
    MERGE_NEW: tl.constexpr,  # the masked tiles of the context and the new tokens in one loop (_segments_merged)
    SOFTCAP: tl.constexpr,  # logits softcap * tanh(scale * q.k / softcap) (softcap2, _attend); 2: tanh.approx
    RETURN_LSE: tl.constexpr,  # also store each row's softmax log-sum-exp (natural log) in Lse
    PREFETCH_IDS: tl.constexpr,  # interior context tiles read the next tile's block ids ahead
    PACK_GQA: tl.constexpr = False,  # a tile's rows are (token, query head of one KV group): see below
):
    # grid: (H, cdiv(max_query_len, BLOCK_M), batch); heads of one GQA group are neighbours. PACK_GQA:
    # grid (Hkv, cdiv(max_query_len, TOK), batch), a tile's BLOCK_M rows the TOK = BLOCK_M // QUERIES_PER_KV
    # tokens x the KV head's QUERIES_PER_KV query heads (row r: token r // QUERIES_PER_KV, head r % ...),
    # so the KV head's keys are read once for all its query heads (short queries: speculative decoding)
    pid_h = tl.program_id(0)
    pid_m = tl.num_programs(1) - 1 - tl.program_id(1)  # latest (heaviest causal) tiles first
    pid_b = tl.program_id(2)
    if PACK_GQA:
        kv_head = pid_h
        TOK: tl.constexpr = BLOCK_M // QUERIES_PER_KV  # query tokens a tile
    else:
        kv_head = pid_h // QUERIES_PER_KV
        TOK: tl.constexpr = BLOCK_M

    # the sequence's rows and lengths, clamped into the tensors and the table (sequence_geometry)
    q_start, q_len, ctx_len, need, cache_len, flags = sequence_geometry(
        Cu_seqlens_q, Seq_lens, pid_b, n_tokens, n_bt_cols, num_blocks, PAGE_SIZE, KV_FROM_CACHE
    )
    seq_len = ctx_len + q_len
    bt_row = Block_table + pid_b.to(tl.int64) * stride_bt_row
    grid_rows = tl.num_programs(1) * TOK  # query rows (tokens) the grid covers
    last_tile = tl.program_id(1) == 0
    if Status is not None:
        if (pid_h == 0) & last_tile:  # one report per sequence, before any program returns
            if SKIP_DECODE:
                need = tl.where(q_len == 1, 0, need)  # (a skipped sequence reads no page)
            flags |= tl.where(q_len > max_query_len, MAX_LEN, 0)
            flags |= bad_block_ids(bt_row, stride_bt_col, need, n_bt_cols, num_blocks, PAGE_SIZE) * BLOCK_ID
            report(Status, flags)
    m0 = pid_m * TOK
    if m0 >= q_len:
        return
    offs_r = tl.arange(0, BLOCK_M)  # [BM] the tile's rows
    if PACK_GQA:
        heads = kv_head * QUERIES_PER_KV + offs_r % QUERIES_PER_KV  # [BM] each row's query head
        offs_m = m0 + offs_r // QUERIES_PER_KV  # [BM] each row's query index in the sequence
        m_m = (offs_m < q_len) & (offs_r < TOK * QUERIES_PER_KV)  # [BM]
        head_rows = heads[:, None]  # [BM, 1]
    else:
        heads = pid_h
        offs_m = m0 + offs_r  # [BM] query index in the sequence
        m_m = offs_m < q_len  # [BM]
        head_rows = pid_h
    if SKIP_DECODE:
        if q_len == 1:
            if RETURN_LSE:  # a skipped row attends to nothing here: its LSE is -inf (its o row untouched)
                if PACK_GQA:  # (rows 0 .. QUERIES_PER_KV - 1: token 0 of each of the group's heads)
                    tl.store(Lse + heads.to(tl.int64) * stride_lse_h + q_start, tl.full([BLOCK_M], float("-inf"),
                             tl.float32), mask=offs_r < QUERIES_PER_KV)  # fmt: skip
                else:
                    tl.store(Lse + pid_h.to(tl.int64) * stride_lse_h + q_start, float("-inf"))
            return
    if last_tile & (q_len > grid_rows):  # a max_query_len too small: the rows past the grid are 0
        if PACK_GQA:
            for g in range(QUERIES_PER_KV):
                zero_rows(O, stride_ot, stride_oh, q_start, grid_rows, q_len, kv_head * QUERIES_PER_KV + g, Lse,
                          stride_lse_h, BLOCK_M, BLOCK_D, HEAD_DIM)  # fmt: skip
        else:
            zero_rows(O, stride_ot, stride_oh, q_start, grid_rows, q_len, pid_h, Lse, stride_lse_h, BLOCK_M,
                      BLOCK_D, HEAD_DIM)  # fmt: skip

    PAD_D: tl.constexpr = BLOCK_D != HEAD_DIM
    offs_d = tl.arange(0, BLOCK_D)  # [BD]
    m_d = offs_d < HEAD_DIM  # [BD]
    q_pos = ctx_len + offs_m  # [BM] absolute positions
    q_lo = ctx_len + m0
    q_hi = ctx_len + tl.minimum(m0 + TOK, q_len) - 1

    p_q_rows = Q + (q_start + offs_m.to(tl.int64))[:, None] * stride_qt + head_rows * stride_qh  # [BM, 1]
    b_q = tl.load(p_q_rows + offs_d[None, :], mask=m_m[:, None] & m_d[None, :], other=0.0)  # [BM, BD]

    if HAS_SINKS:
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + tl.load(Sinks + heads).to(tl.float32) * _LOG2E  # [BM]
        l_i = tl.full([BLOCK_M], 1.0, dtype=tl.float32)  # [BM]
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # [BM]
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # [BM]
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)  # [BM, BD]

    if HAS_ALIBI:
        slope_log2 = tl.load(Alibi_slopes + head_rows).to(tl.float32) * _LOG2E  # (PACK_GQA: [BM, 1])
    else:
        slope_log2 = 0.0
    if CACHE_FP8:
        s_scale_cache = qk_scale * tl.load(K_scale).to(tl.float32)
        v_scale = tl.load(V_scale).to(tl.float32)
    else:
        s_scale_cache = qk_scale
        v_scale = 1.0

    o_kc_head = kv_head.to(tl.int64) * stride_kc_head
    o_vc_head = kv_head.to(tl.int64) * stride_vc_head
    o_kd = dim_offsets(offs_d, stride_kc_dim, stride_kc_x, X)  # [BD] int64
    o_vd = dim_offsets(offs_d, stride_vc_dim, 0, 1)  # [BD] int64

    k_start = q_lo - window_left  # first key any row of this tile may see (with USE_LEFT)
    rows = (q_pos, k_start, m_d, window_left, window_right, slope_log2, softcap2)
    cache = (K_cache, V_cache, bt_row, stride_bt_col, n_bt_cols, stride_kc_block, stride_kc_slot,
             stride_vc_block, stride_vc_slot, o_kc_head, o_vc_head, o_kd, o_vd, num_blocks - 1)  # fmt: skip
    CFG: tl.constexpr = (PAD_D, CAUSAL, USE_LEFT, USE_RIGHT, HAS_ALIBI, FOLD_SCALE, DOT_PRECISION, PAGE_SIZE,
                         K_ALIGN16, V_ALIGN16_ANY, CACHE_FP8, WIDE_OFFSETS, SOFTCAP, PREFETCH_IDS)  # fmt: skip
    V_RUNS: tl.constexpr = (V_ALIGN16_RUNS, V_CONTIG)

    if KV_FROM_CACHE:
        # the new tokens' K/V are in the cache too: keys [0, seq_len) form one paged segment (those the
        # table holds: [0, cache_len)), its tiles at multiples of BLOCK_N_CTX from position 0 (aligned,
        # run hints valid), one masked and one interior loop
        acc, m_i, l_i = _segment(m_i, l_i, acc, b_q, q_lo, q_hi, 0, cache_len, cache_len, rows, cache, None,
                                 s_scale_cache, v_scale, BLOCK_N_CTX, True, V_RUNS, CFG, True, GRANULE)  # fmt: skip
    elif MERGE_NEW:
        # contiguous k/v and a cache of the same form and dtype: the masked tiles of both in one loop
        tl.static_assert(not CACHE_FP8 and GRANULE == 0)
        tl.static_assert(X == 1 and V_CONTIG == 1 and BLOCK_N == BLOCK_N_CTX)
        p_k_rows = K + q_start * stride_kt + kv_head * stride_kh  # new token 0 of this sequence
        p_v_rows = V + q_start * stride_vt + kv_head * stride_vh
        new = (p_k_rows, p_v_rows, stride_kt, stride_vt, offs_d)
        acc, m_i, l_i = _segments_merged(m_i, l_i, acc, b_q, q_lo, q_hi, ctx_len, cache_len, q_len, seq_len, rows,
                                         cache, new, qk_scale, BLOCK_N, V_RUNS, CFG)  # fmt: skip
    else:
        acc, m_i, l_i = _segment(m_i, l_i, acc, b_q, q_lo, q_hi, 0, cache_len, cache_len, rows, cache, None,
                                 s_scale_cache, v_scale, BLOCK_N_CTX, True, V_RUNS, CFG, True, GRANULE)  # fmt: skip
        # ---- the new tokens, key positions [ctx_len, seq_len): the contiguous k/v rows (new tokens start
        # at ctx_len, not at a page boundary: no run hints) ----
        p_k_rows = K + q_start * stride_kt + kv_head * stride_kh  # new token 0 of this sequence
        p_v_rows = V + q_start * stride_vt + kv_head * stride_vh
        new = (p_k_rows, p_v_rows, stride_kt, stride_vt, offs_d)
        acc, m_i, l_i = _segment(m_i, l_i, acc, b_q, q_lo, q_hi, ctx_len, q_len, seq_len, rows, cache, new,
                                 qk_scale, v_scale, BLOCK_N, False, (False, 1), CFG, False)  # fmt: skip

    # ---- epilogue: normalise; rows that saw no key (l == 0) write 0 ----
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)  # [BM]
    b_o = acc * (1.0 / l_safe)[:, None]  # [BM, BD]
    if OUT_FP8:
        b_o = b_o * (1.0 / tl.load(Out_scale).to(tl.float32))  # [BM, BD]
        b_o = tl.minimum(tl.maximum(b_o, -FP8_OUT_MAX), FP8_OUT_MAX)  # [BM, BD]
    p_o = (
        O + (q_start + offs_m.to(tl.int64))[:, None] * stride_ot + head_rows * stride_oh + offs_d[None, :]
    )  # [BM, BD]
    tl.store(p_o, b_o.to(O.dtype.element_ty), mask=m_m[:, None] & m_d[None, :])
    if RETURN_LSE:
        # m_i, l_i in log2 units with the logit scale folded in (and ALiBi, softcap, k_scale): ln of the
        # softmax denominator = ln(2) * (m + log2(l)); rows that saw no key (l == 0) get -inf.
        b_lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.math.log2(l_safe)) * _LN2)  # [BM]
        p_lse = Lse + heads.to(tl.int64) * stride_lse_h + (q_start + offs_m.to(tl.int64))  # [BM]
        tl.store(p_lse, b_lse, mask=m_m)
