"""Gluon kernel (NVIDIA Hopper, sm90): the window-prefill forward, warp-specialised.

The same attention as :func:`window_prefill.kernel._fwd_kernel` (conventions there: positions relative
to the sequence start, key ``j`` visible to row ``i`` by causality and the window, scores in log2
units with ``qk_scale = scale * log2(e)`` folded into the exponent), written in Gluon so the schedule
is ours rather than the compiler's. Triton 3.6 cannot express it (NOTES steps 32, 35, 53):

* **one producer warp** issues every TMA copy: the two Q halves, then K_j and V_j of each key block
  into a two-slot ring (``NUM_STAGES``), each slot refilled once both consumers released it
  (``k_empty``/``v_empty`` mbarriers, count 2; ``k_ready``/``v_ready`` carry the copies' bytes);
* **two consumer warpgroups**, 64 query rows each, that meet only at those mbarriers (no CTA-wide
  barrier per block), so one warpgroup's softmax runs while the other's wgmma does;
* inside each consumer, FlashAttention-3's intra-warpgroup overlap: ``S_j = Q K_j^T`` and ``O +=
  P_{j-1} V_{j-1}`` are issued back to back, the consumer waits for ``S_j`` only
  (``warpgroup_mma_wait(1)``), does block j's softmax while ``P_{j-1} V_{j-1}`` finishes, then waits
  for it and rescales ``O``. ``P`` stays in registers (the A operand of the second wgmma).

Scope (the host runs this kernel only there, else the Triton kernel): sm90, float16/bfloat16, head
size 64, 128 or 256, no sinks, no soft-capping, ``softmax_scale > 0``, Q/K/V each with one head's
features contiguous and 16-byte rows (TMA); any causal/window combination, the ``cu_seqlens`` or
``(starts, lens)`` forms, optional LSE. Query tiles of 128 rows, key blocks of 128 (64 at head 256:
the [64, 256] output tile takes the registers).

Edge blocks: every key block ``[n, n + BLOCK_N)`` of the tile's range ``[key_lo, key_hi)`` is one TMA
copy (rows past the tensor's end read as 0); blocks wholly outside the range are never loaded.
Masked blocks set invisible scores to ``-inf``, so keys outside ``[key_lo, key_hi)`` never reach a
row's softmax whatever they hold, and a block that sticks out of ``[key_lo, key_hi)`` has those V rows
set to 0 in shared memory before its ``P @ V`` (each consumer zeroes half the rows, then both meet at
``fix_bar``): ``0 * NaN`` would otherwise poison the row. (The Triton kernel's masked loads never
read those positions at all; here they are read and discarded.)

Tensors (host side): Q, K, V viewed as ``[total_tokens, heads * HEAD_DIM]`` through descriptors of
block ``[BLOCK_M / 2, HEAD_DIM]`` (Q) and ``[BLOCK_N, HEAD_DIM]`` (K, V); O by pointer with strides
``(stride_ot, stride_oh, 1)``; ``Lse`` ``[num_heads, total_tokens]`` float32, token stride 1.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)


@gluon.jit
def _gl_softmax_step(
    b_s, m_i, l_i, qk_scale, offs_m, n0, key_lo, key_hi, window_left, window_right, masked,
    BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
    S_LAYOUT: gl.constexpr,
):  # fmt: skip
    """Online-softmax step on raw scores ``b_s`` [BM, BN] of the key block at ``n0``: returns (p, alpha,
    m_new, l_new) with p = exp2(s * qk_scale - m_new) [BM, BN] float32, alpha = exp2(m_i - m_new) [BM]
    (the factor for the running output). ``masked`` (runtime, uniform): apply the visibility mask."""
    if masked:
        offs_k = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))  # [BN] key positions
        m_vis = ((offs_k >= key_lo) & (offs_k < key_hi))[None, :] & (offs_m >= 0)[:, None]  # [BM, BN]
        if IS_CAUSAL:
            m_vis = m_vis & (offs_k[None, :] <= offs_m[:, None])  # [BM, BN]
        if HAS_LEFT:
            m_vis = m_vis & (offs_m[:, None] - offs_k[None, :] <= window_left)  # [BM, BN]
        if HAS_RIGHT:
            m_vis = m_vis & (offs_k[None, :] - offs_m[:, None] <= window_right)  # [BM, BN]
        b_s = gl.where(m_vis, b_s, float("-inf"))  # [BM, BN]
    m_new = gl.maximum(m_i, gl.max(b_s, axis=1) * qk_scale)  # [BM]
    m_shift = gl.where(m_new == float("-inf"), 0.0, m_new)  # [BM] a row with nothing visible: exp2 -> 0
    b_p = gl.exp2(b_s * qk_scale - m_shift[:, None])  # [BM, BN]
    alpha = gl.exp2(m_i - m_shift)  # [BM]
    l_new = l_i * alpha + gl.sum(b_p, axis=1)  # [BM]
    return b_p, alpha, m_new, l_new


@gluon.jit
def _ws_producer(
    Q_desc, K_desc, V_desc, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty,
    tok0, m0, head, kv_col, n_lo, n_blocks,
    HALF_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr,
):  # fmt: skip
    """One warp: the two Q halves, then K_j and V_j of every key block into slot j % NUM_STAGES once
    both consumers released that slot (a fresh barrier passes the first round's wait)."""
    kv_bytes: gl.constexpr = BLOCK_N * HEAD_DIM * 2
    for h in gl.static_range(2):
        mbarrier.expect(q_bar.index(h), HALF_M * HEAD_DIM * 2)
        tma.async_copy_global_to_shared(
            Q_desc, [tok0 + m0 + h * HALF_M, head * HEAD_DIM], q_bar.index(h), q_smem.index(h)
        )
    for j in range(n_blocks):
        slot = j % NUM_STAGES
        phase = ((j // NUM_STAGES) & 1) ^ 1
        row = tok0 + n_lo + j * BLOCK_N
        mbarrier.wait(k_empty.index(slot), phase)
        mbarrier.expect(k_ready.index(slot), kv_bytes)
        tma.async_copy_global_to_shared(K_desc, [row, kv_col], k_ready.index(slot), k_smem.index(slot))
        mbarrier.wait(v_empty.index(slot), phase)
        mbarrier.expect(v_ready.index(slot), kv_bytes)
        tma.async_copy_global_to_shared(V_desc, [row, kv_col], v_ready.index(slot), v_smem.index(slot))


@gluon.jit
def _ws_fix_v(v_buf, fix_bar, n_fix, n0, key_lo, key_hi, WG: gl.constexpr, HALF_N: gl.constexpr,
              HEAD_DIM: gl.constexpr):  # fmt: skip
    """This warpgroup's half of the V rows of the block at ``n0`` outside [key_lo, key_hi) set to 0,
    then a handshake with the other consumer (``fix_bar``, count 2) so both halves are done."""
    blk: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    half = v_buf.slice(WG * HALF_N, HALF_N, dim=0)
    b_v = half.load(blk)  # [BN / 2, D]
    offs_k = n0 + WG * HALF_N + gl.arange(0, HALF_N, layout=gl.SliceLayout(1, blk))  # [BN / 2]
    keep = (offs_k >= key_lo) & (offs_k < key_hi)
    half.store(gl.where(keep[:, None], b_v, gl.zeros_like(b_v)))
    fence_async_shared()
    mbarrier.arrive(fix_bar, count=1)
    mbarrier.wait(fix_bar, n_fix & 1)
    return n_fix + 1


@gluon.jit
def _ws_consumer(
    WG: gl.constexpr, O, Lse, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty, fix_bar,
    tok0, seq_len, m0, head, key_lo, key_hi, n_lo, n_full_lo, n_full_hi, n_blocks, qk_scale,
    window_left, window_right, stride_ot, stride_oh, stride_lse_h,
    HALF_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr,
    IS_CAUSAL: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, RETURN_LSE: gl.constexpr,
):  # fmt: skip
    """One warpgroup: rows [m0 + WG * HALF_M, + HALF_M) against every key block (the overlapped step of
    the module docstring), then its rows of O (and the LSE)."""
    S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
    )
    O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    P_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2)
    dtype: gl.constexpr = q_smem.dtype
    q_buf = q_smem.index(WG)
    offs_m = m0 + WG * HALF_M + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, S_LAYOUT))  # [BM / 2]
    m_i = gl.full([HALF_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))
    l_i = gl.zeros([HALF_M], gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))
    acc = gl.zeros([HALF_M, HEAD_DIM], gl.float32, layout=O_LAYOUT)

    mbarrier.wait(q_bar.index(WG), 0)
    mbarrier.wait(k_ready.index(0), 0)
    b_s = warpgroup_mma(
        q_buf,
        k_smem.index(0).permute((1, 0)),
        gl.zeros([HALF_M, BLOCK_N], gl.float32, layout=S_LAYOUT),
        use_acc=False,
        is_async=True,
    )
    b_s = warpgroup_mma_wait(0, deps=[b_s])
    mbarrier.arrive(k_empty.index(0), count=1)
    masked = (n_lo < n_full_lo) | (n_lo >= n_full_hi)
    b_p, alpha, m_i, l_i = _gl_softmax_step(
        b_s, m_i, l_i, qk_scale, offs_m, n_lo, key_lo, key_hi, window_left, window_right, masked,
        BLOCK_N, IS_CAUSAL, HAS_LEFT, HAS_RIGHT, S_LAYOUT,
    )  # fmt: skip
    b_p = gl.convert_layout(b_p.to(dtype), P_LAYOUT)
    n_prev = n_lo
    n_fix = 0
    for j in range(1, n_blocks):
        n0 = n_lo + j * BLOCK_N
        slot = j % NUM_STAGES
        pslot = (j - 1) % NUM_STAGES
        mbarrier.wait(k_ready.index(slot), (j // NUM_STAGES) & 1)
        b_s = warpgroup_mma(
            q_buf,
            k_smem.index(slot).permute((1, 0)),
            gl.zeros([HALF_M, BLOCK_N], gl.float32, layout=S_LAYOUT),
            use_acc=False,
            is_async=True,
        )  # S_j in flight
        mbarrier.wait(v_ready.index(pslot), ((j - 1) // NUM_STAGES) & 1)
        if (n_prev < key_lo) | (n_prev + BLOCK_N > key_hi):
            n_fix = _ws_fix_v(v_smem.index(pslot), fix_bar, n_fix, n_prev, key_lo, key_hi, WG, BLOCK_N // 2,
                              HEAD_DIM)  # fmt: skip
        acc = warpgroup_mma(b_p, v_smem.index(pslot), acc, is_async=True)  # += P_{j-1} V_{j-1}
        b_s = warpgroup_mma_wait(1, deps=[b_s])
        mbarrier.arrive(k_empty.index(slot), count=1)
        masked = (n0 < n_full_lo) | (n0 >= n_full_hi)
        b_pf, alpha, m_i, l_i = _gl_softmax_step(
            b_s, m_i, l_i, qk_scale, offs_m, n0, key_lo, key_hi, window_left, window_right, masked,
            BLOCK_N, IS_CAUSAL, HAS_LEFT, HAS_RIGHT, S_LAYOUT,
        )  # fmt: skip
        acc, b_p = warpgroup_mma_wait(0, deps=[acc, b_p])
        mbarrier.arrive(v_empty.index(pslot), count=1)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))[:, None]
        b_p = gl.convert_layout(b_pf.to(dtype), P_LAYOUT)
        n_prev = n0

    last = n_blocks - 1
    lslot = last % NUM_STAGES
    mbarrier.wait(v_ready.index(lslot), (last // NUM_STAGES) & 1)
    if (n_prev < key_lo) | (n_prev + BLOCK_N > key_hi):
        n_fix = _ws_fix_v(v_smem.index(lslot), fix_bar, n_fix, n_prev, key_lo, key_hi, WG, BLOCK_N // 2,
                          HEAD_DIM)  # fmt: skip
    acc = warpgroup_mma(b_p, v_smem.index(lslot), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=[acc])

    l_safe = gl.where(l_i == 0.0, 1.0, l_i)
    inv_o = gl.convert_layout(1.0 / l_safe, gl.SliceLayout(1, O_LAYOUT))
    b_o = (acc * inv_o[:, None]).to(O.dtype.element_ty)  # [BM / 2, D]
    offs_mo = m0 + WG * HALF_M + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, O_LAYOUT))
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, O_LAYOUT))
    p_row = O + head.to(gl.int64) * stride_oh + (tok0 + offs_mo).to(gl.int64) * stride_ot  # [BM / 2]
    p_o = p_row[:, None] + offs_d[None, :]  # [BM / 2, D]
    gl.store(p_o, b_o, mask=(offs_mo < seq_len)[:, None] & (offs_d < HEAD_DIM)[None, :])
    if RETURN_LSE:
        b_lse = gl.where(l_i == 0.0, float("-inf"), (m_i + gl.log2(l_safe)) * 0.6931471805599453)
        p_lse = Lse + head.to(gl.int64) * stride_lse_h + (tok0 + offs_m).to(gl.int64)
        gl.store(p_lse, b_lse, mask=offs_m < seq_len)


@gluon.jit(do_not_specialize=["window_left", "window_right", "stride_lse_h"])
def _gluon_fwd_kernel(
    Q_desc, K_desc, V_desc, O, Starts, Lens, qk_scale, window_left, window_right, group_size,
    stride_ot, stride_oh, Lse, stride_lse_h,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr,
    HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, LENS_FROM_STARTS: gl.constexpr,
    RETURN_LSE: gl.constexpr, NUM_STAGES: gl.constexpr,
):  # fmt: skip
    """Grid (cdiv(max_len, BLOCK_M), num_heads, batch), as the Triton kernel; launched with 4 warps:
    the default partition is consumer 0, the workers consumer 1 (4 warps) and the producer (1 warp).
    ``qk_scale`` = softmax scale * log2(e) (> 0). Tensors: see the module docstring."""
    # The tile's key range and interior: the Triton kernel's arithmetic (kernel._fwd_kernel), restated
    # because a Gluon function cannot call a Triton one; both kernels pass the same skipping proofs.
    if IS_CAUSAL:
        pid_m = gl.num_programs(0) - 1 - gl.program_id(0)
    else:
        pid_m = gl.program_id(0)
    head = gl.program_id(1)
    seq = gl.program_id(2)
    tok0 = gl.load(Starts + seq).to(gl.int32)
    if LENS_FROM_STARTS:
        seq_len = gl.load(Starts + seq + 1).to(gl.int32) - tok0
    else:
        seq_len = gl.load(Lens + seq).to(gl.int32)
    m0 = pid_m * BLOCK_M
    if m0 >= seq_len:
        return
    m1 = gl.minimum(m0 + BLOCK_M, seq_len)
    key_lo = m0 * 0
    key_hi = seq_len
    if HAS_LEFT:
        key_lo = gl.maximum(m0 - window_left, 0)
    if HAS_RIGHT:
        key_hi = gl.minimum(key_hi, m1 + window_right)
    if IS_CAUSAL:
        key_hi = gl.minimum(key_hi, m1)
    full_lo = key_lo
    full_hi = key_hi
    if HAS_LEFT:
        full_lo = gl.maximum(full_lo, m1 - 1 - window_left)
    if HAS_RIGHT:
        full_hi = gl.minimum(full_hi, m0 + window_right + 1)
    if IS_CAUSAL:
        full_hi = gl.minimum(full_hi, m0 + 1)
    n_lo = (key_lo // BLOCK_N) * BLOCK_N
    n_full_lo = gl.cdiv(full_lo, BLOCK_N) * BLOCK_N
    n_full_hi = gl.maximum((full_hi // BLOCK_N) * BLOCK_N, n_full_lo)
    n_blocks = gl.cdiv(key_hi - n_lo, BLOCK_N)
    kv_col = (head // group_size) * HEAD_DIM
    HALF_M: gl.constexpr = BLOCK_M // 2
    dtype: gl.constexpr = Q_desc.dtype

    q_smem = gl.allocate_shared_memory(dtype, [2, HALF_M, HEAD_DIM], Q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], K_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], V_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    fix_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_bar.index(i), count=1)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)
        mbarrier.init(v_empty.index(i), count=2)
    mbarrier.init(fix_bar.index(0), count=2)
    fence_async_shared()

    bar_f = fix_bar.index(0)
    gl.warp_specialize(
        [
            (_ws_consumer, (
                0, O, Lse, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty, bar_f,
                tok0, seq_len, m0, head, key_lo, key_hi, n_lo, n_full_lo, n_full_hi, n_blocks, qk_scale,
                window_left, window_right, stride_ot, stride_oh, stride_lse_h, HALF_M, BLOCK_N, HEAD_DIM,
                NUM_STAGES, IS_CAUSAL, HAS_LEFT, HAS_RIGHT, RETURN_LSE,
            )),
            (_ws_consumer, (
                1, O, Lse, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty, bar_f,
                tok0, seq_len, m0, head, key_lo, key_hi, n_lo, n_full_lo, n_full_hi, n_blocks, qk_scale,
                window_left, window_right, stride_ot, stride_oh, stride_lse_h, HALF_M, BLOCK_N, HEAD_DIM,
                NUM_STAGES, IS_CAUSAL, HAS_LEFT, HAS_RIGHT, RETURN_LSE,
            )),
            (_ws_producer, (
                Q_desc, K_desc, V_desc, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty,
                tok0, m0, head, kv_col, n_lo, n_blocks, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES,
            )),
        ],
        [4, 1],
        [240, 24],  # registers per thread asked for the workers (a TMA warp needs few)
    )  # fmt: skip
