"""Float64 reference attention for testing prefill kernels (torch only; never imports triton).

- :func:`attention_varlen`: dense ragged-batch attention (causal, sliding windows, GQA, ALiBi,
  sinks, softcap).
- :func:`paged_prefix_attention`: the same with the context read from a paged KV cache
  (layouts "split", "nhd", "hnd"; fp8 / uint8 caches dequantised).
- :func:`gather_paged`: a paged cache gathered into contiguous per-token K or V.
- :func:`compare` / :class:`Comparison`: per-dtype tolerance check of a kernel output;
  :func:`compare_lse`: the same for a softmax log-sum-exp (``return_lse=True`` of the references).
- :func:`negative_control`: a plausible wrong answer, to prove a harness catches bugs.
"""

from __future__ import annotations

from .compare import LSE_ATOL, TOLERANCES, Comparison, compare, compare_lse, tolerance
from .dense import NEGATIVE_CONTROL_KINDS, SINKS_MODES, attention_varlen, negative_control
from .paged import LAYOUTS, dequantize, gather_paged, paged_prefix_attention

__version__ = "0.2.0"

__all__ = [
    "LAYOUTS",
    "LSE_ATOL",
    "NEGATIVE_CONTROL_KINDS",
    "SINKS_MODES",
    "TOLERANCES",
    "Comparison",
    "__version__",
    "attention_varlen",
    "compare",
    "compare_lse",
    "dequantize",
    "gather_paged",
    "negative_control",
    "paged_prefix_attention",
    "tolerance",
]
