"""One warm call of each named feature (``bench/feature_cost.py``'s problems) for Nsight Compute to profile.

    ncu --profile-from-start off --set full -k regex:gluon -o REP python bench/feature_ncu.py \
        [--package prefix|window] [--layout nhd] [--page 16] [--head 128] [--features plain,fp8_e4m3]
    python bench/feature_ncu.py --smoke      # CPU: Triton interpreter, tiny shapes, no profiler

Each feature's call runs three times, then ``finish_compiles()`` and two more calls; then each runs once
between ``cudaProfilerStart`` and ``cudaProfilerStop``, in the order given: report ``i`` (of the kernels
the ``-k`` filter keeps) is the ``i``-th feature's warm call (issue 46: what a feature costs, e.g. the fp8
cache's shared-memory traffic against the plain call). bf16 q. ``BENCH_PACKAGES`` picks the package tree
(bench/common.py). ``gpu_session.sh ncufeatures`` runs it under ncu and summarises the reports with
``bench/window_ncu.py --summary``.
"""

from __future__ import annotations

import argparse
import os
import sys

SMOKE = "--smoke" in sys.argv
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
_argv, sys.argv = sys.argv, [sys.argv[0], *(["--smoke"] if SMOKE else [])]  # (feature_cost reads --smoke)
import feature_cost as fc  # noqa: E402
from common import run_device  # noqa: E402

sys.argv = _argv
import torch  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--package", default="prefix", choices=("prefix", "window"))
    ap.add_argument("--layout", default="nhd", help="prefix cache layout (nhd, hnd, split)")
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--head", type=int, default=128)
    ap.add_argument("--features", default="plain,fp8_e4m3", help="comma list of feature_cost's feature names")
    ap.add_argument("--smoke", action="store_true", help="CPU, Triton interpreter, tiny shapes, no profiler")
    args = ap.parse_args(argv)
    table = fc.PREFIX if args.package == "prefix" else fc.WINDOW
    names = args.features.split(",")
    known = {f.name: f for f in table}
    if not set(names) <= set(known):
        ap.error(f"unknown {args.package} features {sorted(set(names) - set(known))}")
    feats = [known[n] for n in names]
    run = run_device(args.smoke, torch.bfloat16)
    if run is None:
        return 2
    device, dtype = run
    head = 64 if args.smoke else args.head
    if args.package == "prefix":
        entries = fc.prefix_entries(args.layout, args.page, head, feats, device, dtype)
    else:
        entries = fc.window_entries(head, feats, device, dtype)
    for f, fn, plan, _ in entries:
        print(f"{f.name}: {plan.kernel} ({plan.reason})", flush=True)
        for _ in range(1 if args.smoke else 3):
            fn()
    if args.smoke:
        return 0
    from prefix_prefill import finish_compiles

    finish_compiles()
    for _, fn, _, _ in entries:
        fn()
        fn()
    torch.cuda.synchronize()
    for f, fn, _, _ in entries:  # (one profiled launch each, in the order given)
        torch.cuda.cudart().cudaProfilerStart()
        fn()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        print(f"profiled {f.name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
