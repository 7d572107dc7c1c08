"""Gluon device code (NVIDIA Hopper, sm90) shared by the warp-specialised prefill kernels.

Import only where ``triton.experimental.gluon`` exists (Triton >= 3.5); the kernel packages guard it.
The consumer warpgroup below is the compute half of both packages' Gluon kernels
(``window_prefill.gluon_kernel``, ``prefix_prefill.gluon_kernel``); each package keeps its own
producer (which memory the key blocks come from) and its own tile geometry.

Key blocks, in the order the producer fills the K/V rings: ``n_a`` blocks of segment A, then
``n_blocks - n_a`` of segment B. Block ``t`` of a segment covers key coordinates ``[n0, n0 +
BLOCK_N)``, ``n0 = base + t * BLOCK_N``; query row ``r`` (its index in its sequence) sees key ``p`` of
the segment iff ``lo <= p < hi`` and ``p <= r + shift`` (``CAUSAL``) and the window terms hold
(``HAS_LEFT``: ``r + shift - p <= window_left``; ``HAS_RIGHT``: ``p - r - shift <= window_right``:
``r + shift`` is the row's position in the segment's coordinates). Blocks inside ``[full_lo,
full_hi)`` are visible to every row of the tile: no mask. A block that sticks out of ``[lo, hi)`` has
those V rows set to 0 in shared memory before its ``P @ V`` (the rows' P is 0, but the memory may
hold NaN).

* window-prefill: one segment (``n_a == n_blocks``): the tile's key range, ``shift = 0``.
* prefix-prefill: A = the cached context (``shift`` = context length: every context key is before
  every query), B = the new tokens (``shift = 0``, causal); with K/V of the new tokens in the cache,
  one segment over the whole sequence with ``shift`` = context length.

Scores are in log2 units: ``p = exp2(s * qk_scale - m)`` with the scale folded into the exponent and
the row max taken on raw scores (``qk_scale > 0``). Score options (constexprs of :func:`consumer`, each
compiled in only where it is on; their values in the ``score`` tuple :func:`score_terms` makes):
``SOFTCAP`` the raw score becomes ``tanh(s * tanh_scale)`` first (``qk_scale`` is then ``softcap *
log2(e)``: logits ``softcap * tanh(scale * q.k / softcap)``; 2: the hardware ``tanh.approx.f32``, 1:
tanh through exp2; 3: the hardware tanh with the running max pinned, below); ``ALIBI`` the raw score
less ``slope * |q_pos - k_pos|`` (``q_pos = r + shift``,
the slope in raw units: ``slope * log2(e) / qk_scale``; with ``CAUSAL`` every visible key has ``k_pos <=
q_pos``, so the consumer adds ``slope * (k_pos - ref)`` instead, one term per key with ``ref`` the tile's
first row's position, and the rows' own term ``slope * (q_pos - ref)``, a constant of each row, drops out
of the softmax: the sink logit and the LSE take it back; ``ALIBI == 2`` forms ``k_pos - ref`` from the
block's columns converted to float32 once and held across the key loop, one float add a block, where
``ALIBI == 1`` adds the columns as integers and converts every block: the held columns cost registers a
thread, which the prefix consumers spare and the window consumers do not, so each kernel picks its
form); ``SINKS == 1`` the running max and denominator
start at the sink (``sink * log2(e)``) and 1 (0 for a sink of ``-inf``), ``SINKS == 2`` the sink is a
bias on the score of key 0 (raw units; the caller masks the block holding key 0). These are the Triton
kernels' semantics (``window_prefill.kernel``, ``prefix_prefill.kernel``) with the bias terms in raw
units, so the scale still folds into the exponent.

``SOFTCAP == 3`` (bfloat16 P, a cap of at most ``prefill_runtime.checks.PINNED_SOFTCAP_MAX``, no sinks, no
ALiBi, no fp8 keys: ``prefill_runtime.checks.kernel_softcap``): a capped logit in log2 units lies in
``(-qk_scale, qk_scale)`` with ``qk_scale <= 80``, so the running max starts and stays at ``qk_scale -``
:data:`PIN_HEADROOM` and every ``p`` lies in ``[2**(40 - 2 * qk_scale), 2**40]``, normal in bfloat16
and float32 (a sum of 2**31 of them, times any V below 2**56, stays finite): no row max per block and no
rescale of O, the online softmax's only reason for the max being to keep ``exp2`` in range. The result
is the same softmax (its shift cancels).

fp8 key segments (``consumer``'s ``FP8_KV``: prefix-prefill's context from an fp8 cache, converted
exactly into the 16-bit rings, the new tokens 16-bit): each block takes its segment's logit multiplier
and score terms and its V scaling (:func:`segment_terms`, :func:`softmax_step`'s ``SCALED_V``), a
scalar choice per block; the scores themselves take no work beyond the plain step's.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from prefill_runtime.plan import packed_tokens as _packed_tokens

#: :func:`prefill_runtime.plan.packed_tokens` at compile time (a packed consumer's tokens a head)
packed_tokens = gluon.constexpr_function(_packed_tokens)


@gluon.jit
def allocate_rings(Q_desc, K_desc, V_desc, HALF_M: gl.constexpr, BLOCK_N: gl.constexpr,
                   HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr, V_T: gl.constexpr = False,
                   READY_COUNT: gl.constexpr = 1, V_READY_COUNT: gl.constexpr = 0,
                   EMPTY_COUNT: gl.constexpr = 2, K_LAYOUT: gl.constexpr = None,
                   V_STAGES: gl.constexpr = 0, V_LAYOUT: gl.constexpr = None,
                   K_RING: gl.constexpr = None):  # fmt: skip
    """Shared memory and mbarriers of a warp-specialised kernel, initialised: the two Q halves
    ``[2, HALF_M, D]`` (``q_bar``, count 1 each; one ``[1, 2 * HALF_M, D]`` buffer when ``Q_desc``'s
    block has ``2 * HALF_M`` rows, announced on ``q_bar.index(0)``; the two halves too when it has fewer than
    ``HALF_M``: a packed form's, :func:`load_q_halves`), K and V rings ``[NUM_STAGES,
    BLOCK_N, D]`` in the descriptors' layouts (``*_ready``: count 1, the producer's expect-tx;
    ``*_empty``: ``EMPTY_COUNT``, one arrival per consumer or, with one 8-warp consumer partition, one
    per consumer thread; ``K_LAYOUT``: a K ring of 64-wide rows instead, ``[NUM_STAGES, BLOCK_N * D /
    64, 64]`` in this (rank-3) layout, which a producer fills in chunks and the consumer reads through
    its ``K_VIEW``), and ``fix_bar``
    (count 2: the consumers' V-row handshake). ``V_T``: the V ring is ``[NUM_STAGES, D, BLOCK_N]``
    (keys along the rows' contiguous axis) in ``V_desc``'s layout;
    ``READY_COUNT``: arrivals a ready barrier waits for (the producer's threads when they fill slots
    with ``cp.async``); ``V_READY_COUNT``: the V ring's, when it differs (0: the same); ``V_STAGES``:
    the V ring's slots (and barriers), when they differ from ``NUM_STAGES`` (0: the same); ``V_LAYOUT``:
    the V ring's layout when it is not ``V_desc``'s (None: ``V_desc.layout``); ``K_RING``: the K ring's
    (``[NUM_STAGES, BLOCK_N, D]``) when it is not ``K_desc``'s (None: ``K_desc.layout``). Returns
    ``(q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty, fix_bar)``."""
    dtype: gl.constexpr = Q_desc.dtype
    Q_ROWS: gl.constexpr = max(Q_desc.block_shape[0], HALF_M)  # (a packed form's box of fewer rows)
    VS: gl.constexpr = V_STAGES if V_STAGES > 0 else NUM_STAGES
    q_smem = gl.allocate_shared_memory(dtype, [2 * HALF_M // Q_ROWS, Q_ROWS, HEAD_DIM], Q_desc.layout)
    if K_RING is not None:
        k_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], K_RING)
    elif K_LAYOUT is None:
        k_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], K_desc.layout)
    else:
        k_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N * HEAD_DIM // 64, 64], K_LAYOUT)
    V_RING: gl.constexpr = V_desc.layout if V_LAYOUT is None else V_LAYOUT
    if V_T:
        v_smem = gl.allocate_shared_memory(dtype, [VS, HEAD_DIM, BLOCK_N], V_RING)
    else:
        v_smem = gl.allocate_shared_memory(dtype, [VS, BLOCK_N, HEAD_DIM], V_RING)
    q_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [VS, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [VS, 1], mbarrier.MBarrierLayout())
    fix_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_bar.index(i), count=1)
    V_COUNT: gl.constexpr = V_READY_COUNT if V_READY_COUNT > 0 else READY_COUNT
    for i in gl.static_range(max(NUM_STAGES, VS)):
        if i < NUM_STAGES:
            mbarrier.init(k_ready.index(i), count=READY_COUNT)
        if i < VS:
            mbarrier.init(v_ready.index(i), count=V_COUNT)
        if i < NUM_STAGES:
            mbarrier.init(k_empty.index(i), count=EMPTY_COUNT)
        if i < VS:
            mbarrier.init(v_empty.index(i), count=EMPTY_COUNT)
    mbarrier.init(fix_bar.index(0), count=2)
    fence_async_shared()
    return q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty, fix_bar.index(0)


@gluon.jit
def allocate_q_empty():
    """A persistent form's ``q_empty`` mbarrier (count 2: both consumers' last ``Q K^T`` of a tile done, so
    the producer may load the next tile's Q; :func:`consumer`'s ``ring``), initialised."""
    q_free = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_free.index(0), count=2)
    fence_async_shared()
    return q_free.index(0)


@gluon.jit
def next_tile(TileCounter):
    """A dynamically scheduled persistent program's next tile: ``TileCounter[0]``'s value before an atomic
    add of 1 (tiles go out in the launch's order to whichever program asks first; relaxed, as no data
    passes through the counter). ``TileCounter``: int32 ``[2]``, zero at the launch (:func:`tiles_done`)."""
    return gl.atomic_add(TileCounter, 1, sem="relaxed")


@gluon.jit
def tiles_done(TileCounter):
    """A program took its last tile (:func:`next_tile` gave one past the launch's): ``TileCounter[1]``
    counts the programs done, and the launch's last one sets both counters back to 0 for the next launch
    that uses them (every program has then made its last :func:`next_tile`)."""
    if gl.atomic_add(TileCounter + 1, 1) == gl.num_programs(0) - 1:
        gl.atomic_xchg(TileCounter, 0)
        gl.atomic_xchg(TileCounter + 1, 0)


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def live_tile_number(u, k, u_base, seqs, live, heads, n_seqs):
    """The tile number ``(k * n_seqs + seq) * heads + head`` of live tile ``u``, which lies in the chunk
    of sequences ``seqs`` (``[32 * num_warps]``, a 1-D blocked layout) at query level ``k`` whose live
    tiles follow ``u_base``; ``live`` marks the sequences with a tile at that level, each ``heads`` tiles
    in a row."""
    j = u - u_base
    rank = gl.associative_scan(live.to(gl.int32), 0, _add)  # [CH] live sequences up to each, inclusive
    seq = gl.sum(gl.where(live & (rank == j // heads + 1), seqs, 0), 0)
    return (k * n_seqs + seq) * heads + j % heads


@gluon.jit
def allocate_tile_slot():
    """An int32 ``[1, 1]`` shared-memory slot: a dynamically scheduled program's tile, written by the
    partition that took it (:func:`write_tile_slot`) and read by the others (:func:`read_tile_slot`)."""
    return gl.allocate_shared_memory(gl.int32, [1, 1], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))


@gluon.jit
def write_tile_slot(slot, value):
    """Write the int32 scalar ``value`` into ``slot`` (:func:`allocate_tile_slot`); an mbarrier arrival
    after it makes it visible to the partitions that wait on that barrier."""
    L: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [gl.num_warps(), 1], [1, 0])
    slot.store(gl.zeros([1, 1], gl.int32, layout=L) + value)


@gluon.jit
def read_tile_slot(slot):
    """The int32 value of ``slot`` (:func:`allocate_tile_slot`), as a scalar."""
    L: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [gl.num_warps(), 1], [1, 0])
    return gl.max(gl.max(slot.load(L), 1), 0)


@gluon.jit
def load_q_halves(Q_desc, q_smem, q_bar, row0, col, HALF_M: gl.constexpr, HEAD_DIM: gl.constexpr,
                  PAIRED: gl.constexpr = False, PACK: gl.constexpr = 0):  # fmt: skip
    """Producer side: the tile's two 16-bit Q halves, rows ``row0 + h * HALF_M`` at column ``col`` of
    ``Q_desc``, into ``q_smem.index(h)``, each announced on ``q_bar.index(h)`` (one per consumer); or,
    when ``Q_desc``'s block has ``2 * HALF_M`` rows, the whole tile in one copy on ``q_bar.index(0)``.
    ``PAIRED`` (two consumers on two adjacent heads, see :func:`consumer`): both halves are rows
    ``row0 + [0, HALF_M)``, half ``h`` at column ``col + h * HEAD_DIM`` (the next head's features).
    ``PACK`` (``Q_desc``'s block ``[T, D]``, ``T = packed_tokens(HALF_M, PACK)``: :func:`consumer`'s packed
    rows): the first half only, the ``PACK`` heads from column ``col`` one after another, head ``g``'s rows
    ``row0 + [0, T)`` at the half's rows ``g * T``; the half's rows past ``PACK * T`` are left unwritten
    (padding rows, never stored)."""
    Q_ROWS: gl.constexpr = Q_desc.block_shape[0]
    if PACK > 0:
        mbarrier.expect(q_bar.index(0), PACK * Q_ROWS * HEAD_DIM * 2)
        for g in gl.static_range(PACK):
            tma.async_copy_global_to_shared(Q_desc, [row0, col + g * HEAD_DIM], q_bar.index(0),
                                            q_smem.index(0).slice(g * Q_ROWS, Q_ROWS))  # fmt: skip
    else:
        for h in gl.static_range(2 * HALF_M // Q_ROWS):
            mbarrier.expect(q_bar.index(h), Q_ROWS * HEAD_DIM * 2)
            if PAIRED:
                tma.async_copy_global_to_shared(Q_desc, [row0, col + h * HEAD_DIM], q_bar.index(h),
                                                q_smem.index(h))  # fmt: skip
            else:
                tma.async_copy_global_to_shared(Q_desc, [row0 + h * Q_ROWS, col], q_bar.index(h),
                                                q_smem.index(h))  # fmt: skip


@gluon.jit
def tanh(x, FAST: gl.constexpr):
    """tanh of a float32 tensor: ``FAST`` the hardware ``tanh.approx.f32`` (one MUFU op), else through
    exp2 (``prefill_runtime.device.tanh``'s two forms, for Gluon)."""
    if FAST:
        y = gl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=True,
                                      pack=1)  # fmt: skip
    else:
        y = 1.0 - 2.0 / (gl.exp2(x * 2.8853900817779268) + 1.0)  # 2 * log2(e)
    return y


#: ``SOFTCAP == 3``: the pinned running max is ``qk_scale - PIN_HEADROOM`` (module docstring).
PIN_HEADROOM = gl.constexpr(40.0)


@gluon.jit
def score_terms(qk_scale, tanh_scale, Sinks, Slopes, head, SOFTCAP: gl.constexpr, ALIBI: gl.constexpr,
                SINKS: gl.constexpr):  # fmt: skip
    """The ``score`` tuple of :func:`consumer` for query head ``head``: ``(tanh_scale, slope, sink)``
    (module docstring): ``tanh_scale`` with ``SOFTCAP``; ``slope = Slopes[head] * log2(e) / qk_scale``
    with ``ALIBI``; ``sink = Sinks[head] * log2(e)`` with ``SINKS == 1``, divided by ``qk_scale`` with
    ``SINKS == 2``. An entry whose option is off is ``qk_scale`` (never read). ``qk_scale``: the
    multiplier of the (capped) raw score, > 0."""
    LOG2E: gl.constexpr = 1.4426950408889634
    if SOFTCAP > 0:
        cap = tanh_scale
    else:
        cap = qk_scale
    if ALIBI:
        slope = gl.load(Slopes + head).to(gl.float32) * (LOG2E / qk_scale)
    else:
        slope = qk_scale
    if SINKS == 1:
        sink = gl.load(Sinks + head).to(gl.float32) * LOG2E
    elif SINKS == 2:
        sink = gl.load(Sinks + head).to(gl.float32) * (LOG2E / qk_scale)
    else:
        sink = qk_scale
    return cap, slope, sink


@gluon.jit
def out_scale_of(OutScale, placeholder, OUT_MAX: gl.constexpr):
    """The :func:`consumer`'s ``out_scale``: an fp8 output's scale ``OutScale[0]`` as float32, loaded once
    per program where ``OUT_MAX > 0``; else ``placeholder`` (a float the caller has, e.g. ``qk_scale``: a
    partition's arguments cannot be None), which the consumer never reads."""
    if OUT_MAX > 0:
        out_scale = gl.load(OutScale).to(gl.float32)
    else:
        out_scale = placeholder
    return out_scale


@gluon.jit
def softmax_step(
    b_s, m_i, l_i, qk_scale, offs_r, n0, lo, hi, shift, window_left, window_right, masked,
    BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
    S_LAYOUT: gl.constexpr, score=None, SOFTCAP: gl.constexpr = 0, ALIBI: gl.constexpr = False,
    SINKS: gl.constexpr = 0, row0=None, p_log2=None, l_mul=None, SCALED_V: gl.constexpr = False,
):  # fmt: skip
    """Online-softmax step on raw scores ``b_s`` [BM, BN] of the key block at ``n0`` (rows ``offs_r``,
    the tile's first row ``row0``, read by ``ALIBI`` with ``CAUSAL`` only):
    returns (p, alpha, m_new, l_new), p = exp2(s * qk_scale - m_new) [BM, BN] float32, alpha =
    exp2(m_i - m_new) [BM]. ``masked`` (runtime, uniform): apply the visibility mask. ``score``,
    ``SOFTCAP``, ``ALIBI``, ``SINKS``: the score options (module docstring; the key-0 bias of ``SINKS ==
    2`` only in masked blocks). ``SCALED_V`` (a V block that is ``v_eff`` times the true V, an fp8
    cache's, see :func:`segment_terms`): p is ``exp2(s * qk_scale - m_new + p_log2)`` (``p_log2 =
    log2(v_eff)``, so ``P @ V`` is the true one) and the denominator adds ``sum(p) * l_mul`` (``l_mul = 1
    / v_eff``): no work per score beyond the plain step's. ``SOFTCAP == 3``: ``m_i`` is the pinned max
    (module docstring), returned as it is, alpha is 1 (the caller keeps O as it is)."""
    if SOFTCAP > 0:
        b_s = tanh(b_s * score[0], SOFTCAP >= 2)  # [BM, BN] in (-1, 1); times qk_scale = softcap * log2(e)
    if ALIBI:
        if CAUSAL:  # + slope * (k_pos - ref): the rows' - slope * (q_pos - ref) is a constant of each row
            cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))  # [BN]
            if ALIBI == 2:  # the columns in float32, loop invariant (positions exact below 2**24)
                k_rel = (n0 - (row0 + shift)).to(gl.float32) + cols.to(gl.float32)  # [BN]
            else:
                k_rel = (n0 - (row0 + shift) + cols).to(gl.float32)  # [BN]
            b_s = b_s + (score[1] * k_rel)[None, :]  # [BM, BN]
        else:  # - slope * |q_pos - k_pos|, positions exact in float32 (< 2**24)
            k_f = (n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))).to(gl.float32)  # [BN]
            q_f = (offs_r + shift).to(gl.float32)  # [BM]
            b_s = b_s - score[1] * gl.abs(q_f[:, None] - k_f[None, :])  # [BM, BN]
    if masked:
        if HAS_LEFT:
            # each row sees one run of keys [k_min, k_max]: [lo, hi) cut by the causal and window terms.
            # Key n0 + c is visible iff (c - (k_min - n0)) mod 2**32 <= k_max - k_min: one unsigned compare
            # a score against the column index (a constant), where the window's two bounds would take
            # two. A row with no visible key (or before the tile) gets the run [n0 + BLOCK_N, n0 +
            # BLOCK_N], past every column. Positions lie in [0, 2**31).
            q_pos = offs_r + shift  # [BM] the rows' positions in the key coordinates
            k_max = hi - 1
            k_min = gl.maximum(q_pos - window_left, lo)  # [BM]
            if CAUSAL:
                k_max = gl.minimum(q_pos, k_max)  # [BM]
            if HAS_RIGHT:  # min(q_pos + window_right, k_max) without forming a sum past 2**31
                k_max = gl.where(q_pos > k_max - window_right, k_max, q_pos + window_right)  # [BM]
            run = (offs_r >= 0) & (k_max >= k_min)  # [BM]
            first = gl.where(run, k_min - n0, BLOCK_N)  # [BM]
            span = gl.where(run, k_max - k_min, 0).to(gl.uint32)  # [BM]
            cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))  # [BN]
            m_vis = (cols[None, :] - first[:, None]).to(gl.uint32) <= span[:, None]  # [BM, BN]
            if SINKS == 2:
                b_s = gl.where((n0 + cols)[None, :] == 0, b_s + score[2], b_s)  # [BM, BN] the bias of key 0
        else:
            # no left window: [lo, hi) per column, then the causal / right-window bound per score (the
            # run form above costs one more operation a score here and moves the fp8 forms' registers)
            offs_k = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))  # [BN] key coordinates
            m_vis = ((offs_k >= lo) & (offs_k < hi))[None, :] & (offs_r >= 0)[:, None]  # [BM, BN]
            if CAUSAL:  # (offs_r + shift: the rows' positions in the key coordinates)
                m_vis = m_vis & (offs_k[None, :] <= (offs_r + shift)[:, None])  # [BM, BN]
            if HAS_RIGHT:
                m_vis = m_vis & (offs_k[None, :] - (offs_r + shift)[:, None] <= window_right)  # [BM, BN]
            if SINKS == 2:
                b_s = gl.where(offs_k[None, :] == 0, b_s + score[2], b_s)  # [BM, BN] the bias of key 0
        b_s = gl.where(m_vis, b_s, float("-inf"))  # [BM, BN]
    if SOFTCAP == 3:  # the max pinned: every capped logit is below it by at most 2 * qk_scale
        gl.static_assert(not SCALED_V, "pinned max (SOFTCAP 3): no fp8 V scaling")
        m_new = m_i  # [BM]
        alpha = m_i  # [BM] (not read: alpha is 1)
        b_p = gl.exp2(b_s * qk_scale - m_i[:, None])  # [BM, BN]
        l_new = l_i + gl.sum(b_p, axis=1)  # [BM]
    else:
        m_new = gl.maximum(m_i, gl.max(b_s, axis=1) * qk_scale)  # [BM]
        m_shift = gl.where(m_new == float("-inf"), 0.0, m_new)  # [BM] a row with nothing visible: exp2 -> 0
        if SCALED_V:
            b_p = gl.exp2(b_s * qk_scale - (m_shift - p_log2)[:, None])  # [BM, BN] v_eff times the true p
            alpha = gl.exp2(m_i - m_shift)  # [BM]
            l_new = l_i * alpha + gl.sum(b_p, axis=1) * l_mul  # [BM]
        else:
            b_p = gl.exp2(b_s * qk_scale - m_shift[:, None])  # [BM, BN]
            alpha = gl.exp2(m_i - m_shift)  # [BM]
            l_new = l_i * alpha + gl.sum(b_p, axis=1)  # [BM]
    return b_p, alpha, m_new, l_new


@gluon.jit
def segment_terms(j, n_a, qk_scale, score, terms):
    """The logit multiplier, score terms and V scaling of key block ``j`` when segment A's blocks (``j <
    n_a``) come from an fp8 cache and segment B's are 16-bit: ``(qk, score, p_log2, l_mul)``. Segment A
    takes ``qk_scale`` and ``score`` (made for the context's scores: the multiplier or soft cap's
    factor times ``k_scale``, ALiBi slopes divided by that multiplier) and ``terms = (qk_b, score_b,
    p_log2, l_mul)``'s V scaling (``p_log2 = log2(v_eff)``, ``l_mul = 1 / v_eff``: the ring holds V /
    v_eff times ``v_scale``, see :func:`softmax_step`); segment B takes ``qk_b``, ``score_b`` and no
    scaling (0, 1). A scalar choice per block: the scores themselves take no extra work."""
    qk_b, score_b, p_log2, l_mul = terms
    cap_b, slope_b, sink_b = score_b
    cap_a, slope_a, sink_a = score
    if j < n_a:
        qk, cap, slope, sink, pl, lm = qk_scale, cap_a, slope_a, sink_a, p_log2, l_mul
    else:
        qk, cap, slope, sink, pl, lm = qk_b, cap_b, slope_b, sink_b, p_log2 * 0.0, l_mul * 0.0 + 1.0
    return qk, (cap, slope, sink), pl, lm


#: :func:`zero_v_rows`' elements a thread holds per pass: a pass's values are live beside the consumer's
#: accumulator, so a whole half slot at once (64 a thread at heads 128 and 256) costs spills there.
_ZERO_ELEMS = 16


@gluon.constexpr_function
def _zero_layout(cols, warps):
    """The layout of a zeroing pass over rows of ``cols`` elements: 8 contiguous elements a thread (16-byte
    accesses), a warp's threads along a row as far as it goes."""
    tpc = min(32, cols // 8)
    return gl.BlockedLayout([1, 8], [32 // tpc, tpc], [warps, 1], [1, 0])


@gluon.constexpr_function
def _zero_rows_per_pass(rows, cols, warps):
    """Rows of a zeroing pass: :data:`_ZERO_ELEMS` elements a thread, at least one layout tile, at most
    ``rows``."""
    tile = warps * 32 // min(32, cols // 8)  # rows one layout tile covers
    return min(rows, max(tile, _ZERO_ELEMS * 32 * warps // cols))


@gluon.jit
def zero_v_rows(v_buf, fix_bar, n_fix, n0, lo, hi, WG: gl.constexpr, HALF_N: gl.constexpr,
                V_T: gl.constexpr = False, WARPGROUPS: gl.constexpr = 1):  # fmt: skip
    """This warpgroup's half of the V rows of the block at ``n0`` outside ``[lo, hi)`` set to 0 (4 warps),
    then a handshake with the other consumer (``fix_bar``, count 2) so both halves are done. Returns the
    handshake count (its phase parity) after this one. ``V_T``: ``v_buf`` is ``[D, BLOCK_N]``; each
    warpgroup zeroes those keys' columns in its half of the ``D`` rows. ``WARPGROUPS == 2``: one
    partition of both warpgroups (``WG`` 0, ``HALF_N`` the whole block) zeroes the whole slot and
    arrives for both. The half goes in passes of :func:`_zero_rows_per_pass` rows."""
    NW: gl.constexpr = 4 * WARPGROUPS
    if V_T:
        HALF_D: gl.constexpr = v_buf.shape[0] // (3 - WARPGROUPS)
        BN: gl.constexpr = 2 * HALF_N // WARPGROUPS
        ROWS_T: gl.constexpr = _zero_rows_per_pass(HALF_D, BN, NW)
        blk_t: gl.constexpr = _zero_layout(BN, NW)
        offs_kt = n0 + gl.arange(0, BN, layout=gl.SliceLayout(0, blk_t))  # [BN]
        keep_t = (offs_kt >= lo) & (offs_kt < hi)  # [BN]
        for i in gl.static_range(HALF_D // ROWS_T):
            part_t = v_buf.slice(WG * HALF_D + i * ROWS_T, ROWS_T, dim=0)
            b_vt = part_t.load(blk_t)  # [ROWS_T, BN]
            part_t.store(gl.where(keep_t[None, :], b_vt, gl.zeros_like(b_vt)))
    else:
        D: gl.constexpr = v_buf.shape[1]
        ROWS: gl.constexpr = _zero_rows_per_pass(HALF_N, D, NW)
        blk: gl.constexpr = _zero_layout(D, NW)
        for i in gl.static_range(HALF_N // ROWS):
            part = v_buf.slice(WG * HALF_N + i * ROWS, ROWS, dim=0)
            b_v = part.load(blk)  # [ROWS, D]
            offs_k = n0 + WG * HALF_N + i * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, blk))  # [ROWS]
            keep = (offs_k >= lo) & (offs_k < hi)  # [ROWS]
            part.store(gl.where(keep[:, None], b_v, gl.zeros_like(b_v)))
    fence_async_shared()
    mbarrier.arrive(fix_bar, count=WARPGROUPS)
    mbarrier.wait(fix_bar, n_fix & 1)
    return n_fix + 1


@gluon.jit
def _release(bar, WARPGROUPS: gl.constexpr):
    """A consumer's release of a ring slot (its reads of it done): one elected arrival of its
    warpgroup, or with ``WARPGROUPS == 2`` (one 8-warp partition) one arrival per thread, so the two
    warpgroups do not meet at a partition-wide barrier before each release (Triton synchronises a
    partition's warps before an elected arrival). (Triton 3.6's ConSan does not take
    ``cp.async.mbarrier.arrive`` as an arrival, triton-lang/triton#11626: ``bench/sanitize_gluon.py
    --modeled-arrivals`` checks the protocol with an elected arrival instead.)"""
    if WARPGROUPS == 2:
        async_copy.mbarrier_arrive(bar, increment_count=False)  # no cp.async pending: arrives at once
    else:
        mbarrier.arrive(bar, count=1)


@gluon.jit
def _scores_by_parts(q_buf, k_smem, slot, ROWS: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                     S_LAYOUT: gl.constexpr, K_VIEW: gl.constexpr, COLS: gl.constexpr = 64):  # fmt: skip
    """``S = Q K^T`` ``[ROWS, BLOCK_N]`` of ring slot ``slot``, issued asynchronously, when the K ring is
    64-wide rows (``allocate_rings``' ``K_LAYOUT``) holding 64 features after another (rows ``[p *
    BLOCK_N, +BLOCK_N)`` of a slot for features ``[64 p, +64)``), each read as ``[BLOCK_N, 64]`` through
    ``K_VIEW``: one wgmma per 64 features against the matching 64 columns of Q, the ring reinterpreted
    whole and then indexed (Triton 3.8 refuses reinterpreting a subview). ``COLS``: the features a view
    holds (``K_VIEW`` is ``[BLOCK_N, COLS]``); ``COLS == HEAD_DIM``: one view of the whole slot, whose
    stride byte offset is not 1024 when the view is no-swizzle: compile it with
    ``hook_compiles(..., desc_fix_flag=...)`` (see ``prefill_runtime.host.clear_noswizzle_base_offsets``)."""
    NP: gl.constexpr = HEAD_DIM // COLS
    # the whole ring as [slots * NP, BLOCK_N, COLS]: reinterpret the parent, then index
    parts = k_smem._reinterpret(k_smem.dtype, [k_smem.shape[0] * NP, BLOCK_N, COLS], K_VIEW)
    b_s = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=S_LAYOUT)
    for p in gl.static_range(NP):
        b_k = parts.index(slot * NP + p)  # [BLOCK_N, COLS]
        b_s = warpgroup_mma(q_buf.slice(p * COLS, COLS, dim=1), b_k.permute((1, 0)), b_s, use_acc=p > 0,
                            is_async=True)  # fmt: skip
    return b_s


@gluon.jit
def _scores(q_buf, k_smem, slot, ROWS: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
            S_LAYOUT: gl.constexpr, K_VIEW: gl.constexpr, K_COLS: gl.constexpr):  # fmt: skip
    """``S = Q K^T`` ``[ROWS, BLOCK_N]`` of K ring slot ``slot``, issued asynchronously: one wgmma over a
    ``[BLOCK_N, D]`` slot, or with ``K_VIEW`` one per view of :func:`_scores_by_parts`."""
    if K_VIEW is None:
        b_s = warpgroup_mma(
            q_buf,
            k_smem.index(slot).permute((1, 0)),
            gl.zeros([ROWS, BLOCK_N], gl.float32, layout=S_LAYOUT),
            use_acc=False,
            is_async=True,
        )
    else:
        b_s = _scores_by_parts(q_buf, k_smem, slot, ROWS, BLOCK_N, HEAD_DIM, S_LAYOUT, K_VIEW, K_COLS)
    return b_s


@gluon.jit
def _v_operand(v_smem, slot, V_T: gl.constexpr):
    """Slot ``slot`` of the V ring as the ``[BLOCK_N, D]`` B operand of ``P @ V``."""
    if V_T:
        b_v = v_smem.index(slot).permute((1, 0))
    else:
        b_v = v_smem.index(slot)
    return b_v


@gluon.jit
def _pv_step(acc, b_p, v_smem, slot, fix_bar, n_fix, out, n0, lo, hi, WG: gl.constexpr, HALF_N: gl.constexpr,
             V_T: gl.constexpr, WARPGROUPS: gl.constexpr, V_ROWS: gl.constexpr = None):  # fmt: skip
    """Issue ``acc += P @ V`` of ring slot ``slot`` (asynchronously) after zeroing its V rows outside
    ``[lo, hi)`` when the block sticks ``out`` of its segment. ``V_ROWS`` (a layout): the slot holds
    ``[BLOCK_N, D]`` key rows in this layout rather than ``V_T``'s ``[D, BLOCK_N]``. Returns ``(n_fix,
    acc)``."""
    if V_ROWS is not None:
        v_rows = v_smem._reinterpret(v_smem.dtype, [v_smem.shape[0], v_smem.shape[2], v_smem.shape[1]],
                                     V_ROWS).index(slot)  # fmt: skip
        if out:
            n_fix = zero_v_rows(v_rows, fix_bar, n_fix, n0, lo, hi, WG, HALF_N, False, WARPGROUPS)
        pv = warpgroup_mma(b_p, v_rows, acc, is_async=True)  # [BM / 2, D] += P V
    else:
        if out:
            n_fix = zero_v_rows(v_smem.index(slot), fix_bar, n_fix, n0, lo, hi, WG, HALF_N, V_T, WARPGROUPS)
        pv = warpgroup_mma(b_p, _v_operand(v_smem, slot, V_T), acc, is_async=True)  # [BM / 2, D] += P V
    return n_fix, pv


@gluon.constexpr_function
def _store_layout(rows, head_dim, warps):
    """The layout a 16-bit O's rows are stored from: the accumulator's (each warp's 16 rows, a quad of
    lanes on a row, two rows a thread 8 apart) with a row's columns dealt out so that each lane holds 4
    contiguous ones and a quad 32 contiguous bytes, one whole 32-byte sector a store (the accumulator's
    own has a quad write 16 bytes of a sector per store, and the sector's other half in another store).
    Rows stay on their lanes and warps, so the conversion is a shuffle within each quad, no shared
    memory."""
    bits = [1 << i for i in range((head_dim - 1).bit_length())]  # a column index's bits
    reg = [[0, bits[0]], [0, bits[1]], [8, 0]] + [[0, b] for b in bits[4:]]
    lane = [[0, bits[2]], [0, bits[3]], [1, 0], [2, 0], [4, 0]]
    warp = [[16 << i, 0] for i in range(warps.bit_length() - 1)]
    return gl.DistributedLinearLayout(reg, lane, warp, [], [rows, head_dim])


@gluon.constexpr_function
def takes_turns(head_dim):
    """Whether a persistent form's two consumers take turns at the tensor cores (:func:`consumer`'s
    ``PINGPONG``): at head sizes up to 128. At head 256 (64-key blocks) the turns cost more than they
    gain, as they do in the one-tile forms, which never take them (bench/results/NOTES.md, entry 137)."""
    return head_dim <= 128


@gluon.constexpr_function
def _turn_asm(wg, sync):
    """:func:`turn`'s instruction (a ``mov`` gives the inline asm its one result)."""
    op = f"bar.sync {14 + wg}, 256;" if sync else f"bar.arrive {15 - wg}, 256;"
    return op + " mov.b32 $0, $1;"


@gluon.jit
def turn(WG: gl.constexpr, SYNC: gl.constexpr):
    """The consumers' turns at the tensor cores (FlashAttention-3's ping-pong): ``SYNC`` waits for this
    warpgroup's turn (``bar.sync`` on hardware barrier ``14 + WG``, completed by the other warpgroup's
    arrival), else hands the turn to the other warpgroup (``bar.arrive`` on ``15 - WG``); 256 threads each
    (both consumer warpgroups). Barriers 14 and 15: Triton's own partition barriers take the low ids. One
    instruction a thread: the operand is a ``[128]`` tensor of one element a thread (4 warps)."""
    one = gl.full([128], 0, gl.int32, layout=gl.BlockedLayout([1], [32], [4], [0]))
    gl.inline_asm_elementwise(_turn_asm(WG, SYNC), "=r,r", [one], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def first_turn(WG: gl.constexpr, PINGPONG: gl.constexpr):
    """A persistent consumer's turn before its first tile: with ``PINGPONG``, consumer 1 hands consumer 0
    the first turn. With :func:`last_turn` after the last tile, every :func:`turn` of :func:`consumer`
    pairs with one of the other warpgroup (an unpaired ``bar.sync`` would wait forever)."""
    if PINGPONG and WG == 1:
        turn(WG, False)


@gluon.jit
def last_turn(WG: gl.constexpr, PINGPONG: gl.constexpr):
    """A persistent consumer's turn after its last tile: with ``PINGPONG``, consumer 0 takes consumer 1's
    last hand-over (see :func:`first_turn`)."""
    if PINGPONG and WG == 0:
        turn(WG, True)


@gluon.jit
def _block_geometry(j, n_a, a_base, a_lo, a_hi, a_shift, a_full_lo, a_full_hi, b_base, b_lo, b_hi, b_shift,
                    b_full_lo, b_full_hi, BLOCK_N: gl.constexpr):  # fmt: skip
    """(n0, lo, hi, shift, masked, sticks_out) of block ``j`` (see the module docstring)."""
    if j < n_a:
        n0 = a_base + j * BLOCK_N
        lo, hi, shift, full_lo, full_hi = a_lo, a_hi, a_shift, a_full_lo, a_full_hi
    else:
        n0 = b_base + (j - n_a) * BLOCK_N
        lo, hi, shift, full_lo, full_hi = b_lo, b_hi, b_shift, b_full_lo, b_full_hi
    masked = (n0 < full_lo) | (n0 + BLOCK_N > full_hi)
    out = (n0 < lo) | (n0 + BLOCK_N > hi)
    return n0, lo, hi, shift, masked, out


@gluon.jit
def _block_step(
    j, acc, b_p, m_i, l_i, n_fix, p_n0, p_lo, p_hi, p_out, q_buf, k_smem, v_smem, k_ready, k_empty, v_ready,
    v_empty, fix_bar, offs_r, n_a, a_base, a_lo, a_hi, a_shift, a_full_lo, a_full_hi, b_base, b_lo, b_hi,
    b_shift, b_full_lo, b_full_hi, qk_scale, window_left, window_right, score, row0,
    WG: gl.constexpr, ROWS: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
    NUM_STAGES: gl.constexpr, VS: gl.constexpr, CAUSAL: gl.constexpr, HAS_LEFT: gl.constexpr,
    HAS_RIGHT: gl.constexpr, V_T: gl.constexpr, CP_FILL: gl.constexpr, WARPGROUPS: gl.constexpr,
    K_VIEW: gl.constexpr, K_COLS: gl.constexpr, V_ROWS: gl.constexpr,
    S_LAYOUT: gl.constexpr, O_LAYOUT: gl.constexpr, P_LAYOUT: gl.constexpr, SOFTCAP: gl.constexpr,
    ALIBI: gl.constexpr, SINKS: gl.constexpr, terms=None, FP8_KV: gl.constexpr = False, base=0,
    PINGPONG: gl.constexpr = False,
):  # fmt: skip
    """One step of :func:`consumer`'s loop: issue ``S_j = Q K_j^T`` and ``O += P_{j-1} V_{j-1}`` (its V
    slot in the ``V_ROWS`` form when that is given, see :func:`_pv_step`), wait for ``S_j`` only, the
    softmax of block ``j`` while ``P @ V`` runs, then wait and rescale. Returns the loop's state: ``(acc,
    b_p, m_i, l_i, n_fix)`` and block ``j``'s ``(n0, lo, hi, out)`` for its own ``P @ V``. ``score``,
    ``SOFTCAP``, ``ALIBI``, ``SINKS``: :func:`softmax_step`'s; ``FP8_KV``: block ``j``'s terms by
    :func:`segment_terms` of ``terms``; ``base``: the rings' blocks before this tile's (block ``j`` is the
    rings' block ``base + j``: its slot and phase)."""
    dtype: gl.constexpr = q_buf.dtype
    r = base + j  # the rings' block
    slot = r % NUM_STAGES
    pslot = (r - 1) % VS
    mbarrier.wait(k_ready.index(slot), (r // NUM_STAGES) & 1)
    if CP_FILL:
        fence_async_shared()
    if PINGPONG:  # both operands ready and V's rows fixed before the turn (the other consumer takes part)
        mbarrier.wait(v_ready.index(pslot), ((r - 1) // VS) & 1)
        if p_out:
            n_fix = zero_v_rows(v_smem.index(pslot), fix_bar, n_fix, p_n0, p_lo, p_hi, WG, BLOCK_N // 2, V_T)
        turn(WG, True)
    b_s = _scores(q_buf, k_smem, slot, ROWS, BLOCK_N, HEAD_DIM, S_LAYOUT, K_VIEW, K_COLS)  # S_j in flight
    if not PINGPONG:
        mbarrier.wait(v_ready.index(pslot), ((r - 1) // VS) & 1)
    if CP_FILL:
        fence_async_shared()
    pv_out = p_out
    if PINGPONG:  # (zeroed before the turn)
        pv_out = False
    n_fix, acc = _pv_step(acc, b_p, v_smem, pslot, fix_bar, n_fix, pv_out, p_n0, p_lo, p_hi, WG,
                          BLOCK_N * WARPGROUPS // 2, V_T, WARPGROUPS, V_ROWS)  # fmt: skip
    if PINGPONG:
        turn(WG, False)
    b_s = warpgroup_mma_wait(1, deps=[b_s])  # S_j done; P @ V may still run
    _release(k_empty.index(slot), WARPGROUPS)
    n0, lo, hi, shift, masked, out = _block_geometry(
        j, n_a, a_base, a_lo, a_hi, a_shift, a_full_lo, a_full_hi, b_base, b_lo, b_hi, b_shift, b_full_lo,
        b_full_hi, BLOCK_N,
    )  # fmt: skip
    qk_j, score_j, p_log2, l_mul = qk_scale, score, None, None  # (16-bit keys: the call's terms)
    if FP8_KV:
        qk_j, score_j, p_log2, l_mul = segment_terms(j, n_a, qk_scale, score, terms)
    b_pf, alpha, m_i, l_i = softmax_step(
        b_s, m_i, l_i, qk_j, offs_r, n0, lo, hi, shift, window_left, window_right, masked, BLOCK_N,
        CAUSAL, HAS_LEFT, HAS_RIGHT, S_LAYOUT, score_j, SOFTCAP, ALIBI, SINKS, row0, p_log2, l_mul, FP8_KV,
    )  # fmt: skip
    acc, b_p = warpgroup_mma_wait(0, deps=[acc, b_p])
    _release(v_empty.index(pslot), WARPGROUPS)
    if SOFTCAP != 3:  # (a pinned max leaves O as it is)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))[:, None]  # [BM / 2, D]
    b_p = gl.convert_layout(b_pf.to(dtype), P_LAYOUT)  # [BM / 2, BN]
    return acc, b_p, m_i, l_i, n_fix, n0, lo, hi, out


@gluon.jit
def consumer(
    WG: gl.constexpr, O, Lse, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty, fix_bar,
    row0, tok_o, n_rows, head, n_blocks, n_a, a_base, a_lo, a_hi, a_shift, a_full_lo, a_full_hi, b_base,
    b_lo, b_hi, b_shift, b_full_lo, b_full_hi, qk_scale, window_left, window_right, stride_ot, stride_oh,
    stride_lse_h,
    HALF_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, RETURN_LSE: gl.constexpr,
    V_T: gl.constexpr = False, CP_FILL: gl.constexpr = False, WARPGROUPS: gl.constexpr = 1,
    K_VIEW: gl.constexpr = None, V_STAGES: gl.constexpr = 0, K_COLS: gl.constexpr = 64,
    V_ROWS: gl.constexpr = None, score=None, SOFTCAP: gl.constexpr = 0, ALIBI: gl.constexpr = False,
    SINKS: gl.constexpr = 0, PAIRED: gl.constexpr = False, out_scale=None, OUT_MAX: gl.constexpr = 0.0,
    terms=None, FP8_KV: gl.constexpr = False, ring=None, PINGPONG: gl.constexpr = False,
    PACK: gl.constexpr = 0, Sinks=None,
):  # fmt: skip
    """One consumer warpgroup (4 warps): query rows ``row0 + WG * HALF_M + [0, HALF_M)`` (indices in the
    sequence; rows ``>= n_rows`` are padding, never stored) against every key block, then its rows of O
    at tokens ``tok_o + row`` (and the LSE). Per block ``j``: issue ``S_j = Q K_j^T`` and ``O += P_{j-1}
    V_{j-1}`` back to back, wait for ``S_j`` only, softmax while ``P @ V`` runs, then wait and rescale
    (FlashAttention-3's intra-warpgroup overlap). Slots are released to the producer through
    ``k_empty``/``v_empty`` (count 2: both consumers). ``V_T``: V slots are ``[D, BLOCK_N]`` (read as
    their transpose); ``CP_FILL``: slots may be filled by ``cp.async`` (generic proxy), so a proxy fence
    follows each ready wait before wgmma reads the slot (async proxy). ``WARPGROUPS == 2`` (``WG`` 0):
    one partition of 8 warps runs both warpgroups' rows (``2 * HALF_M``, Q as one buffer; each
    warpgroup still issues its own 64-row wgmma) from one copy of this code, every thread releasing
    each slot (``*_empty`` count 256). ``K_VIEW``: K slots are 64-wide rows read 64 features at a time
    through this ``[BLOCK_N, K_COLS]`` layout (see :func:`_scores_by_parts`; ``K_COLS == HEAD_DIM``: all
    features in one view). ``V_STAGES``: the V ring's slots when they differ from the K ring's
    ``NUM_STAGES`` (0: the same; see :func:`allocate_rings`). ``V_ROWS`` (with ``V_T``): the V slots of
    segment B's blocks hold ``[BLOCK_N, D]`` key rows in this layout instead (the slot's memory
    reinterpreted; the new tokens' V as stored, no transposed copy);
    segment B must then hold at least one block (a one-segment caller passes None). ``score``, ``SOFTCAP``,
    ``ALIBI``, ``SINKS``: the score options (module docstring; ``score`` from :func:`score_terms`).
    ``PAIRED`` (two consumers, ``WARPGROUPS == 1``, on two adjacent query heads of one KV head: the caller
    passes each its head, ``O`` rows and ``score``): both warpgroups compute rows ``row0 + [0, HALF_M)``,
    each of its own head, over the same key blocks (the short-query form that reads a KV head's keys once
    for two heads). A second warpgroup whose rows no query of the launch reaches runs :func:`drain`
    instead. ``OUT_MAX > 0`` (an fp8 ``O``): each row is written as ``clamp(o / out_scale, -OUT_MAX,
    OUT_MAX)`` in ``O``'s dtype (the scale folded into the row's reciprocal ``1 / (l * out_scale)``;
    ``out_scale`` a float32 scalar > 0, read only then), the Triton kernel's ``OUT_FP8`` epilogue.
    ``FP8_KV`` (segment A's K/V converted from an fp8 cache, segment B's 16-bit): ``qk_scale`` and
    ``score`` are segment A's, ``terms`` segment B's and A's V scaling (:func:`segment_terms`); the
    sinks' start and the LSE read segment A's ``score[1] * qk_scale`` (the slope in log2 units, the
    same for both segments). ``ring`` (a persistent program's tile after tile through one set of rings):
    ``(base, q_phase, n_fix, q_empty)``: the tile's blocks are the rings' blocks ``base + j`` (their slots
    and phases), its Q is the ``q_bar`` phase ``q_phase``, the V-row handshake count goes on from
    ``n_fix``, once the tile's last ``Q K^T`` is done the warpgroup arrives on ``q_empty`` (count 2: the
    producer may load the next tile's Q), and the last block's V slot is released too (the next tile's
    blocks reuse it); the handshake count after the tile is returned. None: one
    tile, from the rings' first block. ``PINGPONG`` (a persistent form's two 4-warp consumers, see
    :func:`takes_turns`): the warpgroups take turns at the tensor cores (:func:`turn`): each issues its
    ``S_j`` and ``P_{j-1} V_{j-1}`` in its turn, with every mbarrier wait and its V-row fix made before
    the turn, so one warpgroup's softmax runs beside the other's wgmmas (FlashAttention-3's ping-pong).
    ``PACK`` (> 0: the first of two consumers, ``WARPGROUPS == 1``, whose second runs :func:`drain`): the
    warpgroup's rows hold ``PACK`` query heads of one KV head, ``T = packed_tokens(HALF_M, PACK)`` rows
    each: row ``r`` is row ``row0 + r % T`` of head ``head + r // T`` (rows past ``PACK * T`` are padding,
    never stored; every query of the tile within its first ``T`` rows), so one pass over the keys serves
    all of them (speculative decoding's few tokens a sequence). Each row's arithmetic is the unpacked
    row's, so its output is the same bit for bit. ``score`` is the first head's: no ALiBi; sinks
    (``SINKS == 1``) from ``Sinks``, each row its head's (``Sinks[head + r // T] * log2(e)``)."""
    ROW_OFF: gl.constexpr = 0 if PAIRED else WG * HALF_M  # the warpgroup's first row in the tile
    PACK_OK: gl.constexpr = WG == 0 and WARPGROUPS == 1 and not PAIRED and SINKS != 2 and not ALIBI
    gl.static_assert(PACK == 0 or (PACK_OK and ring is None), "PACK: a one-tile first consumer, no ALiBi")
    PT: gl.constexpr = packed_tokens(HALF_M, PACK)  # (0 unpacked)
    NW: gl.constexpr = 4 * WARPGROUPS
    VS: gl.constexpr = V_STAGES if V_STAGES > 0 else NUM_STAGES
    ROWS: gl.constexpr = HALF_M * WARPGROUPS
    S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, BLOCK_N, 16]
    )
    O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    P_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2)
    dtype: gl.constexpr = q_smem.dtype
    q_buf = q_smem.index(WG)  # [ROWS, D] (WARPGROUPS == 2: the whole tile, one buffer)
    if PACK > 0:  # row r: the tile's row r % PT (of head head + r // PT)
        offs_r = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, S_LAYOUT)) % PT  # [BM / 2]
    else:
        offs_r = row0 + ROW_OFF + gl.arange(0, ROWS, layout=gl.SliceLayout(1, S_LAYOUT))  # [BM / 2]
    gl.static_assert(SOFTCAP != 3 or (SINKS == 0 and not ALIBI), "pinned max (SOFTCAP 3): no sinks or ALiBi")
    if SOFTCAP == 3:  # the pinned max (module docstring)
        m_i = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, S_LAYOUT)) + (qk_scale - PIN_HEADROOM)
        l_i = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))  # [BM / 2]
    elif SINKS == 1:  # the sink is one more logit of the denominator: the softmax starts from it
        if PACK > 0:  # each row its head's (score_terms' sink of the rows' heads, padding rows the last's)
            r_h = head + gl.arange(0, ROWS, layout=gl.SliceLayout(1, S_LAYOUT)) // PT  # [BM / 2]
            r_h = gl.minimum(r_h, head + PACK - 1)  # [BM / 2]
            sink = score_terms(qk_scale, qk_scale, Sinks, None, r_h, 0, False, 1)[2]  # [BM / 2]
        else:
            sink = score[2]
        m_i = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, S_LAYOUT)) + sink  # [BM / 2]
        if ALIBI and CAUSAL:  # raised by the rows' ALiBi term, as softmax_step raises the keys' logits
            m_i = m_i + (score[1] * qk_scale) * (offs_r - row0).to(gl.float32)  # [BM / 2]
        l_i = gl.where(m_i == float("-inf"), 0.0, 1.0)  # [BM / 2]
    else:
        m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))  # [BM / 2]
        l_i = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))  # [BM / 2]
    acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=O_LAYOUT)  # [BM / 2, D]
    if ring is None:
        base = 0
        q_phase = 0
        n_fix = 0
    else:
        base, q_phase, n_fix, q_empty = ring

    # (the persistent forms' callers pair every turn: consumer 1 hands consumer 0 the first one before
    # its first tile, consumer 0 takes a last one after its last tile, see :func:`turn`)
    gl.static_assert(not PINGPONG or (WARPGROUPS == 1 and V_ROWS is None and ring is not None),
                     "PINGPONG: two 4-warp consumers of a persistent form")  # fmt: skip

    # ---- block 0: scores and softmax, no P @ V yet ----
    slot0 = base % NUM_STAGES
    mbarrier.wait(q_bar.index(WG), q_phase)
    mbarrier.wait(k_ready.index(slot0), (base // NUM_STAGES) & 1)
    if CP_FILL:
        fence_async_shared()
    if PINGPONG:
        turn(WG, True)
    b_s = _scores(q_buf, k_smem, slot0, ROWS, BLOCK_N, HEAD_DIM, S_LAYOUT, K_VIEW, K_COLS)  # [BM / 2, BN]
    if PINGPONG:
        turn(WG, False)
    b_s = warpgroup_mma_wait(0, deps=[b_s])
    _release(k_empty.index(slot0), WARPGROUPS)
    n0, lo, hi, shift, masked, out = _block_geometry(
        0, n_a, a_base, a_lo, a_hi, a_shift, a_full_lo, a_full_hi, b_base, b_lo, b_hi, b_shift, b_full_lo,
        b_full_hi, BLOCK_N,
    )  # fmt: skip
    qk_0, score_0, p_log2, l_mul = qk_scale, score, None, None  # (16-bit keys: the call's terms)
    if FP8_KV:
        qk_0, score_0, p_log2, l_mul = segment_terms(0, n_a, qk_scale, score, terms)
    b_p, _, m_i, l_i = softmax_step(
        b_s, m_i, l_i, qk_0, offs_r, n0, lo, hi, shift, window_left, window_right, masked, BLOCK_N,
        CAUSAL, HAS_LEFT, HAS_RIGHT, S_LAYOUT, score_0, SOFTCAP, ALIBI, SINKS, row0, p_log2, l_mul, FP8_KV,
    )  # fmt: skip
    b_p = gl.convert_layout(b_p.to(dtype), P_LAYOUT)  # [BM / 2, BN] the A operand of P @ V
    p_n0, p_lo, p_hi, p_out = n0, lo, hi, out  # the previous block's, for its P @ V
    # Blocks 1 .. n_blocks - 1: S_j, then P_{j-1} V_{j-1}. With V_ROWS segment A's P @ V (V_T slots) and
    # segment B's (key rows) run in loops of their own, one operand form each: a runtime branch between
    # two forms of an asynchronous wgmma makes ptxas serialise every wgmma of the kernel (its advisory
    # C7512). Segment B is never empty there (a tile sees its own new tokens), so blocks n_a.. are B's.
    if V_ROWS is None:
        a_stop = n_blocks
    else:
        a_stop = n_a + 1
    for j in range(1, a_stop):
        acc, b_p, m_i, l_i, n_fix, p_n0, p_lo, p_hi, p_out = _block_step(
            j, acc, b_p, m_i, l_i, n_fix, p_n0, p_lo, p_hi, p_out, q_buf, k_smem, v_smem, k_ready, k_empty,
            v_ready, v_empty, fix_bar, offs_r, n_a, a_base, a_lo, a_hi, a_shift, a_full_lo, a_full_hi, b_base,
            b_lo, b_hi, b_shift, b_full_lo, b_full_hi, qk_scale, window_left, window_right, score, row0, WG,
            ROWS, BLOCK_N, HEAD_DIM, NUM_STAGES, VS, CAUSAL, HAS_LEFT, HAS_RIGHT, V_T, CP_FILL, WARPGROUPS,
            K_VIEW, K_COLS, None, S_LAYOUT, O_LAYOUT, P_LAYOUT, SOFTCAP, ALIBI, SINKS, terms, FP8_KV, base,
            PINGPONG,
        )  # fmt: skip
    if V_ROWS is not None:
        for j in range(a_stop, n_blocks):
            acc, b_p, m_i, l_i, n_fix, p_n0, p_lo, p_hi, p_out = _block_step(
                j, acc, b_p, m_i, l_i, n_fix, p_n0, p_lo, p_hi, p_out, q_buf, k_smem, v_smem, k_ready,
                k_empty, v_ready, v_empty, fix_bar, offs_r, n_a, a_base, a_lo, a_hi, a_shift, a_full_lo,
                a_full_hi, b_base, b_lo, b_hi, b_shift, b_full_lo, b_full_hi, qk_scale, window_left,
                window_right, score, row0, WG, ROWS, BLOCK_N, HEAD_DIM, NUM_STAGES, VS, CAUSAL, HAS_LEFT,
                HAS_RIGHT, V_T, CP_FILL, WARPGROUPS, K_VIEW, K_COLS, V_ROWS, S_LAYOUT, O_LAYOUT, P_LAYOUT,
                SOFTCAP, ALIBI, SINKS, terms, FP8_KV, base,
            )  # fmt: skip
    if ring is not None:  # every Q K^T of the tile is done (the last step waited for them all)
        mbarrier.arrive(q_empty, count=1)

    # ---- the last block's P @ V (with V_ROWS a block of segment B) ----
    last = base + n_blocks - 1  # (the rings' block)
    lslot = last % VS
    mbarrier.wait(v_ready.index(lslot), (last // VS) & 1)
    if CP_FILL:
        fence_async_shared()
    pv_out = p_out
    if PINGPONG:  # V's rows fixed before the turn
        if p_out:
            n_fix = zero_v_rows(v_smem.index(lslot), fix_bar, n_fix, p_n0, p_lo, p_hi, WG, BLOCK_N // 2, V_T)
        pv_out = False
        turn(WG, True)
    n_fix, acc = _pv_step(acc, b_p, v_smem, lslot, fix_bar, n_fix, pv_out, p_n0, p_lo, p_hi, WG,
                          BLOCK_N * WARPGROUPS // 2, V_T, WARPGROUPS, V_ROWS)  # fmt: skip
    if PINGPONG:
        turn(WG, False)
    acc = warpgroup_mma_wait(0, deps=[acc])
    if ring is not None:  # (a one-tile program never refills it: the ring ends here)
        _release(v_empty.index(lslot), WARPGROUPS)

    # ---- epilogue: rows that saw no key (l == 0) write 0 ----
    l_safe = gl.where(l_i == 0.0, 1.0, l_i)  # [BM / 2]
    if OUT_MAX > 0:  # fp8 O: o / out_scale, clamped to the fp8 range (a saturating conversion)
        inv_o = gl.convert_layout(1.0 / (l_safe * out_scale), gl.SliceLayout(1, O_LAYOUT))  # [BM / 2]
        b_of = acc * inv_o[:, None]  # [BM / 2, D]
        b_o = gl.minimum(gl.maximum(b_of, -OUT_MAX), OUT_MAX).to(O.dtype.element_ty)  # [BM / 2, D]
    else:
        inv_o = gl.convert_layout(1.0 / l_safe, gl.SliceLayout(1, O_LAYOUT))  # [BM / 2]
        b_o = (acc * inv_o[:, None]).to(O.dtype.element_ty)  # [BM / 2, D]
    if OUT_MAX > 0:  # (one-byte O: the quad shuffle takes shared memory the fp8 forms do not have)
        ST_LAYOUT: gl.constexpr = O_LAYOUT
    else:
        ST_LAYOUT: gl.constexpr = _store_layout(ROWS, HEAD_DIM, NW)
        b_o = gl.convert_layout(b_o, ST_LAYOUT)  # [BM / 2, D] whole sectors a store
    r_o = gl.arange(0, ROWS, layout=gl.SliceLayout(1, ST_LAYOUT))  # [BM / 2]
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, ST_LAYOUT))  # [D]
    if PACK > 0:  # each row's head and row (padding rows past PACK * PT stored nowhere)
        offs_ro = row0 + r_o % PT  # [BM / 2]
        p_row = O + (head + r_o // PT).to(gl.int64) * stride_oh + (tok_o + offs_ro).to(gl.int64) * stride_ot
        row_ok = (offs_ro < n_rows) & (r_o < PACK * PT)  # [BM / 2]
    else:
        offs_ro = row0 + ROW_OFF + r_o  # [BM / 2]
        p_row = O + head.to(gl.int64) * stride_oh + (tok_o + offs_ro).to(gl.int64) * stride_ot  # [BM / 2]
        row_ok = offs_ro < n_rows  # [BM / 2]
    p_o = p_row[:, None] + offs_d[None, :]  # [BM / 2, D]
    gl.store(p_o, b_o, mask=row_ok[:, None] & (offs_d < HEAD_DIM)[None, :])
    if RETURN_LSE:
        b_log2 = m_i + gl.log2(l_safe)  # [BM / 2]
        if ALIBI and CAUSAL:  # less the rows' ALiBi term that softmax_step leaves out
            b_log2 = b_log2 - (score[1] * qk_scale) * (offs_r - row0).to(gl.float32)  # [BM / 2]
        b_lse = gl.where(l_i == 0.0, float("-inf"), b_log2 * 0.6931471805599453)  # [BM / 2]
        if PACK > 0:
            r_l = gl.arange(0, ROWS, layout=gl.SliceLayout(1, S_LAYOUT))  # [BM / 2]
            p_lse = Lse + (head + r_l // PT).to(gl.int64) * stride_lse_h + (tok_o + offs_r).to(gl.int64)
            gl.store(p_lse, b_lse, mask=(offs_r < n_rows) & (r_l < PACK * PT))
        else:
            p_lse = Lse + head.to(gl.int64) * stride_lse_h + (tok_o + offs_r).to(gl.int64)  # [BM / 2]
            gl.store(p_lse, b_lse, mask=offs_r < n_rows)
    if ring is not None:
        return n_fix


@gluon.jit
def drain(k_ready, k_empty, v_ready, v_empty, v_smem, fix_bar, n_blocks, n_a, a_base, a_lo, a_hi, a_full_lo,
           a_full_hi, b_base, b_lo, b_hi, b_full_lo, b_full_hi, a_shift, b_shift, WG: gl.constexpr,
           BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, VS: gl.constexpr, V_T: gl.constexpr,
           CP_FILL: gl.constexpr, V_ROWS: gl.constexpr):  # fmt: skip
    """The second consumer warpgroup of a two-consumer form (``WG == 1``, one warpgroup a partition) in a
    launch whose caller knows that no query reaches past the first warpgroup's rows: it computes nothing,
    leaving the tensor cores to the other warpgroup, and keeps its part of the ring protocol without a
    wgmma (the arguments are :func:`consumer`'s, ``VS`` the V ring's slots). A compile-time form chosen by
    the caller, so the consumer's code is untouched (a runtime branch around its main loop costs every
    launch: bench/results/NOTES.md): each K and V slot waited for (so its release counts for the round
    the producer filled) and released, and this warpgroup's half of every V-row fix
    (:func:`zero_v_rows`' handshake, in the computing consumer's order: block ``j``'s before block
    ``j + 1``'s), its slot read in the view the computing consumer reads it (:func:`_pv_step`)."""
    HALF_N: gl.constexpr = BLOCK_N // 2
    n_fix = 0
    for j in range(n_blocks):
        slot = j % NUM_STAGES
        mbarrier.wait(k_ready.index(slot), (j // NUM_STAGES) & 1)
        _release(k_empty.index(slot), 1)
        vslot = j % VS
        mbarrier.wait(v_ready.index(vslot), (j // VS) & 1)
        n0, lo, hi, _, _, out = _block_geometry(
            j, n_a, a_base, a_lo, a_hi, a_shift, a_full_lo, a_full_hi, b_base, b_lo, b_hi, b_shift,
            b_full_lo, b_full_hi, BLOCK_N,
        )  # fmt: skip
        if out:
            if CP_FILL:
                fence_async_shared()
            if V_ROWS is not None:
                if j >= n_a:
                    v_rows = v_smem._reinterpret(v_smem.dtype, [v_smem.shape[0], v_smem.shape[2],
                                                 v_smem.shape[1]], V_ROWS).index(vslot)  # fmt: skip
                    n_fix = zero_v_rows(v_rows, fix_bar, n_fix, n0, lo, hi, WG, HALF_N, False, 1)
                else:
                    n_fix = zero_v_rows(v_smem.index(vslot), fix_bar, n_fix, n0, lo, hi, WG, HALF_N, V_T, 1)
            else:
                n_fix = zero_v_rows(v_smem.index(vslot), fix_bar, n_fix, n0, lo, hi, WG, HALF_N, V_T, 1)
        _release(v_empty.index(vslot), 1)
