"""The fp8 arguments both kernel packages take on the host: the fp8 dtypes, whether this device's Triton
can store or load one, and per-tensor scales as the kernels read them.

Owns :data:`FP8_DTYPES`, :func:`check_fp8_supported`, :func:`scale_tensor` (a scale checked and made a
1-element device tensor) and :func:`scale_of` (the same, with a float's tensor made once per value and
device, so that a warm call allocates and launches nothing but its kernel). prefix-prefill's fp8 caches
and fp8 outputs and window-prefill's fp8 outputs read their scales through these.
"""

from __future__ import annotations

import math
from typing import Union

import torch

FP8_DTYPES = tuple(
    getattr(torch, n)
    for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    if hasattr(torch, n)
)

#: A per-tensor scale as the public functions take it: a float, a 1-element tensor, or None (1.0).
Scale = Union[float, torch.Tensor, None]


def check_fp8_supported(dtype: torch.dtype, device: torch.device, name: str) -> None:
    """``name`` (an fp8 tensor of ``dtype``) on ``device``: OCP e4m3 needs compute capability 8.9+ on
    NVIDIA GPUs (Triton has no e4m3 conversion before Ada); ROCm and the CPU (interpreter) pass."""
    if device.type != "cuda" or getattr(torch.version, "hip", None):
        return
    if dtype in (torch.float8_e4m3fn,) and torch.cuda.get_device_capability(device) < (8, 9):
        cap = torch.cuda.get_device_capability(device)
        raise ValueError(
            f"{name} is {dtype}, which Triton supports only on compute capability >= 8.9 "
            f"(this device is {cap[0]}.{cap[1]}); use fp8_e5m2 or a 16-bit dtype"
        )


def scale_tensor(s: Scale, name: str, device: torch.device) -> torch.Tensor | None:
    """A per-tensor scale as a 1-element device tensor (no host sync; None stays None): a tensor of one
    floating-point value on ``device`` (itself where it is ``[1]``, else viewed as ``[1]``: a view costs a
    warm call ~0.8 us a scale), or a finite positive float or int."""
    if s is None:
        return None
    if isinstance(s, torch.Tensor):
        if s.numel() != 1:
            raise ValueError(f"{name} must hold one value (per-tensor scale), got shape {tuple(s.shape)}")
        if not s.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point tensor, got {s.dtype}")
        if s.device != device:
            raise ValueError(f"{name} is on {s.device} but q is on {device}; all tensors must share a device")
        return s if s.dim() == 1 else s.reshape(1)
    if isinstance(s, (int, float)) and not isinstance(s, bool):
        if not (math.isfinite(float(s)) and float(s) > 0):
            raise ValueError(f"{name} must be a finite positive fp8 scale, got {s}")
        return torch.full((1,), float(s), dtype=torch.float32, device=device)
    raise TypeError(f"{name} must be a float or a 1-element tensor, got {type(s).__name__}")


_SCALES: dict = {}  # (value, device) -> the float32 [1] tensor scale_of made for it (at most 64)


def scale_of(s: Scale, name: str, device: torch.device) -> torch.Tensor:
    """An fp8 scale as the kernel reads it: a 1-element device tensor (a tensor given stays itself; a float,
    or None for 1.0, becomes a float32 tensor made once per value and device, so that a call launches
    nothing else; during a CUDA-graph capture a new one, recorded into the graph)."""
    if isinstance(s, torch.Tensor):
        return scale_tensor(s, name, device)
    if isinstance(s, bool):  # (before the cache: True would find 1.0's tensor, an equal key)
        raise TypeError(f"{name} must be a float or a 1-element tensor, got bool")
    value = 1.0 if s is None else s
    key = (value, device)
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    t = None if capturing else _SCALES.get(key)
    if t is None:
        t = scale_tensor(value, name, device)
        if not capturing and len(_SCALES) < 64:
            _SCALES[key] = t
    return t
