"""The kernel launch as a PyTorch custom op: ``torch.ops.prefix_prefill.fwd``.

Both public functions (:func:`prefix_prefill.prefix_prefill`, :func:`prefix_prefill.context_attention_fwd`)
check their arguments in Python, allocate the output if needed and then call this op, so
``torch.compile`` (Dynamo, AOTAutograd, Inductor) sees one opaque operator that mutates ``out``
instead of tracing into Triton's launcher, and CUDA graphs capture the one kernel launch.

Schema (every argument a tensor, an optional tensor, an int, a float or a bool)::

    prefix_prefill::fwd(Tensor q, Tensor? k, Tensor? v, Tensor(a!) out, Tensor k_cache,
                        Tensor v_cache, int kv_layout, Tensor block_table, Tensor cu_seqlens_q,
                        Tensor seq_lens, int max_query_len, bool causal, int window_left,
                        int window_right, float? softmax_scale, Tensor? alibi_slopes, Tensor? sinks,
                        Tensor? k_scale, Tensor? v_scale, Tensor? out_scale, bool skip_decode) -> ()

Tensors as documented at :func:`prefix_prefill.context_attention_fwd` and
:func:`prefix_prefill.prefix_prefill`; caches already viewed as their fp8 type (no uint8);
``kv_layout`` is the index of the cache layout in :data:`paged_kv_offsets.LAYOUTS`
(``0`` = ``"split"``, ``1`` = ``"nhd"``, ``2`` = ``"hnd"``); ``window_left``/``window_right``:
FlashAttention's inclusive widths, ``-1`` = unbounded; ``softmax_scale`` None = ``1/sqrt(D)``;
scales: 1-element float tensors or None (= 1). The op does no argument checking (the public
functions do), never synchronises with the host on the default path and allocates at most the
1-element default scales: it is CUDA-graph capturable. It is registered for every device (CPU tensors
run under ``TRITON_INTERPRET=1``); its fake (meta) implementation does nothing, since the only
effect is the in-place write to ``out``. The launch-config override of ``_launch_fwd`` is not on the
op path (tests and sweeps call ``_launch_fwd`` directly).
"""

# No ``from __future__ import annotations``: torch.library reads these annotations at runtime.
from typing import Optional

import torch

from paged_kv_offsets import LAYOUTS, describe_kv_cache
from prefix_prefill import interface as _interface  # partially initialised here: used at call time only


def layout_code(layout: str) -> int:
    """The op's ``kv_layout`` int for a layout name of :data:`paged_kv_offsets.LAYOUTS`."""
    return LAYOUTS.index(layout)


@torch.library.custom_op("prefix_prefill::fwd", mutates_args=("out",))
def fwd(
    q: torch.Tensor,
    k: Optional[torch.Tensor],  # noqa: UP045
    v: Optional[torch.Tensor],  # noqa: UP045
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
    softmax_scale: Optional[float],  # noqa: UP045
    alibi_slopes: Optional[torch.Tensor],  # noqa: UP045
    sinks: Optional[torch.Tensor],  # noqa: UP045
    k_scale: Optional[torch.Tensor],  # noqa: UP045
    v_scale: Optional[torch.Tensor],  # noqa: UP045
    out_scale: Optional[torch.Tensor],  # noqa: UP045
    skip_decode: bool,
) -> None:
    """Launch the kernel on checked arguments, writing ``out`` (see the module docstring)."""
    kc, vc = describe_kv_cache(k_cache, v_cache, LAYOUTS[kv_layout])  # sizes and strides only
    _interface._launch_fwd(
        q, k, v, out, k_cache, v_cache, kc, vc, block_table, cu_seqlens_q, seq_lens, max_query_len,
        causal=causal, window=(window_left, window_right), softmax_scale=softmax_scale,
        alibi_slopes=alibi_slopes, sinks=sinks, k_scale=k_scale, v_scale=v_scale, out_scale=out_scale,
        skip_decode=skip_decode,
    )  # fmt: skip


@fwd.register_fake
def _fwd_fake(
    q: torch.Tensor,
    k: Optional[torch.Tensor],  # noqa: UP045
    v: Optional[torch.Tensor],  # noqa: UP045
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
    softmax_scale: Optional[float],  # noqa: UP045
    alibi_slopes: Optional[torch.Tensor],  # noqa: UP045
    sinks: Optional[torch.Tensor],  # noqa: UP045
    k_scale: Optional[torch.Tensor],  # noqa: UP045
    v_scale: Optional[torch.Tensor],  # noqa: UP045
    out_scale: Optional[torch.Tensor],  # noqa: UP045
    skip_decode: bool,
) -> None:
    """Nothing to compute: ``out`` keeps its metadata and is mutated in place."""
    return None
