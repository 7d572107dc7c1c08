"""Triton's one-time process setup before a first launch, and per-launch ptxas options.

Owns :func:`prime_triton` (Triton's independent first-launch steps side by side),
:func:`prime_triton_in_background` (the same started early by an engine, opt-in) and
:func:`ptxas_launch_options` with its one-time ``ptxas --help`` probe. Nothing here changes what a
kernel computes: priming is only a speed hint, and the ptxas flag reaches one kernel's launches
through Triton's own ``ptx_options`` launch option.
"""

from __future__ import annotations

import functools
import os
import subprocess
import threading

import torch

# prime_triton ran in this process (whichever package launched first)
_PRIMED = False
# the thread prime_triton_in_background started (None: not asked for)
_PRIME_THREAD: threading.Thread | None = None


def prime_triton() -> None:
    """Once per process, before a first launch: Triton's setup steps that do not depend on each
    other, side by side. The hash of Triton's own library (its cache key; the hash releases the GIL)
    runs in a thread while this thread builds or loads the driver's helper module (gcc on an empty
    cache; the GIL is free while gcc runs); a second thread imports ``triton.experimental.gluon``,
    which the specialiser of any first launch imports, and a third runs
    :func:`ptxas_launch_options`' one-time ptxas probe. Run one after another inside the first launch,
    these steps add to a cold first call. Only a speed hint: any failure leaves Triton to do the same
    steps in order; later calls return at once; a call while :func:`prime_triton_in_background`'s
    thread runs waits for it."""
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

        def probe_ptxas() -> None:  # ptxas_launch_options' one-time `ptxas --help`
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
    it takes Triton's library hash and the driver's helper build off that call, which then only
    compiles. It initialises CUDA as the first call would: call it in the process that runs the
    kernels, not in a parent that forks afterwards. The first launch's :func:`prime_triton` waits for
    the thread. Returns the thread, or None when priming already ran or started in this process."""
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

    Why a kernel would ask: at a low level ptxas schedules a loop's next-tile address work ahead of
    its wgmma instead of between its copies (prefix-prefill's context loops)."""
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
    ``--register-usage-level``? Asked once per capability (one ``ptxas --help``). Any doubt (no
    ptxas, a ptxas that cannot run, an older Triton) answers False: the kernel launches without the flag."""
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
