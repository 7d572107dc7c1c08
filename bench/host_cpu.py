"""Host (Python) cost per call of prefix-prefill's warm Gluon path, measured on the CPU.

The GPU's per-call host time (``host_probe.py``) is mostly Python: the signature key, the checks a
repeated call still runs, the descriptors and the launch glue. This script runs that path on CPU
tensors with the machine faked into an sm90 (the plan chooses the Gluon kernels) and the compiled
kernel replaced by a stand-in whose launcher does nothing, so a change to the Python layers can be timed
without a GPU. It times our layers down to the launcher's call, not Triton's launcher (which
``host_probe.py`` times on the GPU with the rest).

Usage (any machine; a Triton with Gluon, e.g. 3.6)::

    python bench/host_cpu.py [--calls 2000] [--rounds 15] [--profile ENTRY]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

from common import add_package_paths
from host_probe import _calls


class _Launcher:
    """Stands in for a compiled kernel's ``CudaLauncher``: its ``launch`` is Triton 3.6's descriptor
    expansion (``wrap_handle_tensordesc``) around a C launcher stand-in that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.global_scratch_size = self.profile_scratch_size = 0
        self.launch_cooperative_grid = self.launch_pdl = False
        self.launch = None

    def __call__(self, *args) -> None:  # (``kernel.run``, where no raw launcher applies)
        self.calls += 1


class _CLaunch:
    """Stands in for the C launcher itself (a built-in: no ``__code__``, as ``RawLauncher.of`` expects)."""

    def __init__(self, run: _Launcher) -> None:
        self.run = run

    def __call__(self, *args) -> None:
        self.run.calls += 1


class _Compiled:
    """Stands in for a ``CompiledKernel``."""

    def __init__(self) -> None:
        self.run = _Launcher()
        self.function = 0
        self.packed_metadata = (4, 1, 0)


class _Jit:
    """Stands in for a ``@gluon.jit`` kernel: ``kernel[grid](...)`` returns one compiled stand-in, whose
    launcher expands the descriptor arguments of the first call's kinds."""

    def __init__(self, names) -> None:
        self.arg_names = names
        self.compiled = _Compiled()

    def __getitem__(self, grid):
        def call(*args, **kwargs):
            if self.compiled.run.launch is None:
                from triton.backends.nvidia import driver

                values = [*args, *[kwargs.get(n) for n in self.arg_names[len(args) :]]]
                signature = {n: "tensordesc<bf16[8, 8]>" if _is_desc(a) else "i32"
                             for n, a in zip(self.arg_names, values, strict=True)}  # fmt: skip
                metas = [dict(swizzle=3, elem_size=2, elem_type=10, block_size=[8, 8], fp4_padded=False)
                         for a in values if _is_desc(a)]  # fmt: skip
                run = self.compiled.run
                run.launch = driver.wrap_handle_tensordesc(_CLaunch(run), signature, metas)
            return self.compiled

        return call

    def warmup(self, *args, **kwargs):
        return self.compiled


def _is_desc(a) -> bool:
    return type(a).__name__ in ("Descriptor", "TensorDescriptor")


def _fake_fill(ptr, swizzle, elem, dtype, block, shape, strides, padding):
    """Stands in for Triton's ``fill_tma_descriptor`` (a CUDA driver call; here a Python object)."""
    return (ptr, swizzle, block)


def _fake_sm90():
    """Patch the packages so CPU tensors take the sm90 Gluon path with stand-in kernels."""
    import torch

    import prefill_runtime.compiled_launch as cl
    from prefix_prefill import checks, configs, gluon_launch, launch

    for mod in (configs, checks, launch):
        mod.detect_arch = lambda device: "sm90"
    checks.interpreted = lambda: True  # (CPU tensors are accepted)
    cl._SUPPORTED = True
    cl._FILL = (_fake_fill, {i: i for i in range(16)})
    from triton.backends.nvidia import driver

    driver.make_tensordesc_arg = lambda arg, meta: [
        _fake_fill(0, 0, 0, 0, 0, 0, 0, 0),
        *arg.shape,
        *arg.strides,
    ]
    torch._C._cuda_getCurrentRawStream = lambda index: 0
    torch.cuda.current_device = lambda: -1  # (a CPU tensor's get_device(): the calls' device is current)
    torch._C._cuda_getDevice = lambda: -1  # (the same, as the warm paths ask it; absent from CPU builds)
    launch_kernels = {}
    for name in ("_NHD", "_SPLIT"):
        real = getattr(gluon_launch, name)
        jit = _Jit(real.jit_fn.arg_names)
        fast = cl.CompiledLaunches(jit)
        setattr(gluon_launch, name, fast)
        kernel_name = "_gluon_fwd_kernel" if name == "_NHD" else "_gluon_split_kernel"
        setattr(gluon_launch, kernel_name, jit)
        launch_kernels[name] = jit
    gluon_launch.available = lambda: True
    from prefix_prefill import float16_copies

    copies = _Jit(float16_copies._COPIES.jit_fn.arg_names)
    float16_copies._COPIES = cl.CompiledLaunches(copies)
    launch_kernels["copies"] = copies
    from window_prefill import launch as wp_launch

    wp_launch.detect_arch = lambda device: "sm90"
    wp_launch.interpreted = lambda: True  # (CPU tensors are accepted; fp16 inputs keep the GPU's path)
    for name, kernel_name in (("_TRITON", "_fwd_kernel"), ("_GLUON", "_gluon_fwd_kernel")):
        jit = _Jit(getattr(wp_launch, name).jit_fn.arg_names)
        setattr(wp_launch, name, cl.CompiledLaunches(jit))
        setattr(wp_launch, kernel_name, jit)
        launch_kernels["wp" + name] = jit
    return launch_kernels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=15, help="timed rounds of each entry (best shown)")
    ap.add_argument("--profile", default="")
    args = ap.parse_args()
    add_package_paths()
    import os

    os.environ["PREFIX_PREFILL_GLUON_TIERED"] = "0"  # the full form from the first call (no compile thread)
    import torch

    kernels = _fake_sm90()
    calls = _calls(torch, "cpu", window_dtype=torch.float16, fp8=True)
    for _, fn in calls:
        for _ in range(3):
            fn()
    for name, fn in calls:
        before = sum(j.compiled.run.calls for j in kernels.values())
        best = float("inf")
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            for _ in range(args.calls):
                fn()
            best = min(best, (time.perf_counter() - t0) / args.calls * 1e6)
        launched = sum(j.compiled.run.calls for j in kernels.values()) - before
        per = launched // (args.rounds * args.calls)
        print(f"{name:10s} {best:7.2f} us/call (python, to the launcher; {per} launch/call)")
    for name, fn in calls:
        if name == args.profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(2000):
                fn()
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
