"""One window_prefill call for Nsight Compute to profile, and the summary of the reports.

    ncu --profile-from-start off --set full -k regex:gluon -o REP python bench/window_ncu.py SHAPE \
        [--l2 F] [--softcap C] [--impl fa3]
    python bench/window_ncu.py --summary DIR      # DIR: <tag>.details.csv and <tag>.sass.csv pairs

SHAPE is a varlen row of ``bench/trees_ab.py``'s table (``anchors``' rows and its own: ``causal8k``,
``noncausal8k``, ``short1k``, ``batch4x16k``, ...), bf16. The call runs once to compile and three times to
settle, then once between ``cudaProfilerStart`` and ``cudaProfilerStop``: the profiled launch is the warm
one. ``--l2 F`` tells ``plan.schedule`` the L2 is ``F`` of its size (smaller sections of the persistent
kernel's order); a tree without a schedule ignores it. ``--softcap C`` calls with soft-capping (issue
46's cost of a feature against the plain call). ``--impl`` profiles ``anchors``' call of the row by
another implementation on the same inputs: ``fa3`` (FlashAttention-3's forward; its kernel is a CUTLASS
``device_kernel``: ``-k regex:device_kernel``) or ``flashinfer`` (the peer wheels on ``PYTHONPATH``), and on
a prefix row (``llama``, ``qwen``, ...) ``prefix`` (prefix-prefill, every token's K/V from the cache) or
``ours_kv`` (the new tokens' K/V given). ``BENCH_PACKAGES`` picks the package tree (bench/common.py).

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


def _sass_rows(path: Path) -> tuple[list[str], list[tuple[dict, int, int]]]:
    """An ``ncu --page source --csv --print-source sass`` export's stall-reason columns (``stall_*``, the
    issued and not-issued samples together) and its instructions as ``(record, samples, executions)``
    (rows whose counts do not parse left out)."""
    with path.open() as f:
        rows = list(csv.reader(f))
    if len(rows) < 3:
        return [], []
    head = rows[1]
    out = []
    for r in rows[2:]:
        rec = dict(zip(head, r, strict=False))
        try:
            n = int(rec.get("Warp Stall Sampling (All Samples)") or 0)
            e = int(rec.get("Instructions Executed") or 0)
        except ValueError:
            continue
        out.append((rec, n, e))
    return [h for h in head if h.startswith("stall_") and "Not Issued" not in h], out


def stalls(path: Path, top: int = 8) -> list[tuple[int, int, str, str]]:
    """The ``top`` instructions by warp stall samples of an ``ncu --page source --csv --print-source
    sass`` export: ``(samples, executions, instruction, leading reasons)``."""
    reasons, rows = _sass_rows(path)
    out = []
    for rec, n, e in rows:
        lead = sorted(((int(rec.get(x) or 0), x[6:]) for x in reasons), reverse=True)[:2]
        why = ", ".join(f"{name} {k}" for k, name in lead if k)
        out.append((n, e, rec.get("Source", "").strip(), why))
    return sorted(out, reverse=True)[:top]


def by_count(path: Path, top: int = 6) -> list[tuple[int, int, int, float, str]]:
    """The warp stall samples of an ``ncu --page source --csv --print-source sass`` export grouped by
    instruction execution count, the ``top`` groups by samples: ``(executions, instructions, samples,
    share of all samples, leading reasons with their shares)``. A warp-specialised kernel's partitions
    run their loops a different number of times (a converter once a key block a warp, the consumers once
    a block a warp of theirs...), so a group is mostly one partition's loop: its samples a warp against
    another's tell which partition waits on which."""
    reasons, rows = _sass_rows(path)
    groups: dict[int, list] = {}
    for rec, n, e in rows:
        g = groups.setdefault(e, [0, 0, dict.fromkeys(reasons, 0)])
        g[0] += 1
        g[1] += n
        for x in reasons:
            g[2][x] += int(rec.get(x) or 0)
    total = sum(n for _, n, _ in rows)
    out = []
    for e, (count, n, why) in groups.items():
        lead = sorted(((k, x[6:]) for x, k in why.items()), key=lambda t: (-t[0], t[1]))[:3]
        text = ", ".join(f"{name} {k / n:.0%}" for k, name in lead if k and n)
        out.append((e, count, n, n / total if total else 0.0, text))
    return sorted(out, key=lambda g: -g[2])[:top]


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
        lines += ["", f"**{tag}**: samples by instruction execution count (mostly one partition's loop each)",
                  "", "| executions | instructions | samples | share | leading reasons |",
                  "|---|---|---|---|---|"]  # fmt: skip
        lines += [f"| {e} | {c} | {n} | {f:.1%} | {why} |" for e, c, n, f, why in by_count(sass)]
    return "\n".join(lines) + "\n"


def _window_call(row, l2: float, softcap: float):
    """window_prefill's call on the varlen ``row`` (``--l2``: the L2 size ``plan.schedule`` sees)."""
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

    return call


def warm(call, sync) -> None:
    """Run ``call`` until it launches its final kernels: three calls, then prefix-prefill's
    ``finish_compiles()`` (the first calls of its Gluon kernels run a quick compile tier, its full form
    compiling meanwhile: a profile before it would be the quick form's), then two calls; ``sync`` after
    each stage (``torch.cuda.synchronize``)."""
    from prefix_prefill import finish_compiles

    for _ in range(3):
        call()
    sync()
    finish_compiles()
    for _ in range(2):
        call()
    sync()


def impl_refusal(impl: str, kind: str) -> str | None:
    """Why ``--impl impl`` cannot profile a row of ``kind`` (``"varlen"`` or ``"prefix"``), or None:
    prefix-prefill's calls (``prefix``, ``ours_kv``) take prefix rows only, window_prefill's (``ours``)
    varlen rows only; a peer takes either."""
    if impl in ("prefix", "ours_kv") and kind != "prefix":
        return f"--impl {impl} on a {kind} row: prefix and ours_kv take prefix rows only"
    if impl == "ours" and kind == "prefix":
        return "--impl ours on a prefix row: --impl prefix, ours_kv or a peer"
    return None


def profile(shape: str, l2: float, softcap: float, impl: str = "ours") -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from trees_ab import row_table

    rows = {r.name: r for r in row_table(smoke=False)}  # (imports anchors: the paths)
    if shape not in rows:
        raise SystemExit(f"unknown row {shape!r}; known: {sorted(rows)}")
    row = rows[shape]
    why = impl_refusal(impl, row.kind)
    if why:
        raise SystemExit(f"{shape}: {why}")
    import anchors
    import torch

    if impl == "ours":
        call = _window_call(row, l2, softcap)
    else:  # anchors' call of the row (a peer's, or prefix-prefill's), the row's own options
        if l2 != 1 or softcap > 0:
            raise SystemExit("--l2 and --softcap are for window_prefill's own call (a *_cap50 row has a cap)")
        build = anchors.varlen_calls if row.kind == "varlen" else anchors.prefix_calls
        calls, notes = build(row, "cuda", torch.bfloat16)
        name = "ours" if impl == "prefix" else impl  # (anchors' name of prefix-prefill's call)
        if name not in calls:
            raise SystemExit(f"{impl} has no call on {shape}: {notes}")
        call = calls[name]

    warm(call, torch.cuda.synchronize)
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
    ap.add_argument("--impl", choices=("ours", "ours_kv", "prefix", "fa3", "flashinfer"), default="ours",
                    help="what to profile (prefix rows: prefix, ours_kv or a peer)")  # fmt: skip
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
