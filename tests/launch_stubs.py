"""Stand-ins for a compiled kernel and its launchers, for the CPU tests of the direct launch path.

:class:`Jit` stands in for a ``@triton.jit`` / ``@gluon.jit`` kernel: ``kernel[grid](...)`` records the
call and returns one :class:`Compiled`, whose C launcher (:meth:`Run.c_launch`) records its arguments.
:func:`fake_raw_launchers` makes :class:`prefill_runtime.compiled_launch.RawLauncher` build the raw
launcher of such a kernel as it builds one on Triton 3.6 (the descriptor arguments of the kernel's first
call are its TMA descriptors, a metadata dict each; descriptors are filled by :func:`fake_fill`, whose
map is the values it encodes), so the direct path and its frames run on any Triton, on the CPU.
"""

from __future__ import annotations

import torch

import prefill_runtime.compiled_launch as cl


class Run:
    """A compiled variant's launcher stand-in (no scratch): ``kernel.run`` and the C launcher record."""

    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid = launch_pdl = False

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.c_calls: list[list] = []

    def __call__(self, *args) -> None:
        self.calls.append(args)

    def c_launch(self, *args) -> None:
        self.c_calls.append(list(args))


class Compiled:
    def __init__(self) -> None:
        self.run, self.function, self.packed_metadata = Run(), 7, (4, 1, 0)


class Jit:
    """A kernel stand-in: ``kernel[grid](...)`` records the call and returns one compiled kernel; the
    descriptor arguments of its first call are the variant's (``metas``: (position, metadata))."""

    def __init__(self, names) -> None:
        self.arg_names, self.compiled, self.triton_calls, self.metas = names, Compiled(), [], None

    def __getitem__(self, grid):
        def call(*args, **kwargs):
            self.triton_calls.append((grid, args, kwargs))
            if self.metas is None:
                values = [*args, *[kwargs[n] for n in self.arg_names[len(args) :]]]
                descs = [i for i, a in enumerate(values) if type(a).__name__ == "TensorDescriptor"]
                self.metas = [(i, {"swizzle": i % 4, "elem_size": 2, "elem_type": 10, "block_size": [8, i],
                                   "fp4_padded": False}) for i in descs]  # fmt: skip
            return self.compiled

        return call


def fake_fill(ptr, swizzle, elem, dtype, block, shape, strides, padding):
    """Stands in for Triton's ``fill_tma_descriptor`` (a CUDA driver call): the map as what it encodes."""
    return ("map", ptr, swizzle, elem, dtype, tuple(block), tuple(shape), tuple(strides), padding)


def _fake_expand(arg, meta):
    """Stands in for Triton's ``make_tensordesc_arg``, over :func:`fake_fill`."""
    m = meta
    fill = fake_fill(arg.base.data_ptr(), m["swizzle"], m["elem_size"], cl._FILL[1][m["elem_type"]],
                     m["block_size"], list(arg.shape), list(arg.strides), 0)  # fmt: skip
    return [fill, *arg.shape, *arg.strides]


def fake_raw_launchers(monkeypatch, *jits: Jit) -> None:
    """Direct launches on: a ``jits`` kernel's raw launcher over its stand-in C launcher, descriptors
    filled by :func:`fake_fill`, stream 0 on device -1 (the CPU tensors' ``get_device()``)."""
    by_compiled = {id(j.compiled): j for j in jits}

    def of(cls, kernel):
        jit = by_compiled[id(kernel)]
        head = (False, False, None, None, kernel.packed_metadata, None, None, None)
        return cls(kernel.run.c_launch, jit.metas, head, _fake_expand)

    monkeypatch.setattr(cl.RawLauncher, "of", classmethod(of))
    monkeypatch.setattr(cl, "_FILL", (fake_fill, {i: i + 100 for i in range(16)}))
    monkeypatch.setattr(cl, "_SUPPORTED", True)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 0, raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: -1)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: -1, raising=False)


def stub_prefix_gluon(monkeypatch, kernel: str, fast: str) -> Jit:
    """A prefix-prefill Gluon kernel (``prefix_prefill.gluon_launch.<kernel>``, its compiled variants
    ``<fast>``) replaced by a stand-in launched directly (full form from the first call: compile tiers
    off), with a raw launcher over the stand-in's C launcher."""
    from prefix_prefill import gluon_launch

    jit = Jit(getattr(gluon_launch, kernel).arg_names)
    fake_raw_launchers(monkeypatch, jit)
    monkeypatch.setattr(gluon_launch, kernel, jit)
    monkeypatch.setattr(gluon_launch, fast, cl.CompiledLaunches(jit))
    monkeypatch.setenv("PREFIX_PREFILL_GLUON_TIERED", "0")
    return jit


def pointers(c_args: list) -> list:
    """The C launcher's arguments with tensors as their pointers (a frame passes pointers)."""
    return [x.data_ptr() if isinstance(x, torch.Tensor) else x for x in c_args]
