"""prefill_runtime.tiers: CompileTiers, a quick-compiling form for first calls and the full form
compiled in the background."""

from __future__ import annotations

import threading

import pytest

import prefill_runtime
import prefill_runtime.tiers as tiers_mod


def test_compile_tiers(monkeypatch):
    """``CompileTiers``: a key's first call launches the quick form and compiles the full form once in
    a background thread; calls after it finished launch the full form (inside a graph capture only once
    it was launched outside one); a failed background compile keeps the quick form; a failing quick
    launch raises to the caller and compiles nothing; ``finish`` waits, ``pending`` counts."""
    capturing = []
    monkeypatch.setattr(tiers_mod, "_capturing", lambda: bool(capturing))
    gate = threading.Event()
    seen = []

    def launch_for(name, fail_full=False, fail_quick=False):
        def launch(full, warmup):
            if warmup:
                gate.wait(10)
                if fail_full:
                    raise RuntimeError("compile failed")
            elif not full and fail_quick:
                raise RuntimeError("launch failed")
            seen.append((name, full, warmup))

        return launch

    tiers = prefill_runtime.CompileTiers()
    assert tiers.run("a", launch_for("a")) is False and tiers.pending() == 1
    assert tiers.run("a", launch_for("a")) is False  # still compiling: quick again, no second compile
    assert tiers.finish(timeout=0.01) is False
    gate.set()
    assert tiers.finish(timeout=10) is True and tiers.pending() == 0
    capturing.append(1)
    assert tiers.run("a", launch_for("a")) is False  # compiled, never launched: quick inside a capture
    capturing.clear()
    assert tiers.run("a", launch_for("a")) is True
    capturing.append(1)
    assert tiers.run("a", launch_for("a")) is True
    capturing.clear()
    assert seen == [("a", False, False), ("a", False, False), ("a", True, True), ("a", False, False),
                    ("a", True, False), ("a", True, False)]  # fmt: skip
    assert tiers.run("b", launch_for("b", fail_full=True)) is False
    tiers.finish(timeout=10)
    assert tiers.run("b", launch_for("b", fail_full=True)) is False and tiers.pending() == 0
    with pytest.raises(RuntimeError):
        tiers.run("c", launch_for("c", fail_quick=True))
    assert tiers.pending() == 0 and tiers.run("c", launch_for("c")) is False
    tiers.finish(timeout=10)
    tiers.clear()
    assert tiers.run("a", launch_for("a")) is False
    tiers.finish(timeout=10)
