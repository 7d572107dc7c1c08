"""One window_prefill call for Nsight Compute to profile, and the summary of the reports.

    ncu --profile-from-start off --set full -k regex:gluon -o REP python bench/window_ncu.py SHAPE \
        [--l2 F] [--softcap C] [--impl fa3]
    python bench/window_ncu.py --summary DIR      # DIR: <tag>.details.csv and <tag>.sass.csv pairs

SHAPE is a varlen row of ``bench/trees_ab.py``'s table (``anchors``' rows and its own: ``causal8k``,
``noncausal8k``, ``short1k``, ``batch4x16k``, ...), bf16. The call runs once to compile and three times to
settle, then once between ``cudaProfilerStart`` and ``cudaProfilerStop``: the profiled launch is the warm
one. ``--l2 F`` tells ``plan.schedule`` the L2 is ``F`` of its size (smaller sections of the persistent
kernel's order); a tree without a schedule ignores it. ``--softcap C`` calls with soft-capping (issue
46's cost of a feature against the plain call). ``--impl fa3`` profiles FlashAttention-3's forward on the
same inputs instead (``anchors``' call of it; the peer wheels on ``PYTHONPATH``; its kernel is a CUTLASS
``device_kernel``: ``-k regex:device_kernel``), the counts beside ours. ``BENCH_PACKAGES`` picks the
package tree (bench/common.py).

The summary (Markdown) has per report the duration, L2 hit rate, DRAM active cycles, executed
instructions, IPC, local-memory spill requests and the memory units' busiest share and peak bandwidth,
then the instructions with the most stall samples and their leading reasons (``gpu_session.sh
ncuwindow`` and ``ncufeatures`` write both csv pages).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from pathlib import Path

METRICS = (
    ("Duration", "ms"),
    ("L2 Hit Rate", "%"),
    ("Average DRAM Active Cycles", ""),
    ("Executed Instructions", ""),
    ("Executed Ipc Active", ""),
    ("Local Memory Spilling Requests", ""),
    ("Mem Busy", "%"),  # (Memory Workload Analysis: the busiest memory unit, shared memory included)
    ("Max Bandwidth", "%"),
)


def details(path: Path) -> dict[str, str]:
    """``{metric name: value}`` of an ``ncu --page details --csv`` export (the first kernel's)."""
    with path.open() as f:
        rows = list(csv.reader(f))
    if not rows:
        return {}
    head = rows[0]
    out: dict[str, str] = {}
    for r in rows[1:]:
        rec = dict(zip(head, r, strict=False))
        name = rec.get("Metric Name")
        if name and name not in out:
            out[name] = rec.get("Metric Value", "")
    return out


def stalls(path: Path, top: int = 8) -> list[tuple[int, int, str, str]]:
    """The ``top`` instructions by warp stall samples of an ``ncu --page source --csv --print-source
    sass`` export: ``(samples, executions, instruction, leading reasons)``."""
    with path.open() as f:
        rows = list(csv.reader(f))
    if len(rows) < 3:
        return []
    head = rows[1]
    reasons = [h for h in head if h.startswith("stall_") and "Not Issued" not in h]
    out = []
    for r in rows[2:]:
        rec = dict(zip(head, r, strict=False))
        try:
            n = int(rec.get("Warp Stall Sampling (All Samples)") or 0)
            e = int(rec.get("Instructions Executed") or 0)
        except ValueError:
            continue
        lead = sorted(((int(rec.get(x) or 0), x[6:]) for x in reasons), reverse=True)[:2]
        why = ", ".join(f"{name} {k}" for k, name in lead if k)
        out.append((n, e, rec.get("Source", "").strip(), why))
    return sorted(out, reverse=True)[:top]


def summary(folder: Path) -> str:
    """The Markdown summary of every ``<tag>.details.csv`` (and its ``<tag>.sass.csv``) in ``folder``."""
    tags = sorted(p.name[: -len(".details.csv")] for p in folder.glob("*.details.csv"))
    lines = ["| report | " + " | ".join(n for n, _ in METRICS) + " |", "|---" * (len(METRICS) + 1) + "|"]
    for tag in tags:
        d = details(folder / f"{tag}.details.csv")
        lines.append(f"| {tag} | " + " | ".join(d.get(n, "-") for n, _ in METRICS) + " |")
    for tag in tags:
        sass = folder / f"{tag}.sass.csv"
        if not sass.exists():
            continue
        lines += ["", f"**{tag}**: instructions with the most stall samples", ""]
        lines += [f"- {n} samples, {e} executions: `{src[:70]}` ({why})" for n, e, src, why in stalls(sass)]
    return "\n".join(lines) + "\n"


def profile(shape: str, l2: float, softcap: float, impl: str = "ours") -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from trees_ab import row_table

    rows = {r.name: r for r in row_table(smoke=False) if r.kind == "varlen"}  # (imports anchors: the paths)
    if shape not in rows:
        raise SystemExit(f"unknown varlen row {shape!r}; known: {sorted(rows)}")
    row = rows[shape]
    import anchors
    import torch

    import window_prefill.launch as wl
    from window_prefill import window_prefill

    if l2 != 1 and hasattr(wl, "device_caches"):
        real = wl.device_caches
        wl.device_caches = lambda i: (lambda c: (c[0], int(c[1] * l2)))(real(i))
    q, k, v, cu, longest = anchors.varlen_problem(row, "cuda", torch.bfloat16)
    out = torch.empty_like(q)
    kw = {"softcap": softcap} if softcap > 0 else {}

    def call():
        window_prefill(q, k, v, cu, longest, causal=row.causal, window=(row.left, -1), out=out, **kw)

    if impl == "fa3":
        if row.left >= 0:
            raise SystemExit("FA3's wheel has no local attention: a row without a window")
        fa3 = anchors._fa3(notes := [])
        if fa3 is None:
            raise SystemExit(f"FA3 did not import: {notes}")

        def call():  # the peer's call in place of ours
            fa3(q, k, v, cu, cu, longest, longest, causal=row.causal, softcap=softcap)

    for _ in range(4):
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print("profiled", impl, shape, "l2 x", l2, "softcap", softcap)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("shape", nargs="?", help="a varlen row of bench/trees_ab.py's table")
    ap.add_argument("--l2", type=float, default=1.0, help="the L2 size plan.schedule sees, as a fraction")
    ap.add_argument("--softcap", type=float, default=0.0, help="soft-capping (0: off)")
    ap.add_argument("--impl", choices=("ours", "fa3"), default="ours", help="the implementation to profile")
    ap.add_argument("--summary", type=Path, help="summarise the csv exports in this folder instead")
    args = ap.parse_args(argv)
    if args.summary is not None:
        print(summary(args.summary), end="")
        return 0
    if args.shape is None:
        ap.error("a SHAPE (or --summary DIR) is required")
    profile(args.shape, args.l2, args.softcap, args.impl)
    return 0


if __name__ == "__main__":
    sys.exit(main())
