"""Gluon kernel (NVIDIA Hopper, sm90): prefix prefill over an NHD or HND paged cache
(``_gluon_fwd_kernel``), warp-specialised, and the program and segment helpers it shares with the
split-cache kernel (:mod:`prefix_prefill.gluon_split_kernel`).

The same attention as :func:`prefix_prefill.kernel._fwd_kernel` for 16-bit caches and fp8 ones (e4m3fn,
e5m2; heads 64, 128 and 256: the ``CACHE_FP8`` forms, see below): query row ``r`` of a
sequence (new token ``r``, at position ``ctx_len + r``) sees every cached context key and the new tokens
``0..r`` (causal; not causal: all of them), within the window and with the score options
(:func:`_gluon_fwd_kernel`; an fp8 output among them). The structure is
window-prefill's Gluon kernel (``window_prefill.gluon_kernel``):

* **two producer warps** (:func:`_producer`, one per ring) fill two-slot K and V rings by TMA:
  a context block that lies inside one page is one copy; one that crosses pages is ``BLOCK_N / BOX``
  copies of ``BOX = gcd(page_size, BLOCK_N)`` tokens, each inside one page, at the rows
  :func:`paged_kv_offsets.gluon.page_row` computes (runs past the context read zeros, with no
  block-table read); new-token blocks come from ``k``/``v`` in one copy each;
* **two consumer warpgroups** of 64 query rows (``prefill_runtime.gluon.consumer``): segment A = the
  context (``shift = ctx_len``: every context key precedes every query), segment B = the new tokens
  (:func:`_program_segments`); with ``k = v = None`` one segment over the whole sequence in the cache.

Persistent form (``PERSISTENT``, 16-bit caches, :func:`_persistent_partitions`; the plan's choice for
narrow windows): grid ``(programs, 1, 1)`` over the live tiles (those holding rows) of the launch's ``n_m *
batch * heads`` (:func:`_persistent_tile`: the latest query tiles of every sequence first, a sequence's
heads back to back). The K producer warp takes live tile ``program_id`` first and each later one from a
counter in global memory (an atomic add; the launch's last program sets it back to 0), maps it to its
tile through the sequences' tile counts (a shared-memory table, :func:`_live_tile`), and hands it to the
V warp and the consumers through shared-memory slots; the rings' blocks count on from tile to tile and Q
is handed back after each tile's last ``Q K^T`` (``q_empty``), so the next tile's Q and first blocks load
while the consumers finish the current one.

fp8 caches (``CACHE_FP8``, :func:`_fp8_partitions`): the context's blocks land as fp8 bytes by TMA in
:func:`fp8_staging` unswizzled staging slots a ring (:func:`_fp8_producer`); a partition of 4 warps (2
at head 256: :func:`fp8_converter_warps`; :func:`_fp8_converter`) converts each exactly into the float16
K/V rings the consumers read (K as it is, V times a power of two, :func:`_v_terms`), and the consumers
fold ``k_scale`` into the context blocks' logit multiplier (or soft cap's factor) and ``v_scale`` into
their P
(``prefill_runtime.gluon.segment_terms``); the new tokens' blocks come from ``k``/``v`` as in the
16-bit forms. q is float16: a bfloat16 call runs as a float16 one
(``prefix_prefill.gluon_launch._float16_operands``), since every fp8 value is a float16 (one conversion
instruction a pair) where bfloat16 would take an integer sequence. 16 warps (consumers at 232
registers, the converter at 32, the producers at 24); at head 256, 12 (the converter's 2 at 40, one
staging slot a ring: :func:`fp8_staging`).

Cache view: ``k_cache``/``v_cache`` ``[num_blocks, page_size, num_kv_heads, head_size]`` (NHD) or
``[num_blocks, num_kv_heads, page_size, head_size]`` (HND) seen as the 2-D view of rows of
:func:`paged_kv_offsets.tma_rows` (``[rows, row_elems]``): slot ``s`` of block ``b`` and KV head ``h``
at row ``b * block_rows + h * head_rows + s``, column ``h * head_cols`` (NHD: ``head_rows = 0``; HND:
``head_cols = 0``), runtime integers, so both layouts run one compiled kernel; q, k, v as
``[total_tokens, heads * head_size]``; O by pointer (strides ``(stride_ot, stride_oh, 1)``);
``Lse`` ``[num_heads, total_q]`` float32, token stride 1. Page sizes: multiples of 8 (a box of ``BOX``
rows fills whole swizzle atoms of a ring slot, 8 rows each).

Bounds, whatever the device metadata holds (:func:`_program`, before the partitions start): rows clamped
into ``Q_desc``'s token count and cached keys to the block table's width
(:func:`prefix_prefill.sequence.sequence_geometry`), so the O/LSE stores (by pointer) and every
block-table read stay inside their tensors; the TMA boxes are bounded by their descriptors, each no
larger than its tensor (a cache's view of rows ends at its last row; a block id outside the cache
addresses rows outside the view: zeros), and the split kernel's gathers clamp block ids into the cache
(:func:`paged_kv_offsets.gluon.slot_offset`). Rows past the grid and the status report as in
:func:`prefix_prefill.kernel._fwd_kernel` (:func:`_program_guard`).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from paged_kv_offsets.gluon import bad_block_ids, next_box, page_row, page_row_at, slot_offset
from prefill_runtime.bounds import BLOCK_ID, MAX_LEN, clamp_span, report
from prefill_runtime.gluon import (
    allocate_q_empty,
    allocate_rings,
    allocate_tile_slot,
    consumer,
    drain,
    first_turn,
    last_turn,
    live_tile_number,
    load_q_halves,
    next_tile,
    out_scale_of,
    packed_tokens,
    read_tile_slot,
    score_terms,
    takes_turns,
    tiles_done,
    write_tile_slot,
)
from prefill_runtime.gluon_bounds import zero_rows
from prefix_prefill.sequence import sequence_geometry

#: a gathering producer's warps (the ``GATHER`` form's, the split kernel's)
PRODUCER_WARPS = gl.constexpr(2)
#: sequences whose query-tile counts a persistent program keeps in shared memory (4 KB); the K warp reads a
#: later sequence's from global memory as its tile cursor passes it (:func:`_chunk_live`).
SEQ_TABLE = gl.constexpr(1024)
#: the largest batch whose one-tile programs (the short-query forms; the full forms from
#: :data:`ORDER_MIN_TILES` query tiles a sequence) take their sequences longest first
#: (:func:`_longest_first`); a larger batch's programs fill the multiprocessors for several waves, where
#: the order matters less than the setup's O(batch²) compares would cost.
ORDER_SEQS = gl.constexpr(128)
#: the sequences :func:`_longest_first` compares against its candidates at once (registers a thread)
ORDER_CH = gl.constexpr(16)
#: Gluon's CTA-wide barrier: ``thread_barrier`` in Triton 3.6 (where the kernels run), ``barrier`` from 3.7
#: (where the offline compiles of tests-cpu build them)
_cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
#: a launch of the full forms (a query tile a program) takes its sequences longest first from this many
#: query tiles a sequence (``max_query_len`` past 384 rows): a program then reads enough keys that the
#: rank (an L2 round trip and a pass over shared memory) is small beside it, and a long sequence's
#: tiles starting last would leave a tail. With fewer tiles (short prompts) programs last a few
#: microseconds and most of them are tiles past their prompt, which would pay the rank before returning.
ORDER_MIN_TILES = gl.constexpr(4)
#: ... and when at least one tile in this many may hold queries (:func:`_full_form_seq`)
ORDER_LIVE_SHARE = gl.constexpr(2)


@gluon.constexpr_function
def program_heads(PAIR_HEADS, PACK):
    """The query heads a one-tile program computes: 2 paired, ``PACK`` packed, else 1."""
    return 2 if PAIR_HEADS else max(PACK, 1)


@gluon.constexpr_function
def sequence_order(IDLE_WG1, PAIR_HEADS, PACK, SKIP_DECODE):
    """How a launch's one-tile programs pick their sequence (:func:`_program_rows`): ``"rank"``, longest
    first (:func:`_longest_first`): the short-query forms (idle, paired, packed: one query tile a sequence,
    grid ``(1, heads or KV heads, batch)``); ``"launch"``, ``program_id(2)``: the same forms with
    ``SKIP_DECODE``, whose batches may be mostly decode rows left to a decode kernel: those rows' programs
    return at once, so the rank (a global round trip and a pass over the batch's lengths) would be most
    of their time, for no order they use; ``"tiles"``: the full forms, ranked when enough of the grid's tiles
    may hold queries (:func:`_full_form_seq`)."""
    if IDLE_WG1 or PAIR_HEADS or PACK:
        return "launch" if SKIP_DECODE else "rank"
    return "tiles"


@gluon.jit
def _longest_first(SeqLens, rank, n_seqs):
    """The sequence a one-tile program computes (:func:`sequence_order`, :func:`_full_form_seq`), ``rank``
    its batch coordinate (``program_id(2)``) of ``n_seqs``: the batch's sequences ordered by ``seq_lens``
    (the keys a program reads, so its work), longest first, ties by index, when ``1 < n_seqs <=
    ORDER_SEQS``; else ``rank``. The multiprocessors start programs in launch order, so the longest
    sequences start in the first wave and the short ones fill the gaps the long ones leave, instead of a
    long sequence starting last and running alone (a speculative-decoding batch of 32 sequences on 2k-8k
    keys, 8 KV heads: two ragged waves of 256 programs). Whatever ``SeqLens`` holds, the order is a total
    one (length, then index), so the ranks are a permutation of ``[0, n_seqs)`` and every sequence runs
    exactly once; which program runs a sequence never changes its rows. Each thread of the default
    partition holds one candidate sequence ``s``, whose length it loads once into the batch's table of
    lengths in shared memory (one global round trip a program, not one a :data:`ORDER_CH` sequences in
    turn), and counts the sequences ordered before it from that table, :data:`ORDER_CH` a step; the
    program takes the one whose count is ``rank``."""
    seq = rank
    if (n_seqs > 1) & (n_seqs <= ORDER_SEQS):
        NW: gl.constexpr = gl.num_warps()
        L: gl.constexpr = gl.BlockedLayout([1, ORDER_CH], [32, 1], [NW, 1], [1, 0])
        s = gl.arange(0, ORDER_SEQS, layout=gl.SliceLayout(1, L))  # [S] candidates
        len_s = gl.load(SeqLens + s, mask=s < n_seqs, other=0)  # [S]
        lens = gl.allocate_shared_memory(gl.int32, [ORDER_SEQS], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        lens.store(len_s)
        _cta_barrier()
        len_s = len_s[:, None]  # [S, 1]
        before = gl.zeros([ORDER_SEQS], gl.int32, layout=gl.SliceLayout(1, L))  # [S]
        for c in gl.static_range(ORDER_SEQS // ORDER_CH):
            if c * ORDER_CH < n_seqs:
                t = c * ORDER_CH + gl.arange(0, ORDER_CH, layout=gl.SliceLayout(0, L))  # [CH]
                len_t = lens.slice(c * ORDER_CH, ORDER_CH).load(gl.SliceLayout(0, L))[None, :]  # [1, CH]
                ahead = (len_t > len_s) | ((len_t == len_s) & (t[None, :] < s[:, None]))  # [S, CH]
                before += gl.sum((ahead & (t[None, :] < n_seqs)).to(gl.int32), 1)
        seq = gl.sum(gl.where((before == rank) & (s < n_seqs), s, 0), 0)
    return seq


@gluon.jit
def _full_form_seq(SeqLens, n_tokens, BLOCK_M: gl.constexpr):
    """The sequence a full-form program (a query tile of grid ``(n_m, heads, batch)``) computes: longest
    first (:func:`_longest_first`) from :data:`ORDER_MIN_TILES` query tiles a sequence when at least
    ``1 / ORDER_LIVE_SHARE`` of the grid's tiles may hold queries, else ``program_id(2)``. The ``n_tokens``
    queries fill at most ``n_tokens // BLOCK_M + batch`` tiles; the rest are tiles past their sequence's
    queries, which would pay the rank only to return (a batch of decodes beside two prompts: 264 tiles a
    head, at most 74 with queries)."""
    seq = gl.program_id(2)
    n_m = gl.num_programs(0)
    n_seqs = gl.num_programs(2)
    if (n_m >= ORDER_MIN_TILES) & (ORDER_LIVE_SHARE * (n_tokens // BLOCK_M + n_seqs) >= n_m * n_seqs):
        seq = _longest_first(SeqLens, seq, n_seqs)
    return seq


@gluon.jit
def _program_rows(CuSeqlensQ, SeqLens, n_tokens, n_bt_cols, num_blocks, page_size, BLOCK_M: gl.constexpr,
                  KV_FROM_CACHE: gl.constexpr, PAIR_HEADS: gl.constexpr = False, pid_m=None,
                  head=None, seq_geo=None, seq=None, PACK: gl.constexpr = 0,
                  ORDER: gl.constexpr = "tiles"):  # fmt: skip
    """``(head, seq, pid_m, q_tok0, q_len, ctx_len, need, cache_len, flags)`` of this program: grid (query
    tiles, heads, batch), the latest query tiles first (they carry the most keys); rows ``[pid_m *
    BLOCK_M, +BLOCK_M)`` of sequence ``seq``, whose new tokens start at ``q_tok0`` (int32); the lengths
    and status bits of :func:`prefix_prefill.kernel.sequence_geometry` (rows clamped into the
    ``n_tokens`` of q, cached keys into the block table's ``n_bt_cols`` columns). ``PAIR_HEADS``: grid
    (1, heads / 2, batch), ``head`` the first of the program's two heads; ``PACK`` (a KV head's ``PACK``
    query heads in one warpgroup's rows): grid (1, KV heads, batch), ``head`` the KV head's first.
    ``ORDER`` (:func:`sequence_order`): the sequences longest first (:func:`_longest_first`), in launch
    order, or by the full forms' rule (:func:`_full_form_seq`). ``pid_m``/``head`` given (a persistent
    program's tile, :func:`_persistent_tile`): that tile of sequence ``seq``, whose lengths and status
    bits ``seq_geo`` holds."""
    if pid_m is None:
        pid_m = gl.num_programs(0) - 1 - gl.program_id(0)
        if PAIR_HEADS:
            head = gl.program_id(1) * 2
        elif PACK > 0:
            head = gl.program_id(1) * PACK
        else:
            head = gl.program_id(1)
    if seq is None:
        if ORDER == "rank":
            seq = _longest_first(SeqLens, gl.program_id(2), gl.num_programs(2))
        elif ORDER == "tiles":
            seq = _full_form_seq(SeqLens, n_tokens, BLOCK_M)
        else:
            seq = gl.program_id(2)
    if seq_geo is None:
        seq_geo = _sequence(CuSeqlensQ, SeqLens, n_tokens, n_bt_cols, num_blocks, page_size, KV_FROM_CACHE,
                            seq)  # fmt: skip
    q_tok0, q_len, ctx_len, need, cache_len, flags = seq_geo
    return head, seq, pid_m, q_tok0, q_len, ctx_len, need, cache_len, flags


@gluon.jit
def _sequence(CuSeqlensQ, SeqLens, n_tokens, n_bt_cols, num_blocks, page_size, KV_FROM_CACHE: gl.constexpr,
              seq):  # fmt: skip
    """Sequence ``seq``'s ``(q_tok0, q_len, ctx_len, need, cache_len, flags)``
    (:func:`prefix_prefill.sequence.sequence_geometry`, ``q_tok0`` as int32): the one-tile program's
    (:func:`_program_rows`, which orders the batch) or a persistent program's tile's."""
    q_tok0, q_len, ctx_len, need, cache_len, flags = sequence_geometry(
        CuSeqlensQ, SeqLens, seq, n_tokens, n_bt_cols, num_blocks, page_size, KV_FROM_CACHE
    )
    return q_tok0.to(gl.int32), q_len, ctx_len, need, cache_len, flags


@gluon.jit
def _program_guard(O, Lse, Status, p_table_row, head, pid_m, q_tok0, q_len, need, flags, n_bt_cols,
                   num_blocks, page_size, max_query_len, stride_ot, stride_oh, stride_lse_h,
                   BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, IDLE_WG1: gl.constexpr,
                   PAIR_HEADS: gl.constexpr = False, n_m=None, PACK: gl.constexpr = 0):  # fmt: skip
    """Program setup of both Gluon kernels, before any program returns: head 0's program of a sequence's
    last query tile reports its malformed metadata into ``Status`` (when given: the bits of
    ``flags``, ``MAX_LEN`` for a query longer than ``max_query_len``, ``BLOCK_ID`` from a scan of the
    ``need`` cached tokens' block ids), and each head's program of the last tile writes the rows past
    the grid (a ``max_query_len`` smaller than the sequence) as 0
    (``prefill_runtime.gluon_bounds.zero_rows``). With ``IDLE_WG1`` (one tile, whose second warpgroup
    computes nothing) or ``PAIR_HEADS`` (one tile, its warpgroups on two heads, ``head`` and ``head + 1``)
    the grid covers the first ``BLOCK_M / 2`` rows; with ``PACK`` (one tile, ``PACK`` heads from ``head``
    in its first warpgroup) the first ``packed_tokens(BLOCK_M / 2, PACK)``. ``n_m``: the query tiles of a
    sequence when they are not the grid's first dimension (a persistent launch)."""
    if PACK > 0:
        COVER: gl.constexpr = packed_tokens(BLOCK_M // 2, PACK)
    elif IDLE_WG1 or PAIR_HEADS:
        COVER: gl.constexpr = BLOCK_M // 2
    else:
        COVER: gl.constexpr = BLOCK_M
    if n_m is None:
        n_m = gl.num_programs(0)
    grid_rows = n_m * COVER  # query rows the grid covers
    last = pid_m == n_m - 1
    if Status is not None:
        if (head == 0) & last:
            flags |= (q_len > max_query_len).to(gl.int32) * MAX_LEN
            flags |= bad_block_ids(p_table_row, need, n_bt_cols, num_blocks, page_size) * BLOCK_ID
            report(Status, flags)
    if last & (q_len > grid_rows):
        for h in gl.static_range(program_heads(PAIR_HEADS, PACK)):
            zero_rows(O, stride_ot, stride_oh, q_tok0, grid_rows, q_len, head + h, Lse, stride_lse_h,
                      HEAD_DIM)  # fmt: skip


@gluon.jit
def _program_segments(q_len, ctx_len, cache_len, m0, window_left, window_right, BLOCK_M: gl.constexpr,
                      BLOCK_N: gl.constexpr, KV_FROM_CACHE: gl.constexpr, HAS_LEFT: gl.constexpr = False,
                      CAUSAL: gl.constexpr = True, HAS_RIGHT: gl.constexpr = False):  # fmt: skip
    """The key segments of a tile with rows ``[m0, m1)`` as the tuple ``(n_blocks, n_a, a_base, a_lo,
    a_end, a_shift, a_full_lo, a_full, b_base, b_end, b_full_lo, b_full)``: segment A = cache positions
    ``[a_lo, a_end)`` (``a_shift = ctx_len``: row r sits at position ``ctx_len + r``; every row sees
    ``[a_full_lo, a_full)``), B = new tokens ``[0, b_end)`` (every row sees ``[b_full_lo, b_full)``);
    ``n_a`` blocks of A from ``a_base``, ``n_blocks - n_a`` of B from ``b_base`` (multiples of
    ``BLOCK_N``). With ``KV_FROM_CACHE`` the new tokens are part of A. Each segment ends after the last
    new token some row sees: ``CAUSAL``, the last row itself; not causal, the sequence's last token, or
    with ``HAS_RIGHT`` (a right window, ``window_right``) the last row's ``window_right`` later tokens;
    its unmasked blocks end where the tile's first row stops seeing keys. ``HAS_LEFT`` (a left window,
    ``window_left``): a row at position ``p_r`` sees keys from ``p_r - window_left`` on, so each segment
    starts at the block of the first key some row sees (no block before it is loaded; A's keys before
    ``a_lo`` are set to 0 in the V slots, K's are masked) and begins its unmasked blocks where every row
    sees them; without, the bases, ``a_lo`` and the lower ``full`` bounds are 0. Segment A never reaches
    past the ``cache_len`` keys the block table holds (with ``KV_FROM_CACHE``, ``n_blocks`` is then 0
    only when the table holds none of the tile's keys: malformed metadata)."""
    m1 = gl.minimum(m0 + BLOCK_M, q_len)
    # new tokens [0, seen) are seen by some row of the tile, [0, seen_all) by every row
    if CAUSAL:
        seen = m1
        seen_all = m0 + 1
    elif HAS_RIGHT:  # (window_right <= 2**30: no overflow)
        seen = gl.minimum(m1 + window_right, q_len)
        seen_all = gl.minimum(m0 + 1 + window_right, q_len)
    else:
        seen = q_len
        seen_all = q_len
    if KV_FROM_CACHE:
        a_end = gl.minimum(ctx_len + seen, cache_len)
        a_full = gl.minimum(((ctx_len + seen_all) // BLOCK_N) * BLOCK_N, a_end)
        b_end = m1 * 0
    else:
        a_end = cache_len
        a_full = gl.minimum((ctx_len // BLOCK_N) * BLOCK_N, a_end)
        b_end = seen
    if HAS_LEFT:
        a_lo = gl.minimum(gl.maximum(ctx_len + m0 - window_left, 0), a_end)  # the first key any row sees
        a_base = (a_lo // BLOCK_N) * BLOCK_N
        a_full_lo = ctx_len + m1 - 1 - window_left  # every row sees the keys from here on
        n_a = gl.where(a_lo < a_end, gl.cdiv(a_end - a_base, BLOCK_N), 0)
        if KV_FROM_CACHE:
            b_base = b_end
        else:
            b_base = (gl.maximum(m0 - window_left, 0) // BLOCK_N) * BLOCK_N
        b_full_lo = m1 - 1 - window_left
        n_blocks = n_a + gl.cdiv(b_end - b_base, BLOCK_N)
    else:
        z = m1 * 0
        a_lo, a_base, a_full_lo, b_base, b_full_lo = z, z, z, z, z
        n_a = gl.cdiv(a_end, BLOCK_N)
        n_blocks = n_a + gl.cdiv(b_end, BLOCK_N)
    b_full = (seen_all // BLOCK_N) * BLOCK_N  # <= b_end: seen_all <= seen
    return n_blocks, n_a, a_base, a_lo, a_end, ctx_len, a_full_lo, a_full, b_base, b_end, b_full_lo, b_full


@gluon.jit
def _program_options(q_len, ctx_len, cache_len, m0, head, window_left, window_right, qk_scale, tanh_scale,
                     Sinks, Slopes, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, KV_FROM_CACHE: gl.constexpr,
                     HAS_LEFT: gl.constexpr, SOFTCAP: gl.constexpr, HAS_ALIBI: gl.constexpr,
                     HAS_SINKS: gl.constexpr, CAUSAL: gl.constexpr = True,
                     HAS_RIGHT: gl.constexpr = False):  # fmt: skip
    """``(w_left, w_right, seg, score)`` of a program: the left and right windows (0 without ``HAS_LEFT``
    / ``HAS_RIGHT``), the segments of :func:`_program_segments`, and the consumers' ``score`` tuple
    (``prefill_runtime.gluon.score_terms``) of query head ``head``: soft-capping, ALiBi slopes ``Slopes``
    and sinks ``Sinks`` (an extra logit of the denominator)."""
    if HAS_LEFT:
        w_left = window_left
    else:
        w_left = m0 * 0
    if HAS_RIGHT:
        w_right = window_right
    else:
        w_right = m0 * 0
    seg = _program_segments(q_len, ctx_len, cache_len, m0, w_left, w_right, BLOCK_M, BLOCK_N, KV_FROM_CACHE,
                            HAS_LEFT, CAUSAL, HAS_RIGHT)  # fmt: skip
    score = score_terms(qk_scale, tanh_scale, Sinks, Slopes, head, SOFTCAP, HAS_ALIBI, 1 if HAS_SINKS else 0)
    return w_left, w_right, seg, score


@gluon.jit
def _program_skipped(Lse, stride_lse_h, head, q_tok0, q_len, m0, RETURN_LSE: gl.constexpr,
                     SKIP_DECODE: gl.constexpr, PAIR_HEADS: gl.constexpr = False,
                     WRITES: gl.constexpr = True, PACK: gl.constexpr = 0):  # fmt: skip
    """Whether this program has nothing to compute: its tile starts past its sequence's new tokens, or
    (``SKIP_DECODE``) the sequence has one new token, left to a decode kernel: that row's output is left as
    it is and, with ``RETURN_LSE``, its LSE is ``-inf`` (written where ``WRITES``)."""
    skip = m0 >= q_len
    if SKIP_DECODE:
        decode = (q_len == 1) & (m0 == 0)
        if RETURN_LSE and WRITES:
            for h in gl.static_range(program_heads(PAIR_HEADS, PACK)):
                gl.store(Lse + (head + h).to(gl.int64) * stride_lse_h + q_tok0, float("-inf"), mask=decode)
        skip = skip | decode
    return skip


@gluon.jit
def _program(
    O, BlockTable, CuSeqlensQ, SeqLens, Lse, Status, n_tokens, stride_bt, n_bt_cols, num_blocks, page_size,
    max_query_len, stride_ot, stride_oh, stride_lse_h, window_left, window_right, qk_scale, tanh_scale, Sinks,
    Slopes, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, KV_FROM_CACHE: gl.constexpr,
    RETURN_LSE: gl.constexpr, SKIP_DECODE: gl.constexpr, HAS_LEFT: gl.constexpr, SOFTCAP: gl.constexpr,
    HAS_ALIBI: gl.constexpr, HAS_SINKS: gl.constexpr, IDLE_WG1: gl.constexpr = False,
    PAIR_HEADS: gl.constexpr = False, CAUSAL: gl.constexpr = True, HAS_RIGHT: gl.constexpr = False,
    pid_m=None, head=None, n_m=None, WRITES: gl.constexpr = True, seq_geo=None, seq=None,
    PACK: gl.constexpr = 0,
):  # fmt: skip
    """The program setup of both Gluon kernels: its rows (:func:`_program_rows`), the report and the rows
    past the grid (:func:`_program_guard`), a decode row left alone (:func:`_program_skipped`), its
    windows, key segments and score terms (:func:`_program_options`). Returns ``(skip, head, q_tok0,
    q_len, m0, p_table_row, w_left, w_right, seg, score)``; ``skip``: the program has nothing (more) to
    do: its tile starts past the sequence, its sequence is a skipped decode row, or (``KV_FROM_CACHE``) the
    table holds no key of the tile, whose rows are then written as 0 here. ``PAIR_HEADS``: the program's
    heads are ``head`` and ``head + 1`` (``score`` is the first's). ``pid_m``, ``head``, ``n_m`` (a
    persistent program's tile, :func:`_persistent_tile`): the tile, of ``n_m`` query tiles a sequence
    (``seq``, whose geometry ``seq_geo`` holds);
    ``WRITES`` False: the setup's writes (report, rows past the grid, a skipped row's LSE, an empty
    tile's rows) are another partition's, this one only reads the tile's geometry. ``PACK``: the
    program's heads are the ``PACK`` from ``head`` (:func:`_program_rows`)."""
    head, seq, pid_m, q_tok0, q_len, ctx_len, need, cache_len, flags = _program_rows(
        CuSeqlensQ, SeqLens, n_tokens, n_bt_cols, num_blocks, page_size, BLOCK_M, KV_FROM_CACHE, PAIR_HEADS,
        pid_m, head, seq_geo, seq, PACK, sequence_order(IDLE_WG1, PAIR_HEADS, PACK, SKIP_DECODE),
    )  # fmt: skip
    p_table_row = BlockTable + seq.to(gl.int64) * stride_bt
    if WRITES:
        _program_guard(O, Lse, Status, p_table_row, head, pid_m, q_tok0, q_len, need, flags, n_bt_cols,
                       num_blocks, page_size, max_query_len, stride_ot, stride_oh, stride_lse_h, BLOCK_M,
                       HEAD_DIM, IDLE_WG1, PAIR_HEADS, n_m, PACK)  # fmt: skip
    m0 = pid_m * BLOCK_M
    skip = _program_skipped(Lse, stride_lse_h, head, q_tok0, q_len, m0, RETURN_LSE, SKIP_DECODE, PAIR_HEADS,
                            WRITES, PACK)  # fmt: skip
    w_left, w_right, seg, score = _program_options(
        q_len, ctx_len, cache_len, m0, head, window_left, window_right, qk_scale, tanh_scale, Sinks, Slopes,
        BLOCK_M, BLOCK_N, KV_FROM_CACHE, HAS_LEFT, SOFTCAP, HAS_ALIBI, HAS_SINKS, CAUSAL, HAS_RIGHT,
    )  # fmt: skip
    if KV_FROM_CACHE:
        empty = (seg[0] == 0) & (m0 < q_len) & (skip == 0)
        if WRITES:
            if empty:  # the table holds no key of the tile (malformed metadata): its rows are 0
                for h in gl.static_range(program_heads(PAIR_HEADS, PACK)):
                    zero_rows(O, stride_ot, stride_oh, q_tok0, m0, gl.minimum(m0 + BLOCK_M, q_len), head + h,
                              Lse, stride_lse_h, HEAD_DIM)  # fmt: skip
        skip = skip | empty
    return skip, head, q_tok0, q_len, m0, p_table_row, w_left, w_right, seg, score


@gluon.jit
def _prefix_consumer(
    WG: gl.constexpr, O, Lse, rings, tile, stride_lse_h, HALF_M: gl.constexpr, BLOCK_N: gl.constexpr,
    HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr, RETURN_LSE: gl.constexpr, SPLIT: gl.constexpr,
    WARPGROUPS: gl.constexpr, K_VIEW: gl.constexpr, K_COLS: gl.constexpr = 64, V_ROWS: gl.constexpr = None,
    HAS_LEFT: gl.constexpr = False, SOFTCAP: gl.constexpr = 0, HAS_ALIBI: gl.constexpr = False,
    HAS_SINKS: gl.constexpr = False, IDLE: gl.constexpr = False, PAIRED: gl.constexpr = False,
    CAUSAL: gl.constexpr = True, HAS_RIGHT: gl.constexpr = False, OUT_MAX: gl.constexpr = 0.0,
    terms=None, FP8_KV: gl.constexpr = False, ring=None, PINGPONG: gl.constexpr = False,
    GATHERED: gl.constexpr = False, PACK: gl.constexpr = 0, Sinks=None,
):  # fmt: skip
    """``prefill_runtime.gluon.consumer`` with prefix-prefill's two key segments: A = the cached context
    (``shift = ctx_len``: every context key precedes every query; with the new tokens in the cache, the
    whole sequence), B = the new tokens (``CAUSAL``, or not; ``HAS_RIGHT``: a right window). ``rings``:
    the nine values of ``allocate_rings``; ``tile``: ``(m0, q_tok0, q_len, head, seg, qk_scale, score,
    window_left, window_right, stride_ot, stride_oh, out_scale)`` (``seg``, ``score``, the windows:
    :func:`_program_options`'; ``out_scale``: ``prefill_runtime.gluon.out_scale_of``'s).
    ``SPLIT``: the split kernel's V slots (``[D, BLOCK_N]``, filled by ``cp.async``); ``WARPGROUPS``,
    ``K_VIEW``, ``K_COLS``, ``V_ROWS``: see the consumer; ``HAS_LEFT`` (the left window),
    ``SOFTCAP``, ``HAS_ALIBI``, ``HAS_SINKS``: the consumer's window term and score options; ``IDLE``: a
    second warpgroup whose rows no query reaches, which runs ``prefill_runtime.gluon.drain`` instead;
    ``PAIRED``: the consumer's (two warpgroups on the same rows of two heads, ``tile`` giving each its head
    and score); ``OUT_MAX``: the consumer's fp8 output (0: O in q's dtype); ``FP8_KV``, ``terms``: the
    consumer's (segment A from an fp8 cache: ``tile``'s ``qk_scale`` and ``score`` are A's); ``ring``: the
    consumer's (a persistent program's tile: the V-row handshake count after it is returned);
    ``GATHERED``: the ``GATHER`` form's rings (key rows filled by ``cp.async``: a proxy fence after each
    wait, as the split kernel's); ``PACK``, ``Sinks``: the consumer's (``PACK`` heads from ``tile``'s in its
    rows, their sinks from ``Sinks``)."""
    q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty, bar_f = rings
    m0, q_tok0, q_len, head, seg, qk_scale, score, window_left, window_right, st_o, sh_o, out_scale = tile
    n_blocks, n_a, a_base, a_lo, a_end, a_shift, a_full_lo, a_full, b_base, b_end, b_full_lo, b_full = seg
    z = m0 * 0
    # slots filled by cp.async (the split kernel's gathers, the GATHER form's) need a proxy fence after each
    # wait; an fp8
    # cache's rings are filled by the converter (which fences its stores) and by TMA
    CP_FILL: gl.constexpr = (SPLIT and not FP8_KV) or GATHERED
    if IDLE:
        drain(k_ready, k_empty, v_ready, v_empty, v_smem, bar_f, n_blocks, n_a, a_base, a_lo, a_end,
              a_full_lo, a_full, b_base, z, b_end, b_full_lo, b_full, a_shift, z, WG, BLOCK_N, NUM_STAGES,
              NUM_STAGES, SPLIT, CP_FILL, V_ROWS)  # fmt: skip
    else:
        n_fix = consumer(
            WG, O, Lse, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty, bar_f, m0,
            q_tok0, q_len, head, n_blocks, n_a, a_base, a_lo, a_end, a_shift, a_full_lo, a_full, b_base, z,
            b_end, z, b_full_lo, b_full, qk_scale, window_left, window_right, st_o, sh_o, stride_lse_h,
            HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, CAUSAL, HAS_LEFT, HAS_RIGHT, RETURN_LSE, SPLIT, CP_FILL,
            WARPGROUPS, K_VIEW, 0,
            K_COLS, V_ROWS, score, SOFTCAP, 2 if HAS_ALIBI else 0, 1 if HAS_SINKS else 0, PAIRED, out_scale,
            OUT_MAX,
            terms, FP8_KV, ring, PINGPONG, PACK, Sinks,
        )  # fmt: skip
        if ring is not None:  # (a one-tile consumer returns nothing)
            return n_fix


@gluon.jit
def _claim_slot(empty, ready, smem, r, NUM_STAGES: gl.constexpr):
    """A producer's ring slot for the ring's block ``r``: waits until the consumers have released the
    slot's previous round (a fresh barrier passes round 0); returns ``(ready barrier, slot buffer)``."""
    slot = r % NUM_STAGES
    mbarrier.wait(empty.index(slot), ((r // NUM_STAGES) & 1) ^ 1)
    return ready.index(slot), smem.index(slot)


@gluon.jit
def _producer(
    KV: gl.constexpr, args, HALF_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
    NUM_STAGES: gl.constexpr, BOX: gl.constexpr, PAIRED: gl.constexpr = False, ring=None,
    PACK: gl.constexpr = 0,
):  # fmt: skip
    """One warp filling one ring: K (``KV == 0``, which also loads the two Q halves; ``PAIRED``: the same
    rows of heads ``head`` and ``head + 1``; ``PACK``: the first half only, the rows of ``PACK`` heads from
    ``head``, ``prefill_runtime.gluon.load_q_halves``) or V. ``args``:
    ``(Q_desc, N_desc, C_desc, CB_desc, q_smem, smem, q_bar, ready, empty, p_table_row, page_size,
    oob_row, block_rows, c_row, c_col, q_tok0, n_tok0, m0, head, kv_col, n_a, a_base, a_end, n_blocks)``
    (``c_row``/``c_col``: the KV head's row and column in the caches' view of rows, ``kv_col``: its
    column in the new tokens' rows). Block ``j`` goes to slot ``j % NUM_STAGES`` once both consumers
    released it. Blocks ``j < n_a``: context positions ``[a_base
    + j * BLOCK_N, +BLOCK_N)`` of the cache (``a_end`` = the segment's end): one copy through ``CB_desc``
    (block [BLOCK_N, D]) when they lie in one page, else ``BLOCK_N / BOX`` copies through ``C_desc``
    (block [BOX, D]), one per page run, at the rows :func:`paged_kv_offsets.gluon.page_row` computes.
    The rest: new tokens through ``N_desc`` from row ``n_tok0``. ``ring`` (a persistent program's tile):
    ``(base, q_phase, q_empty)``: block ``j`` is the ring's block ``base + j`` (its slot and round), and
    Q (tile ``q_phase``'s parity) loads once both consumers released the previous tile's (``q_empty``)."""
    (Q_desc, N_desc, C_desc, CB_desc, q_smem, smem, q_bar, ready, empty, p_table_row, page_size, oob_row,
     block_rows, c_row, c_col, q_tok0, n_tok0, m0, head, kv_col, n_a, a_base, a_end,
     n_blocks) = args  # fmt: skip
    kv_bytes: gl.constexpr = BLOCK_N * HEAD_DIM * 2
    if ring is None:
        base = 0
    else:
        base, q_phase, q_empty = ring
    if KV == 0:
        if ring is not None:  # (the first tile's wait passes on the fresh barrier)
            mbarrier.wait(q_empty, q_phase ^ 1)
        load_q_halves(Q_desc, q_smem, q_bar, q_tok0 + m0, head * HEAD_DIM, HALF_M, HEAD_DIM, PAIRED, PACK)
    for j in range(n_blocks):
        bar, buf = _claim_slot(empty, ready, smem, base + j, NUM_STAGES)  # (the ring's block base + j)
        mbarrier.expect(bar, kv_bytes)
        if j < n_a:
            _context_copy(C_desc, CB_desc, bar, buf, p_table_row, a_base + j * BLOCK_N, a_end, page_size,
                          oob_row, block_rows, c_row, c_col, BLOCK_N, BOX)  # fmt: skip
        else:
            tma.async_copy_global_to_shared(N_desc, [n_tok0 + (j - n_a) * BLOCK_N, kv_col], bar, buf)


@gluon.constexpr_function
def producer_regs(BLOCK_N, BOX, PERSISTENT=False):
    """The registers of a TMA producer warp (:func:`_producer`, :func:`_fp8_producer`,
    :func:`_persistent_producer` with ``PERSISTENT``): 24, and more where ptxas keeps a block's unrolled
    block-id loads live together: 40 where a context block that crosses pages takes more than 8 boxes
    (``BLOCK_N / BOX`` of 16: pages of 8 tokens, or of an odd multiple of 8, at key blocks of 128), and
    the persistent form's producer 56 at every box of 8 rows (offline, sm90, Triton 3.6: head 128 208
    bytes of spill at 24 registers, 16 at 32, none at 40; the persistent form's 468 at 24, 100 at 40, 32
    at 56, where its page-16 form has 16; at head 256, 8 boxes a block, 564 bytes at 24, at 56 as its
    page-16 form)."""
    if PERSISTENT:
        return 56 if BOX < 16 else 24
    return 40 if BLOCK_N // BOX > 8 else 24


@gluon.constexpr_function
def consumer_regs(BLOCK_N, BOX, regs, PERSISTENT=False):
    """The registers of the consumer partition beside two :func:`producer_regs` warps: ``regs``, less 16
    beside 40-register producers and 24 beside 56-register ones (the register file they share)."""
    return regs - {24: 0, 40: 16, 56: 24}[producer_regs(BLOCK_N, BOX, PERSISTENT)]


@gluon.jit
def _producer_args(descs, q_smem, smem, q_bar, ready, empty, p_table_row, geo, q_tok0, m0, head, seg,
                   HEAD_DIM: gl.constexpr):  # fmt: skip
    """:func:`_producer`'s ``args`` for one ring of the tile at rows ``m0`` of query head ``head``:
    ``descs = (Q_desc, N_desc, C_desc, CB_desc)``, ``geo = (group_size, page_size, oob_row, block_rows,
    head_rows, head_cols)`` (the caches' views of rows), ``seg`` :func:`_program_segments`' tuple."""
    Q_desc, N_desc, C_desc, CB_desc = descs
    group_size, page_size, oob_row, block_rows, head_rows, head_cols = geo
    kv_head = head // group_size
    # the KV head's row and column in the caches' views, its column in the new tokens' rows; the first new
    # token a block of segment B holds
    return (Q_desc, N_desc, C_desc, CB_desc, q_smem, smem, q_bar, ready, empty, p_table_row, page_size,
            oob_row, block_rows, kv_head * head_rows, kv_head * head_cols, q_tok0, q_tok0 + seg[8], m0, head,
            kv_head * HEAD_DIM, seg[1], seg[2], seg[4], seg[0])  # fmt: skip


@gluon.jit
def _context_copy(C_desc, CB_desc, bar, buf, p_table_row, pos0, a_end, page_size, oob_row, block_rows, c_row,
                  c_col, BLOCK_N: gl.constexpr, BOX: gl.constexpr):  # fmt: skip
    """The TMA copies of the context block at cache position ``pos0`` into ``buf`` (``[BLOCK_N, D]``),
    announced on ``bar``: one copy through ``CB_desc`` when the block lies in one page, else ``BLOCK_N /
    BOX`` copies through ``C_desc``, one per page run (:func:`_producer`)."""
    if BOX == BLOCK_N:  # pages are multiples of the block: every block lies inside one page
        row = page_row(p_table_row, pos0, a_end, page_size, oob_row, block_rows, c_row)
        tma.async_copy_global_to_shared(CB_desc, [row, c_col], bar, buf)
    else:
        page = pos0 // page_size  # (one division a block; the boxes walk the pages from here)
        slot = pos0 - page * page_size
        if slot + BLOCK_N <= page_size:  # inside one page
            row = page_row_at(p_table_row, page, slot, pos0, a_end, oob_row, block_rows, c_row)
            tma.async_copy_global_to_shared(CB_desc, [row, c_col], bar, buf)
        else:
            for i in gl.static_range(BLOCK_N // BOX):
                row = page_row_at(p_table_row, page, slot, pos0 + i * BOX, a_end, oob_row, block_rows, c_row)
                tma.async_copy_global_to_shared(C_desc, [row, c_col], bar, buf.slice(i * BOX, BOX))
                page, slot = next_box(page, slot, page_size, BOX)


@gluon.constexpr_function
def _x_of(dtype):
    """Elements of a 16-byte copy of ``dtype`` (vLLM's split K cache's ``x``): 8 (16-bit), 16 (fp8)."""
    return 128 // dtype.primitive_bitwidth


@gluon.constexpr_function
def _k_threads_along_features(head_dim, x):
    """A K gather's threads along a key's features: one thread a key row (at most 16 copies a thread a
    step) up to ``16 * x`` features, more beyond."""
    return max(head_dim // (16 * x), 1)


@gluon.jit
def _gather_rows(Cache, buf, p_table_row, pos0, seq_end, page_size, c_block, c_group, head_off, max_block,
                 BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, SUB: gl.constexpr, c_slot=None):  # fmt: skip
    """Context keys ``[pos0, +BLOCK_N)`` of one KV head (``head_off``) into ``buf`` ``[BLOCK_N, D]`` by
    ``cp.async``, ``SUB`` keys per step, one 16-byte copy a key's ``x`` features (``x = 16 / element
    bytes``: 8 for a 16-bit cache, 16 for an fp8 one); keys ``>= seq_end`` are zero-filled and read no
    block-table entry; block ids clamped to ``[0, max_block]``. vLLM's split K cache: slots of ``x``
    elements, a key's feature groups ``c_group`` apart; ``c_slot`` given (an NHD/HND cache's K or V, the
    ``GATHER`` form): slots ``c_slot`` apart, a key's features contiguous (``c_group`` not read)."""
    X: gl.constexpr = _x_of(Cache.dtype.element_ty)
    TPD: gl.constexpr = _k_threads_along_features(HEAD_DIM, X)
    PW: gl.constexpr = gl.num_warps()
    WK: gl.constexpr = PW if TPD == 1 else 1  # warps along the keys (one thread a key row), else the features
    L: gl.constexpr = gl.BlockedLayout([1, X], [32 // TPD, TPD], [WK, PW // WK], [1, 0])  # x features each
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, L))  # [D]
    if c_slot is None:  # (a split K slot: x elements)
        col = (offs_d // X) * c_group.to(gl.int32) + offs_d % X  # [D] int32 (the host checks the range)
        slot_stride = X
    else:
        col = offs_d  # [D]
        slot_stride = c_slot
    for i in gl.static_range(BLOCK_N // SUB):
        pos = pos0 + i * SUB + gl.arange(0, SUB, layout=gl.SliceLayout(1, L))  # [SUB] key positions
        row = slot_offset(p_table_row, pos, seq_end, page_size, c_block, slot_stride, max_block) + head_off
        off = gl.max_contiguous(gl.multiple_of(row[:, None] + col[None, :], [1, X]), [1, X])  # [SUB, D]
        ok = (pos < seq_end)[:, None]  # [SUB, 1]
        async_copy.async_copy_global_to_shared(buf.slice(i * SUB, SUB), Cache + off, mask=ok)


@gluon.jit
def _publish_gathers(bar):
    """A gathering thread's arrival on a slot's ready barrier once its own ``cp.async`` copies have landed
    (``cp.async.mbarrier.arrive.noinc``: the barrier counts one arrival per producer thread); the
    consumers' wait on that barrier then orders the copies before their reads. (Triton 3.6's ConSan does
    not model this completion path and reports the copies as pending: triton-lang/triton#11626;
    ``bench/sanitize_gluon.py --modeled-arrivals`` checks the protocol with the copies completed by
    ``wait_group`` instead.)"""
    async_copy.mbarrier_arrive(bar, increment_count=False)


@gluon.jit
def _gather_producer(
    KV: gl.constexpr, args, gather, HALF_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
    NUM_STAGES: gl.constexpr, PAIRED: gl.constexpr = False,
):  # fmt: skip
    """The ``GATHER`` form's partition filling one ring (:data:`PRODUCER_WARPS` warps): K (``KV == 0``,
    which also loads the two Q halves; ``PAIRED`` as :func:`_producer`'s) or V. ``args`` as
    :func:`_producer`'s; ``gather``: ``(Cache, c_block, c_slot, head_off, max_block)``, the cache's
    pointer, its block and slot strides and the KV head's offset (elements), and its last block id.
    Context blocks ``j < n_a`` by ``cp.async`` gathers of whole key rows (:func:`_gather_rows`: any page
    size), each thread then arriving on the slot's ready barrier (one count a thread) when its copies
    land; new-token blocks by one TMA copy (one expect-tx arrival and the rest in one)."""
    (Q_desc, N_desc, _, _, q_smem, smem, q_bar, ready, empty, p_table_row, page_size, _, _, _, _, q_tok0,
     n_tok0, m0, head, kv_col, n_a, a_base, a_end, n_blocks) = args  # fmt: skip
    Cache, c_block, c_slot, head_off, max_block = gather
    TPD: gl.constexpr = _k_threads_along_features(HEAD_DIM, _x_of(Cache.dtype.element_ty))
    SUB: gl.constexpr = 32 * gl.num_warps() if TPD == 1 else 32 // TPD  # keys a gather step
    kv_bytes: gl.constexpr = BLOCK_N * HEAD_DIM * 2
    if KV == 0:
        load_q_halves(Q_desc, q_smem, q_bar, q_tok0 + m0, head * HEAD_DIM, HALF_M, HEAD_DIM, PAIRED)
    for j in range(n_blocks):
        bar, buf = _claim_slot(empty, ready, smem, j, NUM_STAGES)
        if j < n_a:
            _gather_rows(Cache, buf, p_table_row, a_base + j * BLOCK_N, a_end, page_size, c_block, None,
                         head_off, max_block, BLOCK_N, HEAD_DIM, SUB, c_slot)  # fmt: skip
            _publish_gathers(bar)
        else:
            mbarrier.expect(bar, kv_bytes)
            mbarrier.arrive(bar, count=32 * gl.num_warps() - 1)
            tma.async_copy_global_to_shared(N_desc, [n_tok0 + (j - n_a) * BLOCK_N, kv_col], bar, buf)


@gluon.constexpr_function
def fp8_staging(HEAD_DIM):
    """fp8 caches: the staging slots a ring has for the fp8 context blocks (:func:`_fp8_producer`): 2, and
    1 at head 256, where the float16 Q tile and rings take 192 KB of shared memory and two slots a ring
    (64 KB) would pass the multiprocessor's 227 KB."""
    return 1 if HEAD_DIM > 128 else 2


@gluon.constexpr_function
def fp8_converter_warps(HEAD_DIM):
    """fp8 caches: the warps of :func:`_fp8_converter`: 4, and 2 at head 256, where a 16-warp kernel caps
    each thread at 128 registers under ptxas's ceiling for the launch, fewer than the consumer's
    ``[64, 256]`` float32 accumulator and its wgmma take (ptxas C7602); 12 warps leave 170."""
    return 2 if HEAD_DIM > 128 else 4


@gluon.constexpr_function
def fp8_converter_regs(HEAD_DIM):
    """fp8 caches: :func:`_fp8_converter`'s registers a thread: 32 (16 elements a pass, one pass's load
    ahead), 40 at head 256 (32 elements a pass, see :func:`_fp8_convert_block`; 12 warps: the consumers'
    256 threads at 232, the converter's 64 at 40 and the producers' 64 at 24 take 63,488 of 65,536; ptxas
    spills more of the partitions' values at 48-64, 12 bytes at 40)."""
    return 40 if HEAD_DIM > 128 else 32


@gluon.jit
def _fp8_producer(
    KV: gl.constexpr, args, stage_args, HALF_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
    NUM_STAGES: gl.constexpr, BOX: gl.constexpr, PAIRED: gl.constexpr = False, NEW: gl.constexpr = True,
    PACK: gl.constexpr = 0,
):  # fmt: skip
    """:func:`_producer` over an fp8 cache: one warp filling ring ``KV`` (``args``, ``PAIRED`` and ``PACK``
    as there). Context
    blocks ``j < n_a`` land as fp8 bytes in staging slot ``j % fp8_staging(D)`` of ``stage_args = (stage,
    st_ready, st_empty)`` once :func:`_fp8_converter` released it (it converts them into the ring); the
    new tokens' blocks go to the ring as :func:`_producer` fills it, after the converter's last context
    block (:func:`_fp8_new_blocks` says why). ``NEW`` False
    (the new tokens in the cache: every block is a context block) leaves the new-token part out (its
    descriptor is then the fp8 cache's)."""
    (Q_desc, N_desc, C_desc, CB_desc, q_smem, smem, q_bar, ready, empty, p_table_row, page_size, oob_row,
     block_rows, c_row, c_col, q_tok0, n_tok0, m0, head, kv_col, n_a, a_base, a_end,
     n_blocks) = args  # fmt: skip
    stage, st_ready, st_empty = stage_args
    STAGING: gl.constexpr = fp8_staging(HEAD_DIM)
    if KV == 0:
        load_q_halves(Q_desc, q_smem, q_bar, q_tok0 + m0, head * HEAD_DIM, HALF_M, HEAD_DIM, PAIRED, PACK)
    for j in range(n_a):
        bar, buf = _claim_slot(st_empty, st_ready, stage, j, STAGING)
        mbarrier.expect(bar, BLOCK_N * HEAD_DIM)  # (one byte an element)
        _context_copy(C_desc, CB_desc, bar, buf, p_table_row, a_base + j * BLOCK_N, a_end,
                      page_size, oob_row, block_rows, c_row, c_col, BLOCK_N, BOX)  # fmt: skip
    if NEW:
        _fp8_new_blocks(N_desc, smem, ready, empty, st_empty, n_tok0, kv_col, n_a, n_blocks, BLOCK_N,
                        HEAD_DIM, NUM_STAGES)  # fmt: skip


@gluon.jit
def _fp8_new_blocks(N_desc, smem, ready, empty, st_empty, n_tok0, col, n_a, n_blocks,
                    BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr,
                    AS_ROWS: gl.constexpr = False):  # fmt: skip
    """An fp8 form's producer's new-token blocks ``j`` in ``[n_a, n_blocks)``: each ``[BLOCK_N, D]`` box of
    ``N_desc`` (rows from ``n_tok0 + (j - n_a) * BLOCK_N``, column ``col``) into ring slot ``j %
    NUM_STAGES`` once both consumers released it (``AS_ROWS``: the slot seen in ``N_desc``'s layout, the
    split kernel's V ring), announced on its ready barrier by expect-tx. First the wait for the converter's
    last context block (on its staging slot's ``st_empty``): running ahead of the converter by its staging
    slots, the ring wait would otherwise look at the ring's empty barrier two rounds ahead of the
    converter's fills, where an mbarrier parity wait passes at once (the converter's own ring waits, block
    after block, keep that block's round the one the wait sees)."""
    STAGING: gl.constexpr = fp8_staging(HEAD_DIM)
    if (n_a > 0) & (n_blocks > n_a):
        last = n_a - 1
        mbarrier.wait(st_empty.index(last % STAGING), (last // STAGING) & 1)
    if AS_ROWS:
        ring = smem._reinterpret(smem.dtype, [smem.shape[0], BLOCK_N, HEAD_DIM], N_desc.layout)
    else:
        ring = smem
    for j in range(n_a, n_blocks):
        slot = j % NUM_STAGES
        mbarrier.wait(empty.index(slot), ((j // NUM_STAGES) & 1) ^ 1)
        bar = ready.index(slot)
        mbarrier.expect(bar, BLOCK_N * HEAD_DIM * 2)
        tma.async_copy_global_to_shared(N_desc, [n_tok0 + (j - n_a) * BLOCK_N, col], bar, ring.index(slot))


@gluon.constexpr_function
def _fp8_pass_layout(HEAD_DIM, WARPS):
    """The converter's register layout of one pass: 8 contiguous features a thread (an 8-byte fp8 load,
    a 16-byte ring store), ``D / 8`` threads along a row (at most 32), ``WARPS`` warps: a half warp's
    loads read 128 contiguous staging bytes (one wavefront, no bank conflict, where rows 128 bytes apart
    would fall on the same banks) and a quarter warp's stores fall on 8 distinct 16-byte chunks of a
    128-byte swizzled line."""
    along = min(HEAD_DIM // 8, 32)
    return gl.BlockedLayout([1, 8], [32 // along, along], [WARPS, 1], [1, 0])


@gluon.jit
def _fp8_convert_block(stage, st_ready, st_phase, st_empty, ring, r_empty, r_phase, r_ready, mul,
                       SHIFT: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                       WARPS: gl.constexpr):  # fmt: skip
    """One fp8 block from staging slot ``stage`` (landed: ``st_ready`` at ``st_phase``) into float16 ring
    slot ``ring`` (released: ``r_empty`` at ``r_phase``), exactly (every e4m3 and e5m2 value is a
    float16), times ``mul`` (a power of two, float16) with ``SHIFT``; then the ring slot announced on
    ``r_ready`` (after a proxy fence: wgmma reads it) and the staging slot released on ``st_empty``.
    Slots ``[BLOCK_N, HEAD_DIM]`` (rows, columns: the split kernel's V slots pass ``[D, BLOCK_N]``), by
    ``WARPS`` warps in passes of ``512 * WARPS / HEAD_DIM`` rows (16 elements a thread), at least 8: a
    ring slot's 128-byte swizzle repeats every 8 rows, and a pass stores whole repeats."""
    ROWS: gl.constexpr = max(512 * WARPS // HEAD_DIM, 8)
    layout: gl.constexpr = _fp8_pass_layout(HEAD_DIM, WARPS)
    PASSES: gl.constexpr = BLOCK_N // ROWS
    mbarrier.wait(st_ready, st_phase)
    b_x = stage.slice(0, ROWS).load(layout)  # [ROWS, D] fp8
    mbarrier.wait(r_empty, r_phase)
    for i in gl.static_range(PASSES):
        # the next pass's load is issued before this pass's store: ptxas keeps a shared load after a
        # shared store it cannot tell apart, so without it every pass waits out a load's latency
        if i + 1 < PASSES:
            b_next = stage.slice((i + 1) * ROWS, ROWS).load(layout)  # [ROWS, D] fp8
        b_y = b_x.to(gl.float16)  # [ROWS, D]
        if SHIFT:
            b_y = b_y * mul  # [ROWS, D] exact: the shift keeps every value a normal or subnormal float16
        ring.slice(i * ROWS, ROWS).store(b_y)
        if i + 1 < PASSES:
            b_x = b_next
    fence_async_shared()
    mbarrier.arrive(r_ready, count=1)
    mbarrier.arrive(st_empty, count=1)


@gluon.jit
def _fp8_converter(args, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr,
                   V_T: gl.constexpr = False):  # fmt: skip
    """The partition of the fp8 forms (:func:`fp8_converter_warps` warps): the ``n_a`` context blocks, K
    then V, each from its staging
    slot (filled by :func:`_fp8_producer`, or the split kernel's gathering producers) into its ring slot
    (block ``j``: slot ``j % NUM_STAGES``, once both consumers released it), as :func:`_fp8_convert_block`
    does. K converts unscaled (``k_scale`` is folded into the consumers' logit multiplier); V times
    ``v_mul = 2**-c`` (see :func:`_v_terms`). ``V_T``: V's staging and ring slots are ``[D, BLOCK_N]``
    (the split kernel's), converted as such. ``args``: ``(k_stage, v_stage, ks_ready, ks_empty, vs_ready,
    vs_empty, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, n_a, v_mul)``."""
    V_ROWS: gl.constexpr = HEAD_DIM if V_T else BLOCK_N  # a V slot's rows and columns
    V_COLS: gl.constexpr = BLOCK_N if V_T else HEAD_DIM
    (k_stage, v_stage, ks_ready, ks_empty, vs_ready, vs_empty, k_smem, v_smem, k_ready, k_empty, v_ready,
     v_empty, n_a, v_mul) = args  # fmt: skip
    STAGING: gl.constexpr = fp8_staging(HEAD_DIM)
    WARPS: gl.constexpr = fp8_converter_warps(HEAD_DIM)
    for j in range(n_a):
        st = j % STAGING
        st_phase = (j // STAGING) & 1
        slot = j % NUM_STAGES
        r_phase = ((j // NUM_STAGES) & 1) ^ 1  # a fresh barrier passes round 0
        _fp8_convert_block(k_stage.index(st), ks_ready.index(st), st_phase, ks_empty.index(st),
                           k_smem.index(slot), k_empty.index(slot), r_phase, k_ready.index(slot), v_mul,
                           False, BLOCK_N, HEAD_DIM, WARPS)  # fmt: skip
        _fp8_convert_block(v_stage.index(st), vs_ready.index(st), st_phase, vs_empty.index(st),
                           v_smem.index(slot), v_empty.index(slot), r_phase, v_ready.index(slot), v_mul,
                           True, V_ROWS, V_COLS, WARPS)  # fmt: skip


@gluon.jit
def _v_terms(VScale, C_LO: gl.constexpr, C_HI: gl.constexpr):
    """``(v_mul, p_log2, l_mul)`` of an fp8 V cache with scale ``VScale[0]``: the float16 ring holds ``V *
    v_mul`` and the consumers' P carries ``v_eff = v_scale / v_mul`` (``p_log2 = log2(v_eff)``, ``l_mul = 1
    / v_eff``; ``prefill_runtime.gluon.segment_terms``), with ``v_mul = 2**-c``, ``c = round(-log2
    v_scale)`` clamped to ``[C_LO, C_HI]`` (where every value of the fp8 format times ``2**-c`` is a
    finite float16, no subnormal of it lost), so P stays near [0, 1]: float16's precision for a small
    ``v_scale``, no overflow for a large one. ``v_mul`` is float16 (the converter multiplies in the
    ring's type). A float16 P holds ``v_eff`` at most: a ``v_scale`` past float16's range times
    ``2**C_LO`` (e4m3: 8.4e6, e5m2: 65504) overflows it, far past any dequantisation scale of those
    formats' values."""
    v_s = gl.load(VScale).to(gl.float32)
    c = gl.minimum(gl.maximum(gl.floor(0.5 - gl.log2(v_s)), C_LO), C_HI).to(gl.int32)
    v_mul = ((127 - c) << 23).to(gl.float32, bitcast=True)  # 2**-c, exact
    v_eff = v_s * ((127 + c) << 23).to(gl.float32, bitcast=True)  # v_scale * 2**c
    return v_mul.to(gl.float16), gl.log2(v_eff), 1.0 / v_eff


@gluon.jit
def _tiles(m0, q_tok0, q_len, head, seg, qk_scale, tanh_scale, score, Sinks, Slopes, w_left, w_right,
           stride_ot, stride_oh, out_scale, KScale, VScale, SOFTCAP: gl.constexpr, HAS_ALIBI: gl.constexpr,
           HAS_SINKS: gl.constexpr, PAIR_HEADS: gl.constexpr, CACHE_FP8: gl.constexpr,
           E5M2: gl.constexpr):  # fmt: skip
    """The consumers' ``(tile, tile1, terms, terms1, v_mul)`` (``tile``: :func:`_prefix_consumer`'s; ``tile1``
    the second warpgroup's: with ``PAIR_HEADS`` the next head's, with its score terms). ``CACHE_FP8`` (an
    e4m3fn cache, or e5m2 with ``E5M2``): ``k_scale`` (``KScale[0]``) folds into segment A's logit
    multiplier (soft-capping: into the tanh's argument; the capped logit's multiplier stays), whose score
    terms the tiles then carry; ``terms`` ``(qk_scale, score, p_log2, l_mul)`` keeps segment B's and V's
    scaling (:func:`_v_terms`, ``v_mul`` the converter's V factor). Without it ``terms``, ``terms1`` and
    ``v_mul`` are ``qk_scale``, placeholders never read (a returned value cannot be None)."""
    qk_a = qk_scale  # segment A's logit multiplier, tanh factor and score terms (an fp8 cache: k_scale)
    tanh_a = tanh_scale
    score_a = score
    terms = qk_scale
    v_mul = qk_scale
    if CACHE_FP8:
        k_s = gl.load(KScale).to(gl.float32)
        if SOFTCAP > 0:  # k_scale scales the tanh argument; the capped logit's multiplier stays
            tanh_a = tanh_scale * k_s
        else:
            qk_a = qk_scale * k_s
        score_a = score_terms(qk_a, tanh_a, Sinks, Slopes, head, SOFTCAP, HAS_ALIBI, 1 if HAS_SINKS else 0)
        v_mul, p_log2, l_mul = _v_terms(VScale, 0 if E5M2 else -7, 8 if E5M2 else 15)
        terms = (qk_scale, score, p_log2, l_mul)
    tile = (m0, q_tok0, q_len, head, seg, qk_a, score_a, w_left, w_right, stride_ot, stride_oh, out_scale)
    tile1 = tile
    terms1 = terms
    if PAIR_HEADS:
        score1 = score_terms(qk_scale, tanh_scale, Sinks, Slopes, head + 1, SOFTCAP, HAS_ALIBI,
                             1 if HAS_SINKS else 0)  # fmt: skip
        score1_a = score1
        if CACHE_FP8:
            score1_a = score_terms(qk_a, tanh_a, Sinks, Slopes, head + 1, SOFTCAP, HAS_ALIBI,
                                   1 if HAS_SINKS else 0)  # fmt: skip
            terms1 = (qk_scale, score1, p_log2, l_mul)
        tile1 = (m0, q_tok0, q_len, head + 1, seg, qk_a, score1_a, w_left, w_right, stride_ot, stride_oh,
                 out_scale)  # fmt: skip
    return tile, tile1, terms, terms1, v_mul


@gluon.jit(do_not_specialize=["stride_bt", "page_size", "oob_row", "block_rows", "head_rows", "head_cols",
                              "stride_lse_h", "n_bt_cols", "num_blocks", "max_query_len", "window_left",
                              "window_right", "c_block", "c_slot", "c_head", "n_seqs"])  # fmt: skip
def _gluon_fwd_kernel(
    Q_desc, K_desc, V_desc, KC_desc, VC_desc, KCB_desc, VCB_desc, O, BlockTable, CuSeqlensQ, SeqLens,
    qk_scale, group_size, stride_ot, stride_oh, stride_bt, page_size, oob_row, block_rows, head_rows,
    head_cols, Lse, stride_lse_h, n_bt_cols, num_blocks, max_query_len, Status,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BOX: gl.constexpr,
    KV_FROM_CACHE: gl.constexpr, RETURN_LSE: gl.constexpr, NUM_STAGES: gl.constexpr,
    ONE_CONSUMER: gl.constexpr,
    LLVM_O0: gl.constexpr, Sinks=None, Slopes=None, tanh_scale=None,
    window_left=None, HAS_LEFT: gl.constexpr = False, SOFTCAP: gl.constexpr = 0,
    HAS_ALIBI: gl.constexpr = False, HAS_SINKS: gl.constexpr = False, SKIP_DECODE: gl.constexpr = False,
    IDLE_WG1: gl.constexpr = False, PAIR_HEADS: gl.constexpr = False, window_right=None,
    CAUSAL: gl.constexpr = True, HAS_RIGHT: gl.constexpr = False, OutScale=None, OUT_MAX: gl.constexpr = 0.0,
    KScale=None, VScale=None, CACHE_FP8: gl.constexpr = False, RING: gl.constexpr = None,
    PERSISTENT: gl.constexpr = False, n_seqs=None, TileCounter=None, GATHER: gl.constexpr = False,
    K_cache=None, V_cache=None, c_block=None, c_slot=None, c_head=None, PACK: gl.constexpr = 0,
):  # fmt: skip
    """Grid (cdiv(max_query_len, BLOCK_M), num_heads, batch), 4 warps (+ a consumer warpgroup and two
    producer warps as workers). ``qk_scale`` = softmax scale * log2(e) (> 0). ``KC_desc``/``VC_desc``:
    the caches' views of rows (:func:`paged_kv_offsets.tma_rows`) with block [BOX, D];
    ``KCB_desc``/``VCB_desc``: block [BLOCK_N, D]; ``block_rows``, ``head_rows``, ``head_cols``: the
    views' geometry (the same for K and V), ``oob_row`` a row past both views' ends. With
    ``KV_FROM_CACHE`` the new tokens' K/V are read from the cache (``K_desc``/``V_desc`` then only give
    the rings' shared layout). ``ONE_CONSUMER`` (the quick-compiling form of the compile tiers; launch
    with 8 warps, ``Q_desc`` block ``[BLOCK_M, D]``): both consumer warpgroups as one 8-warp partition,
    one copy of the consumer code (about half the compile). ``LLVM_O0``: read by the compile hook only
    (LLVM at O0, see ``prefill_runtime.hook_compiles``), not by the kernel. Options (each argument None, a
    constexpr, where its option is off): ``HAS_LEFT`` a left window of ``window_left`` keys
    (:func:`_program_segments`); ``SOFTCAP`` soft-capping (``qk_scale`` = softcap * log2(e),
    ``tanh_scale`` = softmax scale / softcap); ``HAS_ALIBI`` ALiBi slopes ``Slopes`` ``[num_heads]``;
    ``HAS_SINKS`` sinks ``Sinks`` ``[num_heads]`` (float32, an extra logit of the denominator);
    ``SKIP_DECODE`` one-token sequences are left to a decode kernel (:func:`_program_skipped`);
    ``CAUSAL`` False: the new tokens see each other both ways, with ``HAS_RIGHT`` at most
    ``window_right`` tokens ahead (:func:`_program_segments`).
    ``IDLE_WG1`` (two consumer warpgroups, ``max_query_len <= BLOCK_M / 2``: the launcher's choice, see
    ``prefix_prefill.plan.idle_second_warpgroup``): the second warpgroup only keeps the rings' protocol.
    ``PAIR_HEADS`` (two consumer warpgroups, ``max_query_len <= BLOCK_M / 2``, an even number of query
    heads per KV head; ``prefix_prefill.plan.pair_heads``): grid (1, num_heads / 2, batch), the two
    warpgroups compute the same rows of two adjacent heads over the KV head's keys, read once for both.
    ``PACK`` (with ``IDLE_WG1``; caches read by TMA, no ALiBi; ``prefix_prefill.plan.pack_heads``):
    grid (1, KV heads, batch), ``PACK == group_size``; the first warpgroup's rows hold the KV head's query
    heads, ``packed_tokens(BLOCK_M / 2, PACK)`` rows each (``prefill_runtime.gluon.consumer``), ``Q_desc``'s
    block that many rows: the KV head's keys read once for all its heads.
    ``n_bt_cols``: the block table's width; ``num_blocks``: the caches'; ``max_query_len``: the caller's;
    ``Status``: the caller's ``status=`` tensor or None (see :func:`_program_guard`; rows come clamped
    into ``Q_desc``'s token count, cached keys into the table). ``OUT_MAX > 0``: ``O`` is fp8 (this
    largest finite value), written as ``clamp(o / OutScale[0])`` (``OutScale``: a 1-element float
    tensor, read once per program; None with ``OUT_MAX`` 0). ``CACHE_FP8`` (an e4m3fn or e5m2 cache, q
    float16; heads 64, 128 and 256): the cache descriptors are fp8 (no swizzle, ``KC_desc``... block rows as
    above), ``RING`` the float16 rings' layout (``K_desc``/``V_desc`` may then be the caches'), ``KScale``
    / ``VScale`` 1-element float tensors (``k_scale``, ``v_scale`` > 0): context blocks land as fp8 in
    staging slots (:func:`_fp8_producer`), a partition (:func:`fp8_converter_warps`) converts them into
    the rings (:func:`_fp8_converter`), and the consumers fold the scales into each context block's terms
    (``prefill_runtime.gluon.segment_terms``: ``qk_scale * k_scale``, or the soft cap's factor times
    ``k_scale``; V's scale through P, :func:`_v_terms`). ``PERSISTENT`` (16-bit caches, two consumer
    warpgroups): grid ``(programs, 1, 1)``, each program taking tiles of the launch's ``n_seqs`` sequences
    one after another through one set of rings, each taken from ``TileCounter`` (int32 ``[2]``, zero at the
    launch; :func:`_persistent_partitions`); ``n_seqs`` and ``TileCounter`` are read there only (None
    elsewhere). ``n_seqs`` changes from call to call of one compiled variant (the launcher's frames),
    so it is never specialised: Triton would make a batch of 1 a constant and mark a multiple of 16 as
    such. ``GATHER`` (16-bit caches, one tile a program; the plan's form for pages that are not
    multiples of 8): the context's key rows are gathered by ``cp.async`` from ``K_cache``/``V_cache``
    (slot ``s`` of block ``b`` and KV head ``h`` at element ``b * c_block + s * c_slot + h * c_head``,
    features contiguous) by :func:`_gather_producer` partitions of :data:`PRODUCER_WARPS` warps, the new
    tokens' by TMA; the cache descriptors then only give the rings' layout."""
    gl.static_assert(PACK == 0 or (IDLE_WG1 and not (GATHER or ONE_CONSUMER or PERSISTENT or PAIR_HEADS
                                                     or HAS_ALIBI)),
                     "PACK: the idle form over caches read by TMA, no ALiBi")  # fmt: skip
    if PERSISTENT:
        gl.static_assert(not (CACHE_FP8 or ONE_CONSUMER or IDLE_WG1 or PAIR_HEADS), "persistent: 16-bit")
        prog = (O, BlockTable, CuSeqlensQ, SeqLens, Lse, Status, Q_desc.shape[0], stride_bt, n_bt_cols,
                num_blocks, page_size, max_query_len, stride_ot, stride_oh, stride_lse_h, window_left,
                window_right, qk_scale, tanh_scale, Sinks, Slopes)  # fmt: skip
        _persistent_partitions(
            prog, (Q_desc, K_desc, V_desc, KC_desc, VC_desc, KCB_desc, VCB_desc),
            (group_size, page_size, oob_row, block_rows, head_rows, head_cols),
            out_scale_of(OutScale, qk_scale, OUT_MAX), n_seqs, TileCounter,
            HEAD_DIM, BLOCK_M, BLOCK_N, BOX, KV_FROM_CACHE, RETURN_LSE, NUM_STAGES, HAS_LEFT, SOFTCAP,
            HAS_ALIBI, HAS_SINKS, SKIP_DECODE, CAUSAL, HAS_RIGHT, OUT_MAX,
        )  # fmt: skip
        return
    skip, head, q_tok0, q_len, m0, p_table_row, w_left, w_right, seg, score = _program(
        O, BlockTable, CuSeqlensQ, SeqLens, Lse, Status, Q_desc.shape[0], stride_bt, n_bt_cols, num_blocks,
        page_size, max_query_len, stride_ot, stride_oh, stride_lse_h, window_left, window_right, qk_scale,
        tanh_scale, Sinks, Slopes, BLOCK_M, BLOCK_N, HEAD_DIM, KV_FROM_CACHE, RETURN_LSE, SKIP_DECODE,
        HAS_LEFT, SOFTCAP, HAS_ALIBI, HAS_SINKS, IDLE_WG1, PAIR_HEADS, CAUSAL, HAS_RIGHT, PACK=PACK,
    )  # fmt: skip
    if skip:
        return
    n_a = seg[1]
    HALF_M: gl.constexpr = BLOCK_M // 2

    # (RING: None for a 16-bit cache, the rings then in the descriptors' layouts)
    q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty, bar_f = allocate_rings(
        Q_desc, K_desc, V_desc, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES,
        READY_COUNT=32 * PRODUCER_WARPS if GATHER else 1,  # (GATHER: one arrival a gathering thread)
        EMPTY_COUNT=256 if ONE_CONSUMER else 2, V_LAYOUT=RING, K_RING=RING,
    )  # fmt: skip
    rings = (q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty, bar_f)
    out_scale = out_scale_of(OutScale, qk_scale, OUT_MAX)
    tile, tile1, terms, terms1, v_mul = _tiles(
        m0, q_tok0, q_len, head, seg, qk_scale, tanh_scale, score, Sinks, Slopes, w_left, w_right, stride_ot,
        stride_oh, out_scale, KScale, VScale, SOFTCAP, HAS_ALIBI, HAS_SINKS, PAIR_HEADS, CACHE_FP8,
        KC_desc.dtype == gl.float8e5,
    )  # fmt: skip
    if CACHE_FP8:
        gl.static_assert(Q_desc.dtype == gl.float16, "fp8 caches convert into float16 rings: q is float16")
    geo = (group_size, page_size, oob_row, block_rows, head_rows, head_cols)
    k_args = _producer_args((Q_desc, K_desc, KC_desc, KCB_desc), q_smem, k_smem, q_bar, k_ready, k_empty,
                            p_table_row, geo, q_tok0, m0, head, seg, HEAD_DIM)  # fmt: skip
    v_args = _producer_args((Q_desc, V_desc, VC_desc, VCB_desc), q_smem, v_smem, q_bar, v_ready, v_empty,
                            p_table_row, geo, q_tok0, m0, head, seg, HEAD_DIM)  # fmt: skip
    if GATHER:
        gl.static_assert(not CACHE_FP8, "GATHER: 16-bit caches")
        kv_off = (head // group_size).to(gl.int64) * c_head
        k_gather = (K_cache, c_block, c_slot, kv_off, num_blocks - 1)
        v_gather = (V_cache, c_block, c_slot, kv_off, num_blocks - 1)
        if ONE_CONSUMER:
            gl.warp_specialize(
                [
                    (_prefix_consumer, (
                        0, O, Lse, rings, tile, stride_lse_h, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES,
                        RETURN_LSE, False, 2, None, 64, None, HAS_LEFT, SOFTCAP, HAS_ALIBI, HAS_SINKS, False,
                        False, CAUSAL, HAS_RIGHT, OUT_MAX, None, False, None, False, True,
                    )),
                    (_gather_producer, (0, k_args, k_gather, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES)),
                    (_gather_producer, (1, v_args, v_gather, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES)),
                ],
                [PRODUCER_WARPS, PRODUCER_WARPS],
                [32, 32],
            )  # fmt: skip
        else:
            gl.warp_specialize(
                [
                    (_prefix_consumer, (
                        0, O, Lse, rings, tile, stride_lse_h, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES,
                        RETURN_LSE, False, 1, None, 64, None, HAS_LEFT, SOFTCAP, HAS_ALIBI, HAS_SINKS, False,
                        PAIR_HEADS, CAUSAL, HAS_RIGHT, OUT_MAX, None, False, None, False, True,
                    )),
                    (_prefix_consumer, (
                        1, O, Lse, rings, tile1, stride_lse_h, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES,
                        RETURN_LSE, False, 1, None, 64, None, HAS_LEFT, SOFTCAP, HAS_ALIBI, HAS_SINKS,
                        IDLE_WG1, PAIR_HEADS, CAUSAL, HAS_RIGHT, OUT_MAX, None, False, None, False, True,
                    )),
                    (_gather_producer, (0, k_args, k_gather, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES,
                                        PAIR_HEADS)),
                    (_gather_producer, (1, v_args, v_gather, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES)),
                ],
                [4, PRODUCER_WARPS, PRODUCER_WARPS],
                [240, 32, 32],
            )  # fmt: skip
    elif CACHE_FP8:
        _fp8_partitions(O, Lse, rings, tile, tile1, terms, terms1, stride_lse_h, k_args, v_args, n_a, v_mul,
                        KCB_desc, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, BOX, RETURN_LSE, ONE_CONSUMER,
                        HAS_LEFT, SOFTCAP, HAS_ALIBI, HAS_SINKS, IDLE_WG1, PAIR_HEADS, CAUSAL, HAS_RIGHT,
                        OUT_MAX, not KV_FROM_CACHE, PACK, Sinks)  # fmt: skip
    elif ONE_CONSUMER:  # one 8-warp partition runs both warpgroups' rows (the kernel launched with 8 warps)
        gl.warp_specialize(
            [
                (_prefix_consumer, (
                    0, O, Lse, rings, tile, stride_lse_h, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, RETURN_LSE,
                    False, 2, None, 64, None, HAS_LEFT, SOFTCAP, HAS_ALIBI, HAS_SINKS, False, False, CAUSAL,
                    HAS_RIGHT, OUT_MAX,
                )),
                (_producer, (0, k_args, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, BOX)),
                (_producer, (1, v_args, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, BOX)),
            ],
            [1, 1],
            [producer_regs(BLOCK_N, BOX), producer_regs(BLOCK_N, BOX)],
        )  # fmt: skip
    else:
        gl.warp_specialize(
            [
                (_prefix_consumer, (
                    0, O, Lse, rings, tile, stride_lse_h, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, RETURN_LSE,
                    False, 1, None, 64, None, HAS_LEFT, SOFTCAP, HAS_ALIBI, HAS_SINKS, False, PAIR_HEADS,
                    CAUSAL, HAS_RIGHT, OUT_MAX, None, False, None, False, False, PACK, Sinks,
                )),
                (_prefix_consumer, (
                    1, O, Lse, rings, tile1, stride_lse_h, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, RETURN_LSE,
                    False, 1, None, 64, None, HAS_LEFT, SOFTCAP, HAS_ALIBI, HAS_SINKS, IDLE_WG1, PAIR_HEADS,
                    CAUSAL, HAS_RIGHT, OUT_MAX,
                )),
                (_producer, (0, k_args, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, BOX, PAIR_HEADS, None, PACK)),
                (_producer, (1, v_args, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, BOX)),
            ],
            [4, 1, 1],
            [consumer_regs(BLOCK_N, BOX, 240), producer_regs(BLOCK_N, BOX), producer_regs(BLOCK_N, BOX)],
        )  # fmt: skip


@gluon.jit
def _fp8_staging(
    rings,
    n_a,
    v_mul,
    dtype: gl.constexpr,
    BLOCK_N: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    K_LAYOUT: gl.constexpr,
    V_LAYOUT: gl.constexpr,
    V_T: gl.constexpr,
    READY_COUNT: gl.constexpr,
):
    """The fp8 forms' staging slots, :func:`fp8_staging` a ring in ``dtype``: K ``[BLOCK_N, D]`` slots in
    ``K_LAYOUT``, V ``[BLOCK_N, D]`` (``V_T``: ``[D, BLOCK_N]``) in ``V_LAYOUT``, their ready barriers
    counting ``READY_COUNT`` arrivals (1: a TMA copy's expect-tx; a gathering partition's threads) and empty
    ones 1 (the converter), initialised. Returns ``(conv_args, k_stage_args, v_stage_args)``: the
    :func:`_fp8_converter`'s arguments over ``rings`` (``allocate_rings``' nine values), ``n_a`` and
    ``v_mul``, and each producer's ``(stage, st_ready, st_empty)``."""
    _, k_smem, v_smem, _, k_ready, k_empty, v_ready, v_empty, _ = rings
    FP8_STAGING: gl.constexpr = fp8_staging(HEAD_DIM)
    k_stage = gl.allocate_shared_memory(dtype, [FP8_STAGING, BLOCK_N, HEAD_DIM], K_LAYOUT)
    if V_T:
        v_stage = gl.allocate_shared_memory(dtype, [FP8_STAGING, HEAD_DIM, BLOCK_N], V_LAYOUT)
    else:
        v_stage = gl.allocate_shared_memory(dtype, [FP8_STAGING, BLOCK_N, HEAD_DIM], V_LAYOUT)
    ks_ready = gl.allocate_shared_memory(gl.int64, [FP8_STAGING, 1], mbarrier.MBarrierLayout())
    ks_empty = gl.allocate_shared_memory(gl.int64, [FP8_STAGING, 1], mbarrier.MBarrierLayout())
    vs_ready = gl.allocate_shared_memory(gl.int64, [FP8_STAGING, 1], mbarrier.MBarrierLayout())
    vs_empty = gl.allocate_shared_memory(gl.int64, [FP8_STAGING, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(FP8_STAGING):
        mbarrier.init(ks_ready.index(i), count=READY_COUNT)
        mbarrier.init(ks_empty.index(i), count=1)
        mbarrier.init(vs_ready.index(i), count=READY_COUNT)
        mbarrier.init(vs_empty.index(i), count=1)
    fence_async_shared()
    conv_args = (k_stage, v_stage, ks_ready, ks_empty, vs_ready, vs_empty, k_smem, v_smem, k_ready, k_empty,
                 v_ready, v_empty, n_a, v_mul)  # fmt: skip
    return conv_args, (k_stage, ks_ready, ks_empty), (v_stage, vs_ready, vs_empty)


@gluon.jit
def _fp8_partitions(
    O, Lse, rings, tile, tile1, terms, terms1, stride_lse_h, k_args, v_args, n_a, v_mul, KCB_desc,
    HALF_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr,
    BOX: gl.constexpr, RETURN_LSE: gl.constexpr, ONE_CONSUMER: gl.constexpr, HAS_LEFT: gl.constexpr,
    SOFTCAP: gl.constexpr, HAS_ALIBI: gl.constexpr, HAS_SINKS: gl.constexpr, IDLE_WG1: gl.constexpr,
    PAIR_HEADS: gl.constexpr, CAUSAL: gl.constexpr, HAS_RIGHT: gl.constexpr, OUT_MAX: gl.constexpr,
    NEW: gl.constexpr, PACK: gl.constexpr = 0, Sinks=None,
):  # fmt: skip
    """The partitions of :func:`_gluon_fwd_kernel`'s ``CACHE_FP8`` forms: the consumers (as the 16-bit
    forms', with segment A's terms from an fp8 cache), :func:`_fp8_converter` (:func:`fp8_converter_warps`
    warps) and the two :func:`_fp8_producer` warps, over :func:`fp8_staging` fp8 staging slots a ring (no
    swizzle: the converter reads them, TMA lands them in ``KCB_desc``'s layout). Two consumer partitions
    at 232 registers (16 warps, 12 at head 256: 128 consumer threads a warpgroup at 232, the converter's
    at :func:`fp8_converter_regs`, the producers' 64 at 24, within the register file's 64K; pages whose
    blocks take 16 boxes: :func:`producer_regs`, :func:`consumer_regs`), or with ``ONE_CONSUMER`` one
    8-warp partition. ``NEW``: the new tokens' K/V come from ``k``/``v`` (16-bit,
    straight into the rings). ``PACK``, ``Sinks``: the packed form's (:func:`_prefix_consumer`)."""
    STAGE: gl.constexpr = KCB_desc.layout  # (TMA lands the blocks in the descriptor's layout)
    conv_args, k_stage_args, v_stage_args = _fp8_staging(
        rings, n_a, v_mul, KCB_desc.dtype, BLOCK_N, HEAD_DIM, STAGE, STAGE, False, 1
    )
    if ONE_CONSUMER:
        gl.warp_specialize(
            [
                (_prefix_consumer, (
                    0, O, Lse, rings, tile, stride_lse_h, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, RETURN_LSE,
                    False, 2, None, 64, None, HAS_LEFT, SOFTCAP, HAS_ALIBI, HAS_SINKS, False, False, CAUSAL,
                    HAS_RIGHT, OUT_MAX, terms, True,
                )),
                (_fp8_converter, (conv_args, BLOCK_N, HEAD_DIM, NUM_STAGES)),
                (_fp8_producer, (0, k_args, k_stage_args, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, BOX, False,
                                 NEW)),
                (_fp8_producer, (1, v_args, v_stage_args, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, BOX, False,
                                 NEW)),
            ],
            [fp8_converter_warps(HEAD_DIM), 1, 1],
            [fp8_converter_regs(HEAD_DIM), producer_regs(BLOCK_N, BOX), producer_regs(BLOCK_N, BOX)],
        )  # fmt: skip
    else:
        gl.warp_specialize(
            [
                (_prefix_consumer, (
                    0, O, Lse, rings, tile, stride_lse_h, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, RETURN_LSE,
                    False, 1, None, 64, None, HAS_LEFT, SOFTCAP, HAS_ALIBI, HAS_SINKS, False, PAIR_HEADS,
                    CAUSAL, HAS_RIGHT, OUT_MAX, terms, True, None, False, False, PACK, Sinks,
                )),
                (_prefix_consumer, (
                    1, O, Lse, rings, tile1, stride_lse_h, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, RETURN_LSE,
                    False, 1, None, 64, None, HAS_LEFT, SOFTCAP, HAS_ALIBI, HAS_SINKS, IDLE_WG1, PAIR_HEADS,
                    CAUSAL, HAS_RIGHT, OUT_MAX, terms1, True,
                )),
                (_fp8_converter, (conv_args, BLOCK_N, HEAD_DIM, NUM_STAGES)),
                (_fp8_producer, (0, k_args, k_stage_args, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, BOX,
                                 PAIR_HEADS, NEW, PACK)),
                (_fp8_producer, (1, v_args, v_stage_args, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, BOX, False,
                                 NEW)),
            ],
            [4, fp8_converter_warps(HEAD_DIM), 1, 1],
            [consumer_regs(BLOCK_N, BOX, 232), fp8_converter_regs(HEAD_DIM), producer_regs(BLOCK_N, BOX),
             producer_regs(BLOCK_N, BOX)],
        )  # fmt: skip


# --------------------------------------------------------------------------- the persistent form
@gluon.jit
def _persistent_tile(
    t, prog, sched, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
    KV_FROM_CACHE: gl.constexpr, RETURN_LSE: gl.constexpr, SKIP_DECODE: gl.constexpr, HAS_LEFT: gl.constexpr,
    SOFTCAP: gl.constexpr, HAS_ALIBI: gl.constexpr, HAS_SINKS: gl.constexpr, CAUSAL: gl.constexpr,
    HAS_RIGHT: gl.constexpr, WRITES: gl.constexpr,
):  # fmt: skip
    """:func:`_program` of tile ``t`` of a persistent launch's ``n_m * n_seqs * heads`` tiles (``sched =
    (heads, n_m, n_seqs, live tiles)``): the latest query tiles of every sequence first (they carry
    the most keys), then sequence by sequence, a sequence's heads back to back (a KV head's query heads read
    its keys while they are in L2): query tile ``n_m - 1 - t // (n_seqs * heads)`` of sequence ``(t //
    heads) % n_seqs``, head ``t % heads``, the sequence's lengths read here (:func:`_sequence`); ``prog``:
    the kernel arguments :func:`_program` reads; ``WRITES``: this partition makes the setup's writes."""
    (O, BlockTable, CuSeqlensQ, SeqLens, Lse, Status, n_tokens, stride_bt, n_bt_cols, num_blocks,
     page_size, max_query_len, stride_ot, stride_oh, stride_lse_h, window_left, window_right, qk_scale,
     tanh_scale, Sinks, Slopes) = prog  # fmt: skip
    heads = sched[0]
    n_m = sched[1]
    per_level = sched[2] * heads
    r = t % per_level
    seq = r // heads
    seq_geo = _sequence(CuSeqlensQ, SeqLens, n_tokens, n_bt_cols, num_blocks, page_size, KV_FROM_CACHE, seq)
    return _program(
        O, BlockTable, CuSeqlensQ, SeqLens, Lse, Status, n_tokens, stride_bt, n_bt_cols, num_blocks,
        page_size, max_query_len, stride_ot, stride_oh, stride_lse_h, window_left, window_right, qk_scale,
        tanh_scale, Sinks, Slopes, BLOCK_M, BLOCK_N, HEAD_DIM, KV_FROM_CACHE, RETURN_LSE, SKIP_DECODE,
        HAS_LEFT, SOFTCAP, HAS_ALIBI, HAS_SINKS, False, False, CAUSAL, HAS_RIGHT, n_m - 1 - t // per_level,
        r % heads, n_m, WRITES, seq_geo, seq,
    )  # fmt: skip


@gluon.jit
def _seq_tiles(CuSeqlensQ, seqs, mask, n_tokens, n_m, BLOCK_M: gl.constexpr):
    """The query tiles a persistent launch computes of sequences ``seqs`` (a tensor; 0 outside ``mask``):
    ``min(cdiv(q_len, BLOCK_M), n_m)``, ``q_len`` clamped into the ``n_tokens`` rows as
    :func:`prefix_prefill.sequence.sequence_geometry` clamps it, so a tile counts exactly where
    :func:`_program` finds rows of its sequence in it (an empty sequence has none; rows past the grid
    belong to the last level's tile)."""
    start = gl.load(CuSeqlensQ + seqs, mask=mask, other=0).to(gl.int64)
    end = gl.load(CuSeqlensQ + seqs + 1, mask=mask, other=0).to(gl.int64)
    q_start, q_end, _moved = clamp_span(start, end, n_tokens.to(gl.int64))
    q_len = (q_end - q_start).to(gl.int32)
    return gl.minimum((q_len + BLOCK_M - 1) // BLOCK_M, n_m)


@gluon.jit
def _fill_tile_table(table, CuSeqlensQ, n_seqs, n_tokens, n_m, BLOCK_M: gl.constexpr):
    """A persistent program's prologue (its default partition): ``table`` (int32 ``[SEQ_TABLE, 1]``) gets
    the query tiles (:func:`_seq_tiles`) of the first :data:`SEQ_TABLE` sequences. Returns the tiles of
    all ``n_seqs`` sequences, summed."""
    NW: gl.constexpr = gl.num_warps()
    CH: gl.constexpr = 32 * NW
    L: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [NW, 1], [1, 0])
    offs = gl.arange(0, CH, layout=gl.SliceLayout(1, L))  # [CH]
    total = gl.zeros([CH], gl.int32, layout=gl.SliceLayout(1, L))  # [CH]
    for s0 in range(0, n_seqs, CH):
        seqs = s0 + offs  # [CH]
        tiles = _seq_tiles(CuSeqlensQ, seqs, seqs < n_seqs, n_tokens, n_m, BLOCK_M)  # [CH]
        total += tiles
        for c in gl.static_range(SEQ_TABLE // CH):
            if s0 == c * CH:
                table.slice(c * CH, CH).store(tiles[:, None])
    return gl.sum(total, 0)


@gluon.jit
def _chunk_live(table, CuSeqlensQ, c0, level, n_seqs, n_tokens, n_m, BLOCK_M: gl.constexpr):
    """The K warp's view of sequences ``[c0, c0 + 32 * num_warps)`` (``c0`` a multiple of that): ``(seqs,
    live)``, ``live`` whether each has a tile at query level ``level``; tile counts from ``table`` for the
    first :data:`SEQ_TABLE` sequences (:func:`_fill_tile_table`), else read (:func:`_seq_tiles`)."""
    NW: gl.constexpr = gl.num_warps()
    CH: gl.constexpr = 32 * NW
    L: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [NW, 1], [1, 0])
    L1: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0])  # (a scan's layout, :func:`_live_tile`)
    seqs = c0 + gl.arange(0, CH, layout=L1)  # [CH]
    inside = seqs < n_seqs
    if c0 < SEQ_TABLE:
        rows = table._reinterpret(gl.int32, [SEQ_TABLE // CH, CH, 1], table.layout)
        tiles = gl.convert_layout(gl.max(rows.index(c0 // CH).load(L), 1), L1)  # [CH]
    else:
        tiles = _seq_tiles(CuSeqlensQ, seqs, inside, n_tokens, n_m, BLOCK_M)
    return seqs, inside & (tiles > level)


@gluon.jit
def _live_tile(u, cursor, table, CuSeqlensQ, sched, n_tokens, BLOCK_M: gl.constexpr):
    """The tile number (:func:`_persistent_tile`'s ``t``) of live tile ``u``: the launch's tiles that hold
    rows, in :func:`_persistent_tile`'s order (tiles past their sequence left out, so a program never takes
    one). ``cursor = (k, c0, u_base, count)``: query level ``k`` from the latest, the sequences from ``c0``
    (:func:`_chunk_live`), ``u_base`` live tiles before them, ``count`` theirs (times the heads); it only
    moves forward, as a program's ``u`` grow. Starts at ``(0, -CH, 0, 0)``. Returns ``(t, cursor)``."""
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
        _seqs, live = _chunk_live(table, CuSeqlensQ, c0, n_m - 1 - k, n_seqs, n_tokens, n_m, BLOCK_M)
        count = gl.sum(live.to(gl.int32), 0) * heads
    seqs, live = _chunk_live(table, CuSeqlensQ, c0, n_m - 1 - k, n_seqs, n_tokens, n_m, BLOCK_M)
    return live_tile_number(u, k, u_base, seqs, live, heads, n_seqs), (k, c0, u_base, count)


@gluon.jit
def _slot_of(slots, i):
    """Slot ``i & 1`` of a program's two tile slots (:func:`_persistent_partitions`), read."""
    if (i & 1) == 0:
        t = read_tile_slot(slots[0])
    else:
        t = read_tile_slot(slots[1])
    return t


@gluon.jit
def _persistent_consumer(
    WG: gl.constexpr, prog, sched, rings, q_empty, slots, out_scale, HALF_M: gl.constexpr,
    BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr, KV_FROM_CACHE: gl.constexpr,
    RETURN_LSE: gl.constexpr, SKIP_DECODE: gl.constexpr, HAS_LEFT: gl.constexpr, SOFTCAP: gl.constexpr,
    HAS_ALIBI: gl.constexpr, HAS_SINKS: gl.constexpr, CAUSAL: gl.constexpr, HAS_RIGHT: gl.constexpr,
    OUT_MAX: gl.constexpr,
):  # fmt: skip
    """Consumer warpgroup ``WG`` of a persistent program: :func:`_prefix_consumer` over each tile the K
    producer took (:func:`_persistent_producer`), read from tile slot ``i & 1`` once the ``i``-th tile's Q
    has landed (``q_bar``'s phase; -1 ends the program), the rings' blocks and the V-row handshake
    counting on from tile to tile, the tile's Q handed back on ``q_empty`` after its last ``Q K^T``."""
    (O, _bt, _cu, _sl, Lse, _st, _nt, _sbt, _nbc, _nb, _ps, _mql, stride_ot, stride_oh, stride_lse_h, _wl,
     _wr, qk_scale, _ts, _sk, _sp) = prog  # fmt: skip
    q_bar = rings[3]
    base = gl.to_tensor(0)  # the rings' blocks of the tiles before
    n_fix = gl.to_tensor(0)
    n_done = gl.to_tensor(0)  # tiles computed (Q's phase)
    PINGPONG: gl.constexpr = takes_turns(HEAD_DIM)  # the consumers' turns at the tensor cores
    first_turn(WG, PINGPONG)
    mbarrier.wait(q_bar.index(WG), 0)
    t = _slot_of(slots, n_done)
    while t >= 0:
        _skip, head, q_tok0, q_len, m0, _ptr, w_left, w_right, seg, score = _persistent_tile(
            t, prog, sched, 2 * HALF_M, BLOCK_N, HEAD_DIM, KV_FROM_CACHE, RETURN_LSE, SKIP_DECODE, HAS_LEFT,
            SOFTCAP, HAS_ALIBI, HAS_SINKS, CAUSAL, HAS_RIGHT, False,
        )  # fmt: skip
        tile = (m0, q_tok0, q_len, head, seg, qk_scale, score, w_left, w_right, stride_ot, stride_oh,
                out_scale)  # fmt: skip
        n_fix = _prefix_consumer(
            WG, O, Lse, rings, tile, stride_lse_h, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, RETURN_LSE,
            False, 1, None, 64, None, HAS_LEFT, SOFTCAP, HAS_ALIBI, HAS_SINKS, False, False, CAUSAL,
            HAS_RIGHT, OUT_MAX, None, False, (base, n_done & 1, n_fix, q_empty), PINGPONG,
        )  # fmt: skip
        base += seg[0]
        n_done += 1
        mbarrier.wait(q_bar.index(WG), n_done & 1)  # the next tile's Q, or the end
        t = _slot_of(slots, n_done)
    last_turn(WG, PINGPONG)


@gluon.jit
def _persistent_producer(
    KV: gl.constexpr, prog, sched, descs, geo, smem, q_smem, q_bar, ready, empty, q_empty, slots, handoff,
    table, TileCounter, HALF_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
    NUM_STAGES: gl.constexpr, BOX: gl.constexpr, KV_FROM_CACHE: gl.constexpr, RETURN_LSE: gl.constexpr,
    SKIP_DECODE: gl.constexpr, HAS_LEFT: gl.constexpr, CAUSAL: gl.constexpr, HAS_RIGHT: gl.constexpr,
):  # fmt: skip
    """Producer warp ``KV`` of a persistent program. The K warp (``KV == 0``) takes the launch's live tiles
    (:func:`_live_tile`): live tile ``program_id(0)`` first, each later one from ``TileCounter`` offset by
    the programs (``prefill_runtime.gluon.next_tile``). It makes each taken tile's setup writes
    (:func:`_program`'s ``WRITES``) and, for a tile with work, writes it into tile slot ``i & 1`` (once
    the V warp read that slot's tile before: ``handoff = (full, free)``, two mbarriers each), announces
    it to the V warp (``full``), then loads its Q and K blocks (:func:`_producer`). Past the last tile it
    counts the program done (``prefill_runtime.gluon.tiles_done``, while the consumers finish), hands
    over -1 and completes both Q barriers' phase without a copy, the consumers' end. The V warp takes
    each tile from the slots (``full``), frees the slot and loads its V blocks, until -1."""
    full, free = handoff
    base = gl.to_tensor(0)
    n_done = gl.to_tensor(0)
    if KV == 0:
        CH: gl.constexpr = 32 * gl.num_warps()
        n_tokens = prog[6]
        cursor = (n_done, n_done - CH, n_done, n_done)
        u = gl.program_id(0)
        while u < sched[3]:
            t, cursor = _live_tile(u, cursor, table, prog[2], sched, n_tokens, 2 * HALF_M)
            skip, head, q_tok0, _ql, m0, p_table_row, _wl, _wr, seg, _sc = _persistent_tile(
                t, prog, sched, 2 * HALF_M, BLOCK_N, HEAD_DIM, KV_FROM_CACHE, RETURN_LSE, SKIP_DECODE,
                HAS_LEFT, 0, False, False, CAUSAL, HAS_RIGHT, True,
            )  # fmt: skip
            if skip == 0:
                _hand_over(slots, full, free, n_done, t)
                args = _producer_args(descs, q_smem, smem, q_bar, ready, empty, p_table_row, geo, q_tok0, m0,
                                      head, seg, HEAD_DIM)  # fmt: skip
                ring = (base, n_done & 1, q_empty)
                _producer(0, args, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, BOX, False, ring)
                base += seg[0]
                n_done += 1
            u = next_tile(TileCounter) + gl.num_programs(0)
        tiles_done(TileCounter)
        _hand_over(slots, full, free, n_done, -1)
        mbarrier.wait(q_empty, (n_done & 1) ^ 1)  # the consumers are done with the last tile's Q
        mbarrier.arrive(q_bar.index(0), count=1)
        mbarrier.arrive(q_bar.index(1), count=1)
    else:
        mbarrier.wait(full.index(0), 0)
        t = _slot_of(slots, n_done)
        while t >= 0:
            mbarrier.arrive(free.index(n_done & 1), count=1)
            skip, head, q_tok0, _ql, m0, p_table_row, _wl, _wr, seg, _sc = _persistent_tile(
                t, prog, sched, 2 * HALF_M, BLOCK_N, HEAD_DIM, KV_FROM_CACHE, False, SKIP_DECODE, HAS_LEFT, 0,
                False, False, CAUSAL, HAS_RIGHT, False,
            )  # fmt: skip
            args = _producer_args(descs, q_smem, smem, q_bar, ready, empty, p_table_row, geo, q_tok0, m0,
                                  head, seg, HEAD_DIM)  # fmt: skip
            ring = (base, n_done & 1, q_empty)
            _producer(1, args, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, BOX, False, ring)
            base += seg[0]
            n_done += 1
            mbarrier.wait(full.index(n_done & 1), (n_done >> 1) & 1)
            t = _slot_of(slots, n_done)


@gluon.jit
def _hand_over(slots, full, free, i, t):
    """The K warp hands tile ``t`` (its ``i``-th; -1: the end) to the V warp and the consumers: into slot
    ``i & 1`` once the V warp freed it (its tile ``i - 2``), announced on ``full``."""
    mbarrier.wait(free.index(i & 1), ((i >> 1) & 1) ^ 1)  # (a fresh barrier passes its first round)
    if (i & 1) == 0:
        write_tile_slot(slots[0], t)
    else:
        write_tile_slot(slots[1], t)
    mbarrier.arrive(full.index(i & 1), count=1)


@gluon.jit
def _persistent_partitions(
    prog, descs, geo, out_scale, n_seqs, TileCounter, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr, BOX: gl.constexpr, KV_FROM_CACHE: gl.constexpr, RETURN_LSE: gl.constexpr,
    NUM_STAGES: gl.constexpr, HAS_LEFT: gl.constexpr, SOFTCAP: gl.constexpr, HAS_ALIBI: gl.constexpr,
    HAS_SINKS: gl.constexpr, SKIP_DECODE: gl.constexpr, CAUSAL: gl.constexpr, HAS_RIGHT: gl.constexpr,
    OUT_MAX: gl.constexpr,
):  # fmt: skip
    """:func:`_gluon_fwd_kernel`'s ``PERSISTENT`` form: grid ``(programs, 1, 1)`` over the live tiles of the
    one-tile grid's ``n_m * n_seqs * heads`` (``n_m`` from ``max_query_len``; ``sched = (heads, n_m, n_seqs,
    live tiles)``, :func:`_persistent_tile`, :func:`_live_tile`), taken one at a time from
    ``TileCounter`` (int32 ``[2]``, zero at the launch: ``prefill_runtime.gluon_host.tile_counter``), so a
    long sequence's tiles spread over every program and a program that finishes early takes more. First
    the sequences' tile counts go into a shared-memory table (:func:`_fill_tile_table`) and, with a
    ``Status``, each program reports its share of the sequences (every ``num_programs(0)``-th; the last
    query level's head-0 tile reports, live or not); then the 16-bit form's rings plus ``q_empty`` (count
    2: both consumers' last ``Q K^T`` of a tile done), two tile slots and the K warp's handoff mbarriers to
    the V warp, two :func:`_persistent_consumer` warpgroups and two :func:`_persistent_producer` warps. A
    row's arithmetic is the one-tile form's: which program computes a tile does not change its result."""
    Q_desc, K_desc, V_desc, KC_desc, VC_desc, KCB_desc, VCB_desc = descs
    HALF_M: gl.constexpr = BLOCK_M // 2
    max_query_len = prog[11]
    heads = Q_desc.shape[1] // HEAD_DIM
    n_m = gl.maximum((max_query_len + BLOCK_M - 1) // BLOCK_M, 1)
    table = gl.allocate_shared_memory(gl.int32, [SEQ_TABLE, 1], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    live = _fill_tile_table(table, prog[2], n_seqs, prog[6], n_m, BLOCK_M)
    sched = (heads, n_m, n_seqs, live * heads)
    if prog[5] is not None:  # Status: the reports of tiles past their sequence, which no program takes
        for seq in range(gl.program_id(0), n_seqs, gl.num_programs(0)):
            _persistent_tile(seq * heads, prog, sched, BLOCK_M, BLOCK_N, HEAD_DIM, KV_FROM_CACHE, RETURN_LSE,
                             SKIP_DECODE, HAS_LEFT, 0, False, False, CAUSAL, HAS_RIGHT, True)  # fmt: skip
    q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty, bar_f = allocate_rings(
        Q_desc, K_desc, V_desc, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES
    )
    rings = (q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty, bar_f)
    q_empty = allocate_q_empty()
    slots = (allocate_tile_slot(), allocate_tile_slot())
    full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(free.index(i), count=1)
    fence_async_shared()
    gl.warp_specialize(
        [
            (_persistent_consumer, (
                0, prog, sched, rings, q_empty, slots, out_scale, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES,
                KV_FROM_CACHE, RETURN_LSE, SKIP_DECODE, HAS_LEFT, SOFTCAP, HAS_ALIBI, HAS_SINKS, CAUSAL,
                HAS_RIGHT, OUT_MAX,
            )),
            (_persistent_consumer, (
                1, prog, sched, rings, q_empty, slots, out_scale, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES,
                KV_FROM_CACHE, RETURN_LSE, SKIP_DECODE, HAS_LEFT, SOFTCAP, HAS_ALIBI, HAS_SINKS, CAUSAL,
                HAS_RIGHT, OUT_MAX,
            )),
            (_persistent_producer, (
                0, prog, sched, (Q_desc, K_desc, KC_desc, KCB_desc), geo, k_smem, q_smem, q_bar, k_ready,
                k_empty, q_empty, slots, (full, free), table, TileCounter, HALF_M, BLOCK_N, HEAD_DIM,
                NUM_STAGES, BOX, KV_FROM_CACHE, RETURN_LSE, SKIP_DECODE, HAS_LEFT, CAUSAL, HAS_RIGHT,
            )),
            (_persistent_producer, (
                1, prog, sched, (Q_desc, V_desc, VC_desc, VCB_desc), geo, v_smem, q_smem, q_bar, v_ready,
                v_empty, q_empty, slots, (full, free), table, TileCounter, HALF_M, BLOCK_N, HEAD_DIM,
                NUM_STAGES, BOX, KV_FROM_CACHE, RETURN_LSE, SKIP_DECODE, HAS_LEFT, CAUSAL, HAS_RIGHT,
            )),
        ],
        [4, 1, 1],
        [consumer_regs(BLOCK_N, BOX, 240, True), producer_regs(BLOCK_N, BOX, True),
         producer_regs(BLOCK_N, BOX, True)],
    )  # fmt: skip
