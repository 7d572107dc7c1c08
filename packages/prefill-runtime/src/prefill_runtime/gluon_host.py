"""The Gluon kernels' host side, shared by both kernel packages.

Owns :func:`gluon_applies` (what both packages' Gluon kernels need of a call), :func:`multiprocessors`
and :func:`persistent_grid` (the persistent forms' grids), :func:`tile_counter` (their tile counters),
the TMA descriptors :func:`gluon_descriptor` / :func:`gluon_token_rows` (the one place their
shared-memory layout is chosen) and :func:`gluon_try_launch` (a Gluon launch that falls back to the
Triton kernel when this Triton cannot build it). Gluon is imported on first use, so ``import
prefill_runtime`` does not import it. Whether this Triton may run the Gluon kernels at all:
:func:`prefill_runtime.gluon_supported`.
The Gluon device code is :mod:`prefill_runtime.gluon`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from prefill_runtime.compiled_launch import VariantMismatch


@functools.cache
def multiprocessors(index: int) -> int:
    """Multiprocessors of CUDA device ``index``; 0 off CUDA (index -1: the CPU tests' stand-in kernels
    launch there). Cached: the persistent plans' warm calls and prefix-prefill's short-query launches
    ask it per call."""
    return torch.cuda.get_device_properties(index).multi_processor_count if index >= 0 else 0


def persistent_grid(tiles: int, sms: int) -> tuple[int, int, int]:
    """A persistent Gluon launch's grid ``(programs, 1, 1)``: one program a multiprocessor (``sms`` of them,
    from :func:`multiprocessors`; at least one), never more programs than the launch's ``tiles``."""
    return min(max(sms, 1), tiles), 1, 1


# the persistent forms' tile counters, one a (device, stream)
_COUNTERS: dict[tuple[int, int], torch.Tensor] = {}


def tile_counter(index: int, stream: int | None = None) -> torch.Tensor | None:
    """The tile counter of a dynamically scheduled persistent Gluon launch on CUDA stream ``stream`` (a raw
    stream handle; None: the current one) of device ``index``: int32 ``[2]`` (the next tile, the programs
    done), zero between launches (``prefill_runtime.gluon.tiles_done``), made on first use. One a stream,
    whichever kernel launches there: launches on one stream run one after another; launches on two
    streams may overlap, so each has its own. A CUDA graph keeps the counter of the stream it was captured
    on (its replays run one after another on their stream). None for ``index`` -1 (the CPU tests'
    stand-in kernels)."""
    if index < 0:
        return None
    if stream is None:
        stream = torch._C._cuda_getCurrentRawStream(index)
    counter = _COUNTERS.get((index, stream))
    if counter is None:
        counter = torch.zeros(2, dtype=torch.int32, device=torch.device("cuda", index))
        _COUNTERS[(index, stream)] = counter
    return counter


@functools.cache
def _gluon_smem_layout(rows: int, head_dim: int, half: bool):
    """The NVMMA shared layout of a [rows, head_dim] float16 (``half``) or bfloat16 TMA block."""
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout.get_default_for([rows, head_dim], gl.float16 if half else gl.bfloat16)


def gluon_descriptor(
    base: torch.Tensor, shape: list[int], row_stride: int, rows: int, head_dim: int, swizzle: bool = True
):
    """A Gluon TMA descriptor over ``base``'s memory seen as the 2-D ``shape`` ``[n, width]`` with
    ``row_stride`` elements between rows and unit column stride, block ``[rows, head_dim]``, in the
    default NVMMA shared layout (128-byte swizzle for head 64+), or with ``swizzle=False`` the
    no-swizzle one (the box lands row-major and dense). The caller checks alignment and strides
    (16-byte base and rows); this is the one place the layout is chosen."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    if swizzle:
        layout = _gluon_smem_layout(rows, head_dim, base.dtype == torch.float16)
    else:
        layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=base.element_size() * 8, rank=2)
    return TensorDescriptor(base, shape, [row_stride, 1], [rows, head_dim], layout)


def gluon_token_rows(t: torch.Tensor, rows: int):
    """A Gluon TMA descriptor over ``t`` ``[tokens, heads, head_dim]`` seen as ``[tokens, heads *
    head_dim]`` (block ``[rows, head_dim]``), or None when one head's features are not contiguous, the
    heads of a token not adjacent, or the rows or base not 16-byte aligned."""
    d = t.shape[2]
    if not (
        t.stride(2) == 1
        and t.stride(1) == d
        and t.stride(0) >= t.shape[1] * d
        and (t.stride(0) * t.element_size()) % 16 == 0
        and t.data_ptr() % 16 == 0
    ):
        return None
    return gluon_descriptor(t, [t.shape[0], t.shape[1] * d], t.stride(0), rows, d)


def gluon_applies(q: torch.Tensor, arch: str, *, sinks: object, softcap: float, scale: float) -> bool:
    """What both packages' Gluon kernels need of a call: an sm90 launch (``arch`` as the launchers name
    it), 16-bit ``q`` with head size 64, 128 or 256 (``q`` ``[tokens, heads, head]``), fewer than 2**31
    tokens, and a positive softmax scale or soft-capping (the kernels fold the score's multiplier,
    ``softcap * log2(e)`` when capped, into the exponent). Sinks are taken (``sinks`` is not read). Each
    package adds its own terms."""
    del sinks
    return (
        arch == "sm90"
        and q.dtype in (torch.float16, torch.bfloat16)
        and q.shape[2] in (64, 128, 256)
        and q.shape[0] < 2**31
        and (scale > 0 or softcap > 0)
    )


def gluon_try_launch(launch: Callable[[], object], package: str) -> bool:
    """Run ``launch`` (a Gluon kernel's launch); True when it ran. A Triton whose Gluon cannot build or
    launch the kernel raises here: warn once on the caller's behalf and return False, so the caller
    runs its Triton kernel (and may stop offering the Gluon one). During a CUDA-graph capture the
    error is raised: a failed launch there cannot be replaced; so is a test's
    :class:`~prefill_runtime.compiled_launch.VariantMismatch`."""
    try:
        launch()
    except VariantMismatch:
        raise
    except Exception as exc:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise
        import warnings

        warnings.warn(
            f"{package}: the Gluon kernel failed to build or launch ({type(exc).__name__}: {exc}); "
            "using the Triton kernel from now on",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    return True
