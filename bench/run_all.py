"""Run every benchmark into bench/results/<gpu>/<date>-<commit>/ (csv, md, png per kernel), then write
the combined table ``combined.csv`` and ``combined.md`` into the same folder: one row per (GPU, kernel,
shape, case, peer).

Usage: ``python bench/run_all.py [--quick] [--sweep] [--out DIR]`` (``nox -s bench`` calls this);
``python bench/run_all.py --combine-only DIR`` rebuilds the combined table of an existing run folder
(its parent is the GPU folder). Add the new folder to bench/results/README.md.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from common import ROOT, commit, gpu_name, today

COMBINED_KEYS = ["gpu", "kernel", "shape", "case", "peer", "ms", "tflops", "floor_ms", "note"]


def combine(run_dir: Path, gpu: str, commit_label: str = "") -> tuple[Path, Path] | None:
    """``run_dir``/{window_prefill,prefix_prefill}.csv -> ``run_dir``/combined.{csv,md}."""
    rows = []
    for kernel in ("window_prefill", "prefix_prefill"):
        path = run_dir / f"{kernel}.csv"
        if not path.exists():
            continue
        with path.open() as f:
            for r in csv.DictReader(f):
                if kernel == "window_prefill":
                    case = f"n={r['n']} window={r['window']} causal={r['causal']}"
                else:
                    case = f"page={r['page']}"
                rows.append({
                    "gpu": gpu, "kernel": kernel, "shape": r["shape"], "case": case, "peer": r["peer"],
                    "ms": float(r["ms"]), "tflops": float(r["tflops"]), "floor_ms": float(r["floor_ms"]),
                    "note": r.get("note", ""),
                })  # fmt: skip
    if not rows:
        return None
    csv_path = run_dir / "combined.csv"
    with csv_path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COMBINED_KEYS)
        w.writeheader()
        w.writerows(rows)
    md_path = run_dir / "combined.md"
    lines = [f"<!-- {gpu}, {run_dir.name}{commit_label}; per-kernel tables and plots beside this file -->"]
    lines += ["| " + " | ".join(COMBINED_KEYS) + " |", "|" + "---|" * len(COMBINED_KEYS)]
    for r in rows:
        cells = [f"{r[k]:.4g}" if isinstance(r[k], float) else str(r[k]) for k in COMBINED_KEYS]
        lines.append("| " + " | ".join(cells) + " |")
    md_path.write_text("\n".join(lines) + "\n")
    return csv_path, md_path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--combine-only", type=Path, default=None, help="only rebuild DIR/combined.csv/.md")
    args = ap.parse_args()
    if args.combine_only is not None:
        run_dir = args.combine_only.resolve()
        print(combine(run_dir, run_dir.parent.name.replace("_", " ")))
        return
    out = args.out or ROOT / "bench" / "results" / gpu_name().replace(" ", "_") / f"{today()}-{commit()}"
    extra = [a for a, on in (("--quick", args.quick), ("--sweep", args.sweep)) if on]
    rc = 0
    for script in ("window_prefill.py", "prefix_prefill.py", "engine_step.py"):
        print(f"== {script}", flush=True)
        rc |= subprocess.call([sys.executable, str(ROOT / "bench" / script), "--out", str(out), *extra])
    print(combine(out, gpu_name()), flush=True)
    sys.exit(rc)


if __name__ == "__main__":
    main()
