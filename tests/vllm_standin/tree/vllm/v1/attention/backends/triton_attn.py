"""Stand-in for ``vllm.v1.attention.backends.triton_attn`` (tests only): like vLLM's, it imports the
varlen ``context_attention_fwd`` by name at import, before any plugin runs."""

from vllm.v1.attention.ops.triton_prefill_attention import context_attention_fwd

__all__ = ["context_attention_fwd"]
