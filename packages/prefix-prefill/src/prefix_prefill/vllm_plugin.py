"""vLLM plugin: run vLLM's Triton prefix-prefill attention on this package's kernel.

Installed as the ``vllm.general_plugins`` entry point ``prefix_prefill =
"prefix_prefill.vllm_plugin:register"``; vLLM calls :func:`register` in every process it starts
(API server, engine core, each tensor-/pipeline-parallel worker). It does something only when the
environment variable ``PREFILL_KERNELS_VLLM=1`` is set and ``vllm`` is importable; then it replaces
``vllm.v1.attention.ops.prefix_prefill.context_attention_fwd`` with :func:`context_attention_fwd`
below and rebinds the name in every already-imported ``vllm.*`` module that imported vLLM's function
directly (e.g. ``vllm.v1.attention.ops.chunked_prefill_paged_decode``, used by the ROCm/Triton
attention backends). Calling it again is harmless. Without the variable, or without vLLM, it returns
at once and imports nothing.

It logs one INFO line when it replaces the function, under the logger
``vllm.plugins.prefix_prefill`` (made by vLLM's ``vllm.logger.init_logger`` where that imports). vLLM
configures only its own ``vllm`` logger (a handler on it, no propagation to the root logger), so a
child of it prints wherever vLLM's own lines do and obeys ``VLLM_LOGGING_LEVEL``.
The replacement itself is :func:`prefill_runtime.vllm_plugin.replace` (shared by both packages).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prefill_runtime import vllm_plugin as _shared

if TYPE_CHECKING:
    import torch

    from prefix_prefill.checks import Scale

ENV_VAR = _shared.ENV_VAR
TARGET_MODULE = "vllm.v1.attention.ops.prefix_prefill"
TARGET_NAME = "context_attention_fwd"

# A child of vLLM's "vllm" logger, so that vLLM's logging setup prints our lines (see the docstring).
LOGGER_NAME = "vllm.plugins.prefix_prefill"
# "original": vLLM's function once replaced; "logged": the one info line was written.
_state: dict[str, Any] = {}


def context_attention_fwd(
    q: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    o: torch.Tensor,
    kv_cache_dtype: str,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    b_loc: torch.Tensor,
    b_start_loc: torch.Tensor,
    b_seq_len: torch.Tensor,
    max_seq_len: int | None,
    max_input_len: int,
    k_scale: Scale,
    v_scale: Scale,
    alibi_slopes: torch.Tensor | None = None,
    sliding_window: int | None = None,
    sm_scale: float | None = None,
    skip_decode: bool = False,
    fp8_out_scale: Scale = None,
    sinks: torch.Tensor | None = None,
    is_block_table_ptr: bool = False,
    interleaved_v_pack_factor: int = 0,
    causal: bool = True,
) -> None:
    """vLLM 0.33's ``prefix_prefill.context_attention_fwd`` signature (positional order included),
    running :func:`prefix_prefill.context_attention_fwd`; see it for the arguments. The two vLLM
    options this package does not implement raise ``NotImplementedError`` when set."""
    if is_block_table_ptr:
        raise NotImplementedError(
            "prefix_prefill (vLLM plugin): is_block_table_ptr=True (a block table of raw cache "
            "addresses) is not supported; pass block indices, or unset "
            f"{ENV_VAR} to use vLLM's own kernel"
        )
    if interleaved_v_pack_factor:
        raise NotImplementedError(
            "prefix_prefill (vLLM plugin): interleaved_v_pack_factor="
            f"{interleaved_v_pack_factor} (an interleaved V cache) is not supported; use the "
            f"[num_blocks, num_kv_heads, head_size, page] V cache, or unset {ENV_VAR} to use vLLM's "
            "own kernel"
        )
    from prefix_prefill.api import context_attention_fwd as ours

    ours(
        q, k, v, o, kv_cache_dtype, k_cache, v_cache, b_loc, b_start_loc, b_seq_len, max_seq_len,
        max_input_len, k_scale, v_scale, alibi_slopes=alibi_slopes, sliding_window=sliding_window,
        sm_scale=sm_scale, skip_decode=skip_decode, fp8_out_scale=fp8_out_scale, sinks=sinks,
        causal=causal,
    )  # fmt: skip


def register() -> None:
    """The ``vllm.general_plugins`` entry point (see the module docstring). Idempotent."""
    _shared.replace("prefix_prefill", TARGET_MODULE, TARGET_NAME, context_attention_fwd, _state, LOGGER_NAME)
