"""Host side of the offsets' integer width (the device functions' ``WIDE`` flag)."""

from __future__ import annotations

import torch

_INT32_LIMIT = 2**31


def offsets_fit_int32(*caches: torch.Tensor) -> bool:
    """True when every element of every tensor lies less than 2**31 elements from its first element,
    through non-negative strides: then int32 offsets (``WIDE=False``) address each of them exactly
    (every partial sum of a block, slot, head and feature offset is at most the largest one)."""
    for t in caches:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"offsets_fit_int32 takes tensors, got {type(t).__name__}")
        if t.numel() == 0:
            continue
        if any(st < 0 for st in t.stride()):
            return False
        span = sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True))
        if span >= _INT32_LIMIT:
            return False
    return True
