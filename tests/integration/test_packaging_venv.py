"""``pip install --find-links dist`` of the kernel packages into a fresh virtual environment, as the
README says, gives working custom ops.

Slow (wheels of every package built from this tree, then a venv with torch, triton and the packages; a
few minutes): runs only with ``RUN_SLOW=1`` (``nox -s packaging`` checks each package alone the same
way). The CPU build of torch is installed first (``CPU_TORCH``, default ``torch==2.13.0``, as in the
noxfile) so pip never resolves a CUDA build. Then ``window-prefill`` and ``prefix-prefill`` are
installed by name from the wheels, their siblings resolved from the same folder; from outside the
repository and without ``PYTHONPATH``, the installed packages must register ``torch.ops.<pkg>.fwd`` on
import (with nothing but their declared dependencies: no numpy), ship ``py.typed`` and declare their
``vllm.general_plugins`` entry points; with the ``[cpu]`` extra added (numpy, which the Triton
interpreter needs), a small problem must match the (also installed) float64 reference. No wall-clock
limit: pip's own network timeouts bound the installs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("RUN_SLOW") != "1", reason="slow (builds a venv): set RUN_SLOW=1"),
]

CHECK = textwrap.dedent(
    """
    import importlib.metadata as md
    import pathlib
    import sys

    import torch

    import prefix_prefill
    import window_prefill

    for pkg in (window_prefill, prefix_prefill):
        where = pathlib.Path(pkg.__file__).resolve()
        assert str(where).startswith(sys.prefix), (where, sys.prefix)  # the installed copy, not the tree
        assert (where.parent / "py.typed").is_file(), where
        assert (where.parent / "ops.py").is_file() and (where.parent / "vllm_plugin.py").is_file()
    schema = str(torch.ops.window_prefill.fwd.default._schema)
    assert schema.startswith("window_prefill::fwd(") and "!) out" in schema, schema
    assert str(torch.ops.prefix_prefill.fwd.default._schema).startswith("prefix_prefill::fwd(")
    eps = {e.name: e.value for e in md.entry_points(group="vllm.general_plugins")}
    assert eps.get("window_prefill") == "window_prefill.vllm_plugin:register", eps
    assert eps.get("prefix_prefill") == "prefix_prefill.vllm_plugin:register", eps
    print("install ok:", torch.__version__)
    """
)

RUN = textwrap.dedent(
    """
    import torch

    import window_prefill
    from attn_reference import attention_varlen, compare

    torch.manual_seed(0)
    q = torch.randn(23, 4, 32, dtype=torch.float16)
    k = torch.randn(23, 2, 32, dtype=torch.float16)
    v = torch.randn(23, 2, 32, dtype=torch.float16)
    cu = torch.tensor([0, 6, 23], dtype=torch.int32)
    out = window_prefill.window_prefill(q, k, v, cu, 17, window=(4, -1), validate=True)
    res = compare(out, attention_varlen(q, k, v, cu, cu, causal=True, window=(4, -1)))
    assert res, res
    print("kernel ok:", res)
    """
)


def _run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_pip_install_into_fresh_venv_registers_ops(tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    py = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    _run([*pip, os.environ.get("CPU_TORCH", "torch==2.13.0")], env=env)
    dist = tmp_path / "dist"
    names = ["paged-kv-offsets", "prefill-runtime", "attn-reference", "window-prefill", "prefix-prefill"]
    wheel = [py, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps", "-w", str(dist)]
    _run([*wheel, *(str(ROOT / "packages" / p) for p in names)], env=env)
    find = ["--find-links", str(dist)]
    _run([*pip, *find, "attn-reference", "window-prefill", "prefix-prefill"], env=env)
    # Outside the tree (cwd), so the installed copies are imported; only the packages' own dependencies.
    proc = _run([py, "-c", CHECK], env={**env, "TRITON_INTERPRET": "0"}, cwd=tmp_path)
    assert "install ok" in proc.stdout
    # The [cpu] extra brings what Triton's interpreter needs (numpy; the GPU path never imports it).
    _run([*pip, *find, "window-prefill[cpu]"], env=env)
    proc = _run([py, "-c", RUN], env={**env, "TRITON_INTERPRET": "1"}, cwd=tmp_path)
    assert "kernel ok" in proc.stdout
