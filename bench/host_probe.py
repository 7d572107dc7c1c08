"""Host (Python) time per window_prefill call on the PR shape: the launch path, not the kernel.

Usage (GPU machine; ``BENCH_PACKAGES=DIR`` times another tree's packages, see ``common.py``)::

    python bench/host_probe.py [--calls 300] [--profile]

Prints the host time per call of 300 calls queued without a sync (under the GPU time, plain launches
stay kernel-bound; above it they are host-bound), and with ``--profile`` the top of a cProfile.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

from common import add_package_paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    add_package_paths()
    import torch

    import window_prefill
    from window_prefill import window_prefill as wp

    print("package", window_prefill.__file__)
    n, h, d = 16384, 8, 64
    q, k, v = (torch.randn(n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cu = torch.tensor([0, n], device="cuda", dtype=torch.int32)
    out = torch.empty_like(q)

    def call():
        wp(q, k, v, cu, n, causal=False, window=(64, 64), out=out)

    for _ in range(20):
        call()
    torch.cuda.synchronize()
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(args.calls):
            call()
        host = (time.perf_counter() - t0) / args.calls * 1e6
        torch.cuda.synchronize()
        total = (time.perf_counter() - t0) / args.calls * 1e6
        print(f"host {host:.1f} us/call, with the final sync {total:.1f} us/call")
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            call()
        prof.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
