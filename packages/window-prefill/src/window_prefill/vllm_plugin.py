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
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

ENV_VAR = "PREFILL_KERNELS_VLLM"
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


def _logger() -> logging.Logger:
    """vLLM's ``init_logger(LOGGER_NAME)`` where ``vllm.logger`` imports (called only once vLLM is
    known to be importable), else ``logging.getLogger(LOGGER_NAME)``: the same logger either way."""
    try:
        from vllm.logger import init_logger
    except Exception:  # an old or partial vLLM tree: the plain logger has the same name
        return logging.getLogger(LOGGER_NAME)
    return init_logger(LOGGER_NAME)


def enabled() -> bool:
    """True when ``PREFILL_KERNELS_VLLM=1`` asks for the replacement."""
    return os.environ.get(ENV_VAR, "0") == "1"


def _vllm_importable() -> bool:
    """Whether ``import vllm`` can work, without importing it."""
    if "vllm" in sys.modules:
        return sys.modules["vllm"] is not None
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


def _rebind(original: Callable[..., Any], replacement: Callable[..., Any]) -> list[str]:
    """Point every imported ``vllm.*`` module attribute that is ``original`` at ``replacement``."""
    rebound = []
    for name, module in list(sys.modules.items()):
        if not (name == "vllm" or name.startswith("vllm.")) or module is None:
            continue
        namespace = getattr(module, "__dict__", None)  # no getattr on the module: never trigger lazy imports
        if isinstance(namespace, dict) and namespace.get(TARGET_NAME) is original:
            setattr(module, TARGET_NAME, replacement)
            rebound.append(name)
    return sorted(rebound)


def register() -> None:
    """The ``vllm.general_plugins`` entry point (see the module docstring). Idempotent."""
    if not enabled() or not _vllm_importable():
        return
    logger = _logger()
    try:
        target = importlib.import_module(TARGET_MODULE)
    except ImportError as e:
        logger.warning("%s=1 but %s cannot be imported (%s): vLLM's kernel stays", ENV_VAR, TARGET_MODULE, e)
        return
    current = target.__dict__.get(TARGET_NAME)
    if current is None:
        logger.warning("%s=1 but %s has no %s: vLLM's kernel stays", ENV_VAR, TARGET_MODULE, TARGET_NAME)
        return
    if current is not context_attention_fwd:
        _state["original"] = current
    original = _state.get("original")
    if original is None:  # already ours, set by hand before any register(): nothing to rebind
        return
    rebound = _rebind(original, context_attention_fwd)
    if not _state.get("logged"):
        _state["logged"] = True
        logger.info(
            "window_prefill: %s.%s replaced by window_prefill.vllm_plugin.%s (%s=1); rebound in: %s",
            TARGET_MODULE, TARGET_NAME, TARGET_NAME, ENV_VAR, ", ".join(rebound) or "nothing",
        )  # fmt: skip
