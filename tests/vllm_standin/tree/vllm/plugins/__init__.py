"""Stand-in for ``vllm.plugins`` (tests only): :func:`load_general_plugins` imports the attention modules
that take the kernels' names at import (as vLLM's backends have by then), then calls both packages'
``vllm.general_plugins`` entry points, ``prefix_prefill.vllm_plugin:register`` and
``window_prefill.vllm_plugin:register`` (vLLM finds them through the installed entry points)."""

from __future__ import annotations

from vllm.logger import init_logger

logger = init_logger(__name__)


def load_general_plugins() -> None:
    import prefix_prefill.vllm_plugin
    import vllm.v1.attention.backends.triton_attn
    import vllm.v1.attention.ops.chunked_prefill_paged_decode  # noqa: F401
    import window_prefill.vllm_plugin

    for register in (prefix_prefill.vllm_plugin.register, window_prefill.vllm_plugin.register):
        register()
    logger.info("plugins loaded")
