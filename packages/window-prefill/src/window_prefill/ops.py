"""The kernel launch as a PyTorch custom op: ``torch.ops.window_prefill.fwd``.

Both public functions (:mod:`window_prefill.api`) check their arguments in Python, allocate the
output if needed and then call this op (:func:`call`), whose kernel is
:func:`window_prefill.launch.forward`, so ``torch.compile`` (Dynamo, AOTAutograd, Inductor) sees one
opaque operator that mutates ``out`` instead of tracing into Triton's launcher, and CUDA graphs capture
the one kernel launch. In eager mode with no Python dispatch mode active they run the op's kernel
directly, without the dispatcher's cost.

Schema (every argument a tensor, an optional tensor, an int, a float or a bool)::

    window_prefill::fwd(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor starts, Tensor? lens,
                        SymInt max_len, bool causal, SymInt window_left, SymInt window_right,
                        float softmax_scale, Tensor? sinks, bool sinks_bias_key0, SymInt block_m=0,
                        SymInt block_n=0, SymInt num_warps=0, SymInt num_stages=0, SymInt tma=0,
                        float softcap=0.0, Tensor(b!)? lse=None, Tensor(c!)? status=None,
                        Tensor? alibi_slopes=None, Tensor? out_scale=None) -> ()

Tensors as documented at :func:`window_prefill.window_prefill`; ``starts`` is ``cu_seqlens`` when
``lens`` is None, else the first token of each sequence with ``lens`` its length (vLLM's
``b_start_loc``/``b_seq_len``). ``window_left``/``window_right``: inclusive widths, ``-1`` =
unbounded. ``block_m``..``tma``: a launch-config override in :class:`~window_prefill.configs.Config`
field order (``tma`` a bit field: 1 = ``Config.tma``, 2 = ``Config.gluon``), ``block_m=0`` = the
per-architecture table; ``softcap`` > 0: logit
soft-capping (see :func:`window_prefill.window_prefill`); ``lse``: a float32 ``[num_heads,
total_tokens]`` buffer (unit token stride) that the op also mutates, writing each row's softmax
log-sum-exp (``return_lse=True`` of :func:`window_prefill.window_prefill`, which allocates it), or
None (the kernel compiles without it); ``status``: an int32 ``[1]`` tensor the op also mutates (the
kernel ORs the bits of :mod:`prefill_runtime.status` into it when it meets malformed metadata and
writes nothing otherwise), or None; ``alibi_slopes``: ``[num_heads]`` floating-point ALiBi slopes
(``- slope * |i - j|`` on each logit), or None; ``out_scale``: with an fp8 ``out``, its float ``[1]``
quantisation scale (``out = clamp(attention / out_scale)``), else None. The op does no argument
checking (the public functions do), never synchronises with the host and allocates nothing: it is
CUDA-graph capturable.

Registered with the low-level ``torch.library.Library`` API (``define`` + a
``CompositeExplicitAutograd`` kernel, i.e. every device: CPU tensors run under ``TRITON_INTERPRET=1``)
rather than ``torch.library.custom_op``, whose Python-side autograd/in-place wrapper costs ~130 us per
call on a loaded CPU (it rebuilds the schema's argument list once per argument) against ~7 us here:
as much as a whole short prefill. Autograd falls back to PyTorch's C++ "not implemented" kernel (the
op has no backward); the kernel bumps the version counters of ``out`` (and ``lse``, ``status``) itself.
The fake (meta) kernel does nothing: the op's only effects are the in-place writes to ``out``, ``lse``
and ``status``.
"""

from __future__ import annotations

import contextlib

import torch

from prefill_runtime.compiled_launch import launch_directly
from prefill_runtime.signatures import bump_versions
from window_prefill import launch
from window_prefill.configs import Config

SCHEMA = (
    "fwd(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor starts, Tensor? lens, SymInt max_len, "
    "bool causal, SymInt window_left, SymInt window_right, float softmax_scale, Tensor? sinks, "
    "bool sinks_bias_key0, SymInt block_m=0, SymInt block_n=0, SymInt num_warps=0, SymInt num_stages=0, "
    "SymInt tma=0, float softcap=0.0, Tensor(b!)? lse=None, Tensor(c!)? status=None, "
    "Tensor? alibi_slopes=None, Tensor? out_scale=None) -> ()"
)
#: The config ints meaning "use the per-architecture table".
NO_CONFIG = (0, 0, 0, 0, 0)


def config_ints(config: Config | None) -> tuple[int, int, int, int, int]:
    """``config`` as the op's ``(block_m, ..., num_stages, tma)`` (``tma``: bit 0 ``Config.tma``, bit 1
    ``Config.gluon``); None -> :data:`NO_CONFIG`."""
    if config is None:
        return NO_CONFIG
    c = config
    flags = int(bool(c.tma)) | (2 if c.gluon else 0)
    return int(c.block_m), int(c.block_n), int(c.num_warps), int(c.num_stages), flags


def on_device(device: torch.device) -> contextlib.AbstractContextManager:
    """Triton launches on the *current* CUDA device: make it the inputs' device when it is not
    (a multi-GPU process that did not call ``torch.cuda.set_device``). No-op otherwise (no sync)."""
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def _fwd_impl(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    starts: torch.Tensor,
    lens: torch.Tensor | None,
    max_len: int,
    causal: bool,
    window_left: int,
    window_right: int,
    softmax_scale: float,
    sinks: torch.Tensor | None,
    sinks_bias_key0: bool,
    block_m: int = 0,
    block_n: int = 0,
    num_warps: int = 0,
    num_stages: int = 0,
    tma: int = 0,
    softcap: float = 0.0,
    lse: torch.Tensor | None = None,
    status: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    out_scale: torch.Tensor | None = None,
) -> None:
    """The op's kernel on every device: the planned kernel launch on checked arguments, writing ``out``
    (and ``lse``, ``status`` when given)."""
    config = (
        Config(block_m, block_n, num_warps, num_stages, bool(tma & 1), bool(tma & 2)) if block_m > 0 else None
    )
    with on_device(q.device):
        launch.forward(
            q, k, v, out, starts, lens, max_len, causal=causal, window_left=window_left,
            window_right=window_right, softmax_scale=softmax_scale, sinks=sinks, bias_key0=sinks_bias_key0,
            config=config, softcap=softcap, lse=lse, status=status, alibi_slopes=alibi_slopes,
            out_scale=out_scale,
        )  # fmt: skip
    bump_versions(out, lse, status)


def _fwd_fake(*args: object, **kwargs: object) -> None:
    """Nothing to compute: ``out`` (and ``lse``, ``status``) keep their metadata and are mutated in place."""
    return None


_LIB = torch.library.Library("window_prefill", "DEF")  # must stay alive: it owns the registrations
_LIB.define(SCHEMA)
_LIB.impl("fwd", _fwd_impl, "CompositeExplicitAutograd")
torch.library.register_fake("window_prefill::fwd", _fwd_fake, lib=_LIB)

#: The registered operator, ``torch.ops.window_prefill.fwd.default``.
fwd = torch.ops.window_prefill.fwd.default


def call(*args: object) -> None:
    """The op on checked arguments (its schema's order): its kernel run directly where
    :func:`~prefill_runtime.compiled_launch.launch_directly` (eager mode, no Python dispatch mode: the
    dispatcher's cost saved), else the op itself (``torch.compile``, dispatch modes)."""
    if launch_directly():
        _fwd_impl(*args)
    else:
        fwd(*args)
