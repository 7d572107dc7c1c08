"""Shared test fixtures.

On a machine without a GPU the kernels run under the Triton interpreter on CPU tensors: we set
``TRITON_INTERPRET=1`` before anything imports triton. On a GPU machine tests use ``cuda``.
"""

from __future__ import annotations

import os

_HAS_GPU_NODE = os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/kfd")
if not _HAS_GPU_NODE:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1"
DEVICE = "cuda" if ON_GPU else "cpu"
# The interpreter multiplies bf16 bit patterns in tl.dot, so bf16 is a GPU-only dtype.
DTYPES = [torch.float16, torch.float32] + ([torch.bfloat16] if ON_GPU else [])


def pytest_collection_modifyitems(config, items):
    if ON_GPU:
        return
    skip = pytest.mark.skip(reason="needs a GPU (running under the Triton interpreter)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device() -> str:
    return DEVICE


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill an output buffer with NaN (or the max value for integer/fp8 types) before a kernel run,
    so any element the kernel forgets to write shows up in the comparison."""
    if t.dtype.is_floating_point and t.element_size() >= 2:
        return t.fill_(float("nan"))
    return t.view(torch.uint8).fill_(0x7F)


# The Gluon kernels (both packages) run on Hopper only.
IS_SM90 = ON_GPU and torch.version.hip is None and torch.cuda.get_device_capability() == (9, 0)
needs_sm90 = pytest.mark.skipif(not IS_SM90, reason="the Gluon kernel runs on sm90 only")


def count_gluon_launches(monkeypatch: pytest.MonkeyPatch, iface) -> list[int]:
    """Turn a package interface's Gluon kernel on (``iface._GLUON``) and wrap its ``_gluon_launch``: the
    returned list grows by one for each call the Gluon kernel took (``_gluon_launch`` returned True)."""
    taken: list[int] = []
    orig = iface._gluon_launch

    def counted(*args, **kwargs):
        ok = orig(*args, **kwargs)
        if ok:
            taken.append(1)
        return ok

    monkeypatch.setattr(iface, "_gluon_launch", counted)
    monkeypatch.setattr(iface, "_GLUON", True)
    return taken
