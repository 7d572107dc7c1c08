"""Does compute-sanitizer's racecheck flag Gluon's ``warp_specialize`` itself? Two minimal kernels:

    compute-sanitizer --tool racecheck python bench/probe_ws_racecheck.py

* ``empty``: a default partition and one worker partition that touch no shared memory of their own
  (each writes one global value);
* ``handoff``: the worker fills a ``[32, 32]`` shared buffer and arrives on an mbarrier; the default
  partition waits on it and copies the buffer out.

A hazard reported here, at the kernel's ``def`` line or at the ``warp_specialize`` call, lies in the
code Triton generates for warp specialisation, not in a kernel's own shared-memory protocol. Prints
``OK <kernel>`` for each kernel whose output is right; needs an sm90 GPU.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier


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
def _handoff_producer(Out, buf, bar):
    blk: gl.constexpr = gl.BlockedLayout([1, 4], [32, 1], [1, 1], [1, 0])
    r = gl.arange(0, 32, layout=gl.SliceLayout(1, blk))
    c = gl.arange(0, 32, layout=gl.SliceLayout(0, blk))
    buf.store((r[:, None] * 32 + c[None, :]).to(gl.float32))
    fence_async_shared()
    mbarrier.arrive(bar, count=1)


@gluon.jit
def _handoff_kernel(Out):
    buf = gl.allocate_shared_memory(gl.float32, [32, 32], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    mbarrier.init(bar.index(0), count=1)
    b = bar.index(0)
    gl.warp_specialize([(_handoff_consumer, (Out, buf, b)), (_handoff_producer, (Out, buf, b))], [1], [24])


def main() -> int:
    ok = 0
    out = torch.zeros(2, device="cuda")
    _empty_kernel[(4,)](out, num_warps=4)
    torch.cuda.synchronize()
    if out.tolist() == [1.0, 2.0]:
        print("OK empty", flush=True)
        ok += 1
    out = torch.zeros(32, 32, device="cuda")
    _handoff_kernel[(4,)](out, num_warps=4)
    torch.cuda.synchronize()
    if torch.equal(out.flatten(), torch.arange(1024, device="cuda", dtype=torch.float32)):
        print("OK handoff", flush=True)
        ok += 1
    return 0 if ok == 2 else 1


if __name__ == "__main__":
    raise SystemExit(main())
