"""Opt-in tuner: regenerate the per-architecture config tables as a file to review (``nox -s tune``).

Never runs on the call path. For the GPU it runs on, it times candidate configs for every table key
of both kernels (window-prefill: head-dim bucket x causal; prefix-prefill: head-dim bucket x
page-size class) on a representative bf16 shape, drops candidates that exceed the arch's shared
memory by the package's own static model, and writes::

    bench/results/<gpu>/tuned-<date>.json   # every timing, the best config and the shipped one per key

plus a printed snippet of table lines (``("sm90", 128, "16bit"): _C(...)``) for a person to review
and copy into ``packages/*/src/*/configs.py``. Long runs print one line per timing and stop cleanly at
``--budget-s`` (what was measured so far is written).

    python bench/tune.py [--kernels window,prefix] [--quick] [--budget-s 500] [--out DIR]
    python bench/tune.py --smoke   # CPU: tiny shapes under the Triton interpreter, checks the code paths
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, bench_ms, gpu_name, start, today, uniform_prefix_problem

SMOKE = "--smoke" in sys.argv
start(interpret=SMOKE)

import torch  # noqa: E402

DEV = "cpu" if SMOKE else "cuda"
DT = torch.float16 if SMOKE else torch.bfloat16


def _time(fn) -> float:
    if SMOKE:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    fn()  # compile outside the timing
    return bench_ms(fn, warmup=10, rep=40)


# ---------------------------------------------------------------- window-prefill
def window_jobs(quick: bool):
    from window_prefill import window_prefill
    from window_prefill.configs import (
        SHARED_MEMORY_LIMIT,
        Config,
        detect_arch,
        get_config,
        shared_memory_bytes,
    )

    arch = detect_arch(torch.device(DEV))
    grid = [(64, 32), (128, 64)] if quick or SMOKE else [(64, 32), (64, 64), (128, 32), (128, 64), (128, 128)]
    warps, stages = ((4,), (2,)) if SMOKE else ((4, 8), (2, 3, 4))
    for head_dim, causal in itertools.product((64, 128, 256), (True, False)):
        n, h, hkv = (64, 2, 1) if SMOKE else (16384, 32, 8)
        window = (4095, -1) if causal else (64, 64)
        if SMOKE:
            window = (15, -1) if causal else (8, 8)
        cu = torch.tensor([0, n], dtype=torch.int32, device=DEV)
        q = torch.randn(n, h, head_dim, device=DEV, dtype=DT)
        k = torch.randn(n, hkv, head_dim, device=DEV, dtype=DT)
        v = torch.randn(n, hkv, head_dim, device=DEV, dtype=DT)
        out = torch.empty_like(q)
        shipped = get_config(head_dim, DT, causal, arch)
        cands = {Config(bm, bn, w, s) for (bm, bn), w, s in itertools.product(grid, warps, stages)}
        cands.add(shipped)
        # The static models are upper bounds used to reject AMD configs before compiling; on NVIDIA a
        # config that does not fit simply fails to launch and is recorded as an error.
        limit = SHARED_MEMORY_LIMIT.get(arch) if arch.startswith("gfx") else None
        key = f"window/{arch}/{head_dim}/16bit/{'causal' if causal else 'noncausal'}"
        for cfg in sorted(cands):
            if limit is not None and shared_memory_bytes(cfg, head_dim, DT) > limit:
                continue

            def fn(cfg=cfg, q=q, k=k, v=v, cu=cu, out=out, n=n, causal=causal, window=window):
                window_prefill(q, k, v, cu, n, causal=causal, window=window, out=out, config=cfg)

            yield key, cfg._asdict(), cfg == shipped, fn


# ---------------------------------------------------------------- prefix-prefill
def prefix_jobs(quick: bool):
    from paged_kv_offsets import describe_kv_cache
    from prefix_prefill.configs import (
        SHARED_MEMORY_BUDGET,
        KernelConfig,
        detect_arch,
        get_config,
        page_class,
        shared_memory_bytes,
    )
    from prefix_prefill.launch import forward as _launch_fwd

    arch = detect_arch(torch.device(DEV))
    bms, bncs = ((64, 128), (32, 64, 128)) if not (quick or SMOKE) else ((128,), (32, 64))
    warps, stages = ((4,), (2,)) if SMOKE else ((4, 8), (2, 3))
    for head_dim, page in itertools.product((64, 128, 256), (16, 544)):
        b, ctx, new = (2, 40, 24) if SMOKE else (4, 4096, 1024)
        h, hkv = (4, 2) if SMOKE else ((16, 2) if head_dim == 256 else (32, 8))
        pb = uniform_prefix_problem(
            torch, batch=b, heads=h, kv_heads=hkv, head_dim=head_dim, ctx=ctx, new=new, page=page,
            layout="split", device=DEV, dtype=DT, spare=3,
        )  # fmt: skip
        q, k, v, k_cache, v_cache = pb["q"], pb["k"], pb["v"], pb["k_cache"], pb["v_cache"]
        table, cu, seq_lens = pb["block_table"], pb["cu"], pb["seq_lens"]
        kc, vc = describe_kv_cache(k_cache, v_cache, "split")
        out = torch.empty_like(q)
        shipped = get_config(arch, head_dim, DT, page)
        cands = {
            KernelConfig(bm, 64, bnc, w, s) for bm, bnc, w, s in itertools.product(bms, bncs, warps, stages)
        }
        cands.add(shipped)
        budget = SHARED_MEMORY_BUDGET.get(arch) if arch.startswith("gfx") else None
        key = f"prefix/{arch}/{head_dim}/16bit/{page_class(page)}"
        for cfg in sorted(cands, key=lambda c: tuple(vars(c).values())):
            if budget is not None and shared_memory_bytes(cfg, head_dim, DT.itemsize) > budget:
                continue

            def fn(cfg=cfg, a=(q, k, v, out, k_cache, v_cache, kc, vc, table, cu, seq_lens, new)):
                _launch_fwd(*a, config=cfg)

            yield key, dict(vars(cfg)), cfg == shipped, fn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", default="window,prefix")
    ap.add_argument("--quick", action="store_true", help="a smaller candidate grid")
    ap.add_argument("--budget-s", type=float, default=480.0, help="stop (and write) after this many seconds")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--smoke", action="store_true", help="CPU interpreter, tiny shapes: checks the code paths"
    )
    args = ap.parse_args()
    if not SMOKE and not torch.cuda.is_available():
        raise SystemExit("tune needs a GPU (or --smoke for a CPU check of the code paths)")
    out_dir = args.out or ROOT / "bench" / "results" / gpu_name().replace(" ", "_")
    start = time.perf_counter()
    results: dict[str, dict] = {}
    stopped = False
    makers = {"window": window_jobs, "prefix": prefix_jobs}
    for name in args.kernels.split(","):
        for key, cfg, is_shipped, fn in makers[name](args.quick):
            if time.perf_counter() - start > args.budget_s:
                stopped = True
                break
            try:
                ms = _time(fn)
                status = "ok"
            except Exception as e:  # a config that does not compile or run (e.g. out of resources)
                ms, status = float("nan"), f"error: {type(e).__name__}: {str(e)[:80]}"
            entry = results.setdefault(key, {"timings": [], "shipped": None, "best": None})
            entry["timings"].append({"config": cfg, "ms": ms, "status": status})
            if is_shipped:
                entry["shipped"] = {"config": cfg, "ms": ms}
            if status == "ok" and (entry["best"] is None or ms < entry["best"]["ms"]):
                entry["best"] = {"config": cfg, "ms": ms}
            print(f"{key}  {cfg}  {ms:.4f} ms  {status}{'  (shipped)' if is_shipped else ''}", flush=True)
        if stopped:
            print(f"# stopped at the {args.budget_s:.0f} s budget; writing what was measured", flush=True)
            break
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / ("tuned-smoke.json" if SMOKE else f"tuned-{today()}.json")
    meta = {"gpu": gpu_name(), "date": today(), "torch": torch.__version__, "complete": not stopped}
    path.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    print(f"# wrote {path}\n# proposed table lines (review before copying into configs.py):")
    for key, entry in results.items():
        best, shipped = entry["best"], entry["shipped"]
        if best is None:
            continue
        gain = (
            f"{shipped['ms'] / best['ms']:.2f}x vs shipped"
            if shipped and shipped["ms"] == shipped["ms"]
            else ""
        )
        print(f"#   {key}: {tuple(best['config'].values())}  {best['ms']:.4f} ms  {gain}")


if __name__ == "__main__":
    main()
