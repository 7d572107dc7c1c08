"""vLLM plugin: run vLLM's Triton varlen prefill attention on this package's kernel.

Installed as the ``vllm.general_plugins`` entry point ``window_prefill =
"window_prefill.vllm_plugin:register"``; vLLM calls :func:`register` in every process it starts
(API server, engine core, each tensor-/pipeline-parallel worker). It does something only when the
environment variable ``PREFILL_KERNELS_VLLM=1`` is set and ``vllm`` is importable; then it replaces
``vllm.v1.attention.ops.triton_prefill_attention.context_attention_fwd`` with
:func:`context_attention_fwd` below and rebinds the name in every already-imported ``vllm.*`` module
that imported vLLM's function directly. Calling it again is harmless. Without the variable, or
without vLLM, it returns at once and imports nothing.

It logs one INFO line when it replaces the function, under the logger
``vllm.plugins.window_prefill`` (made by vLLM's ``vllm.logger.init_logger`` where that imports). vLLM
configures only its own ``vllm`` logger (a handler on it, no propagation to the root logger), so a
child of it prints wherever vLLM's own lines do and obeys ``VLLM_LOGGING_LEVEL``.
The replacement itself is :func:`prefill_runtime.vllm_plugin.replace` (shared by both packages).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prefill_runtime import vllm_plugin as _shared

if TYPE_CHECKING:
    import torch

ENV_VAR = _shared.ENV_VAR
TARGET_MODULE = "vllm.v1.attention.ops.triton_prefill_attention"
TARGET_NAME = "context_attention_fwd"

# A child of vLLM's "vllm" logger, so that vLLM's logging setup prints our lines (see the docstring).
LOGGER_NAME = "vllm.plugins.window_prefill"
# "original": vLLM's function once replaced; "logged": the one info line was written.
_state: dict[str, Any] = {}


def context_attention_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    b_start_loc: torch.Tensor,
    b_seq_len: torch.Tensor,
    max_input_len: int,
    is_causal: bool = True,
    softmax_scale: float | None = None,
    sliding_window_q: int | None = None,
    sliding_window_k: int | None = None,
    sinks: torch.Tensor | None = None,
    sinks_bias_key0: bool = False,
) -> None:
    """vLLM 0.33's ``triton_prefill_attention.context_attention_fwd`` signature (positional order
    included), running :func:`window_prefill.context_attention_fwd`; see it for the arguments."""
    from window_prefill.api import context_attention_fwd as ours

    ours(
        q, k, v, o, b_start_loc, b_seq_len, max_input_len, is_causal=is_causal,
        softmax_scale=softmax_scale, sliding_window_q=sliding_window_q,
        sliding_window_k=sliding_window_k, sinks=sinks, sinks_bias_key0=sinks_bias_key0,
    )  # fmt: skip


def register() -> None:
    """The ``vllm.general_plugins`` entry point (see the module docstring). Idempotent."""
    _shared.replace("window_prefill", TARGET_MODULE, TARGET_NAME, context_attention_fwd, _state, LOGGER_NAME)
