"""Host helpers shared by the prefill kernel packages' launchers."""

from __future__ import annotations

import functools
import os
import subprocess
import threading
import types
from collections.abc import Callable

import torch

# prime_triton ran in this process (whichever package launched first)
_PRIMED = False


def prime_triton() -> None:
    """Once per process, before a first launch: Triton's setup steps that do not depend on each
    other, side by side. Its cache key hashes its own ~400 MB library (0.36 s warm, 0.73 s from a
    cold disk on the H200 host) in a thread (the hash releases the GIL) while this thread builds or
    loads the driver's helper module (gcc on an empty cache, 0.35-0.55 s; the GIL is free while gcc
    runs), a second thread imports ``triton.experimental.gluon`` (0.14 s), which the specialiser of
    any first launch imports, and a third runs :func:`ptxas_launch_options`' one-time ptxas probe.
    Measured on the H200 (bench/results/NOTES.md step 35): a cold prefix-prefill first call 5.0-5.3
    -> 3.7-4.0 s. Only a speed hint: any failure leaves Triton to do the same steps in order; later
    calls return at once."""
    global _PRIMED
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


def hook_compiles(jit_fn: object, prebuild_launcher: Callable[[], bool] = lambda: True) -> bool:
    """Once per ``@triton.jit`` kernel (idempotent): wrap Triton's compile step for it
    (``JITFunction._do_compile``, set on the instance, so no other kernel is touched) so that while the
    kernel compiles (seconds), a thread builds its launcher: the C module Triton compiles with gcc for
    each kernel signature after the kernel itself (0.25-0.35 s on an empty cache), from the same
    signature and constants, so the first launch then finds it in Triton's cache
    (bench/results/NOTES.md step 49). NVIDIA CUDA only, when ``prebuild_launcher()`` is true, no
    argument is a tensor descriptor (their launcher depends on the compiled kernel) and Triton's
    async compile mode is not active (it builds launchers when collecting its futures). Only a speed
    hint: any failure leaves Triton to build the launcher itself, after the compile, as it would.

    Returns whether the hook is in place (False: this Triton has no such step, e.g. the interpreter)."""
    orig = getattr(jit_fn, "_do_compile", None)
    if orig is None or getattr(orig, "_prefill_hooked", False):
        return orig is not None

    def _do_compile(*args, **kwargs):
        builder = None
        try:
            # Triton 3.4-3.6: (key, signature, device, constexprs, options, attrs, warmup)
            _key, signature, _device, constexprs, _options, attrs = args[:6]
            if prebuild_launcher() and torch.version.hip is None and not _async_compiling():
                builder = threading.Thread(
                    target=_build_launcher, args=(jit_fn, signature, constexprs, attrs), daemon=True
                )
                builder.start()
        except Exception:
            pass
        try:
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


def _async_compiling() -> bool:
    """Is Triton's ``AsyncCompileMode`` active (compiles handed to an executor, launchers built when the
    futures are collected)? The launcher prebuild then stays out of the way."""
    try:
        from triton.runtime import _async_compile

        return _async_compile.active_mode.get() is not None
    except Exception:  # a Triton without async compiles
        return False


def _build_launcher(jit_fn: object, signature: dict, constexprs: dict, attrs: dict) -> None:
    """Build (or find in Triton's cache) the launcher module of ``jit_fn`` for one specialization, as
    the compiled kernel's first launch will ask for it. Never raises."""
    try:
        if any(isinstance(t, str) and t.startswith("tensordesc") for t in signature.values()):
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
