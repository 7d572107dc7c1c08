"""prefill_runtime as a package: its version, its public names, the Gluon module kept apart, and the
``prefill_runtime.host`` names other code imports."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import prefill_runtime

# public names of prefill_runtime that the kernel packages, tests and bench probes import
_PUBLIC = (
    "CompileTiers", "check_lse", "clear_noswizzle_base_offsets", "gluon_applies", "gluon_descriptor",
    "gluon_token_rows", "gluon_try_launch", "hook_compiles", "prime_triton", "prime_triton_in_background",
    "ptxas_launch_options", "softcap_form",
)  # fmt: skip


def test_version():
    assert prefill_runtime.__version__ == "0.29.0"


def test_public_names():
    """Exactly these names are exported: :data:`_PUBLIC` plus the allowlist's two, the launch plan record
    and the status helpers, each from the module that owns it."""
    owners = {
        "triton_setup": ("prime_triton", "prime_triton_in_background", "ptxas_launch_options"),
        "compiler_hooks": ("hook_compiles", "clear_noswizzle_base_offsets"),
        "gluon_support": ("gluon_supported", "VERIFIED_TRITON_VERSIONS"),
        "tiers": ("CompileTiers",),
        "checks": ("check_lse", "softcap_form"),
        "plan": ("LaunchPlan",),
        "gluon_host": ("gluon_applies", "gluon_descriptor", "gluon_token_rows", "gluon_try_launch"),
        "status": ("check_status", "new_status", "status_names"),
    }
    later = {"gluon_supported", "VERIFIED_TRITON_VERSIONS", "LaunchPlan", "__version__", *owners["status"]}
    assert set(_PUBLIC) | later == set(prefill_runtime.__all__)
    for module, names in owners.items():
        mod = importlib.import_module(f"prefill_runtime.{module}")
        for name in names:
            assert getattr(prefill_runtime, name) is getattr(mod, name), name


def test_host_module_reexports():
    """``prefill_runtime.host`` holds the names tests, bench probes and docstrings use, as the
    owning modules' own objects (the compile options' thread-locals included)."""
    import prefill_runtime.compiler_hooks as hooks
    import prefill_runtime.host as host

    for name in _PUBLIC:
        assert getattr(host, name) is getattr(prefill_runtime, name), name
    private = ("_DESC_FIX", "_LLVM_LEVEL", "_LLVM_O0", "_asm_wrapper", "_build_launcher",
               "_llvm_level_wrapper")  # fmt: skip
    for name in private:
        assert getattr(host, name) is getattr(hooks, name), name


def test_gluon_module_is_separate():
    """``import prefill_runtime`` does not import Gluon; ``prefill_runtime.gluon`` (and paged-kv-offsets'
    ``gluon`` module) import where this Triton has Gluon and hold the kernels' device functions."""
    code = "import sys, prefill_runtime, paged_kv_offsets; print('triton.experimental.gluon' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr[-2000:]
    try:
        importlib.import_module("triton.experimental.gluon.language.nvidia.hopper")
    except Exception:
        pytest.skip("this Triton has no Gluon")
    g = importlib.import_module("prefill_runtime.gluon")
    assert all(hasattr(g, name) for name in ("consumer", "softmax_step", "zero_v_rows", "allocate_rings"))
    assert hasattr(importlib.import_module("paged_kv_offsets.gluon"), "page_row")


def test_constexpr_map_is_read_only_and_built_once():
    """``LaunchPlan.constexpr_map``: the constexprs as a mapping (the same values as ``consts()``), read
    only, one object per plan; ``consts()`` stays a fresh dict a caller may change; equality and hashing
    are the fields' (the cached mapping takes no part)."""
    import types

    from prefill_runtime import LaunchPlan

    p = LaunchPlan("k", "r", 64, LaunchPlan.items({"B": 2, "A": True}))
    m = p.constexpr_map
    assert isinstance(m, types.MappingProxyType) and dict(m) == p.consts() == {"A": True, "B": 2}
    assert p.constexpr_map is m and m.get("ONE_CONSUMER", False) is False
    with pytest.raises(TypeError):
        m["A"] = False  # type: ignore[index]
    c = p.consts()
    c["A"] = False
    assert p.consts()["A"] is True and m["A"] is True
    q = LaunchPlan("k", "r", 64, LaunchPlan.items({"A": True, "B": 2}))
    assert q == p and hash(q) == hash(p)
