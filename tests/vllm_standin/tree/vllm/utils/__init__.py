"""Stand-in for ``vllm.utils`` (tests only)."""
