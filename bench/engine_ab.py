"""Engine steps of several package trees in one GPU call, interleaved: an A/B of whole trees.

    python bench/engine_ab.py --tree main=/tmp/main/packages --tree new= --rounds 3 \
        --scenarios specdec_32x4,specdec_32x8 --out DIR
    python bench/engine_ab.py --smoke --tree a= --tree b= --rounds 1 --scenarios ... --out DIR   # CPU

A tree is ``NAME=DIR``: DIR holds a checkout's ``packages/`` (``git archive COMMIT packages | tar x -C
/tmp/x``, then ``/tmp/x/packages``); an empty DIR is this checkout's. Each round runs
``bench/engine_step.py --tables steps --no-vllm`` (``--quick`` on a GPU, ``--smoke`` with ``--smoke``)
once per tree, each in a fresh process with ``BENCH_PACKAGES=DIR``, the trees in the given order, so a
drift of the machine reaches every tree alike. Writes ``DIR/<tree>_<round>/`` (each run's
``engine_step.{csv,md}`` and log) and ``DIR/engine_ab.md``: per scenario and implementation the median
over rounds of the wall time per step (no CUDA graph) and of the GPU time in a CUDA graph (where the runs
took it), each with its % against the first tree, then the sums over the rows.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
COLUMNS = (
    ("wall_ms", "wall time per step, no CUDA graph (ms)"),
    ("graph_ms", "GPU time per step in a CUDA graph (ms)"),
)


def parse_tree(text: str) -> tuple[str, str]:
    """``NAME=DIR`` -> ``(NAME, DIR)`` (DIR may be empty: this checkout's packages)."""
    name, sep, path = text.partition("=")
    if not sep or not name or not name.replace("-", "").replace(".", "").isalnum():
        raise argparse.ArgumentTypeError(f"--tree wants NAME=DIR with a plain NAME, got {text!r}")
    if path and not Path(path).is_dir():
        raise argparse.ArgumentTypeError(f"--tree {name}: {path} is not a directory")
    return name, path


def read_runs(out: Path, trees: list[str], rounds: int) -> dict[tuple[str, str, str], dict[str, list[float]]]:
    """``(scenario, impl, tree) -> {column: [value per round]}`` from the runs' ``engine_step.csv`` files
    (a missing file or an empty cell is left out)."""
    runs: dict = defaultdict(lambda: defaultdict(list))
    for tree in trees:
        for r in range(1, rounds + 1):
            path = out / f"{tree}_{r}" / "engine_step.csv"
            if not path.exists():
                continue
            with path.open() as f:
                for row in csv.DictReader(f):
                    for col, _ in COLUMNS:
                        if row.get(col):
                            runs[(row["scenario"], row["impl"], tree)][col].append(float(row[col]))
    return runs


def summary(runs: dict, trees: list[str], header: str = "") -> str:
    """The medians of :func:`read_runs`' values as Markdown tables, one per column that has values, each
    cell with its % against the first tree; rows that every tree ran, then their sums."""
    base = trees[0]
    keys = sorted({k[:2] for k in runs if all((*k[:2], t) in runs for t in trees)})
    lines = [header] if header else []
    for col, title in COLUMNS:
        rows = [k for k in keys if all(runs[(*k, t)].get(col) for t in trees)]
        if not rows:
            continue
        lines += [f"## {title}", "", "| scenario | impl | " + " | ".join(trees) + " |",
                  "|---|---|" + "---|" * len(trees)]  # fmt: skip
        sums = dict.fromkeys(trees, 0.0)

        def cell(value: float, ref: float, first: bool) -> str:
            return f"{value:.3f}" if first else f"{value:.3f} ({100 * (value / ref - 1):+.2f}%)"

        for k in rows:
            med = {t: statistics.median(runs[(*k, t)][col]) for t in trees}
            for t in trees:
                sums[t] += med[t]
            cells = " | ".join(cell(med[t], med[base], t == base) for t in trees)
            lines.append(f"| {k[0]} | {k[1]} | {cells} |")
        lines.append("| sum | | " + " | ".join(cell(sums[t], sums[base], t == base) for t in trees) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--tree",
        dest="trees",
        action="append",
        type=parse_tree,
        required=True,
        help="NAME=DIR of a tree's packages/ (empty DIR: this checkout's); the first is the base",
    )
    ap.add_argument("--rounds", type=int, default=3, help="runs per tree, interleaved (medians reported)")
    ap.add_argument("--scenarios", default="", help="engine_step.py's --scenarios (default all)")
    ap.add_argument("--out", type=Path, required=True, help="directory for the runs and engine_ab.md")
    ap.add_argument("--smoke", action="store_true", help="CPU: engine_step.py --smoke (interpreter)")
    ap.add_argument("--no-graph", action="store_true", help="no CUDA-graph timings")
    ap.add_argument("--timeout-s", type=float, default=150.0, help="limit of one engine_step.py run")
    args = ap.parse_args(argv)
    names = [n for n, _ in args.trees]
    if len(set(names)) != len(names):
        ap.error(f"tree names repeat: {names}")
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    args.out.mkdir(parents=True, exist_ok=True)
    step_args = ["--tables", "steps", "--no-vllm", "--smoke" if args.smoke else "--quick"]
    step_args += ["--scenarios", args.scenarios] if args.scenarios else []
    step_args += ["--no-graph"] if args.no_graph or args.smoke else []
    failed = 0
    for r in range(1, args.rounds + 1):
        for name, path in args.trees:
            run_dir = args.out / f"{name}_{r}"
            run_dir.mkdir(exist_ok=True)
            env = {**os.environ, "BENCH_PACKAGES": os.path.abspath(path) if path else ""}
            cmd = [sys.executable, str(HERE / "engine_step.py"), *step_args, "--out", str(run_dir)]
            with (run_dir / "log.txt").open("w") as log:
                try:
                    rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                        timeout=args.timeout_s).returncode  # fmt: skip
                except subprocess.TimeoutExpired:
                    rc = "timeout"
            failed += rc != 0
            print(f"[{name} {r}] rc={rc}", flush=True)
    title = f"# engine steps: {', '.join(names)} ({args.rounds} rounds, interleaved; % against {names[0]})\n"
    text = summary(read_runs(args.out, names, args.rounds), names, title)
    (args.out / "engine_ab.md").write_text(text)
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
