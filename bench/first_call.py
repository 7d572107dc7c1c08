"""First-call cost: the wall time of a process's first call of each kernel, with an empty Triton cache
(cold: compiles) and with the cache the cold run left (warm: loads the binary), per (kernel, dtype,
head size). Each measurement is a fresh subprocess with its own ``TRITON_CACHE_DIR``; only the call
is timed (imports and input allocation are not). The child also makes a second call with other
sequence lengths and batch size and reports whether that compiled anything (it must not).

    python bench/first_call.py [--out DIR] [--kernels window,prefix,prefix_kvcache] [--dtypes bf16,fp16]
                               [--heads 64,128,256] [--set NAME=0|1 ...] [--layout nhd|split]

(``prefix_kvcache``: prefix-prefill with k=v=None, the new tokens' K/V read from the cache.)
    python bench/first_call.py --smoke # CPU: Triton interpreter, tiny shapes, cold runs (checks the script)

(``--smoke`` runs the window kernel and prefix_kvcache, whose child takes every line that prefix's does.)

``--prime-early S``: each child calls ``prefill_runtime.prime_triton_in_background()`` right after its
imports, then waits S seconds (an engine's other start-up work, e.g. loading weights) before it builds
the inputs and times the call: the first call of an engine that opts in (``prime_early_s`` in the
rows; 0, the default: no early start, the plain first call).

Writes DIR/first_call.{csv,md} with ``--out``. ``FIRST_CALL_PROFILE=FILE`` in the environment appends a
cProfile of every child's first call (cumulative and own time; cProfile slows Python-heavy parts) to FILE;
``FIRST_CALL_STAGES=FILE`` a wall-time timeline of Triton's compile steps in that call (no profiler).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, write_rows


def _child(
    kernel: str, dtype_name: str, head: int, smoke: bool, sets: list[str], layout: str = "nhd",
    prime_early: float = 0.0,
) -> dict:  # fmt: skip
    from common import add_package_paths, set_constants, settle

    add_package_paths()

    def bad(msg):
        raise SystemExit(msg)

    if sets:  # the kernel package's plan constants (--set NAME=VALUE), applied before the first call
        module = "window_prefill.plan" if kernel == "window" else "prefix_prefill.plan"
        set_constants(sets, bad, module=module)
    import torch

    dev = "cpu" if smoke else "cuda"
    n_q, n_kv = (2, 1) if smoke else (8, 2)
    dt = getattr(torch, {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[dtype_name])
    gen = torch.Generator(device=dev).manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, device=dev, generator=gen).to(dt)

    if kernel == "window":
        import window_prefill.launch as wi
        from window_prefill import window_prefill

        jits = [wi._fwd_kernel, wi._gluon_fwd_kernel]  # head 128 16-bit causal runs the Gluon kernel on sm90

        def make(lens):
            n = sum(lens)
            cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=dev)
            q, k, v = randn(n, n_q, head), randn(n, n_kv, head), randn(n, n_kv, head)
            return lambda: window_prefill(q, k, v, cu, max(lens), causal=True, window=(255, -1))
    else:  # "prefix", or "prefix_kvcache": k=v=None, the new tokens' K/V read from the cache
        kv_from_cache = kernel == "prefix_kvcache"
        import prefix_prefill.gluon_launch as pg
        import prefix_prefill.launch as pi
        from prefix_prefill import prefix_prefill

        # 16-bit on sm90 runs a Gluon kernel: NHD caches _gluon_fwd_kernel, vLLM's split _gluon_split_kernel
        jits = [pi._fwd_kernel, pg._gluon_fwd_kernel, pg._gluon_split_kernel]
        page = 16

        def make(lens):
            ctx = [2 * n for n in lens]
            seq = [c + n for c, n in zip(ctx, lens, strict=True)]
            pages = [-(-s // page) for s in seq]
            nb = sum(pages) + 1
            if layout == "split":  # vLLM's: K [blocks, Hkv, D/x, page, x], V [blocks, Hkv, D, page]
                x = 16 // torch.empty(0, dtype=dt).element_size()
                k_cache = randn(nb, n_kv, head // x, page, x)
                v_cache = randn(nb, n_kv, head, page)
            else:
                k_cache, v_cache = randn(nb, page, n_kv, head), randn(nb, page, n_kv, head)
            table = torch.zeros(len(lens), max(pages), dtype=torch.int32, device=dev)
            at = 0
            for i, p in enumerate(pages):
                table[i, :p] = torch.arange(at, at + p, dtype=torch.int32, device=dev)
                at += p
            n = sum(lens)
            cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=dev)
            sl = torch.tensor(seq, dtype=torch.int32, device=dev)
            q, k, v = randn(n, n_q, head), randn(n, n_kv, head), randn(n, n_kv, head)
            if kv_from_cache:  # the new tokens' K/V are read from the cache (which holds every token)
                k = v = None
            return lambda: prefix_prefill(
                q, k, v, k_cache, v_cache, table, cu, sl, max(lens), kv_layout=layout
            )

    def sync():
        if not smoke:
            torch.cuda.synchronize()

    def n_compiled() -> int:
        try:
            return sum(
                len(entry[0]) for jit in jits if jit is not None for entry in jit.device_caches.values()
            )
        except Exception:
            return -1

    if prime_early > 0:  # an engine that opts in: Triton's setup started early, in the background
        import prefill_runtime

        prefill_runtime.prime_triton_in_background()
        time.sleep(prime_early)
    # inputs of both calls first (their allocation and torch's own first kernels are not timed)
    t = time.perf_counter()
    call1 = make([37, 200] if not smoke else [5, 9])
    call2 = make([1, 513, 64, 90] if not smoke else [3, 17, 2])  # other lengths and batch size
    sync()
    inputs = time.perf_counter() - t
    t_call = [0.0]
    events: list[tuple[str, str, float, float]] = []
    if os.environ.get("FIRST_CALL_STAGES") and not smoke:
        _time_stages(events, t_call)
    prof = None
    if os.environ.get("FIRST_CALL_PROFILE"):  # cProfile of the first call: where its seconds go
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    t = t_call[0] = time.perf_counter()
    call1()
    sync()
    first = time.perf_counter() - t
    if events:
        with open(os.environ["FIRST_CALL_STAGES"], "a") as f:
            f.write(f"===== {kernel} {dtype_name} d{head} sets={sets} first={first:.3f} s\n")
            for name, thread, start, dur in sorted(events, key=lambda e: e[2]):
                f.write(f"  {start:7.3f} +{dur:6.3f} s  {name}  [{thread}]\n")
    if prof is not None:
        import io
        import pstats

        prof.disable()
        buf = io.StringIO()
        stats = pstats.Stats(prof, stream=buf)
        stats.sort_stats("cumulative").print_stats(45)
        stats.sort_stats("tottime").print_stats(25)
        with open(os.environ["FIRST_CALL_PROFILE"], "a") as f:
            f.write(f"===== {kernel} {dtype_name} d{head} sets={sets} first={first:.3f} s\n")
            f.write(buf.getvalue() + "\n")
    # prefix-prefill's compile tiers: the first call ran the quick form; wait for the full form's
    # background compile (not part of the first call; full_ready_s: from the first call's start)
    settle()
    full_ready = time.perf_counter() - t_call[0]
    before = n_compiled()
    # compiled variants per kernel after the first call (Triton kernel, Gluon kernel(s)): 1 in all when
    # one kernel ran, 2 for a Gluon kernel with compile tiers (quick and full form); a Gluon kernel that
    # failed and left the call to the Triton one shows as one more
    caches = [getattr(jit, "device_caches", None) for jit in jits]  # none under the interpreter
    variants = "/".join(str(sum(len(e[0]) for e in c.values())) if c is not None else "-" for c in caches)
    t = time.perf_counter()
    call2()
    sync()
    second = time.perf_counter() - t
    return {"first_call_s": first, "second_call_s": second, "recompiled": n_compiled() != before,
            "variants": variants, "inputs_s": inputs, "full_ready_s": full_ready}  # fmt: skip


def _time_stages(events: list, t_call: list) -> None:
    """``FIRST_CALL_STAGES=FILE``: wrap Triton's compile steps (front end, each backend stage, the gcc-built
    modules, the library hash) so the child writes when each started after the call began and how long
    it took, with its thread, to FILE (wall time; no profiler overhead)."""
    import threading

    def timed(name, fn):
        def run(*a, **kw):
            start = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                now = time.perf_counter()
                events.append((name, threading.current_thread().name, start - t_call[0], now - start))

        return run

    try:
        from triton.backends.nvidia import compiler as nvc
        from triton.backends.nvidia import driver as nvd
        from triton.compiler import compiler as cc
        from triton.runtime import cache

        add = nvc.CUDABackend.add_stages

        def add_stages(self, stages, options, *rest):
            add(self, stages, options, *rest)
            for key in list(stages):
                stages[key] = timed(f"stage {key}", stages[key])

        nvc.CUDABackend.add_stages = add_stages
        cc.ASTSource.make_ir = timed("front end", cc.ASTSource.make_ir)
        nvd.compile_module_from_src = timed("gcc module", nvd.compile_module_from_src)
        cache.triton_key = timed("triton_key", cache.triton_key)
        import triton.compiler

        triton.compiler.compile = timed("triton.compile", triton.compiler.compile)  # bound at a first run
        cc.CompiledKernel._init_handles = timed("load binary + launcher", cc.CompiledKernel._init_handles)
        from triton.experimental.gluon import _runtime as gr

        gr.GluonASTSource.make_ir = timed("front end (gluon)", gr.GluonASTSource.make_ir)
    except Exception as exc:  # another Triton: time what could be wrapped
        print(f"# stage timer: {type(exc).__name__}: {exc}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--kernels", default="window,prefix")
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--heads", default="64,128,256")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="for every child: a bool or int constant of the kernel's plan module "
                    "(prefix_prefill.plan, window_prefill.plan)")  # fmt: skip
    ap.add_argument("--layout", default="nhd", choices=("nhd", "split"),
                    help="prefix kernels' cache layout (split: vLLM's)")  # fmt: skip
    ap.add_argument("--prime-early", type=float, default=0.0, metavar="S",
                    help="children start Triton's setup S seconds before the call (0: off)")  # fmt: skip
    ap.add_argument("--child", nargs=3, metavar=("KERNEL", "DTYPE", "HEAD"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        kernel, dtype_name, head = args.child
        res = _child(kernel, dtype_name, int(head), args.smoke, args.set, args.layout, args.prime_early)
        print("RESULT " + json.dumps(res), flush=True)
        return 0
    kernels, dtypes = args.kernels.split(","), args.dtypes.split(",")
    heads = [int(h) for h in args.heads.split(",")]
    if args.smoke:
        kernels, dtypes, heads = ["window", "prefix_kvcache"], ["fp16"], [64]
    rows = []
    for kernel in kernels:
        for dtype_name in dtypes:
            for head in heads:
                with tempfile.TemporaryDirectory() as cache:
                    env = dict(os.environ, TRITON_CACHE_DIR=cache)
                    if args.smoke:
                        env["TRITON_INTERPRET"] = "1"
                    # warm: the same cache directory, filled by the cold run (the interpreter of --smoke
                    # compiles nothing, so there a warm run would repeat the cold one)
                    for kind in ("cold",) if args.smoke else ("cold", "warm"):
                        cmd = [sys.executable, __file__, "--child", kernel, dtype_name, str(head)]
                        cmd += ["--layout", args.layout, f"--prime-early={args.prime_early}"]
                        cmd += ["--smoke"] if args.smoke else []
                        cmd += [f"--set={kv}" for kv in args.set]
                        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
                        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
                        if proc.returncode != 0 or not line:
                            print(f"# {kernel} {dtype_name} d{head} {kind}: failed\n{proc.stderr[-2000:]}")
                            continue
                        res = json.loads(line[0][len("RESULT ") :])
                        row = {"kernel": kernel, "dtype": dtype_name, "head": head, "cache": kind,
                               "layout": "-" if kernel == "window" else args.layout,
                               "sets": " ".join(args.set), "prime_early_s": args.prime_early,
                               **res}  # fmt: skip
                        rows.append(row)
                        print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
                        if args.out:  # rewritten after every row: a run cut by a time limit keeps its rows
                            write_rows(Path(args.out), "first_call", rows)
    return 0 if rows else 1


if __name__ == "__main__":
    raise SystemExit(main())
