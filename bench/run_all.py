"""Run every benchmark into bench/results/<gpu>/<date>/ (csv, md, png per kernel).

Usage: ``python bench/run_all.py [--quick] [--sweep] [--out DIR]`` (``nox -s bench`` calls this).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from common import ROOT, gpu_name, today


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sweep", action="store_true")
    args = ap.parse_args()
    out = args.out or ROOT / "bench" / "results" / gpu_name().replace(" ", "_") / today()
    extra = [a for a, on in (("--quick", args.quick), ("--sweep", args.sweep)) if on]
    rc = 0
    for script in ("window_prefill.py", "prefix_prefill.py"):
        print(f"== {script}", flush=True)
        rc |= subprocess.call([sys.executable, str(ROOT / "bench" / script), "--out", str(out), *extra])
    sys.exit(rc)


if __name__ == "__main__":
    main()
