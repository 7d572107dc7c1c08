"""prefix-prefill: paged-KV prefix prefill attention in Triton, any page size at full speed.

Public API: :func:`context_attention_fwd` (drop-in for vLLM 0.33's function of that name),
:func:`prefix_prefill` (Pythonic form: any cache layout, FlashAttention window convention),
:func:`explain` (which kernel a call runs, and why: the :class:`prefill_runtime.LaunchPlan` of
:func:`prefix_prefill.plan.plan`) and :func:`finish_compiles` (wait for the kernels compiling in the
background after a first call: call it before capturing CUDA graphs).

Modules: ``api`` (the public functions), ``checks`` (argument checks), ``plan`` (the one dispatch
point), ``launch`` (the Triton launch), ``gluon_launch`` (the Gluon kernels' host side), ``ops`` (the
torch custom op), ``kernel`` / ``gluon_kernel`` / ``gluon_split_kernel`` (device code), ``configs`` (the
Triton kernel's tiles).
"""

__version__ = "0.37.1"

from prefix_prefill.api import KV_CACHE_DTYPES, context_attention_fwd, explain, prefix_prefill
from prefix_prefill.configs import CONFIGS, KernelConfig, get_config, shared_memory_bytes
from prefix_prefill.gluon_launch import finish_compiles

__all__ = [
    "CONFIGS",
    "KV_CACHE_DTYPES",
    "KernelConfig",
    "__version__",
    "context_attention_fwd",
    "explain",
    "finish_compiles",
    "get_config",
    "prefix_prefill",
    "shared_memory_bytes",
]
