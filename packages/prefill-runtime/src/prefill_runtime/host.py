"""Host helpers shared by the prefill kernel packages' launchers."""

from __future__ import annotations

import ast
import functools
import os
import re
import subprocess
import threading
import time
import types
from collections.abc import Callable

import torch

# prime_triton ran in this process (whichever package launched first)
_PRIMED = False
# the thread prime_triton_in_background started (None: not asked for)
_PRIME_THREAD: threading.Thread | None = None


def prime_triton() -> None:
    """Once per process, before a first launch: Triton's setup steps that do not depend on each
    other, side by side. Its cache key hashes its own ~400 MB library (0.36 s warm, 0.73 s from a
    cold disk on the H200 host) in a thread (the hash releases the GIL) while this thread builds or
    loads the driver's helper module (gcc on an empty cache, 0.35-0.55 s; the GIL is free while gcc
    runs), a second thread imports ``triton.experimental.gluon`` (0.14 s), which the specialiser of
    any first launch imports, and a third runs :func:`ptxas_launch_options`' one-time ptxas probe.
    Measured on the H200 (bench/results/NOTES.md step 35): a cold prefix-prefill first call 5.0-5.3
    -> 3.7-4.0 s. Only a speed hint: any failure leaves Triton to do the same steps in order; later
    calls return at once; a call while :func:`prime_triton_in_background`'s thread runs waits for it."""
    global _PRIMED
    started = _PRIME_THREAD
    if started is not None and started is not threading.current_thread():
        started.join()
        return
    if _PRIMED:
        return
    _PRIMED = True
    try:
        from triton.runtime import cache, driver

        def hash_library() -> None:  # a failure here is Triton's to report when it needs the key
            try:
                cache.triton_key()
            except Exception:
                pass

        def probe_ptxas() -> None:  # ptxas_launch_options' one-time `ptxas --help` (10-60 ms)
            try:
                if torch.version.hip is None and torch.cuda.is_available():
                    _ptxas_has_register_usage_level(torch.cuda.get_device_capability())
            except Exception:
                pass

        def import_gluon() -> None:  # Python work that fits in while gcc builds the driver helper
            try:
                import triton.experimental.gluon  # noqa: F401
            except Exception:
                pass

        helpers = [threading.Thread(target=f, daemon=True) for f in (hash_library, probe_ptxas, import_gluon)]
        for t in helpers:
            t.start()
        try:
            driver.active.get_current_device()
        finally:
            for t in helpers:
                t.join()
    except Exception:  # a speed hint on triton internals; the launch does the same steps anyway
        pass


def prime_triton_in_background() -> threading.Thread | None:
    """Start :func:`prime_triton` in a daemon thread and return at once (opt-in, for a serving engine's
    start-up): called seconds before the first prefill call, e.g. before loading the model's weights,
    it takes Triton's library hash and the driver's helper build (0.4-0.85 s of a cold first call on the
    H200 hosts, NOTES step 56) off that call, which then only compiles. It initialises CUDA as the first
    call would: call it in the process that runs the kernels, not in a parent that forks afterwards.
    The first launch's :func:`prime_triton` waits for the thread. Returns the thread, or None when
    priming already ran or started in this process."""
    global _PRIME_THREAD
    if _PRIMED or _PRIME_THREAD is not None:
        return None
    thread = threading.Thread(target=prime_triton, name="prefill_runtime_prime", daemon=True)
    _PRIME_THREAD = thread
    thread.start()
    return thread


def ptxas_launch_options(register_usage_level: int, device: torch.device) -> dict[str, str]:
    """Launch keyword arguments that pass ``--register-usage-level=N`` to ptxas for one kernel (Triton's
    per-launch ``ptx_options``; it joins the compile cache key, so nothing else compiles differently).
    ``{}`` when ``register_usage_level`` is 0 (ptxas's default, 5), off NVIDIA CUDA devices (ROCm, the
    interpreter, CPU tensors), when this Triton has no ``ptx_options`` launch option, or when its ptxas
    does not list the flag (a beta ptxas option, CUDA 12.x); ``ValueError`` outside 0..10. Options the
    user set through ``PTXAS_OPTIONS`` are kept (the flag is appended), and a level given there wins.

    Why a kernel would ask (bench/results/NOTES.md step 47): at level 3 or below ptxas 12.8 gives the
    prefix kernel's page-16 and power-of-two-page context loops the order its other pages already
    get, the next tile's address work ahead of the q.k wgmma instead of between the K/V copies."""
    ok = isinstance(register_usage_level, int) and not isinstance(register_usage_level, bool)
    if not ok or not 0 <= register_usage_level <= 10:
        raise ValueError(f"register_usage_level must be an int in 0..10, got {register_usage_level!r}")
    if register_usage_level == 0 or device.type != "cuda" or torch.version.hip is not None:
        return {}
    if not _ptxas_has_register_usage_level(torch.cuda.get_device_capability(device)):
        return {}
    flag = f"--register-usage-level={register_usage_level}"
    user = _user_ptxas_options()  # PTXAS_OPTIONS: a launch's ptx_options replaces it, so keep it
    if user and "register-usage-level" in user:
        return {}  # the user's own level wins (Triton's default ptx_options carries it)
    return {"ptx_options": f"{user} {flag}" if user else flag}


def hook_compiles(
    jit_fn: object,
    prebuild_launcher: Callable[[], bool] = lambda: True,
    tma_descriptors: bool = False,
    llvm_o0_flag: str | None = None,
    free_waits_flag: str | None = None,
    desc_fix_flag: str | None = None,
) -> bool:
    """Once per ``@triton.jit`` kernel (idempotent): wrap Triton's compile step for it
    (``JITFunction._do_compile``, set on the instance, so no other kernel is touched) so that while the
    kernel compiles (seconds), a thread builds its launcher: the C module Triton compiles with gcc for
    each kernel signature after the kernel itself (0.25-0.35 s on an empty cache), from the same
    signature and constants, so the first launch then finds it in Triton's cache
    (bench/results/NOTES.md step 49). NVIDIA CUDA only, when ``prebuild_launcher()`` is true, no
    argument is a tensor descriptor (their launcher depends on the compiled kernel) unless
    ``tma_descriptors`` says the kernel lowers every descriptor argument to a TMA descriptor (Gluon
    kernels on Hopper: the launcher's C source then depends only on that, and Triton 3.6 builds the same
    source from the compiled kernel's ``tensordesc_meta``), and Triton's async compile mode is not
    active (it builds launchers when collecting its futures). Only a speed hint: any failure, or a
    guess that does not match, leaves Triton to build the launcher itself, after the compile.

    ``llvm_o0_flag``: the name of one of the kernel's boolean constexprs; a compile where it is true
    runs LLVM's module optimisation (Triton's ``llvm.optimize_module``, O3) at O0 in this thread, see
    :func:`_llvm_level_wrapper` (installed by the first such compile; nothing of Triton's is touched
    while no compile asks). The constexpr is part of Triton's cache key, so the two forms of the kernel
    never share a cache entry.

    ``free_waits_flag``: likewise, a boolean constexpr; a compile where it is true has the PTX that
    Triton's LLVM stage returns (``llvm.translate_to_asm``, in this thread) pass through
    :func:`drop_wait_barriers`, which drops the partition-wide barriers Triton put before the kernel's
    ``prefill_runtime.gluon.free_wait`` calls (the wrapper is installed by the first such compile).

    ``desc_fix_flag``: likewise; a compile where it is true has that PTX pass through
    :func:`clear_noswizzle_base_offsets` (wgmma views of no-swizzle shared memory whose stride byte
    offset is not 1024 bytes read wrong data on the H200 without it).

    Returns whether the hook is in place (False: this Triton has no such step, e.g. the interpreter)."""
    orig = getattr(jit_fn, "_do_compile", None)
    if orig is None or getattr(orig, "_prefill_hooked", False):
        return orig is not None
    o0_path = _constexpr_path(jit_fn, llvm_o0_flag)
    free_path = _constexpr_path(jit_fn, free_waits_flag)
    fix_path = _constexpr_path(jit_fn, desc_fix_flag)

    def _do_compile(*args, **kwargs):
        builder = None
        try:
            # Triton 3.4-3.6: (key, signature, device, constexprs, options, attrs, warmup)
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
        level = None
        try:
            # the wrapper goes in with the first compile that asks for O0, not before
            if o0_path is not None and args[3].get(o0_path) is True and _llvm_level_wrapper():
                level = _LLVM_O0
        except Exception:
            level = None
        free = fix = False
        try:
            free = free_path is not None and args[3].get(free_path) is True and _asm_wrapper()
        except Exception:
            free = False
        try:
            fix = fix_path is not None and args[3].get(fix_path) is True and _asm_wrapper()
        except Exception:
            fix = False
        prior = getattr(_LLVM_LEVEL, "value", None)
        prior_free = getattr(_FREE_WAITS, "value", False)
        prior_fix = getattr(_DESC_FIX, "value", False)
        _LLVM_LEVEL.value = level
        _FREE_WAITS.value = free
        _DESC_FIX.value = fix
        try:
            return orig(*args, **kwargs)
        finally:
            _LLVM_LEVEL.value = prior
            _FREE_WAITS.value = prior_free
            _DESC_FIX.value = prior_fix
            if builder is not None:
                builder.join()

    _do_compile._prefill_hooked = True
    try:
        jit_fn._do_compile = _do_compile
    except Exception:
        return False
    return True


def _constexpr_path(jit_fn: object, name: str | None) -> tuple[int] | None:
    """Triton 3.4-3.6's key of constexpr ``name`` in a compile's constexprs (its argument path)."""
    if name is None:
        return None
    try:
        return (list(jit_fn.arg_names).index(name),)
    except Exception:
        return None


# Whether the compiles of this thread drop the barriers before free waits (drop_wait_barriers), and
# how many the last PTX of this thread lost (tests, diagnostics)
_FREE_WAITS = threading.local()
# Whether the compiles of this thread clear no-swizzle wgmma descriptors' base offsets
# (clear_noswizzle_base_offsets), and how many constants the last PTX of this thread had changed
_DESC_FIX = threading.local()

_PTX_FILE = re.compile(r'^\s*\.file\s+(\d+)\s+"([^"]+)"', re.M)
_PTX_LOC = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)\s")
_PTX_BAR = re.compile(r"^\s*(?:bar|barrier)\.sync(?:\.aligned)?\s+[^;]*;\s*$")
# what may sit between a barrier and the wait's poll loop: blank lines, comments, line info, the
# inline-asm block's brace, predicate declaration and loop label
_PTX_FILLER = re.compile(r"^\s*(?://.*|\.loc\s.*|\{|\.reg\s+\.pred\s+\w+;|\w+:)?\s*$")


@functools.lru_cache(maxsize=1)
def free_wait_lines() -> tuple[str, frozenset[int]]:
    """``(path, lines)``: ``prefill_runtime/gluon.py`` and the source lines of the ``mbarrier.wait``
    call(s) in its ``free_wait`` (found by parsing the file, so they follow edits)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gluon.py")
    lines: set[int] = set()
    try:
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == "free_wait":
                for sub in ast.walk(node):
                    if isinstance(sub, ast.Call) and getattr(sub.func, "attr", None) == "wait":
                        lines.add(sub.lineno)
    except (OSError, SyntaxError):
        pass
    return path, frozenset(lines)


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.realpath(a) == os.path.realpath(b)
    except (OSError, ValueError):
        return False


def drop_wait_barriers(
    ptx: str, path: str | None = None, lines: frozenset[int] | None = None
) -> tuple[str, int]:
    """``(ptx', n)``: ``ptx`` without the ``n`` barrier instructions (``bar.sync`` / ``barrier.sync``)
    that Triton emitted for an ``mbarrier.wait`` at one of ``lines`` of ``path`` (default: the
    ``free_wait`` of :func:`free_wait_lines`): a barrier whose line info (the last ``.loc`` before it)
    is such a line and whose next instruction is that wait's ``mbarrier.try_wait`` poll. Triton's
    shared-memory analysis counts a wait as a write to its barrier, so it separates two waits on one
    ring by a barrier of the whole partition (``prefill_runtime.gluon.free_wait`` says why the
    consumer does not need them). Without line info (``TRITON_DISABLE_LINE_INFO``) nothing matches and
    the PTX is returned unchanged."""
    if path is None or lines is None:
        path, lines = free_wait_lines()
    files = {int(m.group(1)) for m in _PTX_FILE.finditer(ptx) if _same_file(m.group(2), path)}
    if not files or not lines:
        return ptx, 0
    src = ptx.splitlines(keepends=True)
    out: list[str] = []
    loc: tuple[int, int] | None = None
    dropped = 0
    for i, line in enumerate(src):
        m = _PTX_LOC.match(line)
        if m:
            loc = (int(m.group(1)), int(m.group(2)))
        elif loc is not None and loc[0] in files and loc[1] in lines and _PTX_BAR.match(line):
            j = i + 1
            while j < len(src) and _PTX_FILLER.match(src[j]):
                j += 1
            if j < len(src) and "mbarrier.try_wait" in src[j]:
                dropped += 1
                continue
        out.append(line)
    return "".join(out), dropped


_PTX_WGMMA = re.compile(r"\bwgmma\.mma_async\.[^;]*;")
_PTX_RD = re.compile(r"%rd\d+")
_PTX_DESC_CONST = re.compile(r"^(\s*(?:add|or)\.[bsu]64\s+(%rd\d+),\s*%rd\d+,\s*)(\d+)(;.*)$")
_BASE_OFFSET_MASK = 7 << 49  # wgmma descriptor bits 49-51: the matrix base offset


def clear_noswizzle_base_offsets(ptx: str) -> tuple[str, int]:
    """``(ptx', n)``: ``ptx`` with the matrix-base-offset field (bits 49-51) cleared in the ``n``
    no-swizzle wgmma descriptor constants it sets: a decimal constant of an ``add``/``or`` whose result
    register is a descriptor operand of a ``wgmma.mma_async`` and whose swizzle field (bits 62-63) is 0.
    Why: Triton 3.6 writes ``(offset / 128) % 8`` of each k-step's byte offset within its shared-memory
    view into that field for every swizzle mode (its mask is ``swizzle / 16 - 1``, all ones at 0),
    while PTX defines the field for the swizzled modes only. The H200 honours it anyway: a no-swizzle
    K-major view with a stride byte offset other than 1024 reads nothing (or faults) at the k-steps
    where it is 4 or 6 (``bench/probe_wgmma_kview.py``, NOTES step 74). Swizzled descriptors (Q, V)
    keep theirs."""
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


def _asm_wrapper() -> bool:
    """Once per process: a thin wrapper around Triton's ``llvm.translate_to_asm`` (LLVM IR to PTX /
    AMDGCN) that passes PTX through :func:`drop_wait_barriers` while :data:`_FREE_WAITS` is set in the
    calling thread (``hook_compiles``' ``free_waits_flag``) and through
    :func:`clear_noswizzle_base_offsets` while :data:`_DESC_FIX` is (``desc_fix_flag``), every other
    call untouched.
    Returns whether the wrapper is in place (False: this Triton has no such function)."""
    try:
        from triton._C.libtriton import llvm

        current = llvm.translate_to_asm
        if getattr(current, "_prefill_wrapped", False):
            return True

        def translate_to_asm(*args, **kwargs):
            out = current(*args, **kwargs)
            if getattr(_FREE_WAITS, "value", False) and isinstance(out, str) and ".target sm_" in out:
                out, _FREE_WAITS.dropped = drop_wait_barriers(out)
            if getattr(_DESC_FIX, "value", False) and isinstance(out, str) and ".target sm_" in out:
                out, _DESC_FIX.cleared = clear_noswizzle_base_offsets(out)
            return out

        translate_to_asm._prefill_wrapped = True
        llvm.translate_to_asm = translate_to_asm
        return True
    except Exception:
        return False


# The LLVM optimisation level the compiles of this thread run at (None: Triton's own) and O0's value
_LLVM_LEVEL = threading.local()
_LLVM_O0 = "O0"


def _llvm_level_wrapper() -> bool:
    """Once per process: put a thin wrapper around Triton's ``llvm.optimize_module`` (the O3 module
    pass pipeline its NVIDIA and AMD backends run between the LLVM IR and PTX/AMDGCN stages) that runs
    at O0 while :data:`_LLVM_LEVEL` is set in the calling thread, and passes every other call through
    untouched (other threads, other kernels, Triton's async compiles). Why (bench/results/NOTES.md
    step 64): the warp-specialised Gluon kernels reach LLVM already simplified by MLIR's passes and
    ptxas does the machine-level work; offline (sm_90a, Triton 3.6) O0 takes 0.3-0.5 s off a 2.0-2.8 s
    compile and ptxas emits the same instruction mix within 1-3%, but on the H200 the split-layout
    prefix kernel at head 128 ran 10% slower: the kernel packages keep it off. Returns whether the
    wrapper is in place (False: this Triton has no such function)."""
    try:
        from triton._C.libtriton import llvm

        current = llvm.optimize_module
        if getattr(current, "_prefill_wrapped", False):
            return True
        o0 = llvm.OPTIMIZE_O0

        def optimize_module(mod, level, *args, **kwargs):
            if getattr(_LLVM_LEVEL, "value", None) == _LLVM_O0:
                level = o0
            return current(mod, level, *args, **kwargs)

        optimize_module._prefill_wrapped = True
        llvm.optimize_module = optimize_module
        return True
    except Exception:
        return False


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
    argument is lowered to a TMA descriptor). Never raises."""
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


def _user_ptxas_options() -> str | None:
    """The ptxas options the user gave Triton through ``PTXAS_OPTIONS`` (None if none)."""
    try:
        from triton import knobs

        return knobs.nvidia.ptxas_options or None
    except Exception:  # older Triton: no knobs module
        return os.environ.get("PTXAS_OPTIONS") or None


@functools.cache
def _ptxas_has_register_usage_level(capability: tuple[int, int]) -> bool:
    """Does this Triton take ``ptx_options`` at launch, and does its ptxas for ``capability`` know
    ``--register-usage-level``? Asked once per capability (one ``ptxas --help``, ~10 ms)."""
    try:
        from triton.backends.nvidia.compiler import CUDAOptions, get_ptxas

        if "ptx_options" not in CUDAOptions.__dataclass_fields__:
            return False
        try:
            ptxas = get_ptxas(capability[0] * 10 + capability[1]).path
        except TypeError:  # older Triton: get_ptxas() takes no architecture
            ptxas = get_ptxas().path
        out = subprocess.run([ptxas, "--help"], capture_output=True, text=True, timeout=30)
        return "--register-usage-level" in out.stdout
    except Exception:  # any doubt: launch without the option
        return False


def softcap_form(softcap: float, q: torch.Tensor, fast: bool = True) -> int:
    """A kernel's ``SOFTCAP`` constexpr for logits capped at ``softcap`` on ``q``'s device: 0 off, 1
    tanh through exp2 (any backend, the interpreter), 2 the hardware tanh of
    :func:`prefill_runtime.device.tanh` (``fast`` and an NVIDIA GPU of compute capability 7.5 or
    newer, which has PTX ``tanh.approx.f32``; not ROCm, not Volta)."""
    if softcap <= 0:
        return 0
    nvidia = fast and q.is_cuda and torch.version.hip is None
    return 2 if nvidia and torch.cuda.get_device_capability(q.device) >= (7, 5) else 1


def check_lse(
    return_lse: object, lse: object, q: torch.Tensor, tokens: str = "total_tokens"
) -> torch.Tensor | None:
    """The softmax-LSE buffer of a call: None without ``return_lse``; with it ``lse`` checked, or a
    new float32 ``[num_heads, <tokens>]`` tensor on ``q``'s device (``q`` is ``[<tokens>, num_heads,
    head_dim]``; ``tokens`` names that dimension in the messages). A non-bool ``return_lse`` is a
    ``TypeError``; ``lse`` without ``return_lse=True``, or of the wrong shape, device or token stride,
    a ``ValueError``; a wrong type or dtype a ``TypeError``, each naming the argument."""
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    if not return_lse:
        if lse is not None:
            raise ValueError("lse is given but return_lse is False: pass return_lse=True to have it written")
        return None
    total, heads = q.shape[0], q.shape[1]
    doc = f"float32 [num_heads, {tokens}] = [{heads}, {total}]"
    if lse is None:
        return torch.empty((heads, total), dtype=torch.float32, device=q.device)
    if not isinstance(lse, torch.Tensor):
        raise TypeError(f"lse must be a torch.Tensor {doc}, got {type(lse).__name__}")
    if lse.dtype != torch.float32:
        raise TypeError(f"lse must be {doc}, got dtype {lse.dtype}")
    if tuple(lse.shape) != (heads, total):
        raise ValueError(f"lse must have shape {doc}, got {tuple(lse.shape)}")
    if lse.device != q.device:
        raise ValueError(f"lse is on {lse.device} but q is on {q.device}; all tensors must share a device")
    if total > 1 and lse.stride(1) != 1:
        raise ValueError(
            f"lse must have unit stride in its last ({tokens}) dimension, got strides {tuple(lse.stride())} "
            "(call .contiguous())"
        )
    return lse


# ------------------------------------------------------------------- Gluon kernels' host side
@functools.cache
def _gluon_smem_layout(rows: int, head_dim: int, half: bool):
    """The NVMMA shared layout of a [rows, head_dim] float16 (``half``) or bfloat16 TMA block."""
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout.get_default_for([rows, head_dim], gl.float16 if half else gl.bfloat16)


def gluon_descriptor(
    base: torch.Tensor, shape: list[int], row_stride: int, rows: int, head_dim: int, swizzle: bool = True
):
    """A Gluon TMA descriptor over ``base``'s memory seen as the 2-D ``shape`` ``[n, width]`` with
    ``row_stride`` elements between rows and unit column stride, block ``[rows, head_dim]``, in the
    default NVMMA shared layout (128-byte swizzle for head 64+), or with ``swizzle=False`` the
    no-swizzle one (the box lands row-major and dense). The caller checks alignment and strides
    (16-byte base and rows); this is the one place the layout is chosen."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    if swizzle:
        layout = _gluon_smem_layout(rows, head_dim, base.dtype == torch.float16)
    else:
        layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=base.element_size() * 8, rank=2)
    return TensorDescriptor(base, shape, [row_stride, 1], [rows, head_dim], layout)


def gluon_token_rows(t: torch.Tensor, rows: int):
    """A Gluon TMA descriptor over ``t`` ``[tokens, heads, head_dim]`` seen as ``[tokens, heads *
    head_dim]`` (block ``[rows, head_dim]``), or None when one head's features are not contiguous, the
    heads of a token not adjacent, or the rows or base not 16-byte aligned."""
    d = t.shape[2]
    if not (
        t.stride(2) == 1
        and t.stride(1) == d
        and t.stride(0) >= t.shape[1] * d
        and (t.stride(0) * t.element_size()) % 16 == 0
        and t.data_ptr() % 16 == 0
    ):
        return None
    return gluon_descriptor(t, [t.shape[0], t.shape[1] * d], t.stride(0), rows, d)


def gluon_applies(q: torch.Tensor, arch: str, *, sinks: object, softcap: float, scale: float) -> bool:
    """What both packages' Gluon kernels need of a call: an sm90 launch (``arch`` as the launchers name
    it), 16-bit ``q`` with head size 64, 128 or 256 (``q`` ``[tokens, heads, head]``), fewer than 2**31
    tokens, no sinks, no soft-capping and a positive softmax scale. Each package adds its own terms."""
    return (
        arch == "sm90"
        and q.dtype in (torch.float16, torch.bfloat16)
        and q.shape[2] in (64, 128, 256)
        and q.shape[0] < 2**31
        and sinks is None
        and not softcap > 0
        and scale > 0
    )


def gluon_try_launch(launch: Callable[[], object], package: str) -> bool:
    """Run ``launch`` (a Gluon kernel's launch); True when it ran. A Triton whose Gluon cannot build or
    launch the kernel raises here: warn once on the caller's behalf and return False, so the caller
    runs its Triton kernel (and may stop offering the Gluon one). During a CUDA-graph capture the
    error is raised: a failed launch there cannot be replaced."""
    try:
        launch()
    except Exception as exc:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise
        import warnings

        warnings.warn(
            f"{package}: the Gluon kernel failed to build or launch ({type(exc).__name__}: {exc}); "
            "using the Triton kernel from now on",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    return True


def _capturing() -> bool:
    """Is the current CUDA stream capturing a graph? (False without CUDA)"""
    try:
        return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    except Exception:
        return False


class CompileTiers:
    """Two forms of one kernel that compute the same output bit for bit: a *quick* form that compiles
    in about half the time (the first calls) and a *full* form that runs faster. The first call of a
    key (one compiled specialization: the caller's constexprs, dtype, optional arguments) launches
    the quick form, then a daemon thread compiles the full form (Triton's ``warmup``: compile, no
    launch); every call after that finished launches the full form. Why: a cold first call of the
    warp-specialised Gluon prefix kernel compiles its consumer twice (2.6-5 s on the H200's hosts),
    the one-partition form once (1.8-1.9 s), at 2-7% of its speed (bench/results/NOTES.md step 68).

    ``launch(full, warmup)`` runs (``warmup``: only compiles) one form; its exceptions reach the caller
    (a failed background compile keeps the key on the quick form). The first launch of the full form
    loads its module, so inside a CUDA graph capture a key whose full form has not been launched yet
    stays on the quick form; call :meth:`finish` (e.g. an engine before it captures its graphs) to wait
    for the background compiles."""

    _LOADED = "loaded"  # full form compiled and launched once (its module loaded)
    _READY = "ready"  # full form compiled
    _FAILED = "failed"  # full form failed to compile: quick form for good

    def __init__(self) -> None:
        self._state: dict[object, object] = {}  # key -> Thread (compiling) | _READY | _LOADED | _FAILED
        self._lock = threading.Lock()

    def run(self, key: object, launch: Callable[[bool, bool], object]) -> bool:
        """Launch ``key``'s full form if compiled, else its quick form (starting the full form's
        background compile on the first call). Returns whether the full form ran."""
        state = self._state.get(key)
        if state is self._LOADED or (state is self._READY and not _capturing()):
            launch(True, False)
            if state is self._READY:
                self._state[key] = self._LOADED
            return True
        launch(False, False)
        if state is None:
            with self._lock:
                if key not in self._state:
                    thread = threading.Thread(
                        target=self._compile, args=(key, launch), daemon=True, name="prefill-full-compile"
                    )
                    self._state[key] = thread
                    thread.start()
        return False

    def _compile(self, key: object, launch: Callable[[bool, bool], object]) -> None:
        try:
            launch(True, True)
            state = self._READY
        except Exception:
            state = self._FAILED
        with self._lock:
            self._state[key] = state

    def pending(self) -> int:
        """How many full forms are compiling now."""
        return sum(isinstance(s, threading.Thread) for s in list(self._state.values()))

    def finish(self, timeout: float | None = None) -> bool:
        """Wait for the full forms compiling now (at most ``timeout`` seconds in all); True when none
        is left compiling."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for state in list(self._state.values()):
            if isinstance(state, threading.Thread):
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                state.join(left)
        return self.pending() == 0

    def clear(self) -> None:
        """Forget every key (tests); compiles in flight finish on their own."""
        with self._lock:
            self._state.clear()
