"""Compiler hooks: everything prefill_runtime changes in how Triton compiles the kernel packages' kernels.

Owns :func:`hook_compiles` (per kernel: its launcher built beside its compile, and the compile's
options below), :func:`compile_passes` (the state those options set for one compile), the launcher
prebuild, the two process-wide wrappers around ``triton._C.libtriton.llvm`` functions
(``optimize_module``: LLVM at O0; ``translate_to_asm``: the PTX pass) and the PTX pass
:func:`clear_noswizzle_base_offsets`.

Containment (vLLM and others compile many Triton kernels in the same process):

* :func:`hook_compiles` sets attributes on one ``JITFunction`` instance (its ``_do_compile`` and
  ``compile``); no other kernel's compile path changes.
* The two ``llvm`` wrappers are process-wide (Triton's backends look the functions up on each call) and
  installed by the first compile that asks for them. They pass every call through untouched unless the
  calling thread is inside :func:`compile_passes`, which only a compile of a hooked kernel enters (its
  ``_do_compile`` call and its ``compile``), and the module (``optimize_module``) or the PTX
  (``translate_to_asm``) defines that kernel's entry point, by name. Output that is not PTX (AMDGCN,
  object files) is never touched. (What would still match: a kernel of the same name compiled by a
  user's Triton compile hook from inside our compile, in its thread.)
* The PTX pass applies only on the Triton versions it was verified on
  (:func:`prefill_runtime.gluon_support.ptx_passes_supported`).
"""

from __future__ import annotations

import contextlib
import re
import threading
import types
from collections.abc import Callable, Iterator

import torch

from prefill_runtime.gluon_support import ptx_passes_supported

# The LLVM optimisation level the compiles of this thread run at (None: Triton's own) and O0's value
_LLVM_LEVEL = threading.local()
_LLVM_O0 = "O0"
# Whether the compiles of this thread clear no-swizzle wgmma descriptors' base offsets
# (clear_noswizzle_base_offsets), and how many constants the last PTX of this thread had changed
_DESC_FIX = threading.local()
# The entry point (kernel name) the options above are for in this thread (None: any, for tools that
# compile with triton.compile directly)
_KERNEL = threading.local()


def hook_compiles(
    jit_fn: object,
    prebuild_launcher: Callable[[], bool] = lambda: True,
    tma_descriptors: bool = False,
    llvm_o0_flag: str | None = None,
    desc_fix_flag: str | None = None,
) -> bool:
    """Once per ``@triton.jit`` kernel (idempotent): hook that kernel's compiles, and only its.

    * Launcher prebuild: Triton's compile step for this kernel (``JITFunction._do_compile``, wrapped on
      the instance) starts a thread that builds the kernel's launcher (the C module Triton compiles
      with gcc for each kernel signature, after the kernel) from the same signature and constants,
      so the first launch finds it in Triton's cache instead of waiting for gcc; see
      :func:`_build_launcher`. NVIDIA CUDA only, when ``prebuild_launcher()`` is true, no argument is a
      tensor descriptor (their launcher depends on the compiled kernel) unless ``tma_descriptors``
      says the kernel lowers every descriptor argument to a TMA descriptor (Gluon kernels on Hopper:
      the launcher's C source then depends only on that), and Triton's async compile mode is not
      active (it builds launchers when collecting its futures). Only a speed hint: any failure, or a
      guess that does not match, leaves Triton to build the launcher itself, after the compile.
    * Compile options (each the name of one of the kernel's boolean constexprs; a compile where it is
      true gets the option; the constexpr is part of Triton's cache key, so the forms never share a
      cache entry): ``llvm_o0_flag``: LLVM's module optimisation at O0 (:func:`_llvm_level_wrapper`);
      ``desc_fix_flag``: the PTX through :func:`clear_noswizzle_base_offsets`, which applies only where
      :func:`~prefill_runtime.gluon_support.ptx_passes_supported` (a verified Triton, or forced). The
      options hold for this kernel's compiles only, in whichever thread compiles it (also Triton's
      async compiles): see :class:`_CompileOptions` and :func:`compile_passes`.

    Returns whether the hook is in place (False: this Triton has no such step, e.g. the interpreter)."""
    orig = getattr(jit_fn, "_do_compile", None)
    if orig is None or getattr(orig, "_prefill_hooked", False):
        return orig is not None
    options = _CompileOptions.of(jit_fn, llvm_o0_flag, desc_fix_flag)

    def _do_compile(*args, **kwargs):
        builder = None
        try:
            # Triton 3.4-3.8: (key, signature, device, constexprs, options, attrs, warmup)
            _key, signature, _device, constexprs, _options, attrs = args[:6]
            if prebuild_launcher() and torch.version.hip is None and not _async_compiling():
                builder = threading.Thread(
                    target=_build_launcher,
                    args=(jit_fn, signature, constexprs, attrs, tma_descriptors),
                    daemon=True,
                )
                builder.start()
        except Exception:
            pass
        try:
            if options is None:
                return orig(*args, **kwargs)
            options.wrap_compile()
            with options.passes(args[3] if len(args) > 3 else None, options.name):
                return orig(*args, **kwargs)
        finally:
            if builder is not None:
                builder.join()

    _do_compile._prefill_hooked = True
    try:
        jit_fn._do_compile = _do_compile
    except Exception:
        return False
    return True


class _CompileOptions:
    """The compile options :func:`hook_compiles` gives one kernel, and where they are set.

    A compile of the kernel whose named constexprs are true runs inside :func:`compile_passes` with
    those options for the kernel's entry point, set twice over so that no compile of it misses them:
    in the thread of its ``_do_compile`` for the whole call, and by a wrapper of the instance's
    ``compile``, which Triton sets to ``triton.compile`` when it creates a device's binder (before any
    ``_do_compile`` of that device) and which ``_do_compile`` calls, also from the executor thread of
    Triton's async compile mode (Triton 3.6 and 3.8). Each ``_do_compile`` puts the wrapper back if a
    new device's binder replaced it. Nested, the two set the same state."""

    def __init__(self, jit_fn: object, paths: list[tuple[int] | None]) -> None:
        self.jit_fn = jit_fn
        self.name = getattr(jit_fn, "__name__", None)
        self.o0_path, self.fix_path = paths

    @classmethod
    def of(cls, jit_fn: object, llvm_o0: str | None, desc_fix: str | None) -> _CompileOptions | None:
        """The options of ``jit_fn`` (None when no option is named, or none is a parameter of it)."""
        paths = [_constexpr_path(jit_fn, name) for name in (llvm_o0, desc_fix)]
        if all(p is None for p in paths):
            return None
        options = cls(jit_fn, paths)
        options.wrap_compile()  # a kernel whose binder exists already
        return options

    def passes(self, constexprs: object, name: object) -> contextlib.AbstractContextManager:
        """:func:`compile_passes` for a compile with these constexprs (keyed by argument path) of the
        entry point ``name``; a no-op context when no option is true or the compile is not one this
        hook knows. The PTX pass only where :func:`ptx_passes_supported`."""
        try:
            get = constexprs.get
            options = dict(
                llvm_o0=self.o0_path is not None and get(self.o0_path) is True,
                desc_fix=self.fix_path is not None and get(self.fix_path) is True and ptx_passes_supported(),
            )
        except Exception:  # not a compile this hook knows: Triton's compile as it is
            return contextlib.nullcontext()
        if not isinstance(name, str) or not any(options.values()):
            return contextlib.nullcontext()
        return compile_passes(kernel=name, **options)

    def wrap_compile(self) -> None:
        """Wrap the instance's ``compile`` if it is there and not wrapped yet."""
        try:
            current = self.jit_fn.compile
            if not callable(current) or getattr(current, "_prefill_hooked", False):
                return
        except Exception:  # no compile attribute yet: _do_compile's own thread state covers it
            return

        def compile(src, *args, **kwargs):
            with self.passes(getattr(src, "constants", None), getattr(src, "name", None)):
                return current(src, *args, **kwargs)

        compile._prefill_hooked = True
        try:
            self.jit_fn.compile = compile
        except Exception:
            pass


def _constexpr_path(jit_fn: object, name: str | None) -> tuple[int] | None:
    """Triton's key of constexpr ``name`` in a compile's constexprs (its argument path)."""
    if name is None:
        return None
    try:
        return (list(jit_fn.arg_names).index(name),)
    except Exception:
        return None


@contextlib.contextmanager
def compile_passes(
    *, llvm_o0: bool = False, desc_fix: bool = False, kernel: str | None = None
) -> Iterator[None]:
    """While active, the compiles of this thread whose entry point is ``kernel`` (None: any) run LLVM
    at O0 (``llvm_o0``) and have their PTX pass through :func:`clear_noswizzle_base_offsets`
    (``desc_fix``), as :func:`hook_compiles` runs them; the wrappers that do it are installed on first
    use. Other threads, and other entry points, are not affected. Count of the last PTX rewritten in
    this thread: ``_DESC_FIX.cleared``. For tools that call ``triton.compile`` themselves (tests,
    probes), this does not consult the version allowlist; :func:`hook_compiles` does."""
    level = _LLVM_O0 if llvm_o0 and _llvm_level_wrapper() else None
    fix = bool(desc_fix) and _asm_wrapper()
    prior = (
        getattr(_LLVM_LEVEL, "value", None),
        getattr(_DESC_FIX, "value", False),
        getattr(_KERNEL, "value", None),
    )
    _LLVM_LEVEL.value, _DESC_FIX.value, _KERNEL.value = level, fix, kernel
    try:
        yield
    finally:
        _LLVM_LEVEL.value, _DESC_FIX.value, _KERNEL.value = prior


def _defines_kernel(mod: object) -> bool:
    """Does LLVM module ``mod`` define this thread's :data:`_KERNEL` (or is it None)? False on doubt."""
    name = getattr(_KERNEL, "value", None)
    if name is None:
        return True
    try:
        return any(f.name == name and not f.is_declaration() for f in mod.get_functions())
    except Exception:
        return False


def _ptx_defines_kernel(ptx: str) -> bool:
    """Is ``ptx`` the PTX of this thread's :data:`_KERNEL` (an ``.entry`` of that name), or is it None?"""
    name = getattr(_KERNEL, "value", None)
    return name is None or re.search(rf"\.entry\s+{re.escape(name)}\s*\(", ptx) is not None


def _llvm_level_wrapper() -> bool:
    """Once per process: a thin wrapper around Triton's ``llvm.optimize_module`` (the O3 module pass
    pipeline its NVIDIA and AMD backends run between the LLVM IR and PTX/AMDGCN stages).

    Rewrites: the optimisation level argument, to O0, for a module that defines this thread's kernel
    while :func:`compile_passes` asks for it (``hook_compiles``' ``llvm_o0_flag``); every other call
    (other threads, other kernels, Triton's own compiles) passes through with its arguments untouched.
    Why: the warp-specialised Gluon kernels reach LLVM already simplified by MLIR's passes and ptxas
    does the machine-level work, so O0 shortens a first call's compile; it is a speed trade, not a
    correctness fix (the kernel packages decide per form whether to ask). Works around no Triton bug
    (no upstream issue). Verified on Triton 3.6 (GPU) and 3.8 (offline: the function and its call in
    the NVIDIA backend). Returns whether the wrapper is in place (False: this Triton has no such
    function)."""
    try:
        from triton._C.libtriton import llvm

        current = llvm.optimize_module
        if getattr(current, "_prefill_wrapped", False):
            return True
        o0 = llvm.OPTIMIZE_O0

        def optimize_module(mod, level, *args, **kwargs):
            if getattr(_LLVM_LEVEL, "value", None) == _LLVM_O0 and _defines_kernel(mod):
                level = o0
            return current(mod, level, *args, **kwargs)

        optimize_module._prefill_wrapped = True
        llvm.optimize_module = optimize_module
        return True
    except Exception:
        return False


def _asm_wrapper() -> bool:
    """Once per process: a thin wrapper around Triton's ``llvm.translate_to_asm`` (LLVM IR to PTX /
    AMDGCN / object code).

    Rewrites: the PTX it returns, for the entry point of this thread's kernel only, while
    :func:`compile_passes` asks for the pass: through :func:`clear_noswizzle_base_offsets`
    (``desc_fix``), whose docstring says what it changes, why, and the upstream issue. Every other call
    (other threads, other kernels, AMDGCN, objects) returns Triton's output untouched. Verified on
    Triton 3.6 (GPU) and 3.8 (offline).
    Returns whether the wrapper is in place (False: this Triton has no such function)."""
    try:
        from triton._C.libtriton import llvm

        current = llvm.translate_to_asm
        if getattr(current, "_prefill_wrapped", False):
            return True

        def translate_to_asm(*args, **kwargs):
            out = current(*args, **kwargs)
            fix = getattr(_DESC_FIX, "value", False)
            if fix and isinstance(out, str) and ".target sm_" in out and _ptx_defines_kernel(out):
                out, _DESC_FIX.cleared = clear_noswizzle_base_offsets(out)
            return out

        translate_to_asm._prefill_wrapped = True
        llvm.translate_to_asm = translate_to_asm
        return True
    except Exception:
        return False


# -------------------------------------------------------------------------------- PTX pass
_PTX_WGMMA = re.compile(r"\bwgmma\.mma_async\.[^;]*;")
_PTX_RD = re.compile(r"%rd\d+")
_PTX_DESC_CONST = re.compile(r"^(\s*(?:add|or)\.[bsu]64\s+(%rd\d+),\s*%rd\d+,\s*)(\d+)(;.*)$")
_BASE_OFFSET_MASK = 7 << 49  # wgmma descriptor bits 49-51: the matrix base offset


def clear_noswizzle_base_offsets(ptx: str) -> tuple[str, int]:
    """``(ptx', n)``: ``ptx`` with the matrix-base-offset field (bits 49-51) cleared in the ``n``
    no-swizzle wgmma descriptor constants it sets.

    Rewrites: a decimal constant of an ``add``/``or`` whose result register is a descriptor operand of
    a ``wgmma.mma_async`` and whose swizzle field (bits 62-63) is 0 loses bits 49-51; swizzled
    descriptors (Q, V) and every other instruction keep theirs.
    Why: Triton 3.6 writes ``(offset / 128) % 8`` of each k-step's byte offset within its shared-memory
    view into that field for every swizzle mode (its mask is ``swizzle / 16 - 1``, all ones at 0),
    while PTX defines the field for the swizzled modes only. The H200 honours it anyway: a no-swizzle
    K-major view whose stride byte offset is not 1024 reads nothing (or faults) at the k-steps where it
    is 4 or 6, so a kernel reading such views is correct only with this pass. Verified on Triton 3.6
    (H200). Upstream: no upstream issue filed yet; the reproducer is ``bench/probe_wgmma_kview.py`` of
    commit 0af21c8 (``git show 0af21c8:bench/probe_wgmma_kview.py``; ``PROBE_FIX=1`` runs it through this
    pass). The closest upstream thread, triton-lang/triton#8378
    (a merged fix for swizzling=0 matrix descriptors), leaves this field set in Triton 3.6."""
    regs = set()
    for m in _PTX_WGMMA.finditer(ptx):
        regs.update(_PTX_RD.findall(m.group(0)))
    if not regs:
        return ptx, 0
    out: list[str] = []
    n = 0
    for line in ptx.splitlines(keepends=True):
        m = _PTX_DESC_CONST.match(line.rstrip("\n"))
        if m and m.group(2) in regs:
            c = int(m.group(3))
            if c >> 62 == 0 and c & _BASE_OFFSET_MASK:
                end = "\n" if line.endswith("\n") else ""
                line = f"{m.group(1)}{c & ~_BASE_OFFSET_MASK}{m.group(4)}{end}"
                n += 1
        out.append(line)
    return "".join(out), n


# ---------------------------------------------------------------------------- launcher prebuild
def _async_compiling() -> bool:
    """Is Triton's ``AsyncCompileMode`` active (compiles handed to an executor, launchers built when the
    futures are collected)? The launcher prebuild then stays out of the way."""
    try:
        from triton.runtime import _async_compile

        return _async_compile.active_mode.get() is not None
    except Exception:  # a Triton without async compiles
        return False


def _build_launcher(
    jit_fn: object, signature: dict, constexprs: dict, attrs: dict, tma_descriptors: bool = False
) -> None:
    """Build (or find in Triton's cache) the launcher module of ``jit_fn`` for one specialization, as
    the compiled kernel's first launch will ask for it (``tma_descriptors``: every tensor-descriptor
    argument is lowered to a TMA descriptor). Never raises.

    Rewrites nothing: it builds, ahead of time and through Triton's own ``launcher_cls``, the module
    Triton would build after the compile; a guess that does not match only leaves an unused entry in
    Triton's cache. Why: gcc's build of the launcher otherwise follows the kernel's compile on a cold
    first call. Verified on Triton 3.6 (H200: one launcher per compiled kernel, the prebuilt one).
    Works around no Triton bug (no upstream issue)."""
    try:
        n_desc = sum(1 for t in signature.values() if isinstance(t, str) and t.startswith("tensordesc"))
        if n_desc and not tma_descriptors:
            return
        from triton.runtime.driver import driver

        src = jit_fn.ASTSource(jit_fn, signature, constexprs, attrs)
        meta = types.SimpleNamespace(
            num_ctas=1,
            global_scratch_size=0,
            global_scratch_align=1,
            profile_scratch_size=0,
            profile_scratch_align=1,
            launch_cooperative_grid=False,
            launch_pdl=False,
        )
        if n_desc:  # the launcher's C source only asks whether each descriptor's metadata is present
            meta.tensordesc_meta = [{} for _ in range(n_desc)]
        driver.active.launcher_cls(src, meta)
    except Exception:
        pass
