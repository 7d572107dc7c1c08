"""Gluon kernel (NVIDIA Hopper, sm90): prefix prefill over vLLM's split cache (``_gluon_split_kernel``),
warp-specialised like the NHD one (:mod:`prefix_prefill.gluon_kernel`: same grid, consumers and
segments).

K cache ``[num_blocks, kv_heads, D / 8, page_size, 8]`` (16-bit, x = 8), V cache ``[num_blocks,
kv_heads, D, page_size]``: there is no 2-D row view for TMA boxes, so a gathering producer copies a
context block with ``cp.async``, 16 bytes per copy, into the ring's NVMMA layout: K as ``[BLOCK_N, D]``
(one key's 8 features per copy), V as ``[D, BLOCK_N]`` (8 keys of one feature per copy; a page is a
multiple of 8 keys, so a copy never crosses a page), the ``P @ V`` operand read through its transpose.
Each of the producer's threads arrives on the slot's ready barrier when its own copies have landed
(``cp.async.mbarrier.arrive.noinc``), and the consumers fence the generic proxy (where ``cp.async``
writes) against the async proxy (where wgmma reads) after each wait. The plan picks TMA producers
instead where the page size allows (``V_TMA``, ``K_TMA``). The new tokens come by TMA from ``k`` / ``v``
where they are; with ``V_STAGE`` the V producer transposes their rows into the V ring's slot form.

fp8 caches (``CACHE_FP8``: e4m3fn / e5m2, vLLM's ``x = 16``; heads 64 and 128): the gathering producers
copy each context block's fp8 bytes (16 features of a key, or 16 keys of a feature, a copy) into
``prefix_prefill.gluon_kernel.fp8_staging`` swizzled staging slots (:func:`_split_fp8_producer`), and the
NHD kernel's 4-warp converter (``prefix_prefill.gluon_kernel._fp8_converter``) turns them into the float16
rings, V in its ``[D, BLOCK_N]`` form; the consumers fold the scales in as the NHD kernel's fp8 forms do
(q float16: a bfloat16 call runs as a float16 one).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from paged_kv_offsets.gluon import slot_offset
from prefill_runtime.gluon import allocate_rings, load_q_halves, out_scale_of
from prefix_prefill.gluon_kernel import (
    PRODUCER_WARPS,
    _claim_slot,
    _fp8_converter,
    _fp8_new_blocks,
    _fp8_staging,
    _gather_rows,
    _k_threads_along_features,
    _prefix_consumer,
    _program,
    _publish_gathers,
    _tiles,
    _x_of,
    fp8_converter_warps,
    fp8_staging,
    program_heads,
)


@gluon.constexpr_function
def fp8_gather_warps(HEAD_DIM):
    """The warps of each gathering producer of the ``CACHE_FP8`` forms: :data:`PRODUCER_WARPS`, and 1 at
    head 256. There the consumers' ``[64, 256]`` float32 accumulator and its wgmma need ptxas's per-thread
    ceiling for the launch at 158 registers or more (C7602), which a kernel of 12 warps leaves (168) and
    one of 14 does not (144): 8 consumer warps, the converter's 2 and one warp a ring."""
    return 1 if HEAD_DIM > 128 else PRODUCER_WARPS


@gluon.constexpr_function
def fp8_consumer_regs(HEAD_DIM):
    """The consumer partitions' registers in the ``CACHE_FP8`` forms: 224 of the 16-warp kernel's 128 a
    thread at heads 64/128 (the rest to the converter's 4 warps and the producers' 4 at 32); 232 of the
    12-warp kernel's 168 at head 256 (:func:`fp8_split_converter_regs`' 2 warps at 48, the producers' 2 at
    32: 64,512)."""
    return 232 if HEAD_DIM > 128 else 224


@gluon.constexpr_function
def fp8_split_converter_regs(HEAD_DIM):
    """The converter's registers in the ``CACHE_FP8`` forms: 32, and 48 at head 256, where its V slots
    ``[D, BLOCK_N]`` pass 16 rows of 64 keys at a time (offline, sm90, Triton 3.6: 28 bytes of spill at
    48, 36 at 40, 80 at 32; consumers at 240 with the converter at 40: 40)."""
    return 48 if HEAD_DIM > 128 else 32


@gluon.jit
def _gather_v_block(Cache, buf, p_table_row, pos0, seq_end, page_size, c_block, c_dim, head_off, max_block,
                    BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, SUB: gl.constexpr,
                    TPR: gl.constexpr):  # fmt: skip
    """Context keys ``[pos0, +BLOCK_N)`` of one KV head's V into ``buf`` ``[D, BLOCK_N]``, ``SUB``
    features per step, ``TPR`` threads along a feature's keys: one warp copy reads ``TPR * x``-key runs
    of ``32 / TPR`` features (``x = 16 / element bytes`` keys a 16-byte copy: 8 for a 16-bit cache, 16
    for an fp8 one; the kernel passes ``BLOCK_N // x``: the block's whole key run per feature). Copies
    are ``x``-key groups (a page holds whole groups: pages are multiples of 16); a group that starts
    before ``seq_end`` is copied whole (its page holds it; the consumers zero the V columns past the
    segment), one past it is zero-filled. Block ids clamped to ``[0, max_block]``."""
    X: gl.constexpr = _x_of(Cache.dtype.element_ty)
    PW: gl.constexpr = gl.num_warps()
    RUN: gl.constexpr = TPR * X  # keys of one run
    NR: gl.constexpr = BLOCK_N // RUN  # runs per block
    L: gl.constexpr = gl.BlockedLayout([1, X], [32 // TPR, TPR], [PW, 1], [1, 0])  # a thread: x keys
    offs_n = gl.arange(0, RUN, layout=gl.SliceLayout(0, L))  # [RUN]
    rows = gl.arange(0, SUB, layout=gl.SliceLayout(1, L)) * c_dim.to(gl.int32)  # [SUB] int32 (host-checked)
    step = SUB * c_dim
    for r in gl.static_range(NR):
        grp = pos0 + r * RUN + (offs_n // X) * X  # [RUN] the key's x-key group
        col = slot_offset(p_table_row, grp, seq_end, page_size, c_block, 1, max_block)  # [RUN]
        col += offs_n % X + head_off  # [RUN]
        ok = grp < seq_end  # [RUN]
        if RUN == BLOCK_N:
            dst = buf
        else:
            dst = buf.slice(r * RUN, RUN, dim=1)  # [D, RUN]
        for i in gl.static_range(HEAD_DIM // SUB):
            # each step's feature offset is added to the run's key offsets in a chain (not to the loop-
            # invariant rows), so the compiler does not keep every step's offsets live across the block loop
            off = gl.multiple_of(rows[:, None] + col[None, :], [1, X])  # [SUB, RUN]
            off = gl.max_contiguous(off, [1, X])
            async_copy.async_copy_global_to_shared(dst.slice(i * SUB, SUB), Cache + off, mask=ok[None, :])
            col += step


@gluon.jit
def _transpose_v_half(stage, buf, h, HALF: gl.constexpr, HEAD_DIM: gl.constexpr):
    """Keys ``[h * HALF, +HALF)`` of a new-token block's V from ``stage`` ``[HALF, D]`` (key rows, as a
    TMA box of ``v`` lands) into ring slot ``buf`` ``[D, BLOCK_N]`` (keys along the rows: the context
    blocks' form, so every ``P @ V`` of the consumers has one operand form), 16 features at a time:
    loaded in the layout of an mma B operand (``ldmatrix.trans``: each register holds two keys of one
    feature) and stored so into the slot's transposed view (``stmatrix``), 8 registers a thread."""
    PW: gl.constexpr = gl.num_warps()
    L: gl.constexpr = gl.DotOperandLayout(
        operand_index=1, parent=gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, PW],
                                                          instr_shape=[16, 8]), k_width=2,
    )  # fmt: skip
    for f in gl.static_range(HEAD_DIM // 16):
        t = stage.slice(f * 16, 16, dim=1).load(L)  # [HALF, 16]
        buf.slice(f * 16, 16, dim=0).slice(h * HALF, HALF, dim=1).permute((1, 0)).store(t)


@gluon.jit
def _load_v_half(N_desc, stage, stage_bar, h, tok, col, HALF: gl.constexpr, HEAD_DIM: gl.constexpr):
    """Rows ``[tok + h * HALF, +HALF)`` of the new tokens' V (column ``col`` of ``N_desc``, block ``[HALF,
    D]``) into ``stage.index(h)`` by one TMA copy, announced on ``stage_bar.index(h)``."""
    mbarrier.expect(stage_bar.index(h), HALF * HEAD_DIM * 2)
    tma.async_copy_global_to_shared(N_desc, [tok + h * HALF, col], stage_bar.index(h), stage.index(h))


@gluon.jit
def _split_producer(
    KV: gl.constexpr, args, HALF_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
    NUM_STAGES: gl.constexpr, SUB: gl.constexpr, V_TPR: gl.constexpr, STAGE: gl.constexpr = False, stage=None,
    stage_bar=None, PAIRED: gl.constexpr = False, PACK: gl.constexpr = 0,
):  # fmt: skip
    """A partition of two warps filling one ring from vLLM's split cache by gathers: K (``KV == 0``,
    which also loads the two Q halves; ``PAIRED``: the same rows of heads ``head`` and ``head + 1``;
    ``PACK``: the packed rows of ``PACK`` heads, ``prefill_runtime.gluon.load_q_halves``) or V.
    Context blocks ``j < n_a`` by ``cp.async`` gathers
    (``c_block``/``c_head``/``c_feat``: the cache's block, head and feature-group (K) or feature (V)
    strides), each thread then arriving on the slot's ready barrier (one count per thread) when its
    copies land; new-token blocks by one TMA copy (one expect-tx arrival and the rest in one), from
    ``N_desc`` at token ``n_tok0`` of the sequence's first new token.
    ``SUB``: keys (K) / features (V) per gather step. ``args``: ``(Q_desc, N_desc, Cache, q_smem, smem,
    q_bar, ready, empty, p_table_row, page_size, c_block, c_head, c_feat, q_tok0, n_tok0, m0, head,
    kv_head, n_a, a_base, a_end, n_blocks, b_end, max_block)``; ``N_desc``: the new tokens' rows ``[tokens,
    kv_heads * D]``,
    block ``[BLOCK_N, D]`` (V: into the slot seen in its layout). ``STAGE`` (V): ``N_desc``'s block is
    half a key block, ``stage`` two ``[BLOCK_N / 2, D]`` buffers in its layout with barriers
    ``stage_bar`` ``[2, 1]``; each half of a new-token block lands in its stage by one TMA copy (the
    first block's before the context blocks, each later one as soon as its stage is read), and the
    partition's threads transpose it into the slot's ``[D, BLOCK_N]`` form (:func:`_transpose_v_half`),
    fence their stores against the async proxy and arrive together."""
    (Q_desc, N_desc, Cache, q_smem, smem, q_bar, ready, empty, p_table_row, page_size, c_block, c_head,
     c_feat, q_tok0, n_tok0, m0, head, kv_head, n_a, a_base, a_end, n_blocks, _,
     max_block) = args  # fmt: skip
    kv_bytes: gl.constexpr = BLOCK_N * HEAD_DIM * 2
    if KV == 0:
        load_q_halves(Q_desc, q_smem, q_bar, q_tok0 + m0, head * HEAD_DIM, HALF_M, HEAD_DIM, PAIRED, PACK)
    head_off = kv_head.to(gl.int64) * c_head
    if KV == 1 and STAGE:  # the first new-token block's halves, while the context blocks go by
        for h in gl.static_range(2):
            _load_v_half(N_desc, stage, stage_bar, h, n_tok0, kv_head * HEAD_DIM, BLOCK_N // 2, HEAD_DIM)
    for j in range(n_blocks):
        bar, buf = _claim_slot(empty, ready, smem, j, NUM_STAGES)
        if j < n_a:
            pos0 = a_base + j * BLOCK_N
            if KV == 0:
                _gather_rows(Cache, buf, p_table_row, pos0, a_end, page_size, c_block, c_feat, head_off,
                                max_block, BLOCK_N, HEAD_DIM, SUB)  # fmt: skip
            else:
                _gather_v_block(Cache, buf, p_table_row, pos0, a_end, page_size, c_block, c_feat, head_off,
                                max_block, BLOCK_N, HEAD_DIM, SUB, V_TPR)  # fmt: skip
            _publish_gathers(bar)
        else:
            tok = n_tok0 + (j - n_a) * BLOCK_N  # the new tokens' first row in N_desc
            if KV == 1 and STAGE:  # each half from its stage into the slot, the next block's half behind it
                t = j - n_a
                for h in gl.static_range(2):
                    mbarrier.wait(stage_bar.index(h), t & 1)
                    _transpose_v_half(stage.index(h), buf, h, BLOCK_N // 2, HEAD_DIM)
                    # (orders the partition's reads of the stage before the async proxy's next write to it)
                    fence_async_shared()
                    if t + 1 < n_blocks - n_a:  # the next block's half
                        _load_v_half(N_desc, stage, stage_bar, h, tok + BLOCK_N, kv_head * HEAD_DIM,
                                     BLOCK_N // 2, HEAD_DIM)  # fmt: skip
                fence_async_shared()  # the slot's stores before the consumers' wgmma reads (async proxy)
                mbarrier.arrive(bar, count=32 * gl.num_warps())
            else:
                mbarrier.expect(bar, kv_bytes)
                mbarrier.arrive(bar, count=32 * gl.num_warps() - 1)
                if KV == 0:
                    tma.async_copy_global_to_shared(N_desc, [tok, kv_head * HEAD_DIM], bar, buf)
                else:  # V as key rows: the slot seen in N_desc's layout
                    rows = smem._reinterpret(smem.dtype, [smem.shape[0], BLOCK_N, HEAD_DIM], N_desc.layout)
                    tma.async_copy_global_to_shared(
                        N_desc, [tok, kv_head * HEAD_DIM], bar, rows.index(j % NUM_STAGES)
                    )


@gluon.jit
def _split_v_tma_producer(
    N_desc, C_desc, smem, ready, empty, p_table_row, page_size, n_tok0, kv_head, kv_heads, n_a, a_base,
    a_end, n_blocks, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr,
):  # fmt: skip
    """The V ring by TMA (one warp): a slot ``[D, BLOCK_N]`` in a 32-byte-swizzled layout is ``BLOCK_N /
    16`` column blocks ``[D, 16]``, each one box: a context run of 16 keys (inside one page: pages are
    multiples of 16; the context's blocks from position ``a_base``) from ``C_desc``, the V cache seen as
    ``[num_blocks * kv_heads * D, page_size]``
    (row ``(block * kv_heads + kv_head) * D``; runs at or past ``a_end`` from row ``-D``, outside the
    view: zeros, no block-table read). A new-token block is one box ``[BLOCK_N, D]`` of ``N_desc`` (the new
    tokens' rows, from row ``n_tok0 + ...``) into the slot seen in ``N_desc``'s layout. One expect-tx
    arrival per slot."""
    NB: gl.constexpr = BLOCK_N // 16
    for j in range(n_blocks):
        bar, buf = _claim_slot(empty, ready, smem, j, NUM_STAGES)
        mbarrier.expect(bar, BLOCK_N * HEAD_DIM * 2)
        if j < n_a:
            for i in gl.static_range(NB):
                pos = a_base + j * BLOCK_N + i * 16
                ok = pos < a_end
                page = pos // page_size
                blk = gl.load(p_table_row + page, mask=ok, other=0).to(gl.int32)
                row = gl.where(ok, (blk * kv_heads + kv_head) * HEAD_DIM, -HEAD_DIM)
                tma.async_copy_global_to_shared(C_desc, [row, pos - page * page_size], bar,
                                                buf.slice(i * 16, 16, dim=1))  # fmt: skip
        else:
            rows = smem._reinterpret(smem.dtype, [smem.shape[0], BLOCK_N, HEAD_DIM], N_desc.layout)
            tok = n_tok0 + (j - n_a) * BLOCK_N
            tma.async_copy_global_to_shared(
                N_desc, [tok, kv_head * HEAD_DIM], bar, rows.index(j % NUM_STAGES)
            )


@gluon.jit
def _k_run_boxes(R_desc, parts, slot, bar, p_table_row, pos0, a_end, page_size, kv_heads, kv_head,
                 BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, CM: gl.constexpr = False):  # fmt: skip
    """One context block's K as ``BLOCK_N/16`` runs of 16 keys (pages a multiple of 16: a run never
    crosses a page): per run one block-table read and ``D/64`` boxes ``[2, 8, 64]`` of ``R_desc`` into
    the run's two chunks of each part of ring slot ``slot`` (``parts``: the ring as ``[slots * D/64,
    BLOCK_N/8, 8, 64]``); runs at or past ``a_end`` from row -8 (zeros, no block-table read). ``CM``
    (chunk-major ring; ``parts`` is then ``[slots, BLOCK_N/8, D/8, 64]``): one box ``[2, D/8, 64]`` per
    run."""
    G: gl.constexpr = HEAD_DIM // 8
    NP: gl.constexpr = HEAD_DIM // 64
    NR: gl.constexpr = BLOCK_N // 16
    for r in gl.static_range(NR):
        pos = pos0 + r * 16
        ok = pos < a_end
        page = pos // page_size
        blk = gl.load(p_table_row + page, mask=ok, other=0).to(gl.int32)
        row0 = (blk * kv_heads + kv_head) * G
        kg = (pos - page * page_size) // 8
        if CM:
            row = gl.where(ok, row0, -G)
            tma.async_copy_global_to_shared(R_desc, [kg, row, 0], bar, parts.index(slot).slice(r * 2, 2))
        else:
            for p in gl.static_range(NP):
                row = gl.where(ok, row0 + p * 8, -8)
                dst = parts.index(slot * NP + p).slice(r * 2, 2)  # [2, 8, 64]
                tma.async_copy_global_to_shared(R_desc, [kg, row, 0], bar, dst)


@gluon.jit
def _k_page_boxes(W_desc, parts, slot, bar, p_table_row, page0, off, kv_heads, kv_head,
                  HEAD_DIM: gl.constexpr, CM: gl.constexpr = False):  # fmt: skip
    """A context block inside page ``page0`` (its first key at ``off`` in the page) as ``D/64`` boxes
    ``[BLOCK_N/8, 8, 64]`` of ``W_desc`` into the parts of ring slot ``slot`` (see
    :func:`_split_k_tma_producer`): one block-table read. ``CM`` (chunk-major ring, ``parts`` then
    ``[slots, BLOCK_N/8, D/8, 64]``): one box ``[BLOCK_N/8, D/8, 64]``."""
    G: gl.constexpr = HEAD_DIM // 8
    NP: gl.constexpr = HEAD_DIM // 64
    blk0 = gl.load(p_table_row + page0).to(gl.int32)
    row00 = (blk0 * kv_heads + kv_head) * G
    if CM:
        tma.async_copy_global_to_shared(W_desc, [off // 8, row00, 0], bar, parts.index(slot))
    else:
        for p in gl.static_range(NP):
            dst = parts.index(slot * NP + p)  # [BLOCK_N/8, 8, 64]
            tma.async_copy_global_to_shared(W_desc, [off // 8, row00 + p * 8, 0], bar, dst)


@gluon.jit
def _split_k_tma_producer(
    Q_desc, N_desc, C_desc, q_smem, smem, q_bar, ready, empty, p_table_row, page_size, q_tok0, n_tok0, m0,
    head, kv_head, kv_heads, n_a, a_base, a_end, n_blocks, b_end, HALF_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr, W_desc=None, R_desc=None, K_WIDE: gl.constexpr = 1,
    CM: gl.constexpr = False, NW_desc=None, PAIRED: gl.constexpr = False, PACK: gl.constexpr = 0,
):  # fmt: skip
    """The K ring by TMA (one warp; also loads the two Q halves, ``PAIRED`` and ``PACK`` as
    :func:`_split_producer`).
    A slot holds, per 64 features (part
    ``p``), ``BLOCK_N / 8`` chunks of 8 keys, each ``[8 feature groups, 8 keys, 8 features]`` dense (1 KB):
    wgmma's no-swizzle K-major core matrices, 128 bytes apart along the features and 1 KB apart along the
    keys (the consumers' ``K_VIEW``). A context block that lies in one page is ``D/64`` boxes
    ``[BLOCK_N/8, 8, 64]`` of ``W_desc``, the K cache seen as ``[page_size/8, num_blocks * kv_heads * D/8,
    64]`` (strides ``[64, page_size * 8, 1]``: key groups of 8, feature groups, one group's 8 keys x 8
    features: a feature group's 8 keys are 128 contiguous bytes, one cache line of vLLM's split layout),
    which land as the chunks: one block-table read per block (:func:`_k_page_boxes`). Any other block
    (across pages; every block when pages are shorter than a block, ``K_WIDE == 2``, ``W_desc`` then
    absent) as runs of 16 keys, each inside one page: one read and ``D/64`` boxes ``[2, 8, 64]`` of
    ``R_desc`` (the same view) per run (:func:`_k_run_boxes`). Runs at or past ``a_end`` come from row
    -8 (outside the view: zeros, no block-table read); the keys of a run that straddles ``a_end`` are
    stale slots of its page, which the consumers' mask never lets through (``where``, not a product:
    NaN-safe). New tokens (``b_end`` of them from row ``n_tok0``): a block whose keys all lie among them
    (so in ``k``) is ``D/64`` boxes ``[BLOCK_N/8, 8, 8, 8]`` (one, ``[BLOCK_N/8, D/8, 8, 8]``, chunk-major) of
    ``NW_desc``, ``k`` seen as ``[BLOCK_N/8, kv_heads * D/8, tokens, 8]`` with strides ``[8 * token
    stride, 8, token stride, 1]`` (key groups of 8, feature groups, keys, features: a box at token
    ``tok`` lands as its chunks; the first dimension overlaps the third, and reads stay inside ``k``
    because the block does); the last, partial block of a tile by boxes ``[8, 8, 8]`` (8 feature groups
    of 8 keys of 8 features: one chunk) from ``N_desc``, ``k`` seen as ``[kv_heads * D/8, tokens, 8]``
    (strides ``[8, token stride, 1]``), rows past ``k``'s end reading zeros. The sequence's new tokens
    start at row ``n_tok0``. One expect-tx per slot. ``CM``: a
    chunk-major ring, a slot ``BLOCK_N/8`` chunks of all ``D/8`` feature groups (``[8 keys, 8
    features]`` each), which the consumers read as one ``[BLOCK_N, D]`` view: a one-page block is one
    box ``[BLOCK_N/8, D/8, 64]``, a run one box ``[2, D/8, 64]`` (``W_desc``, ``R_desc`` with those
    blocks), instead of ``D/64`` of each."""
    G: gl.constexpr = HEAD_DIM // 8
    NC: gl.constexpr = BLOCK_N // 8
    NP: gl.constexpr = HEAD_DIM // 64
    if CM:  # every slot of the ring as [NC, G, 64] (one box, or NC / 2 runs' boxes)
        parts = smem._reinterpret(smem.dtype, [NUM_STAGES, NC, G, 64], R_desc.layout)
    else:  # every part of the ring, [slot][part], as [NC, 8, 64] (one box, or NC / 2 runs' boxes)
        parts = smem._reinterpret(smem.dtype, [NUM_STAGES * NP, NC, 8, 64], R_desc.layout)
    # every chunk of the ring as [8 groups, 8 keys, 8 features] (a new-token box of a partial block)
    chunks = smem._reinterpret(smem.dtype, [NUM_STAGES * NC * NP, 8, 8, 8], N_desc.layout)
    if CM:  # every slot as [NC, G, 8, 8] (a full new-token block: one box)
        news = smem._reinterpret(smem.dtype, [NUM_STAGES, NC, G, 8, 8], NW_desc.layout)
    else:  # every part of the ring as [NC, 8, 8, 8] (a full new-token block: a box per part)
        news = smem._reinterpret(smem.dtype, [NUM_STAGES * NP, NC, 8, 8, 8], NW_desc.layout)
    load_q_halves(Q_desc, q_smem, q_bar, q_tok0 + m0, head * HEAD_DIM, HALF_M, HEAD_DIM, PAIRED, PACK)
    for j in range(n_blocks):
        slot = j % NUM_STAGES
        mbarrier.wait(empty.index(slot), ((j // NUM_STAGES) & 1) ^ 1)  # a fresh barrier passes round 0
        bar = ready.index(slot)
        mbarrier.expect(bar, BLOCK_N * HEAD_DIM * 2)
        if j < n_a:
            pos0 = a_base + j * BLOCK_N
            if K_WIDE == 1:
                page0 = pos0 // page_size
                off = pos0 - page0 * page_size  # the block's first key in its page
                if off + BLOCK_N <= page_size:  # key groups [off / 8, + NC) of one page: a box per part
                    _k_page_boxes(W_desc, parts, slot, bar, p_table_row, page0, off, kv_heads, kv_head,
                                  HEAD_DIM, CM)  # fmt: skip
                else:
                    _k_run_boxes(R_desc, parts, slot, bar, p_table_row, pos0, a_end, page_size,
                                 kv_heads, kv_head, BLOCK_N, HEAD_DIM, CM)  # fmt: skip
            else:
                _k_run_boxes(R_desc, parts, slot, bar, p_table_row, pos0, a_end, page_size, kv_heads,
                             kv_head, BLOCK_N, HEAD_DIM, CM)  # fmt: skip
        else:
            tok = n_tok0 + (j - n_a) * BLOCK_N
            if (j - n_a + 1) * BLOCK_N <= b_end:  # every key of the block is a new token of the sequence
                if CM:
                    tma.async_copy_global_to_shared(NW_desc, [0, kv_head * G, tok, 0], bar, news.index(slot))
                else:
                    for p in gl.static_range(NP):
                        tma.async_copy_global_to_shared(NW_desc, [0, kv_head * G + p * 8, tok, 0], bar,
                                                        news.index(slot * NP + p))  # fmt: skip
            else:
                for c in gl.static_range(NC):
                    for p in gl.static_range(NP):
                        # (chunk c, part p) of the slot: chunk-major c * NP + p, part-major p * NC + c
                        idx = slot * (NC * NP) + (c * NP + p if CM else p * NC + c)
                        tma.async_copy_global_to_shared(N_desc, [kv_head * G + p * 8, tok + c * 8, 0], bar,
                                                        chunks.index(idx))  # fmt: skip


@gluon.jit
def _split_k_partition(
    K_TMA: gl.constexpr, args, kv_heads, HALF_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
    NUM_STAGES: gl.constexpr, SUB: gl.constexpr, V_TPR: gl.constexpr, W_desc=None, R_desc=None,
    K_WIDE: gl.constexpr = 0, CM: gl.constexpr = False, NW_desc=None, PAIRED: gl.constexpr = False,
    PACK: gl.constexpr = 0,
):  # fmt: skip
    """The K ring's producer (``args`` as :func:`_split_producer`'s): :func:`_split_k_tma_producer` with
    ``K_TMA`` (``Cache`` is then the K cache's descriptor; ``W_desc``, ``R_desc``, ``K_WIDE``, ``CM``,
    ``NW_desc`` as there), else :func:`_split_producer`'s gathers; ``PAIRED``, ``PACK``: the Q halves'
    form."""
    if K_TMA:
        (Q_desc, N_desc, Cache, q_smem, smem, q_bar, ready, empty, p_table_row, page_size, _, _, _, q_tok0,
         n_tok0, m0, head, kv_head, n_a, a_base, a_end, n_blocks, b_end, _) = args  # fmt: skip
        _split_k_tma_producer(Q_desc, N_desc, Cache, q_smem, smem, q_bar, ready, empty, p_table_row,
                              page_size, q_tok0, n_tok0, m0, head, kv_head, kv_heads, n_a, a_base, a_end,
                              n_blocks, b_end, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, W_desc, R_desc, K_WIDE,
                              CM, NW_desc, PAIRED, PACK)  # fmt: skip
    else:
        _split_producer(0, args, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, SUB, V_TPR, False, None, None, PAIRED,
                        PACK)  # fmt: skip


@gluon.jit
def _split_v_partition(
    V_TMA: gl.constexpr, args, kv_heads, HALF_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
    NUM_STAGES: gl.constexpr, SUB: gl.constexpr, V_TPR: gl.constexpr, STAGE: gl.constexpr = False, stage=None,
    stage_bar=None,
):  # fmt: skip
    """The V ring's producer (``args`` as :func:`_split_producer`'s): :func:`_split_v_tma_producer` with
    ``V_TMA`` (``Cache`` is then the V cache's descriptor), else :func:`_split_producer`'s gathers
    (``STAGE``, ``stage``, ``stage_bar`` as there)."""
    if V_TMA:
        (_, N_desc, Cache, _, smem, _, ready, empty, p_table_row, page_size, _, _, _, _, n_tok0, _, _,
         kv_head, n_a, a_base, a_end, n_blocks, _, _) = args  # fmt: skip
        _split_v_tma_producer(N_desc, Cache, smem, ready, empty, p_table_row, page_size, n_tok0, kv_head,
                              kv_heads, n_a, a_base, a_end, n_blocks, BLOCK_N, HEAD_DIM,
                              NUM_STAGES)  # fmt: skip
    else:
        _split_producer(1, args, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, SUB, V_TPR, STAGE, stage, stage_bar)


@gluon.constexpr_function
def _staging_layout(cols):
    """An fp8 staging slot's layout (``[rows, cols]``, 8-bit, swizzled by its row's bytes up to 128): the
    gathers' 16-byte copies of consecutive rows land in distinct banks, the converter's loads read whole
    rows."""
    return gl.NVMMASharedLayout(swizzle_byte_width=min(cols, 128), element_bitwidth=8, rank=2)


@gluon.jit
def _split_fp8_producer(
    KV: gl.constexpr, args, stage_args, HALF_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
    NUM_STAGES: gl.constexpr, SUB: gl.constexpr, V_TPR: gl.constexpr, PAIRED: gl.constexpr = False,
    NEW: gl.constexpr = True, PACK: gl.constexpr = 0,
):  # fmt: skip
    """:func:`_split_producer` over an fp8 split cache (``args``, ``PAIRED`` and ``PACK`` as there): context
    blocks ``j < n_a`` are gathered as fp8 bytes into staging slot ``j % fp8_staging(D)`` of ``stage_args
    = (stage, st_ready, st_empty)`` (K ``[BLOCK_N, D]``, V ``[D, BLOCK_N]``) once
    ``prefix_prefill.gluon_kernel._fp8_converter`` released it, each thread arriving on ``st_ready`` when
    its copies land; the converter turns them into the float16 ring. The new tokens' blocks (``NEW``) go to
    the ring by TMA (``prefix_prefill.gluon_kernel._fp8_new_blocks``)."""
    (Q_desc, N_desc, Cache, q_smem, smem, q_bar, ready, empty, p_table_row, page_size, c_block, c_head,
     c_feat, q_tok0, n_tok0, m0, head, kv_head, n_a, a_base, a_end, n_blocks, _,
     max_block) = args  # fmt: skip
    stage, st_ready, st_empty = stage_args
    STAGING: gl.constexpr = fp8_staging(HEAD_DIM)
    if KV == 0:
        load_q_halves(Q_desc, q_smem, q_bar, q_tok0 + m0, head * HEAD_DIM, HALF_M, HEAD_DIM, PAIRED, PACK)
    head_off = kv_head.to(gl.int64) * c_head
    for j in range(n_a):
        st = j % STAGING
        mbarrier.wait(st_empty.index(st), ((j // STAGING) & 1) ^ 1)  # a fresh barrier passes round 0
        pos0 = a_base + j * BLOCK_N
        if KV == 0:
            _gather_rows(Cache, stage.index(st), p_table_row, pos0, a_end, page_size, c_block, c_feat,
                            head_off, max_block, BLOCK_N, HEAD_DIM, SUB)  # fmt: skip
        else:
            _gather_v_block(Cache, stage.index(st), p_table_row, pos0, a_end, page_size, c_block, c_feat,
                            head_off, max_block, BLOCK_N, HEAD_DIM, SUB, V_TPR)  # fmt: skip
        _publish_gathers(st_ready.index(st))
    if NEW:  # (V as key rows: the slot seen in N_desc's layout)
        _fp8_new_blocks(N_desc, smem, ready, empty, st_empty, n_tok0, kv_head * HEAD_DIM, n_a, n_blocks,
                        BLOCK_N, HEAD_DIM, NUM_STAGES, KV == 1)  # fmt: skip


@gluon.jit
def _split_fp8_partitions(
    O, Lse, rings, tile, tile1, terms, terms1, stride_lse_h, k_args, v_args, n_a, v_mul, K_cache,
    HALF_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr,
    K_SUB: gl.constexpr, V_SUB: gl.constexpr, V_TPR: gl.constexpr, V_ROWS: gl.constexpr,
    RETURN_LSE: gl.constexpr, ONE_CONSUMER: gl.constexpr, HAS_LEFT: gl.constexpr, SOFTCAP: gl.constexpr,
    HAS_ALIBI: gl.constexpr, HAS_SINKS: gl.constexpr, IDLE_WG1: gl.constexpr, PAIR_HEADS: gl.constexpr,
    CAUSAL: gl.constexpr, HAS_RIGHT: gl.constexpr, OUT_MAX: gl.constexpr, NEW: gl.constexpr,
    PACK: gl.constexpr = 0, Sinks=None,
):  # fmt: skip
    """The partitions of :func:`_gluon_split_kernel`'s ``CACHE_FP8`` forms: the consumers (segment A's terms
    from the fp8 cache), ``prefix_prefill.gluon_kernel._fp8_converter`` (``fp8_converter_warps``: 4
    warps at heads 64/128, 2 at 256; V slots ``[D, BLOCK_N]``) and the two gathering
    :func:`_split_fp8_producer` partitions (:func:`fp8_gather_warps`: 2 warps each, 1 at head 256), over
    ``fp8_staging(D)`` fp8 staging slots a ring (:func:`_staging_layout`). 16 warps: the consumers at 224
    registers, the converter and the producers at 32; at head 256 12 (:func:`fp8_consumer_regs`,
    :func:`fp8_split_converter_regs`). ``NEW``: the new tokens' K/V come from ``k``/``v`` (float16, by TMA
    into the rings)."""
    # (ready barriers: one arrival per gathering thread)
    PW: gl.constexpr = fp8_gather_warps(HEAD_DIM)
    REGS: gl.constexpr = fp8_split_converter_regs(HEAD_DIM)
    conv_args, k_stage_args, v_stage_args = _fp8_staging(
        rings, n_a, v_mul, K_cache.dtype.element_ty, BLOCK_N, HEAD_DIM, _staging_layout(HEAD_DIM),
        _staging_layout(BLOCK_N), True, 32 * PW,
    )  # fmt: skip
    if ONE_CONSUMER:
        gl.warp_specialize(
            [
                (_prefix_consumer, (
                    0, O, Lse, rings, tile, stride_lse_h, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, RETURN_LSE,
                    True, 2, None, 64, V_ROWS, HAS_LEFT, SOFTCAP, HAS_ALIBI, HAS_SINKS, False, False, CAUSAL,
                    HAS_RIGHT, OUT_MAX, terms, True,
                )),
                (_fp8_converter, (conv_args, BLOCK_N, HEAD_DIM, NUM_STAGES, True)),
                (_split_fp8_producer, (0, k_args, k_stage_args, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, K_SUB,
                                       V_TPR, False, NEW)),
                (_split_fp8_producer, (1, v_args, v_stage_args, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, V_SUB,
                                       V_TPR, False, NEW)),
            ],
            [fp8_converter_warps(HEAD_DIM), PW, PW],
            [REGS, 32, 32],
        )  # fmt: skip
    else:
        gl.warp_specialize(
            [
                (_prefix_consumer, (
                    0, O, Lse, rings, tile, stride_lse_h, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, RETURN_LSE,
                    True, 1, None, 64, V_ROWS, HAS_LEFT, SOFTCAP, HAS_ALIBI, HAS_SINKS, False, PAIR_HEADS,
                    CAUSAL, HAS_RIGHT, OUT_MAX, terms, True, None, False, False, PACK, Sinks,
                )),
                (_prefix_consumer, (
                    1, O, Lse, rings, tile1, stride_lse_h, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, RETURN_LSE,
                    True, 1, None, 64, V_ROWS, HAS_LEFT, SOFTCAP, HAS_ALIBI, HAS_SINKS, IDLE_WG1, PAIR_HEADS,
                    CAUSAL, HAS_RIGHT, OUT_MAX, terms1, True,
                )),
                (_fp8_converter, (conv_args, BLOCK_N, HEAD_DIM, NUM_STAGES, True)),
                (_split_fp8_producer, (0, k_args, k_stage_args, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, K_SUB,
                                       V_TPR, PAIR_HEADS, NEW, PACK)),
                (_split_fp8_producer, (1, v_args, v_stage_args, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, V_SUB,
                                       V_TPR, False, NEW)),
            ],
            [4, fp8_converter_warps(HEAD_DIM), PW, PW],
            [fp8_consumer_regs(HEAD_DIM), REGS, 32, 32],
        )  # fmt: skip


@gluon.jit(do_not_specialize=["stride_bt", "page_size", "stride_lse_h", "kc_block", "kc_head", "kc_group",
                              "vc_block", "vc_head", "vc_dim", "n_bt_cols", "num_blocks",
                              "max_query_len", "window_left", "window_right"])  # fmt: skip
def _gluon_split_kernel(
    Q_desc, K_desc, V_desc, K_cache, V_cache, O, BlockTable, CuSeqlensQ, SeqLens, qk_scale, group_size,
    stride_ot, stride_oh, stride_bt, page_size, kc_block, kc_head, kc_group, vc_block, vc_head, vc_dim, Lse,
    stride_lse_h, n_bt_cols, num_blocks, max_query_len, Status,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, KV_FROM_CACHE: gl.constexpr,
    RETURN_LSE: gl.constexpr, NUM_STAGES: gl.constexpr, V_TMA: gl.constexpr, ONE_CONSUMER: gl.constexpr,
    K_TMA: gl.constexpr, K_VIEW: gl.constexpr, LLVM_O0: gl.constexpr, V_RING: gl.constexpr,
    KW_desc=None, KR_desc=None, K_WIDE: gl.constexpr = 0, K_CM: gl.constexpr = False,
    KN_desc=None, V_STAGE: gl.constexpr = False, Sinks=None, Slopes=None, tanh_scale=None, window_left=None,
    HAS_LEFT: gl.constexpr = False, SOFTCAP: gl.constexpr = 0,
    HAS_ALIBI: gl.constexpr = False, HAS_SINKS: gl.constexpr = False, SKIP_DECODE: gl.constexpr = False,
    IDLE_WG1: gl.constexpr = False, PAIR_HEADS: gl.constexpr = False, window_right=None,
    CAUSAL: gl.constexpr = True, HAS_RIGHT: gl.constexpr = False, OutScale=None, OUT_MAX: gl.constexpr = 0.0,
    KScale=None, VScale=None, CACHE_FP8: gl.constexpr = False, PACK: gl.constexpr = 0,
):  # fmt: skip
    """:func:`prefix_prefill.gluon_kernel._gluon_fwd_kernel` over vLLM's split cache (see the module
    docstring): same grid, warps and segments.
    ``K_desc``: the new tokens' K, ``[tokens, kv_heads * D]`` with block ``[BLOCK_N, D]`` (K gathered: the
    K ring's layout too), or with ``K_TMA`` ``[kv_heads * D/8, tokens, 8]`` with block ``[8, 8, 8]``;
    ``V_desc``: their V ``[tokens, kv_heads * D]``, block ``[BLOCK_N, D]`` (the layout segment B's V
    slots are read in), or with ``V_STAGE`` ``[BLOCK_N / 2, D]`` (the V producer's stages' layout); with
    ``KV_FROM_CACHE`` neither is read. ``V_RING``: the V ring's layout
    (``[D, BLOCK_N]`` slots). ``kc_*``/``vc_*``: element strides of the
    caches' blocks, heads and feature groups of 8 (K) / features (V); the host checks every stride
    and base is 16-byte aligned. The gathering producers are two warps of 32 registers each (the two
    share one warpgroup's register budget); a TMA producer is one warp (its boxes need no partition
    barrier between them).
    ``V_TMA``: V by TMA boxes (:func:`_split_v_tma_producer`); ``V_cache`` is then the V cache's
    descriptor (``[num_blocks * kv_heads * D, page_size]``, block ``[D, 16]``) and ``V_desc``'s block
    ``[D, 16]`` too (32-byte swizzle). ``ONE_CONSUMER``, ``LLVM_O0``: as in
    :func:`prefix_prefill.gluon_kernel._gluon_fwd_kernel`.
    ``K_TMA``: K by TMA boxes (:func:`_split_k_tma_producer`) into a K ring of 64-wide rows (``K_cache``'s
    layout) read as ``[BLOCK_N, D]`` through ``K_VIEW``; ``K_cache`` is then a descriptor (block ``[8,
    64]``, no swizzle) over the K cache; ``K_WIDE``: 1 blocks inside one page by ``D/64`` boxes of
    ``KW_desc``, the others by 16-key runs of ``KR_desc``; 2 (pages shorter than a block) every block by
    runs; the new tokens' full blocks by boxes of ``KN_desc`` (``NW_desc`` of
    :func:`_split_k_tma_producer`), their partial ones by ``K_desc``'s. ``K_CM`` (with ``K_TMA``): the
    K ring chunk-major, read through ``K_VIEW`` as one ``[BLOCK_N, D]`` view (``CM`` there); its PTX
    must go through ``prefill_runtime.host.clear_noswizzle_base_offsets`` (the package's compile hook
    does it). ``ONE_CONSUMER`` is also the plan's full form at head 128 with the new tokens given and pages
    holding a key block (``prefix_prefill.plan.SPLIT_ONE_CONSUMER_HEADS``): both consumer loops then exist
    once in the code. ``V_STAGE`` (V gathered, the new tokens given, head <= 128): ``V_desc``'s block is
    half a key block and the V producer transposes those rows into the V ring's slot form
    (:func:`_split_producer`), so the consumers run one loop. ``Sinks``, ``Slopes``, ``tanh_scale``,
    ``window_left`` and ``HAS_LEFT``, ``SOFTCAP``, ``HAS_ALIBI``, ``HAS_SINKS``, ``SKIP_DECODE``,
    ``CAUSAL``, ``window_right`` and ``HAS_RIGHT``, ``IDLE_WG1``, ``PAIR_HEADS`` (two consumer partitions
    only), ``PACK``, ``OutScale`` and ``OUT_MAX`` (an fp8 output), ``KScale``, ``VScale``
    and ``CACHE_FP8`` (an fp8 cache gathered by pointer, K and V: :func:`_split_fp8_partitions`; ``V_RING``
    and the descriptors float16): the options of
    :func:`prefix_prefill.gluon_kernel._gluon_fwd_kernel` (blocks before a window's first visible key are
    never copied, gathered or boxed). ``n_bt_cols``, ``num_blocks``, ``max_query_len``,
    ``Status``: as there; the gathers clamp every block id into ``[0, num_blocks)`` (a TMA box needs no
    clamp: coordinates outside the view read zeros)."""
    PRODUCER_REGS: gl.constexpr = 32  # every producer's registers (setmaxnreg)
    if V_TMA:  # (V by TMA implies K by TMA: no gathers)
        CX: gl.constexpr = 8
    else:  # the caches' elements a 16-byte gather copy (vLLM's x), from their element type
        CX: gl.constexpr = _x_of(V_cache.dtype.element_ty)
    V_TPR: gl.constexpr = BLOCK_N // CX  # threads along a feature row's keys in the V gathers
    TPD: gl.constexpr = _k_threads_along_features(HEAD_DIM, CX)  # the K gathers' (_gather_rows)
    GW: gl.constexpr = fp8_gather_warps(HEAD_DIM) if CACHE_FP8 else PRODUCER_WARPS  # a gatherer's warps
    K_SUB: gl.constexpr = 32 * GW if TPD == 1 else 32 // TPD  # keys per K gather step
    V_SUB: gl.constexpr = max(16, GW * 32 // V_TPR)  # features per V gather step
    K_PW: gl.constexpr = 1 if K_TMA else PRODUCER_WARPS  # the K producer's warps
    V_PW: gl.constexpr = 1 if V_TMA else PRODUCER_WARPS  # the V producer's warps
    K_COLS: gl.constexpr = HEAD_DIM if K_CM else 64
    gl.static_assert(PACK == 0 or (IDLE_WG1 and not (ONE_CONSUMER or PAIR_HEADS or HAS_ALIBI)),
                     "PACK: the idle form, no ALiBi")  # fmt: skip
    skip, head, q_tok0, q_len, m0, p_table_row, w_left, w_right, seg, score = _program(
        O, BlockTable, CuSeqlensQ, SeqLens, Lse, Status, Q_desc.shape[0], stride_bt, n_bt_cols, num_blocks,
        page_size, max_query_len, stride_ot, stride_oh, stride_lse_h, window_left, window_right, qk_scale,
        tanh_scale, Sinks, Slopes, BLOCK_M, BLOCK_N, HEAD_DIM, KV_FROM_CACHE, RETURN_LSE, SKIP_DECODE,
        HAS_LEFT, SOFTCAP, HAS_ALIBI, HAS_SINKS, IDLE_WG1, PAIR_HEADS, CAUSAL, HAS_RIGHT, PACK=PACK,
    )  # fmt: skip
    if skip:
        return
    n_blocks, n_a, a_base, _, a_end, _, _, _, b_base, b_end, _, _ = seg
    kv_head = head // group_size
    HALF_M: gl.constexpr = BLOCK_M // 2
    if K_TMA:
        K_ROWS: gl.constexpr = K_cache.layout  # the K ring as 64-wide rows (8-key chunks of [D/8, 64])
    else:
        K_ROWS: gl.constexpr = None
    # With V_STAGE the gathering V producer transposes the new tokens' V into the context's [D, BLOCK_N]
    # slot form through two half-block stages (one consumer loop, one P @ V operand form); otherwise
    # segment B's V slots hold key rows, which the consumers read in a loop of their own.
    if KV_FROM_CACHE or V_STAGE:  # every V slot in the [D, BLOCK_N] form
        V_ROWS: gl.constexpr = None
    else:  # segment B's V slots: the new tokens' rows
        V_ROWS: gl.constexpr = V_desc.layout

    q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty, bar_f = allocate_rings(
        Q_desc,
        K_desc,
        V_desc,
        HALF_M,
        BLOCK_N,
        HEAD_DIM,
        NUM_STAGES,
        True,
        1 if K_TMA or CACHE_FP8 else 32 * K_PW,  # (fp8: the converter's one arrival, or a TMA copy's)
        1 if V_TMA or CACHE_FP8 else 32 * PRODUCER_WARPS,
        256 if ONE_CONSUMER else 2,
        K_ROWS,
        0,
        V_RING,
    )
    if V_STAGE:  # two half-block stages [2, BLOCK_N / 2, D] (V_desc's block is a half block then)
        v_stage = gl.allocate_shared_memory(V_desc.dtype, [2, BLOCK_N // 2, HEAD_DIM], V_desc.layout)
        v_stage_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for h in gl.static_range(2):
            mbarrier.init(v_stage_bar.index(h), count=1)
        fence_async_shared()
    else:  # (placeholders: a partition's arguments cannot be None; unused without V_STAGE)
        v_stage = v_smem
        v_stage_bar = k_ready
    rings = (q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty, bar_f)
    out_scale = out_scale_of(OutScale, qk_scale, OUT_MAX)
    if CACHE_FP8:
        gl.static_assert(Q_desc.dtype == gl.float16, "fp8 caches convert into float16 rings: q is float16")
        gl.static_assert(not (K_TMA or V_TMA or V_STAGE), "fp8 split caches: K and V gathered, no V staging")
        E5M2: gl.constexpr = K_cache.dtype.element_ty == gl.float8e5
    else:
        E5M2: gl.constexpr = False
    tile, tile1, terms, terms1, v_mul = _tiles(
        m0, q_tok0, q_len, head, seg, qk_scale, tanh_scale, score, Sinks, Slopes, w_left, w_right, stride_ot,
        stride_oh, out_scale, KScale, VScale, SOFTCAP, HAS_ALIBI, HAS_SINKS, PAIR_HEADS, CACHE_FP8, E5M2,
    )  # fmt: skip
    # the new tokens from B's first block on: rows from n_tok0, n_new of them
    n_tok0, n_new = q_tok0 + b_base, b_end - b_base
    k_args = (Q_desc, K_desc, K_cache, q_smem, k_smem, q_bar, k_ready, k_empty, p_table_row, page_size,
              kc_block, kc_head, kc_group, q_tok0, n_tok0, m0, head, kv_head, n_a, a_base, a_end, n_blocks,
              n_new, num_blocks - 1)  # fmt: skip
    v_args = (Q_desc, V_desc, V_cache, q_smem, v_smem, q_bar, v_ready, v_empty, p_table_row, page_size,
              vc_block, vc_head, vc_dim, q_tok0, n_tok0, m0, head, kv_head, n_a, a_base, a_end, n_blocks,
              n_new, num_blocks - 1)  # fmt: skip
    kv_heads = gl.num_programs(1) * program_heads(PAIR_HEADS, PACK) // group_size
    # The producer entries repeat in both lists: Gluon cannot bind a (function, arguments) pair to a
    # name, and an argument tuple bound to a name loses its constexprs.
    if CACHE_FP8:
        _split_fp8_partitions(O, Lse, rings, tile, tile1, terms, terms1, stride_lse_h, k_args, v_args, n_a,
                              v_mul, K_cache, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, K_SUB, V_SUB, V_TPR,
                              V_ROWS, RETURN_LSE, ONE_CONSUMER, HAS_LEFT, SOFTCAP, HAS_ALIBI, HAS_SINKS,
                              IDLE_WG1, PAIR_HEADS, CAUSAL, HAS_RIGHT, OUT_MAX,
                              not KV_FROM_CACHE, PACK, Sinks)  # fmt: skip
    elif ONE_CONSUMER:  # one 8-warp consumer partition (the kernel launched with 8 warps)
        gl.warp_specialize(
            [
                (_prefix_consumer, (
                    0, O, Lse, rings, tile, stride_lse_h, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, RETURN_LSE,
                    True, 2, K_VIEW, K_COLS, V_ROWS, HAS_LEFT, SOFTCAP, HAS_ALIBI, HAS_SINKS, False, False,
                    CAUSAL, HAS_RIGHT, OUT_MAX,
                )),
                (_split_k_partition, (K_TMA, k_args, kv_heads, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, K_SUB,
                                       V_TPR, KW_desc, KR_desc, K_WIDE, K_CM, KN_desc)),
                (_split_v_partition, (V_TMA, v_args, kv_heads, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, V_SUB,
                                       V_TPR, V_STAGE, v_stage, v_stage_bar)),
            ],
            [K_PW, V_PW],
            [PRODUCER_REGS, PRODUCER_REGS],
        )  # fmt: skip
    else:
        gl.warp_specialize(
            [
                (_prefix_consumer, (
                    0, O, Lse, rings, tile, stride_lse_h, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, RETURN_LSE,
                    True, 1, K_VIEW, K_COLS, V_ROWS, HAS_LEFT, SOFTCAP, HAS_ALIBI, HAS_SINKS, False,
                    PAIR_HEADS, CAUSAL, HAS_RIGHT, OUT_MAX, None, False, None, False, False, PACK, Sinks,
                )),
                (_prefix_consumer, (
                    1, O, Lse, rings, tile1, stride_lse_h, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, RETURN_LSE,
                    True, 1, K_VIEW, K_COLS, V_ROWS, HAS_LEFT, SOFTCAP, HAS_ALIBI, HAS_SINKS, IDLE_WG1,
                    PAIR_HEADS, CAUSAL, HAS_RIGHT, OUT_MAX,
                )),
                (_split_k_partition, (K_TMA, k_args, kv_heads, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, K_SUB,
                                       V_TPR, KW_desc, KR_desc, K_WIDE, K_CM, KN_desc, PAIR_HEADS, PACK)),
                (_split_v_partition, (V_TMA, v_args, kv_heads, HALF_M, BLOCK_N, HEAD_DIM, NUM_STAGES, V_SUB,
                                       V_TPR, V_STAGE, v_stage, v_stage_bar)),
            ],
            [4, K_PW, V_PW],
            [240, PRODUCER_REGS, PRODUCER_REGS],
        )  # fmt: skip
