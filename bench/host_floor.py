"""The floor under a call's host time on this machine: what a launch costs before any of our Python.

Times, per call (best of ``--rounds`` rounds of ``--calls`` calls, no sync): a tiny torch op, torch
SDPA on a tiny problem, an empty Triton kernel through ``kernel[grid]``, through its compiled
``CompiledKernel.run`` and through its C launcher, one TMA descriptor filled by Triton's driver
utility, and the tensor accessors a call signature reads (``stride()``, ``data_ptr()``, ``device``,
``dtype``, ``shape``). Read beside ``host_probe.py``: our per-call cost minus this floor is our Python.

Usage (GPU machine)::

    python bench/host_floor.py [--calls 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import time

import torch
import triton
import triton.language as tl


@triton.jit
def _empty(x_ptr, n):
    pid = tl.program_id(0)
    if pid < 0:  # never: the kernel launches and does nothing
        tl.store(x_ptr + pid, n)


def _best(fn, calls: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    torch.cuda.synchronize()
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    x = torch.zeros(16, device="cuda")
    q = torch.randn(1, 8, 16, 128, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(1, 8, 32, 128, device="cuda", dtype=torch.bfloat16)
    compiled = _empty[(1,)](x, 5)
    stream = torch.cuda.current_stream().cuda_stream
    run = compiled.run
    c_launch = getattr(run, "launch", None)
    fill = triton.runtime.driver.active.utils.fill_tma_descriptor
    rows = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    cases = [
        ("torch x.add_(1)", lambda: x.add_(1)),
        ("torch SDPA tiny", lambda: torch.nn.functional.scaled_dot_product_attention(q, kv, kv)),
        ("triton kernel[grid]", lambda: _empty[(1,)](x, 5)),
        (
            "CompiledKernel.run",
            lambda: run(1, 1, 1, stream, compiled.function, compiled.packed_metadata, None, None, None, x, 5),
        ),
        ("torch.cuda.current_stream", lambda: torch._C._cuda_getCurrentRawStream(0)),
        ("fill_tma_descriptor", lambda: fill(rows.data_ptr(), 3, 2, 9, [64, 64], [64, 256], [256, 1], 0)),
        ("t.stride()", lambda: x.stride()),
        ("t.data_ptr()", lambda: x.data_ptr()),
        ("t.device", lambda: x.device),
        ("t.dtype", lambda: x.dtype),
        ("t.shape", lambda: x.shape),
        ("t.shape[0]", lambda: x.shape[0]),
        ("t.size(0)", lambda: x.size(0)),
        ("t.get_device()", lambda: x.get_device()),
        ("python: empty call", lambda: None),
    ]
    if c_launch is not None and getattr(c_launch, "__code__", None) is None:
        head = (
            run.launch_cooperative_grid,
            run.launch_pdl,
            None,
            None,
            compiled.packed_metadata,
            None,
            None,
            None,
        )
        cases.insert(4, ("C launcher", lambda: c_launch(1, 1, 1, stream, compiled.function, *head, x, 5)))
    for _name, fn in cases:
        for _ in range(20):
            fn()
    torch.cuda.synchronize()
    print(f"torch {torch.__version__} triton {triton.__version__} {torch.cuda.get_device_name()}")
    for name, fn in cases:
        print(f"{name:28s} {_best(fn, args.calls, args.rounds):7.2f} us/call")


if __name__ == "__main__":
    main()
