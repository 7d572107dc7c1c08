"""prefix-prefill: paged-KV prefix prefill attention in Triton, any page size at full speed.

Public API: :func:`context_attention_fwd` (drop-in for vLLM 0.33's function of that name),
:func:`prefix_prefill` (Pythonic form: any cache layout, FlashAttention window convention) and
:func:`finish_compiles` (wait for the kernels compiling in the background after a first call: call
it before capturing CUDA graphs).
Launch configs come from a static per-architecture table (:mod:`prefix_prefill.configs`).
"""

__version__ = "0.12.0"

from prefix_prefill.configs import CONFIGS, KernelConfig, get_config, shared_memory_bytes
from prefix_prefill.interface import KV_CACHE_DTYPES, context_attention_fwd, finish_compiles, prefix_prefill

__all__ = [
    "CONFIGS",
    "KV_CACHE_DTYPES",
    "KernelConfig",
    "__version__",
    "context_attention_fwd",
    "finish_compiles",
    "get_config",
    "prefix_prefill",
    "shared_memory_bytes",
]
