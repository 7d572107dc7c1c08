"""Is page 16's gap in vLLM's split layout the scattered pages? (NOTES step 60/62.)

    python bench/page_scatter_probe.py [--rounds 15] [--out DIR]

For the llama and qwen-hybrid prefix shapes of bench/prefix_prefill.py at pages 16 and 512, times our
split-layout call (and the NHD one) with the benchmark's random block table and with an identity
table (every sequence's pages consecutive in the cache), round-robin: every (shape, page, table,
layout) launched once per round, back to back, each launch timed by device events; medians printed.
Same cache contents and work; only where the pages lie changes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import prefix_bench_module, start, write_rows

start(interpret=False)

import torch  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    pb = prefix_bench_module()
    entries = []
    for name in ("llama", "qwen"):
        for page in (16, 512):
            prob = pb.make_problem(torch, pb.SHAPES[name], page)
            caches = pb.to_nhd(prob)
            out = torch.empty_like(prob["q"])
            flops, _ = pb.useful_work(prob)
            random_table = prob["block_table"]
            n = random_table.shape[1]
            identity = torch.arange(random_table.numel(), dtype=torch.int32, device="cuda").view_as(
                random_table
            )
            identity = identity + 1  # block 0 stays spare, as in the random table's cache
            assert int(identity.max()) < prob["k_cache"].shape[0], (n, prob["k_cache"].shape)
            for table_name, table in (("random", random_table), ("identity", identity)):
                p = dict(prob, block_table=table)
                entries.append(((name, page, table_name, "split"), pb.call_ours(p), flops))
                entries.append(((name, page, table_name, "nhd"), pb.call_ours_nhd(p, caches, out), flops))
    for _, fn, _ in entries:  # compile and warm
        fn()
    torch.cuda.synchronize()
    times = {key: [] for key, _, _ in entries}
    for r in range(args.rounds):
        order = entries[r % len(entries) :] + entries[: r % len(entries)]
        events = []
        for key, fn, _ in order:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            events.append((key, a, b))
        torch.cuda.synchronize()
        for key, a, b in events:
            times[key].append(a.elapsed_time(b))
    rows = []
    for key, _, flops in entries:
        ms = statistics.median(times[key])
        name, page, table_name, layout = key
        row = {
            "shape": name,
            "page": page,
            "table": table_name,
            "layout": layout,
            "ms": round(ms, 3),
            "tflops": round(flops / ms / 1e9, 1),
        }
        rows.append(row)
        print("  ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    if args.out:
        write_rows(__import__("pathlib").Path(args.out), "page_scatter_probe", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
