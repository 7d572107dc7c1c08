"""Comparing a kernel output with the float64 reference, with per-dtype tolerances."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# (atol on max |out - ref|, rtol on ||out - ref|| / ||ref||) by the kernel's output dtype.
# float32 allows for tf32 tl.dot on GPUs.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-9, 1e-10),
    torch.float32: (5e-3, 1e-3),
    torch.float16: (1e-2, 2e-3),
    torch.bfloat16: (6e-2, 1.6e-2),
}
_FP8_TOLERANCE = (0.25, 6e-2)
_TINY = 1e-30


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """Default ``(atol, rtol)`` for outputs of ``dtype``."""
    if dtype in TOLERANCES:
        return TOLERANCES[dtype]
    if dtype.is_floating_point and dtype.itemsize == 1:
        return _FP8_TOLERANCE
    raise TypeError(f"no default tolerance for output dtype {dtype}; pass atol= and rtol=")


@dataclass(frozen=True)
class Comparison:
    """Result of :func:`compare`; ``bool(c)`` is ``c.ok``."""

    max_abs: float
    rel_l2: float
    ok: bool
    atol: float
    rtol: float
    nonfinite: int = 0

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        bad = f" nonfinite={self.nonfinite}" if self.nonfinite else ""
        verdict = "OK" if self.ok else "FAIL"
        return (
            f"max_abs={self.max_abs:.3e} rel_l2={self.rel_l2:.3e}{bad} "
            f"(atol={self.atol:.1e}, rtol={self.rtol:.1e}) {verdict}"
        )


def _check_pair(out: object, ref: object, name: str) -> None:
    """``out`` (called ``name``) and ``ref``: floating-point tensors of one shape."""
    if not isinstance(out, torch.Tensor) or not isinstance(ref, torch.Tensor):
        raise TypeError(f"{name} and ref must be torch.Tensors")
    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"{name} and ref shapes differ: {tuple(out.shape)} vs {tuple(ref.shape)}")
    if not out.dtype.is_floating_point or not ref.dtype.is_floating_point:
        raise TypeError(f"{name} and ref must be floating point, got {out.dtype} and {ref.dtype}")


def compare(
    out: torch.Tensor,
    ref: torch.Tensor,
    dtype: torch.dtype | None = None,
    *,
    atol: float | None = None,
    rtol: float | None = None,
) -> Comparison:
    """Compare a kernel output ``out`` with a reference ``ref`` (same shape).

    ``max_abs = max |out - ref|``, ``rel_l2 = ||out - ref|| / max(||ref||, tiny)`` (computed in
    float64). ``ok`` iff every element of ``out`` is finite, ``max_abs <= atol`` and
    ``rel_l2 <= rtol``. Tolerances default by ``dtype`` (default ``out.dtype``): float32 5e-3 / 1e-3
    (tf32-tolerant), float16 1e-2 / 2e-3, bfloat16 6e-2 / 1.6e-2, fp8 0.25 / 6e-2.
    """
    _check_pair(out, ref, "out")
    d_atol, d_rtol = tolerance(dtype if dtype is not None else out.dtype)
    atol = d_atol if atol is None else float(atol)
    rtol = d_rtol if rtol is None else float(rtol)
    o = out.detach().to(device=ref.device, dtype=torch.float64)
    r = ref.detach().to(torch.float64)
    nonfinite = int((~torch.isfinite(o)).sum().item())
    if o.numel() == 0:
        max_abs, rel = 0.0, 0.0
    else:
        diff = o - r
        max_abs = float(diff.abs().max().item())
        rel = float(torch.linalg.vector_norm(diff).item()) / max(
            float(torch.linalg.vector_norm(r).item()), _TINY
        )
    ok = nonfinite == 0 and max_abs <= atol and rel <= rtol
    if max_abs != max_abs:  # NaN
        ok = False
    return Comparison(max_abs=max_abs, rel_l2=rel, ok=ok, atol=atol, rtol=rtol, nonfinite=nonfinite)


#: Default ``atol`` of :func:`compare_lse` (natural-log units; the kernels keep the LSE in float32).
LSE_ATOL = 1e-3


def compare_lse(
    lse: torch.Tensor,
    ref: torch.Tensor,
    *,
    atol: float = LSE_ATOL,
    rtol: float | None = None,
) -> Comparison:
    """Compare a kernel's softmax log-sum-exp ``lse`` (e.g. ``[H, total_q]`` float32) with a reference.

    ``-inf`` marks rows without any visible key: wherever ``ref`` is ``-inf``, ``lse`` must be exactly
    ``-inf``, and wherever ``ref`` is finite ``lse`` must be finite. ``nonfinite`` counts the elements
    that break this (and any NaN or ``+inf`` in ``lse``). ``max_abs`` and ``rel_l2`` are taken over the
    finite rows only (float64). ``ok`` iff ``nonfinite == 0``, ``max_abs <= atol`` and, when ``rtol``
    is given, ``rel_l2 <= rtol`` (default: the absolute bound only).
    """
    _check_pair(lse, ref, "lse")
    o = lse.detach().to(device=ref.device, dtype=torch.float64)
    r = ref.detach().to(torch.float64)
    if bool(torch.isnan(r).any()) or bool((r == float("inf")).any()):
        raise ValueError("ref holds NaN or +inf: a log-sum-exp is finite or -inf")
    empty = r == float("-inf")
    bad = (
        torch.isnan(o) | (o == float("inf")) | (empty & (o != float("-inf"))) | (~empty & ~torch.isfinite(o))
    )
    nonfinite = int(bad.sum().item())
    both = ~empty & torch.isfinite(o)
    if bool(both.any()):
        diff = o[both] - r[both]
        max_abs = float(diff.abs().max().item())
        rel = float(torch.linalg.vector_norm(diff).item()) / max(
            float(torch.linalg.vector_norm(r[both]).item()), _TINY
        )
    else:
        max_abs, rel = 0.0, 0.0
    rtol_v = float("inf") if rtol is None else float(rtol)
    ok = nonfinite == 0 and max_abs <= float(atol) and rel <= rtol_v
    return Comparison(max_abs=max_abs, rel_l2=rel, ok=ok, atol=float(atol), rtol=rtol_v, nonfinite=nonfinite)
