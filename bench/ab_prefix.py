"""A/B timing of one constexpr of prefix-prefill's launch plans (a maintainer's tool): the same problems
timed with the constexpr off and on, ours only (no peers), in one process, with the page-size spread
of each setting and whether the two outputs are bitwise equal.

    python bench/ab_prefix.py [--switch PREFETCH_IDS] [--shapes llama,qwen] [--layouts split,nhd]
                              [--pages 16,512,544,...] [--kernel triton] [--set NAME=V] [--out DIR]
    python bench/ab_prefix.py --smoke      # CPU: one tiny shape under the Triton interpreter
    bash bench/gpu_session.sh ab|abbench   # on the GPU machine (abbench: the A/B, then both benchmarks)

What it measures: for each (shape, layout, page) the median milliseconds of the plan with the
constexpr ``--switch`` at 0/False and at True (or ``--on-value``), changed through
``bench/plan_override.py`` in the plans of ``--kernel`` only (same inputs, interleaved, medians of
``triton.testing.do_bench``); one line per timing and, per shape and layout, the page spread of each
setting (slowest non-power-of-two page over the fastest power-of-two page, and slowest over fastest
page), then ``CHOICE NAME=0|1``: the setting that keeps every spread within 5% (both or neither: the
faster in total). ``bench/prefix_prefill.py --set NAME=V`` times one setting against the peers; this
script times the two settings against each other, which a page spread of a few % needs.

``--jobs N`` first compiles every (shape, layout, page, setting) in N parallel worker processes
(``--compile-only``, same problems, so the timing process finds every kernel in Triton's disk
cache): 56 compiles take about a minute instead of several. ``--choice FILE`` appends the chosen
setting (``NAME=0|1``), for the next step of a device call.

``--rounds N`` times every (page, setting) N times, the pages in a rotated order and off/on flipped
each round, and reports the median: the H200's clocks drift by a few % over a run, which one pass per
page takes for a page difference. ``--robin N`` instead launches every (page, setting) once per
round, back to back with no pause, N rounds (the order rotated and reversed every other round), each
launch timed by device events: every page then runs under the same mix of clock states, and the
median of N launches is reported with its quartiles; L2 is not flushed between launches (the rotation
spreads whatever a previous launch left). Writes DIR/ab_prefix<switch>.{csv,md} with ``--out``.
Shapes are those of bench/prefix_prefill.py.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (
    bench_ms,
    prefix_bench_module,
    settle,
    start,
    tflops,
    uniform_prefix_problem,
    write_rows,
)
from plan_override import overridden, parse_sets

SMOKE = "--smoke" in sys.argv
start(interpret=SMOKE)

import torch  # noqa: E402

from prefix_prefill import prefix_prefill  # noqa: E402

DEV = "cpu" if SMOKE else "cuda"


def _problem(bp, shape: dict, page: int, layout: str) -> dict:
    if SMOKE:  # the builder allocates on CUDA in bf16; build a tiny fp16 CPU case (NHD only)
        if layout == "split":
            raise SystemExit("--smoke runs the nhd layout only")
        pb = uniform_prefix_problem(
            torch, batch=shape["batch"], heads=shape["heads"], kv_heads=shape["kv_heads"],
            head_dim=shape["head_size"], ctx=shape["ctx"], new=shape["new"], page=page, layout="nhd",
            device="cpu", dtype=torch.float16, gen=torch.Generator().manual_seed(0),
        )  # fmt: skip
        b, new = shape["batch"], shape["new"]
        return {
            "q": pb["q"], "k": pb["k"], "v": pb["v"], "nhd": (pb["k_cache"], pb["v_cache"]),
            "block_table": pb["block_table"], "cu": pb["cu"], "seq_lens": pb["seq_lens"], "max_q": new,
            "ctxs": [shape["ctx"]] * b, "new": new, "shape": shape,
        }  # fmt: skip
    prob = bp.make_problem(torch, shape, page)
    if layout == "nhd":
        prob["nhd"] = bp.to_nhd(prob)
    return prob


def _call(prob: dict, layout: str, out: torch.Tensor, kv_from_cache: bool = False):
    caches = (prob["k_cache"], prob["v_cache"]) if layout == "split" else prob["nhd"]
    k, v = (None, None) if kv_from_cache else (prob["k"], prob["v"])

    def fn():
        prefix_prefill(
            prob["q"], k, v, caches[0], caches[1], prob["block_table"], prob["cu"],
            prob["seq_lens"], prob["max_q"], kv_layout=layout, out=out,
        )  # fmt: skip

    return fn


@contextlib.contextmanager
def _switched(args, on: bool):
    """The constexpr under test off (0 / False) or on (True, or ``--on-value``) inside the block, over the
    run's ``--set`` constexprs."""
    value = (args.on_value if on else 0) if args.on_value is not None else on
    with overridden("prefix_prefill", {**args.fixed, args.switch: value}, kernel=args.kernel):
        yield


def _fmt(key: str, value: object) -> str:
    return f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}"


def _time(fn) -> float:
    if SMOKE:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    return bench_ms(fn, warmup=10, rep=50)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="llama,qwen")
    ap.add_argument("--pages", default="16,512,544,1024,1040,1056,2048")
    ap.add_argument("--layouts", default="split,nhd")
    ap.add_argument("--switch", default="PREFETCH_IDS", help="a constexpr of the plans")
    ap.add_argument(
        "--kernel", default=None, help="override this kernel's plans only (triton, gluon-split...)"
    )
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--jobs", type=int, default=0, help="compile in this many worker processes first")
    ap.add_argument("--compile-only", action="store_true", help="worker mode: compile, do not time")
    ap.add_argument("--choice", type=Path, default=None, help="write the setting with the smaller spread")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="fix another constexpr for the whole run (e.g. K_CM=False)")  # fmt: skip
    ap.add_argument("--kv-from-cache", action="store_true",
                    help="k=v=None: new tokens' K/V from the cache (it holds every token)")  # fmt: skip
    ap.add_argument("--robin", type=int, default=0,
                    help="round-robin: N rounds of one event-timed launch per (page, setting)")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=1,
                    help="time each (page, setting) N times, pages interleaved: medians")  # fmt: skip
    ap.add_argument("--on-value", type=int, default=None,
                    help="an int constexpr: time 0 (off) against this value")  # fmt: skip
    args = ap.parse_args(argv)
    args.fixed = parse_sets(args.set, ap.error)
    bp = prefix_bench_module()
    shapes = {n: bp.SHAPES[n] for n in args.shapes.split(",")}
    pages = [int(p) for p in args.pages.split(",")]
    layouts = args.layouts.split(",")
    if SMOKE:
        shapes = {"tiny": {"heads": 2, "kv_heads": 1, "head_size": 32, "batch": 2, "ctx": 20, "new": 8}}
        pages, layouts = [16, 17], ["nhd"]
    if args.jobs > 0 and not SMOKE:
        _precompile(args, shapes, layouts, pages)
    rows = []
    spreads: dict[bool, list[float]] = {False: [], True: []}
    for name, shape in shapes.items():
        for layout in layouts:
            probs, fns, outs = {}, {}, {}
            for page in pages:  # every problem and kernel first, so rounds can interleave the pages
                prob = probs[page] = _problem(bp, shape, page, layout)
                for on in (False, True):
                    with _switched(args, on):
                        out = outs[page, on] = torch.empty_like(prob["q"])
                        fn = fns[page, on] = _call(prob, layout, out, args.kv_from_cache)
                        fn()  # compile outside the timing (and the full form of compile tiers)
                        if not SMOKE:  # (the interpreter compiles nothing)
                            settle()
                            fn()
                if not SMOKE:
                    torch.cuda.synchronize()
                if args.compile_only:
                    print(f"# compiled {name} {layout} page {page}", flush=True)
            if args.compile_only:
                continue
            times: dict[tuple[int, bool], list[float]] = {}
            if args.robin > 0 and not SMOKE:
                times = _robin(args, pages, fns)
            for rnd in range(args.rounds if not times else 0):  # pages rotated, off/on flipped each round
                order = pages[rnd % len(pages) :] + pages[: rnd % len(pages)]
                for page in order:
                    for on in (False, True) if rnd % 2 == 0 else (True, False):
                        with _switched(args, on):
                            times.setdefault((page, on), []).append(_time(fns[page, on]))
            for page in pages:
                flops, _ = bp.useful_work(probs[page])
                for on in (False, True):
                    ms = statistics.median(times[page, on])
                    r = {"shape": name, "layout": layout, "page": page, "switch": args.switch, "on": on,
                         "kv_from_cache": args.kv_from_cache, "ms": ms,
                         "tflops": tflops(flops, ms)}  # fmt: skip
                    if args.robin > 0 and not SMOKE:
                        q = statistics.quantiles(times[page, on], n=4)
                        r["q1_ms"], r["q3_ms"], r["launches"] = q[0], q[2], len(times[page, on])
                    elif args.rounds > 1:
                        r["rounds_ms"] = "/".join(f"{t:.3f}" for t in times[page, on])
                    rows.append(r)
                    print(" ".join(_fmt(k, v) for k, v in r.items()), flush=True)
                same = torch.equal(outs[page, False], outs[page, True])
                diff = (outs[page, False].float() - outs[page, True].float()).abs().max().item()
                print(f"# {name} {layout} page {page}: outputs bitwise equal off/on: {same} "
                      f"(max|diff| {diff:.3g})", flush=True)  # fmt: skip
            del probs, fns, outs
            if not SMOKE:
                torch.cuda.empty_cache()
            for on in (False, True):
                t = {
                    r["page"]: r["ms"]
                    for r in rows
                    if (r["shape"], r["layout"], r["on"]) == (name, layout, on)
                }
                pow2 = [v for p, v in t.items() if p & (p - 1) == 0]
                other = [v for p, v in t.items() if p & (p - 1) != 0]
                if pow2 and other:
                    spreads[on].append(max(other) / min(pow2))
                    print(f"SPREAD {name} {layout} {args.switch}={on}: slowest non-pow2 / fastest pow2 = "
                          f"{max(other) / min(pow2):.3f}; slowest / fastest page = "
                          f"{max(t.values()) / min(t.values()):.3f}", flush=True)  # fmt: skip
    if args.out is not None and rows:
        stem = f"ab_prefix{args.switch}" + ("_kvcache" if args.kv_from_cache else "")
        stem += "" if args.on_value is None else f"_{args.on_value}"  # an int setting's value
        stem += "" if sorted(layouts) == ["nhd", "split"] else "_" + "_".join(layouts)  # runs per layout
        write_rows(args.out, stem, rows)
    if spreads[False] and spreads[True]:
        # the setting that keeps every spread within 5%; both or neither: the faster in total, or
        # (neither) the smaller worst spread
        worst = {on: max(spreads[on]) for on in (False, True)}
        total = {on: sum(r["ms"] for r in rows if r["on"] == on) for on in (False, True)}
        meets = {on: worst[on] <= 1.05 for on in (False, True)}
        if meets[False] != meets[True]:
            best = meets[True]
        else:
            best = min((False, True), key=lambda on: total[on] if meets[on] else worst[on])
        print(f"CHOICE {args.switch}={int(best)} (worst spread off {worst[False]:.3f}, on {worst[True]:.3f}; "
              f"total ms off {total[False]:.2f}, on {total[True]:.2f})", flush=True)  # fmt: skip
        if args.choice is not None:
            with open(args.choice, "a") as f:  # one line per switch, several runs may share the file
                on_value = 1 if args.on_value is None else args.on_value
                f.write(f"{args.switch}={on_value if best else 0}\n")
    return 0


def _robin(args, pages: list[int], fns: dict) -> dict[tuple[int, bool], list[float]]:
    """``--robin``: device-event milliseconds of every (page, setting) launch, one launch each per
    round, back to back (see the module docstring)."""
    keys = [(page, on) for page in pages for on in (False, True)]
    events: dict[tuple[int, bool], list] = {key: [] for key in keys}
    for rnd in range(args.robin):
        order = keys[rnd % len(keys) :] + keys[: rnd % len(keys)]
        for key in order if rnd % 2 == 0 else order[::-1]:
            with _switched(args, key[1]):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                fns[key]()
                e1.record()
            events[key].append((e0, e1))
        if rnd % 4 == 3:  # a bounded queue; the host stays ahead of the device within a round
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return {key: [e0.elapsed_time(e1) for e0, e1 in evs] for key, evs in events.items()}


def _precompile(args, shapes: dict, layouts: list[str], pages: list[int]) -> None:
    """Compile every timed kernel in ``args.jobs`` worker processes (one per shape/layout/page)."""
    t0 = time.perf_counter()
    todo = [(n, lay, p) for n in shapes for lay in layouts for p in pages]
    running: list[subprocess.Popen] = []
    failed = 0
    for name, layout, page in todo:
        while len(running) >= args.jobs:
            running[0].wait()
            failed += running.pop(0).returncode != 0
        cmd = [sys.executable, __file__, "--compile-only", "--shapes", name, "--layouts", layout,
               "--pages", str(page), "--switch", args.switch]  # fmt: skip
        cmd += ["--kv-from-cache"] if args.kv_from_cache else []
        cmd += [f"--on-value={args.on_value}"] if args.on_value is not None else []
        cmd += [f"--set={kv}" for kv in args.set]
        cmd += [f"--kernel={args.kernel}"] if args.kernel else []
        running.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL))
    for proc in running:
        proc.wait()
        failed += proc.returncode != 0
    print(f"# precompiled {len(todo)} problems x 2 settings in {time.perf_counter() - t0:.0f} s "
          f"with {args.jobs} workers ({failed} failed)", flush=True)  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
