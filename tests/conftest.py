"""Shared test fixtures.

On a machine without a GPU the kernels run under the Triton interpreter on CPU tensors: we set
``TRITON_INTERPRET=1`` before anything imports triton. On a GPU machine tests use ``cuda``.
"""

from __future__ import annotations

import os

_HAS_GPU_NODE = os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/kfd")
if not _HAS_GPU_NODE:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1"
DEVICE = "cuda" if ON_GPU else "cpu"
# The interpreter multiplies bf16 bit patterns in tl.dot, so bf16 is a GPU-only dtype.
DTYPES = [torch.float16, torch.float32] + ([torch.bfloat16] if ON_GPU else [])


def pytest_collection_modifyitems(config, items):
    if ON_GPU:
        return
    skip = pytest.mark.skip(reason="needs a GPU (running under the Triton interpreter)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device() -> str:
    return DEVICE


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _fresh_signatures():
    """Each test starts with both packages' tables of call signatures empty, as a new process does: a
    test that changes what a plan depends on (the architecture, Gluon's availability, a kernel stand-in)
    gets its own first calls. The calls within a test repeat signatures as an engine does."""
    from prefix_prefill import signatures
    from window_prefill import api

    signatures.SEEN.clear()
    api.SEEN.clear()
    yield


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill an output buffer with NaN (or the max value for integer/fp8 types) before a kernel run,
    so any element the kernel forgets to write shows up in the comparison."""
    if t.dtype.is_floating_point and t.element_size() >= 2:
        return t.fill_(float("nan"))
    t.view(torch.uint8).fill_(0x7F)  # (0x7F: NaN in both fp8 formats)
    return t


# The Gluon kernels (both packages) run on Hopper only.
IS_SM90 = ON_GPU and torch.version.hip is None and torch.cuda.get_device_capability() == (9, 0)
needs_sm90 = pytest.mark.skipif(not IS_SM90, reason="the Gluon kernel runs on sm90 only")


# Head of the scripts that compile a Gluon kernel for sm90 in a fresh interpreter (see
# compile_gluon_for_sm90): the imports and compile_sm90(fn, sig, consts) -> (source, compiled kernel).
GLUON_COMPILE_PREAMBLE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource


def compile_sm90(fn, sig, consts, aligned=(), num_warps=4, llvm_o0=False):
    # aligned: pointer arguments the launcher would specialise as 16-byte aligned (tt.divisibility 16);
    # llvm_o0: the kernel's LLVM_O0 constexpr (shipped: off), and LLVM at O0 as hook_compiles runs it
    import prefill_runtime.host as host

    if "LLVM_O0" in fn.arg_names:
        consts = {**consts, "LLVM_O0": llvm_o0}
    # parameters left out keep their defaults (the candidates' constexprs, absent descriptors)
    consts = {**{p.name: p.default for p in fn.params if p.has_default and p.name not in sig}, **consts}
    sig = {**sig, **{name: "constexpr" for name in consts if name not in sig}}
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in aligned}
    src = GluonASTSource(fn, sig, consts, attrs)
    o0 = consts.get("LLVM_O0") is True and host._llvm_level_wrapper()
    host._LLVM_LEVEL.value = host._LLVM_O0 if o0 else None
    # K_CM (the split kernel's chunk-major K ring): the PTX through clear_noswizzle_base_offsets, as
    # hook_compiles runs it (prints "cleared N")
    host._DESC_FIX.value = consts.get("K_CM") is True and host._asm_wrapper()
    host._DESC_FIX.cleared = 0
    try:
        kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    finally:
        host._LLVM_LEVEL.value = None
        host._DESC_FIX.value = False
    print("cleared", host._DESC_FIX.cleared)
    ptx = kernel.asm["ptx"]
    assert "wgmma.mma_async" in ptx, "no wgmma in the PTX"
    print("shared", kernel.metadata.shared)
    # the consumers' turns at the tensor cores: 256-thread named barriers 14 and 15 (check_turns)
    print("turns", consts.get("HEAD_DIM"), int(consts.get("PERSISTENT") is True),
          *(ptx.count(f"{op} {b}, 256;") for op in ("bar.sync", "bar.arrive") for b in (14, 15)))
    # the prefix kernels' one-tile forms' longest-first order reads the batch size (check_order), but for
    # the short-query forms with SKIP_DECODE
    short = any(consts.get(n) for n in ("IDLE_WG1", "PAIR_HEADS", "PACK"))
    ordered = (fn.fn.__module__.startswith("prefix_prefill.") and consts.get("PERSISTENT") is not True
               and not (short and consts.get("SKIP_DECODE")))  # fmt: skip
    print("order", int(ordered), ptx.count("%nctaid.z"))
    return src, kernel
"""


def compile_gluon_for_sm90(script: str) -> tuple[list[int], str]:
    """Run ``GLUON_COMPILE_PREAMBLE + script`` in a subprocess (no GPU needed; a fresh interpreter, since
    this one's interpreter mode swaps Triton's library functions); it must succeed, and every kernel
    takes the turns :func:`check_turns` expects. Returns the shared memory (bytes) of every kernel it
    compiled through ``compile_sm90``, and its stdout."""
    import subprocess
    import sys

    env = {**os.environ, "TRITON_INTERPRET": "0"}
    code = GLUON_COMPILE_PREAMBLE + script
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    shared = [int(line.split()[1]) for line in r.stdout.splitlines() if line.startswith("shared ")]
    check_turns(r.stdout)
    check_order(r.stdout)
    return shared, r.stdout


def check_tanh_forms(out: str) -> None:
    """A compile script's lines ``tanh <SOFTCAP form> <count of tanh.approx.f32 in the PTX>``: the
    hardware tanh is in the forms that ask for it (2, and 3 with the pinned max) and in no other."""
    lines = [line.split() for line in out.splitlines() if line.startswith("tanh ")]
    assert lines, out
    for _, form, count in lines:
        assert (int(count) > 0) is (form in ("2", "3")), (form, count)


def check_order(out: str) -> None:
    """A compile script's lines ``order <one-tile prefix form> <reads of %nctaid.z in the PTX>`` (one a
    kernel ``compile_sm90`` compiled): the prefix kernels' one-tile forms (a program a query tile or a
    short query's sequence, not ``PERSISTENT``) read the batch size, to take their sequences longest
    first (``prefix_prefill.gluon_kernel._longest_first``), but for the short-query forms with
    ``SKIP_DECODE`` (launch order: their batches may be mostly decode rows, whose programs return at
    once); the persistent forms (their own tile order) and window-prefill's kernels read none."""
    lines = [line.split()[1:] for line in out.splitlines() if line.startswith("order ")]
    assert lines, out
    for ordered, reads in lines:
        assert (int(reads) > 0) is (ordered == "1"), (ordered, reads)


def check_turns(out: str) -> None:
    """A compile script's lines ``turns <HEAD_DIM> <PERSISTENT> <bar.sync 14> <bar.sync 15> <bar.arrive
    14> <bar.arrive 15>`` (256-thread named barriers in the PTX, one line a kernel ``compile_sm90``
    compiled): the persistent forms up to head 128 take turns at the tensor cores
    (``prefill_runtime.gluon.takes_turns``), consumer 0 waiting on barrier 14 and handing over on 15,
    consumer 1 the other way round, each barrier with as many arrivals as waits in the code; head 256
    and every other form take none."""
    lines = [line.split()[1:] for line in out.splitlines() if line.startswith("turns ")]
    for head, persistent, *counts in lines:
        sync14, sync15, arrive14, arrive15 = map(int, counts)
        if persistent == "1" and head != "None" and int(head) <= 128:
            assert sync14 > 0 and sync15 > 0, (head, counts)
            assert (sync14, sync15) == (arrive14, arrive15), (head, counts)
        else:
            assert sync14 == sync15 == arrive14 == arrive15 == 0, (head, persistent, counts)


def refuse_gluon(monkeypatch: pytest.MonkeyPatch, iface) -> list[dict]:
    """Turn a package interface's Gluon kernel on (``iface._GLUON``) and replace its ``_gluon_launch`` by
    one that refuses every call: the returned list holds each offered call's keyword arguments, and the
    Triton kernel answers (the routing tests, which run on the CPU)."""
    offered: list[dict] = []

    def offer(*args, **kwargs):
        offered.append(kwargs)
        return False

    monkeypatch.setattr(iface, "_gluon_launch", offer)
    monkeypatch.setattr(iface, "_GLUON", True)
    return offered


def compiled_variants(jit_fn) -> int:
    """How many variants of a ``@triton.jit`` / ``@gluon.jit`` kernel this process compiled (over every
    device); skips the calling test on a Triton that does not keep per-device caches."""
    caches = getattr(jit_fn, "device_caches", None)
    if not caches:
        pytest.skip("this triton has no device_caches")
    return sum(len(entry[0]) for entry in caches.values())


def bench_module(name: str):
    """``bench/<name>.py`` loaded by path as a private module (``_bench_<name>``). A script that puts
    bench/ first on ``sys.path`` (whose prefix_prefill.py / window_prefill.py would shadow the packages)
    leaves it as it was."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    saved = list(sys.path)
    sys.modules[spec.name] = mod  # (dataclasses look their module up while it loads)
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path[:] = saved
        sys.modules.pop(spec.name, None)
    return mod
