"""Run the compile check: plan the matrix, compile each distinct launch for its target, write the table.

    python tests/compile_check/cc_run.py --out DIR [--workers 2] [--targets sm90,gfx942] [--only TEXT]

(``nox -s compile-check`` runs it through tests/compile_check/test_compile_matrix.py and files the table
under bench/results/compile-check/<date>-<commit>/.) Needs the packages' ``src`` directories on
``PYTHONPATH`` and ``TRITON_INTERPRET`` unset; no GPU.

Steps: every :class:`cc_matrix.Case` is planned and its launch recorded in this process; launches with
the same Triton cache key on the same target (:func:`cc_compile.specialization_key`) are one job; the
jobs are compiled by ``--workers`` processes in a fresh Triton cache (so that every job runs the
toolchain and reports what it used); each result gets its verdict (:func:`cc_targets.verdict`).
Writes ``DIR/compile-check.csv`` (one row per job) and ``DIR/compile-check.md`` (a summary per target
and kernel, then every row), and exits 1 when any job failed to compile, broke a budget, spilled or
fell below the occupancy floor.

``--hang-guard-s`` bounds the compile phase (default 3600 s, many times its usual length): only a hung
toolchain reaches it, and the jobs left are then reported as "hang guard" failures, not as verdicts.
"""

from __future__ import annotations

import argparse
import csv
import multiprocessing
import os
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

COLUMNS = ["target", "kernel", "head", "dtype", "key_constexprs", "num_warps", "stages", "shared_bytes",
           "shared_budget", "registers", "spills", "scratch_bytes", "programs_per_sm", "verdict", "problems",
           "example", "detail"]  # fmt: skip


def passed(row: dict) -> bool:
    return row["verdict"].startswith("pass")


# --------------------------------------------------------------------------- planning (this process)
def plan_jobs(targets: list[str] | None, only: str | None) -> list[tuple[object, list[str]]]:
    """``(representative case, labels of every case with the same launch)`` per distinct launch."""
    import cc_compile
    import cc_matrix
    from cc_targets import TARGETS

    groups: dict[tuple, list] = defaultdict(list)
    for case in cc_matrix.cases(targets):
        if only and only not in case.label():
            continue
        launch = cc_matrix.launches(case)[0]
        target = TARGETS[case.target]
        key = (case.target, launch.kernel.fn.__module__, cc_compile.specialization_key(launch, target))
        groups[key].append(case)
    return [(group[0], [c.label() for c in group]) for group in groups.values()]


# --------------------------------------------------------------------------- compiling (workers)
def _init_worker(cache_dir: str) -> None:
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    import cc_compile
    import cc_matrix

    cc_matrix.prepare_process()
    cc_compile.install_driver()


def _cpu_s() -> float:
    """CPU seconds of this process and its finished children (ptxas), for the progress log."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _work(item: tuple[int, object]) -> tuple[int, dict]:
    """Compile the launch of one job's case (in a worker): its row without the grouping columns."""
    import cc_compile
    import cc_matrix
    from cc_targets import GLUON_SPILL_BYTES, TARGETS, triton_spill_budget, verdict

    index, case = item
    target = TARGETS[case.target]
    launch = cc_matrix.launches(case)[0]
    dtype = case.dtype + (f"/cache-{case.cache}" if case.cache else "")
    dtype += f"/out-{case.out}" if case.out else ""
    row = {"target": case.target, "kernel": cc_matrix.kernel_label(launch), "head": case.head,
           "dtype": dtype, "key_constexprs": cc_matrix.key_constexprs(launch),
           "shared_budget": target.shared_per_program}  # fmt: skip
    start = _cpu_s()
    try:
        res, info = cc_compile.compile_launch(launch, target)
    except Exception as exc:  # a compile error is this job's verdict
        msg = " ".join(str(exc).split())[:300]
        return index, {**row, "verdict": f"FAIL: compile error: {type(exc).__name__}: {msg}"}
    gluon = launch.plan.kernel.startswith("gluon")
    offered, why = cc_matrix.gluon_offered(case.package) if gluon else (True, "")
    budget = 0 if gluon else triton_spill_budget(case.target, case.package, case.head, case.dtype, case.cache)
    programs, bad = verdict(target, res, gluon=gluon, offered=offered, spill_budget=budget)
    ok = "pass (Gluon spills reported)" if gluon and res.spills else "pass"
    if budget and res.spills:
        ok = f"pass (timed tile: spills {res.spills} B <= {budget} B)"
    if gluon and res.spills and not offered:  # (cc_targets: the spill verdict binds where the plan picks it)
        over = f" > {GLUON_SPILL_BYTES} B" if res.spills > GLUON_SPILL_BYTES else ""
        ok = f"pass (Gluon spills {res.spills} B{over}, informational: not planned on this Triton: {why})"
    return index, {
        **row,
        "num_warps": info["num_warps"],
        "stages": info["num_stages"],
        "shared_bytes": res.shared,
        "registers": res.regs,
        "spills": res.spills,
        "scratch_bytes": res.scratch,
        "programs_per_sm": programs,
        "detail": res.detail,
        "verdict": "FAIL: " + "; ".join(bad) if bad else ok,
        "cpu_s": _cpu_s() - start,  # (the progress log only)
    }


def _cost(case) -> float:
    """A guess of a job's compile time, for starting the long ones first (no verdict uses it)."""
    return case.head * (4 if case.dtype == "fp32" else 1) * (3 if case.gluon else 1)


def run(jobs: list, workers: int, hang_guard_s: float) -> list[dict]:
    """Compile every job (``workers`` processes, longest first); one row per job, in the jobs' order."""
    order = sorted(range(len(jobs)), key=lambda i: -_cost(jobs[i][0]))
    rows: dict[int, dict] = {}
    with tempfile.TemporaryDirectory(prefix="compile-check-cache-") as cache:
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(workers, initializer=_init_worker, initargs=(cache,)) as pool:
            results = pool.imap_unordered(_work, [(i, jobs[i][0]) for i in order], chunksize=1)
            deadline = time.monotonic() + hang_guard_s
            for _ in order:
                try:
                    i, row = results.next(timeout=max(1.0, deadline - time.monotonic()))
                except multiprocessing.TimeoutError:
                    pool.terminate()
                    break
                rows[i] = row
                print(f"[{len(rows)}/{len(jobs)}] {row.get('cpu_s', 0):5.1f} cpu-s {jobs[i][1][0]}: "
                      f"{row['verdict'][:70]}", flush=True)  # fmt: skip
    out = []
    for i, (case, labels) in enumerate(jobs):
        missing = {
            "target": case.target,
            "kernel": case.package,
            "head": case.head,
            "dtype": case.dtype,
            "verdict": f"FAIL: hang guard ({hang_guard_s:.0f} s) reached before this job finished",
        }
        out.append({**rows.get(i, missing), "problems": len(labels), "example": labels[0]})  # fmt: skip
    return out


# --------------------------------------------------------------------------- the table
def _sorted(rows: list[dict]) -> list[dict]:
    from cc_targets import TARGETS

    order = {name: i for i, name in enumerate(TARGETS)}
    return sorted(rows, key=lambda r: (order[r["target"]], r["kernel"], r["head"], r["dtype"], r["example"]))


def _summary(rows: list[dict]) -> list[str]:
    lines = ["| target | kernel | launches | pass | fail | max shared / budget (B) | max registers "
             "| spills (B) | min programs per SM/CU |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    by = defaultdict(list)
    for r in rows:
        by[(r["target"], r["kernel"])].append(r)
    for (target, kernel), rs in by.items():
        ok = sum(passed(r) for r in rs)
        built = [r for r in rs if "shared_bytes" in r]
        shared = max((r["shared_bytes"] for r in built), default=0)
        regs = max((r["registers"] for r in built), default=0)
        spills = max((r["spills"] for r in built), default=0)
        programs = min((r["programs_per_sm"] for r in built), default=0)
        lines.append(f"| {target} | {kernel} | {len(rs)} | {ok} | {len(rs) - ok} | {shared} / "
                     f"{rs[0]['shared_budget']} | {regs} | {spills} | {programs} |")  # fmt: skip
    return lines


def write(rows: list[dict], out: Path, header: str) -> None:
    """``out/compile-check.csv`` and ``out/compile-check.md`` (rows sorted by target, kernel, head)."""
    rows = _sorted(rows)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "compile-check.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in COLUMNS})
    lines = [header, "", "## Summary", "", *_summary(rows), "", "## Every launch", ""]
    lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in COLUMNS) + " |" for r in rows]
    (out / "compile-check.md").write_text("\n".join(lines) + "\n")


def _gluon_note() -> str:
    """Whether each package's Gluon spill verdicts bind on this Triton (cc_targets), and why."""
    import cc_matrix
    from cc_targets import GLUON_SPILL_BYTES

    parts = []
    for package, kernels in (("prefix", "gluon-nhd, gluon-hnd, gluon-split"), ("window", "gluon")):
        offered, why = cc_matrix.gluon_offered(package)
        mode = f"bind ({GLUON_SPILL_BYTES} B)" if offered else "are informational"
        parts.append(f"{package} ({kernels}): spill verdicts {mode}: {why}.")
    return "Gluon kernels on this Triton: " + " ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="directory for compile-check.csv/.md")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--targets", default="", help="comma-separated subset of sm80,sm90,sm100,gfx942,gfx950")
    ap.add_argument("--only", default="", help="only cases whose label contains this text")
    ap.add_argument("--hang-guard-s", type=float, default=3600.0)
    args = ap.parse_args(argv)
    import cc_compile
    import cc_matrix
    import triton

    cc_matrix.prepare_process()
    cc_compile.install_driver()
    targets = [t for t in args.targets.split(",") if t] or None
    jobs = plan_jobs(targets, args.only or None)
    n_cases = sum(len(labels) for _, labels in jobs)
    print(f"{n_cases} planned calls, {len(jobs)} distinct launches", flush=True)
    rows = run(jobs, args.workers, args.hang_guard_s)
    failed = [r for r in rows if not passed(r)]
    names = ", ".join(targets or cc_matrix.TARGETS)
    header = (f"# Compile check: {n_cases} planned calls, {len(jobs)} distinct launches, "
              f"{len(failed)} failing\n\nTriton {triton.__version__} and its bundled toolchains, no GPU; "
              f"targets {names}. The matrix: tests/compile_check/cc_matrix.py; budgets, floors and verdict "
              "rules: cc_targets.py.\n\n" + _gluon_note())  # fmt: skip
    write(rows, args.out, header)
    counts = Counter((r["target"], passed(r)) for r in rows)
    print(" ".join(f"{t}:{'pass' if ok else 'FAIL'}={n}" for (t, ok), n in sorted(counts.items())))
    for r in failed:
        print(f"FAIL {r['target']} {r['kernel']} d{r['head']} {r['dtype']} [{r['example']}]: {r['verdict']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
