"""Shared benchmark helpers: timing, FLOP/byte floors, device ceilings and result files.

Every benchmark script imports from here so that all numbers in bench/results/ are computed the
same way: medians of ``triton.testing.do_bench`` (milliseconds), useful FLOPs counted from the
visible (unmasked) query-key pairs, and the H200 ceilings measured on 2026-11-29.
"""

from __future__ import annotations

import csv
import datetime as _dt
import os
import subprocess
import sys
from pathlib import Path

# Card ceilings (H200, measured 2026-11-29): bf16 dense matrix rate and device copy bandwidth.
PEAK_TFLOPS = {"NVIDIA H200": 796.0}
PEAK_TBPS = {"NVIDIA H200": 4.27}
ROOT = Path(__file__).resolve().parents[1]


def add_package_paths() -> None:
    """Make the packages importable from a source checkout (no install needed, as on the device).

    Also drops bench/ itself from ``sys.path``: the scripts ``bench/prefix_prefill.py`` and
    ``bench/window_prefill.py`` would otherwise shadow the packages of the same name.
    ``BENCH_PACKAGES=DIR`` puts DIR/*/src first instead (an A/B against another tree's packages, e.g.
    ``git archive OLD packages | tar x -C /tmp/old``, then ``BENCH_PACKAGES=/tmp/old/packages``);
    ``BENCH_PACKAGES=installed`` adds nothing: the packages come from the environment's install."""
    bench_dir = os.path.realpath(os.path.dirname(__file__))
    sys.path[:] = [p for p in sys.path if not p or os.path.realpath(p) != bench_dir]
    if os.environ.get("BENCH_PACKAGES") == "installed":  # the installed packages (nox -s demo-cpu)
        return
    packages = Path(os.environ.get("BENCH_PACKAGES") or ROOT / "packages")
    for src in sorted(packages.glob("*/src")):
        if str(src) not in sys.path:
            sys.path.insert(0, str(src))
    peers = ROOT / ".peers"
    if peers.is_dir() and str(peers) not in sys.path:
        sys.path.append(str(peers))


def start(interpret: bool) -> None:
    """Every script's first step, before torch or triton is imported: with ``interpret`` the kernels
    run under the Triton interpreter (CPU smoke runs); the packages' ``src/`` go on ``sys.path``."""
    if interpret:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    add_package_paths()


def on_gpu_node() -> bool:
    """True on a machine with an NVIDIA or AMD GPU driver (checked without importing torch)."""
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/kfd")


def uniform_prefix_problem(
    torch, *, batch: int, heads: int, kv_heads: int, head_dim: int, ctx: int, new: int, page: int,
    layout: str, device: str, dtype, spare: int = 1, gen=None,
) -> dict:  # fmt: skip
    """``batch`` sequences of ``ctx`` cached + ``new`` query tokens: :func:`prefix_problem` with one
    length pair for all."""
    return prefix_problem(torch, seqs=[(ctx, new)] * batch, heads=heads, kv_heads=kv_heads,
                          head_dim=head_dim, page=page, layout=layout, device=device, dtype=dtype,
                          spare=spare, gen=gen)  # fmt: skip


def prefix_problem(
    torch, *, seqs: list[tuple[int, int]], heads: int, kv_heads: int, head_dim: int, page: int, layout: str,
    device: str, dtype, spare: int = 1, gen=None,
) -> dict:  # fmt: skip
    """Sequences of ``(ctx, new)`` tokens (``ctx`` cached + ``new`` query tokens each) in a paged cache
    ("split": vLLM's ``[blocks, H, D/8, page, 8]`` / ``[blocks, H, D, page]``; "nhd": ``[blocks, page,
    H, D]``; "hnd": ``[blocks, H, page, D]``) with shuffled block ids and ``spare`` unused blocks; a
    block-table row past its sequence's pages holds 0 (never read). Keys: q, k, v (the new tokens,
    packed), k_cache, v_cache, block_table, cu, seq_lens (int32 tensors on ``device``), pages (per
    sequence, a list)."""
    pages = [-(-(c + n) // page) for c, n in seqs]
    nb = sum(pages) + spare
    total = sum(n for _, n in seqs)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype) if gen is not None else (
            torch.randn(*shape, device=device, dtype=dtype))  # fmt: skip

    if layout == "split":
        k_cache, v_cache = randn(nb, kv_heads, head_dim // 8, page, 8), randn(nb, kv_heads, head_dim, page)
    elif layout == "nhd":
        k_cache, v_cache = randn(nb, page, kv_heads, head_dim), randn(nb, page, kv_heads, head_dim)
    elif layout == "hnd":
        k_cache, v_cache = randn(nb, kv_heads, page, head_dim), randn(nb, kv_heads, page, head_dim)
    else:
        raise ValueError(f"layout must be 'split', 'nhd' or 'hnd', got {layout!r}")
    perm = torch.randperm(nb, generator=gen) if gen is not None else torch.randperm(nb)
    table = torch.zeros(len(seqs), max(pages), dtype=torch.int32)
    at = 0
    for b, n in enumerate(pages):
        table[b, :n] = perm[at : at + n].to(torch.int32)
        at += n
    starts = [0]
    for _, n in seqs:
        starts.append(starts[-1] + n)
    return {
        "q": randn(total, heads, head_dim),
        "k": randn(total, kv_heads, head_dim),
        "v": randn(total, kv_heads, head_dim),
        "k_cache": k_cache,
        "v_cache": v_cache,
        "block_table": table.to(device),
        "cu": torch.tensor(starts, dtype=torch.int32, device=device),
        "seq_lens": torch.tensor([c + n for c, n in seqs], dtype=torch.int32, device=device),
        "pages": pages,
    }


def exact_paged_layout(torch, pages: list[int], width: int, far: int, layout: str, kv: int, d: int,
                       page: int, x: int) -> tuple:  # fmt: skip
    """A cache of exactly the pages the sequences hold (``pages[b]`` each, ``nb = sum(pages)`` blocks, no
    spare) for the memcheck scripts: ``(table, k_shape, v_shape)``, the int32 block table ``[batch,
    width]`` (shuffled ids; entries past a sequence's ``width`` pages hold ``far``, outside the cache) on
    the host, and the caches' shapes in ``layout`` (``x``: the split K layout's last dimension)."""
    nb = sum(pages)
    perm = torch.randperm(nb)
    table = torch.full((len(pages), width), far, dtype=torch.int32)
    at = 0
    for b, n in enumerate(pages):
        m = min(n, width)
        table[b, :m] = perm[at : at + m].to(torch.int32)
        at += n
    if layout == "split":
        return table, (nb, kv, d // x, page, x), (nb, kv, d, page)
    if layout == "nhd":
        return table, (nb, page, kv, d), (nb, page, kv, d)
    return table, (nb, kv, page, d), (nb, kv, page, d)


def run_device(smoke: bool, gpu_dtype):
    """``(device, dtype)`` of a benchmark run: ``("cpu", torch.float16)`` with ``--smoke`` (the
    interpreter cannot multiply bfloat16), ``("cuda", gpu_dtype)`` on a CUDA device, else None after a
    line on stderr (the caller exits 2)."""
    import torch

    if smoke:
        return "cpu", torch.float16
    if not torch.cuda.is_available():
        print("this benchmark needs a CUDA device (or --smoke)", file=sys.stderr)
        return None
    return "cuda", gpu_dtype


def gpu_name() -> str:
    """``BENCH_GPU`` when set (results rebuilt away from the GPU), else the CUDA device's name."""
    if os.environ.get("BENCH_GPU"):
        return os.environ["BENCH_GPU"]
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def commit() -> str:
    """``BENCH_COMMIT`` when set (the device machine's copy of .git can be older than the tree it
    runs: seen 2026-11-29, results labelled with an older commit), else git HEAD."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True).strip()
    except Exception:
        return "unknown"


def today() -> str:
    return _dt.date.today().isoformat()


def settle() -> None:
    """Wait for the kernels compiling in the background: prefix-prefill's compile tiers (a first call
    runs a quick-compiling form while the full form compiles in a thread), so timings see the form an
    engine runs after warm-up."""
    mod = sys.modules.get("prefix_prefill")
    if mod is not None:
        mod.finish_compiles()


def bench_ms(fn, warmup: int = 25, rep: int = 100) -> float:
    """Median milliseconds of ``fn()`` by triton.testing.do_bench (device events, L2 flushed), after a
    first call and :func:`settle`."""
    import triton

    fn()
    settle()
    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def alibi_slopes(torch, heads: int, device: str):
    """The usual ALiBi slopes ``2 ** (-8 (h + 1) / heads)``, float32 ``[heads]``, for the benches' calls."""
    return 2.0 ** (-8.0 * torch.arange(1, heads + 1, device=device, dtype=torch.float32) / heads)


def attn_flops(pairs: int, head_dim: int, heads: int, head_dim_v: int | None = None) -> float:
    """Useful FLOPs of attention over ``pairs`` visible (query, key) pairs per head:
    2*D for QK^T plus 2*Dv for PV, per pair, per head."""
    dv = head_dim if head_dim_v is None else head_dim_v
    return float(pairs) * heads * 2.0 * (head_dim + dv)


def tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12


def floors_ms(flops: float, nbytes: float, gpu: str | None = None) -> tuple[float, float]:
    """(compute floor, memory floor) in ms at the card's measured ceilings."""
    gpu = gpu or gpu_name()
    peak = PEAK_TFLOPS.get(gpu, 796.0)
    bw = PEAK_TBPS.get(gpu, 4.27)
    return flops / (peak * 1e12) * 1e3, nbytes / (bw * 1e12) * 1e3


def write_rows(out_dir: Path, stem: str, rows: list[dict]) -> tuple[Path, Path]:
    """Write ``rows`` (dicts with the same keys) as ``stem.csv`` and a markdown table ``stem.md``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    keys: list[str] = []
    for r in rows:
        for k in r:
            if k not in keys:
                keys.append(k)
    csv_path = out_dir / f"{stem}.csv"
    with csv_path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    md_path = out_dir / f"{stem}.md"

    def fmt(v):
        return f"{v:.4g}" if isinstance(v, float) else str(v).replace("|", "\\|")

    lines = [
        f"<!-- {gpu_name()}, {today()}, commit {commit()} -->",
        "| " + " | ".join(keys) + " |",
        "|" + "---|" * len(keys),
    ]
    lines += ["| " + " | ".join(fmt(r.get(k, "")) for k in keys) + " |" for r in rows]
    md_path.write_text("\n".join(lines) + "\n")
    return csv_path, md_path


def print_rows(rows: list[dict], keys: list[str]) -> None:
    """One line per row, flushed, so long runs show progress."""
    for r in rows:
        print(
            "  ".join(f"{k}={r[k]:.4g}" if isinstance(r.get(k), float) else f"{k}={r.get(k)}" for k in keys),
            flush=True,
        )


def window_bench_module():
    """bench/window_prefill.py (shapes, peers, CUDA-graph helper) as a module, loaded by path like
    :func:`prefix_bench_module`; registered in ``sys.modules`` first (its dataclasses need it)."""
    import importlib.util

    name = "_bench_window"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / "window_prefill.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != str(ROOT / "bench")]
    return mod


def prefix_bench_module():
    """bench/prefix_prefill.py (problem builders, shapes, peers) as a module, loaded by path: its
    name would shadow the ``prefix_prefill`` package. Takes bench/ back off ``sys.path`` after."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_bench_pp", ROOT / "bench" / "prefix_prefill.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != str(ROOT / "bench")]
    return mod


def set_constants(sets: list[str], error, module: str) -> None:
    """Apply ``--set NAME=VALUE`` options to a kernel package's plan module (``prefix_prefill.plan``,
    ``window_prefill.plan``): NAME one of its int tuning constants (``NAME=N``; a per-head-size table of
    ints, such as ``_GLUON_MIN_WIDTH``, takes N at every head size) or booleans (``NAME=0|1``), set
    before the first call; ``error(msg)`` reports a bad one (argparse's ``ap.error``). Plan overrides of
    single constexprs are :mod:`plan_override`'s."""
    import importlib

    mod = importlib.import_module(module)
    for kv in sets:
        name, _, val = kv.partition("=")
        cur = getattr(mod, name, None)
        if isinstance(cur, bool) and val in ("0", "1"):
            setattr(mod, name, val == "1")
        elif isinstance(cur, int) and not isinstance(cur, bool) and val.isdigit():
            setattr(mod, name, int(val))
        elif isinstance(cur, dict) and cur and all(type(x) is int for x in cur.values()) and val.isdigit():
            setattr(mod, name, dict.fromkeys(cur, int(val)))
        else:
            error(f"--set {kv}: expected NAME=0|1 or NAME=N with NAME a bool or int constant of {module}")
    if hasattr(getattr(mod, "plan", None), "cache_clear"):
        mod.plan.cache_clear()  # plans made before the change
