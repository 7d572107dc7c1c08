"""prefill_runtime.checks: the soft-capping form a kernel compiles for a device, the LSE buffer of a
``return_lse=True`` call and the validation switch."""

from __future__ import annotations

import os
import types

import pytest
import torch

from prefill_runtime import check_lse, softcap_form
from prefill_runtime.checks import PINNED_SOFTCAP_MAX, _environ_reader, kernel_softcap, validate_requested


def test_softcap_form(monkeypatch):
    """Kernel SOFTCAP: 0 without soft-capping, 2 (hardware tanh) for NVIDIA GPU tensors of compute
    capability 7.5+, 3 there for a bfloat16 q and a cap of at most PINNED_SOFTCAP_MAX (the Gluon
    consumers' pinned max), 1 (tanh through exp2) for anything else (the interpreter's CPU tensors,
    ROCm, Volta) or with ``fast=False``. The hardware forms run in the GPU soft-capping tests (both
    packages)."""
    gpu = types.SimpleNamespace(is_cuda=True, device="cuda:0", dtype=torch.float16)
    bf16 = types.SimpleNamespace(is_cuda=True, device="cuda:0", dtype=torch.bfloat16)
    cpu = torch.zeros(1)
    cap = {"value": (9, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap["value"])
    assert softcap_form(0.0, cpu) == 0 and softcap_form(0.0, gpu) == 0
    assert softcap_form(30.0, cpu) == 1
    monkeypatch.setattr(torch.version, "hip", None)
    assert softcap_form(30.0, gpu) == 2
    assert softcap_form(30.0, bf16) == 3 and softcap_form(PINNED_SOFTCAP_MAX, bf16) == 3
    assert softcap_form(PINNED_SOFTCAP_MAX * 1.01, bf16) == 2
    cap["value"] = (7, 0)
    assert softcap_form(30.0, gpu) == 1
    cap["value"] = (7, 5)
    assert softcap_form(30.0, gpu) == 2
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert softcap_form(30.0, gpu) == 1
    monkeypatch.setattr(torch.version, "hip", None)
    assert softcap_form(30.0, gpu, fast=False) == 1


def test_kernel_softcap():
    """The pinned-max form (3) reaches only the Gluon consumers of calls with nothing shifting the logits
    past the cap's bounds; elsewhere it is the hardware tanh (2); forms 0-2 pass as they are."""
    assert kernel_softcap(3, gluon=True) == 3
    assert kernel_softcap(3, gluon=True, shifted=True) == 2 and kernel_softcap(3, gluon=False) == 2
    assert [kernel_softcap(f, gluon=g, shifted=s) for f in (0, 1, 2) for g in (False, True)
            for s in (False, True)] == [f for f in (0, 1, 2) for _ in range(4)]  # fmt: skip


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


def test_validate_requested_reads_the_environment_per_call(monkeypatch):
    """``validate`` true, or ``PREFILL_VALIDATE`` exactly "1" when the call is made (set, changed and
    removed after import)."""
    for value, expected in ((None, False), ("1", True), ("0", False), ("true", False), ("1", True)):
        if value is None:
            monkeypatch.delenv("PREFILL_VALIDATE", raising=False)
        else:
            monkeypatch.setenv("PREFILL_VALIDATE", value)
        assert validate_requested(False) is expected, value
        assert validate_requested(True) is True
    monkeypatch.delenv("PREFILL_VALIDATE")
    assert validate_requested(0) is False and validate_requested(1) is True


def test_environ_reader_forms():
    """The reader over CPython's ``os.environ`` (its encoded store) and over a plain mapping (the
    ``get`` form) answer alike as the mapping changes."""
    plain: dict = {}
    read = _environ_reader(plain)
    assert read() is False
    plain["PREFILL_VALIDATE"] = "1"
    assert read() is True
    plain["PREFILL_VALIDATE"] = "0"
    assert read() is False
    assert _environ_reader(os.environ).__code__ is not read.__code__  # (the encoded-store form here)
