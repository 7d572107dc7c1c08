"""prefix-prefill: paged-KV prefix prefill attention in Triton, any page size at full speed.

Public API: :func:`context_attention_fwd` (drop-in for vLLM 0.33's function of that name) and
:func:`prefix_prefill` (Pythonic form: any cache layout, FlashAttention window convention).
Launch configs come from a static per-architecture table (:mod:`prefix_prefill.configs`).
"""

__version__ = "0.9.0"

from prefix_prefill.configs import CONFIGS, KernelConfig, get_config, shared_memory_bytes
from prefix_prefill.interface import KV_CACHE_DTYPES, context_attention_fwd, prefix_prefill

__all__ = [
    "CONFIGS",
    "KV_CACHE_DTYPES",
    "KernelConfig",
    "__version__",
    "context_attention_fwd",
    "get_config",
    "prefix_prefill",
    "shared_memory_bytes",
]
