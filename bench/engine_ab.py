"""Engine steps (or the host time per call) of several package trees in one GPU call, interleaved: an
A/B of whole trees.

    python bench/engine_ab.py --tree main=/tmp/main/packages --tree new= --rounds 3 \
        --scenarios specdec_32x4,specdec_32x8 --out DIR
    python bench/engine_ab.py --host --tree main=/tmp/main/packages --tree new= --rounds 4 --out DIR
    python bench/engine_ab.py --smoke --tree a= --tree b= --rounds 1 --scenarios ... --out DIR   # CPU

A tree is ``NAME=DIR``: DIR holds a checkout's ``packages/`` (``git archive COMMIT packages | tar x -C
/tmp/x``, then ``/tmp/x/packages``); an empty DIR is this checkout's. Each round runs
``bench/engine_step.py --tables steps --no-vllm`` (``--quick`` on a GPU, ``--smoke`` with ``--smoke``)
once per tree, each in a fresh process with ``BENCH_PACKAGES=DIR``, the trees in the given order, so a
drift of the machine reaches every tree alike. Writes ``DIR/<tree>_<round>/`` (each run's
``engine_step.{csv,md}`` and log) and ``DIR/engine_ab.md``: per scenario and implementation the median
over rounds of the wall time per step (no CUDA graph) and of the GPU time in a CUDA graph (where the runs
took it), each with its % against the first tree, then the sums over the rows. With ``--host`` each run
is ``engine_step.py --tables host`` (the tiny problem per entry point) and ``DIR/engine_host_ab.md`` has,
per entry point, the medians over rounds of the best round's host time per call, of its ratio to torch
SDPA's in the same process (the host drifts between processes, up to 1.6x here: compare this column)
and of the GPU time per call in a CUDA graph.
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
HOST_COLUMNS = (
    ("vs_sdpa", "host time per call over torch SDPA's in the same process"),
    ("host_us", "host time per call, best round of the process (us)"),
    ("graph_us", "GPU time per call in a CUDA graph (us)"),
)


def parse_tree(text: str) -> tuple[str, str]:
    """``NAME=DIR`` -> ``(NAME, DIR)`` (DIR may be empty: this checkout's packages)."""
    name, sep, path = text.partition("=")
    if not sep or not name or not name.replace("-", "").replace(".", "").isalnum():
        raise argparse.ArgumentTypeError(f"--tree wants NAME=DIR with a plain NAME, got {text!r}")
    if path and not Path(path).is_dir():
        raise argparse.ArgumentTypeError(f"--tree {name}: {path} is not a directory")
    return name, path


def run_in_tree(cmd: list[str], path: str, log: Path, timeout: float, extra_env: dict | None = None):
    """``cmd`` in a fresh process with ``BENCH_PACKAGES`` the tree ``path`` (empty: this checkout's), its
    output into ``log``: the return code, or "timeout" past ``timeout`` seconds."""
    env = {**os.environ, **(extra_env or {}), "BENCH_PACKAGES": os.path.abspath(path) if path else ""}
    with log.open("w") as f:
        try:
            proc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired:
            return "timeout"
    return proc.returncode


def read_runs(
    out: Path, trees: list[str], rounds: int, host: bool = False
) -> dict[tuple[str, str, str], dict[str, list[float]]]:
    """``(scenario, impl, tree) -> {column: [value per round]}`` from the runs' ``engine_step.csv`` files,
    or with ``host`` their ``engine_host.csv`` (scenario ``tiny``) (a missing file or an empty cell is
    left out)."""
    runs: dict = defaultdict(lambda: defaultdict(list))
    name, columns = ("engine_host.csv", HOST_COLUMNS) if host else ("engine_step.csv", COLUMNS)
    for tree in trees:
        for r in range(1, rounds + 1):
            path = out / f"{tree}_{r}" / name
            if not path.exists():
                continue
            with path.open() as f:
                for row in csv.DictReader(f):
                    for col, _ in columns:
                        if row.get(col):
                            key = (row.get("scenario", "tiny"), row["impl"], tree)
                            runs[key][col].append(float(row[col]))
    return runs


def summary(runs: dict, trees: list[str], header: str = "", host: bool = False) -> str:
    """The medians of :func:`read_runs`' values as Markdown tables, one per column that has values, each
    cell with its % against the first tree; rows that every tree ran, then their sums (not for ``host``:
    its rows are entry points of one problem, and one column is a ratio)."""
    base = trees[0]
    keys = sorted({k[:2] for k in runs if all((*k[:2], t) in runs for t in trees)})
    lines = [header] if header else []
    for col, title in HOST_COLUMNS if host else COLUMNS:
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
        total = " | ".join(cell(sums[t], sums[base], t == base) for t in trees)
        lines += [] if host else [f"| sum | | {total} |"]
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
    ap.add_argument("--host", action="store_true", help="the host table per call instead of the steps")
    ap.add_argument("--no-graph", action="store_true", help="no CUDA-graph timings")
    ap.add_argument("--timeout-s", type=float, default=150.0, help="limit of one engine_step.py run")
    args = ap.parse_args(argv)
    names = [n for n, _ in args.trees]
    if len(set(names)) != len(names):
        ap.error(f"tree names repeat: {names}")
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    args.out.mkdir(parents=True, exist_ok=True)
    table = "host" if args.host else "steps"
    step_args = ["--tables", table, "--no-vllm", "--smoke" if args.smoke else "--quick"]
    step_args += ["--scenarios", args.scenarios] if args.scenarios and not args.host else []
    step_args += ["--no-graph"] if args.no_graph or args.smoke else []
    failed = 0
    for r in range(1, args.rounds + 1):
        for name, path in args.trees:
            run_dir = args.out / f"{name}_{r}"
            run_dir.mkdir(exist_ok=True)
            cmd = [sys.executable, str(HERE / "engine_step.py"), *step_args, "--out", str(run_dir)]
            rc = run_in_tree(cmd, path, run_dir / "log.txt", args.timeout_s)
            failed += rc != 0
            print(f"[{name} {r}] rc={rc}", flush=True)
    what = "host time per call (tiny problem)" if args.host else "engine steps"
    title = f"# {what}: {', '.join(names)} ({args.rounds} rounds, interleaved; % against {names[0]})\n"
    text = summary(read_runs(args.out, names, args.rounds, args.host), names, title, args.host)
    (args.out / ("engine_host_ab.md" if args.host else "engine_ab.md")).write_text(text)
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
