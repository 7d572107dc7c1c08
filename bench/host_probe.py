"""Host (Python) time per call of every public entry point on a tiny problem: the launch path, not the
kernel.

Usage (GPU machine; ``BENCH_PACKAGES=DIR`` times another tree's packages, see ``common.py``)::

    python bench/host_probe.py [--calls 1000] [--rounds 5] [--profile ENTRY] [--peers]

Each entry point is called ``--calls`` times without a sync, in ``--rounds`` interleaved rounds (the best
round shown; the kernel is far shorter than the call, so the wall time per call is the host's cost);
``--profile ENTRY`` prints the top of a cProfile of that entry point's calls (``pp_caf``, ``pp_caf_2buf``
(``pp_caf`` over two sets of new-token buffers in turn), ``pp_split``, ``pp_nhd``, ``wp_caf``, ``wp``);
``--peers`` adds torch SDPA on the same tokens and vLLM 0.33's ``context_attention_fwd`` (``.peers``) as
rows of the same rounds, so a slow host process shows in their rows too. The last line says where the
process ran (its CPU affinity, the CPU it ended on, the load average).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time

from common import add_package_paths


def _where() -> str:
    """The process's CPU affinity, the CPU it runs on now and the load average (Linux; '?' elsewhere)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
        with open("/proc/self/stat") as f:
            now = f.read().rsplit(")", 1)[1].split()[36]
        with open("/proc/loadavg") as f:
            load = " ".join(f.read().split()[:3])
        span = f"{cpus[0]}-{cpus[-1]}" if len(cpus) == cpus[-1] - cpus[0] + 1 else ",".join(map(str, cpus))
        return f"affinity {span} ({len(cpus)} cpus), on cpu {now}, loadavg {load}"
    except Exception:
        return "?"


def _calls(torch, dev="cuda", window_dtype=None, peers=False, fp8=False):
    """(name, zero-argument call) of every entry point on a tiny problem (16 new tokens on a 16-token
    context, 8/2 heads, d128, page 16; bf16, or ``window_dtype`` for window-prefill's) on ``dev``:
    prefix-prefill's four first. ``peers``: then torch SDPA on the same queries (8 kv heads) and, where
    ``.peers`` is on the path, vLLM 0.33's prefix ``context_attention_fwd`` on the same arguments.
    ``fp8``: last, ``pp_nhd_fp8``, the NHD call over the caches in fp8 e4m3 (1-element scale tensors;
    a bfloat16 call over an fp8 cache runs on float16 copies: two launches)."""
    import prefix_prefill as pp
    import window_prefill as wp

    dt = torch.bfloat16
    h, hk, d, page = 8, 2, 128, 16
    q = torch.randn(16, h, d, device=dev, dtype=dt)
    k = torch.randn(16, hk, d, device=dev, dtype=dt)
    v = torch.randn_like(k)
    o = torch.empty_like(q)
    kc_split = torch.randn(8, hk, d // 8, page, 8, device=dev, dtype=dt)
    vc_split = torch.randn(8, hk, d, page, device=dev, dtype=dt)
    kc_nhd = torch.randn(8, page, hk, d, device=dev, dtype=dt)
    vc_nhd = torch.randn_like(kc_nhd)
    bt = torch.tensor([[3, 5, 0, 0]], dtype=torch.int32, device=dev)
    cu = torch.tensor([0, 16], dtype=torch.int32, device=dev)
    sl = torch.tensor([32], dtype=torch.int32, device=dev)
    start = torch.tensor([0], dtype=torch.int32, device=dev)
    lens = torch.tensor([16], dtype=torch.int32, device=dev)
    one = torch.ones(1, device=dev)
    wq, wk, wv, wo = (t.to(window_dtype or dt) for t in (q, k, v, o))
    # pp_caf over two sets of new-token buffers in turn (an engine whose activations move between calls)
    sets = [(q, k, v, o), tuple(torch.empty_like(t).copy_(t) for t in (q, k, v, o))]
    turn = [0]

    def pp_caf_2buf():
        turn[0] ^= 1
        q_, k_, v_, o_ = sets[turn[0]]
        pp.context_attention_fwd(q_, k_, v_, o_, "auto", kc_split, vc_split, bt, cu, sl, 32, 16, one, one)

    caf_args = (q, k, v, o, "auto", kc_split, vc_split, bt, cu, sl, 32, 16, one, one)
    calls = [
        ("pp_caf", lambda: pp.context_attention_fwd(*caf_args)),
        ("pp_caf_2buf", pp_caf_2buf),
        ("pp_split", lambda: pp.prefix_prefill(q, k, v, kc_split, vc_split, bt, cu, sl, 16, out=o)),
        ("pp_nhd", lambda: pp.prefix_prefill(q, k, v, kc_nhd, vc_nhd, bt, cu, sl, 16, out=o)),
        ("wp_caf", lambda: wp.context_attention_fwd(wq, wk, wv, wo, start, lens, 16)),
        ("wp", lambda: wp.window_prefill(wq, wk, wv, cu, 16, out=wo)),
    ]
    if peers:
        calls += _peer_calls(torch, q, caf_args)
    if fp8:
        kc8, vc8 = kc_nhd.to(torch.float8_e4m3fn), vc_nhd.to(torch.float8_e4m3fn)
        calls.append(("pp_nhd_fp8", lambda: pp.prefix_prefill(q, k, v, kc8, vc8, bt, cu, sl, 16, out=o,
                                                               k_scale=one, v_scale=one)))  # fmt: skip
    return calls


def _peer_calls(torch, q, vllm_args: tuple) -> list:
    """torch SDPA over ``q``'s token count and heads (its own inputs), and vLLM 0.33's
    ``context_attention_fwd`` of ``vllm_args`` (our ``pp_caf`` row's) where ``.peers`` is on the path."""
    shape = (1, q.shape[1], q.shape[0], q.shape[2])  # [1, H, S, D], contiguous
    q4, k4, v4 = (torch.randn(shape, device=q.device, dtype=q.dtype) for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    out = [("sdpa", lambda: sdpa(q4, k4, v4, is_causal=True))]
    try:
        from vllm.v1.attention.ops.prefix_prefill import context_attention_fwd as vpp
    except Exception:
        return out
    return [*out, ("vllm_pp", lambda: vpp(*vllm_args))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds of each entry (best shown)")
    ap.add_argument("--profile", default="")
    ap.add_argument("--peers", action="store_true", help="also time torch SDPA and vLLM 0.33 (.peers)")
    args = ap.parse_args()
    add_package_paths()
    import torch

    import prefix_prefill

    calls = _calls(torch, peers=args.peers)
    for _, fn in calls:  # compile, and let the compile tiers finish
        for _ in range(3):
            fn()
    prefix_prefill.finish_compiles()
    for _, fn in calls:
        fn()
    torch.cuda.synchronize()
    best: dict[str, tuple[float, float]] = {}
    for _ in range(args.rounds):  # rounds interleave the entry points: a noisy host shows in one round
        for name, fn in calls:
            t0 = time.perf_counter()
            for _ in range(args.calls):
                fn()
            host = (time.perf_counter() - t0) / args.calls * 1e6
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t0) / args.calls * 1e6
            if name not in best or host < best[name][0]:
                best[name] = (host, wall)
    for name, (host, wall) in best.items():
        print(f"{name:11s} host {host:7.1f} us/call  wall {wall:7.1f} us/call  (best of {args.rounds})")
    for name, fn in calls:
        if name == args.profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.calls):
                fn()
            prof.disable()
            torch.cuda.synchronize()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    print("where:", _where())
    from prefix_prefill import gluon_launch, launch

    direct = {n: len(c) for n, c in (("triton", launch._TRITON), ("nhd", gluon_launch._NHD),
                                     ("split", gluon_launch._SPLIT)) if c is not None}  # fmt: skip
    print("compiled variants launched directly:", direct)


if __name__ == "__main__":
    main()
