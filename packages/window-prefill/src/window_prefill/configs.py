"""Per-architecture launch configurations: a static table, looked up once per (arch, head dim, dtype,
causal), read by :func:`window_prefill.plan.plan`. No autotuning happens on the call path; the
benchmark's ``--sweep`` is how the table is tuned. Also: the architecture of a device
(:func:`detect_arch`) and the static shared-memory estimate the tests hold the table to.

Table key: ``(arch, head_dim_bucket, dtype_class, causal)`` with

* ``arch`` in :data:`ARCHS`: ``"sm90"`` (H100/H200), ``"sm100"`` (B200/B300), ``"sm80"`` (A100),
  ``"gfx942"`` (MI300), ``"gfx950"`` (MI350), ``"interpreter"`` (``TRITON_INTERPRET=1`` / CPU
  tensors) and ``"default"`` (any other GPU; sized to fit 64 KiB of shared memory);
* ``head_dim_bucket`` in :data:`HEAD_DIM_BUCKETS`: the smallest bucket >= the head dim (64, 128, 256);
* ``dtype_class``: ``"16bit"`` (fp16, bf16) or ``"fp32"``;
* ``causal``: bool.

Value: :class:`Config` ``(block_m, block_n, num_warps, num_stages)``. The plan changes a few fields
of an entry for calls with 64-bit token offsets (K or V past 2**31 elements): :func:`wide_offsets_config`.
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

import torch


class Config(NamedTuple):
    """One launch configuration: query tile rows, key tile rows, warps, software-pipeline stages, and
    whether interior K/V blocks load through TMA tensor descriptors where the inputs allow it (sm90,
    16-bit, unpadded head dim, 16-byte rows), and whether the warp-specialised Gluon kernel
    (``window_prefill.gluon_kernel``, its own fixed 128-row tiles) runs instead where it applies; the
    other fields then describe the Triton kernel that runs where it does not (sinks, soft-capping,
    strides TMA cannot take, narrow windows). :func:`window_prefill.plan.plan` applies both flags."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    tma: bool = False
    gluon: bool = False


ARCHS = ("sm90", "sm100", "sm80", "gfx942", "gfx950", "interpreter", "default")
HEAD_DIM_BUCKETS = (64, 128, 256)
DTYPE_CLASSES = ("16bit", "fp32")
MAX_HEAD_DIM = 256

# Shared memory (LDS on AMD) available to one program, bytes. "default" is the smallest we target
# (Turing's 64 KiB); the interpreter has no limit.
SHARED_MEMORY_LIMIT: dict[str, int] = {
    "sm90": 227 * 1024,
    "sm100": 227 * 1024,
    "sm80": 163 * 1024,
    "gfx942": 64 * 1024,
    "gfx950": 160 * 1024,
    "default": 64 * 1024,
}

_C = Config
# (arch, head_dim_bucket, dtype_class) -> Config, for causal and non-causal alike unless overridden below.
_BASE: dict[tuple[str, int, str], Config] = {
    # Hopper, 16-bit: the Gluon kernel where it applies and the window is wide (plan._GLUON_MIN_WIDTH);
    # these Triton tiles for narrow windows, sinks and soft-capping: the largest that compile for sm_90a
    # without spills in every form of the compile check (tests/compile_check; 128x128 tiles spill 28-48 B
    # at head 128, two stages at head 256 24-48 B).
    ("sm90", 64, "16bit"): _C(64, 32, 4, 3, False, True),
    ("sm90", 128, "16bit"): _C(128, 64, 8, 2, False, True),
    ("sm90", 256, "16bit"): _C(128, 32, 8, 1, False, True),
    # fp32 (IEEE dots, FMA loops): 16/16 tiles spill nothing; larger ones spill 2-45 KB per thread.
    ("sm90", 64, "fp32"): _C(16, 16, 4, 2),
    ("sm90", 128, "fp32"): _C(16, 16, 4, 2),
    ("sm90", 256, "fp32"): _C(16, 16, 4, 2),
    # Blackwell (B200/B300, compute capability 10.x; 227 KiB): the Triton kernel. Untimed: the largest
    # tiles that compile without spills for sm_100a in every form of the compile check
    # (tests/compile_check; 4 warps spill at 64+ query rows).
    ("sm100", 64, "16bit"): _C(128, 64, 8, 2),
    ("sm100", 128, "16bit"): _C(128, 64, 8, 2),
    ("sm100", 256, "16bit"): _C(64, 32, 8, 2),
    ("sm100", 64, "fp32"): _C(16, 16, 4, 1),
    ("sm100", 128, "fp32"): _C(16, 16, 4, 1),
    ("sm100", 256, "fp32"): _C(16, 16, 8, 2),  # 4 warps spill 40 B with sinks
    # Ampere (163 KiB). Untimed: the largest query tile that compiles for sm_80 without spills in every
    # form of the compile check (mma.sync keeps the accumulator in registers: 8 warps share it).
    ("sm80", 64, "16bit"): _C(128, 64, 8, 2),
    ("sm80", 128, "16bit"): _C(128, 32, 8, 2),
    ("sm80", 256, "16bit"): _C(64, 32, 8, 2),
    ("sm80", 64, "fp32"): _C(16, 16, 4, 2),  # as sm90: no spills
    ("sm80", 128, "fp32"): _C(16, 16, 4, 2),
    ("sm80", 256, "fp32"): _C(16, 16, 4, 2),
    # MI300 (64 KiB LDS): one or two stages, every entry checked by shared_memory_bytes in the tests.
    ("gfx942", 64, "16bit"): _C(128, 64, 4, 2),
    ("gfx942", 128, "16bit"): _C(128, 64, 4, 1),
    ("gfx942", 256, "16bit"): _C(64, 32, 4, 1),
    ("gfx942", 64, "fp32"): _C(64, 32, 4, 1),
    ("gfx942", 128, "fp32"): _C(32, 32, 4, 1),
    ("gfx942", 256, "fp32"): _C(32, 16, 4, 1),
    # MI350 (160 KiB LDS).
    ("gfx950", 64, "16bit"): _C(128, 64, 4, 2),
    # 4 warps: each keeps more of its 512 VGPRs per lane; 8 spill at heads 80-256 in the compile check.
    ("gfx950", 128, "16bit"): _C(128, 64, 4, 2),
    ("gfx950", 256, "16bit"): _C(128, 32, 4, 2),
    ("gfx950", 64, "fp32"): _C(64, 32, 4, 2),
    ("gfx950", 128, "fp32"): _C(64, 32, 4, 2),
    ("gfx950", 256, "fp32"): _C(32, 32, 4, 1),
    # Interpreter: tiny tiles so short test sequences cross many query and key tiles.
    **{("interpreter", hd, dc): _C(16, 16, 1, 1) for hd in HEAD_DIM_BUCKETS for dc in DTYPE_CLASSES},
    # Any other GPU (sm75, sm86, sm89, sm120, gfx90a, ...): fits 64 KiB.
    ("default", 64, "16bit"): _C(64, 64, 4, 2),
    ("default", 128, "16bit"): _C(64, 32, 4, 2),
    ("default", 256, "16bit"): _C(32, 32, 4, 1),
    ("default", 64, "fp32"): _C(16, 16, 4, 1),
    ("default", 128, "fp32"): _C(16, 16, 4, 1),
    ("default", 256, "fp32"): _C(16, 16, 4, 1),
}

# Entries where the causal kernel wants something else than the shared base (tuned with --sweep).
_CAUSAL_OVERRIDES: dict[tuple[str, int, str, bool], Config] = {
    # Hopper head 128 causal: 3 stages with TMA K/V (the H200's LLM shape ran fastest so at 128x128 tiles).
    ("sm90", 128, "16bit", True): _C(128, 64, 8, 3, True, True),
}

# (arch, head_dim_bucket, dtype_class) -> fields to change for calls with 64-bit token offsets
# (``WIDE_OFFSETS``), causal and non-causal alike.
_WIDE_OFFSETS_OVERRIDES: dict[tuple[str, int, str], dict[str, int]] = {
    # Hopper head 256, 16-bit: the 128x32 tile sits at 253-255 registers with 64-bit offsets and
    # spills 16 B with the LSE (Triton 3.8; 3.6: 64-104 B in each of the six wide forms compiled); 64
    # query rows need 229-246 registers and spill nothing.
    ("sm90", 256, "16bit"): dict(block_m=64),
}

CONFIGS: dict[tuple[str, int, str, bool], Config] = {
    **{(a, hd, dc, causal): cfg for (a, hd, dc), cfg in _BASE.items() for causal in (False, True)},
    **_CAUSAL_OVERRIDES,
}


def head_dim_bucket(head_dim: int) -> int:
    """Smallest bucket in :data:`HEAD_DIM_BUCKETS` that holds ``head_dim`` (1..256)."""
    for b in HEAD_DIM_BUCKETS:
        if head_dim <= b:
            return b
    raise ValueError(f"head_dim must be <= {MAX_HEAD_DIM}, got {head_dim}")


def dtype_class(dtype: torch.dtype) -> str:
    """``"fp32"`` for float32, ``"16bit"`` for float16/bfloat16."""
    if dtype == torch.float32:
        return "fp32"
    if dtype in (torch.float16, torch.bfloat16):
        return "16bit"
    raise TypeError(f"unsupported dtype {dtype}; expected float16, bfloat16 or float32")


def block_d(head_dim: int) -> int:
    """Padded head-dim tile: next power of two, at least 16 (the smallest tl.dot K)."""
    return max(16, 1 << (head_dim - 1).bit_length())  # next power of two, plain ints


def shared_memory_bytes(config: Config, head_dim: int, dtype: torch.dtype) -> int:
    """Static estimate of the shared memory (LDS) one program needs: the Q tile plus one K and one V
    tile per pipeline stage (at least one), all at ``block_d(head_dim)`` width. P stays in registers."""
    elem = torch.empty((), dtype=dtype).element_size()
    bd = block_d(head_dim)
    return elem * bd * (config.block_m + 2 * config.block_n * max(1, config.num_stages))


@functools.cache
def _arch_of(device_type: str, index: int | None) -> str:
    if os.environ.get("TRITON_INTERPRET", "0") == "1" or device_type == "cpu":
        return "interpreter"
    if getattr(torch.version, "hip", None):
        name = str(torch.cuda.get_device_properties(index).gcnArchName).split(":")[0]
        return name if name in ("gfx942", "gfx950") else "default"
    major, minor = torch.cuda.get_device_capability(index)
    if major == 9:
        return "sm90"
    if major == 10:
        return "sm100"
    if (major, minor) == (8, 0):
        return "sm80"
    return "default"


def detect_arch(device: torch.device | str | None = None) -> str:
    """Architecture key of ``device`` (cached per device): one of :data:`ARCHS`."""
    device = torch.device("cuda" if device is None else device)
    return _arch_of(device.type, device.index)


@functools.cache
def get_config(head_dim: int, dtype: torch.dtype, causal: bool, arch: str) -> Config:
    """The shipped :class:`Config` for this problem class on ``arch`` (unknown archs use "default")."""
    key = (arch if arch in ARCHS else "default", head_dim_bucket(head_dim), dtype_class(dtype), bool(causal))
    return CONFIGS[key]


def wide_offsets_config(cfg: Config, head_dim: int, dtype: torch.dtype, arch: str) -> Config:
    """``cfg`` with the fields ``_WIDE_OFFSETS_OVERRIDES`` changes for a call with 64-bit token offsets
    (the plan's choice: the 128-row tile spills there). The query tile changes the rows' rounding, so
    at head 256 on sm90 a call whose K or V passes 2**31 elements is not bitwise the same as a smaller
    one (as the plan's Gluon / Triton choice by window width already makes rows depend on the width a
    call's ``max_len`` allows)."""
    key = (arch if arch in ARCHS else "default", head_dim_bucket(head_dim), dtype_class(dtype))
    fields = _WIDE_OFFSETS_OVERRIDES.get(key, {})
    return cfg._replace(**fields) if fields else cfg
