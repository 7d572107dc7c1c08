"""The warm launch path on the CPU: a compiled key's calls straight to its variant, then through a
frame (:class:`prefill_runtime.compiled_launch.Frame`) per (key, cache pointers), and the C launcher
called directly on Triton 3.6.

The compiled kernel is a stand-in whose C launcher records its arguments (the raw launcher built for it
the way :meth:`RawLauncher.of` builds one on Triton 3.6, so these run on any Triton); the machine is
faked into an sm90 where a test needs the plan's Gluon kernels. What must hold: a frame's call hands the
C launcher exactly what the generic direct launch of the same call would (new tokens, batch, lengths,
block table: all per call), a call over other caches never uses another cache's frame, the key of a call
signature is one small int, and :class:`RawLauncher` hands the C launcher exactly what Triton 3.6's own
launcher would.
"""

from __future__ import annotations

import math

import pytest
import torch
from launch_stubs import Compiled, pointers, stub_prefix_gluon
from pp_cases import make_case, problem_of

import prefill_runtime.compiled_launch as cl
from paged_kv_offsets import describe_kv_cache
from prefill_runtime.plan import packed_tokens
from prefix_prefill import gluon_launch, plan

HAS_GLUON = gluon_launch._gluon_split_kernel is not None


@pytest.fixture
def warm_split(monkeypatch):
    """The split kernel replaced by a stand-in launched directly (full form from the first call), with a
    raw launcher over the stand-in's C launcher."""
    if not HAS_GLUON:
        pytest.skip("this Triton has no Gluon")
    return stub_prefix_gluon(monkeypatch, "_gluon_split_kernel", "_SPLIT")


_BLOCKS = 48  # every case's cache: one geometry (one call signature)


def _split_case(seqs=((40, 5), (0, 19), (70, 130)), **kw):
    pages = sum(math.ceil((c + n) / 16) for c, n in seqs)
    return make_case(list(seqs), num_heads=4, num_kv_heads=2, head_size=128, page=16, dtype=torch.bfloat16,
                     device="cpu", layout="split", spare_blocks=_BLOCKS - pages, **kw)  # fmt: skip


def _call(case, key=None, generic=False, o=None, scale=0.1, status=None):
    """Launch ``case`` (its key computed when None) into ``o`` (a new buffer when None), with ``status``;
    ``generic``: through the direct launch without a frame (what a frame's call must equal). Returns the
    key."""
    kc, vc = describe_kv_cache(case.k_cache, case.v_cache, case.layout)
    problem = problem_of(case, arch="sm90", gluon=True)
    chosen = plan.plan(problem)
    o = torch.empty_like(case.q) if o is None else o
    if key is None:
        key = gluon_launch.launch_key(
            chosen, problem, case.block_table, case.cu_seqlens_q, case.seq_lens, None, status
        )
    args = (chosen, problem, case.q, case.k, case.v, o, case.k_cache, case.v_cache, kc, vc, case.block_table,
            case.cu_seqlens_q, case.seq_lens, case.max_query_len, scale, None)  # fmt: skip
    if generic:  # (the compiled variant's key: a short-query form's for short queries)
        batch = case.seq_lens.shape[0]
        vkey = gluon_launch._variant(chosen, key, case.max_query_len, case.q, case.k_cache, batch)
        gluon_launch._warm(gluon_launch._SPLIT, gluon_launch._split_call, chosen, vkey, *args[2:], status)
    elif not gluon_launch.warm(chosen, key, *args[2:8], *args[10:14], scale, None, status):  # a repeated call
        assert gluon_launch.launch(*args, key, status)
    return key


def test_frame_call_is_the_generic_launch(warm_split):
    """The first call goes through Triton, the second launches the variant directly and keeps a frame over
    its caches; a frame's call for new tokens, batch, lengths and block table over those caches hands
    the C launcher exactly the arguments the generic direct launch hands it for that call. A batch of
    queries no longer than 64 rows runs a short-query form, a variant of its own:
    its first call goes through Triton once (here two query heads a KV head: queries of at most 32 rows
    pack both into the first warpgroup's rows, ``PACK``, over a grid of KV heads; longer ones, off CUDA
    with no multiprocessor count to weigh the batch against, the paired-heads form, ``PAIR_HEADS``, over
    a grid of head pairs)."""
    a = _split_case()
    key = _call(a)
    assert isinstance(key, int) and len(warm_split.triton_calls) == 1
    _call(a, key)
    c_calls = warm_split.compiled.run.c_calls
    assert len(c_calls) == 1 and len(warm_split.triton_calls) == 1  # direct: the C launcher, not Triton
    for seqs, scale in (([(40, 5), (0, 19), (70, 130)], 0.1), ([(3, 1)], 0.1),
                        ([(0, 64), (100, 37), (5, 5), (0, 1)], 0.1), ([(3, 1)], 0.25)):  # fmt: skip
        b = _split_case(seqs)
        b.k_cache, b.v_cache = a.k_cache, a.v_cache  # an engine's next step on the same layer
        o = torch.empty_like(b.q)
        n_triton = len(warm_split.triton_calls)
        for _ in range(3):  # (another scale or form: the same key, another frame, made by an early call)
            _call(b, key, o=o, scale=scale)
        short = b.max_query_len <= 64
        packed = b.max_query_len <= packed_tokens(64, 2)  # (both heads of a KV head in one warpgroup's rows)
        if len(warm_split.triton_calls) > n_triton:  # (a form's first call: through Triton, its constexprs)
            kw = warm_split.triton_calls[-1][2]
            assert kw["PAIR_HEADS"] == (short and not packed) and kw["PACK"] == (2 if packed else 0)
            assert kw["IDLE_WG1"] is packed
        framed = c_calls[-1]
        assert not any(isinstance(x, torch.Tensor) for x in framed)  # a frame's call: pointers only
        _call(b, key, generic=True, o=o, scale=scale)
        assert framed == pointers(c_calls[-1])
        assert framed[0] == -(-b.max_query_len // 128) and framed[2] == len(seqs)
        assert framed[1] == (2 if short else 4)  # KV heads (packed), head pairs, or heads
        maps = [x for x in framed if isinstance(x, tuple) and x[:1] == ("map",)]
        assert any(m[1] == b.q.data_ptr() for m in maps) and any(m[1] == b.k.data_ptr() for m in maps)
    assert len(warm_split.triton_calls) == 3  # the full form, the packed and the paired-heads forms
    st = torch.zeros(1, dtype=torch.int32)  # with status=: another variant, whose frame passes each call's
    skey = _call(a, status=st)
    for seqs in ([(3, 1)], [(0, 64), (100, 37)]):
        b = _split_case(seqs)
        b.k_cache, b.v_cache = a.k_cache, a.v_cache
        o = torch.empty_like(b.q)
        for _ in range(3):
            _call(b, skey, o=o, status=st)
        framed = c_calls[-1]
        assert st.data_ptr() in framed
        _call(b, skey, generic=True, o=o, status=st)
        assert framed == pointers(c_calls[-1])


def test_frame_is_per_cache(warm_split):
    """A call over other caches (an engine's next layer: same signature) gets a frame of its own: its C
    arguments describe its caches, never the first layer's."""
    a, b = _split_case(), _split_case()
    key = _call(a)
    for _ in range(3):
        _call(a, key)
    _call(b, key)
    _call(b, key)
    last = warm_split.compiled.run.c_calls[-1]  # (a cache by TMA as its map's base, else as a pointer)
    ptrs = {x[1] if isinstance(x, tuple) else x for x in last if isinstance(x, (tuple, int))}
    assert b.k_cache.data_ptr() in ptrs and b.v_cache.data_ptr() in ptrs
    assert a.k_cache.data_ptr() not in ptrs and a.v_cache.data_ptr() not in ptrs
    assert len(gluon_launch._SPLIT._frames) == 2


def test_launch_key_ids_are_never_reused(monkeypatch):
    """A key's id names one (kernel, problem, plan, spec): the table, when full, starts over with new ids."""
    if not HAS_GLUON:
        pytest.skip("this Triton has no Gluon")
    monkeypatch.setattr(gluon_launch, "_KEY_IDS", {})
    monkeypatch.setattr(gluon_launch, "_KEY_IDS_MAX", 2)
    case = _split_case()
    problem = problem_of(case, arch="sm90", gluon=True)
    chosen = plan.plan(problem)
    args = (case.block_table, case.cu_seqlens_q, case.seq_lens)
    a = gluon_launch.launch_key(chosen, problem, *args, None)
    assert gluon_launch.launch_key(chosen, problem, *args, None) == a
    lse = torch.empty(4, case.q.shape[0])
    b = gluon_launch.launch_key(chosen, problem, *args, lse)
    assert b != a
    c = gluon_launch.launch_key(chosen, problem, *args, lse.double())  # the table was full: it starts over
    assert c not in (a, b)
    again = gluon_launch.launch_key(chosen, problem, *args, None)
    assert again not in (a, b, c)


def _fake_tensordesc_arg(arg, meta):
    """Stands in for Triton's ``make_tensordesc_arg`` (which needs a GPU): a fresh map object a call."""
    return [("map", arg.base.data_ptr(), tuple(arg.shape), meta["id"]), *arg.shape, *arg.strides]


def test_raw_launcher_passes_what_triton_passes(monkeypatch):
    """Triton 3.6: the C launcher gets from :class:`RawLauncher` exactly what Triton's own
    ``CudaLauncher.__call__`` hands it (grid, stream, function, cooperative / PDL flags, no scratch, the
    metadata, the descriptors expanded in place), and a reused :class:`Descriptor` keeps its expansion."""
    import triton

    if not triton.__version__.startswith("3.6."):
        pytest.skip("RawLauncher is verified for Triton 3.6 only")
    from triton.backends.nvidia import driver

    monkeypatch.setattr(driver, "make_tensordesc_arg", _fake_tensordesc_arg)
    signature = {"A": "tensordesc<bf16[64, 128],x>", "p": "*bf16", "n": "i32",
                 "B": "tensordesc<bf16[8, 64],y>", "C": "constexpr"}  # fmt: skip
    got: list[tuple] = []

    class _Launcher:  # what Triton 3.6's CudaLauncher holds, its __call__ Triton's own
        global_scratch_size = profile_scratch_size = 0
        global_scratch_align = profile_scratch_align = num_ctas = 1
        launch_cooperative_grid, launch_pdl = False, True
        __call__ = driver.CudaLauncher.__call__

    kernel = Compiled()
    kernel.run = _Launcher()
    metas = [{"id": 0}, {"id": 1}]
    kernel.run.launch = driver.wrap_handle_tensordesc(lambda *a: got.append(a), signature, metas)
    raw = cl.RawLauncher.of(kernel)
    assert raw is not None
    t, c = torch.zeros(64, 128), torch.zeros(8, 64)
    fresh = cl.Descriptor(t, [64, 128], [128, 1])
    kept = cl.Descriptor(c, [8, 64], [64, 1])
    args = (fresh, t, 5, kept, 3)
    kernel.run(2, 3, 4, 99, kernel.function, kernel.packed_metadata, None, None, None, *args)
    raw((2, 3, 4), 99, kernel.function, args)
    assert len(got) == 2 and got[0] == got[1]
    assert kept.tma is not None and fresh.tma is not None
    raw((2, 3, 4), 99, kernel.function, args)
    assert got[2][-6] is got[1][-6]  # B's map: kept on the descriptor, not filled again


def test_raw_launcher_only_on_verified_triton(monkeypatch):
    """Outside Triton 3.6, or with scratch buffers, or a launcher of another shape, there is no raw
    launcher (the variant runs through ``kernel.run``)."""
    kernel = Compiled()
    monkeypatch.setattr(cl, "_triton_36", lambda: False)
    assert cl.RawLauncher.of(kernel) is None
    monkeypatch.setattr(cl, "_triton_36", lambda: True)
    kernel.run.launch = max  # a C launcher (no closure): a kernel without descriptor arguments
    assert cl.RawLauncher.of(kernel) is not None
    kernel.run.global_scratch_size = 64
    assert cl.RawLauncher.of(kernel) is None
    kernel.run.global_scratch_size = 0

    def other(*args):  # a closure of another shape
        return kernel, args

    kernel.run.launch = other
    assert cl.RawLauncher.of(kernel) is None
