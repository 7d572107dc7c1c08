"""prefill_runtime.device: the soft-capping tanh the Triton kernels call."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from conftest import DEVICE

from prefill_runtime.device import tanh


@triton.jit
def _tanh_kernel(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < n
    tl.store(Y + offs, tanh(tl.load(X + offs, mask=m, other=0.0)), mask=m)


def test_device_tanh_exp2_form():
    """The exp2 form (the one the interpreter and AMD run) against torch.tanh: finite inputs within
    a few float32 ulps of 1, +-inf to exactly +-1, NaN stays NaN."""
    x = torch.cat(
        [torch.linspace(-20, 20, 101), torch.tensor([0.0, 1e-6, -1e-6, math.inf, -math.inf, math.nan])]
    )
    x = x.to(DEVICE)
    y = torch.full_like(x, 7.0)
    _tanh_kernel[(1,)](x, y, x.numel(), BLOCK=128)
    ref = torch.tanh(x.double().cpu())
    y = y.double().cpu()
    finite = torch.isfinite(x.cpu())
    assert float((y[finite] - ref[finite]).abs().max()) < 1e-6
    assert y[-3] == 1.0 and y[-2] == -1.0 and math.isnan(y[-1])
