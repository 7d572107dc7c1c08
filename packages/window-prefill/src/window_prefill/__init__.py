"""window-prefill: varlen sliding-window prefill attention in Triton, O(tokens * window) work.

Public API (:mod:`window_prefill.api`):

* :func:`window_prefill` -- ``cu_seqlens`` + FlashAttention-style inclusive ``window=(left, right)``;
* :func:`context_attention_fwd` -- drop-in for vLLM's ``triton_prefill_attention.context_attention_fwd``;
* :func:`explain` -- the launch plan (kernel, settings, the rule that chose them) of a
  :func:`window_prefill` call, without launching.

Package layout: :mod:`~window_prefill.api` (public functions, host-side checks) ->
:mod:`~window_prefill.ops` (the custom op) -> :mod:`~window_prefill.launch` (describe the call, run
its plan) -> :mod:`~window_prefill.plan` (the one kernel choice, cached) ->
:mod:`~window_prefill.configs` (the per-architecture tile table); kernels in
:mod:`~window_prefill.kernel` (Triton) and :mod:`~window_prefill.gluon_kernel` (Gluon, sm90). There is
no autotuning on the call path and no host synchronisation unless ``validate=True``.
"""

__version__ = "0.23.0"

from window_prefill.api import context_attention_fwd, explain, window_prefill
from window_prefill.configs import Config, detect_arch, get_config, shared_memory_bytes

__all__ = [
    "Config",
    "__version__",
    "context_attention_fwd",
    "detect_arch",
    "explain",
    "get_config",
    "shared_memory_bytes",
    "window_prefill",
]
