"""A/B of prefix-prefill between package trees: the same calls timed with each tree's packages.

    python bench/ab_trees.py --tree cur=packages --tree old=/tmp/old/packages [--shapes llama,qwen]
                             [--layouts split,nhd] [--pages 16,544,1056] [--rounds 3] [--out DIR]
                             [--kv-from-cache]

Each ``--tree NAME=DIR`` is a ``packages/`` folder (e.g. ``git archive OLD packages | tar x -C /tmp/old``).
Every round starts one child process per tree (``BENCH_PACKAGES=DIR``, the trees in a rotated order
each round) that times every (shape, layout, page) of ``bench/prefix_prefill.py``'s problems with
``context_attention_fwd`` (split) or ``prefix_prefill(kv_layout="nhd")`` (NHD) by
:func:`common.bench_ms`, and reports a digest of each output (``--kv-from-cache``:
``prefix_prefill(k=None, v=None)`` in both layouts, the benchmark's caches holding the new tokens
too: one key segment). The parent prints, per case, each tree's median over the rounds, its ratio to
the first tree, and whether the outputs of the trees are bitwise equal; ``--out`` writes
``ab_trees.{csv,md}``. The first round also compiles (Triton's disk cache serves the later ones).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, write_rows


def child(cases: list[tuple[str, str, int]], reps: dict, kv_from_cache: bool) -> None:
    """Time ``cases`` with the packages on ``sys.path`` (set by ``BENCH_PACKAGES``); one JSON line each."""
    from common import bench_ms, start

    start(interpret=False)
    import hashlib

    import torch

    import prefix_prefill as pp

    bench = _bench_module()
    for shape, layout, page in cases:
        prob = bench.make_problem(torch, bench.SHAPES[shape], page)
        if kv_from_cache:
            caches = (prob["k_cache"], prob["v_cache"]) if layout == "split" else bench.to_nhd(prob)
            out = torch.empty_like(prob["q"])
            args = (prob["q"], None, None, *caches, prob["block_table"], prob["cu"], prob["seq_lens"],
                    prob["max_q"])  # fmt: skip

            def fn(args=args, layout=layout, out=out):
                pp.prefix_prefill(*args, kv_layout=layout, out=out)
        elif layout == "split":
            fn = bench.call_ours(prob)
            out = prob["o"]
        else:
            caches = bench.to_nhd(prob)
            out = torch.empty_like(prob["q"])
            fn = bench.call_ours_nhd(prob, caches, out)
        ms = bench_ms(fn, **reps)
        torch.cuda.synchronize()
        digest = hashlib.sha1(out.view(torch.int16).cpu().numpy().tobytes()).hexdigest()[:16]
        print(json.dumps({"shape": shape, "layout": layout, "page": page, "ms": ms, "digest": digest,
                          "version": pp.__version__}), flush=True)  # fmt: skip
        del prob, fn, out
        torch.cuda.empty_cache()


def _bench_module():
    """bench/prefix_prefill.py as a module (its name is the package's, so load it by path)."""
    import importlib.util

    path = ROOT / "bench" / "prefix_prefill.py"
    spec = importlib.util.spec_from_file_location("bench_prefix_prefill", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", action="append", default=[], metavar="NAME=DIR", help="a packages/ folder")
    p.add_argument("--shapes", default="llama,qwen")
    p.add_argument("--layouts", default="split,nhd")
    p.add_argument("--pages", default="16,544,1056")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--rep", type=int, default=40)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--kv-from-cache", action="store_true", help="k=None, v=None (new tokens cached)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    cases = [(s, lay, int(pg)) for s in a.shapes.split(",") for lay in a.layouts.split(",")
             for pg in a.pages.split(",")]  # fmt: skip
    reps = {"warmup": a.warmup, "rep": a.rep}
    if a.child is not None:
        child(cases, reps, a.kv_from_cache)
        return 0
    trees = [t.split("=", 1) for t in a.tree]
    if len(trees) < 2:
        p.error("give at least two --tree NAME=DIR")
    times: dict[tuple, dict[str, list[float]]] = {}
    digests: dict[tuple, dict[str, str]] = {}
    for r in range(a.rounds):
        order = trees[r % len(trees) :] + trees[: r % len(trees)]
        for name, path in order:
            env = {**os.environ, "BENCH_PACKAGES": str(Path(path).resolve())}
            cmd = [sys.executable, __file__, "--child", name, "--shapes", a.shapes, "--layouts", a.layouts,
                   "--pages", a.pages, "--warmup", str(a.warmup), "--rep", str(a.rep)]  # fmt: skip
            cmd += ["--kv-from-cache"] if a.kv_from_cache else []
            res = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if res.returncode != 0:
                print(f"# tree {name} round {r}: exit {res.returncode}\n{res.stderr[-2000:]}", flush=True)
                continue
            for line in res.stdout.splitlines():
                if line.startswith("{"):
                    d = json.loads(line)
                    key = (d["shape"], d["layout"], d["page"])
                    times.setdefault(key, {}).setdefault(name, []).append(d["ms"])
                    digests.setdefault(key, {})[name] = d["digest"]
                    print(f"round={r} tree={name} v={d['version']} {key} {d['ms']:.4f} ms", flush=True)
    rows = []
    base = trees[0][0]
    for key in cases:
        t = times.get(key, {})
        med = {n: statistics.median(v) for n, v in t.items()}
        same = len(set(digests.get(key, {}).values())) == 1
        row = {"shape": key[0], "layout": key[1], "page": key[2]}
        for name, _ in trees:
            row[f"{name}_ms"] = round(med[name], 4) if name in med else None
            if name != base and name in med and base in med:
                row[f"{name}/{base}"] = round(med[name] / med[base], 4)
        row["bitwise_equal"] = same
        rows.append(row)
        print("AB", json.dumps(row), flush=True)
    if a.out is not None:
        write_rows(a.out, "ab_trees", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
