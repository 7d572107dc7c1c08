"""fp32 tile A/B: the fp32 tiles shipped until ea639c7 ("old") against the table's 16-wide ones.

bench/results/NOTES.md 2026-11-29, 378a544 and 2026-11-29, 87e1591.

    python bench/fp32_configs.py [--heads 64,128,256] [--out DIR]
    python bench/fp32_configs.py --smoke      # CPU: Triton interpreter, tiny shapes (checks the script)

fp32 inputs run IEEE dots, which Triton lowers to FMA loops; offline, the old sm90 tiles (prefix
64/32/32/4/2 and 32/32/32/4/2, window 64/32/4/2 and 32/32/4/2) spill kilobytes per thread and take
8-30 s to compile, the 16-wide ones now in the tables (prefix 16/16/16/4/2, window 16/16/4/2) none
and 2-7 s. For each kernel and head size this times (medians of ``triton.testing.do_bench``) the old
and the table's ("new") config on the same inputs in one process, prints the compile+first-call
seconds of each (Triton's cache is whatever the process has: run it with an empty
``TRITON_CACHE_DIR`` for cold figures) and the largest difference between the two outputs (tiling
changes only the summation order). Writes DIR/fp32_configs.{csv,md} with
``--out``. Shapes: prefix 2 sequences of 2048 cached + 512 new tokens, 8/2 heads, page 16, NHD cache;
window 8192 tokens, 8/2 heads, causal, left window 511.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import bench_ms, print_rows, start, uniform_prefix_problem, write_rows

SMOKE = "--smoke" in sys.argv
start(interpret=SMOKE)

import torch  # noqa: E402

from paged_kv_offsets import describe_kv_cache  # noqa: E402
from prefix_prefill.configs import KernelConfig  # noqa: E402
from prefix_prefill.launch import forward as prefix_forward  # noqa: E402
from window_prefill import window_prefill  # noqa: E402
from window_prefill.configs import Config  # noqa: E402

DEV = "cpu" if SMOKE else "cuda"
# "old": the sm90 fp32 entries shipped until ea639c7; "new": the table as shipped now (16-wide tiles,
# put there after this script's H200 run of 2026-11-29, NOTES.md 2026-11-29, 87e1591)
OLD_PREFIX = {
    64: KernelConfig(64, 32, 32, 4, 2),
    128: KernelConfig(64, 32, 32, 4, 2),
    256: KernelConfig(32, 32, 32, 4, 2),
}
OLD_WINDOW = {64: Config(64, 32, 4, 2), 128: Config(64, 32, 4, 2), 256: Config(32, 32, 4, 2)}


def _prefix_fn(head: int, config):
    ctx, new, batch = (40, 24, 2) if SMOKE else (2048, 512, 2)
    pb = uniform_prefix_problem(
        torch, batch=batch, heads=8, kv_heads=2, head_dim=head, ctx=ctx, new=new, page=16, layout="nhd",
        device=DEV, dtype=torch.float32, gen=torch.Generator().manual_seed(head),
    )  # fmt: skip
    out = torch.empty_like(pb["q"])
    kc, vc = describe_kv_cache(pb["k_cache"], pb["v_cache"], "nhd")

    def fn():  # the launcher with a tile override (None: the shipped table), as bench/tune.py times it
        prefix_forward(
            pb["q"], pb["k"], pb["v"], out, pb["k_cache"], pb["v_cache"], kc, vc, pb["block_table"],
            pb["cu"], pb["seq_lens"], new, config=config,
        )  # fmt: skip
        return out

    return fn


def _window_fn(head: int, config):
    n = 64 if SMOKE else 8192
    gen = torch.Generator().manual_seed(head)
    q, k, v = (torch.randn(n, h, head, generator=gen).to(DEV) for h in (8, 2, 2))
    cu = torch.tensor([0, n], dtype=torch.int32, device=DEV)
    out = torch.empty_like(q)

    def fn():
        window_prefill(q, k, v, cu, n, causal=True, window=(511, -1), out=out, config=config)
        return out

    return fn


def _first(fn) -> float:
    t = time.perf_counter()
    fn()
    if not SMOKE:
        torch.cuda.synchronize()
    return time.perf_counter() - t


def _time(fn) -> float:
    return _first(fn) * 1e3 if SMOKE else bench_ms(fn, warmup=10, rep=50)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heads", default="64,128,256")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    heads = [64] if SMOKE else [int(h) for h in args.heads.split(",")]
    rows = []
    for head in heads:
        for kernel in ("prefix", "window"):
            outs = {}
            for which in ("old", "new"):
                old_p = OLD_PREFIX.get(head, OLD_PREFIX[256])
                if kernel == "prefix":
                    fn = _prefix_fn(head, old_p if which == "old" else None)
                else:
                    fn = _window_fn(head, OLD_WINDOW.get(head, OLD_WINDOW[256]) if which == "old" else None)
                first_s = _first(fn)
                ms = _time(fn)
                outs[which] = fn().clone()
                rows.append(
                    {"kernel": kernel, "head": head, "config": which, "first_call_s": first_s, "ms": ms}
                )
                print_rows(rows[-1:], list(rows[-1]))
            diff = (outs["old"] - outs["new"]).abs().max().item()
            print(f"# {kernel} head {head}: max|old-new| = {diff:.3g}", flush=True)
            rows[-1]["max_abs_diff_vs_old"] = diff
    if args.out is not None:
        print("# wrote", *write_rows(args.out, "fp32_configs", rows), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
