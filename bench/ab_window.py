"""A/B timing of a window-prefill plan change, ours only, in one process, interleaved rounds.

    python bench/ab_window.py --set kernel=triton [--shapes pr,llm] [--rounds 5] [--out DIR]
    python bench/ab_window.py --set num_stages=3 --set TMA_KV=0
    python bench/ab_window.py --smoke --set WIDE_OFFSETS=1    # CPU: Triton interpreter, tiny shape

For each shape of bench/window_prefill.py (``pr``, ``llm``) it takes the plan our call makes
(``window_prefill.explain``) as A and that plan changed by every ``--set NAME=VALUE`` as B
(``LaunchPlan.replace``): ``kernel=triton`` runs a Gluon plan's Triton fallback; a launch option
(``num_warps``, ``num_stages``) or a constexpr of the planned kernel (``WIDE_OFFSETS=1``,
``NUM_STAGES=3``...) takes the value (0/1 for booleans). Both run through ``window_prefill.launch.run``,
plain and captured in a CUDA graph; the two outputs are checked for bitwise equality, then all of
them are timed in ``--rounds`` passes (order flipped each pass) and the medians printed with every
pass: the card's clocks drift by a few % within a run.
"""

from __future__ import annotations

import argparse
import math
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

import window_prefill.launch as wl  # noqa: E402
from prefill_runtime import LaunchPlan  # noqa: E402
from window_prefill import explain  # noqa: E402


def changed(plan: LaunchPlan, sets: list[str], error) -> LaunchPlan:
    """``plan`` with every ``NAME=VALUE`` of ``sets`` applied (see the module docstring)."""
    for kv in sets:
        name, _, val = kv.partition("=")
        if name == "kernel":
            if val == plan.kernel:
                continue
            if val != "triton" or plan.kernel != "gluon":
                error(f"--set {kv}: a {plan.kernel} plan can only become its Triton fallback")
            plan = plan.get("fallback")
        elif name in plan.opts() and val.isdigit():
            plan = plan.replace(options=LaunchPlan.items({**plan.opts(), name: int(val)}))
        elif name in plan.consts() and val.isdigit():
            cur = plan.consts()[name]
            plan = plan.replace(constexprs={name: bool(int(val)) if isinstance(cur, bool) else int(val)})
        else:
            error(f"--set {kv}: not kernel=triton, nor an option or constexpr of {plan.kernel}: {plan}")
    return plan


def launcher(p: LaunchPlan, q, k, v, cu, s):
    """A callable that launches plan ``p`` on shape ``s``'s inputs (one sequence) and returns the output."""
    out = torch.empty_like(q)
    left, right = s.window
    scale = 1.0 / math.sqrt(s.head_dim)

    def fn():
        wl.run(p, q, k, v, out, cu, None, s.n, 1, window_left=left, window_right=right, softmax_scale=scale,
               sinks=None, softcap=0.0, lse=None)  # fmt: skip
        return out

    return fn


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--set", action="append", required=True, metavar="NAME=VALUE", help="plan B's change")
    ap.add_argument("--shapes", default="pr,llm")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    bw = window_bench_module()
    if SMOKE:
        bw.DEVICE, bw.DTYPE_NAME = "cpu", "float16"
        shapes = [bw.Shape("tiny", 96, 2, 1, 32, True, (20, -1))]
    else:
        shapes = bw.make_shapes(args.shapes.split(","), quick=False)
    peers = bw.Peers()
    rows = []
    label = ",".join(args.set)
    for s in shapes:
        q, k, v, cu = peers.inputs(s)
        a = explain(q, k, v, cu, s.n, causal=s.causal, window=s.window)
        plans = {False: a, True: changed(a, args.set, ap.error)}
        print(
            f"# {s.name}: A {a.reason}\n# {s.name}: B {plans[True].reason} {plans[True].consts()}", flush=True
        )
        fns, outs = {}, {}
        for on, p in plans.items():
            fn = launcher(p, q, k, v, cu, s)
            outs[on] = fn().clone()
            fns[on, "plain"] = fn
            if not SMOKE:
                torch.cuda.synchronize()
                fns[on, "graph"] = bw._graphed(torch, fn)
        print(f"# {s.name}: outputs bitwise equal A/B: {torch.equal(outs[False], outs[True])}", flush=True)
        times: dict[tuple, list[float]] = {key: [] for key in fns}
        for rnd in range(args.rounds):
            for key in list(fns) if rnd % 2 == 0 else list(fns)[::-1]:
                if SMOKE:
                    t0 = time.perf_counter()
                    fns[key]()
                    times[key].append((time.perf_counter() - t0) * 1e3)
                else:
                    times[key].append(bench_ms(fns[key]))
        flops = bw.attn_flops(bw.visible_pairs(s.n, s.causal, s.window), s.head_dim, s.heads)
        for (on, mode), t in times.items():
            ms = statistics.median(t)
            passes = "/".join(f"{x:.4f}" for x in t)
            r = {"shape": s.name, "change": label, "on": on, "kernel": plans[on].kernel, "mode": mode,
                 "ms": ms, "tflops": tflops(flops, ms), "rounds_ms": passes}  # fmt: skip
            rows.append(r)
            print(
                " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()),
                flush=True,
            )
    if args.out is not None and rows:
        write_rows(args.out, "ab_window_" + label.replace("=", "").replace(",", "_"), rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
