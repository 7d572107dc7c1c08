"""prefill_runtime.gluon_support: the Triton-version allowlist of the Gluon kernels and the PTX pass,
PREFILL_GLUON, and the one log line when the portable kernels run because of the allowlist."""

from __future__ import annotations

import logging

import pytest
import triton

import prefill_runtime
import prefill_runtime.gluon_support as support


@pytest.fixture
def fresh(monkeypatch):
    """No PREFILL_GLUON, Gluon present, the log line not yet written in this process."""
    monkeypatch.delenv("PREFILL_GLUON", raising=False)
    monkeypatch.setattr(support, "_has_gluon", lambda: True)
    monkeypatch.setattr(support, "_LOGGED", False)
    return monkeypatch


def test_allowlist_is_explicit():
    """Today's allowlist is Triton 3.6 only, exported as it is."""
    assert prefill_runtime.VERIFIED_TRITON_VERSIONS == support.VERIFIED_TRITON_VERSIONS == ("3.6",)


@pytest.mark.parametrize("raw, want", [("3.6.0", "3.6"), ("3.6.1+git8a1b2c", "3.6"), ("3.10.0rc1", "3.10"),
                                       ("4.0", "4.0"), ("dev", ""), (None, "")])  # fmt: skip
def test_triton_version(monkeypatch, raw, want):
    """``major.minor`` of whatever Triton reports, ``""`` when it reports no version."""
    monkeypatch.setattr(triton, "__version__", raw)
    assert support.triton_version() == want


def test_verified_version(fresh):
    """Triton 3.6 (any patch or build): supported, the reason says verified; nothing logged."""
    fresh.setattr(triton, "__version__", "3.6.0+gitabc")
    ok, reason = prefill_runtime.gluon_supported()
    assert ok and "3.6 is verified" in reason
    assert support.ptx_passes_supported() and not support._LOGGED


def test_outside_allowlist_logs_once(fresh, caplog):
    """Triton 3.8: not supported, with a reason naming the version, the allowlist and how to force; the
    first such answer logs one WARNING line on logger ``prefill_runtime`` and later answers log
    nothing; the PTX pass is off too."""
    fresh.setattr(triton, "__version__", "3.8.0")
    caplog.set_level(logging.INFO, logger="prefill_runtime")
    ok, reason = prefill_runtime.gluon_supported()
    assert not ok and "Triton 3.8" in reason and "3.6" in reason and "PREFILL_GLUON=1" in reason
    assert prefill_runtime.gluon_supported() == (False, reason)
    records = [r for r in caplog.records if r.name == "prefill_runtime"]
    assert len(records) == 1 and records[0].levelno == logging.WARNING
    line = records[0].getMessage()
    assert "portable Triton kernels" in line and "PREFILL_GLUON=1" in line
    assert not support.ptx_passes_supported()


def test_forced_on(fresh, caplog):
    """PREFILL_GLUON=1 outside the allowlist: supported, the reason says forced; PTX pass on; no log
    line (nothing falls back)."""
    fresh.setattr(triton, "__version__", "3.8.0")
    fresh.setenv("PREFILL_GLUON", "1")
    caplog.set_level(logging.INFO, logger="prefill_runtime")
    ok, reason = prefill_runtime.gluon_supported()
    assert ok and "forced by PREFILL_GLUON=1" in reason and "3.8" in reason
    assert support.ptx_passes_supported()
    assert not [r for r in caplog.records if r.name == "prefill_runtime"]


def test_forced_off(fresh, caplog):
    """PREFILL_GLUON=0 on an allowlisted Triton: not supported (the user's choice: no log line); the PTX
    pass stays on for a Gluon kernel that compiles anyway."""
    fresh.setattr(triton, "__version__", "3.6.0")
    fresh.setenv("PREFILL_GLUON", "0")
    caplog.set_level(logging.INFO, logger="prefill_runtime")
    assert prefill_runtime.gluon_supported() == (False, "PREFILL_GLUON=0: the portable Triton kernels run")
    assert support.ptx_passes_supported()
    assert not [r for r in caplog.records if r.name == "prefill_runtime"]


def test_no_gluon(fresh):
    """A Triton without Gluon: not supported, whatever the version or PREFILL_GLUON=1 says."""
    fresh.setattr(support, "_has_gluon", lambda: False)
    for version, env in (("3.6.0", None), ("3.8.0", "1")):
        fresh.setattr(triton, "__version__", version)
        if env:
            fresh.setenv("PREFILL_GLUON", env)
        ok, reason = prefill_runtime.gluon_supported()
        assert not ok and "no Gluon" in reason


def test_has_gluon_matches_this_triton():
    """``_has_gluon`` answers whether the Gluon Hopper module imports here."""
    try:
        import triton.experimental.gluon.language.nvidia.hopper  # noqa: F401

        present = True
    except Exception:
        present = False
    assert support._has_gluon() is present
