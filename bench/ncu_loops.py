"""Stall samples per loop of one kernel, from Nsight Compute's per-instruction source page:

    ncu -i REPORT.ncu-rep --page source --print-source sass --csv > k.sass.csv   (bench/gpu_session.sh ncu)
    python bench/ncu_loops.py k.sass.csv [--min-instr 200] [--top 8]

A loop is a backward branch and the instructions between its target and it. For every loop of at least
``--min-instr`` instructions it prints the address range, its instructions, its wgmma (HGMMA) count, how
often its first instruction ran, its share of the kernel's warp-state samples and its ``--top`` stall
reasons; then the kernel's stall reasons in all. ``stall_no_inst`` spread over every 128-byte line of
a hot loop is the instruction cache missing (the loops' code does not stay cached).
"""

from __future__ import annotations

import argparse
import collections
import csv
import re
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--min-instr", type=int, default=200)
    ap.add_argument("--top", type=int, default=8)
    a = ap.parse_args()
    rows = list(csv.reader(open(a.csv)))
    hdr = next(r for r in rows if r and r[0] == "Address")
    ix = {h: i for i, h in enumerate(hdr)}
    ins = [r for r in rows[rows.index(hdr) + 1 :] if len(r) >= len(hdr)]
    if not ins:
        print("no instructions in", a.csv, file=sys.stderr)
        return 1
    addr = [int(r[0], 16) for r in ins]
    where = {x: i for i, x in enumerate(addr)}
    base = addr[0]
    samples = [int(r[ix["Warp Stall Sampling (All Samples)"]] or 0) for r in ins]
    execs = [int(r[ix["Instructions Executed"]] or 0) for r in ins]
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(samples) or 1

    def reasons(lo: int, hi: int) -> collections.Counter:
        c: collections.Counter = collections.Counter()
        for k in range(lo, hi + 1):
            for h in stalls:
                c[h[6:]] += int(ins[k][ix[h]] or 0)
        return c

    for i, r in enumerate(ins):
        m = re.search(r"BRA\s+(?:\S+\s+)?`?\(?(0x[0-9a-f]+)", r[1])
        if not m:
            continue
        j = where.get(int(m.group(1), 16))
        if j is None or j > i or i - j + 1 < a.min_instr:
            continue
        s = sum(samples[j : i + 1])
        hg = sum("HGMMA" in ins[k][1] for k in range(j, i + 1))
        top = ", ".join(f"{h}={v}" for h, v in reasons(j, i).most_common(a.top))
        span = f"{addr[j] - base:#x}-{addr[i] - base:#x}"
        print(f"loop {span} instr={i - j + 1} hgmma={hg} head_runs={execs[j]} samples={s} "
              f"({100 * s / total:.1f}%): {top}")  # fmt: skip
    top = ", ".join(f"{h}={v}" for h, v in reasons(0, len(ins) - 1).most_common(a.top + 2))
    print(f"kernel: samples={total} instructions_executed={sum(execs)}: {top}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
