"""Stand-in for ``vllm.platforms.rocm`` (tests only): no ROCm custom paged attention, not RDNA."""

from __future__ import annotations


def use_rocm_custom_paged_attention(*args: object, **kwargs: object) -> bool:
    return False


def on_gfx1x() -> bool:
    return False
