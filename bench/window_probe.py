"""Run one window-prefill shape a few times (for Nsight Compute): ``python bench/window_probe.py pr|llm``."""

import os
import sys

# bench/window_prefill.py would shadow the package: keep this script's directory off the import path
_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != _HERE]

import torch  # noqa: E402

from window_prefill import window_prefill  # noqa: E402

SHAPES = {"pr": (16384, 8, 8, 64, False, (64, 64)), "llm": (32768, 32, 8, 128, True, (4095, -1))}

n, h, hkv, d, causal, window = SHAPES[sys.argv[1] if len(sys.argv) > 1 else "pr"]
g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(n, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
k = torch.randn(n, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
v = torch.randn(n, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
cu = torch.tensor([0, n], dtype=torch.int32, device="cuda")
for _ in range(3):
    window_prefill(q, k, v, cu, n, causal=causal, window=window)
torch.cuda.synchronize()
