"""Which Triton versions the Gluon kernels and the PTX pass run on.

Owns the allowlist :data:`VERIFIED_TRITON_VERSIONS` (the Triton versions, as ``"major.minor"``, on
which the Gluon kernels of both kernel packages and the compiler hooks' PTX pass were verified on
a GPU), :func:`gluon_supported` (the one answer both kernel packages ask before they offer a Gluon
kernel) and :func:`ptx_passes_supported` (the gate of :mod:`prefill_runtime.compiler_hooks`' PTX
rewrite). Why an allowlist: the Gluon API is experimental and changes between Triton releases, and
the PTX pass matches the exact form of the PTX one Triton version emits; on any other version the
portable Triton kernels run. Env ``PREFILL_GLUON``: ``0`` turns the Gluon kernels off, ``1`` forces
them (and the PTX pass) on outside the allowlist.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import threading

# Triton versions ("major.minor") the Gluon kernels and the PTX pass were verified on a GPU with
VERIFIED_TRITON_VERSIONS: tuple[str, ...] = ("3.6",)
# the env variable that turns the Gluon kernels off ("0") or forces them on ("1")
ENV = "PREFILL_GLUON"

_log = logging.getLogger("prefill_runtime")
# the one log line about the allowlist was written in this process
_LOGGED = False
_LOG_LOCK = threading.Lock()


def triton_version() -> str:
    """This Triton's ``"major.minor"`` (``"3.6"`` for ``3.6.0+git...``); ``""`` when it cannot tell."""
    try:
        import triton

        m = re.match(r"\s*(\d+)\.(\d+)", str(triton.__version__))
    except Exception:
        return ""
    return f"{m.group(1)}.{m.group(2)}" if m else ""


@functools.cache
def _has_gluon() -> bool:
    """Does this Triton have Gluon with its Hopper module (what the Gluon kernels import)?"""
    try:
        import triton.experimental.gluon.language.nvidia.hopper  # noqa: F401
    except Exception:
        return False
    return True


def _verified() -> tuple[bool, str]:
    """``(in the allowlist or forced, reason)`` for this Triton's version, ignoring Gluon itself."""
    version = triton_version() or "of unknown version"
    allowed = ", ".join(VERIFIED_TRITON_VERSIONS)
    if version in VERIFIED_TRITON_VERSIONS:
        return True, f"Triton {version} is verified (allowlist: {allowed})"
    if os.environ.get(ENV) == "1":
        return True, f"forced by {ENV}=1: Triton {version} is outside the verified versions ({allowed})"
    return False, (
        f"Triton {version} is outside the versions the Gluon kernels were verified on ({allowed}); "
        f"set {ENV}=1 to force them"
    )


def gluon_supported() -> tuple[bool, str]:
    """``(ok, reason)``: may a kernel package offer its Gluon kernels in this process? False when env
    ``PREFILL_GLUON=0``, when this Triton has no Gluon (or no Gluon Hopper module), or when its version
    is outside :data:`VERIFIED_TRITON_VERSIONS` and ``PREFILL_GLUON=1`` does not force it; ``reason``
    says which, or why True (verified, or forced). The call's own terms (architecture, dtype, head
    size: :func:`prefill_runtime.gluon_applies`) are the caller's.

    Call it where a call would take a Gluon kernel: the first answer that is False because of the
    allowlist logs one line per process (logger ``prefill_runtime``, WARNING) saying that the portable
    Triton kernels run and how to force the Gluon ones. Cheap (the environment is read on each call;
    the Gluon import is checked once)."""
    if os.environ.get(ENV) == "0":
        return False, f"{ENV}=0: the portable Triton kernels run"
    if not _has_gluon():
        return False, "this Triton has no Gluon (triton.experimental.gluon with its Hopper module)"
    ok, reason = _verified()
    if not ok:
        _log_once(reason)
    return ok, reason


def ptx_passes_supported() -> bool:
    """May the compiler hooks rewrite a compile's PTX (``clear_noswizzle_base_offsets``)? True on a
    version of :data:`VERIFIED_TRITON_VERSIONS` or with ``PREFILL_GLUON=1``. ``PREFILL_GLUON=0`` does
    not turn it off: it keeps the Gluon kernels from being offered, and a Gluon kernel that compiles
    anyway on a verified Triton keeps the pass its correctness was verified with."""
    return _verified()[0]


def _log_once(reason: str) -> None:
    global _LOGGED
    with _LOG_LOCK:
        if _LOGGED:
            return
        _LOGGED = True
    _log.warning("prefill_runtime: running the portable Triton kernels: %s", reason)
