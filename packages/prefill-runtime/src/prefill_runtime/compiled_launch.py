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

On Triton 3.6 it goes one step further (:class:`RawLauncher`): it calls the variant's C launcher itself,
expanding each TMA descriptor argument with Triton's own ``make_tensordesc_arg``, and keeps that
expansion (the filled ``CUtensorMap``) on a :class:`Descriptor` the caller reuses from call to call
(descriptors over a KV cache: same tensor, same geometry). A descriptor made per call (the new tokens'
rows) is expanded per call, as Triton does.

:func:`launch_directly` says where a public function may skip its custom op's dispatch.
"""

from __future__ import annotations

import os
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
    enter, exit_ = runtime.launch_enter_hook, runtime.launch_exit_hook
    if type(enter) is _CHAIN and type(exit_) is _CHAIN:  # the usual case: two chains, read directly
        return bool(enter.calls or exit_.calls)
    for hook in (enter, exit_):
        if hook is not None and (not hasattr(hook, "calls") or len(hook.calls) > 0):
            return True
    return False


def _knobs():
    """``triton.knobs``, imported on first use (not at this module's import)."""
    global _KNOBS, _CHAIN
    if _KNOBS is None:
        from triton import knobs

        _CHAIN = getattr(knobs, "HookChain", None)
        _KNOBS = knobs
    return _KNOBS


# the cached ``triton.knobs`` module and its hook-chain class (process state, not settings)
_KNOBS = None
_CHAIN = None


class Descriptor:
    """A TMA descriptor's per-call part, as Triton's launcher reads a ``TensorDescriptor`` (base, shape,
    strides, padding; the block and layout are the compiled variant's): for a variant launched
    directly, made without ``TensorDescriptor``'s checks (the key's first call ran them through Triton on
    the same geometry). ``tma``: its expansion for the C launcher, ``(metadata, [CUtensorMap, *shape,
    *strides])``, filled on its first raw launch (:class:`RawLauncher`); a caller that reuses the object
    must give it the same tensor memory each time."""

    __slots__ = ("base", "padding", "shape", "strides", "tma")

    def __init__(self, base: torch.Tensor, shape: list, strides: list) -> None:
        self.base, self.shape, self.strides, self.padding, self.tma = base, shape, strides, "zero", None


def _triton_36() -> bool:
    try:
        import triton

        return triton.__version__.startswith("3.6.")
    except Exception:  # pragma: no cover
        return False


class RawLauncher:
    """A compiled variant's C launcher called directly (Triton 3.6, whose ``CudaLauncher`` wraps it in
    a closure that expands descriptor arguments and adds the scratch buffers): :meth:`of` returns one
    only where that structure is the one this code was verified against (the closure's free variables
    by name, no global or profile scratch), else None (the caller keeps ``kernel.run``)."""

    __slots__ = ("_c", "_descs", "_expand", "_head")

    def __init__(self, c_launch, descs: list, head: tuple, expand) -> None:
        self._c, self._descs, self._head, self._expand = c_launch, descs, head, expand

    @classmethod
    def of(cls, kernel) -> RawLauncher | None:
        run = getattr(kernel, "run", None)
        if (
            not _triton_36()
            or run is None
            or getattr(run, "global_scratch_size", 1) != 0
            or getattr(run, "profile_scratch_size", 1) != 0
        ):
            return None
        launch = getattr(run, "launch", None)
        code = getattr(launch, "__code__", None)
        if code is None:  # the C launcher itself: no descriptor argument
            c_launch, descs = launch, []
        elif code.co_freevars == ("launcher", "tensordesc_indices", "tensordesc_meta"):
            cells = dict(zip(code.co_freevars, (c.cell_contents for c in launch.__closure__), strict=True))
            metas = cells["tensordesc_meta"]
            if not metas:  # descriptors lowered without TMA metadata: Triton's expansion differs
                return None
            positions = sorted(cells["tensordesc_indices"])
            c_launch, descs = cells["launcher"], list(zip(positions, metas, strict=True))
        else:
            return None
        if c_launch is None:
            return None
        from triton.backends.nvidia.driver import make_tensordesc_arg

        # the C launcher's arguments after the grid, stream and function: Triton 3.6's CudaLauncher.__call__
        # (no scratch) and JITFunction.run's (no launch metadata, no hooks)
        head = (run.launch_cooperative_grid, run.launch_pdl, None, None, kernel.packed_metadata, None, None,
                None)  # fmt: skip
        return cls(c_launch, descs, head, make_tensordesc_arg)

    def __call__(self, grid: tuple[int, int, int], stream: int, function: int, args: Sequence) -> None:
        final = [grid[0], grid[1], grid[2], stream, function, *self._head]
        prev = 0
        for i, meta in self._descs:
            final.extend(args[prev:i])
            d = args[i]
            if isinstance(d, Descriptor):  # kept by the caller: expanded once
                if d.tma is None or d.tma[0] is not meta:
                    d.tma = (meta, self._expand(d, meta))
                final.extend(d.tma[1])
            else:
                final.extend(self._expand(d, meta))
            prev = i + 1
        final.extend(args[prev:])
        self._c(*final)


def _tma_fill():
    """Triton 3.6's descriptor filler and its device-to-host TMA dtype map, resolved once (a frame's
    per-call descriptors are filled with them, as ``make_tensordesc_arg`` does)."""
    global _FILL
    if _FILL is None:
        import triton
        from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST

        _FILL = (triton.runtime.driver.active.utils.fill_tma_descriptor, TMA_DTYPE_DEVICE_TO_HOST)
    return _FILL


# (fill_tma_descriptor, dtype map), resolved on the first frame (process state, not a setting)
_FILL = None


class Frame:
    """A compiled variant's C-launcher argument list for the calls of one signature over the same
    kept tensors (an engine layer's KV cache), with the entries a call changes as slots: made once
    from one call's arguments (:meth:`CompiledLaunches.make_frame`), then per call the grid, the stream,
    the per-call descriptors and the per-call plain arguments are written into a copy of it and the C
    launcher is called. Every other argument (integers the signature fixes, constexprs, descriptors
    over the kept tensors, filled once) is the one of the call that made it.

    A per-call descriptor is one over a ``[tokens, ...]`` tensor whose geometry the signature fixes
    but for the token count: per call it is filled for the tensor's pointer and the call's token count
    (at ``dim`` of the descriptor's shape), with the variant's block, swizzle and dtype, as Triton's
    ``make_tensordesc_arg`` fills it; a descriptor whose pointer and token count are the ones of its
    previous fill reuses that fill (an engine layer called again over the same buffers fills nothing).
    Plain per-call arguments are passed as given (an int pointer, a tensor, an int, None)."""

    __slots__ = ("_descs", "_fill", "_kernel", "_state")

    def __init__(self, kernel, c_launch, template: list, descs: list, plain: list, fill) -> None:
        self._kernel = kernel  # (its module stays loaded while the frame lives)
        self._descs, self._fill = descs, fill
        # what a call reads, in one tuple (one attribute read): the template, the C launcher, the
        # plain slots, and per descriptor its slot, the slot of its token-count dimension and its last
        # fill as the key (pointer, tokens) and the filled CUtensorMap (None before the first)
        n = len(descs)
        slots, token_slots = [d[0] for d in descs], [d[0] + 1 + d[1] for d in descs]
        self._state = (template, c_launch, plain, range(n), slots, token_slots, [None] * n, [None] * n)

    def __call__(
        self, grid0: int, grid1: int, grid2: int, stream: int, tokens: int, bases: Sequence, plain: Sequence
    ) -> None:
        """Launch on ``grid``: ``bases`` are the data pointers of the per-call descriptors' tensors (at
        least one a descriptor, in the order the frame was made with; any past them are unused), each of
        ``tokens`` rows; ``plain`` the per-call plain arguments, in their order."""
        template, c_launch, plain_slots, descs, slots, token_slots, keys, fills = self._state
        final = template.copy()
        final[0] = grid0
        final[1] = grid1
        final[2] = grid2
        final[3] = stream
        for j in descs:
            ptr = bases[j]
            if keys[j] != (ptr, tokens):  # (a new pointer or token count: fill it again)
                _, dim, shape, strides, swizzle, elem, dtype, block = self._descs[j]
                shape = shape.copy()
                shape[dim] = tokens
                fills[j] = self._fill(ptr, swizzle, elem, dtype, block, shape, strides, 0)
                keys[j] = (ptr, tokens)
            final[slots[j]] = fills[j]
            final[token_slots[j]] = tokens
        for slot, value in zip(plain_slots, plain, strict=True):
            final[slot] = value
        c_launch(*final)


class VariantMismatch(AssertionError):
    """A key's compiled variant is not the one Triton picks for the call (raised with ``verify``)."""


class CompiledLaunches:
    """The compiled variants of one ``@triton.jit`` / ``@gluon.jit`` kernel, by caller key, launched
    directly (module docstring). At most ``maxsize`` keys (the oldest dropped first). With
    ``verify`` set (tests), every direct launch first asks :meth:`check` and raises
    :class:`VariantMismatch` where Triton would pick another variant (callers pass it on: it is not a
    launch failure to fall back from). Callers that launch with per-call descriptor stand-ins pass
    Triton's own descriptors while ``verify`` is set, so :meth:`check` sees what Triton would."""

    verify = False

    def __init__(self, jit_fn, maxsize: int = 256) -> None:
        self.jit_fn = jit_fn
        self.maxsize = maxsize
        self._names = tuple(jit_fn.arg_names) if hasattr(jit_fn, "arg_names") else ()
        self._kernels: dict[Hashable, tuple] = {}
        self._frames: dict[Hashable, Frame] = {}

    def __len__(self) -> int:
        return len(self._kernels)

    def clear(self) -> None:
        self._kernels.clear()
        self._frames.clear()

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
            kernel, tail, raw = entry
            if self.verify and not self.check(key, grid, args, params, options):
                raise VariantMismatch(f"{self.jit_fn}: key {key!r} holds another variant than Triton's")
            index = device.index if device.index is not None else torch.cuda.current_device()
            stream = torch._C._cuda_getCurrentRawStream(index)
            if raw is not None:
                raw(grid, stream, kernel.function, (*args, *[params[n] for n in tail]))
            else:
                kernel.run(grid[0], grid[1], grid[2], stream, kernel.function, kernel.packed_metadata, None,
                           None, None, *args, *[params[n] for n in tail])  # fmt: skip
            return
        kernel = self.jit_fn[grid](*args, **params, **options)
        if key is None or not _SUPPORTED or kernel is None or not hasattr(kernel, "packed_metadata"):
            return
        tail = self._names[len(args) :]
        if any(n not in params for n in tail):  # a parameter left to its default: keep Triton's path
            return
        if len(self._kernels) >= self.maxsize:  # bounded: the oldest key goes
            self._kernels.pop(next(iter(self._kernels)))
        self._kernels[key] = (kernel, tail, RawLauncher.of(kernel))

    @staticmethod
    def direct_now() -> bool:
        """Whether a direct launch may run now (no launch hook installed: a profiler gets Triton's path)."""
        return not _hooks_installed()

    def frame(self, frame_key: Hashable) -> Frame | None:
        """The :class:`Frame` kept for ``frame_key`` (None: none, or a launch hook is installed)."""
        frame = self._frames.get(frame_key)
        if frame is None or _hooks_installed():
            return None
        return frame

    def make_frame(self, key: Hashable, frame_key: Hashable, args: Sequence, params: dict, descs: dict,
                   plain: Sequence[str]) -> Frame | None:  # fmt: skip
        """Keep a :class:`Frame` (as ``frame_key``) of ``key``'s variant, made from one call's ``args`` and
        ``params`` (a call :meth:`launch` just ran): ``descs`` maps the kernel parameters that are per-call
        descriptors (:class:`Descriptor` objects over a ``[tokens, ...]`` tensor) to the dimension of the
        descriptor's shape that is the token count; ``plain`` names the per-call plain parameters. None
        (and nothing kept) where the variant has no raw launcher (:class:`RawLauncher`) or a descriptor
        argument is not one it can fill. A tensor argument that is not per-call is kept as its pointer (the
        frame does not keep it alive): ``frame_key`` must name it. Bounded (four frames a variant)."""
        entry = self._kernels.get(key)
        if entry is None or entry[2] is None:
            return None
        kernel, tail, raw = entry
        values = (*args, *[params[n] for n in tail])
        position = {n: i for i, n in enumerate(self._names)}
        metas = dict(raw._descs)
        fill, dtypes = _tma_fill()
        template = [0, 0, 0, 0, kernel.function, *raw._head]
        slots = {}
        for i, value in enumerate(values):
            if i in metas:
                meta = metas[i]
                if not isinstance(value, Descriptor) or meta.get("fp4_padded") or value.padding != "zero":
                    return None
                if value.tma is None or value.tma[0] is not meta:
                    value.tma = (meta, raw._expand(value, meta))
                slots[i] = len(template)
                template.extend(value.tma[1])
            else:
                slots[i] = len(template)
                template.append(value.data_ptr() if isinstance(value, torch.Tensor) else value)
        frame_descs = []
        for name, dim in descs.items():
            i = position[name]
            d, meta = values[i], metas[i]
            fill_args = (meta["swizzle"], meta["elem_size"], dtypes[meta["elem_type"]], meta["block_size"])
            frame_descs.append((slots[i], dim, list(d.shape), list(d.strides), *fill_args))
        frame = Frame(kernel, raw._c, template, frame_descs, [slots[position[n]] for n in plain], fill)
        if len(self._frames) >= self.maxsize * 4:  # bounded: the oldest frame goes
            self._frames.pop(next(iter(self._frames)))
        self._frames[frame_key] = frame
        return frame

    def check(self, key: Hashable, grid, args: Sequence, params: dict, options: dict) -> bool:
        """Whether ``key``'s kernel (if any) is the variant Triton compiles for this call (it compiles
        nothing new: a call Triton would compile differently shows as a different kernel)."""
        entry = self._kernels.get(key)
        if entry is None:
            return True
        kernel = self.jit_fn.warmup(*args, grid=grid, **params, **options)
        return kernel is entry[0]
