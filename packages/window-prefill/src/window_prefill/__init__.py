"""window-prefill: varlen sliding-window prefill attention in Triton, O(tokens * window) work.

Public API:

* :func:`window_prefill` -- ``cu_seqlens`` + FlashAttention-style inclusive ``window=(left, right)``;
* :func:`context_attention_fwd` -- drop-in for vLLM's ``triton_prefill_attention.context_attention_fwd``.

Launch configurations come from a static per-architecture table (:mod:`window_prefill.configs`); there
is no autotuning on the call path and no host synchronisation unless ``validate=True``.
"""

__version__ = "0.5.0"

from window_prefill.configs import Config, detect_arch, get_config, shared_memory_bytes
from window_prefill.interface import context_attention_fwd, window_prefill

__all__ = [
    "Config",
    "__version__",
    "context_attention_fwd",
    "detect_arch",
    "get_config",
    "shared_memory_bytes",
    "window_prefill",
]
