"""The compile check's own rules, on the CPU (no compile): each target's GPU gets its own table in both
packages, and the occupancy arithmetic and verdicts of :mod:`cc_targets` on known resource counts."""

from __future__ import annotations

import pytest
from cc_targets import (
    GLUON_SPILL_BYTES,
    KIB,
    TARGETS,
    TIMED_SPILL_BYTES,
    Resources,
    emulated_device,
    programs_per_sm,
    triton_spill_budget,
    verdict,
)

import prefix_prefill.configs as pc
import window_prefill.configs as wc


@pytest.mark.parametrize("name", list(TARGETS))
def test_each_target_has_its_own_table_entries(name):
    with emulated_device(TARGETS[name]) as device:
        assert pc.detect_arch(device) == name
        assert wc.detect_arch(device) == name
    assert {a for a, *_ in pc.CONFIGS} >= {name} and {a for a, *_ in wc.CONFIGS} >= {name}


def test_emulation_is_undone():
    with emulated_device(TARGETS["gfx942"]):
        pass
    import torch

    assert torch.version.hip is None or torch.version.hip != "6.4"
    assert pc.detect_arch(torch.device("cpu")) == "interpreter"


def test_nvidia_occupancy():
    sm90 = TARGETS["sm90"]
    # 255 registers x 256 threads: 8 warps of 8192 registers (rounded to 256 per warp) -> 1 program
    big = Resources(shared=200 * KIB, threads=256, regs=255, spills=0, scratch=0)
    assert programs_per_sm(sm90, big) == 1
    # 64 registers x 128 threads: registers bound it at 65536 / 8192 = 8 (24 KiB of shared memory: 9)
    small = Resources(shared=24 * KIB, threads=128, regs=64, spills=0, scratch=0)
    assert programs_per_sm(sm90, small) == 8
    assert verdict(sm90, small) == (8, [])
    # 40 KiB of shared memory: 228 / 41 = 5
    assert programs_per_sm(sm90, Resources(shared=40 * KIB, threads=128, regs=64, spills=0, scratch=0)) == 5


def test_amd_occupancy():
    gfx942 = TARGETS["gfx942"]
    # 1 wave per SIMD (the compiler's figure), 4 waves per program -> 1 program; LDS 32 KiB allows 2
    r = Resources(shared=32 * KIB, threads=256, regs=312, spills=0, scratch=0, waves_per_simd=1)
    assert programs_per_sm(gfx942, r) == 1
    # 8 waves per program on 1 wave per SIMD: no program fits
    r8 = Resources(shared=32 * KIB, threads=512, regs=312, spills=0, scratch=0, waves_per_simd=1)
    assert verdict(gfx942, r8)[1] == ["no program fits on one SM/CU"]


def test_verdicts():
    sm80 = TARGETS["sm80"]
    ok = Resources(shared=100 * KIB, threads=256, regs=200, spills=0, scratch=0)
    assert verdict(sm80, ok)[1] == []
    over = Resources(shared=170 * KIB, threads=256, regs=200, spills=0, scratch=0)
    assert "budget" in verdict(sm80, over)[1][0]
    spilled = Resources(shared=100 * KIB, threads=256, regs=255, spills=8, scratch=8)
    assert verdict(sm80, spilled)[1] == ["spills 8, scratch 8 B"]
    # a Gluon kernel's spills are reported up to the allowance, then fail
    assert verdict(sm80, spilled, gluon=True)[1] == []
    many = Resources(shared=100 * KIB, threads=384, regs=168, spills=GLUON_SPILL_BYTES + 8, scratch=64)
    assert verdict(sm80, many, gluon=True)[1] == [f"spills {GLUON_SPILL_BYTES + 8} B > {GLUON_SPILL_BYTES} B"]
    # ... where the plan offers the kernel; elsewhere its spills are informational, the other rules hold
    assert verdict(sm80, many, gluon=True, offered=False)[1] == []
    too_big = Resources(shared=170 * KIB, threads=384, regs=168, spills=GLUON_SPILL_BYTES + 8, scratch=64)
    assert "budget" in verdict(sm80, too_big, gluon=True, offered=False)[1][0]
    # a Triton kernel's spills fail, but within a timed class's budget
    assert verdict(sm80, spilled, offered=False)[1] == ["spills 8, scratch 8 B"]
    assert verdict(sm80, spilled, spill_budget=8)[1] == []
    assert verdict(sm80, spilled, spill_budget=4)[1] == ["spills 8 B > 4 B (timed class)"]
    # two warps on one SM leave two of its four schedulers idle
    thin = Resources(shared=100 * KIB, threads=64, regs=255, spills=0, scratch=0)
    assert verdict(sm80, thin)[1] == ["2 warps per SM/CU < 4"]


def test_timed_spill_classes():
    """Only prefix-prefill's sm90 fp8-cache tile at head 256 with 16-bit q may spill (its head bucket:
    192 too); the same case on another target, dtype, cache or package may not."""
    budget = TIMED_SPILL_BYTES[("sm90", "prefix", 256, "16bit", "fp8")]
    assert triton_spill_budget("sm90", "prefix", 256, "bf16", "fp8") == budget > 0
    assert triton_spill_budget("sm90", "prefix", 192, "fp16", "fp8") == budget
    for case in (("sm80", "prefix", 256, "bf16", "fp8"), ("sm90", "prefix", 256, "fp32", "fp8"),
                 ("sm90", "prefix", 256, "bf16", None), ("sm90", "prefix", 128, "bf16", "fp8"),
                 ("sm90", "window", 256, "bf16", "fp8")):  # fmt: skip
        assert triton_spill_budget(*case) == 0, case


def test_gluon_offered_follows_the_packages_gates(monkeypatch):
    """Both packages' Gluon kernels are offered where prefill_runtime's allowlist (or PREFILL_GLUON=1)
    lets their launchers plan them."""
    import cc_matrix

    import prefill_runtime
    from prefix_prefill import launch as prefix_launch

    offered, why = cc_matrix.gluon_offered("prefix")
    assert offered == prefix_launch.gluon_allowed() and why == prefill_runtime.gluon_supported()[1]
    monkeypatch.setenv("PREFILL_GLUON", "0")
    assert cc_matrix.gluon_offered("prefix")[0] is False
    from window_prefill import launch as window_launch

    assert cc_matrix.gluon_offered("window")[0] is False  # PREFILL_GLUON=0 turns window-prefill's off too
    monkeypatch.setattr(window_launch, "_gluon_ok", True)
    monkeypatch.setenv("PREFILL_GLUON", "1")  # forced: offered on any Triton
    assert cc_matrix.gluon_offered("window")[0] is True and window_launch.gluon_offered()
