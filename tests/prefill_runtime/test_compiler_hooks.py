"""prefill_runtime.compiler_hooks: hook_compiles (launcher prebuild, compile options), the llvm wrappers,
the PTX pass, and that none of it reaches a Triton kernel that is not hooked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import types

import pytest
import torch
import triton

import prefill_runtime.compiler_hooks as hooks
from prefill_runtime import clear_noswizzle_base_offsets, hook_compiles


class _Fn:
    """An LLVM function as ``llvm.module.get_functions()`` lists it."""

    def __init__(self, name: str, declaration: bool = False):
        self.name = name
        self._declaration = declaration

    def is_declaration(self) -> bool:
        return self._declaration


class _Module:
    """An LLVM module defining ``names`` (and declaring an intrinsic)."""

    def __init__(self, *names: str):
        self.functions = [_Fn(n) for n in names] + [_Fn("llvm.nvvm.read.ptx.sreg.tid.x", True)]

    def get_functions(self):
        return self.functions


class _FakeJit:
    """Stands in for a JITFunction named ``name``: ``_do_compile`` records its key and, as Triton's
    does, calls ``self.compile`` (an instance attribute) with its source; ``body(src)`` is what that
    compile does (default: return the key, raise for key "boom")."""

    arg_names = ("Q", "N", "FLAG")

    def __init__(self, name: str = "ours", body=None):
        self.name = self.__name__ = name
        self.calls: list[object] = []
        self.body = body or _key_or_raise
        self.compile = lambda src, target=None, options=None: self.body(src)

    def ASTSource(self, fn, signature, constexprs, attrs):
        return types.SimpleNamespace(
            fn=fn, name=fn.name, signature=signature, constants=constexprs, attrs=attrs, key=None
        )

    def _do_compile(self, key, signature, device, constexprs, options, attrs, warmup):
        self.calls.append(key)
        src = self.ASTSource(self, signature, constexprs, attrs)
        src.key = key
        return self.compile(src, target=None, options={})


_SIG = {"Q": "*bf16", "N": "i32", "FLAG": "constexpr"}


def _key_or_raise(src):
    if src.key == "boom":
        raise RuntimeError("compile failed")
    return src.key


def test_hook_compiles_prebuilds_launcher(monkeypatch):
    """hook_compiles wraps one kernel's compile step, once: each compile starts the launcher build in a
    thread with that compile's signature, constants and attributes and waits for it before returning
    (also when the compile raises); not on ROCm, with its switch off or under Triton's async compile
    mode; the compile's answer and errors pass through untouched. Something without a compile step
    (the interpreter's kernels) is left alone."""
    monkeypatch.setattr(torch.version, "hip", None)
    built = []
    monkeypatch.setattr(
        hooks, "_build_launcher", lambda fn, sig, cx, at, tma: built.append((fn, sig, cx, at))
    )
    fake = _FakeJit()
    switch = {"on": True}
    assert hook_compiles(fake, lambda: switch["on"]) is True
    wrapped = fake._do_compile
    assert hook_compiles(fake, lambda: switch["on"]) is True and fake._do_compile is wrapped  # once
    sig, cx, attrs, opts = {"Q": "*bf16", "N": "i32"}, {(2,): 64}, {}, types.SimpleNamespace()
    assert fake._do_compile("a", sig, 0, cx, opts, attrs, False) == "a"
    assert built == [(fake, sig, cx, attrs)]  # joined before the compile step returned
    with pytest.raises(RuntimeError, match="compile failed"):
        fake._do_compile("boom", sig, 0, cx, opts, attrs, False)
    assert len(built) == 2
    switch["on"] = False
    assert fake._do_compile("c", sig, 0, cx, opts, attrs, warmup=False) == "c"
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
    """``llvm_o0_flag``: the compile of the hooked kernel whose named constexpr is true runs Triton's
    LLVM module optimisation at O0 (the level swapped, every other argument kept) for its own module
    only: a module of another kernel in that compile window, a compile whose flag is false or absent,
    a call outside any hooked compile and one in another thread run at the level Triton asked for; the
    level is reset when the compile raises; an unknown flag name leaves the kernel's compile as it is.
    Not gated by the Triton version (O0 changes speed, not results)."""
    from triton._C.libtriton import llvm

    seen = []
    monkeypatch.setattr(llvm, "optimize_module", lambda mod, level, *a, **k: seen.append((level, a, k)))
    monkeypatch.setattr(hooks, "_build_launcher", lambda *a: None)
    monkeypatch.setattr(triton, "__version__", "9.9.0")  # outside the allowlist
    o0, o3 = llvm.OPTIMIZE_O0, llvm.OPTIMIZE_O3

    def body(src):
        llvm.optimize_module(_Module("ours"), o3, "sm_90a", fast=True)  # as Triton's make_llir calls it
        llvm.optimize_module(_Module("other"), o3)  # not this kernel's module
        if src.key == "boom":
            raise RuntimeError("compile failed")
        return src.key

    fake = _FakeJit(body=body)
    assert hook_compiles(fake, lambda: False, llvm_o0_flag="FLAG") is True
    assert fake._do_compile("a", _SIG, 0, {(2,): True}, None, {}, False) == "a"
    fake._do_compile("b", _SIG, 0, {(2,): False}, None, {}, False)
    fake._do_compile("c", _SIG, 0, {}, None, {}, False)
    with pytest.raises(RuntimeError):
        fake._do_compile("boom", _SIG, 0, {(2,): True}, None, {}, False)
    llvm.optimize_module(_Module("ours"), o3)  # not inside a hooked compile
    t = threading.Thread(target=lambda: llvm.optimize_module(_Module("ours"), o3))
    t.start()
    t.join()
    assert [lv for lv, _, _ in seen] == [o0, o3, o3, o3, o3, o3, o0, o3, o3, o3]
    assert seen[0][1:] == (("sm_90a",), {"fast": True})
    plain = _FakeJit(body=body)
    assert hook_compiles(plain, lambda: False, llvm_o0_flag="NOT_AN_ARG") is True
    plain._do_compile("d", _SIG, 0, {(2,): True}, None, {}, False)
    assert [lv for lv, _, _ in seen[-2:]] == [o3, o3]


def _desc(base, lbo, sbo, mbo, swz):
    """A wgmma matrix descriptor with these fields (byte offsets, base offset, swizzle mode)."""
    return base | (lbo >> 4) << 16 | (sbo >> 4) << 32 | mbo << 49 | swz << 62


def _wgmma_ptx(entry: str = "ours") -> tuple[str, int, int]:
    """PTX setting two no-swizzle B descriptors with base offsets and a swizzled A one, entry ``entry``;
    returns it and the two no-swizzle constants."""
    b0, b1 = _desc(16, 128, 2048, 2, 0), _desc(48, 128, 4096, 6, 0)
    a0, a1 = _desc(2, 0, 1024, 3, 1), _desc(0, 0, 0, 4, 0)
    ptx = (
        f".target sm_90a\n.visible .entry {entry}(\n)\n"
        f"\tadd.s64 \t%rd5, %rd54, {a0};\n"
        f"\tadd.s64 \t%rd6, %rd55, {b0};\n"
        f"\tor.b64 \t%rd7, %rd55, {b1};\n"
        f"\tadd.s64 \t%rd9, %rd55, {a1};\n"  # not a wgmma operand: kept
        "\twgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%r1,%r2}, %rd5, %rd6, %p4, 1, 1, 0, 0;\n"
        "\twgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%r1,%r2}, %rd5, %rd7, %p4, 1, 1, 0, 0;\n"
    )
    return ptx, b0, b1


def test_clear_noswizzle_base_offsets():
    """``clear_noswizzle_base_offsets`` clears bits 49-51 of exactly the decimal ``add``/``or`` constants
    that set a wgmma descriptor operand with swizzle field 0; swizzled descriptors, constants of other
    registers and PTX without wgmma stay as they are."""
    ptx, b0, b1 = _wgmma_ptx()
    out, n = clear_noswizzle_base_offsets(ptx)
    assert n == 2
    mask = ~(7 << 49)
    assert f"%rd6, %rd55, {b0 & mask};" in out and f"%rd7, %rd55, {b1 & mask};" in out
    a0, a1 = _desc(2, 0, 1024, 3, 1), _desc(0, 0, 0, 4, 0)
    assert f"%rd5, %rd54, {a0};" in out and f"%rd9, %rd55, {a1};" in out
    assert out.count("\n") == ptx.count("\n") and out.count("wgmma") == 2
    no_mma = ptx.replace("wgmma.mma_async", "mma.sync")
    assert clear_noswizzle_base_offsets(no_mma) == (no_mma, 0)


@pytest.fixture
def asm_calls(monkeypatch):
    """Triton's ``llvm.translate_to_asm`` replaced by the identity (its input is the PTX), and the
    launcher prebuild off; yields the list of what the hooked compiles' asm step returned."""
    from triton._C.libtriton import llvm

    monkeypatch.setattr(llvm, "translate_to_asm", lambda src, *a, **k: src)
    monkeypatch.setattr(hooks, "_build_launcher", lambda *a: None)
    got: list[str] = []

    def body(src):  # the hooked kernel's compile: its PTX, then another kernel's in the same window
        got.append(llvm.translate_to_asm(src.key, "nvptx64-nvidia-cuda", "sm_90a", "", [], True, False))
        got.append(llvm.translate_to_asm(src.key.replace("entry ours", "entry other")))
        return src.key

    yield got, body


_PASS_CASES = [("3.6.0", None, True), ("3.8.0", None, False), ("3.8.0", "1", True), ("3.6.0", "0", True)]


@pytest.mark.parametrize("version, forced, applies", _PASS_CASES)
def test_hook_compiles_ptx_pass(monkeypatch, asm_calls, version, forced, applies):
    """``desc_fix_flag``: the PTX of the hooked kernel's compile whose named constexpr is true goes
    through ``clear_noswizzle_base_offsets`` (count in ``_DESC_FIX.cleared``) on an allowlisted Triton or
    with PREFILL_GLUON=1, never on another version; PREFILL_GLUON=0 leaves it on (it only stops the
    Gluon kernels from being offered). Another kernel's PTX in the same compile window, a compile whose
    flag is false or absent, AMDGCN, and calls outside a hooked compile get Triton's output untouched."""
    from triton._C.libtriton import llvm

    got, body = asm_calls
    monkeypatch.setattr(triton, "__version__", version)
    if forced is None:
        monkeypatch.delenv("PREFILL_GLUON", raising=False)
    else:
        monkeypatch.setenv("PREFILL_GLUON", forced)
    desc_ptx, b0, b1 = _wgmma_ptx()
    fix = _FakeJit(body=body)
    assert hook_compiles(fix, lambda: False, desc_fix_flag="FLAG")
    hooks._DESC_FIX.cleared = None
    fix._do_compile(desc_ptx, _SIG, 0, {(2,): True}, None, {}, False)
    if applies:
        assert hooks._DESC_FIX.cleared == 2 and got[0] != desc_ptx
        assert str(b0 & ~(7 << 49)) in got[0] and str(b1 & ~(7 << 49)) in got[0]
    else:
        assert got[0] == desc_ptx and hooks._DESC_FIX.cleared is None
    assert got[1] == desc_ptx.replace("entry ours", "entry other")
    got.clear()
    for flags in ({(2,): False}, {}):
        fix._do_compile(desc_ptx, _SIG, 0, flags, None, {}, False)
    assert got[0::2] == [desc_ptx] * 2
    amdgcn = desc_ptx.replace(".target sm_90a", ".amdgcn_target")
    fix._do_compile(amdgcn, _SIG, 0, {(2,): True}, None, {}, False)
    assert got[-2] == amdgcn
    assert llvm.translate_to_asm(desc_ptx) == desc_ptx and not getattr(hooks._DESC_FIX, "value", False)


def test_compile_passes_scope(monkeypatch):
    """``compile_passes`` holds for its thread and its entry point only, and restores what was there
    before (nested use, exceptions); ``kernel=None`` (tools that call triton.compile) matches any."""
    from triton._C.libtriton import llvm

    monkeypatch.setattr(llvm, "translate_to_asm", lambda src, *a, **k: src)
    ptx, _, _ = _wgmma_ptx("k1")
    other = ptx.replace("entry k1", "entry k2")
    seen = []
    with hooks.compile_passes(desc_fix=True, kernel="k1"):
        assert llvm.translate_to_asm(ptx) != ptx and llvm.translate_to_asm(other) == other
        t = threading.Thread(target=lambda: seen.append(llvm.translate_to_asm(ptx)))
        t.start()
        t.join()
        with pytest.raises(KeyError), hooks.compile_passes(kernel="k2"):
            assert llvm.translate_to_asm(ptx) == ptx
            raise KeyError
        assert llvm.translate_to_asm(ptx) != ptx  # the outer state is back
    assert seen == [ptx] and llvm.translate_to_asm(ptx) == ptx
    with hooks.compile_passes(desc_fix=True):
        assert llvm.translate_to_asm(other) != other


def test_hook_compiles_options_reach_every_compile_of_the_kernel(monkeypatch, asm_calls):
    """The options hold for the hooked kernel's compile also when Triton runs it in another thread (its
    async compile mode: the instance's ``compile`` is wrapped) and when a new device's binder has put
    the unwrapped ``compile`` back just before the compile (the ``_do_compile`` thread's state)."""
    got, body = asm_calls
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    monkeypatch.delenv("PREFILL_GLUON", raising=False)
    desc_ptx, b0, _ = _wgmma_ptx()
    fixed = str(b0 & ~(7 << 49))
    raw = _FakeJit(body=body).compile  # Triton's compile, as a device's binder sets it

    class _Async(_FakeJit):  # _do_compile hands the compile to an executor thread
        def _do_compile(self, key, signature, device, constexprs, options, attrs, warmup):
            src = self.ASTSource(self, signature, constexprs, attrs)
            src.key = key
            box = []
            t = threading.Thread(target=lambda: box.append(self.compile(src, target=None, options={})))
            t.start()
            t.join()
            return box[0]

    class _Rebound(_FakeJit):  # another device's binder resets compile right before the compile
        def _do_compile(self, key, signature, device, constexprs, options, attrs, warmup):
            self.compile = raw
            return super()._do_compile(key, signature, device, constexprs, options, attrs, warmup)

    for cls in (_Async, _Rebound):
        fake = cls(body=body)
        assert hook_compiles(fake, lambda: False, desc_fix_flag="FLAG")
        got.clear()
        fake._do_compile(desc_ptx, _SIG, 0, {(2,): True}, None, {}, False)
        assert fixed in got[0] and got[1] == desc_ptx.replace("entry ours", "entry other"), cls.__name__


def test_build_launcher_never_raises(monkeypatch):
    """The launcher build is a speed hint: no driver (this machine), a descriptor signature or any
    error returns quietly; a descriptor signature never reaches the driver."""
    seen = []
    fake = _FakeJit()
    monkeypatch.setattr(
        fake, "ASTSource", lambda *a: seen.append(a) or (_ for _ in ()).throw(RuntimeError("x"))
    )
    hooks._build_launcher(fake, {"K": "tensordesc<bf16[64, 128]>"}, {}, {})
    assert seen == []
    hooks._build_launcher(fake, {"K": "*bf16"}, {}, {})
    assert len(seen) == 1


def test_build_launcher_tma_descriptors(monkeypatch):
    """A kernel that lowers every descriptor argument to a TMA descriptor (Gluon on Hopper,
    ``tma_descriptors=True``) gets its launcher built with one metadata entry per descriptor argument
    (Triton 3.6's launcher source only asks whether each is present); hook_compiles passes the flag on."""
    import triton.runtime.driver  # noqa: F401  (the module: triton.runtime's own `driver` shadows it)

    drv = sys.modules["triton.runtime.driver"]
    metas = []
    active = types.SimpleNamespace(launcher_cls=lambda src, meta: metas.append(meta))
    monkeypatch.setattr(drv, "driver", types.SimpleNamespace(active=active))
    fake = _FakeJit()
    monkeypatch.setattr(fake, "ASTSource", lambda *a: "src", raising=False)
    sig = {"Q": "tensordesc<bf16[64, 128]>", "O": "*bf16", "K": "tensordesc<bf16[128, 128]>"}
    hooks._build_launcher(fake, sig, {}, {}, tma_descriptors=True)
    assert len(metas) == 1 and metas[0].tensordesc_meta == [{}, {}]
    hooks._build_launcher(fake, {"O": "*bf16"}, {}, {}, tma_descriptors=True)
    assert len(metas) == 2 and not hasattr(metas[1], "tensordesc_meta")
    monkeypatch.setattr(torch.version, "hip", None)
    seen = []
    monkeypatch.setattr(hooks, "_build_launcher", lambda fn, sig, cx, at, tma: seen.append(tma))
    hooked = _FakeJit()
    assert hook_compiles(hooked, tma_descriptors=True)
    hooked._do_compile("a", sig, 0, {}, types.SimpleNamespace(), {}, False)
    assert seen == [True]


# A fresh interpreter (TRITON_INTERPRET=0: the test process's interpreter mode swaps Triton's library
# functions) compiles `unrelated` for sm_90a offline, with no cache; "baseline" never imports
# prefill_runtime; "hooked" hooks `ours` with every option, compiles it through Triton's own
# JITFunction._do_compile (with the device binder Triton would create for an H200), and then compiles
# `unrelated` again: after the hooks are in, in the state of one of our compiles (same thread, another
# thread), and, as controls, with the O0 option for any kernel and for `unrelated` by name.
_CONTAINMENT_CHILD = r"""
import json, sys, threading
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend

TARGET = GPUTarget("cuda", 90, 32)
SIG = {"X": "*fp32", "Y": "*fp32", "n": "i32", "BLOCK": "constexpr"}


@triton.jit
def unrelated(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(X + offs, mask=m, other=0.0)
    tl.store(Y + offs, tl.exp(x) * 2.0 + x * x, mask=m)


def ptx_of_unrelated():
    return triton.compile(ASTSource(unrelated, SIG, {"BLOCK": 256}), target=TARGET).asm["ptx"]


out = {}
if sys.argv[1] == "baseline":
    out["baseline"] = ptx_of_unrelated()
else:
    from triton._C.libtriton import llvm

    import prefill_runtime
    from prefill_runtime import compiler_hooks as hooks

    @triton.jit
    def ours(X, Y, n, BLOCK: tl.constexpr, LLVM_O0: tl.constexpr, FIX: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        x = tl.load(X + offs, mask=m, other=0.0)
        tl.store(Y + offs, tl.exp(x) * 2.0 + x * x, mask=m)

    ok = prefill_runtime.hook_compiles(ours, lambda: False, llvm_o0_flag="LLVM_O0", desc_fix_flag="FIX")
    assert ok
    backend = make_backend(TARGET)
    # what Triton's create_binder gives a device and sets on the kernel (it needs a driver)
    ours.device_caches[0] = ({}, {}, TARGET, backend, None)
    ours.compile, ours.ASTSource = triton.compile, ASTSource

    def ptx_of_ours(o0):
        named = dict(BLOCK=256, LLVM_O0=o0, FIX=True)
        consts = {(ours.arg_names.index(k),): v for k, v in named.items()}
        sig = {**SIG, "LLVM_O0": "constexpr", "FIX": "constexpr"}
        kernel = ours._do_compile(("key", o0), sig, 0, consts, backend.parse_options({}), {}, True)
        return kernel.asm["ptx"]

    out["ours_o0"] = ptx_of_ours(True)  # installs both llvm wrappers
    out["ours_o3"] = ptx_of_ours(False)
    wrapped = [llvm.optimize_module, llvm.translate_to_asm]
    out["wrapped"] = all(getattr(f, "_prefill_wrapped", False) for f in wrapped)
    calls = {"optimize_module": 0, "translate_to_asm": 0}

    def counted(name, f):
        def call(*a, **k):
            calls[name] += 1
            return f(*a, **k)
        return call

    llvm.optimize_module = counted("optimize_module", wrapped[0])
    llvm.translate_to_asm = counted("translate_to_asm", wrapped[1])
    out["after"] = ptx_of_unrelated()
    with hooks.compile_passes(llvm_o0=True, desc_fix=True, kernel="ours"):
        out["inside"] = ptx_of_unrelated()
        box = []
        t = threading.Thread(target=lambda: box.append(ptx_of_unrelated()))
        t.start()
        t.join()
        out["thread"] = box[0]
    with hooks.compile_passes(llvm_o0=True):
        out["control_any"] = ptx_of_unrelated()
    with hooks.compile_passes(llvm_o0=True, kernel="unrelated"):
        out["control_named"] = ptx_of_unrelated()
    out["calls"] = calls
print("RESULT " + json.dumps(out))
"""


def _containment_child(mode: str, tmp_path) -> subprocess.Popen:
    script = tmp_path / "containment_child.py"  # a file: @triton.jit reads its kernels' source
    if not script.exists():
        script.write_text(_CONTAINMENT_CHILD)
    env = {
        **os.environ,
        "TRITON_INTERPRET": "0",
        "TRITON_ALWAYS_COMPILE": "1",  # every compile runs every stage (no cache hit)
        "TRITON_CACHE_DIR": str(tmp_path / mode),
        "PREFILL_GLUON": "1",  # the PTX pass on whatever this Triton's version is
    }
    args = [sys.executable, str(script), mode]
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen) -> tuple[int, dict | None, str]:
    stdout, stderr = proc.communicate()
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    return proc.returncode, json.loads(lines[-1][7:]) if lines else None, stderr[-3000:]


def test_hooks_leave_unrelated_kernels_untouched(tmp_path):
    """With hook_compiles on a kernel of ours (LLVM O0 and the PTX pass) and both llvm wrappers in
    place, an unrelated ``@triton.jit`` kernel compiled offline for sm_90a gets PTX byte-identical to its
    PTX from a process that never imported prefill_runtime: after the hooks are in, and in the state of
    one of our compiles, in the same thread and in another; its compiles did go through the wrappers.
    Controls: our own kernel's PTX does change with its O0 flag, and the unrelated kernel's changes when
    the O0 option is set for any kernel or for it by name, so an option that leaked would show."""
    baseline_proc = _containment_child("baseline", tmp_path)
    hooked_proc = _containment_child("hooked", tmp_path)
    rc, base, err = _result(baseline_proc)
    if rc != 0 or base is None:
        hooked_proc.kill()
        hooked_proc.communicate()
        pytest.skip(f"offline sm_90a compile unavailable with this Triton: {err[-500:]}")
    rc, got, err = _result(hooked_proc)
    assert rc == 0 and got is not None, err
    assert got["wrapped"] and got["ours_o0"] != got["ours_o3"]
    for case in ("after", "inside", "thread"):
        assert got[case] == base["baseline"], case
    assert got["calls"]["optimize_module"] >= 5 and got["calls"]["translate_to_asm"] >= 5, got["calls"]
    assert got["control_any"] != base["baseline"] and got["control_named"] != base["baseline"]


_COLD_COMPILE_CHILD = r"""
import glob, json, os, sys
import torch
import prefill_runtime.compiler_hooks as hooks
import prefix_prefill.gluon_launch as pg
import prefix_prefill.launch as pi
import window_prefill.launch as wi
import prefix_prefill as prefix_prefill_pkg
from prefix_prefill import prefix_prefill
from window_prefill import window_prefill
mode = sys.argv[1]
if mode == "off":  # no prebuild: Triton builds each launcher itself, after the compile
    hooks._build_launcher = lambda *args, **kwargs: None
if mode == "wrong":  # negative control: prebuild for a signature the compile does not have (i32 -> i64)
    build = hooks._build_launcher
    widen = lambda sig: {n: "i64" if t == "i32" else t for n, t in sig.items()}
    hooks._build_launcher = lambda fn, sig, cx, at, *rest: build(fn, widen(sig), cx, at, *rest)
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
jits = [pi._fwd_kernel, wi._fwd_kernel] + [k for k in (pg._gluon_fwd_kernel, wi._gluon_fwd_kernel) if k]
caches = [cache for jit in jits for cache in jit.device_caches.values()]
kernels = [c for cache in caches for c in cache[0].values()]
root = os.environ["TRITON_CACHE_DIR"]
got = json.dumps({
    "finite": bool(torch.isfinite(o1).all() and torch.isfinite(o2).all()),
    "kernels": len(kernels),
    "launchers": len(glob.glob(os.path.join(root, "*", "__triton_launcher*"))),
})
prefix_prefill_pkg.finish_compiles()  # no compile thread left running at exit
print(got)
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
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-c", _COLD_COMPILE_CHILD, mode], env=env, capture_output=True,
                         text=True)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["finite"] and got["kernels"] == 2, got
    assert got["launchers"] == (2 * got["kernels"] if mode == "wrong" else got["kernels"]), got
