"""Stand-in for ``vllm._custom_ops`` (tests only): vLLM's compiled ops are not here."""

from __future__ import annotations


def paged_attention_rocm(*args: object, **kwargs: object) -> None:
    raise NotImplementedError("vllm._custom_ops stand-in: no ROCm custom paged attention")
