"""Stand-in for ``vllm.triton_utils`` (tests only): Triton itself."""

import triton
import triton.language as tl

__all__ = ["tl", "triton"]
