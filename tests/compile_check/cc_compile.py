"""Compiling a recorded launch for a GPU target without a GPU, and reading what the compile used.

Triton's own launch path does the work: a stand-in driver (:class:`TargetDriver`) answers "which
device, which target" with the target being checked, so ``kernel.warmup(*args, grid=..., **kwargs)``
binds and specialises the recorded arguments exactly as a launch on that GPU would, then compiles with
the target's bundled toolchain (ptxas, ptxas-blackwell, the AMDGPU LLVM backend). Nothing is loaded or
launched. :func:`specialization_key` runs the same path with a hook that stops before compiling and
returns Triton's cache key of the launch (the matrix's de-duplication key).

Resources come from the compile itself: NVIDIA from the ``ptxas -v`` log Triton's compile writes
(registers, stack frame, spill stores and loads; threads from the PTX ``.maxntid``/``.reqntid``);
AMD from the AMDGPU code object's metadata in the assembly (``.vgpr_count`` (VGPRs and AGPRs),
``.vgpr_spill_count``, ``.private_segment_fixed_size``) and the compiler's ``; Occupancy:`` figure
(waves per SIMD). SGPR spills (``.sgpr_spill_count``) are reported, not counted as spills: the AMDGPU
backend spills SGPRs into lanes of a VGPR (``v_writelane``/``v_readlane``, register to register); an
SGPR spill that reaches memory goes through scratch, which is counted. Shared memory / LDS:
``metadata.shared``.
"""

from __future__ import annotations

import contextlib
import io
import re

from cc_matrix import Launch
from cc_targets import TARGETS, Resources, Target

_TARGET_INDEX = {name: i for i, name in enumerate(TARGETS)}


class TargetDriver:
    """The part of a Triton driver that binding and compiling ask for (current device, stream, target):
    device ``i`` is the ``i``-th target of :data:`cc_targets.TARGETS`, so each target has its own
    per-device binder in every kernel."""

    def __init__(self) -> None:
        self.target: Target | None = None

    def get_current_device(self) -> int:
        return _TARGET_INDEX[self.target.name]

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self):
        return self.target.gpu_target()

    def get_active_torch_device(self):
        import torch

        return torch.device("meta")


_DRIVER = TargetDriver()


def install_driver() -> None:
    """Make :data:`_DRIVER` Triton's active driver in this process, and the packages' compile hooks as
    their first GPU launch installs them (compile options of the Gluon kernels), without the launcher
    prebuild (a C build for a launch that never happens)."""
    from triton.runtime.driver import driver

    import prefill_runtime.compiler_hooks as hooks

    driver.set_active(_DRIVER)
    hooks._build_launcher = lambda *args, **kwargs: None
    from prefix_prefill import launch as prefix_launch
    from window_prefill import launch as window_launch

    prefix_launch.install_hooks()
    window_launch._prime_triton()


def _warmup(launch: Launch, target: Target):
    _DRIVER.target = target
    return launch.kernel.warmup(*launch.args, grid=launch.grid, **launch.kwargs)


def specialization_key(launch: Launch, target: Target) -> str:
    """Triton's cache key of ``launch`` on ``target`` (specialisation, constexprs, options): two launches
    with one key compile to one kernel."""
    import triton.runtime.jit as jit
    from triton import knobs

    seen: list[str] = []

    def stop(*, key, **_):
        seen.append(str(key))
        return True  # (compile nothing)

    # the hook's JSON form of the specialisation cannot hold Gluon layouts; the key is all that is needed
    serialize = jit.serialize_specialization_data
    jit.serialize_specialization_data = lambda *args, **kwargs: ""
    knobs.runtime.jit_cache_hook = stop
    try:
        _warmup(launch, target)
    finally:
        knobs.runtime.jit_cache_hook = None
        jit.serialize_specialization_data = serialize
    if len(seen) != 1:
        raise RuntimeError(f"expected one compile of {launch.kernel.__name__}, saw {len(seen)}")
    return seen[0]


def compile_launch(launch: Launch, target: Target) -> tuple[Resources, dict]:
    """Compile ``launch`` for ``target``; its resources and a few metadata fields (num_warps, stages)."""
    from triton import knobs

    log = io.StringIO()
    knobs.nvidia.dump_ptxas_log = target.nvidia
    with contextlib.redirect_stdout(log):
        kernel = _warmup(launch, target)
    meta = kernel.metadata
    info = {"num_warps": meta.num_warps, "num_stages": meta.num_stages}
    if target.nvidia:
        return _nvidia(log.getvalue(), kernel.asm["ptx"], meta.shared), info
    return _amd(kernel.asm["amdgcn"], meta.shared, meta.num_warps * target.warp_size), info


def _last_int(pattern: str, text: str, what: str) -> int:
    found = re.findall(pattern, text)
    if not found:
        raise RuntimeError(f"no {what} in the compiler output")
    return int(found[-1])


def _nvidia(ptxas_log: str, ptx: str, shared: int) -> Resources:
    stores = _last_int(r"(\d+) bytes spill stores", ptxas_log, "ptxas spill stores")
    loads = _last_int(r"(\d+) bytes spill loads", ptxas_log, "ptxas spill loads")
    stack = _last_int(r"(\d+) bytes stack frame", ptxas_log, "ptxas stack frame")
    return Resources(
        shared=shared,
        threads=_last_int(r"\.(?:maxntid|reqntid)\s+(\d+)", ptx, "thread count"),
        regs=_last_int(r"Used (\d+) registers", ptxas_log, "ptxas register count"),
        spills=stores + loads,
        scratch=stack,
        detail=f"stack {stack} B, spill stores {stores} B, spill loads {loads} B",
    )


def _amd(asm: str, shared: int, threads: int) -> Resources:
    vgpr_spills = _last_int(r"\.vgpr_spill_count:\s+(\d+)", asm, "VGPR spill count")
    sgpr_spills = _last_int(r"\.sgpr_spill_count:\s+(\d+)", asm, "SGPR spill count")
    scratch = _last_int(r"\.private_segment_fixed_size:\s+(\d+)", asm, "scratch size")
    waves = _last_int(r";\s*Occupancy:\s+(\d+)", asm, "occupancy")
    agprs = _last_int(r";\s*NumAgprs:\s+(\d+)", asm, "AGPR count")
    sgprs = _last_int(r"\.sgpr_count:\s+(\d+)", asm, "SGPR count")
    return Resources(
        shared=shared,
        threads=threads,
        regs=_last_int(r"\.vgpr_count:\s+(\d+)", asm, "VGPR count"),
        spills=vgpr_spills,  # (SGPRs spill to VGPR lanes, register to register; to memory only via scratch)
        scratch=scratch,
        waves_per_simd=waves,
        detail=f"AGPRs {agprs}, SGPRs {sgprs}, VGPR spills {vgpr_spills}, SGPR spills to VGPR lanes "
        f"{sgpr_spills}, scratch {scratch} B, waves/SIMD {waves}",
    )
