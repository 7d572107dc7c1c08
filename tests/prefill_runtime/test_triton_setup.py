"""prefill_runtime.triton_setup: Triton's first-launch setup (prime_triton, its early start) and the
per-launch ptxas options with their probe."""

from __future__ import annotations

import sys
import threading
import types

import pytest
import torch

import prefill_runtime
import prefill_runtime.triton_setup as setup
from prefill_runtime import prime_triton, ptxas_launch_options


@pytest.fixture
def steps(monkeypatch):
    """Triton's setup steps replaced by recorders (the library hash and the driver's device query raise,
    as on a machine without a driver); a CUDA device of capability 9.0 that is not ROCm; priming not yet
    run. Yields the list of the steps run, in any order."""
    import triton.runtime
    import triton.runtime.cache

    seen: list[object] = []

    def boom(name):
        def step():
            seen.append(name)
            raise RuntimeError(f"{name} failed")

        return step

    monkeypatch.setattr(triton.runtime.cache, "triton_key", boom("hash"))
    active = types.SimpleNamespace(get_current_device=boom("device"))
    monkeypatch.setattr(triton.runtime, "driver", types.SimpleNamespace(active=active))
    monkeypatch.setattr(setup, "_ptxas_has_register_usage_level", lambda cap: seen.append(("ptxas", cap)))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(setup, "_PRIMED", False)
    monkeypatch.setattr(setup, "_PRIME_THREAD", None)
    yield seen


def test_prime_triton_runs_each_step_once(steps):
    """The first call runs each setup step once (the library hash, the driver's device, the ptxas probe
    for the current device) and swallows their failures; a second call runs none."""
    prime_triton()
    assert sorted(map(str, steps)) == sorted(map(str, ["hash", "device", ("ptxas", (9, 0))]))
    assert setup._PRIMED
    steps.clear()
    prime_triton()
    assert steps == []


def test_prime_triton_no_ptxas_probe_on_rocm(steps, monkeypatch):
    """On ROCm the ptxas probe is left out; the other steps run."""
    monkeypatch.setattr(torch.version, "hip", "6.2")
    prime_triton()
    assert sorted(steps) == ["device", "hash"]


def test_prime_triton_in_background(monkeypatch):
    """The opt-in early start: priming runs in a daemon thread; a first launch's prime_triton waits for
    it (here: it blocks until the thread's slow step ends), and a second early start is a no-op."""
    gate, order = threading.Event(), []

    def slow_probe(cap):  # the thread's last helper step, held until the test lets it go
        gate.wait(10)
        order.append("primed")
        return True

    monkeypatch.setattr(setup, "_ptxas_has_register_usage_level", slow_probe)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(setup, "_PRIMED", False)
    monkeypatch.setattr(setup, "_PRIME_THREAD", None)
    thread = prefill_runtime.prime_triton_in_background()
    assert thread is not None and thread.daemon and setup._PRIME_THREAD is thread
    assert prefill_runtime.prime_triton_in_background() is None  # started already
    threading.Timer(0.2, gate.set).start()
    prime_triton()  # the first launch: returns only once the early priming is done
    order.append("launch")
    assert order == ["primed", "launch"] and setup._PRIMED and not thread.is_alive()
    monkeypatch.setattr(setup, "_PRIME_THREAD", None)
    assert prefill_runtime.prime_triton_in_background() is None  # primed already


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
    monkeypatch.setattr(setup, "_ptxas_has_register_usage_level", lambda cap: False)
    assert ptxas_launch_options(3, gpu) == {}
    monkeypatch.setattr(setup, "_ptxas_has_register_usage_level", lambda cap: True)
    monkeypatch.setattr(setup, "_user_ptxas_options", lambda: None)
    assert ptxas_launch_options(3, gpu) == {"ptx_options": "--register-usage-level=3"}
    # PTXAS_OPTIONS (Triton's default ptx_options, which a launch's ptx_options replaces) is kept
    monkeypatch.setattr(setup, "_user_ptxas_options", lambda: "-lineinfo --warn-on-spills")
    assert ptxas_launch_options(3, gpu) == {
        "ptx_options": "-lineinfo --warn-on-spills --register-usage-level=3"
    }
    monkeypatch.setattr(setup, "_user_ptxas_options", lambda: "--register-usage-level=8")
    assert ptxas_launch_options(3, gpu) == {}  # the user's own level wins


def test_user_ptxas_options(monkeypatch):
    """PTXAS_OPTIONS as Triton reads it (None when unset or empty)."""
    from triton import knobs

    monkeypatch.setattr(knobs.nvidia, "ptxas_options", None, raising=False)
    assert setup._user_ptxas_options() is None
    monkeypatch.setattr(knobs.nvidia, "ptxas_options", "-lineinfo", raising=False)
    assert setup._user_ptxas_options() == "-lineinfo"


@pytest.fixture
def fake_ptxas(monkeypatch, tmp_path):
    """Triton's ptxas replaced by a script whose ``--help`` prints ``help`` (set by the test); yields a
    setter and the list of architectures Triton was asked for. The probe's cache is cleared around."""
    import triton.backends.nvidia.compiler as nv

    asked: list[int] = []
    script = tmp_path / "ptxas"

    def set_help(text: str | None) -> None:
        body = f"cat <<'HELP'\n{text}\nHELP\n" if text is not None else "exit 3\n"
        script.write_text("#!/bin/sh\n" + body)
        script.chmod(0o755)

    def get_ptxas(arch=None):
        asked.append(arch)
        return types.SimpleNamespace(path=str(script))

    monkeypatch.setattr(nv, "get_ptxas", get_ptxas)
    setup._ptxas_has_register_usage_level.cache_clear()
    yield set_help, asked
    setup._ptxas_has_register_usage_level.cache_clear()


@pytest.mark.skipif(sys.platform == "win32", reason="a shell-script ptxas")
def test_ptxas_probe(fake_ptxas, monkeypatch, tmp_path):
    """The probe answers whether the ptxas Triton picks for the device's architecture lists the flag,
    asking once per capability; a ptxas that is missing or cannot run, or a Triton whose CUDA options
    have no ``ptx_options``, answers False instead of raising."""
    import triton.backends.nvidia.compiler as nv

    set_help, asked = fake_ptxas
    set_help("  --register-usage-level <N>   (beta)\n  --warn-on-spills")
    assert setup._ptxas_has_register_usage_level((9, 0)) is True
    assert setup._ptxas_has_register_usage_level((9, 0)) is True and asked == [90]  # asked once
    set_help("  --warn-on-spills")
    assert setup._ptxas_has_register_usage_level((8, 0)) is False and asked == [90, 80]
    setup._ptxas_has_register_usage_level.cache_clear()
    (tmp_path / "ptxas").unlink()
    assert setup._ptxas_has_register_usage_level((9, 0)) is False
    setup._ptxas_has_register_usage_level.cache_clear()
    fields = {k: v for k, v in nv.CUDAOptions.__dataclass_fields__.items() if k != "ptx_options"}
    monkeypatch.setattr(nv.CUDAOptions, "__dataclass_fields__", fields)
    set_help("  --register-usage-level <N>")
    assert setup._ptxas_has_register_usage_level((9, 0)) is False
