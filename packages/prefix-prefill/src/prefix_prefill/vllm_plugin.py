"""vLLM plugin: run vLLM's Triton prefix-prefill attention on this package's kernel.

Installed as the ``vllm.general_plugins`` entry point ``prefix_prefill =
"prefix_prefill.vllm_plugin:register"``; vLLM calls :func:`register` in every process it starts
(API server, engine core, each tensor-/pipeline-parallel worker). It does something only when the
environment variable ``PREFILL_KERNELS_VLLM=1`` is set and ``vllm`` is importable; then it replaces
``vllm.v1.attention.ops.prefix_prefill.context_attention_fwd`` with
:func:`prefix_prefill.context_attention_fwd` (vLLM 0.33's signature: same parameters, order and
defaults) and rebinds the name in every already-imported ``vllm.*`` module that imported vLLM's
function directly (e.g. ``vllm.v1.attention.ops.chunked_prefill_paged_decode``, used by the ROCm/Triton
attention backends). Calling it again is harmless. Without the variable, or without vLLM, it returns
at once and imports nothing of vLLM.

It logs one INFO line when it replaces the function, under the logger
``vllm.plugins.prefix_prefill`` (made by vLLM's ``vllm.logger.init_logger`` where that imports). vLLM
configures only its own ``vllm`` logger (a handler on it, no propagation to the root logger), so a
child of it prints wherever vLLM's own lines do and obeys ``VLLM_LOGGING_LEVEL``.
The replacement itself is :func:`prefill_runtime.vllm_plugin.replace` (shared by both packages).
"""

from __future__ import annotations

from typing import Any

from prefill_runtime import vllm_plugin as _shared
from prefix_prefill.api import context_attention_fwd

ENV_VAR = _shared.ENV_VAR
TARGET_MODULE = "vllm.v1.attention.ops.prefix_prefill"
TARGET_NAME = "context_attention_fwd"

# A child of vLLM's "vllm" logger, so that vLLM's logging setup prints our lines (see the docstring).
LOGGER_NAME = "vllm.plugins.prefix_prefill"
# "original": vLLM's function once replaced; "logged": the one info line was written.
_state: dict[str, Any] = {}

__all__ = ["ENV_VAR", "LOGGER_NAME", "TARGET_MODULE", "TARGET_NAME", "context_attention_fwd", "register"]


def register() -> None:
    """The ``vllm.general_plugins`` entry point (see the module docstring). Idempotent."""
    _shared.replace("prefix_prefill", TARGET_MODULE, TARGET_NAME, context_attention_fwd, _state, LOGGER_NAME)
