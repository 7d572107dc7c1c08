"""Stand-in for ``vllm.v1.attention.ops.chunked_prefill_paged_decode`` (tests only): like vLLM's, it
imports ``context_attention_fwd`` by name at import, before any plugin runs."""

from .prefix_prefill import context_attention_fwd

__all__ = ["context_attention_fwd"]
