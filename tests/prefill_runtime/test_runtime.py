"""prefill_runtime: the helpers both kernel packages share (first-launch setup, soft-capping form and
tanh, the LSE buffer)."""

from __future__ import annotations

import math
import threading
import types

import pytest
import torch
import triton
import triton.language as tl
from conftest import DEVICE

import prefill_runtime
import prefill_runtime.host as host
from prefill_runtime import (
    check_lse,
    hook_compiles,
    prime_triton,
    ptxas_launch_options,
    softcap_form,
)
from prefill_runtime.device import tanh


@pytest.mark.parametrize("pkg", ["window_prefill", "prefix_prefill"])
def test_softcap_form(monkeypatch, pkg):
    """Kernel SOFTCAP: 0 without soft-capping, 2 (hardware tanh) for NVIDIA GPU tensors of compute
    capability 7.5+, 1 (tanh through exp2) for anything else (the interpreter's CPU tensors, ROCm,
    Volta) or with the package's ``_FAST_TANH`` off (passed as ``fast``). The hardware form runs in
    the GPU soft-capping tests (bf16, both packages)."""
    mod = pytest.importorskip(f"{pkg}.interface")  # absent when only prefill-runtime is installed
    assert mod._FAST_TANH is True  # the packages' default
    gpu = types.SimpleNamespace(is_cuda=True, device="cuda:0")
    cpu = torch.zeros(1)
    cap = {"value": (9, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap["value"])
    assert softcap_form(0.0, cpu) == 0 and softcap_form(0.0, gpu) == 0
    assert softcap_form(30.0, cpu) == 1
    monkeypatch.setattr(torch.version, "hip", None)
    assert softcap_form(30.0, gpu, mod._FAST_TANH) == 2
    cap["value"] = (7, 0)
    assert softcap_form(30.0, gpu) == 1
    cap["value"] = (7, 5)
    assert softcap_form(30.0, gpu) == 2
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert softcap_form(30.0, gpu) == 1
    monkeypatch.setattr(torch.version, "hip", None)
    assert softcap_form(30.0, gpu, fast=False) == 1


@triton.jit
def _tanh_kernel(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < n
    tl.store(Y + offs, tanh(tl.load(X + offs, mask=m, other=0.0)), mask=m)


def test_device_tanh_exp2_form():
    """The exp2 form (the one the interpreter and AMD run) against torch.tanh: finite inputs within
    a few float32 ulps of 1, +-inf to exactly +-1, NaN stays NaN."""
    x = torch.cat(
        [torch.linspace(-20, 20, 101), torch.tensor([0.0, 1e-6, -1e-6, math.inf, -math.inf, math.nan])]
    )
    x = x.to(DEVICE)
    y = torch.full_like(x, 7.0)
    _tanh_kernel[(1,)](x, y, x.numel(), BLOCK=128)
    ref = torch.tanh(x.double().cpu())
    y = y.double().cpu()
    finite = torch.isfinite(x.cpu())
    assert float((y[finite] - ref[finite]).abs().max()) < 1e-6
    assert y[-3] == 1.0 and y[-2] == -1.0 and math.isnan(y[-1])


def test_prime_triton_once_and_never_raises(monkeypatch):
    """A speed hint: the first call marks the process primed and never raises (no GPU driver here);
    a second call returns at once, whichever package made the first."""
    monkeypatch.setattr(host, "_PRIMED", False)
    prime_triton()
    assert host._PRIMED
    prime_triton()  # no-op


def test_prime_triton_in_background(monkeypatch):
    """The opt-in early start: priming runs in a daemon thread; a first launch's prime_triton waits for
    it (here: it blocks until the thread's slow step ends), and a second early start is a no-op."""
    gate, order = threading.Event(), []

    def slow_probe(cap):  # the thread's last helper step, held until the test lets it go
        gate.wait(10)
        order.append("primed")
        return True

    monkeypatch.setattr(host, "_ptxas_has_register_usage_level", slow_probe)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(host, "_PRIMED", False)
    monkeypatch.setattr(host, "_PRIME_THREAD", None)
    thread = prefill_runtime.prime_triton_in_background()
    assert thread is not None and thread.daemon and host._PRIME_THREAD is thread
    assert prefill_runtime.prime_triton_in_background() is None  # started already
    threading.Timer(0.2, gate.set).start()
    prime_triton()  # the first launch: returns only once the early priming is done
    order.append("launch")
    assert order == ["primed", "launch"] and host._PRIMED and not thread.is_alive()
    monkeypatch.setattr(host, "_PRIME_THREAD", None)
    assert prefill_runtime.prime_triton_in_background() is None  # primed already


def test_prime_triton_probes_ptxas(monkeypatch):
    """Priming also runs ptxas_launch_options' one-time ptxas probe (for the current device), off the
    launch's critical path; not on ROCm."""
    seen = []
    monkeypatch.setattr(host, "_ptxas_has_register_usage_level", lambda cap: seen.append(cap) or True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(host, "_PRIMED", False)
    prime_triton()
    assert seen == [(9, 0)]
    monkeypatch.setattr(torch.version, "hip", "6.2")
    monkeypatch.setattr(host, "_PRIMED", False)
    prime_triton()
    assert seen == [(9, 0)]


def test_check_lse():
    """None without return_lse; a new float32 [heads, tokens] buffer with it; a given buffer checked
    (type, dtype, shape, device, token stride), each error naming the argument."""
    q = torch.zeros(5, 3, 16)
    assert check_lse(False, None, q) is None
    new = check_lse(True, None, q, "total_q")
    assert new.shape == (3, 5) and new.dtype == torch.float32 and new.is_contiguous()
    good = torch.empty(3, 5)
    assert check_lse(True, good, q) is good
    with pytest.raises(TypeError, match="return_lse must be a bool"):
        check_lse(1, None, q)
    with pytest.raises(ValueError, match="return_lse=True"):
        check_lse(False, good, q)
    with pytest.raises(TypeError, match=r"lse must be a torch.Tensor float32 \[num_heads, total_q\]"):
        check_lse(True, [0.0], q, "total_q")
    with pytest.raises(TypeError, match="float32"):
        check_lse(True, torch.empty(3, 5, dtype=torch.float16), q)
    with pytest.raises(ValueError, match="shape"):
        check_lse(True, torch.empty(5, 3), q)
    with pytest.raises(ValueError, match="lse is on meta"):
        check_lse(True, torch.empty(3, 5, device="meta"), q)
    with pytest.raises(ValueError, match="unit stride"):
        check_lse(True, torch.empty(5, 3).t(), q)


def test_ptxas_launch_options(monkeypatch):
    """``--register-usage-level`` reaches ptxas only for a level in 1..10 on an NVIDIA CUDA device whose
    Triton takes ``ptx_options`` and whose ptxas lists the flag; bad levels are a ValueError naming
    the argument; CPU tensors (the interpreter), ROCm and level 0 launch without options."""
    for bad in (-1, 11, "3", 2.0, None, True):
        with pytest.raises(ValueError, match="register_usage_level"):
            ptxas_launch_options(bad, torch.device("cpu"))
    assert ptxas_launch_options(0, torch.device("cpu")) == {}
    assert ptxas_launch_options(3, torch.device("cpu")) == {}
    gpu = torch.device("cuda", 0)
    assert ptxas_launch_options(0, gpu) == {}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert ptxas_launch_options(3, gpu) == {}
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(host, "_ptxas_has_register_usage_level", lambda cap: False)
    assert ptxas_launch_options(3, gpu) == {}
    monkeypatch.setattr(host, "_ptxas_has_register_usage_level", lambda cap: True)
    monkeypatch.setattr(host, "_user_ptxas_options", lambda: None)
    assert ptxas_launch_options(3, gpu) == {"ptx_options": "--register-usage-level=3"}
    # PTXAS_OPTIONS (Triton's default ptx_options, which a launch's ptx_options replaces) is kept
    monkeypatch.setattr(host, "_user_ptxas_options", lambda: "-lineinfo --warn-on-spills")
    assert ptxas_launch_options(3, gpu) == {
        "ptx_options": "-lineinfo --warn-on-spills --register-usage-level=3"
    }
    monkeypatch.setattr(host, "_user_ptxas_options", lambda: "--register-usage-level=8")
    assert ptxas_launch_options(3, gpu) == {}  # the user's own level wins


class _FakeJit:
    """Stands in for a JITFunction: ``_do_compile`` records its calls (and raises for key "boom")."""

    def __init__(self):
        self.calls = []

    def ASTSource(self, fn, signature, constexprs, attrs):
        return types.SimpleNamespace(fn=fn, signature=signature, constants=constexprs, attrs=attrs)

    def _do_compile(self, key, signature, device, constexprs, options, attrs, warmup):
        self.calls.append(key)
        if key == "boom":
            raise RuntimeError("compile failed")
        return f"kernel-{key}"


def test_hook_compiles(monkeypatch):
    """hook_compiles wraps one kernel's compile step, once: each compile starts the launcher build in a
    thread with that compile's signature, constants and attributes and waits for it before returning
    (also when the compile raises); not on ROCm, with its switch off or under Triton's async compile
    mode; the compile's answer and errors pass through untouched. Something without a compile step
    (the interpreter's kernels) is left alone."""
    monkeypatch.setattr(torch.version, "hip", None)
    built = []
    monkeypatch.setattr(host, "_build_launcher", lambda fn, sig, cx, at, tma: built.append((fn, sig, cx, at)))
    fake = _FakeJit()
    switch = {"on": True}
    assert hook_compiles(fake, lambda: switch["on"]) is True
    wrapped = fake._do_compile
    assert hook_compiles(fake, lambda: switch["on"]) is True and fake._do_compile is wrapped  # once
    sig, cx, attrs, opts = {"Q": "*bf16", "N": "i32"}, {("BLOCK",): 64}, {}, types.SimpleNamespace()
    assert fake._do_compile("a", sig, 0, cx, opts, attrs, False) == "kernel-a"
    assert built == [(fake, sig, cx, attrs)]  # joined before the compile step returned
    with pytest.raises(RuntimeError, match="compile failed"):
        fake._do_compile("boom", sig, 0, cx, opts, attrs, False)
    assert len(built) == 2
    switch["on"] = False
    assert fake._do_compile("c", sig, 0, cx, opts, attrs, warmup=False) == "kernel-c"
    monkeypatch.setattr(torch.version, "hip", "6.2")
    switch["on"] = True
    fake._do_compile("d", sig, 0, cx, opts, attrs, False)
    assert len(built) == 2 and fake.calls == ["a", "boom", "c", "d"]  # not c (switch off) nor d (ROCm)
    monkeypatch.setattr(torch.version, "hip", None)
    from triton.runtime import _async_compile

    token = _async_compile.active_mode.set(object())  # inside Triton's AsyncCompileMode
    try:
        fake._do_compile("e", sig, 0, cx, opts, attrs, False)
    finally:
        _async_compile.active_mode.reset(token)
    fake._do_compile("f", sig, 0, cx, opts, attrs, False)
    assert len(built) == 3 and fake.calls[-2:] == ["e", "f"]  # e: async compiles are left alone
    assert hook_compiles(object()) is False


def test_hook_compiles_llvm_o0(monkeypatch):
    """``llvm_o0_flag``: a compile whose named constexpr is true runs Triton's LLVM module optimisation at
    O0 (the level argument swapped, every other argument kept), one whose flag is false or absent at the
    level Triton asked for; calls outside a hooked compile (another kernel, another thread) pass through;
    the level is reset when the compile raises; an unknown flag name leaves the hook without it."""
    from triton._C.libtriton import llvm

    seen = []
    monkeypatch.setattr(llvm, "optimize_module", lambda mod, level, *a, **k: seen.append((level, a, k)))
    monkeypatch.setattr(host, "_build_launcher", lambda *a: None)
    o0, o3 = llvm.OPTIMIZE_O0, llvm.OPTIMIZE_O3

    class _OptJit(_FakeJit):
        arg_names = ("Q", "N", "BLOCK", "LLVM_O0")

        def _do_compile(self, key, signature, device, constexprs, options, attrs, warmup):
            llvm.optimize_module("mod", o3, "sm_90a", fast=True)  # as Triton's make_llir calls it
            if key == "boom":
                raise RuntimeError("compile failed")
            return key

    fake = _OptJit()
    assert hook_compiles(fake, lambda: False, llvm_o0_flag="LLVM_O0") is True
    sig, opts = {"Q": "*bf16", "N": "i32", "BLOCK": "constexpr", "LLVM_O0": "constexpr"}, None
    assert fake._do_compile("a", sig, 0, {(2,): 64, (3,): True}, opts, {}, False) == "a"
    fake._do_compile("b", sig, 0, {(2,): 64, (3,): False}, opts, {}, False)
    fake._do_compile("c", sig, 0, {(2,): 64}, opts, {}, False)
    with pytest.raises(RuntimeError):
        fake._do_compile("boom", sig, 0, {(2,): 64, (3,): True}, opts, {}, False)
    llvm.optimize_module("other", o3)  # not inside a hooked compile
    t = threading.Thread(target=lambda: llvm.optimize_module("thread", o3))
    t.start()
    t.join()
    assert [lv for lv, _, _ in seen] == [o0, o3, o3, o0, o3, o3]
    assert seen[0][1:] == (("sm_90a",), {"fast": True})
    plain = _OptJit()
    assert hook_compiles(plain, lambda: False, llvm_o0_flag="NOT_AN_ARG") is True
    plain._do_compile("d", sig, 0, {(3,): True}, opts, {}, False)
    assert seen[-1][0] == o3


def _free_wait_ptx(path: str, line: int) -> str:
    """PTX in Triton 3.6's form: a barrier Triton put before a free wait (line info ``line`` of
    ``path``), one before a wait at another line, one before a store, one before the free wait's line
    that is no wait."""
    wait = """	// begin inline asm
	{
	.reg .pred complete;
	waitLoop:
	mbarrier.try_wait.parity.shared.b64 complete, [%r1], %r2;
	@!complete bra.uni waitLoop;
	}
	// end inline asm
"""
    return f"""//
.visible .entry k()
{{
	.loc	3 {line} 5                         // gluon.py:{line}:5
	bar.sync 	0, 256;
{wait}	.loc	3 {line + 40} 5
	bar.sync 	0, 256;
{wait}	.loc	3 {line} 5
	bar.sync 	1, 128;
	st.shared.b32 	[%r3], %r4;
	.loc	3 {line} 5
	barrier.sync 	2;

{wait}	ret;
}}
	.file	1 "/elsewhere/kernel.py"
	.file	3 "{path}"
"""


def test_clear_noswizzle_base_offsets():
    """``clear_noswizzle_base_offsets`` clears bits 49-51 of exactly the decimal ``add``/``or`` constants
    that set a wgmma descriptor operand with swizzle field 0; swizzled descriptors, constants of other
    registers and PTX without wgmma stay as they are."""
    from prefill_runtime.host import clear_noswizzle_base_offsets

    def desc(base, lbo, sbo, mbo, swz):
        return base | (lbo >> 4) << 16 | (sbo >> 4) << 32 | mbo << 49 | swz << 62

    b0, b1 = desc(16, 128, 2048, 2, 0), desc(48, 128, 4096, 6, 0)
    a0, a1 = desc(2, 0, 1024, 3, 1), desc(0, 0, 0, 4, 0)
    ptx = (
        f"\tadd.s64 \t%rd5, %rd54, {a0};\n"
        f"\tadd.s64 \t%rd6, %rd55, {b0};\n"
        f"\tor.b64 \t%rd7, %rd55, {b1};\n"
        f"\tadd.s64 \t%rd9, %rd55, {a1};\n"  # not a wgmma operand: kept
        "\twgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%r1,%r2}, %rd5, %rd6, %p4, 1, 1, 0, 0;\n"
        "\twgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%r1,%r2}, %rd5, %rd7, %p4, 1, 1, 0, 0;\n"
    )
    out, n = clear_noswizzle_base_offsets(ptx)
    assert n == 2
    mask = ~(7 << 49)
    assert f"%rd6, %rd55, {b0 & mask};" in out and f"%rd7, %rd55, {b1 & mask};" in out
    assert f"%rd5, %rd54, {a0};" in out and f"%rd9, %rd55, {a1};" in out
    assert out.count("\n") == ptx.count("\n") and out.count("wgmma") == 2
    no_mma = ptx.replace("wgmma.mma_async", "mma.sync")
    assert clear_noswizzle_base_offsets(no_mma) == (no_mma, 0)


def test_drop_wait_barriers(tmp_path):
    """``drop_wait_barriers`` drops exactly the barriers whose line info is a free-wait line of the
    given file and whose next instruction is that wait's poll (any barrier form); barriers before other
    lines' waits or before other instructions stay; no line info or no such file: unchanged. The
    package's own ``free_wait`` has exactly one wait line."""
    path = str(tmp_path / "gluon.py")
    (tmp_path / "gluon.py").write_text("")
    ptx = _free_wait_ptx(path, 200)
    out, n = host.drop_wait_barriers(ptx, path, frozenset({200}))
    assert n == 2
    assert out.count("bar.sync \t0, 256;") == 1 and "bar.sync \t1, 128;" in out and "barrier.sync" not in out
    assert out.count("mbarrier.try_wait") == 3 and "st.shared" in out
    assert host.drop_wait_barriers(ptx, path, frozenset({201})) == (ptx, 0)
    assert host.drop_wait_barriers(ptx, str(tmp_path / "other.py"), frozenset({200})) == (ptx, 0)
    no_info = "\n".join(line for line in ptx.splitlines() if ".loc" not in line)
    assert host.drop_wait_barriers(no_info, path, frozenset({200}))[1] == 0
    own_path, own_lines = host.free_wait_lines()
    assert own_path.endswith("gluon.py") and len(own_lines) == 1
    with open(own_path) as f:
        assert "mbarrier.wait(" in f.read().splitlines()[next(iter(own_lines)) - 1]


def test_hook_compiles_free_waits(monkeypatch):
    """``free_waits_flag``: the PTX of a compile whose named constexpr is true goes through
    ``drop_wait_barriers`` (``_FREE_WAITS.dropped`` counts), a compile whose flag is false or absent,
    and calls outside a hooked compile, get Triton's PTX untouched; AMDGCN is never touched."""
    from triton._C.libtriton import llvm

    path, lines = host.free_wait_lines()
    ptx = _free_wait_ptx(path, next(iter(lines)))
    monkeypatch.setattr(llvm, "translate_to_asm", lambda src, *a, **k: src)
    monkeypatch.setattr(host, "_build_launcher", lambda *a: None)
    got = []

    class _AsmJit(_FakeJit):
        arg_names = ("Q", "N", "FREE_WAITS")

        def _do_compile(self, key, signature, device, constexprs, options, attrs, warmup):
            got.append(llvm.translate_to_asm(key, "nvptx64-nvidia-cuda", "sm_90a", "", [], True, False))
            return key

    fake = _AsmJit()
    assert hook_compiles(fake, lambda: False, free_waits_flag="FREE_WAITS") is True
    sig = {"Q": "*bf16", "N": "i32", "FREE_WAITS": "constexpr"}
    tptx = ptx.replace("//\n", "//\n.target sm_90a\n", 1)
    fake._do_compile(tptx, sig, 0, {(2,): True}, None, {}, False)
    assert host._FREE_WAITS.dropped == 2 and got[-1].count("bar.sync") == 2
    fake._do_compile(tptx, sig, 0, {(2,): False}, None, {}, False)
    fake._do_compile(tptx, sig, 0, {}, None, {}, False)
    assert got[-2] == got[-1] == tptx
    amdgcn = tptx.replace(".target sm_90a", ".amdgcn_target")
    fake._do_compile(amdgcn, sig, 0, {(2,): True}, None, {}, False)
    assert got[-1] == amdgcn
    assert llvm.translate_to_asm(tptx) == tptx and not getattr(host._FREE_WAITS, "value", False)


def test_compile_tiers(monkeypatch):
    """``CompileTiers``: a key's first call launches the quick form and compiles the full form once in
    a background thread; calls after it finished launch the full form (inside a graph capture only once
    it was launched outside one); a failed background compile keeps the quick form; a failing quick
    launch raises to the caller and compiles nothing; ``finish`` waits, ``pending`` counts."""
    capturing = []
    monkeypatch.setattr(host, "_capturing", lambda: bool(capturing))
    gate = threading.Event()
    seen = []

    def launch_for(name, fail_full=False, fail_quick=False):
        def launch(full, warmup):
            if warmup:
                gate.wait(10)
                if fail_full:
                    raise RuntimeError("compile failed")
            elif not full and fail_quick:
                raise RuntimeError("launch failed")
            seen.append((name, full, warmup))

        return launch

    tiers = prefill_runtime.CompileTiers()
    assert tiers.run("a", launch_for("a")) is False and tiers.pending() == 1
    assert tiers.run("a", launch_for("a")) is False  # still compiling: quick again, no second compile
    assert tiers.finish(timeout=0.01) is False
    gate.set()
    assert tiers.finish(timeout=10) is True and tiers.pending() == 0
    capturing.append(1)
    assert tiers.run("a", launch_for("a")) is False  # compiled, never launched: quick inside a capture
    capturing.clear()
    assert tiers.run("a", launch_for("a")) is True
    capturing.append(1)
    assert tiers.run("a", launch_for("a")) is True
    capturing.clear()
    assert seen == [("a", False, False), ("a", False, False), ("a", True, True), ("a", False, False),
                    ("a", True, False), ("a", True, False)]  # fmt: skip
    assert tiers.run("b", launch_for("b", fail_full=True)) is False
    tiers.finish(timeout=10)
    assert tiers.run("b", launch_for("b", fail_full=True)) is False and tiers.pending() == 0
    with pytest.raises(RuntimeError):
        tiers.run("c", launch_for("c", fail_quick=True))
    assert tiers.pending() == 0 and tiers.run("c", launch_for("c")) is False
    tiers.finish(timeout=10)
    tiers.clear()
    assert tiers.run("a", launch_for("a")) is False
    tiers.finish(timeout=10)


def test_build_launcher_never_raises(monkeypatch):
    """The launcher build is a speed hint: no driver (this machine), a descriptor signature or any
    error returns quietly; a descriptor signature never reaches the driver."""
    seen = []
    fake = _FakeJit()
    monkeypatch.setattr(
        fake, "ASTSource", lambda *a: seen.append(a) or (_ for _ in ()).throw(RuntimeError("x"))
    )
    host._build_launcher(fake, {"K": "tensordesc<bf16[64, 128]>"}, {}, {})
    assert seen == []
    host._build_launcher(fake, {"K": "*bf16"}, {}, {})
    assert len(seen) == 1


def test_build_launcher_tma_descriptors(monkeypatch):
    """A kernel that lowers every descriptor argument to a TMA descriptor (Gluon on Hopper,
    ``tma_descriptors=True``) gets its launcher built with one metadata entry per descriptor argument
    (Triton 3.6's launcher source only asks whether each is present); hook_compiles passes the flag on."""
    import sys

    import triton.runtime.driver  # noqa: F401  (the module: triton.runtime's own `driver` shadows it)

    drv = sys.modules["triton.runtime.driver"]
    metas = []
    active = types.SimpleNamespace(launcher_cls=lambda src, meta: metas.append(meta))
    monkeypatch.setattr(drv, "driver", types.SimpleNamespace(active=active))
    fake = _FakeJit()
    monkeypatch.setattr(fake, "ASTSource", lambda *a: "src", raising=False)
    sig = {"Q": "tensordesc<bf16[64, 128]>", "O": "*bf16", "K": "tensordesc<bf16[128, 128]>"}
    host._build_launcher(fake, sig, {}, {}, tma_descriptors=True)
    assert len(metas) == 1 and metas[0].tensordesc_meta == [{}, {}]
    host._build_launcher(fake, {"O": "*bf16"}, {}, {}, tma_descriptors=True)
    assert len(metas) == 2 and not hasattr(metas[1], "tensordesc_meta")
    monkeypatch.setattr(torch.version, "hip", None)
    seen = []
    monkeypatch.setattr(host, "_build_launcher", lambda fn, sig, cx, at, tma: seen.append(tma))
    hooked = _FakeJit()
    assert hook_compiles(hooked, tma_descriptors=True)
    hooked._do_compile("a", sig, 0, {}, types.SimpleNamespace(), {}, False)
    assert seen == [True]


def test_user_ptxas_options(monkeypatch):
    """PTXAS_OPTIONS as Triton reads it (None when unset or empty)."""
    from triton import knobs

    monkeypatch.setattr(knobs.nvidia, "ptxas_options", None, raising=False)
    assert host._user_ptxas_options() is None
    monkeypatch.setattr(knobs.nvidia, "ptxas_options", "-lineinfo", raising=False)
    assert host._user_ptxas_options() == "-lineinfo"


def test_ptxas_probe_never_raises():
    """The probe answers a bool whatever this machine has (no ptxas, an old Triton, a CPU-only
    install): a missing tool means launching without the flag, never an error."""
    host._ptxas_has_register_usage_level.cache_clear()
    assert host._ptxas_has_register_usage_level((9, 0)) in (True, False)


def test_version():
    assert prefill_runtime.__version__ == "0.10.0"


def test_gluon_module_is_separate():
    """``import prefill_runtime`` does not import Gluon; ``prefill_runtime.gluon`` (and paged-kv-offsets'
    ``gluon`` module) import where this Triton has Gluon and hold the kernels' device functions."""
    import importlib
    import subprocess
    import sys

    code = "import sys, prefill_runtime, paged_kv_offsets; print('triton.experimental.gluon' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr[-2000:]
    try:
        importlib.import_module("triton.experimental.gluon.language.nvidia.hopper")
    except Exception:
        pytest.skip("this Triton has no Gluon")
    g = importlib.import_module("prefill_runtime.gluon")
    assert all(hasattr(g, name) for name in ("consumer", "softmax_step", "zero_v_rows"))
    assert hasattr(importlib.import_module("paged_kv_offsets.gluon"), "page_row")


_COLD_COMPILE_CHILD = r"""
import glob, json, os, sys
import torch
import prefill_runtime.host as host
import prefix_prefill.interface as pi
import window_prefill.interface as wi
from prefix_prefill import prefix_prefill
from window_prefill import window_prefill
mode = sys.argv[1]
for mod in (pi, wi):
    mod._PREBUILD_LAUNCHER = mode != "off"
if mode == "wrong":  # negative control: prebuild for a signature the compile does not have (i32 -> i64)
    build = host._build_launcher
    widen = lambda sig: {n: "i64" if t == "i32" else t for n, t in sig.items()}
    host._build_launcher = lambda fn, sig, cx, at, *rest: build(fn, widen(sig), cx, at, *rest)
torch.manual_seed(0)
dev, dt, page, lens, ctx = "cuda", torch.bfloat16, 16, [37, 5], [50, 0]
cu = torch.tensor([0, 37, 42], dtype=torch.int32, device=dev)
q, k, v = (torch.randn(42, h, 64, device=dev, dtype=dt) for h in (4, 2, 2))
# prefix: context from a paged NHD cache plus the new rows (k given)
seq = [c + n for c, n in zip(ctx, lens)]
pages = [-(-s // page) for s in seq]
kc = torch.randn(sum(pages) + 1, page, 2, 64, device=dev, dtype=dt)
vc = torch.randn_like(kc)
bt = torch.zeros(2, max(pages), dtype=torch.int32, device=dev)
nxt = 1
for b, n in enumerate(pages):
    bt[b, :n] = torch.arange(nxt, nxt + n, dtype=torch.int32)
    nxt += n
sl = torch.tensor(seq, dtype=torch.int32, device=dev)
o1 = prefix_prefill(q, k, v, kc, vc, bt, cu, sl, max(lens))
o2 = window_prefill(q, k, v, cu, max(lens), causal=True, window=(7, -1))
torch.cuda.synchronize()
# the Triton kernels and (sm90: prefix head 64 runs it) the Gluon ones, whose launchers are prebuilt too
jits = [mod._fwd_kernel for mod in (pi, wi)] + [m._gluon_fwd_kernel for m in (pi, wi) if m._gluon_fwd_kernel]
caches = [cache for jit in jits for cache in jit.device_caches.values()]
kernels = [c for cache in caches for c in cache[0].values()]
root = os.environ["TRITON_CACHE_DIR"]
print(json.dumps({
    "finite": bool(torch.isfinite(o1).all() and torch.isfinite(o2).all()),
    "kernels": len(kernels),
    "launchers": len(glob.glob(os.path.join(root, "*", "__triton_launcher*"))),
}))
"""


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["on", "off", "wrong"])
def test_gpu_launcher_prebuild(tmp_path, mode):
    """On an empty Triton cache, each kernel package's first launch (a fresh process): with the
    launcher built beside the compile ("on"), Triton's launch finds that very launcher: one launcher
    module per compiled kernel, as without the prebuild ("off"). Negative control ("wrong"): a
    prebuild for another signature leaves a second, unused launcher per kernel, so the count sees a
    prebuild that misses. On sm90 the prefix call runs the Gluon kernel, whose descriptor launcher the
    prebuild guesses (``tma_descriptors``). Answers themselves are checked by the suites."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-c", _COLD_COMPILE_CHILD, mode], env=env, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["finite"] and got["kernels"] == 2, got
    assert got["launchers"] == (2 * got["kernels"] if mode == "wrong" else got["kernels"]), got


def test_gluon_applies():
    """The conditions both Gluon kernels share: sm90, 16-bit, head 64/128/256, no sinks or soft-capping,
    a positive scale; each one alone turns the answer to False."""
    q = torch.empty(8, 2, 128, dtype=torch.bfloat16)
    ok = dict(sinks=None, softcap=0.0, scale=0.1)
    assert prefill_runtime.gluon_applies(q, "sm90", **ok)
    assert not prefill_runtime.gluon_applies(q, "sm80", **ok)
    assert not prefill_runtime.gluon_applies(q, "interpreter", **ok)
    assert not prefill_runtime.gluon_applies(q.float(), "sm90", **ok)
    assert not prefill_runtime.gluon_applies(torch.empty(8, 2, 96, dtype=torch.float16), "sm90", **ok)
    assert not prefill_runtime.gluon_applies(q, "sm90", **{**ok, "sinks": torch.zeros(2)})
    assert not prefill_runtime.gluon_applies(q, "sm90", **{**ok, "softcap": 30.0})
    assert not prefill_runtime.gluon_applies(q, "sm90", **{**ok, "scale": 0.0})


def test_gluon_token_rows_and_descriptor():
    """TMA descriptors of the Gluon kernels: ``[tokens, heads, D]`` seen as ``[tokens, heads * D]``; None
    for strides TMA cannot take (heads not D apart, a feature stride, unaligned rows)."""
    try:
        import triton.experimental.gluon.nvidia.hopper  # noqa: F401
    except Exception:
        pytest.skip("this Triton has no Gluon")
    packed = torch.randn(10, 6, 64, dtype=torch.float16)  # q, k, v heads of one packed tensor
    q = packed[:, :4]
    d = prefill_runtime.gluon_token_rows(q, 64)
    assert (
        list(d.shape) == [10, 4 * 64] and list(d.strides) == [6 * 64, 1] and list(d.block_shape) == [64, 64]
    )
    assert d.layout.swizzle_byte_width == 128 and d.base is q
    assert (
        prefill_runtime.gluon_token_rows(torch.randn(10, 2, 128, dtype=torch.bfloat16)[:, :, :64], 64) is None
    )
    assert (
        prefill_runtime.gluon_token_rows(torch.randn(10, 2, 64, 2, dtype=torch.float16)[..., 0], 64) is None
    )
    assert prefill_runtime.gluon_token_rows(torch.randn(10, 1, 36, dtype=torch.float16)[:, :, :4], 16) is None
    cache = torch.randn(5, 16, 2, 128, dtype=torch.bfloat16)
    c = prefill_runtime.gluon_descriptor(cache, [5 * 16, 2 * 128], 2 * 128, 16, 128)
    assert list(c.shape) == [80, 256] and list(c.block_shape) == [16, 128]


def test_gluon_try_launch():
    """A launch that raises: False and one RuntimeWarning naming the package (the caller then runs its
    Triton kernel); one that runs: True."""
    ran = []
    assert prefill_runtime.gluon_try_launch(lambda: ran.append(1), "pkg") is True and ran == [1]

    def boom():
        raise RuntimeError("no such Gluon op")

    with pytest.warns(RuntimeWarning, match="pkg: the Gluon kernel failed"):
        assert prefill_runtime.gluon_try_launch(boom, "pkg") is False
