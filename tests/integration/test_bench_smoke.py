"""The A/B bench script runs end to end on the CPU (Triton interpreter, tiny shapes): its code paths
stay working between GPU sessions, and the per-token and per-tile addressing paths give
bitwise-equal outputs (with page walks off: a walk visits a page's tiles in another order)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ON_GPU

ROOT = Path(__file__).resolve().parents[2]

# CPU checks of the scripts' code paths; on a GPU node bench/gpu_session.sh runs the scripts for real
# (and there the scripts pick the GPU path whatever TRITON_INTERPRET says).
pytestmark = pytest.mark.skipif(ON_GPU, reason="interpreter smoke runs; a GPU session runs the scripts")


def test_ab_prefix_smoke():
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "ab_prefix.py"), "--smoke", "--set", "_PAGE_WALK=0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    equal = [line for line in proc.stdout.splitlines() if "bitwise equal" in line]
    assert equal and all("bitwise equal off/on: True" in line for line in equal), proc.stdout
    assert "SPREAD tiny nhd _TILE_PAGES=True" in proc.stdout


def test_first_call_smoke(tmp_path):
    """bench/first_call.py: cold and warm child processes per kernel, rows written."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "first_call.py"), "--smoke", "--out", str(tmp_path)],
        env=dict(os.environ, TRITON_INTERPRET="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    text = (tmp_path / "first_call.csv").read_text()
    for kernel in ("window", "prefix"):
        for cache in ("cold", "warm"):
            assert f"{kernel},fp16,64,{cache}," in text, text
    assert "True" not in text, "a second call with other lengths recompiled"


def test_sanitize_edge_smoke():
    """bench/sanitize_edge.py (the memcheck edge suite) runs its quick subset under the interpreter."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "sanitize_edge.py")],
        env=dict(os.environ, TRITON_INTERPRET="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert proc.stdout.strip().splitlines()[-1].endswith("cases OK"), proc.stdout[-2000:]
