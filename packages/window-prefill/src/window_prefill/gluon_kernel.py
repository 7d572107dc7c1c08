"""Gluon kernel (NVIDIA Hopper, sm90): the window-prefill forward, warp-specialised.

The same attention as :func:`window_prefill.kernel._fwd_kernel` (conventions there: positions relative
to the sequence start, key ``j`` visible to row ``i`` by causality and the window, scores in log2
units with ``qk_scale = scale * log2(e)`` folded into the exponent), written in Gluon so the schedule
is ours rather than the compiler's (Triton's own pipelining cannot express it):

* **one producer warp** issues every TMA copy: the two Q halves, then K_j and V_j of each key block
  into a two-slot ring (``NUM_STAGES``), each slot refilled once both consumers released it
  (``k_empty``/``v_empty`` mbarriers, count 2; ``k_ready``/``v_ready`` carry the copies' bytes);
* **two consumer warpgroups**, 64 query rows each, that meet only at those mbarriers (no CTA-wide
  barrier per block), so one warpgroup's softmax runs while the other's wgmma does;
* inside each consumer (``prefill_runtime.gluon.consumer``, shared with prefix-prefill),
  FlashAttention-3's intra-warpgroup overlap: ``S_j = Q K_j^T`` and ``O += P_{j-1} V_{j-1}`` are
  issued back to back, the consumer waits for ``S_j`` only (``warpgroup_mma_wait(1)``), does block j's
  softmax while ``P_{j-1} V_{j-1}`` finishes, then waits for it and rescales ``O``. ``P`` stays in
  registers (the A operand of the second wgmma).

Scope (the host runs this kernel only there, else the Triton kernel): sm90, float16/bfloat16, head
size 64, 128 or 256, ``softmax_scale > 0`` (or soft-capping), Q/K/V each with one head's features
contiguous and 16-byte rows (TMA); any causal/window combination, the ``cu_seqlens`` or ``(starts,
lens)`` forms, optional LSE, sinks in both modes (``SINKS`` 1: an extra logit of the denominator; 2: a
bias on key 0, whose block is then always masked), soft-capping (``SOFTCAP``: the consumer's
``tanh``, ``tanh_scale = scale / softcap``, ``qk_scale = softcap * log2(e)``). Query tiles of 128
rows, key blocks of 128 (64 at head 256: the [64, 256] output tile takes the registers).

Edge blocks: every key block ``[n, n + BLOCK_N)`` of the tile's range ``[key_lo, key_hi)`` is one TMA
copy (rows past the tensor's end read as 0); blocks wholly outside the range are never loaded.
Masked blocks set invisible scores to ``-inf``, so keys outside ``[key_lo, key_hi)`` never reach a
row's softmax whatever they hold, and a block that sticks out of ``[key_lo, key_hi)`` has those V rows
set to 0 in shared memory before its ``P @ V`` (each consumer zeroes half the rows, then both meet at
``fix_bar``): ``0 * NaN`` would otherwise poison the row. (The Triton kernel's masked loads never
read those positions at all; here they are read and discarded.)

Bounds: the Triton kernel's program setup (``program_tile``: spans clamped into ``Q_desc``'s token count,
the status report) and its rows past the grid, written as 0 here by
``prefill_runtime.gluon_bounds.zero_rows``; every load is a TMA box bounded by its descriptor.

Tensors (host side): Q, K, V viewed as ``[total_tokens, heads * HEAD_DIM]`` through descriptors of
block ``[BLOCK_M / 2, HEAD_DIM]`` (Q) and ``[BLOCK_N, HEAD_DIM]`` (K, V); O by pointer with strides
``(stride_ot, stride_oh, 1)``; ``Lse`` ``[num_heads, total_tokens]`` float32, token stride 1;
``Sinks`` ``[num_heads]`` float32.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from prefill_runtime.gluon import allocate_rings, consumer, load_q_halves, score_terms
from prefill_runtime.gluon_bounds import zero_rows
from window_prefill.kernel import program_tile, tile_key_range


@gluon.jit
def _ws_producer(
    Q_desc, K_desc, V_desc, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty,
    tok0, m0, head, kv_col, n_lo, n_blocks,
    HALF_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr,
):  # fmt: skip
    """One warp: the two Q halves, then K_j and V_j of every key block into slot j % NUM_STAGES once
    both consumers released that slot (a fresh barrier passes the first round's wait)."""
    kv_bytes: gl.constexpr = BLOCK_N * HEAD_DIM * 2
    load_q_halves(Q_desc, q_smem, q_bar, tok0 + m0, head * HEAD_DIM, HALF_M, HEAD_DIM)
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


@gluon.jit(do_not_specialize=["window_left", "window_right", "stride_lse_h", "max_len"])
def _gluon_fwd_kernel(
    Q_desc, K_desc, V_desc, O, Starts, Lens, qk_scale, window_left, window_right, group_size,
    stride_ot, stride_oh, Lse, stride_lse_h, max_len, Status, Sinks, tanh_scale,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr,
    HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, LENS_FROM_STARTS: gl.constexpr,
    RETURN_LSE: gl.constexpr, NUM_STAGES: gl.constexpr, SOFTCAP: gl.constexpr = 0, SINKS: gl.constexpr = 0,
):  # fmt: skip
    """Grid (cdiv(max_len, BLOCK_M), num_heads, batch), as the Triton kernel; launched with 4 warps:
    the default partition is consumer 0, the workers consumer 1 (4 warps) and the producer (1 warp).
    ``qk_scale`` = softmax scale * log2(e) (> 0), or with ``SOFTCAP`` softcap * log2(e) and
    ``tanh_scale`` = softmax scale / softcap (else None); ``Sinks``: with ``SINKS`` (1 denominator, 2
    key-0 bias), else None. Tensors: see the module docstring. Sequences come clamped into ``Q_desc``'s
    token count and reported into ``Status`` (None: no report) as in the Triton kernel, whose program
    setup this is (``program_tile``); the rows past the grid of a sequence longer than ``max_len`` are
    written as 0 by each head's program of the last query tile."""
    # (tok0 int32)
    pid_m, head, tok0, seq_len = program_tile(Starts, Lens, Q_desc.shape[0], max_len, Status, BLOCK_M,
                                              IS_CAUSAL, LENS_FROM_STARTS, False)  # fmt: skip
    m0 = pid_m * BLOCK_M
    if m0 >= seq_len:
        return
    grid_rows = gl.num_programs(0) * BLOCK_M
    if (pid_m == gl.num_programs(0) - 1) & (seq_len > grid_rows):  # rows past the grid: 0
        zero_rows(O, stride_ot, stride_oh, tok0, grid_rows, seq_len, head, Lse, stride_lse_h, HEAD_DIM)
    m1 = gl.minimum(m0 + BLOCK_M, seq_len)
    # the tile's key range and interior: the Triton kernel's own helper (same blocks skipped)
    key_lo, key_hi, full_lo, full_hi = tile_key_range(
        m0, m1, seq_len, window_left, window_right, IS_CAUSAL, HAS_LEFT, HAS_RIGHT
    )
    if SINKS == 2:
        full_lo = gl.maximum(full_lo, 1)  # key 0 carries the sink's bias: its block takes the masked path
    n_lo = (key_lo // BLOCK_N) * BLOCK_N
    n_full_lo = gl.cdiv(full_lo, BLOCK_N) * BLOCK_N
    n_full_hi = gl.maximum((full_hi // BLOCK_N) * BLOCK_N, n_full_lo)
    n_blocks = gl.cdiv(key_hi - n_lo, BLOCK_N)
    kv_col = (head // group_size) * HEAD_DIM
    HALF_M: gl.constexpr = BLOCK_M // 2

    q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty, bar_f = allocate_rings(
        Q_desc, K_desc, V_desc, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES
    )
    score = score_terms(qk_scale, tanh_scale, Sinks, Sinks, head, SOFTCAP, False, SINKS)
    z = m0 * 0  # segment B is empty; A is the tile's key range
    gl.warp_specialize(
        [
            (consumer, (
                0, O, Lse, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty, bar_f, m0, tok0,
                seq_len, head, n_blocks, n_blocks, n_lo, key_lo, key_hi, z, n_full_lo, n_full_hi, z, z, z, z,
                z, z, qk_scale, window_left, window_right, stride_ot, stride_oh, stride_lse_h,
                HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, IS_CAUSAL, HAS_LEFT, HAS_RIGHT, RETURN_LSE,
                False, False, 1, None, 0, 64, None, score, SOFTCAP, False, SINKS,
            )),
            (consumer, (
                1, O, Lse, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty, bar_f, m0, tok0,
                seq_len, head, n_blocks, n_blocks, n_lo, key_lo, key_hi, z, n_full_lo, n_full_hi, z, z, z, z,
                z, z, qk_scale, window_left, window_right, stride_ot, stride_oh, stride_lse_h,
                HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, IS_CAUSAL, HAS_LEFT, HAS_RIGHT, RETURN_LSE,
                False, False, 1, None, 0, 64, None, score, SOFTCAP, False, SINKS,
            )),
            (_ws_producer, (
                Q_desc, K_desc, V_desc, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty,
                tok0, m0, head, kv_col, n_lo, n_blocks, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES,
            )),
        ],
        [4, 1],
        [240, 24],  # registers per thread asked for the workers (a TMA warp needs few)
    )  # fmt: skip
