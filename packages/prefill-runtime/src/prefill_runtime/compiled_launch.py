"""Launching a kernel's compiled variant directly, without ``JITFunction.run`` on every call.

Triton's ``kernel[grid](*args)`` binds and specialises every argument (the kind of each tensor pointer,
whether each integer is 1 or a multiple of 16), hashes the result and looks the compiled variant up, on
every call: tens of microseconds for a kernel of ~40 arguments. A launcher that already knows which
variant its call needs can skip that: :class:`CompiledLaunches` keeps, per key the caller computes, the
``CompiledKernel`` the first call compiled (through Triton, so compile hooks and Triton's caches work as
ever) and launches it directly after that.

The caller's key must determine Triton's specialisation of the call: every argument's dtype, every
pointer's 16-byte alignment, every specialised integer's value (the kernels here pass strides that are
part of their plan's problem, and mark the integers that change from call to call ``do_not_specialize``),
every constexpr and launch option. :meth:`CompiledLaunches.check` compares a key's kernel with the one
Triton itself would pick (tests, ``PREFILL_VALIDATE=1``).

The direct launch runs only where it is known to be right: NVIDIA CUDA with Triton 3.4 to 3.6 (the
``CompiledKernel.run`` signature it calls), no launch hooks installed (profilers get Triton's path), not
under the interpreter. Anywhere else every call goes through ``kernel[grid]``.

:func:`launch_directly` says where a public function may skip its custom op's dispatch.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Hashable, Sequence

import torch

_VERIFIED_TRITON = ("3.4", "3.5", "3.6")


def _supported() -> bool:
    try:
        import triton

        version = ".".join(triton.__version__.split(".")[:2])
    except Exception:  # pragma: no cover
        return False
    return (
        version in _VERIFIED_TRITON
        and torch.version.hip is None
        and os.environ.get("TRITON_INTERPRET", "0") != "1"
    )


_SUPPORTED = _supported()


def launch_directly() -> bool:
    """Whether a kernel package's public function may launch without going through its custom op
    (saving the dispatcher's cost): not under ``torch.compile``, and no Python dispatch mode (a
    ``TorchDispatchMode``, ``FakeTensorMode``, a profiler's or tracer's) is active, since such a mode
    must see the op itself."""
    return not torch.compiler.is_compiling() and torch._C._len_torch_dispatch_stack() == 0


def _hooks_installed() -> bool:
    """A launch hook is installed (Triton 3.6 keeps them in chains that are empty by default)."""
    runtime = _knobs().runtime
    for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook):
        if hook is not None and (not hasattr(hook, "calls") or len(hook.calls) > 0):
            return True
    return False


def _knobs():
    """``triton.knobs``, imported on first use (not at this module's import)."""
    global _KNOBS
    if _KNOBS is None:
        from triton import knobs

        _KNOBS = knobs
    return _KNOBS


# the cached ``triton.knobs`` module (process state, not a setting)
_KNOBS = None


class VariantMismatch(AssertionError):
    """A key's compiled variant is not the one Triton picks for the call (raised with ``verify``)."""


class CompiledLaunches:
    """The compiled variants of one ``@triton.jit`` / ``@gluon.jit`` kernel, by caller key, launched
    directly (module docstring). At most ``maxsize`` keys (least recently used dropped). With
    ``verify`` set (tests), every direct launch first asks :meth:`check` and raises
    :class:`VariantMismatch` where Triton would pick another variant (callers pass it on: it is not a
    launch failure to fall back from). Callers that launch with per-call descriptor stand-ins pass
    Triton's own descriptors while ``verify`` is set, so :meth:`check` sees what Triton would."""

    verify = False

    def __init__(self, jit_fn, maxsize: int = 256) -> None:
        self.jit_fn = jit_fn
        self.maxsize = maxsize
        self._names = tuple(jit_fn.arg_names) if hasattr(jit_fn, "arg_names") else ()
        self._kernels: OrderedDict[Hashable, tuple] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kernels)

    def clear(self) -> None:
        self._kernels.clear()

    def has(self, key: Hashable | None) -> bool:
        """Whether a call with ``key`` launches directly (its variant compiled and no launch hook)."""
        return key is not None and key in self._kernels and not _hooks_installed()

    def launch(self, key: Hashable | None, grid: tuple[int, int, int], args: Sequence, params: dict,
               options: dict, device: torch.device) -> None:  # fmt: skip
        """Launch ``jit_fn[grid](*args, **params, **options)``; ``params``: the kernel's keyword
        parameters (constexprs and trailing arguments), ``options``: launch options (``num_warps``,
        ``num_stages``, ``ptx_options``...). ``key`` None: always through Triton."""
        entry = self._kernels.get(key) if key is not None else None
        if entry is not None and not _hooks_installed():
            kernel, tail = entry
            if self.verify and not self.check(key, grid, args, params, options):
                raise VariantMismatch(f"{self.jit_fn}: key {key!r} holds another variant than Triton's")
            index = device.index if device.index is not None else torch.cuda.current_device()
            stream = torch._C._cuda_getCurrentRawStream(index)
            kernel.run(grid[0], grid[1], grid[2], stream, kernel.function, kernel.packed_metadata, None, None,
                       None, *args, *[params[n] for n in tail])  # fmt: skip
            self._kernels.move_to_end(key)
            return
        kernel = self.jit_fn[grid](*args, **params, **options)
        if key is None or not _SUPPORTED or kernel is None or not hasattr(kernel, "packed_metadata"):
            return
        tail = self._names[len(args) :]
        if any(n not in params for n in tail):  # a parameter left to its default: keep Triton's path
            return
        self._kernels[key] = (kernel, tail)
        if len(self._kernels) > self.maxsize:
            self._kernels.popitem(last=False)

    def check(self, key: Hashable, grid, args: Sequence, params: dict, options: dict) -> bool:
        """Whether ``key``'s kernel (if any) is the variant Triton compiles for this call (it compiles
        nothing new: a call Triton would compile differently shows as a different kernel)."""
        entry = self._kernels.get(key)
        if entry is None:
            return True
        kernel = self.jit_fn.warmup(*args, grid=grid, **params, **options)
        return kernel is entry[0]
