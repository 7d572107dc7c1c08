"""Probe: does the split layout's page stride (not the page size) set prefix-prefill's speed?

    python bench/probe_pad.py [--shape llama] [--pages 512,544,1040,1056] [--out DIR]
    python bench/probe_pad.py --pages 512,544 --ctx 4096,4352   # context lengths instead

For each page size P it times the bench's problem (bench/prefix_prefill.py, vLLM's split layout) with
the caches as allocated, and with the same caches copied into tensors whose page dimension is padded
to S slots (a view ``[..., :P]`` of a ``[..., S]`` tensor): the kernel, its constexprs and the data are
the same, only the distance between the rows of a page changes (V ``[blocks, H, D, page]``: row
stride P elements; K ``[blocks, H, D/8, page, 8]``: 8P). Padding only K or only V tells which
cache's stride matters. Writes DIR/probe_pad.csv with ``--out``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import bench_ms, prefix_bench_module, set_switches, start, tflops, write_rows

start(interpret=False)

import torch  # noqa: E402


def _padded(cache: torch.Tensor, slot_dim: int, slots: int) -> torch.Tensor:
    shape = list(cache.shape)
    page = shape[slot_dim]
    shape[slot_dim] = slots
    big = torch.empty(shape, dtype=cache.dtype, device=cache.device)
    view = big.narrow(slot_dim, 0, page)
    view.copy_(cache)
    return view


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="llama")
    ap.add_argument("--pages", default="512,544,1040,1056")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--ctx", default=None, help="context lengths (a,b,...) to time instead of padding")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=0|1",
                    help="a prefix_prefill.interface switch for the run (e.g. _REST_GROUP=1)")  # fmt: skip
    args = ap.parse_args()
    set_switches(args.set, ap.error)
    bp = prefix_bench_module()
    shape = bp.SHAPES[args.shape]
    rows = []
    if args.ctx is not None:  # context lengths instead of strides: where a context ends inside a page
        for page in [int(p) for p in args.pages.split(",")]:
            for ctx in [int(c) for c in args.ctx.split(",")]:
                prob = bp.make_problem(torch, dict(shape, ctx=ctx), page)
                flops, _ = bp.useful_work(prob)
                fn = bp.call_ours(prob)
                fn()
                ms = bench_ms(fn)
                sets = " ".join(args.set) or "-"
                r = {"shape": args.shape, "page": page, "ctx": ctx, "sets": sets, "ms": ms}
                r["tflops"] = tflops(flops, ms)
                rows.append(r)
                print(" ".join(f"{k}={v}" for k, v in r.items()), flush=True)
                del prob
        if args.out is not None:
            write_rows(args.out, "probe_ctx" + "".join("_" + s.replace("=", "") for s in args.set), rows)
        return 0
    for page in [int(p) for p in args.pages.split(",")]:
        prob = bp.make_problem(torch, shape, page)
        flops, _ = bp.useful_work(prob)
        kc0, vc0 = prob["k_cache"], prob["v_cache"]
        ref = None
        up = -(-page // 64) * 64
        pads = sorted({page, up if up != page else page + 32, page + 64})
        for slots in pads:
            for which in ("both", "k", "v") if slots != page else ("none",):
                prob["k_cache"] = _padded(kc0, 3, slots) if which in ("both", "k") else kc0
                prob["v_cache"] = _padded(vc0, 3, slots) if which in ("both", "v") else vc0
                fn = bp.call_ours(prob)
                fn()
                torch.cuda.synchronize()
                if ref is None:
                    ref = prob["o"].clone()
                same = torch.equal(prob["o"], ref)
                ms = bench_ms(fn)
                v_row = (slots if which in ("both", "v") else page) * 2
                r = {"shape": args.shape, "page": page, "slots": slots, "padded": which, "ms": ms,
                     "tflops": tflops(flops, ms), "v_row_bytes": v_row, "same_output": same}  # fmt: skip
                rows.append(r)
                print(" ".join(f"{k}={v}" for k, v in r.items()), flush=True)
        del prob, kc0, vc0
        torch.cuda.empty_cache()
    if args.out is not None:
        write_rows(args.out, "probe_pad", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
