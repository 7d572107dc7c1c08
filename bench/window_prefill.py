#!/usr/bin/env python
"""Benchmark window_prefill against its peers on one GPU (H200): time, useful TFLOP/s, GB/s, floors.

Usage::

    python bench/window_prefill.py --out DIR [--quick] [--sweep] [--shapes pr,llm,sweep_n,sweep_w]
                                   [--softcap C] [--set NAME=V ...]

``--set NAME=V``: a tuning constant of ``window_prefill.plan`` (``_GLUON_MIN_WIDTH=4096``) or a
constexpr of the planned kernel (``WIDE_OFFSETS=1``, through ``bench/plan_override.py``); two runs,
with and without, are an A/B of that setting beside the peers.

Shapes (all bf16, one sequence of N tokens):

* ``pr``      N=16384, 8 q / 8 kv heads, head_dim 64, window (64, 64), non-causal;
* ``llm``     N=32768, 32 q / 8 kv heads, head_dim 128, causal, window (4095, -1);
* ``sweep_n`` N = 4k .. 256k (powers of two) at the ``pr`` configuration;
* ``sweep_w`` window (w, w), w = 64 .. N, at N=16384, otherwise the ``pr`` configuration;
* ``llm_nc``  the ``llm`` heads, non-causal, window (2047, 2048) (not in the default list);
* ``llm64``   the ``llm`` shape at head_dim 64, 32 q / 8 kv heads (not in the default list);
* ``llm256``  N=32768, 16 q / 2 kv heads, head_dim 256, causal, window (4095, -1) (not in the default
  list);
* ``causal8k`` N=8192, 32 q / 8 kv heads, head_dim 128, causal, no window: full causal attention,
  where cuDNN SDPA is the peer to beat (not in the default list).

Peers, each guarded (printed and skipped when unavailable): ``ours``; ``ours_graph`` (ours replayed from a
CUDA graph: the kernel without the host launch path); ``ours_nowindow`` (same kernel,
window off: O(N^2)); ``vllm`` (vLLM 0.33 context_attention_fwd from .peers, sliding_window_q/k);
``flex`` (torch FlexAttention, torch.compile'd, sliding-window block mask built once per shape, GQA via
enable_gqa); ``sdpa_flash`` / ``sdpa_cudnn`` (torch SDPA backends on FULL attention, noted in the row).
Full-attention peers are skipped above N=65536 to keep the run short.

Useful FLOPs = visible (query, key) pairs (exact, closed form per row) * heads * 4 * head_dim; bytes =
q, k, v and o once. ``floor_ms`` = max(compute floor, memory floor) at the card's measured ceilings.
Windowed peers are checked against ``ours`` (attn_reference.compare, bf16 tolerances) in ``check``.

``--sweep`` also times our kernel over BLOCK_M {64,128} x BLOCK_N {32,64,128} x warps {4,8} x stages
{2,3,4} on the ``pr`` and ``llm`` shapes and writes DIR/window_sweep.{csv,md} (pass ``--shapes ""``
for the sweep alone). Writes DIR/window_prefill.{csv,md} and DIR/window_prefill.png.
Each peer is timed in ``--rounds`` passes (default 3; peer order rotated each pass): rows hold the
median, the note lists every pass.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_BENCH_DIR = os.path.realpath(Path(__file__).resolve().parent)
sys.path.insert(0, _BENCH_DIR)

from common import (  # noqa: E402
    add_package_paths,
    attn_flops,
    bench_ms,
    floors_ms,
    gpu_name,
    set_constants,
    tflops,
    write_rows,
)
from plan_override import overridden, parse_sets  # noqa: E402

# This script's own name would shadow the window_prefill package: keep bench/ off the import path.
sys.path[:] = [p for p in sys.path if not p or os.path.realpath(p) != _BENCH_DIR]

FULL_MAX_N = 65536  # full-attention peers above this would dominate the run time
DEVICE = "cuda"  # a CPU smoke run (TRITON_INTERPRET=1) may set "cpu" ...
DTYPE_NAME = "bfloat16"  # ... and "float16" (the interpreter has no bf16 tl.dot)


@dataclass(frozen=True)
class Shape:
    name: str
    n: int
    heads: int
    kv_heads: int
    head_dim: int
    causal: bool
    window: tuple[int, int]


def make_shapes(kinds: list[str], quick: bool) -> list[Shape]:
    pr = Shape("pr", 16384, 8, 8, 64, False, (64, 64))
    out: list[Shape] = []
    for kind in kinds:
        if kind == "pr":
            out.append(pr)
        elif kind == "llm":
            out.append(Shape("llm", 32768, 32, 8, 128, True, (4095, -1)))
        elif kind == "sweep_n":
            ns = [4096, 16384, 65536, 262144] if quick else [4096 << i for i in range(7)]
            out += [Shape("sweep_n", n, 8, 8, 64, False, (64, 64)) for n in ns]
        elif kind == "sweep_w":
            ws = [64, 1024, 16384] if quick else [64, 256, 1024, 4096, 16384]
            out += [Shape("sweep_w", 16384, 8, 8, 64, False, (w, w)) for w in ws]
        elif kind == "llm_nc":
            out.append(Shape("llm_nc", 32768, 32, 8, 128, False, (2047, 2048)))
        elif kind == "llm64":
            out.append(Shape("llm64", 32768, 32, 8, 64, True, (4095, -1)))
        elif kind == "llm256":
            out.append(Shape("llm256", 32768, 16, 2, 256, True, (4095, -1)))
        elif kind == "causal8k":
            out.append(Shape("causal8k", 8192, 32, 8, 128, True, (-1, -1)))
        elif kind:
            kinds_known = "pr, llm, sweep_n, sweep_w, llm_nc, llm64, llm256, causal8k"
            raise SystemExit(f"unknown shape kind {kind!r}; expected {kinds_known}")
    return out


def visible_pairs(n: int, causal: bool, window: tuple[int, int]) -> int:
    """Exact count of visible (query, key) pairs of one self-attention sequence of n tokens:
    row i sees keys [max(0, i - left), min(n - 1, i + right, i if causal)] (closed form per row)."""
    import torch

    left, right = window
    i = torch.arange(n, dtype=torch.int64)
    lo = (i - left).clamp(min=0) if left >= 0 else torch.zeros_like(i)
    hi = (i + right).clamp(max=n - 1) if right >= 0 else torch.full_like(i, n - 1)
    if causal:
        hi = torch.minimum(hi, i)
    return int((hi - lo + 1).clamp(min=0).sum())


class Peers:
    """Builds one timed callable per peer for a shape; each may raise (then the peer is skipped)."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self._flex = None
        self._masks: dict[tuple, object] = {}

    def inputs(self, s: Shape):
        torch = self.torch
        dt = getattr(torch, DTYPE_NAME)
        q = torch.randn(s.n, s.heads, s.head_dim, device=DEVICE, dtype=dt)
        k = torch.randn(s.n, s.kv_heads, s.head_dim, device=DEVICE, dtype=dt)
        v = torch.randn(s.n, s.kv_heads, s.head_dim, device=DEVICE, dtype=dt)
        cu = torch.tensor([0, s.n], device=DEVICE, dtype=torch.int32)
        return q, k, v, cu

    def ours(self, s: Shape, q, k, v, cu, window=None, config=None) -> Callable[[], object]:
        from window_prefill import window_prefill

        out = self.torch.empty_like(q)
        w = s.window if window is None else window
        kw = {"out": out, "config": config, **({"softcap": SOFTCAP} if SOFTCAP > 0 else {})}
        if RETURN_LSE:
            lse = self.torch.empty(q.shape[1], q.shape[0], dtype=self.torch.float32, device=q.device)
            kw.update(return_lse=True, lse=lse)
        if RETURN_LSE:  # the output, for the checks; the LSE is written into kw["lse"]
            return lambda: window_prefill(q, k, v, cu, s.n, causal=s.causal, window=w, **kw)[0]
        return lambda: window_prefill(q, k, v, cu, s.n, causal=s.causal, window=w, **kw)

    def ours_graph(self, s: Shape, q, k, v, cu) -> Callable[[], object]:
        """Our call captured once in a CUDA graph and replayed: the kernel time without the host
        launch path (argument checks, op dispatch, Triton launch), which do_bench's events can
        include when the host is slower than the GPU (seen on the 0.05 ms shapes)."""
        torch = self.torch
        call = self.ours(s, q, k, v, cu)
        out = call()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()

        def fn():
            graph.replay()
            return out

        return fn

    def ours_nowindow(self, s: Shape, q, k, v, cu) -> Callable[[], object]:
        if s.n > FULL_MAX_N:
            raise RuntimeError(f"full attention skipped above N={FULL_MAX_N}")
        return self.ours(s, q, k, v, cu, window=(-1, -1))

    def vllm(self, s: Shape, q, k, v, cu) -> Callable[[], object]:
        if SOFTCAP > 0:
            raise RuntimeError("no softcap in vLLM's context_attention_fwd")
        from vllm.v1.attention.ops.triton_prefill_attention import context_attention_fwd

        o = self.torch.empty_like(q)
        lens = cu.diff()
        left, right = s.window
        sw_q = left if left > 0 else None
        sw_k = right if right > 0 else None
        if left == 0 or right == 0:
            raise RuntimeError("vLLM cannot express a zero-width window side")

        def fn():
            context_attention_fwd(q, k, v, o, cu[:-1], lens, s.n, s.causal, None, sw_q, sw_k)
            return o

        return fn

    def flex(self, s: Shape, q, k, v, cu) -> Callable[[], object]:
        torch = self.torch
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        if self._flex is None:
            import torch._dynamo

            torch._dynamo.config.cache_size_limit = 64  # never fall back to eager (O(N^2) memory)
            self._flex = torch.compile(flex_attention, dynamic=False)
        key = (s.n, s.causal, s.window)
        if key not in self._masks:
            left_t = torch.tensor(s.window[0], device=DEVICE)
            right_t = torch.tensor(s.window[1], device=DEVICE)
            causal, has_left, has_right = s.causal, s.window[0] >= 0, s.window[1] >= 0

            def mask_mod(b, h, q_idx, kv_idx):
                vis = q_idx >= 0
                if causal:
                    vis = vis & (kv_idx <= q_idx)
                if has_left:
                    vis = vis & (q_idx - kv_idx <= left_t)
                if has_right:
                    vis = vis & (kv_idx - q_idx <= right_t)
                return vis

            self._masks[key] = create_block_mask(mask_mod, None, None, s.n, s.n, device=DEVICE)
        bm = self._masks[key]
        q4, k4, v4 = (t.transpose(0, 1).unsqueeze(0).contiguous() for t in (q, k, v))  # [1, H, N, D]
        gqa = s.heads != s.kv_heads
        fn = self._flex
        if SOFTCAP > 0:
            cap = SOFTCAP

            def score_mod(score, b, h, q_idx, kv_idx):  # score is already scaled
                return cap * torch.tanh(score / cap)

            return lambda: fn(q4, k4, v4, score_mod=score_mod, block_mask=bm, enable_gqa=gqa)
        return lambda: fn(q4, k4, v4, block_mask=bm, enable_gqa=gqa)

    def _sdpa(self, backend_name: str, s: Shape, q, k, v) -> Callable[[], object]:
        if SOFTCAP > 0:
            raise RuntimeError("no softcap in SDPA")
        torch = self.torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        if s.n > FULL_MAX_N:
            raise RuntimeError(f"full attention skipped above N={FULL_MAX_N}")
        backend = getattr(SDPBackend, backend_name)
        group = s.heads // s.kv_heads
        q4 = q.transpose(0, 1).unsqueeze(0).contiguous()
        k4, v4 = (t.repeat_interleave(group, dim=1).transpose(0, 1).unsqueeze(0).contiguous() for t in (k, v))
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def fn():
            with sdpa_kernel(backend):
                return sdpa(q4, k4, v4, is_causal=s.causal)

        return fn

    def sdpa_flash(self, s: Shape, q, k, v, cu) -> Callable[[], object]:
        return self._sdpa("FLASH_ATTENTION", s, q, k, v)

    def sdpa_cudnn(self, s: Shape, q, k, v, cu) -> Callable[[], object]:
        return self._sdpa("CUDNN_ATTENTION", s, q, k, v)


PEERS = ["ours", "ours_graph", "ours_nowindow", "vllm", "flex", "sdpa_flash", "sdpa_cudnn"]
# --softcap C: logits C * tanh(scale * q.k / C) for ours and FlexAttention (a score_mod); the peers
# without it are skipped.
SOFTCAP = 0.0
# --return-lse: ours also writes the softmax LSE (return_lse=True, a preallocated buffer)
RETURN_LSE = False
FULL_PEERS = {"ours_nowindow", "sdpa_flash", "sdpa_cudnn"}
PEER_NOTES = {"ours_graph": "ours replayed from a CUDA graph: no Python launch cost in the timing"}


def _as_tokens(t, s: Shape):
    """A peer's output as [N, H, D] (flex/SDPA return [1, H, N, D])."""
    if t.dim() == 4:
        return t[0].transpose(0, 1)
    return t


def fmt_row(r: dict) -> str:
    keys = [
        "shape",
        "peer",
        "n",
        "window",
        "causal",
        "ms",
        "tflops",
        "gbps",
        "floor_ms",
        "pct_floor",
        "check",
    ]
    return "  ".join(
        f"{k}={r[k]:.4g}" if isinstance(r.get(k), float) else f"{k}={r.get(k, '')}" for k in keys
    )


def run_peers(shapes: list[Shape], gpu: str, only: list[str] | None = None, rounds: int = 1) -> list[dict]:
    """Every peer on every shape. Per shape, each peer runs once (output checked against ours), then
    ``rounds`` passes time them all, the peer order rotated each pass, and a row holds the median: the
    card's clocks drift by a few % over a run (bench/results/NOTES.md step 46), so a ratio of two
    peers timed once each, one after the other, carries that drift."""
    import statistics

    import torch

    from attn_reference import compare

    peers = Peers()
    rows: list[dict] = []
    for s in shapes:
        q, k, v, cu = peers.inputs(s)
        pairs = visible_pairs(s.n, s.causal, s.window)
        flops = attn_flops(pairs, s.head_dim, s.heads)
        nbytes = (2 * s.heads + 2 * s.kv_heads) * s.n * s.head_dim * q.element_size()
        f_ms, m_ms = floors_ms(flops, nbytes, gpu)
        floor = max(f_ms, m_ms)
        ours_out = None
        fns, checks = {}, {}
        for name in PEERS:
            if only and name not in only:
                continue
            try:
                fn = getattr(peers, name)(s, q, k, v, cu)
                res = fn()
                torch.cuda.synchronize()
            except Exception as exc:
                print(
                    f"shape={s.name} n={s.n} peer={name} SKIP ({type(exc).__name__}: {str(exc)[:160]})",
                    flush=True,
                )
                continue
            check = ""
            if name == "ours":
                ours_out = _as_tokens(res, s)
            elif name not in FULL_PEERS and ours_out is not None:
                try:
                    c = compare(ours_out, _as_tokens(res, s).float(), dtype=torch.bfloat16)  # bf16 tolerance
                    check = "ok" if c else f"FAIL max_abs={c.max_abs:.3g}"
                except Exception as exc:
                    check = f"n/a ({type(exc).__name__})"
            del res
            fns[name], checks[name] = fn, check
        times: dict[str, list[float]] = {name: [] for name in fns}
        order = list(fns)
        for rnd in range(rounds):
            for name in order[rnd % len(order) :] + order[: rnd % len(order)]:
                times[name].append(bench_ms(fns[name]))
        for name in order:
            ms = statistics.median(times[name])
            note = "full attention (no window)" if name in FULL_PEERS else PEER_NOTES.get(name, "")
            if rounds > 1:
                note = (
                    (note + "; " if note else "")
                    + f"median of {rounds} rounds "
                    + "/".join(f"{t:.4g}" for t in times[name])
                )
            row = {
                "shape": s.name,
                "peer": name,
                "n": s.n,
                "heads": s.heads,
                "kv_heads": s.kv_heads,
                "head_dim": s.head_dim,
                "causal": s.causal,
                "window": f"{s.window[0]}/{s.window[1]}",
                "note": note,
                "ms": ms,
                "tflops": tflops(flops, ms),
                "gbps": nbytes / (ms * 1e-3) / 1e9,
                "floor_ms": floor,
                "compute_floor_ms": f_ms,
                "memory_floor_ms": m_ms,
                "pct_floor": 100.0 * floor / ms,
                "check": checks[name],
            }
            rows.append(row)
            print(fmt_row(row), flush=True)
        del q, k, v, ours_out, fns
        torch.cuda.empty_cache()
    return rows


def _graphed(torch, fn):
    """``fn`` captured once in a CUDA graph: the kernel time without the host launch path."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def run_sweep(gpu: str, shapes: list[Shape] | None = None, grid: str | None = None) -> list[dict]:
    """Time our kernel over a launch-config grid (``grid``: ``BMs/BNs/warps/stages[/tma]``, each a
    comma list, tma 0 or 1 (default 0); default 64,128/32,64,128/4,8/2,3,4), each config captured in a
    CUDA graph (the small shapes are host-bound with plain launches on some machines)."""
    import torch

    from window_prefill import Config, detect_arch, get_config, shared_memory_bytes
    from window_prefill.configs import SHARED_MEMORY_LIMIT

    arch = detect_arch(torch.device(DEVICE))
    limit = SHARED_MEMORY_LIMIT.get(arch, SHARED_MEMORY_LIMIT["default"])
    peers = Peers()
    rows: list[dict] = []
    for s in shapes if shapes is not None else make_shapes(["pr", "llm"], quick=False):
        q, k, v, cu = peers.inputs(s)
        flops = attn_flops(visible_pairs(s.n, s.causal, s.window), s.head_dim, s.heads)
        default = get_config(s.head_dim, q.dtype, s.causal, arch)
        best: tuple[float, Config] | None = None
        default_ms = float("nan")
        axes = [
            tuple(int(x) for x in part.split(","))
            for part in (grid or "64,128/32,64,128/4,8/2,3,4").split("/")
        ]
        axes += [(0,)] * (5 - len(axes))
        for bm, bn, nw, ns, tma in itertools.product(*axes):
            cfg = Config(bm, bn, nw, ns, bool(tma))
            smem = shared_memory_bytes(cfg, s.head_dim, q.dtype)
            row = {
                "shape": s.name,
                "block_m": bm,
                "block_n": bn,
                "num_warps": nw,
                "num_stages": ns,
                "tma": tma,
            }
            row["smem_est"] = smem
            if smem > limit:
                row.update(ms=float("nan"), tflops=float("nan"), status="skipped: shared memory estimate")
            else:
                try:
                    fn = _graphed(torch, peers.ours(s, q, k, v, cu, config=cfg))
                    ms = bench_ms(fn, warmup=5, rep=25)
                    row.update(ms=ms, tflops=tflops(flops, ms), status="ok")
                    if best is None or ms < best[0]:
                        best = (ms, cfg)
                    if cfg == default:
                        default_ms = ms
                except Exception as exc:
                    row.update(ms=float("nan"), tflops=float("nan"), status=f"error: {type(exc).__name__}")
            row["is_default"] = cfg == default
            rows.append(row)
            print(
                "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                flush=True,
            )
        if best is not None:
            print(
                f"BEST shape={s.name} {best[1]} ms={best[0]:.4g} tflops={tflops(flops, best[0]):.4g} "
                f"(shipped default {default}: ms={default_ms:.4g})",
                flush=True,
            )
        del q, k, v
        torch.cuda.empty_cache()
    return rows


def plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        print(f"no plot ({exc})", flush=True)
        return
    sel = [r for r in rows if r["shape"] == "sweep_n"] or rows
    if not sel:
        return
    fig, ax = plt.subplots(figsize=(7, 5))
    for peer in PEERS:
        pts = sorted((r["n"], r["ms"]) for r in sel if r["peer"] == peer)
        if pts:
            label = peer + (" (full attention)" if peer in FULL_PEERS else "")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    floor = sorted({(r["n"], r["floor_ms"]) for r in sel})
    ax.plot([p[0] for p in floor], [p[1] for p in floor], "k--", label="floor (max of compute, memory)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens N")
    ax.set_ylabel("ms")
    title = (
        "window_prefill, bf16, 8 heads, hd 64, window (64, 64)"
        if sel[0]["shape"] == "sweep_n"
        else "all shapes"
    )
    ax.set_title(f"{title} — {gpu_name()}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="output directory")
    ap.add_argument("--quick", action="store_true", help="fewer N and window points")
    ap.add_argument("--sweep", action="store_true", help="also sweep launch configs on the pr and llm shapes")
    ap.add_argument("--shapes", default="pr,llm,sweep_n,sweep_w", help="comma list of pr,llm,sweep_n,sweep_w")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=V",
                    help="a tuning constant of window_prefill.plan (_GLUON_MIN_WIDTH=4096) or a constexpr "
                         "of the planned kernel (WIDE_OFFSETS=1, through plan_override.py)")  # fmt: skip
    ap.add_argument("--sweep-shapes", default="pr,llm", help="shapes of --sweep")
    ap.add_argument("--peers", default="", help="comma list: time only these peers (default all)")
    ap.add_argument("--tag", default="", help="appended to the output file names")
    ap.add_argument("--rounds", type=int, default=3, help="timing passes over the peers (medians reported)")
    ap.add_argument("--softcap", type=float, default=0.0, help="logit soft-cap for ours and Flex (0: off)")
    ap.add_argument("--return-lse", action="store_true", help="ours also returns the softmax LSE")
    ap.add_argument(
        "--sweep-grid", default=None, help="BMs/BNs/warps/stages[/tma], e.g. 32,64/16,32,64/2,4/2,3,4/0,1"
    )
    args = ap.parse_args(argv)
    kinds = [k.strip() for k in args.shapes.split(",") if k.strip()]
    shapes = make_shapes(kinds, args.quick)

    add_package_paths()
    import torch

    import window_prefill.plan

    constexprs = [kv for kv in args.set if not hasattr(window_prefill.plan, kv.partition("=")[0])]
    set_constants([kv for kv in args.set if kv not in constexprs], ap.error, module="window_prefill.plan")
    with overridden("window_prefill", parse_sets(constexprs, ap.error)):
        return _run(torch, args, shapes)


def _run(torch, args, shapes) -> int:
    global SOFTCAP, RETURN_LSE
    SOFTCAP, RETURN_LSE = args.softcap, args.return_lse
    tag = f"_{args.tag}" if args.tag else ""
    tag += "_lse" if RETURN_LSE else ""
    tag += f"_softcap{args.softcap:g}" if args.softcap > 0 else ""
    stem = "window_prefill" + "".join("_" + s.replace("=", "") for s in args.set) + tag
    if not torch.cuda.is_available():
        print("needs a GPU", file=sys.stderr)
        return 2
    gpu = gpu_name()
    print(f"# {gpu}, torch {torch.__version__}" + (f", {' '.join(args.set)}" if args.set else ""), flush=True)
    if shapes:
        rows = run_peers(shapes, gpu, [p for p in args.peers.split(",") if p], args.rounds)
        if rows:
            csv_path, md_path = write_rows(args.out, stem, rows)
            print(f"wrote {csv_path} {md_path}", flush=True)
            plot(rows, args.out / f"{stem}.png")
    if args.sweep:
        rows = run_sweep(gpu, make_shapes(args.sweep_shapes.split(","), quick=False), args.sweep_grid)
        csv_path, md_path = write_rows(args.out, "window_sweep" + tag, rows)
        print(f"wrote {csv_path} {md_path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
