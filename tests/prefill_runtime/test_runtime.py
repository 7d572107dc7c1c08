"""prefill_runtime: the helpers both kernel packages share (first-launch setup, soft-capping form and
tanh, the LSE buffer)."""

from __future__ import annotations

import math
import types

import pytest
import torch
import triton
import triton.language as tl
from conftest import DEVICE

import prefill_runtime
import prefill_runtime.host as host
from prefill_runtime import check_lse, prime_triton, ptxas_launch_options, softcap_form
from prefill_runtime.device import tanh


@pytest.mark.parametrize("pkg", ["window_prefill", "prefix_prefill"])
def test_softcap_form(monkeypatch, pkg):
    """Kernel SOFTCAP: 0 without soft-capping, 2 (hardware tanh) for NVIDIA GPU tensors of compute
    capability 7.5+, 1 (tanh through exp2) for anything else (the interpreter's CPU tensors, ROCm,
    Volta) or with the package's ``_FAST_TANH`` off (passed as ``fast``). The hardware form runs in
    the GPU soft-capping tests (bf16, both packages)."""
    mod = pytest.importorskip(f"{pkg}.interface")  # absent when only prefill-runtime is installed
    assert mod._FAST_TANH is True  # the packages' default
    gpu = types.SimpleNamespace(is_cuda=True, device="cuda:0")
    cpu = torch.zeros(1)
    cap = {"value": (9, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap["value"])
    assert softcap_form(0.0, cpu) == 0 and softcap_form(0.0, gpu) == 0
    assert softcap_form(30.0, cpu) == 1
    monkeypatch.setattr(torch.version, "hip", None)
    assert softcap_form(30.0, gpu, mod._FAST_TANH) == 2
    cap["value"] = (7, 0)
    assert softcap_form(30.0, gpu) == 1
    cap["value"] = (7, 5)
    assert softcap_form(30.0, gpu) == 2
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert softcap_form(30.0, gpu) == 1
    monkeypatch.setattr(torch.version, "hip", None)
    assert softcap_form(30.0, gpu, fast=False) == 1


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


def test_prime_triton_once_and_never_raises(monkeypatch):
    """A speed hint: the first call marks the process primed and never raises (no GPU driver here);
    a second call returns at once, whichever package made the first."""
    monkeypatch.setattr(host, "_PRIMED", False)
    prime_triton()
    assert host._PRIMED
    prime_triton()  # no-op


def test_prime_triton_probes_ptxas(monkeypatch):
    """Priming also runs ptxas_launch_options' one-time ptxas probe (for the current device), off the
    launch's critical path; not on ROCm."""
    seen = []
    monkeypatch.setattr(host, "_ptxas_has_register_usage_level", lambda cap: seen.append(cap) or True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(host, "_PRIMED", False)
    prime_triton()
    assert seen == [(9, 0)]
    monkeypatch.setattr(torch.version, "hip", "6.2")
    monkeypatch.setattr(host, "_PRIMED", False)
    prime_triton()
    assert seen == [(9, 0)]


def test_check_lse():
    """None without return_lse; a new float32 [heads, tokens] buffer with it; a given buffer checked
    (type, dtype, shape, device, token stride), each error naming the argument."""
    q = torch.zeros(5, 3, 16)
    assert check_lse(False, None, q) is None
    new = check_lse(True, None, q, "total_q")
    assert new.shape == (3, 5) and new.dtype == torch.float32 and new.is_contiguous()
    good = torch.empty(3, 5)
    assert check_lse(True, good, q) is good
    with pytest.raises(TypeError, match="return_lse must be a bool"):
        check_lse(1, None, q)
    with pytest.raises(ValueError, match="return_lse=True"):
        check_lse(False, good, q)
    with pytest.raises(TypeError, match=r"lse must be a torch.Tensor float32 \[num_heads, total_q\]"):
        check_lse(True, [0.0], q, "total_q")
    with pytest.raises(TypeError, match="float32"):
        check_lse(True, torch.empty(3, 5, dtype=torch.float16), q)
    with pytest.raises(ValueError, match="shape"):
        check_lse(True, torch.empty(5, 3), q)
    with pytest.raises(ValueError, match="lse is on meta"):
        check_lse(True, torch.empty(3, 5, device="meta"), q)
    with pytest.raises(ValueError, match="unit stride"):
        check_lse(True, torch.empty(5, 3).t(), q)


def test_ptxas_launch_options(monkeypatch):
    """``--register-usage-level`` reaches ptxas only for a level in 1..10 on an NVIDIA CUDA device whose
    Triton takes ``ptx_options`` and whose ptxas lists the flag; bad levels are a ValueError naming
    the argument; CPU tensors (the interpreter), ROCm and level 0 launch without options."""
    for bad in (-1, 11, "3", 2.0, None, True):
        with pytest.raises(ValueError, match="register_usage_level"):
            ptxas_launch_options(bad, torch.device("cpu"))
    assert ptxas_launch_options(0, torch.device("cpu")) == {}
    assert ptxas_launch_options(3, torch.device("cpu")) == {}
    gpu = torch.device("cuda", 0)
    assert ptxas_launch_options(0, gpu) == {}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert ptxas_launch_options(3, gpu) == {}
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(host, "_ptxas_has_register_usage_level", lambda cap: False)
    assert ptxas_launch_options(3, gpu) == {}
    monkeypatch.setattr(host, "_ptxas_has_register_usage_level", lambda cap: True)
    monkeypatch.setattr(host, "_user_ptxas_options", lambda: None)
    assert ptxas_launch_options(3, gpu) == {"ptx_options": "--register-usage-level=3"}
    # PTXAS_OPTIONS (Triton's default ptx_options, which a launch's ptx_options replaces) is kept
    monkeypatch.setattr(host, "_user_ptxas_options", lambda: "-lineinfo --warn-on-spills")
    assert ptxas_launch_options(3, gpu) == {
        "ptx_options": "-lineinfo --warn-on-spills --register-usage-level=3"
    }
    monkeypatch.setattr(host, "_user_ptxas_options", lambda: "--register-usage-level=8")
    assert ptxas_launch_options(3, gpu) == {}  # the user's own level wins


def test_user_ptxas_options(monkeypatch):
    """PTXAS_OPTIONS as Triton reads it (None when unset or empty)."""
    from triton import knobs

    monkeypatch.setattr(knobs.nvidia, "ptxas_options", None, raising=False)
    assert host._user_ptxas_options() is None
    monkeypatch.setattr(knobs.nvidia, "ptxas_options", "-lineinfo", raising=False)
    assert host._user_ptxas_options() == "-lineinfo"


def test_ptxas_probe_never_raises():
    """The probe answers a bool whatever this machine has (no ptxas, an old Triton, a CPU-only
    install): a missing tool means launching without the flag, never an error."""
    host._ptxas_has_register_usage_level.cache_clear()
    assert host._ptxas_has_register_usage_level((9, 0)) in (True, False)


def test_version():
    assert prefill_runtime.__version__ == "0.2.0"
