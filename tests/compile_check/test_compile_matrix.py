"""Every kernel configuration the plans pick, compiled for sm80, sm90, sm100, gfx942 and gfx950 without a
GPU, within each target's shared-memory/LDS budget, without spills, above the occupancy floor.

The matrix and the rules: tests/compile_check/cc_matrix.py and cc_targets.py. The compiles run in
``cc_run.py`` (a subprocess without ``TRITON_INTERPRET``, two worker processes); its table goes to
``$COMPILE_CHECK_OUT`` (``nox -s compile-check`` sets it to bench/results/compile-check/<date>-<commit>/),
else to the test's temporary directory. The subprocess limit is a hang guard only, far above the
check's length; the verdicts are the compilers' resource counts, whatever the machine's load.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
#: seconds after which the compile phase is called hung (a normal run takes a few minutes)
HANG_GUARD_S = 3600


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    src = [str(p) for p in sorted((ROOT / "packages").glob("*/src"))]
    env["PYTHONPATH"] = os.pathsep.join([*src, str(HERE), env.get("PYTHONPATH", "")])
    return env


@pytest.mark.compile_check
def test_every_planned_launch_compiles_within_budget(tmp_path):
    pytest.importorskip("triton.backends.nvidia")
    pytest.importorskip("triton.backends.amd")
    out = Path(os.environ.get("COMPILE_CHECK_OUT") or tmp_path)
    cmd = [sys.executable, str(HERE / "cc_run.py"), "--out", str(out), "--workers", "2",
           "--hang-guard-s", str(HANG_GUARD_S)]  # fmt: skip
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=HANG_GUARD_S + 600)
    table = out / "compile-check.csv"
    assert table.is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(table) as f:
        rows = list(csv.DictReader(f))
    targets = {r["target"] for r in rows}
    assert targets == {"sm80", "sm90", "sm100", "gfx942", "gfx950"}, targets
    kernels = {(r["target"], r["kernel"]) for r in rows}
    gluon = ("prefix:gluon-nhd", "prefix:gluon-hnd", "prefix:gluon-split", "window:gluon")
    assert {("sm90", k) for k in gluon} <= kernels
    failing = [f"{r['target']} {r['kernel']} d{r['head']} {r['dtype']} [{r['example']}]: {r['verdict']}"
               for r in rows if not r["verdict"].startswith("pass")]  # fmt: skip
    assert not failing, f"{len(failing)} of {len(rows)} launches fail (table: {out}):\n" + "\n".join(failing)
    assert proc.returncode == 0, proc.stderr[-3000:]
