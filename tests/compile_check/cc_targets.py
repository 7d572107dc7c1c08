"""The GPU targets of the compile check, their resource budgets, and the verdict on one compiled kernel.

Each :class:`Target` is a Triton ``GPUTarget`` (compiled with Triton's bundled toolchains, no GPU),
the device identity the packages' ``detect_arch`` sees on it (emulated while the matrix is planned,
:func:`emulated_device`), and the hardware limits a compiled kernel is held to:

======  ==========  =============  ======================  ================================================
target  GPUTarget   shared/LDS     per SM / CU             source
======  ==========  =============  ======================  ================================================
sm80    cuda 80     163 KiB/block  164 KiB, 64K regs,      CUDA C++ Programming Guide, technical
                                   64 warps, 32 blocks     specifications per compute capability (8.0)
sm90    cuda 90     227 KiB/block  228 KiB, 64K regs,      same (9.0)
                                   64 warps, 32 blocks
sm100   cuda 100    227 KiB/block  228 KiB, 64K regs,      same (10.0)
                                   64 warps, 32 blocks
gfx942  hip gfx942  64 KiB/group   64 KiB LDS, 4 SIMDs     AMD CDNA3 ISA / MI300 (LDS per CU, SIMDs per CU)
gfx950  hip gfx950  160 KiB/group  160 KiB LDS, 4 SIMDs    AMD CDNA4 ISA / MI350
======  ==========  =============  ======================  ================================================

Verdict of one compiled kernel (:func:`verdict`), each rule independent of the machine that compiles:

* shared memory (NVIDIA, the ``shared`` Triton requests per program) or LDS (AMD, the same field:
  Triton passes it as dynamic LDS) within the per-program budget;
* no spills: ptxas's spill stores/loads and stack frame (NVIDIA: local memory), the VGPR spill count and
  the scratch (private segment) size of the AMDGPU code object (AMD; SGPRs spilled into VGPR lanes stay in
  registers and are reported, not failed). The Triton kernels' tiles are table entries, chosen so that
  none spills, but for the classes of :data:`TIMED_SPILL_BYTES`, whose spilling tile H200 timings chose
  over every spill-free one (prefix-prefill, sm90, head 256, 16-bit q, fp8 cache: 3.9x faster than the
  spill-free 16-key tile); their forms fail above that class's bytes. The Gluon kernels (sm90 only) have
  fixed tiles (128 query rows, two consumer warpgroups, K/V rings) whose forms H200 timings chose, and
  some forms spill a little: for them the spills are reported and fail above :data:`GLUON_SPILL_BYTES`
  (making them spill-free is tuning work on the GPU, not a table choice). That spill verdict binds on a
  Triton where the package's plan offers the kernel (``cc_matrix.gluon_offered``). Both packages offer
  their Gluon kernels only on the Tritons of ``prefill_runtime.gluon_support.VERIFIED_TRITON_VERSIONS``
  (3.6, what the H200 runs) or with ``PREFILL_GLUON=1``; on another Triton their plans run the Triton
  kernels for those calls. The matrix still compiles and reports the Gluon forms there (their cases are
  planned with the Gluon kernels forced available), but their spills are informational: ptxas allocates
  the same kernel differently under the PTX another Triton emits (the split kernel at head 256, page 16:
  252 B on Triton 3.6, 316 B on 3.8), and a verdict there would judge code that no plan runs. On the
  verified Triton the verdict binds: ``CPU_TRITON=triton==3.6.0 nox -s compile-check``, or ``cc_run.py
  --targets sm90`` under that Triton (its other targets' verdicts are those of an older toolchain than the
  tiles were sized with).
* occupancy floor: at least one program per SM / CU (the launch can run at all) and at least one warp
  per SM sub-partition (4 per SM) / one wave per SIMD (4 per CU), so that no scheduler is left without
  a warp to issue. Attention kernels of this shape run big tiles at low occupancy on purpose (the
  flash-attention kernels run one or two programs per SM), so the floor asks no more than that.

Occupancy (programs per SM / CU) is computed from the compiled resources: NVIDIA as the CUDA occupancy
calculator does (registers allocated per warp in units of 256, 1 KiB of shared memory reserved per
block, the per-SM warp and block limits); AMD from the compiler's own waves-per-SIMD figure for the
kernel's registers (the ``; Occupancy:`` line of the AMDGPU assembly) and the LDS per CU.
"""

from __future__ import annotations

import contextlib
import os
import types
from collections.abc import Iterator
from dataclasses import dataclass

import torch

KIB = 1024


@dataclass(frozen=True)
class Target:
    """One GPU target (module docstring): ``capability`` (NVIDIA) or ``gcn`` (AMD) is what the emulated
    device reports; ``e4m3``: the platform's fp8 type for caches (``torch`` dtype name; e5m2 where
    e4m3 is not supported)."""

    name: str
    backend: str
    arch: int | str
    warp_size: int
    shared_per_program: int
    shared_per_sm: int
    e4m3: str
    capability: tuple[int, int] | None = None
    gcn: str | None = None
    regs_per_sm: int = 65536
    max_warps_per_sm: int = 64
    max_programs_per_sm: int = 32

    @property
    def nvidia(self) -> bool:
        return self.backend == "cuda"

    def gpu_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget(self.backend, self.arch, self.warp_size)


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("sm80", "cuda", 80, 32, 163 * KIB, 164 * KIB, "float8_e5m2", capability=(8, 0)),
        Target("sm90", "cuda", 90, 32, 227 * KIB, 228 * KIB, "float8_e4m3fn", capability=(9, 0)),
        Target("sm100", "cuda", 100, 32, 227 * KIB, 228 * KIB, "float8_e4m3fn", capability=(10, 0)),
        Target("gfx942", "hip", "gfx942", 64, 64 * KIB, 64 * KIB, "float8_e4m3fnuz", gcn="gfx942:sramecc+"),
        Target("gfx950", "hip", "gfx950", 64, 160 * KIB, 160 * KIB, "float8_e4m3fn", gcn="gfx950:sramecc+"),
    )
}

#: CUDA keeps this much shared memory per resident block for itself (occupancy calculator).
CUDA_RESERVED_SHARED = 1 * KIB
#: NVIDIA registers are allocated per warp in units of this many (occupancy calculator).
CUDA_REG_UNIT = 256
#: SM sub-partitions (NVIDIA) / SIMDs per CU (AMD): the warps / waves the floor asks for per SM / CU.
SCHEDULERS = 4
#: Spill bytes per thread (ptxas's stores + loads) above which a Gluon kernel's form fails.
GLUON_SPILL_BYTES = 256
#: Triton-kernel classes whose table tile spills by choice (module docstring): (target, package, head
#: bucket, q dtype class, cache) -> spill bytes per thread above which a form fails. prefix-prefill's
#: sm90 fp8-cache tile at head 256 (``configs._FP8_CACHE_OVERRIDES``): 184-344 B on Triton 3.6, 176-304
#: B on 3.8 over the matrix's forms.
TIMED_SPILL_BYTES = {("sm90", "prefix", 256, "16bit", "fp8"): 384}


def triton_spill_budget(target: str, package: str, head: int, dtype: str, cache: str | None) -> int:
    """The spill bytes a Triton kernel's form of this case may have (0 but for :data:`TIMED_SPILL_BYTES`);
    ``dtype`` is q's as the matrix names it (``fp16``, ``bf16``, ``fp32``), ``head`` the case's head size
    (its bucket and dtype class as prefix-prefill's config table keys them)."""
    from cc_matrix import DTYPES  # (cc_matrix imports this module)

    from prefix_prefill.configs import dtype_class, head_bucket

    return TIMED_SPILL_BYTES.get((target, package, head_bucket(head), dtype_class(DTYPES[dtype]), cache), 0)


@contextlib.contextmanager
def emulated_device(target: Target) -> Iterator[torch.device]:
    """``torch.cuda`` and ``torch.version.hip`` answering as one GPU of ``target`` would, for the
    packages' ``detect_arch`` (their per-device caches cleared on entry and exit); yields the device."""
    import prefix_prefill.configs as pc
    import window_prefill.configs as wc

    props = types.SimpleNamespace(gcnArchName=target.gcn or "", name=target.name)
    interpret = os.environ.pop("TRITON_INTERPRET", None)  # (which the packages read as "interpreter")
    saved = (torch.cuda.is_available, torch.cuda.get_device_capability, torch.cuda.get_device_properties,
             torch.cuda.current_device, torch.version.hip)  # fmt: skip
    torch.cuda.is_available = lambda: True
    torch.cuda.get_device_capability = lambda device=None: target.capability or (9, 4)
    torch.cuda.get_device_properties = lambda device=None: props
    torch.cuda.current_device = lambda: 0
    torch.version.hip = None if target.nvidia else "6.4"
    pc._arch_of.cache_clear()
    wc._arch_of.cache_clear()
    try:
        yield torch.device("cuda", 0)
    finally:
        (torch.cuda.is_available, torch.cuda.get_device_capability, torch.cuda.get_device_properties,
         torch.cuda.current_device, torch.version.hip) = saved  # fmt: skip
        pc._arch_of.cache_clear()
        wc._arch_of.cache_clear()
        if interpret is not None:
            os.environ["TRITON_INTERPRET"] = interpret


@dataclass
class Resources:
    """What a compile used: ``shared`` bytes per program, ``threads`` per program, ``regs`` per thread
    (AMD: VGPRs incl. AGPRs), ``spills`` (NVIDIA: spill store + load bytes; AMD: VGPR spill count),
    ``scratch`` bytes per thread (NVIDIA: stack frame; AMD: private segment), ``waves_per_simd`` (AMD:
    the compiler's occupancy figure); ``detail``: the compiler's own figures, as text."""

    shared: int
    threads: int
    regs: int
    spills: int
    scratch: int
    waves_per_simd: int = 0
    detail: str = ""


def programs_per_sm(target: Target, r: Resources) -> int:
    """Programs of this kernel that fit on one SM / CU at once (module docstring)."""
    warps = -(-r.threads // target.warp_size)
    if target.nvidia:
        per_warp = -(-r.regs * target.warp_size // CUDA_REG_UNIT) * CUDA_REG_UNIT
        by_regs = target.regs_per_sm // (per_warp * warps) if per_warp else target.max_programs_per_sm
        by_shared = target.shared_per_sm // (r.shared + CUDA_RESERVED_SHARED)
        by_warps = target.max_warps_per_sm // warps
        return min(by_regs, by_shared, by_warps, target.max_programs_per_sm)
    by_regs = r.waves_per_simd * SCHEDULERS // warps
    by_lds = target.shared_per_sm // r.shared if r.shared else by_regs
    return min(by_regs, by_lds)


def verdict(
    target: Target, r: Resources, gluon: bool = False, offered: bool = True, spill_budget: int = 0
) -> tuple[int, list[str]]:
    """``(programs per SM / CU, violations)`` of a compile (``gluon``: a Gluon kernel's; ``offered``:
    its package's plan offers it on this Triton, else its spills are informational; ``spill_budget``: a
    Triton kernel's allowance, :func:`triton_spill_budget`; module docstring); an empty list passes."""
    bad = []
    if r.shared > target.shared_per_program:
        bad.append(f"shared {r.shared} B > budget {target.shared_per_program} B")
    if gluon:
        if offered and r.spills > GLUON_SPILL_BYTES:
            bad.append(f"spills {r.spills} B > {GLUON_SPILL_BYTES} B")
    elif spill_budget:
        if r.spills > spill_budget:
            bad.append(f"spills {r.spills} B > {spill_budget} B (timed class)")
    elif r.spills or r.scratch:
        bad.append(f"spills {r.spills}, scratch {r.scratch} B")
    programs = programs_per_sm(target, r)
    warps = -(-r.threads // target.warp_size)
    if programs < 1:
        bad.append("no program fits on one SM/CU")
    elif programs * warps < SCHEDULERS:
        bad.append(f"{programs * warps} warps per SM/CU < {SCHEDULERS}")
    return programs, bad
