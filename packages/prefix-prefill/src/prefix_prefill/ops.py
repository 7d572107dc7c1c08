"""The kernel launch as a PyTorch custom op: ``torch.ops.prefix_prefill.fwd``.

Both public functions (:func:`prefix_prefill.prefix_prefill`, :func:`prefix_prefill.context_attention_fwd`)
check their arguments in Python, allocate the output if needed and then, under ``torch.compile``, call
this op, so Dynamo, AOTAutograd and Inductor see one opaque operator that mutates ``out`` instead of
tracing into Triton's launcher. In eager mode with no Python dispatch mode active (``direct``,
:func:`prefill_runtime.compiled_launch.launch_directly`) they launch directly, without the
dispatcher's cost; the op does the same launch when called itself.

Schema (every argument a tensor, an optional tensor, an int, a float or a bool)::

    prefix_prefill::fwd(Tensor q, Tensor? k, Tensor? v, Tensor(a!) out, Tensor k_cache,
                        Tensor v_cache, int kv_layout, Tensor block_table, Tensor cu_seqlens_q,
                        Tensor seq_lens, SymInt max_query_len, bool causal, SymInt window_left,
                        SymInt window_right, float? softmax_scale, Tensor? alibi_slopes, Tensor? sinks,
                        Tensor? k_scale, Tensor? v_scale, Tensor? out_scale, bool skip_decode,
                        float softcap=0.0, Tensor(b!)? lse=None, Tensor(c!)? status=None) -> ()

Tensors as documented at :func:`prefix_prefill.context_attention_fwd` and
:func:`prefix_prefill.prefix_prefill`; caches already viewed as their fp8 type (no uint8);
``kv_layout`` is the index of the cache layout in :data:`paged_kv_offsets.LAYOUTS`
(``0`` = ``"split"``, ``1`` = ``"nhd"``, ``2`` = ``"hnd"``); ``window_left``/``window_right``:
FlashAttention's inclusive widths, ``-1`` = unbounded; ``softmax_scale`` None = ``1/sqrt(D)``;
scales: 1-element float tensors or None (= 1); ``lse``: a float32 ``[H, total_q]`` buffer (unit
token stride) that the op also mutates, writing each row's softmax log-sum-exp (``return_lse=True``
of :func:`prefix_prefill.prefix_prefill`, which allocates it; rows skipped by ``skip_decode`` get
``-inf``), or None (the kernel compiles without it); ``status``: an int32 ``[1]`` tensor the op also
mutates (the kernel ORs the bits of :mod:`prefill_runtime.status` into it when it meets malformed
metadata and writes nothing otherwise), or None. The op does no argument checking (the public
functions do), never synchronises with the host on the default path and allocates at most the
1-element default scales: it is CUDA-graph capturable. Plan and tile overrides are not on the op path
(tests and sweeps call :func:`prefix_prefill.launch.forward` directly).

Registered with the low-level ``torch.library.Library`` API (``define`` + a
``CompositeExplicitAutograd`` kernel, i.e. every device: CPU tensors run under ``TRITON_INTERPRET=1``)
rather than ``torch.library.custom_op``, whose Python-side autograd/in-place wrapper costs well over
100 us per call with this many arguments (it rebuilds the schema's argument list once per argument),
against a few us here. Autograd falls back to PyTorch's C++ "not implemented" kernel (the op has no
backward); the kernel bumps the version counters of ``out`` (and ``lse``, ``status``) itself. The fake
(meta) kernel does nothing: the op's only effects are the in-place writes to ``out``, ``lse`` and
``status``.
"""

from __future__ import annotations

import contextlib

import torch

from paged_kv_offsets import LAYOUTS, describe_kv_cache
from prefill_runtime.compiled_launch import launch_directly
from prefill_runtime.signatures import bump_versions
from prefix_prefill import launch

#: Whether the public functions launch without the op (eager mode, no Python dispatch mode).
direct = launch_directly

SCHEMA = (
    "fwd(Tensor q, Tensor? k, Tensor? v, Tensor(a!) out, Tensor k_cache, Tensor v_cache, int kv_layout, "
    "Tensor block_table, Tensor cu_seqlens_q, Tensor seq_lens, SymInt max_query_len, bool causal, "
    "SymInt window_left, SymInt window_right, float? softmax_scale, Tensor? alibi_slopes, Tensor? sinks, "
    "Tensor? k_scale, Tensor? v_scale, Tensor? out_scale, bool skip_decode, float softcap=0.0, "
    "Tensor(b!)? lse=None, Tensor(c!)? status=None) -> ()"
)


def layout_code(layout: str) -> int:
    """The op's ``kv_layout`` int for a layout name of :data:`paged_kv_offsets.LAYOUTS`."""
    return LAYOUTS.index(layout)


def on_device(device: torch.device) -> contextlib.AbstractContextManager:
    """Triton launches on the *current* CUDA device: make it the inputs' device when it is not
    (a multi-GPU process that did not call ``torch.cuda.set_device``). No-op otherwise (no sync)."""
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def _fwd_impl(
    q: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    out: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_layout: int,
    block_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    max_query_len: int,
    causal: bool,
    window_left: int,
    window_right: int,
    softmax_scale: float | None,
    alibi_slopes: torch.Tensor | None,
    sinks: torch.Tensor | None,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    out_scale: torch.Tensor | None,
    skip_decode: bool,
    softcap: float = 0.0,
    lse: torch.Tensor | None = None,
    status: torch.Tensor | None = None,
) -> None:
    """The op's kernel on every device: launch the planned kernel on checked arguments, writing ``out``
    (and ``lse``, ``status`` when given)."""
    kc, vc = describe_kv_cache(k_cache, v_cache, LAYOUTS[kv_layout])  # sizes and strides only
    with on_device(q.device):
        launch.forward(
            q, k, v, out, k_cache, v_cache, kc, vc, block_table, cu_seqlens_q, seq_lens, max_query_len,
            causal=causal, window=(window_left, window_right), softmax_scale=softmax_scale,
            alibi_slopes=alibi_slopes, sinks=sinks, k_scale=k_scale, v_scale=v_scale, out_scale=out_scale,
            skip_decode=skip_decode, softcap=softcap, lse=lse, status=status,
        )  # fmt: skip
    bump_versions(out, lse, status)


def _fwd_fake(*args: object, **kwargs: object) -> None:
    """Nothing to compute: ``out`` (and ``lse``, ``status``) keep their metadata and are mutated in place."""
    return None


_LIB = torch.library.Library("prefix_prefill", "DEF")  # must stay alive: it owns the registrations
_LIB.define(SCHEMA)
_LIB.impl("fwd", _fwd_impl, "CompositeExplicitAutograd")
torch.library.register_fake("prefix_prefill::fwd", _fwd_fake, lib=_LIB)

#: The registered operator, ``torch.ops.prefix_prefill.fwd.default``.
fwd = torch.ops.prefix_prefill.fwd.default
