"""Launch configurations: one static table per architecture, looked up without autotuning.

Key: ``(arch, head-size bucket, dtype class, page-size class)``

* ``arch``: ``"sm90"`` (Hopper), ``"sm100"`` (Blackwell, compute capability 10.x), ``"sm80"`` (A100,
  164 KiB shared memory), ``"gfx942"``
  (MI300, 64 KiB LDS), ``"gfx950"`` (MI350, 160 KiB LDS), ``"interpreter"`` (``TRITON_INTERPRET=1``),
  ``"default"`` (anything else: conservative, fits 99 KiB).
* head-size bucket: 64 (``D <= 64``), 128 (``D <= 128``), 256 (``D <= 256``); the kernel pads ``D``
  to the next power of two, so 80/96/112 run in the 128 bucket and 192 in the 256 bucket.
* dtype class of ``q``: ``"16bit"`` (fp16, bf16) or ``"fp32"``.
* page-size class: ``"1"``, ``"small"`` (<= 16), ``"large"`` (> 16). The page size may change the
  context tile ``BLOCK_N_CTX`` or the pipeline depth, never ``BLOCK_M``/``BLOCK_N`` (tested): any
  page size, 544 or 1056 included, runs the same tiles as a power of two.

Two classes inside a key change a few fields of its entry (:func:`get_config`): heads narrower than
:data:`NARROW_HEAD` (padded to the 16-wide feature tile, their feature loads masked;
``_NARROW_HEAD_OVERRIDES``) and fp8 KV caches (``_FP8_CACHE_OVERRIDES``).

The entries are starting points (sm90 to be tuned on the GPU); ``python bench/prefix_prefill.py
--sweep`` times a grid. :func:`shared_memory_bytes` is a conservative static model of the shared
memory (LDS) a config needs; the AMD entries are checked against the LDS size by a CPU test.
"""

from __future__ import annotations

import functools
import os
from dataclasses import asdict, dataclass

import torch

ARCHS = ("sm90", "sm100", "sm80", "gfx942", "gfx950", "interpreter", "default")
HEAD_BUCKETS = (64, 128, 256)
DTYPE_CLASSES = ("16bit", "fp32")
PAGE_CLASSES = ("1", "small", "large")
MAX_HEAD_SIZE = 256
#: CUDA's limit on a launch grid's y and z dimensions (query tiles or heads, sequences).
MAX_GRID_YZ = 65535

#: Shared memory (NVIDIA, opt-in maximum per block) or LDS (AMD) per architecture, in bytes.
SHARED_MEMORY_BUDGET = {
    "sm90": 227 * 1024,
    "sm100": 227 * 1024,
    "sm80": 163 * 1024,
    "gfx942": 64 * 1024,
    "gfx950": 160 * 1024,
    "interpreter": 1 << 30,
    "default": 99 * 1024,
}


@dataclass(frozen=True)
class KernelConfig:
    """Tile sizes and launch options of one kernel variant.

    ``BLOCK_M`` query rows per program, ``BLOCK_N`` new-token keys per step, ``BLOCK_N_CTX`` cached
    context keys per step (any value: tiles may straddle pages).
    """

    BLOCK_M: int
    BLOCK_N: int
    BLOCK_N_CTX: int
    num_warps: int
    num_stages: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def head_bucket(head_size: int) -> int:
    """64, 128 or 256: the smallest bucket holding ``head_size`` (ValueError above 256)."""
    for b in HEAD_BUCKETS:
        if head_size <= b:
            return b
    raise ValueError(f"head size must be <= {MAX_HEAD_SIZE}, got {head_size}")


def dtype_class(dtype: torch.dtype) -> str:
    return "fp32" if dtype == torch.float32 else "16bit"


def page_class(page_size: int) -> str:
    if page_size == 1:
        return "1"
    return "small" if page_size <= 16 else "large"


def _c(bm: int, bn: int, bnc: int, w: int, s: int) -> KernelConfig:
    return KernelConfig(bm, bn, bnc, w, s)


# (arch, head bucket, dtype class) -> config shared by every page class.
_BASE: dict[tuple[str, int, str], KernelConfig] = {
    # Hopper: 227 KiB shared memory. On a Triton that runs the Gluon kernels (plan.py) they take the
    # plain causal calls at heads 64/128/256; this kernel runs the rest (windows, ALiBi, sinks,
    # soft-capping, fp8 caches, HND caches, other head sizes), and every call on other Tritons. The
    # entries are the largest tiles that compile for sm_90a without spills in every form of the
    # compile check (tests/compile_check). H200 timings of the plain llama/qwen calls (split cache,
    # page 544; bench/results/NOTES.md 2026-11-29, 5bc0f97) favour wider tiles that spill: head 128
    # 128/128/128/8/3 10.63 ms vs 13.43 for 128/64/64/8/3; head 256 128/64/64/8/2 4.86 ms vs 9.90 for
    # 64/64/64/8/2. Those tiles spill 100-800 B per thread in the option forms this kernel serves.
    ("sm90", 64, "16bit"): _c(128, 64, 64, 8, 3),
    ("sm90", 128, "16bit"): _c(128, 64, 64, 8, 3),
    ("sm90", 256, "16bit"): _c(64, 32, 32, 8, 2),
    # fp32 (IEEE dots, lowered to FMA loops): 16/16/16 tiles (H200, NOTES.md 2026-11-29, 87e1591: 18.1 ->
    # 1.6 ms at head 128 against 64/32/32/4/2, which spills KBs). With 2 stages 4 warps spill 16-24 B
    # at heads 64-128 and 8 warps 8 B at head 64: 8 warps at 128/256, one stage at 64.
    ("sm90", 64, "fp32"): _c(16, 16, 16, 4, 1),
    ("sm90", 128, "fp32"): _c(16, 16, 16, 8, 2),
    ("sm90", 256, "fp32"): _c(16, 16, 16, 8, 2),
    # Blackwell (B200/B300, compute capability 10.x; 227 KiB): the Triton kernel (the Gluon kernels are
    # Hopper-only). Untimed: the largest tiles that compile without spills for sm_100a in every form of
    # the compile check (tests/compile_check); 4 warps spill at 128 query rows. Tune on a B200.
    ("sm100", 64, "16bit"): _c(128, 64, 64, 8, 2),
    ("sm100", 128, "16bit"): _c(128, 32, 32, 8, 2),
    ("sm100", 256, "16bit"): _c(64, 32, 32, 8, 2),
    # fp32: two stages spill 16 B at head 80 (new tokens read from an NHD cache); one stage none.
    ("sm100", 64, "fp32"): _c(16, 16, 16, 4, 1),
    ("sm100", 128, "fp32"): _c(16, 16, 16, 4, 1),
    ("sm100", 256, "fp32"): _c(16, 16, 16, 4, 1),
    # Ampere A100 (163 KiB); Ada/consumer parts map to "default". Untimed: the largest query tile that
    # compiles for sm_80 without spills in every form of the compile check, with two stages; mma.sync
    # keeps the accumulator in registers, so 8 warps share it (4 warps spill 0.1-3 KB per thread).
    ("sm80", 64, "16bit"): _c(128, 32, 32, 8, 2),
    ("sm80", 128, "16bit"): _c(64, 32, 32, 8, 2),
    ("sm80", 256, "16bit"): _c(64, 16, 16, 8, 2),
    # fp32 as sm90 (offline sm_80: 64/32/32/4/2 spills 62 KB, 16/16/16/4/2 none; NOTES.md 2026-11-29,
    # 378a544); 8 warps at head 64, where 4 spill 24 B in the compile check.
    ("sm80", 64, "fp32"): _c(16, 16, 16, 8, 2),
    ("sm80", 128, "fp32"): _c(16, 16, 16, 4, 2),
    ("sm80", 256, "fp32"): _c(16, 16, 16, 4, 2),
    # MI300 (gfx942): 64 KiB LDS, 64-lane wavefronts.
    ("gfx942", 64, "16bit"): _c(128, 64, 64, 4, 1),
    ("gfx942", 128, "16bit"): _c(64, 64, 64, 4, 1),
    ("gfx942", 256, "16bit"): _c(32, 32, 32, 4, 1),
    ("gfx942", 64, "fp32"): _c(64, 32, 32, 4, 1),
    ("gfx942", 128, "fp32"): _c(32, 32, 32, 4, 1),
    ("gfx942", 256, "fp32"): _c(16, 16, 16, 4, 1),
    # MI350 (gfx950): 160 KiB LDS.
    ("gfx950", 64, "16bit"): _c(128, 64, 64, 4, 2),
    ("gfx950", 128, "16bit"): _c(128, 64, 64, 4, 2),
    ("gfx950", 256, "16bit"): _c(64, 64, 64, 4, 1),
    ("gfx950", 64, "fp32"): _c(64, 64, 64, 4, 1),
    ("gfx950", 128, "fp32"): _c(64, 32, 32, 4, 1),  # two stages spill VGPRs
    ("gfx950", 256, "fp32"): _c(32, 32, 32, 4, 1),
    # Triton interpreter (CPU tests): small tiles so short sequences still cross tile edges.
    ("interpreter", 64, "16bit"): _c(16, 16, 16, 1, 1),
    ("interpreter", 128, "16bit"): _c(16, 16, 16, 1, 1),
    ("interpreter", 256, "16bit"): _c(16, 16, 16, 1, 1),
    ("interpreter", 64, "fp32"): _c(16, 16, 16, 1, 1),
    ("interpreter", 128, "fp32"): _c(16, 16, 16, 1, 1),
    ("interpreter", 256, "fp32"): _c(16, 16, 16, 1, 1),
    # Unknown GPUs (sm75, sm86/89, sm120, other AMD): fits 99 KiB with one stage.
    ("default", 64, "16bit"): _c(128, 64, 64, 4, 1),
    ("default", 128, "16bit"): _c(128, 64, 64, 4, 1),
    ("default", 256, "16bit"): _c(64, 32, 32, 4, 1),
    ("default", 64, "fp32"): _c(16, 16, 16, 4, 1),
    ("default", 128, "fp32"): _c(16, 16, 16, 4, 1),
    ("default", 256, "fp32"): _c(16, 16, 16, 4, 1),
}

# (arch, page class) -> fields to change for that page class. Only BLOCK_N_CTX and num_stages
# may appear here (BLOCK_M/BLOCK_N never depend on the page size). Empty until GPU tuning shows
# a page class that wants something else.
_PAGE_OVERRIDES: dict[tuple[str, str], dict[str, int]] = {}

#: Heads narrower than this run in the 16-wide feature tile (``tl.dot`` takes K >= 16) with masked
#: feature loads: :data:`_NARROW_HEAD_OVERRIDES` applies to them.
NARROW_HEAD = 16

# (arch, dtype class) -> fields to change for heads narrower than NARROW_HEAD.
_NARROW_HEAD_OVERRIDES: dict[tuple[str, str], dict[str, int]] = {
    # sm80, 16-bit: ptxas (Triton 3.8) gives the padded head's kernel 128 registers (two programs per
    # SM), and with two stages it spills 24 B (bidirectional window, new tokens in the context loop,
    # head 8); one stage needs 102 registers and spills nothing (Triton 3.6: 98).
    ("sm80", "16bit"): dict(num_stages=1),
}

# (arch, head bucket, dtype class) -> fields to change when the KV cache is fp8 (its tiles are converted
# to q's dtype in registers).
_FP8_CACHE_OVERRIDES: dict[tuple[str, int, str], dict[str, int]] = {
    # sm90 head 256, 16-bit q: 128/64/64/8/2 (two warpgroups of 64 rows, as wgmma takes them). H200,
    # bf16 q, e4m3 cache, 4 x (8192 + 2048), 16/2 heads: 4.13 ms NHD / 5.10 ms split at page 16 against
    # 15.9 / 19.8 ms for 64/16/16 (spill-free), 5.4-6.1 for 64/32/32/4/1 and 5.6-6.3 for 128/32/32; the
    # same order with a 4095 window, sinks and the LSE. It spills (Triton 3.6: 184 B plain causal, 344 B
    # with sinks, a window and fp8 output), within the compile check's timed-class budget.
    ("sm90", 256, "16bit"): dict(BLOCK_M=128, BLOCK_N=64, BLOCK_N_CTX=64),
}

#: The full table: (arch, head bucket, dtype class, page class) -> KernelConfig.
CONFIGS: dict[tuple[str, int, str, str], KernelConfig] = {
    (arch, hb, dc, pc): KernelConfig(**{**cfg.as_dict(), **_PAGE_OVERRIDES.get((arch, pc), {})})
    for (arch, hb, dc), cfg in _BASE.items()
    for pc in PAGE_CLASSES
}


def shared_memory_bytes(cfg: KernelConfig, head_size: int, dtype_bytes: int) -> int:
    """Conservative static estimate of the shared memory / LDS ``cfg`` needs, in bytes.

    Model: the Q tile ``[BLOCK_M, D]`` once, the K and V tiles ``[max(BLOCK_N, BLOCK_N_CTX), D]``
    once per pipeline stage (``max(1, num_stages)`` buffers), and the ``[BLOCK_M, BLOCK_N]``
    probability tile for its layout conversion before the PV dot; ``D`` padded to a power of two
    (at least 16, the kernel's narrowest feature tile).
    """
    d = max(16, 1 << max(0, (int(head_size) - 1).bit_length()))
    bn = max(cfg.BLOCK_N, cfg.BLOCK_N_CTX)
    q_tile = cfg.BLOCK_M * d * dtype_bytes
    kv_tiles = max(1, cfg.num_stages) * 2 * bn * d * dtype_bytes
    p_tile = cfg.BLOCK_M * bn * dtype_bytes
    return q_tile + kv_tiles + p_tile


@functools.cache
def get_config(
    arch: str, head_size: int, dtype: torch.dtype, page_size: int, cache_fp8: bool = False
) -> KernelConfig:
    """The table entry for a call (``cache_fp8``: the KV cache is fp8), with the narrow-head and
    fp8-cache fields of its class; unknown archs fall back to ``"default"``."""
    key_arch = arch if arch in ARCHS else "default"
    cfg = CONFIGS[(key_arch, head_bucket(head_size), dtype_class(dtype), page_class(page_size))]
    fields: dict[str, int] = {}
    if head_size < NARROW_HEAD:
        fields.update(_NARROW_HEAD_OVERRIDES.get((key_arch, dtype_class(dtype)), {}))
    if cache_fp8:
        fields.update(_FP8_CACHE_OVERRIDES.get((key_arch, head_bucket(head_size), dtype_class(dtype)), {}))
    return KernelConfig(**{**cfg.as_dict(), **fields}) if fields else cfg


def config_key(arch: str, head_size: int, dtype: torch.dtype, page_size: int) -> tuple[str, int, str, str]:
    key_arch = arch if arch in ARCHS else "default"
    return (key_arch, head_bucket(head_size), dtype_class(dtype), page_class(page_size))


@functools.cache
def _arch_of(device_type: str, index: int | None) -> str:
    if os.environ.get("TRITON_INTERPRET", "0") == "1" or device_type == "cpu":
        return "interpreter"
    if device_type != "cuda" or not torch.cuda.is_available():
        return "default"
    if getattr(torch.version, "hip", None):
        name = getattr(torch.cuda.get_device_properties(index), "gcnArchName", "")
        for arch in ("gfx942", "gfx950"):
            if name.startswith(arch):
                return arch
        return "default"
    major, minor = torch.cuda.get_device_capability(index)
    if (major, minor) == (9, 0):
        return "sm90"
    if major == 10:
        return "sm100"
    if (major, minor) == (8, 0):
        return "sm80"
    return "default"


def detect_arch(device: torch.device) -> str:
    """The table's arch name for ``device`` (``"interpreter"`` under ``TRITON_INTERPRET=1``)."""
    index = device.index
    if device.type == "cuda" and index is None and torch.cuda.is_available():
        index = torch.cuda.current_device()
    return _arch_of(device.type, index)
