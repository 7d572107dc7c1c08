"""A/B timing of a window-prefill switch, ours only, in one process, interleaved rounds.

    python bench/ab_window.py --switch _PTXAS_REGISTER_USAGE_LEVEL --on-value 3 [--shapes pr,llm]
                              [--rounds 5] [--out DIR]
    python bench/ab_window.py --smoke --switch _BAND_MASK     # CPU: Triton interpreter, tiny shape

For each shape of bench/window_prefill.py (``pr``, ``llm``) it builds our callable with the switch
``window_prefill.interface.<switch>`` off (0) and on (1, or ``--on-value``), plain and captured in a
CUDA graph (the graph holds the setting it was captured with; the plain call reads the switch at call
time, so it is set before each timing), checks the two outputs for bitwise equality, then times all
of them in ``--rounds`` passes (order flipped each pass) and prints the medians with every pass:
the card's clocks drift by a few % within a run (bench/results/NOTES.md step 46).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import bench_ms, start, tflops, window_bench_module, write_rows

SMOKE = "--smoke" in sys.argv
start(interpret=SMOKE)

import torch  # noqa: E402

import window_prefill.interface as itf  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--switch", required=True, help="a bool or int setting of window_prefill.interface")
    ap.add_argument("--on-value", type=int, default=None, help="an int setting: time 0 against this value")
    ap.add_argument("--shapes", default="pr,llm")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    if not hasattr(itf, args.switch):
        ap.error(f"window_prefill.interface has no switch {args.switch}")
    bw = window_bench_module()
    if SMOKE:
        bw.DEVICE, bw.DTYPE_NAME = "cpu", "float16"
        shapes = [bw.Shape("tiny", 96, 2, 1, 32, True, (20, -1))]
    else:
        shapes = bw.make_shapes(args.shapes.split(","), quick=False)
    default = getattr(itf, args.switch)
    values = {
        False: 0 if args.on_value is not None else False,
        True: args.on_value if args.on_value else True,
    }
    peers = bw.Peers()
    rows = []
    for s in shapes:
        q, k, v, cu = peers.inputs(s)
        fns, outs = {}, {}
        try:
            for on in (False, True):
                setattr(itf, args.switch, values[on])
                fn = peers.ours(s, q, k, v, cu)
                outs[on] = fn().clone()
                fns[on, "plain"] = fn
                if not SMOKE:
                    torch.cuda.synchronize()
                    fns[on, "graph"] = bw._graphed(torch, fn)
        finally:
            setattr(itf, args.switch, default)
        print(f"# {s.name}: outputs bitwise equal off/on: {torch.equal(outs[False], outs[True])}", flush=True)
        times: dict[tuple, list[float]] = {key: [] for key in fns}
        for rnd in range(args.rounds):
            for key in list(fns) if rnd % 2 == 0 else list(fns)[::-1]:
                setattr(itf, args.switch, values[key[0]])
                try:
                    if SMOKE:
                        t0 = time.perf_counter()
                        fns[key]()
                        times[key].append((time.perf_counter() - t0) * 1e3)
                    else:
                        times[key].append(bench_ms(fns[key]))
                finally:
                    setattr(itf, args.switch, default)
        flops = bw.attn_flops(bw.visible_pairs(s.n, s.causal, s.window), s.head_dim, s.heads)
        for (on, mode), t in times.items():
            ms = statistics.median(t)
            passes = "/".join(f"{x:.4f}" for x in t)
            r = {"shape": s.name, "switch": args.switch, "on": on, "value": values[on], "mode": mode,
                 "ms": ms, "tflops": tflops(flops, ms), "rounds_ms": passes}  # fmt: skip
            rows.append(r)
            print(
                " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()),
                flush=True,
            )
    if args.out is not None and rows:
        write_rows(args.out, f"ab_window{args.switch}", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
