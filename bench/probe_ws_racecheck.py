"""Does compute-sanitizer's racecheck flag Gluon's ``warp_specialize`` itself? Four minimal kernels:

    compute-sanitizer --tool racecheck python bench/probe_ws_racecheck.py [KERNEL ...]

* ``empty``: a default partition and one worker partition that touch no shared memory of their own
  (each writes one global value);
* ``handoff``: the worker fills a ``[32, 32]`` shared buffer and arrives on an mbarrier; the default
  partition waits on it and copies the buffer out;
* ``handoff_sync``: the same, with a barrier of the whole CTA after the mbarrier's init and a barrier of
  the worker's warps between its stores and its (one-thread) arrive;
* ``handoff_4w``: ``handoff_sync`` with a four-warp worker.

Each kernel's PTX synchronisation lines (barriers, fences, mbarrier arrives and waits) are printed, so a
report can be set against what was emitted.

A hazard reported here, at the kernel's ``def`` line or at the ``warp_specialize`` call, lies in the
code Triton generates for warp specialisation, not in a kernel's own shared-memory protocol. Prints
``OK <kernel>`` for each kernel whose output is right (all four, or the ones named: one process per
kernel keeps racecheck's reports apart); needs an sm90 GPU.
"""

from __future__ import annotations

import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

# a barrier of the calling partition's warps (Triton 3.6 names it thread_barrier, later ones barrier)
_partition_barrier = getattr(gl, "thread_barrier", None) or gl.barrier


@gluon.jit
def _write_one(Out, idx, value):
    gl.store(Out + idx, value)


@gluon.jit
def _empty_kernel(Out):
    gl.warp_specialize([(_write_one, (Out, 0, 1.0)), (_write_one, (Out, 1, 2.0))], [1], [24])


@gluon.jit
def _handoff_consumer(Out, buf, bar):
    mbarrier.wait(bar, 0)
    blk: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
    x = buf.load(blk)  # [32, 32]
    r = gl.arange(0, 32, layout=gl.SliceLayout(1, blk))
    c = gl.arange(0, 32, layout=gl.SliceLayout(0, blk))
    gl.store(Out + r[:, None] * 32 + c[None, :], x)


@gluon.jit
def _handoff_producer(Out, buf, bar, SYNC: gl.constexpr, WARPS: gl.constexpr):
    blk: gl.constexpr = gl.BlockedLayout([1, 4], [32 // WARPS, WARPS], [WARPS, 1], [1, 0])
    r = gl.arange(0, 32, layout=gl.SliceLayout(1, blk))
    c = gl.arange(0, 32, layout=gl.SliceLayout(0, blk))
    buf.store((r[:, None] * 32 + c[None, :]).to(gl.float32))
    fence_async_shared()
    if SYNC:
        _partition_barrier()
    mbarrier.arrive(bar, count=1)


@gluon.jit
def _handoff_kernel(Out, SYNC: gl.constexpr, WARPS: gl.constexpr):
    buf = gl.allocate_shared_memory(gl.float32, [32, 32], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    mbarrier.init(bar.index(0), count=1)
    if SYNC:
        fence_async_shared()
        _partition_barrier()
    b = bar.index(0)
    gl.warp_specialize(
        [(_handoff_consumer, (Out, buf, b)), (_handoff_producer, (Out, buf, b, SYNC, WARPS))], [WARPS], [24]
    )


def _sync_lines(compiled) -> str:
    """The PTX lines of ``compiled`` that synchronise (barriers, fences, mbarrier arrives/waits)."""
    keep = ("bar.", "barrier.", "fence", "mbarrier.arrive", "mbarrier.try_wait", "mbarrier.init")
    lines = [ln.strip() for ln in compiled.asm["ptx"].splitlines() if any(k in ln for k in keep)]
    return "\n".join("    " + ln for ln in lines)


def main() -> int:
    handoffs = (("handoff", False, 1), ("handoff_sync", True, 1), ("handoff_4w", True, 4))
    chosen = sys.argv[1:] or ["empty"] + [h[0] for h in handoffs]
    ok = 0
    if "empty" in chosen:
        out = torch.zeros(2, device="cuda")
        _empty_kernel[(4,)](out, num_warps=4)
        torch.cuda.synchronize()
        if out.tolist() == [1.0, 2.0]:
            print("OK empty", flush=True)
            ok += 1
    for name, sync, warps in (h for h in handoffs if h[0] in chosen):
        out = torch.zeros(32, 32, device="cuda")
        compiled = _handoff_kernel[(4,)](out, sync, warps, num_warps=4)
        torch.cuda.synchronize()
        print(f"{name} PTX synchronisation:\n{_sync_lines(compiled)}", flush=True)
        if torch.equal(out.flatten(), torch.arange(1024, device="cuda", dtype=torch.float32)):
            print(f"OK {name}", flush=True)
            ok += 1
    return 0 if ok == len(chosen) else 1


if __name__ == "__main__":
    raise SystemExit(main())
