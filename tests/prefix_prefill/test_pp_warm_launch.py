"""The warm launch path on the CPU: a compiled key's call straight to its variant, the descriptors over
the KV caches reused per (key, cache pointers), and the C launcher called directly on Triton 3.6.

The compiled kernel is a stand-in whose launcher records its arguments; the machine is faked into an
sm90 where a test needs the plan's Gluon kernels. What must hold: a warm call gets descriptors of its
own tensors (a new cache pointer never reuses another cache's descriptors; the new tokens' rows are
described per call), the key of a call signature is one small int, the caches' descriptors are the same
objects while the caches are, and :class:`prefill_runtime.compiled_launch.RawLauncher` hands the C
launcher exactly what Triton 3.6's own launcher would.
"""

from __future__ import annotations

import pytest
import torch
from pp_cases import make_case, problem_of

import prefill_runtime.compiled_launch as cl
from paged_kv_offsets import describe_kv_cache
from prefix_prefill import gluon_launch, plan

HAS_GLUON = gluon_launch._gluon_split_kernel is not None


class _Run:
    """A compiled variant's launcher stand-in (no scratch, no descriptor expansion): records calls."""

    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid = launch_pdl = False

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, *args) -> None:
        self.calls.append(args)


class _Compiled:
    def __init__(self) -> None:
        self.run, self.function, self.packed_metadata = _Run(), 7, (4, 1, 0)


class _Jit:
    """A ``@gluon.jit`` stand-in: ``kernel[grid](...)`` records the call and returns one compiled kernel."""

    def __init__(self, names) -> None:
        self.arg_names, self.compiled, self.triton_calls = names, _Compiled(), []

    def __getitem__(self, grid):
        def call(*args, **kwargs):
            self.triton_calls.append((grid, args, kwargs))
            return self.compiled

        return call


@pytest.fixture
def warm_split(monkeypatch):
    """The split kernel replaced by a stand-in launched directly (full form from the first call)."""
    if not HAS_GLUON:
        pytest.skip("this Triton has no Gluon")
    jit = _Jit(gluon_launch._gluon_split_kernel.arg_names)
    monkeypatch.setattr(cl, "_SUPPORTED", True)
    monkeypatch.setattr(gluon_launch, "_gluon_split_kernel", jit)
    monkeypatch.setattr(gluon_launch, "_SPLIT", cl.CompiledLaunches(jit))
    monkeypatch.setattr(gluon_launch, "_CACHE_DESCS", {})
    monkeypatch.setenv("PREFIX_PREFILL_GLUON_TIERED", "0")
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 0, raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return jit


def _split_case(**kw):
    return make_case([(40, 5), (0, 19), (70, 130)], num_heads=4, num_kv_heads=2, head_size=128, page=16,
                     dtype=torch.bfloat16, device="cpu", layout="split", **kw)  # fmt: skip


def _call(case, key=None):
    kc, vc = describe_kv_cache(case.k_cache, case.v_cache, case.layout)
    problem = problem_of(case, arch="sm90", gluon=True)
    chosen = plan.plan(problem)
    o = torch.empty_like(case.q)
    if key is None:
        key = gluon_launch.launch_key(
            chosen, problem, case.block_table, case.cu_seqlens_q, case.seq_lens, None
        )
    ok = gluon_launch.launch(chosen, problem, case.q, case.k, case.v, o, case.k_cache, case.v_cache, kc, vc,
                             case.block_table, case.cu_seqlens_q, case.seq_lens, case.max_query_len, 0.1,
                             None, key)  # fmt: skip
    assert ok
    return key


def _descs(args) -> list:
    return [a for a in args if isinstance(a, cl.Descriptor)]


def test_warm_call_describes_its_own_tensors(warm_split):
    """The first call goes through Triton; the next ones of the key launch the variant directly, with
    the caches' descriptors reused while the caches are the same and made anew for another cache (same
    geometry, other memory), and the new tokens' rows described per call."""
    a = _split_case()
    key = _call(a)
    assert isinstance(key, int) and len(warm_split.triton_calls) == 1
    _call(a, key)
    _call(a, key)
    first, second = warm_split.compiled.run.calls
    assert len(warm_split.triton_calls) == 1  # the two warm calls did not go through Triton
    d1, d2 = _descs(first), _descs(second)
    cache_bases = (a.k_cache, a.v_cache)
    shared = [d for d in d1 if d.base is a.k_cache or d.base is a.v_cache]
    assert shared and all(any(d is e for e in d2) for d in shared)  # the caches': the same objects
    rows = [d for d in d1 if not any(d.base is t for t in cache_bases)]
    assert rows and all(d.base is a.q or d.base is a.k or d.base is a.v for d in rows)
    assert not any(d is e for d in rows for e in d2)  # the new tokens' rows: described per call
    b = _split_case()  # an engine's next layer: other caches and tokens, the same signature
    _call(b, key)
    third = warm_split.compiled.run.calls[-1]
    assert len(warm_split.triton_calls) == 1
    bases = [d.base for d in _descs(third)] + [t for t in third if isinstance(t, torch.Tensor)]
    assert not any(t is a.k_cache or t is a.v_cache or t is a.q for t in bases)
    assert any(t is b.k_cache for t in bases) and any(t is b.v_cache for t in bases)
    assert any(t is b.q for t in bases)
    assert third[3] == first[3] and third[4] == 7  # the stream, the variant's function


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

    kernel = _Compiled()
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
    kernel = _Compiled()
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
