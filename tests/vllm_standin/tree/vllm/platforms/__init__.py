"""Stand-in for ``vllm.platforms`` (tests only): ``current_platform`` with the queries vLLM's Triton
attention files make, answered from torch."""

from __future__ import annotations

import torch


class _Platform:
    def get_device_capability(self, device_id: int = 0) -> tuple[int, int]:
        if torch.cuda.is_available():
            return tuple(torch.cuda.get_device_capability(device_id))
        return (9, 0)  # the interpreter: any answer compiles nothing

    def has_device_capability(self, capability: int | tuple[int, int], device_id: int = 0) -> bool:
        major, minor = self.get_device_capability(device_id)
        if isinstance(capability, tuple):
            return (major, minor) >= capability
        return major * 10 + minor >= capability

    def is_rocm(self) -> bool:
        return torch.version.hip is not None

    def is_cuda(self) -> bool:
        return torch.version.hip is None

    def is_cuda_alike(self) -> bool:
        return True

    def fp8_dtype(self) -> torch.dtype:
        return torch.float8_e4m3fnuz if self.is_rocm() else torch.float8_e4m3fn


current_platform = _Platform()
