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
``tanh``, ``tanh_scale = scale / softcap``, ``qk_scale = softcap * log2(e)``), ALiBi (``HAS_ALIBI``:
the consumer's slope term, ``- Slopes[head] * |i - j|``; queries and keys share positions, so the
consumer's query shift is 0). Query tiles of 128
rows, key blocks of 128 (64 at head 256: the [64, 256] output tile takes the registers).

Persistent form (``PERSISTENT``, the plan's choice for causal calls and windows of at most
``plan._PERSISTENT_MAX_WIDTH`` keys, :func:`_persistent_partitions`): grid ``(programs, 1, 1)``, one program
a multiprocessor, over the launch's ``n_m * batch * heads`` tiles (:func:`_persistent_tile`: the latest
query tiles of every sequence first, a sequence's heads back to back). Where under half the tiles hold
rows (one long sequence among short ones) only those are numbered (:func:`_live_tile`), so a tile past
its sequence costs no atomic. The producer warp takes number ``program_id`` first and each later one from
a counter in global memory (an atomic add; the launch's last program sets it back to 0; no counter when
the numbers are no more than the programs) and hands the tile to the consumers through a shared-memory
slot written before the tile's Q lands, so a program that finishes early takes more tiles and tiles of
unlike cost balance. The
sequences' spans come from a shared-memory table each program fills once (:func:`_fill_seq_table`); the
rings' blocks count on from tile to tile and Q is handed back after each tile's last ``Q K^T``
(``q_empty``), so the next tile's Q and first blocks load while the consumers finish the current one.

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
``Sinks``, ``Slopes`` ``[num_heads]`` float16/bfloat16/float32 (read as float32).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from prefill_runtime.bounds import MAX_LEN, ROWS, report
from prefill_runtime.gluon import (
    allocate_q_empty,
    allocate_rings,
    allocate_tile_slot,
    consumer,
    first_turn,
    last_turn,
    live_tile_number,
    load_q_halves,
    next_tile,
    out_scale_of,
    read_tile_slot,
    score_terms,
    takes_turns,
    tiles_done,
    write_tile_slot,
)
from prefill_runtime.gluon_bounds import zero_rows
from window_prefill.kernel import program_tile, sequence_span, tile_key_range


@gluon.jit
def _ws_producer(
    Q_desc, K_desc, V_desc, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty,
    tok0, m0, head, kv_col, n_lo, n_blocks,
    HALF_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr, base=0,
):  # fmt: skip
    """One warp: the two Q halves, then K_j and V_j of every key block into slot j % NUM_STAGES once
    both consumers released that slot (a fresh barrier passes the first round's wait). ``base`` (a
    persistent program's tile): the rings' blocks before this tile's, so block ``j`` is the rings' block
    ``base + j`` (its slot and round)."""
    kv_bytes: gl.constexpr = BLOCK_N * HEAD_DIM * 2
    load_q_halves(Q_desc, q_smem, q_bar, tok0 + m0, head * HEAD_DIM, HALF_M, HEAD_DIM)
    for j in range(n_blocks):
        r = base + j  # the rings' block
        slot = r % NUM_STAGES
        phase = ((r // NUM_STAGES) & 1) ^ 1
        row = tok0 + n_lo + j * BLOCK_N
        mbarrier.wait(k_empty.index(slot), phase)
        mbarrier.expect(k_ready.index(slot), kv_bytes)
        tma.async_copy_global_to_shared(K_desc, [row, kv_col], k_ready.index(slot), k_smem.index(slot))
        mbarrier.wait(v_empty.index(slot), phase)
        mbarrier.expect(v_ready.index(slot), kv_bytes)
        tma.async_copy_global_to_shared(V_desc, [row, kv_col], v_ready.index(slot), v_smem.index(slot))


@gluon.jit
def _tile_blocks(m0, seq_len, window_left, window_right, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 IS_CAUSAL: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
                 SINKS: gl.constexpr):  # fmt: skip
    """The key blocks of the query tile at row ``m0`` (``m0 < seq_len``): ``(n_lo, n_blocks, key_lo,
    key_hi, n_full_lo, n_full_hi)``: ``n_blocks`` blocks of ``BLOCK_N`` keys from ``n_lo`` cover the
    tile's key range ``[key_lo, key_hi)`` (the Triton kernel's ``tile_key_range``: both kernels skip the
    same blocks), blocks inside ``[n_full_lo, n_full_hi)`` need no mask (``SINKS == 2``: key 0's block
    always takes the masked path, it carries the sink's bias)."""
    m1 = gl.minimum(m0 + BLOCK_M, seq_len)
    key_lo, key_hi, full_lo, full_hi = tile_key_range(
        m0, m1, seq_len, window_left, window_right, IS_CAUSAL, HAS_LEFT, HAS_RIGHT
    )
    if SINKS == 2:
        full_lo = gl.maximum(full_lo, 1)
    n_lo = (key_lo // BLOCK_N) * BLOCK_N
    n_full_lo = gl.cdiv(full_lo, BLOCK_N) * BLOCK_N
    n_full_hi = gl.maximum((full_hi // BLOCK_N) * BLOCK_N, n_full_lo)
    n_blocks = gl.cdiv(key_hi - n_lo, BLOCK_N)
    return n_lo, n_blocks, key_lo, key_hi, n_full_lo, n_full_hi


#: The persistent form's table of sequence spans in shared memory: the first ``SEQ_TABLE`` sequences' first
#: token and length, filled once per program; a tile of a later sequence reads its span from global memory.
SEQ_TABLE = gl.constexpr(1024)


@gluon.jit
def _fill_seq_table(table, Starts, Lens, n_seqs, n_tokens, max_len, grid_rows, n_m, BLOCK_M: gl.constexpr,
                    LENS_FROM_STARTS: gl.constexpr):  # fmt: skip
    """The default partition's prologue of a persistent program: ``table`` ``[2 * SEQ_TABLE, 1]`` int32 gets
    the clamped spans (``tok0``, ``seq_len``: ``window_prefill.kernel.sequence_span``'s) of the first
    ``SEQ_TABLE`` sequences.
    Returns ``(flags, past, live)``: the status bits of all ``n_seqs`` sequences (``ROWS`` where a clamp
    moved a span, ``MAX_LEN`` where a sequence is longer than ``max_len``), whether some sequence runs past
    the grid's ``grid_rows`` rows, and the query tiles of the ``n_m`` levels that hold rows, summed over
    the sequences (:func:`_chunk_live`)."""
    NW: gl.constexpr = gl.num_warps()
    CH: gl.constexpr = 32 * NW
    L: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [NW, 1], [1, 0])
    LS: gl.constexpr = gl.SliceLayout(1, L)
    offs = gl.arange(0, CH, layout=LS)  # [CH]
    flags = gl.zeros([CH], gl.int32, layout=LS)  # [CH]
    longest = gl.zeros([CH], gl.int32, layout=LS)  # [CH]
    live = gl.zeros([CH], gl.int32, layout=LS)  # [CH]
    for s0 in range(0, n_seqs, CH):
        seqs = s0 + offs  # [CH]
        m = seqs < n_seqs
        tok0, seq_len, moved = sequence_span(Starts, Lens, seqs, n_tokens, LENS_FROM_STARTS, m)  # [CH]
        flags |= gl.where(m & moved, ROWS, 0) | gl.where(m & (seq_len > max_len), MAX_LEN, 0)
        longest = gl.maximum(longest, gl.where(m, seq_len, 0))
        live += gl.where(m, gl.minimum((seq_len + BLOCK_M - 1) // BLOCK_M, n_m), 0)
        for c in gl.static_range(SEQ_TABLE // CH):
            if s0 == c * CH:
                table.slice(c * CH, CH).store(tok0.to(gl.int32)[:, None])  # rows [0, SEQ_TABLE): tok0
                table.slice(SEQ_TABLE + c * CH, CH).store(seq_len[:, None])  # then the lengths
    return gl.reduce_or(flags, 0), gl.max(longest, 0) > grid_rows, gl.sum(live, 0)


@gluon.jit
def _chunk_live(table, Starts, Lens, c0, level, n_seqs, n_tokens, n_m, BLOCK_M: gl.constexpr,
                LENS_FROM_STARTS: gl.constexpr):  # fmt: skip
    """The producer's view of sequences ``[c0, c0 + 32 * num_warps)`` (``c0`` a multiple of that):
    ``(seqs, live)``, ``live`` whether each has rows at query level ``level`` (``min(cdiv(seq_len,
    BLOCK_M), n_m)`` levels a sequence); lengths from the table for the first :data:`SEQ_TABLE`
    sequences, else read (``sequence_span``)."""
    NW: gl.constexpr = gl.num_warps()
    CH: gl.constexpr = 32 * NW
    L: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [NW, 1], [1, 0])
    L1: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0])  # (a scan's layout, :func:`_live_tile`)
    seqs = c0 + gl.arange(0, CH, layout=L1)  # [CH]
    inside = seqs < n_seqs
    if c0 < SEQ_TABLE:
        rows = table._reinterpret(gl.int32, [2 * SEQ_TABLE // CH, CH, 1], table.layout)
        seq_len = gl.convert_layout(gl.max(rows.index((SEQ_TABLE + c0) // CH).load(L), 1), L1)  # [CH]
    else:
        _tok0, seq_len, _moved = sequence_span(Starts, Lens, seqs, n_tokens, LENS_FROM_STARTS, inside)
    tiles = gl.minimum((seq_len + BLOCK_M - 1) // BLOCK_M, n_m)
    return seqs, inside & (tiles > level)


@gluon.jit
def _live_tile(u, cursor, table, Starts, Lens, sched, n_tokens, BLOCK_M: gl.constexpr,
               LENS_FROM_STARTS: gl.constexpr):  # fmt: skip
    """The tile number (:func:`_persistent_tile`'s ``t``) of live tile ``u``: the launch's tiles that hold
    rows, in :func:`_persistent_tile`'s order. ``cursor = (k, c0, u_base, count)``: query level ``k`` from
    the latest, the sequences from ``c0`` (:func:`_chunk_live`), ``u_base`` live tiles before them,
    ``count`` theirs (times the heads); it only moves forward, as a program's ``u`` grow. Starts at ``(0,
    -CH, 0, 0)``. Returns ``(t, cursor)``."""
    heads = sched[0]
    n_m = sched[1]
    n_seqs = sched[2]
    k, c0, u_base, count = cursor
    while u >= u_base + count:
        u_base += count
        c0 += 32 * gl.num_warps()
        if c0 >= n_seqs:
            c0 = c0 * 0
            k += 1
        _seqs, live = _chunk_live(table, Starts, Lens, c0, n_m - 1 - k, n_seqs, n_tokens, n_m, BLOCK_M,
                                  LENS_FROM_STARTS)  # fmt: skip
        count = gl.sum(live.to(gl.int32), 0) * heads
    seqs, live = _chunk_live(table, Starts, Lens, c0, n_m - 1 - k, n_seqs, n_tokens, n_m, BLOCK_M,
                             LENS_FROM_STARTS)  # fmt: skip
    return live_tile_number(u, k, u_base, seqs, live, heads, n_seqs), (k, c0, u_base, count)


@gluon.jit
def _seq_span(table, Starts, Lens, seq, n_tokens, LENS_FROM_STARTS: gl.constexpr):
    """``(tok0, seq_len)`` of sequence ``seq``: from the program's table (:func:`_fill_seq_table`) for the
    first ``SEQ_TABLE`` sequences, else from global memory."""
    NW: gl.constexpr = gl.num_warps()
    L1: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [NW, 1], [1, 0])
    if seq < SEQ_TABLE:  # the table seen as [2 * SEQ_TABLE] entries of [1, 1]: an entry's one value
        entries = table._reinterpret(gl.int32, [2 * SEQ_TABLE, 1, 1], table.layout)
        tok0 = gl.max(gl.max(entries.index(seq).load(L1), 1), 0)
        seq_len = gl.max(gl.max(entries.index(SEQ_TABLE + seq).load(L1), 1), 0)
    else:
        tok0_wide, seq_len, _moved = sequence_span(Starts, Lens, seq, n_tokens, LENS_FROM_STARTS)
        tok0 = tok0_wide.to(gl.int32)
    return tok0, seq_len


@gluon.jit
def _persistent_tile(t, sched, table, Starts, Lens, n_tokens, BLOCK_M: gl.constexpr,
                     LENS_FROM_STARTS: gl.constexpr):  # fmt: skip
    """Tile ``t`` of a persistent launch's tile space (``sched = (heads, n_m, batch, tiles)``, ``tiles = n_m *
    batch * heads``, or with head sections ``(heads, n_m, batch, tiles, section)``) as ``(head, m0, tok0,
    seq_len)``: the latest query tiles of every sequence first (under causality they carry the most keys),
    then sequence by sequence, a sequence's heads back to back (a KV head's query heads read its keys while
    they are in L2); with sections, the heads in sections of ``section`` (whole KV heads' groups,
    ``window_prefill.launch.head_section``), that order within each. ``m0 >= seq_len``: a tile past its
    sequence's end."""
    section = sched[0]  # (no sections: all heads one section, ``sec`` 0)
    sec = t * 0
    r = t
    if len(sched) == 5:  # head sections (the launch's SECTIONS)
        section = sched[4]
        if section < sched[0]:  # (the live numbering's order is one section: no division for it)
            per_section = sched[1] * sched[2] * section
            sec = t // per_section
            r = t - sec * per_section
    per_level = sched[2] * section
    m0 = (sched[1] - 1 - r // per_level) * BLOCK_M
    r = r % per_level
    tok0, seq_len = _seq_span(table, Starts, Lens, r // section, n_tokens, LENS_FROM_STARTS)
    return sec * section + r % section, m0, tok0, seq_len


@gluon.jit
def _persistent_consumer(
    WG: gl.constexpr, O, Lse, Starts, Lens, n_tokens, table, rings, q_empty, tile_slot, sched, Sinks, Slopes,
    qk_scale, tanh_scale, window_left, window_right, stride_ot, stride_oh, stride_lse_h,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
    IS_CAUSAL: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, LENS_FROM_STARTS: gl.constexpr,
    RETURN_LSE: gl.constexpr, SOFTCAP: gl.constexpr, SINKS: gl.constexpr, HAS_ALIBI: gl.constexpr, out_scale,
    OUT_MAX: gl.constexpr,
):  # fmt: skip
    """Consumer warpgroup ``WG`` of a persistent program: ``prefill_runtime.gluon.consumer`` over the tiles
    the producer takes (:func:`_persistent_producer`), each read from ``tile_slot`` once its Q has landed
    (``q_bar``'s phase; -1 ends the program), the rings' blocks and the V-row handshake counting on from
    tile to tile, each tile's Q handed back on ``q_empty`` after its last ``Q K^T``."""
    q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty, bar_f = rings
    HALF_M: gl.constexpr = BLOCK_M // 2
    base = gl.to_tensor(0)  # the rings' blocks of the tiles before
    n_fix = gl.to_tensor(0)
    n_done = gl.to_tensor(0)  # tiles computed (Q's phase)
    PINGPONG: gl.constexpr = takes_turns(HEAD_DIM)  # the consumers' turns at the tensor cores
    first_turn(WG, PINGPONG)
    mbarrier.wait(q_bar.index(WG), 0)
    t = read_tile_slot(tile_slot)
    while t >= 0:
        c_head, c_m0, c_tok0, c_len = _persistent_tile(t, sched, table, Starts, Lens, n_tokens, BLOCK_M,
                                                       LENS_FROM_STARTS)  # fmt: skip
        n_lo, n_blocks, key_lo, key_hi, n_full_lo, n_full_hi = _tile_blocks(
            c_m0, c_len, window_left, window_right, BLOCK_M, BLOCK_N, IS_CAUSAL, HAS_LEFT, HAS_RIGHT, SINKS,
        )  # fmt: skip
        score = score_terms(qk_scale, tanh_scale, Sinks, Slopes, c_head, SOFTCAP, HAS_ALIBI, SINKS)
        z = c_m0 * 0  # segment B is empty; A is the tile's key range
        n_fix = consumer(
            WG, O, Lse, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty, bar_f, c_m0,
            c_tok0, c_len, c_head, n_blocks, n_blocks, n_lo, key_lo, key_hi, z, n_full_lo, n_full_hi, z,
            z, z, z, z, z, qk_scale, window_left, window_right, stride_ot, stride_oh, stride_lse_h,
            HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, IS_CAUSAL, HAS_LEFT, HAS_RIGHT, RETURN_LSE,
            False, False, 1, None, 0, 64, None, score, SOFTCAP, HAS_ALIBI, SINKS, False, out_scale, OUT_MAX,
            None, False, (base, n_done & 1, n_fix, q_empty), PINGPONG,
        )  # fmt: skip
        base += n_blocks
        n_done += 1
        mbarrier.wait(q_bar.index(WG), n_done & 1)  # the next tile's Q, or the end
        t = read_tile_slot(tile_slot)
    last_turn(WG, PINGPONG)


@gluon.jit
def _persistent_producer(
    Q_desc, K_desc, V_desc, Starts, Lens, n_tokens, table, rings, q_empty, tile_slot, TileCounter, sched,
    group_size, window_left, window_right, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr, HAS_LEFT: gl.constexpr,
    HAS_RIGHT: gl.constexpr, LENS_FROM_STARTS: gl.constexpr, SINKS: gl.constexpr,
):  # fmt: skip
    """The producer warp of a persistent program. It numbers ``sched[3]`` tiles: where that is below the
    tile space's size only the live ones (those holding rows; :func:`_live_tile` maps number ``u`` to its
    tile), else every tile of the space (number ``u`` is tile ``u``, a dead one skipped). Its first number
    is ``program_id(0)`` (the grid has no more programs than tiles), the later ones come from
    ``TileCounter``, offset by the programs (``prefill_runtime.gluon.next_tile``: tiles go out in
    :func:`_persistent_tile`'s order to whichever program asks first), so no atomic stands before the
    first tile's Q load; with no more numbers than programs each program runs its one tile and touches no
    counter. For each live tile it waits for ``q_empty`` (both consumers done with the last tile's Q; the
    first wait passes on the fresh barrier), writes it into ``tile_slot`` and loads its Q and blocks
    (:func:`_ws_producer`), each tile's blocks after the previous tile's in the rings. Past the last tile
    it counts the program done at once (``prefill_runtime.gluon.tiles_done``: the launch's last program
    sets the counter back to 0; those atomics overlap the consumers' last tile), then writes -1 and
    completes both Q barriers' phase without a copy."""
    q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty, _bar_f = rings
    base = gl.to_tensor(0)
    n_done = gl.to_tensor(0)
    CH: gl.constexpr = 32 * gl.num_warps()
    cursor = (n_done, n_done - CH, n_done, n_done)
    u = gl.program_id(0)
    while u < sched[3]:
        t = u
        if sched[3] < sched[0] * sched[1] * sched[2]:  # the live tiles numbered (sparse): map u to its tile
            t, cursor = _live_tile(u, cursor, table, Starts, Lens, sched, n_tokens, BLOCK_M, LENS_FROM_STARTS)
        c_head, c_m0, c_tok0, c_len = _persistent_tile(t, sched, table, Starts, Lens, n_tokens, BLOCK_M,
                                                       LENS_FROM_STARTS)  # fmt: skip
        if c_m0 < c_len:  # (a dead tile, numbered only when most tiles are live, is skipped)
            blocks = _tile_blocks(c_m0, c_len, window_left, window_right, BLOCK_M, BLOCK_N, IS_CAUSAL,
                                  HAS_LEFT, HAS_RIGHT, SINKS)  # fmt: skip
            n_blocks = blocks[1]
            mbarrier.wait(q_empty, (n_done & 1) ^ 1)
            write_tile_slot(tile_slot, t)  # (made visible by the Q barriers' arrivals below)
            _ws_producer(Q_desc, K_desc, V_desc, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready,
                         v_empty, c_tok0, c_m0, c_head, (c_head // group_size) * HEAD_DIM, blocks[0],
                         n_blocks, BLOCK_M // 2, BLOCK_N, HEAD_DIM, NUM_STAGES, base)  # fmt: skip
            base += n_blocks
            n_done += 1
        if sched[3] > gl.num_programs(0):  # (else each program runs its one tile, no counter)
            u = next_tile(TileCounter) + gl.num_programs(0)
        else:
            u = sched[3]
    if sched[3] > gl.num_programs(0):
        tiles_done(TileCounter)
    mbarrier.wait(q_empty, (n_done & 1) ^ 1)
    write_tile_slot(tile_slot, -1)
    mbarrier.arrive(q_bar.index(0), count=1)
    mbarrier.arrive(q_bar.index(1), count=1)


@gluon.jit
def _persistent_partitions(
    Q_desc, K_desc, V_desc, O, Starts, Lens, Lse, Status, Sinks, Slopes, qk_scale, tanh_scale, window_left,
    window_right, group_size, stride_ot, stride_oh, stride_lse_h, max_len, n_seqs, head_section,
    HEAD_DIM: gl.constexpr,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr,
    HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, LENS_FROM_STARTS: gl.constexpr, RETURN_LSE: gl.constexpr,
    SOFTCAP: gl.constexpr, SINKS: gl.constexpr, HAS_ALIBI: gl.constexpr, TileCounter, out_scale,
    OUT_MAX: gl.constexpr, SECTIONS: gl.constexpr,
):  # fmt: skip
    """:func:`_gluon_fwd_kernel`'s ``PERSISTENT`` form: grid ``(programs, 1, 1)`` over the launch's tile
    space (the ``n_m * n_seqs * heads`` tiles of the one-tile grid, ``n_m`` from ``max_len``;
    :func:`_persistent_tile`), the tiles taken one at a time from ``TileCounter`` (int32 ``[2]``, zero at
    the launch: ``prefill_runtime.gluon_host.tile_counter``). First each program's share of the sequences
    (``n_seqs`` of them, every ``num_programs(0)``-th) is reported into ``Status`` and has its rows past the
    grid written as 0, as the one-tile form's last query tiles do; then the one-tile form's rings plus
    ``q_empty`` (count 2: both consumers' last ``Q K^T`` of a tile done) and the tile slot, two
    :func:`_persistent_consumer` warpgroups and the :func:`_persistent_producer` warp. A row's arithmetic
    is the one-tile form's: which program computes a tile does not change its result."""
    HALF_M: gl.constexpr = BLOCK_M // 2
    heads = Q_desc.shape[1] // HEAD_DIM
    n_tokens = Q_desc.shape[0]
    n_m = gl.maximum((max_len + BLOCK_M - 1) // BLOCK_M, 1)
    grid_rows = n_m * BLOCK_M
    table = gl.allocate_shared_memory(gl.int32, [2 * SEQ_TABLE, 1], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    flags, past, live = _fill_seq_table(table, Starts, Lens, n_seqs, n_tokens, max_len, grid_rows, n_m,
                                        BLOCK_M, LENS_FROM_STARTS)  # fmt: skip
    if gl.program_id(0) == 0:
        report(Status, flags)
    if past:  # rows past the grid (max_len below a sequence's length): 0, each program its share
        for seq in range(gl.program_id(0), n_seqs, gl.num_programs(0)):
            tok0, seq_len, _moved = sequence_span(Starts, Lens, seq, n_tokens, LENS_FROM_STARTS)
            if seq_len > grid_rows:
                for h in range(heads):
                    zero_rows(O, stride_ot, stride_oh, tok0, grid_rows, seq_len, h, Lse, stride_lse_h,
                              HEAD_DIM)  # fmt: skip
    # the tiles the producers number: the live ones where they are under half the space (one long sequence
    # among short ones: the cursor's cost per tile is below the dead tiles' atomics), else the whole space
    # with its dead tiles skipped (the cursor would cost more than those few atomics)
    numbered = n_m * n_seqs
    section = head_section
    if live * 2 < numbered:
        numbered = live
        section = heads  # (the live numbering's order is one section)
    if SECTIONS:
        sched = (heads, n_m, n_seqs, numbered * heads, section)
    else:
        sched = (heads, n_m, n_seqs, numbered * heads)
    rings = allocate_rings(Q_desc, K_desc, V_desc, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES)
    q_empty = allocate_q_empty()
    tile_slot = allocate_tile_slot()
    gl.warp_specialize(
        [
            (_persistent_consumer, (
                0, O, Lse, Starts, Lens, n_tokens, table, rings, q_empty, tile_slot, sched, Sinks, Slopes,
                qk_scale, tanh_scale, window_left, window_right, stride_ot, stride_oh, stride_lse_h, HEAD_DIM,
                BLOCK_M, BLOCK_N, NUM_STAGES, IS_CAUSAL, HAS_LEFT, HAS_RIGHT, LENS_FROM_STARTS, RETURN_LSE,
                SOFTCAP, SINKS, HAS_ALIBI, out_scale, OUT_MAX,
            )),
            (_persistent_consumer, (
                1, O, Lse, Starts, Lens, n_tokens, table, rings, q_empty, tile_slot, sched, Sinks, Slopes,
                qk_scale, tanh_scale, window_left, window_right, stride_ot, stride_oh, stride_lse_h, HEAD_DIM,
                BLOCK_M, BLOCK_N, NUM_STAGES, IS_CAUSAL, HAS_LEFT, HAS_RIGHT, LENS_FROM_STARTS, RETURN_LSE,
                SOFTCAP, SINKS, HAS_ALIBI, out_scale, OUT_MAX,
            )),
            (_persistent_producer, (
                Q_desc, K_desc, V_desc, Starts, Lens, n_tokens, table, rings, q_empty, tile_slot, TileCounter,
                sched, group_size, window_left, window_right, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_STAGES,
                IS_CAUSAL, HAS_LEFT, HAS_RIGHT, LENS_FROM_STARTS, SINKS,
            )),
        ],
        [4, 1],
        [240, 24],
    )  # fmt: skip


@gluon.jit(
    do_not_specialize=["window_left", "window_right", "stride_lse_h", "max_len", "n_seqs", "head_section"]
)
def _gluon_fwd_kernel(
    Q_desc, K_desc, V_desc, O, Starts, Lens, qk_scale, window_left, window_right, group_size,
    stride_ot, stride_oh, Lse, stride_lse_h, max_len, Status, Sinks, tanh_scale, n_seqs, Slopes, OutScale,
    head_section, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    IS_CAUSAL: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, LENS_FROM_STARTS: gl.constexpr,
    RETURN_LSE: gl.constexpr, NUM_STAGES: gl.constexpr, SOFTCAP: gl.constexpr = 0, SINKS: gl.constexpr = 0,
    HAS_ALIBI: gl.constexpr = False, OUT_MAX: gl.constexpr = 0.0, PERSISTENT: gl.constexpr = False,
    SECTIONS: gl.constexpr = False, TileCounter=None,
):  # fmt: skip
    """Grid (cdiv(max_len, BLOCK_M), num_heads, batch), as the Triton kernel; launched with 4 warps: the
    default partition is consumer 0, the workers consumer 1 (4 warps) and the producer (1 warp). ``qk_scale``
    = softmax scale * log2(e) (> 0), or with ``SOFTCAP`` softcap * log2(e) and ``tanh_scale`` = softmax scale
    / softcap (else None); ``Sinks``: with ``SINKS`` (1 denominator, 2 key-0 bias), else None; ``Slopes``: the
    ALiBi slopes with ``HAS_ALIBI``, else None; ``OutScale``: an fp8 ``O``'s quantisation scale (float
    ``[1]``) with ``OUT_MAX`` (the format's largest finite value: ``O = clamp(out / scale)``), else None.
    Tensors: see the module docstring. Sequences come clamped into ``Q_desc``'s token count and reported into
    ``Status`` (None: no report) as in the Triton kernel, whose program setup this is (``program_tile``); the
    rows past the grid of a sequence longer than ``max_len`` are written as 0 by each head's program of the
    last query tile. ``n_seqs``: the batch, read by the persistent form only; ``head_section``: the query
    heads a section of the persistent order (:func:`_persistent_tile`), read with ``SECTIONS`` only (a
    persistent launch whose K/V exceed the L2 budget). ``PERSISTENT``: grid
    ``(programs, 1, 1)``, each program taking the launch's next tile from ``TileCounter`` until none is left
    (:func:`_persistent_partitions`; None in the one-tile form)."""
    if PERSISTENT:
        _persistent_partitions(
            Q_desc, K_desc, V_desc, O, Starts, Lens, Lse, Status, Sinks, Slopes, qk_scale, tanh_scale,
            window_left, window_right, group_size, stride_ot, stride_oh, stride_lse_h, max_len, n_seqs,
            head_section, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_STAGES, IS_CAUSAL, HAS_LEFT, HAS_RIGHT,
            LENS_FROM_STARTS, RETURN_LSE, SOFTCAP, SINKS, HAS_ALIBI, TileCounter,
            out_scale_of(OutScale, qk_scale, OUT_MAX), OUT_MAX, SECTIONS,
        )  # fmt: skip
        return
    # (tok0 int32)
    pid_m, head, tok0, seq_len = program_tile(Starts, Lens, Q_desc.shape[0], max_len, Status, BLOCK_M,
                                              IS_CAUSAL, LENS_FROM_STARTS, False)  # fmt: skip
    m0 = pid_m * BLOCK_M
    if m0 >= seq_len:
        return
    grid_rows = gl.num_programs(0) * BLOCK_M
    if (pid_m == gl.num_programs(0) - 1) & (seq_len > grid_rows):  # rows past the grid: 0
        zero_rows(O, stride_ot, stride_oh, tok0, grid_rows, seq_len, head, Lse, stride_lse_h, HEAD_DIM)
    n_lo, n_blocks, key_lo, key_hi, n_full_lo, n_full_hi = _tile_blocks(
        m0, seq_len, window_left, window_right, BLOCK_M, BLOCK_N, IS_CAUSAL, HAS_LEFT, HAS_RIGHT, SINKS
    )
    kv_col = (head // group_size) * HEAD_DIM
    HALF_M: gl.constexpr = BLOCK_M // 2

    q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty, bar_f = allocate_rings(
        Q_desc, K_desc, V_desc, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES
    )
    score = score_terms(qk_scale, tanh_scale, Sinks, Slopes, head, SOFTCAP, HAS_ALIBI, SINKS)
    out_scale = out_scale_of(OutScale, qk_scale, OUT_MAX)
    z = m0 * 0  # segment B is empty; A is the tile's key range
    gl.warp_specialize(
        [
            (consumer, (
                0, O, Lse, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty, bar_f, m0, tok0,
                seq_len, head, n_blocks, n_blocks, n_lo, key_lo, key_hi, z, n_full_lo, n_full_hi, z, z, z, z,
                z, z, qk_scale, window_left, window_right, stride_ot, stride_oh, stride_lse_h,
                HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, IS_CAUSAL, HAS_LEFT, HAS_RIGHT, RETURN_LSE,
                False, False, 1, None, 0, 64, None, score, SOFTCAP, HAS_ALIBI, SINKS, False, out_scale,
                OUT_MAX,
            )),
            (consumer, (
                1, O, Lse, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty, bar_f, m0, tok0,
                seq_len, head, n_blocks, n_blocks, n_lo, key_lo, key_hi, z, n_full_lo, n_full_hi, z, z, z, z,
                z, z, qk_scale, window_left, window_right, stride_ot, stride_oh, stride_lse_h,
                HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, IS_CAUSAL, HAS_LEFT, HAS_RIGHT, RETURN_LSE,
                False, False, 1, None, 0, 64, None, score, SOFTCAP, HAS_ALIBI, SINKS, False, out_scale,
                OUT_MAX,
            )),
            (_ws_producer, (
                Q_desc, K_desc, V_desc, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty,
                tok0, m0, head, kv_col, n_lo, n_blocks, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES,
            )),
        ],
        [4, 1],
        [240, 24],  # registers per thread asked for the workers (a TMA warp needs few)
    )  # fmt: skip
