"""The persistent form of prefix-prefill's NHD/HND Gluon kernel (``PERSISTENT``): a window that lets a row
see at most :data:`prefix_prefill.plan.PERSISTENT_MAX_WINDOW` keys runs grid ``(programs, 1, 1)``, each
program taking the whole launch's tiles that hold rows (every sequence's, the latest query tiles first) one
after another from a counter, through one set of rings.

CPU: the plan's rule (narrow windows on NHD/HND with 16-bit caches; not fp8 caches, not the split kernel,
not wider windows); the grid (one program a multiprocessor, at most the one-tile grid's tiles); the
launches' grids (the full form persistent, the quick tier and the short-query forms one tile a program,
the warm frame's grid the generic launch's); every integer a frame passes per call (the batch ``n_seqs``
among them) never specialised; a model of the ring protocol over random programs, and its
negative controls (:mod:`persistent_rings_model`); the form compiles for sm90 offline with its options at
heads 64/128/256. sm90 GPU: against the float64 reference with every option and few programs (many tiles a
program, of several sequences: the rings' slots and phases, Q's hand-back and the V-row handshake carried
from tile to tile), ragged batches with empty contexts, one-token queries, rows past the grid and skipped
decode rows, more sequences than the tile-count table holds; the status report of a sequence with no tile
at the last query level; batches of 1, 16 and 3 through one compiled variant; the rows bit for bit the
one-tile form's whatever the program count.
"""

from __future__ import annotations

import random

import pytest
import torch
from conftest import DEVICE, compile_gluon_for_sm90, needs_sm90, poison
from launch_stubs import stub_prefix_gluon
from persistent_rings_model import Faults, ProtocolError, check
from pp_cases import FP8_E4M3, make_layout_case, problem_of, reference
from pp_gluon_compile import PP_COMPILE_HEAD
from test_pp_gluon_features import GPU_OPTIONS, _case, _kw, _nan_invisible_slots, record_gluon_kernel

from attn_reference import compare
from paged_kv_offsets import describe_kv_cache
from prefill_runtime import status
from prefix_prefill import explain, gluon_launch, launch, plan, prefix_prefill

HAS_GLUON = gluon_launch._gluon_fwd_kernel is not None
NARROW = plan.PERSISTENT_MAX_WINDOW - 1  # the widest causal left window of the persistent form


# ------------------------------------------------------------------------- CPU: the plan's rule
@pytest.mark.parametrize("layout", ["nhd", "hnd", "nhd-interleaved"])
def test_narrow_windows_run_persistent(layout):
    """Causal windows of 128 to ``PERSISTENT_MAX_WINDOW`` keys a row, and non-causal ones of at most that
    many keys both ways, take the persistent form (named in the reason); one key more, no window, or a
    side unbounded do not."""
    case = _case(layout)
    for opts, want in (
        (dict(left=127), True),
        (dict(left=NARROW, sinks=True, softcap_form=2, alibi=True, skip_decode=True, lse=True), True),
        (dict(left=NARROW + 1), False),
        ({}, False),
        (dict(causal=False, left=500, right=NARROW - 500), True),
        (dict(causal=False, left=500, right=NARROW - 499), False),
        (dict(causal=False, left=100), False),  # the right side unbounded
        (dict(causal=False, right=100), False),
    ):
        chosen = plan.plan(problem_of(case, arch="sm90", **opts))
        assert chosen.kernel.startswith("gluon-"), chosen.reason
        assert chosen.consts()["PERSISTENT"] is want, opts
        assert ("persistent" in chosen.reason) is want


def test_persistent_form_only_for_16_bit_caches():
    """An fp8 cache keeps the one-tile form (its converter partition has no persistent form) at a window the
    persistent form would take over a 16-bit cache (the narrowest the fp8 Gluon forms take); the split
    kernel has none."""
    left = plan.GLUON_MIN_WINDOW_FP8 - 1
    assert left < plan.PERSISTENT_MAX_WINDOW
    case = _case("nhd")
    k8, v8 = case.k_cache.to(FP8_E4M3), case.v_cache.to(FP8_E4M3)
    kc, vc = describe_kv_cache(k8, v8, "nhd")
    p = plan.make_problem(case.q, case.k, case.v, torch.empty_like(case.q), k8, v8, kc, vc, case.block_table,
                          arch="sm90", gluon=True, causal=True, left=left, right=-1, scale=0.1, alibi=False,
                          sinks=False, softcap_form=0, skip_decode=False, lse=False)  # fmt: skip
    chosen = plan.plan(p)
    assert chosen.kernel == "gluon-nhd" and chosen.consts()["CACHE_FP8"] and not chosen.consts()["PERSISTENT"]
    split = plan.plan(problem_of(_case("split"), arch="sm90", left=127))
    assert split.kernel == "gluon-split" and "PERSISTENT" not in split.consts()


def test_persistent_grid(monkeypatch):
    """A persistent launch's grid is one program a multiprocessor over the whole launch's tiles, never more
    programs than the one-tile grid's tiles: ``(min(sms, n_m * heads * batch), 1, 1)``."""
    for max_q, heads, batch, sms, want in ((300, 8, 2, 132, 48), (4096, 32, 8, 132, 132), (0, 2, 1, 132, 2),
                                           (129, 4, 3, 5, 5)):  # fmt: skip
        monkeypatch.setattr(gluon_launch, "_multiprocessors", lambda index, sms=sms: sms)
        assert gluon_launch._grid(128, max_q, heads, batch, None, True, 0) == (want, 1, 1)
    assert gluon_launch._grid(128, 300, 8, 2, None) == (3, 8, 2)


@pytest.mark.parametrize("layout", ["nhd", "hnd"])
def test_persistent_grids(layout, monkeypatch):
    """The full form of a persistent plan launches grid ``(programs, 1, 1)`` with ``PERSISTENT`` and the
    batch as ``n_seqs``; queries of at most 64 rows take the short-query form (one tile a program, not
    persistent, ``n_seqs`` None)."""
    rec = record_gluon_kernel(layout, monkeypatch)
    monkeypatch.setattr(gluon_launch, "_multiprocessors", lambda index: 3)
    for seqs, persistent in (([(40, 300), (0, 19)], True), ([(40, 5), (0, 19)], False)):
        case = _case(layout, seqs=seqs)
        kc, vc = describe_kv_cache(case.k_cache, case.v_cache, case.layout)
        problem = problem_of(case, arch="sm90", left=127)
        chosen = plan.plan(problem)
        assert chosen.consts()["PERSISTENT"]
        o = torch.empty_like(case.q)
        opts = gluon_launch.Options(0.0, 127)
        assert gluon_launch.launch(chosen, problem, case.q, case.k, case.v, o, case.k_cache, case.v_cache, kc,
                                   vc, case.block_table, case.cu_seqlens_q, case.seq_lens, case.max_query_len,
                                   0.1, None, opts=opts)  # fmt: skip
        grid, _, kw = rec.calls[-1]
        assert kw["PERSISTENT"] is persistent
        if persistent:
            assert grid == (3, 1, 1) and kw["n_seqs"] == 2
        else:
            assert grid[0] == 1 and (kw["IDLE_WG1"] or kw["PAIR_HEADS"]) and kw["n_seqs"] is None


@pytest.mark.parametrize("layout,left", [("nhd", 127), ("nhd", -1), ("split", -1)])
def test_per_call_integers_are_never_specialised(layout, left, monkeypatch):
    """Every integer a launch passes per call through its frame (``gluon_launch._per_call_plain``: strides,
    widths, ``max_query_len``, the persistent form's batch ``n_seqs``) is in its kernel's
    ``do_not_specialize``. A compiled variant serves every call of its key, and Triton specialises an
    integer argument of 1 into a constant (and marks a multiple of 16): specialised, a batch of 1 at the
    key's first call would make every later call compute one sequence."""
    from prefix_prefill.gluon_kernel import _gluon_fwd_kernel
    from prefix_prefill.gluon_split_kernel import _gluon_split_kernel

    kernel = _gluon_split_kernel if layout == "split" else _gluon_fwd_kernel
    rec = record_gluon_kernel(layout, monkeypatch)
    case = _case(layout, seqs=[(40, 300), (0, 19)])
    kc, vc = describe_kv_cache(case.k_cache, case.v_cache, case.layout)
    problem = problem_of(case, arch="sm90", left=left)
    chosen = plan.plan(problem)
    assert chosen.consts().get("PERSISTENT", False) is (left > 0)
    o = torch.empty_like(case.q)
    opts = gluon_launch.Options(0.0, left)
    assert gluon_launch.launch(chosen, problem, case.q, case.k, case.v, o, case.k_cache, case.v_cache, kc, vc,
                               case.block_table, case.cu_seqlens_q, case.seq_lens, case.max_query_len, 0.1,
                               torch.empty(4, case.q.shape[0]), opts=opts)  # fmt: skip
    _, args, kw = rec.calls[-1]
    bound = dict(zip(rec.arg_names, args, strict=False)) | kw  # (the rest passed by keyword)
    ints = {n for n in gluon_launch._per_call_plain(kw) if type(bound[n]) is int}
    assert {"stride_bt", "n_bt_cols", "max_query_len", "stride_lse_h"} <= ints
    assert ("n_seqs" in ints) is (left > 0)
    assert ints <= set(kernel.do_not_specialize), ints - set(kernel.do_not_specialize)


def test_quick_tier_is_one_tile(monkeypatch):
    """With the compile tiers on, the quick form (one 8-warp consumer partition) of a persistent plan runs
    one tile a program (its grid the one-tile grid)."""
    if not HAS_GLUON:
        pytest.skip("this Triton has no Gluon")
    case = _case("nhd", seqs=[(40, 300), (0, 19)])
    kc, vc = describe_kv_cache(case.k_cache, case.v_cache, "nhd")
    chosen = plan.plan(problem_of(case, arch="sm90", left=127))
    opts = gluon_launch.Options(0.0, 127)
    for full in (False, True):
        o = torch.empty_like(case.q)
        _, consts, grid = gluon_launch._nhd_call(
            chosen, 1, case.q, case.k, case.v, o, case.k_cache, case.v_cache, kc, vc, case.block_table,
            case.cu_seqlens_q, case.seq_lens, case.max_query_len, 0.1, None, None, opts, full, False,
        )  # fmt: skip
        assert consts["PERSISTENT"] is full and consts["ONE_CONSUMER"] is not full
        assert grid == ((1, 1, 1) if full else (3, 4, 2))  # (off CUDA: one multiprocessor)


def test_warm_frame_grid_is_persistent(monkeypatch):
    """A warm call of a persistent plan (through its frame) launches the generic launch's grid."""
    if not HAS_GLUON:
        pytest.skip("this Triton has no Gluon")
    stub = stub_prefix_gluon(monkeypatch, "_gluon_fwd_kernel", "_NHD")
    monkeypatch.setattr(gluon_launch, "_multiprocessors", lambda index: 5)
    case = _case("nhd", seqs=[(40, 300), (0, 19), (70, 130)])
    kc, vc = describe_kv_cache(case.k_cache, case.v_cache, "nhd")
    problem = problem_of(case, arch="sm90", left=127)
    chosen = plan.plan(problem)
    o = torch.empty_like(case.q)
    call = (case.q, case.k, case.v, o, case.k_cache, case.v_cache)
    index = (case.block_table, case.cu_seqlens_q, case.seq_lens, case.max_query_len, 0.1, None)
    opts = gluon_launch.Options(0.0, 127)
    key = gluon_launch.launch_key(chosen, problem, *index[:3], None, opts=opts)
    assert gluon_launch.launch(chosen, problem, *call, kc, vc, *index, key, opts=opts)  # through Triton
    assert stub.triton_calls[-1][0] == (5, 1, 1)
    assert gluon_launch.launch(chosen, problem, *call, kc, vc, *index, key, opts=opts)  # direct: a frame
    direct = stub.compiled.run.c_calls[-1][:3]
    assert gluon_launch.warm(chosen, key, *call, *index, opts=opts)
    assert stub.compiled.run.c_calls[-1][:3] == direct == [5, 1, 1]


# ------------------------------------------------------------------------- CPU: the protocol's model
def test_persistent_protocol_model():
    """The persistent form's ring and tile-slot protocol (:mod:`persistent_rings_model`: the four
    partitions, parity waits, copies landing at random later steps, partitions lagging at random) over
    random programs of skipped tiles and 1-5-block tiles with V-row fixes, 2 and 3 ring slots: no
    overwrite, no wrong read, no deadlock."""
    for seed in range(300):
        check(seed, tiles=10, stages=2 + seed % 2)


@pytest.mark.parametrize(
    "faults,caught,seeds,tiles",
    [(Faults(keep_last_v=True), "deadlock", 40, 10), (Faults(reset_base=True), "", 40, 10),
     (Faults(skip_q_empty=True), "", 40, 10), (Faults(one_slot=True), "tile slot 0 overwritten", 40, 10),
     (Faults(skip_free=True), "overwritten before ['v']", 200, 16)],
    ids=["last_v_kept", "rings_from_0", "q_without_q_empty", "one_tile_slot", "slot_without_free"],
)  # fmt: skip
def test_persistent_protocol_model_catches_faults(faults, caught, seeds, tiles):
    """Negative controls: the model catches each broken rule (the last V slot never released: the next
    tile's V producer waits forever; the rings counted from 0 at each tile; Q loaded before the consumers
    handed the last one back; one tile slot, which the K producer refills before the consumers read it;
    a slot refilled without waiting for the V producer's ``free``, caught when the V producer lags) as a
    deadlock, an overwrite or a wrong read within a few random programs."""
    errors = []
    for seed in range(seeds):
        try:
            check(seed, tiles=tiles, faults=faults)
        except ProtocolError as e:
            errors.append(str(e))
    assert errors and all(caught in e for e in errors), errors[:3]


# ------------------------------------------------------------------------- CPU: offline compiles
_COMPILE_SCRIPT = """
ALL = dict(HAS_LEFT=True, SOFTCAP=2, HAS_ALIBI=True, HAS_SINKS=True, SKIP_DECODE=True)
BOTH_WAYS = dict(CAUSAL=False, HAS_LEFT=True, HAS_RIGHT=True, HAS_ALIBI=True, HAS_SINKS=True)
for head, box, from_cache, lse, opts in [
    (128, 16, False, False, dict(HAS_LEFT=True)),
    (128, 128, True, True, ALL),
    (64, 16, False, True, dict(ALL, SOFTCAP=3, HAS_ALIBI=False, HAS_SINKS=False)),
    (256, 16, False, True, BOTH_WAYS),
    (128, 16, False, False, dict(HAS_LEFT=True, OUT_MAX=448.0)),
]:
    out = "fp8e4nv" if opts.get("OUT_MAX") else "bf16"
    if out != "bf16":
        opts = dict(opts)
    _, k = compile_nhd(head, box, from_cache, lse, out=out, PERSISTENT=True, **opts)
"""


@pytest.mark.compile_check
def test_persistent_forms_compile_for_sm90():
    """The persistent form compiles for sm90 (no GPU needed) at heads 64/128/256 with its options (k given
    or from the cache, every score option, both-way windows, an fp8 output), within one program's shared
    memory."""
    if not HAS_GLUON:
        pytest.skip("this Triton has no Gluon")
    shared, out = compile_gluon_for_sm90(PP_COMPILE_HEAD + _COMPILE_SCRIPT)
    assert len(shared) == 5 and max(shared) <= 227 * 1024, out


# ------------------------------------------------------------------------- GPU (sm90)
SEQS = [(2500, 600), (0, 300), (1700, 1), (129, 128), (37, 930), (900, 1), (0, 1), (4000, 257)]


def _run(case, kw, lse_heads, max_query_len=None):
    out = poison(torch.empty_like(case.q))
    lse = poison(torch.empty(lse_heads, case.q.shape[0], dtype=torch.float32, device=DEVICE))
    mql = case.max_query_len if max_query_len is None else max_query_len
    prefix_prefill(case.q, case.k, case.v, case.k_cache, case.v_cache, case.block_table, case.cu_seqlens_q,
                   case.seq_lens, mql, kv_layout=case.layout, out=out, return_lse=True, lse=lse,
                   validate=True, **kw)  # fmt: skip
    return out, lse


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("programs", [1, 2, 7, None], ids=["p1", "p2", "p7", "rule"])
@pytest.mark.parametrize(
    "layout,from_cache,head,dtype,page,option",
    [("nhd", False, 128, torch.bfloat16, 16, "window_sinks"),
     ("hnd", True, 128, torch.bfloat16, 544, "all"),
     ("nhd", False, 64, torch.float16, 1056, "softcap_window"),
     ("nhd-interleaved", False, 256, torch.bfloat16, 16, "noncausal_window"),
     ("nhd", True, 256, torch.float16, 16, "window"),
     ("hnd", False, 128, torch.bfloat16, 8, "window_sinks"),  # boxes of 8 rows
     ("nhd", True, 64, torch.float16, 24, "all")],
)  # fmt: skip
def test_gpu_persistent_against_reference(layout, from_cache, head, dtype, page, option, programs,
                                          monkeypatch):  # fmt: skip
    """The persistent form with few programs (1: every tile of the launch in one program) or one a
    multiprocessor, against the float64 reference (output and LSE), NaN in every slot no query may read,
    and bit for bit the one-tile form's rows (``PERSISTENT_MAX_WINDOW`` 0)."""
    monkeypatch.setenv("PREFIX_PREFILL_GLUON_TIERED", "0")
    if programs is not None:
        monkeypatch.setattr(gluon_launch, "_multiprocessors", lambda index: programs)
    case = make_layout_case(SEQS, num_heads=8, num_kv_heads=2, head_size=head, page=page, dtype=dtype,
                            device=DEVICE, layout=layout, kv_from_cache=from_cache)  # fmt: skip
    opts = GPU_OPTIONS[option]
    kw = _kw(opts, 8)
    ref, ref_lse = reference(case, return_lse=True, **kw)
    _nan_invisible_slots(case, opts.get("left", -1))
    args = (case.q, case.k, case.v, case.k_cache, case.v_cache, case.block_table, case.cu_seqlens_q,
            case.seq_lens, case.max_query_len)  # fmt: skip
    chosen = explain(*args, kv_layout=case.layout, **kw)
    assert chosen.kernel.startswith("gluon-") and chosen.consts()["PERSISTENT"], chosen.reason
    _check_against_reference_and_one_tile(case, kw, 8, ref, ref_lse, args, monkeypatch)


def _check_against_reference_and_one_tile(case, kw, lse_heads, ref, ref_lse, args, monkeypatch):
    """The persistent call (:func:`_run`) against the float64 reference ``ref`` (the output; the LSE within
    1e-3 where ``ref_lse`` is finite, infinite where it is), then bit for bit the one-tile form's rows
    (``PERSISTENT_MAX_WINDOW`` 0, which ``args``' plan then no longer takes)."""
    out, lse = _run(case, kw, lse_heads)
    c = compare(out, ref)
    assert c, c
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse.double()[finite] - ref_lse[finite]).abs().max().item() < 1e-3
    monkeypatch.setattr(plan, "PERSISTENT_MAX_WINDOW", 0)
    plan.plan.cache_clear()
    try:
        assert not explain(*args, kv_layout=case.layout, **kw).consts()["PERSISTENT"]
        one_out, one_lse = _run(case, kw, lse_heads)
    finally:
        plan.plan.cache_clear()
    assert torch.equal(out, one_out) and torch.equal(lse, one_lse)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("programs", [1, 3])
def test_gpu_persistent_rows_past_grid_and_skip_decode(programs, monkeypatch):
    """A ``max_query_len`` smaller than a sequence (its rows past the grid written as 0, the status
    reporting it) and skip_decode (one-token sequences left alone, their LSE -inf) in the persistent
    form, with few programs."""
    monkeypatch.setenv("PREFIX_PREFILL_GLUON_TIERED", "0")
    monkeypatch.setattr(gluon_launch, "_multiprocessors", lambda index: programs)
    case = _case("nhd", seqs=[(300, 1), (120, 700), (0, 1), (400, 190)], device=DEVICE)
    kw = dict(window=(200, -1), sinks=torch.randn(4, device=DEVICE))
    out = poison(torch.empty_like(case.q))
    lse = poison(torch.empty(4, case.q.shape[0], dtype=torch.float32, device=DEVICE))
    chosen = plan.plan(problem_of(case, skip_decode=True, lse=True, left=200, sinks=True))
    assert chosen.consts()["PERSISTENT"] and chosen.consts()["SKIP_DECODE"]
    kc, vc = describe_kv_cache(case.k_cache, case.v_cache, "nhd")
    launch.forward(case.q, case.k, case.v, out, case.k_cache, case.v_cache, kc, vc, case.block_table,
                   case.cu_seqlens_q, case.seq_lens, 300, skip_decode=True, lse=lse, **kw)  # fmt: skip
    ref = reference(case, **kw)
    starts = case.cu_seqlens_q.tolist()
    decode = [starts[0], starts[2]]
    assert torch.isnan(out[decode].float()).all() and (lse[:, decode] == float("-inf")).all()
    past = torch.zeros(case.q.shape[0], dtype=torch.bool, device=DEVICE)
    past[starts[1] + 384 : starts[2]] = True  # the second sequence's rows past the grid (3 tiles of 128)
    assert (out[past] == 0).all()
    keep = torch.ones_like(past)
    keep[decode] = False
    keep &= ~past
    c = compare(out[keep], ref[keep])
    assert c, c


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("programs", [3, None], ids=["p3", "rule"])
def test_gpu_persistent_many_sequences(programs, monkeypatch):
    """More sequences than the persistent form's tile-count table holds (``gluon_kernel.SEQ_TABLE``: the K
    warp reads the later ones' counts from global memory as its cursor passes them), of 0 to 300 new tokens
    on short contexts: against the float64 reference (output and LSE), and bit for bit the one-tile form's
    rows."""
    from prefix_prefill.gluon_kernel import SEQ_TABLE

    monkeypatch.setenv("PREFIX_PREFILL_GLUON_TIERED", "0")
    if programs is not None:
        monkeypatch.setattr(gluon_launch, "_multiprocessors", lambda index: programs)
    gen = random.Random(11)
    n_seqs = SEQ_TABLE.value + 77
    seqs = [(gen.choice([0, 16, 40]), gen.choice([0, 1, 3, 64, 129, 300])) for _ in range(n_seqs)]
    case = make_layout_case(seqs, num_heads=4, num_kv_heads=2, head_size=64, page=16, dtype=torch.bfloat16,
                            device=DEVICE, layout="nhd")  # fmt: skip
    kw = dict(window=(100, -1))
    args = (case.q, case.k, case.v, case.k_cache, case.v_cache, case.block_table, case.cu_seqlens_q,
            case.seq_lens, case.max_query_len)  # fmt: skip
    assert explain(*args, kv_layout=case.layout, **kw).consts()["PERSISTENT"]
    ref, ref_lse = reference(case, return_lse=True, **kw)
    _check_against_reference_and_one_tile(case, kw, 4, ref, ref_lse, args, monkeypatch)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("programs", [1, 3])
def test_gpu_persistent_reports_sequences_without_a_last_level_tile(programs, monkeypatch):
    """A block id past the cache in a sequence with no tile at the launch's last query level (no program
    takes one there; the one-tile form's program of that tile reports): ``status`` still says
    ``BLOCK_ID``, and the same call over the intact table reports nothing."""
    monkeypatch.setenv("PREFIX_PREFILL_GLUON_TIERED", "0")
    monkeypatch.setattr(gluon_launch, "_multiprocessors", lambda index: programs)
    case = _case("nhd", seqs=[(300, 400), (100, 50)], device=DEVICE)
    kw = dict(window=(200, -1))
    for bad in (False, True):
        table = case.block_table.clone()
        if bad:
            table[1, 2] = case.k_cache.shape[0] + 7  # sequence 1's third page (its 150 tokens take ten)
        st = torch.zeros(1, dtype=torch.int32, device=DEVICE)
        out = torch.empty_like(case.q)
        args = (case.q, case.k, case.v, case.k_cache, case.v_cache, table, case.cu_seqlens_q, case.seq_lens,
                case.max_query_len)  # fmt: skip
        assert explain(*args, kv_layout=case.layout, **kw).consts()["PERSISTENT"]
        prefix_prefill(*args, kv_layout=case.layout, out=out, status=st, **kw)
        assert int(st) == (status.BLOCK_ID if bad else 0), bad


# the cache blocks of every call of test_gpu_persistent_batch_sizes_share_a_variant (16 sequences of at
# most 500 tokens need 512 pages of 16)
_SHARED_BLOCKS = 600


@pytest.mark.gpu
@needs_sm90
def test_gpu_persistent_batch_sizes_share_a_variant(monkeypatch):
    """One call signature with batches of 1, 16 and 3 sequences in turn (the compiled variant of the
    first call, launched directly and through its frame for the later ones): each against the float64
    reference, NaN in every cache slot no query may read and in the output. A head count no other test
    uses keeps the signature new to the process, so its first call (batch 1) compiles the variant; every
    call's caches hold the same number of blocks, as an engine's do (the block count is part of the
    signature: caches of other sizes would each compile their own variant). On prefix-prefill 0.37.0,
    whose persistent form specialised ``n_seqs``, the batch of 16 computes its first sequence only."""
    monkeypatch.setenv("PREFIX_PREFILL_GLUON_TIERED", "0")
    gen = random.Random(5)
    kw = dict(window=(100, -1))
    before = set(gluon_launch._NHD._kernels)
    for batch in (1, 16, 3, 16, 1):
        seqs = [(gen.choice([0, 30, 200]), gen.choice([1, 70, 300])) for _ in range(batch)]
        case = make_layout_case(seqs, num_heads=6, num_kv_heads=3, head_size=64, page=16,
                                dtype=torch.bfloat16, device=DEVICE, layout="nhd",
                                num_blocks=_SHARED_BLOCKS)  # fmt: skip
        assert case.k_cache.shape[0] == _SHARED_BLOCKS
        args = (case.q, case.k, case.v, case.k_cache, case.v_cache, case.block_table, case.cu_seqlens_q,
                case.seq_lens, case.max_query_len)  # fmt: skip
        assert explain(*args, kv_layout=case.layout, **kw).consts()["PERSISTENT"]
        ref = reference(case, **kw)
        _nan_invisible_slots(case, 100)
        out = poison(torch.empty_like(case.q))
        prefix_prefill(*args, kv_layout=case.layout, out=out, **kw)
        c = compare(out, ref)
        assert c, (batch, c)
    assert len(set(gluon_launch._NHD._kernels) - before) == 1  # (one variant served every batch)
