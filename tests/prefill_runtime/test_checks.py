"""prefill_runtime.checks: the soft-capping form a kernel compiles for a device, and the LSE buffer of a
``return_lse=True`` call."""

from __future__ import annotations

import types

import pytest
import torch

from prefill_runtime import check_lse, softcap_form


def test_softcap_form(monkeypatch):
    """Kernel SOFTCAP: 0 without soft-capping, 2 (hardware tanh) for NVIDIA GPU tensors of compute
    capability 7.5+, 1 (tanh through exp2) for anything else (the interpreter's CPU tensors, ROCm,
    Volta) or with ``fast=False``. The hardware form runs in the GPU soft-capping tests (bf16, both
    packages)."""
    gpu = types.SimpleNamespace(is_cuda=True, device="cuda:0")
    cpu = torch.zeros(1)
    cap = {"value": (9, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap["value"])
    assert softcap_form(0.0, cpu) == 0 and softcap_form(0.0, gpu) == 0
    assert softcap_form(30.0, cpu) == 1
    monkeypatch.setattr(torch.version, "hip", None)
    assert softcap_form(30.0, gpu) == 2
    cap["value"] = (7, 0)
    assert softcap_form(30.0, gpu) == 1
    cap["value"] = (7, 5)
    assert softcap_form(30.0, gpu) == 2
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert softcap_form(30.0, gpu) == 1
    monkeypatch.setattr(torch.version, "hip", None)
    assert softcap_form(30.0, gpu, fast=False) == 1


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
