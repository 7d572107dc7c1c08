"""Benchmark: prefix prefill (paged context + new tokens) across page sizes, ours vs peers.

    python bench/prefix_prefill.py --out DIR [--quick] [--sweep] [--shapes llama,qwen,chunked]
    python bench/prefix_prefill.py --out DIR --set PREFETCH_IDS=0   # a plan constexpr changed (A/B)
    python bench/prefix_prefill.py --out DIR --from-logs RUN.log [MORE.log ...]   # no GPU needed

Writes DIR/prefix_prefill.{csv,md,png} (and DIR/prefix_sweep.{csv,md} with --sweep), rewritten after
each shape so that a run cut by a timeout keeps what it measured; prints one line per measurement.
Each (page, peer) is timed in ``--rounds`` passes (default 3) over all pages, their order rotated
each pass; rows hold the median and the note lists every pass.
``--from-logs`` rebuilds the csv/md/png from the measurement lines of one or more runs' output (a
device run cut before its files came back, plus a second run of the shapes it missed); set
``BENCH_GPU`` and ``BENCH_COMMIT`` to label them. ``--set NAME=V`` runs every plan of ours with that
constexpr changed (``bench/plan_override.py``): two runs, with and without, are an A/B beside the peers
(``bench/ab_prefix.py`` times the two settings against each other in one process).

Everything runs in bf16 with block tables that are a random permutation of the block ids (never the
identity); the cache is built in vLLM's "split" layout, and ours also runs on an NHD copy of it (same
contents, same block table).

Shapes (each over pages 16, 512, 544, 1024, 1040, 1056, 2048):
  llama        32 q / 8 kv heads, head 128, batch 8, context 4096 + 4096 new tokens
  qwen         (qwen-hybrid) 16 q / 2 kv heads, head 256, batch 4, context 8192 + 2048 new tokens
  chunked      one 32768-token prompt in 16 chunks of 2048 (context 0..30720), qwen heads, page
               1056: total time of the 16 calls, ours vs vLLM

Peers:
  ours         prefix_prefill.context_attention_fwd on the split cache (default config table, no autotune)
  ours_nhd     prefix_prefill.prefix_prefill(kv_layout="nhd") on the NHD copy: the layout we recommend
  vllm         vLLM 0.33's context_attention_fwd from .peers (same arguments, same cache)
  flex         torch FlexAttention on contiguous K/V with the block mask ``kv_idx <= q_idx + ctx``
               (the same useful work without paging; it does not depend on the page size, so it is
               measured once per shape and drawn as a horizontal line)
  sdpa_full    torch SDPA (flash backend) on FULL causal attention over ctx + new tokens, also
               contiguous: it computes the context queries too, so it is an upper bound, not a peer
               on equal work (its TFLOP/s counts its own, larger, causal work)

Useful FLOPs = visible (query, key) pairs * heads * 4 * head_size. The floor is max(compute floor,
memory floor) at the card's measured ceilings (bench/common.py); memory = Q + O + every K/V token.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    add_package_paths,
    attn_flops,
    bench_ms,
    floors_ms,
    gpu_name,
    print_rows,
    tflops,
    write_rows,
)

PAGES = [16, 512, 544, 1024, 1040, 1056, 2048]
QUICK_PAGES = [16, 544, 1056]
SHAPES = {
    "llama": {"heads": 32, "kv_heads": 8, "head_size": 128, "batch": 8, "ctx": 4096, "new": 4096},
    "qwen": {"heads": 16, "kv_heads": 2, "head_size": 256, "batch": 4, "ctx": 8192, "new": 2048},
}
ALIASES = {"qwen-hybrid": "qwen", "qwen_hybrid": "qwen"}
KEYS = ["shape", "page", "peer", "ms", "tflops", "floor_ms", "pct_of_floor", "note"]
# --softcap C: ours_nhd computes logits C * tanh(scale * q.k / C) (the other peers do not change)
SOFTCAP = 0.0
# --return-lse: ours_nhd also writes the softmax LSE (return_lse=True, a preallocated buffer)
RETURN_LSE = False


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, type=Path, help="directory for the csv/md/png results")
    p.add_argument("--quick", action="store_true", help="pages 16/544/1056 only, fewer repetitions, no flex")
    p.add_argument("--sweep", action="store_true", help="also time our kernel over a config grid")
    p.add_argument("--shapes", default="llama,qwen,chunked", help="comma list of llama, qwen, chunked")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="a plan constexpr for this run, e.g. PREFETCH_IDS=0 (plan_override.py)")  # fmt: skip
    p.add_argument("--rounds", type=int, default=3, help="timing passes over the pages (medians reported)")
    p.add_argument("--softcap", type=float, default=0.0, help="logit soft-cap for ours_nhd (0: off)")
    p.add_argument("--return-lse", action="store_true", help="ours_nhd also returns the softmax LSE")
    p.add_argument("--from-logs", nargs="+", type=Path, default=None, metavar="LOG",
                   help="rebuild the csv/md/png from these runs' printed lines; measure nothing")  # fmt: skip
    args = p.parse_args(argv)
    from plan_override import parse_sets

    args.consts = parse_sets(args.set, p.error)
    shapes = [ALIASES.get(s.strip(), s.strip()) for s in args.shapes.split(",") if s.strip()]
    bad = [s for s in shapes if s not in (*SHAPES, "chunked")]
    if bad:
        p.error(f"unknown shapes {bad}; choose from llama, qwen, chunked")
    args.shapes = shapes
    return args


# ----------------------------------------------------------------------------------- problems
def make_problem(torch, shape: dict, page: int, seed: int = 0, seq_ctx: list[int] | None = None) -> dict:
    """bf16 q/k/v of the new tokens and a split-layout paged cache holding every token."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    h, hkv, d, b = shape["heads"], shape["kv_heads"], shape["head_size"], shape["batch"]
    ctxs = seq_ctx or [shape["ctx"]] * b
    new = shape["new"]
    dt = torch.bfloat16
    seq_lens = [c + new for c in ctxs]
    pages = [math.ceil(n / page) for n in seq_lens]
    nb = sum(pages) + 1
    x = 16 // 2
    k_cache = torch.randn(nb, hkv, d // x, page, x, device="cuda", dtype=dt, generator=g)
    v_cache = torch.randn(nb, hkv, d, page, device="cuda", dtype=dt, generator=g)
    perm = torch.randperm(nb, device="cuda", generator=g)
    if bool((perm == torch.arange(nb, device="cuda")).all()):
        perm = perm.roll(1)
    table = torch.zeros(len(ctxs), max(pages), dtype=torch.int32, device="cuda")
    at = 0
    for i, n in enumerate(pages):
        table[i, :n] = perm[at : at + n].to(torch.int32)
        at += n
    total = new * len(ctxs)
    q = torch.randn(total, h, d, device="cuda", dtype=dt, generator=g)
    k = torch.randn(total, hkv, d, device="cuda", dtype=dt, generator=g)
    v = torch.randn(total, hkv, d, device="cuda", dtype=dt, generator=g)
    cu = torch.arange(0, total + 1, new, dtype=torch.int32, device="cuda")
    return {
        "q": q,
        "k": k,
        "v": v,
        "o": torch.empty_like(q),
        "k_cache": k_cache,
        "v_cache": v_cache,
        "block_table": table,
        "cu": cu,
        "seq_lens": torch.tensor(seq_lens, dtype=torch.int32, device="cuda"),
        "max_seq": max(seq_lens),
        "max_q": new,
        "scale": torch.ones(1, dtype=torch.float32, device="cuda"),
        "ctxs": ctxs,
        "new": new,
        "shape": shape,
    }


def useful_work(prob: dict) -> tuple[float, float]:
    """(useful FLOPs, bytes moved at least once) of one call."""
    s = prob["shape"]
    h, hkv, d, new = s["heads"], s["kv_heads"], s["head_size"], prob["new"]
    pairs = sum(c * new + new * (new + 1) // 2 for c in prob["ctxs"])
    flops = attn_flops(pairs, d, h)
    tokens_q = new * len(prob["ctxs"])
    tokens_kv = sum(c + new for c in prob["ctxs"])
    nbytes = 2 * (2 * tokens_q * h * d + 2 * tokens_kv * hkv * d)
    return flops, nbytes


def call_ours(prob: dict):
    from prefix_prefill import context_attention_fwd

    def fn():
        context_attention_fwd(
            prob["q"], prob["k"], prob["v"], prob["o"], "auto", prob["k_cache"], prob["v_cache"],
            prob["block_table"], prob["cu"], prob["seq_lens"], prob["max_seq"], prob["max_q"],
            prob["scale"], prob["scale"],
        )  # fmt: skip

    return fn


def to_nhd(prob: dict) -> tuple:
    """The same cache contents in the NHD layout ``[num_blocks, page, Hkv, D]`` (K and V)."""
    kc, vc = prob["k_cache"], prob["v_cache"]
    nb, hkv, dx, page, x = kc.shape
    k_nhd = kc.permute(0, 3, 1, 2, 4).reshape(nb, page, hkv, dx * x).contiguous()
    v_nhd = vc.permute(0, 3, 1, 2).contiguous()
    return k_nhd, v_nhd


def call_ours_nhd(prob: dict, caches: tuple, out):
    """Our Pythonic entry point on the NHD copy of the cache (same block table, same work)."""
    from prefix_prefill import prefix_prefill

    kw = {"softcap": SOFTCAP} if SOFTCAP > 0 else {}
    if RETURN_LSE:
        q = prob["q"]
        import torch

        kw.update(return_lse=True, lse=q.new_empty(q.shape[1], q.shape[0], dtype=torch.float32))

    def fn():
        prefix_prefill(
            prob["q"], prob["k"], prob["v"], caches[0], caches[1], prob["block_table"], prob["cu"],
            prob["seq_lens"], prob["max_q"], kv_layout="nhd", out=out, **kw,
        )  # fmt: skip

    return fn


def call_vllm(prob: dict, out):
    try:
        from vllm.v1.attention.ops.prefix_prefill import context_attention_fwd as vllm_fwd
    except Exception as e:  # .peers missing or broken
        print(f"# vLLM peer unavailable: {e}", flush=True)
        return None

    def fn():
        vllm_fwd(
            prob["q"], prob["k"], prob["v"], out, "auto", prob["k_cache"], prob["v_cache"],
            prob["block_table"], prob["cu"], prob["seq_lens"], prob["max_seq"], prob["max_q"],
            prob["scale"], prob["scale"],
        )  # fmt: skip

    return fn


def row(shape: str, page, peer: str, ms: float, flops: float, floor: float, note: str = "") -> dict:
    return {
        "shape": shape,
        "page": page,
        "peer": peer,
        "ms": ms,
        "tflops": tflops(flops, ms),
        "floor_ms": floor,
        "pct_of_floor": 100.0 * floor / ms,
        "note": note,
    }


# ------------------------------------------------------------------------------ contiguous peers
def contiguous_peers(torch, name: str, shape: dict, quick: bool, reps: dict) -> list[dict]:
    """FlexAttention with the prefix-aware mask, and SDPA on full causal attention (upper bound)."""
    import torch.nn.functional as F

    h, hkv, d, b = shape["heads"], shape["kv_heads"], shape["head_size"], shape["batch"]
    ctx, new = shape["ctx"], shape["new"]
    total = ctx + new
    dt = torch.bfloat16
    q = torch.randn(b, h, new, d, device="cuda", dtype=dt)
    k = torch.randn(b, hkv, total, d, device="cuda", dtype=dt)
    v = torch.randn(b, hkv, total, d, device="cuda", dtype=dt)
    pairs = b * (ctx * new + new * (new + 1) // 2)
    flops = attn_flops(pairs, d, h)
    nbytes = 2 * (2 * b * new * h * d + 2 * b * total * hkv * d)
    floor = max(floors_ms(flops, nbytes))
    rows = []
    if not quick:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention

            def prefix_causal(b_, h_, q_idx, kv_idx):
                return kv_idx <= q_idx + ctx

            mask = create_block_mask(prefix_causal, None, None, new, total, device="cuda")
            flex = torch.compile(flex_attention)

            def run_flex():
                flex(q, k, v, block_mask=mask, enable_gqa=True)

            ms = bench_ms(run_flex, **reps)
            rows.append(row(name, "-", "flex", ms, flops, floor, "contiguous K/V, block mask kv<=q+ctx"))
        except Exception as e:
            print(f"# flex attention skipped: {type(e).__name__}: {e}", flush=True)
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        qf = torch.randn(b, h, total, d, device="cuda", dtype=dt)
        kf = k.repeat_interleave(h // hkv, dim=1)
        vf = v.repeat_interleave(h // hkv, dim=1)
        full_pairs = b * total * (total + 1) // 2
        full_flops = attn_flops(full_pairs, d, h)

        def run_sdpa():
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
                F.scaled_dot_product_attention(qf, kf, vf, is_causal=True)

        ms = bench_ms(run_sdpa, **reps)
        rows.append(
            row(name, "-", "sdpa_full", ms, full_flops, floor, "full causal over ctx+new: upper bound")
        )
    except Exception as e:
        print(f"# sdpa skipped: {type(e).__name__}: {e}", flush=True)
    return rows


# ------------------------------------------------------------------------------------ sections
def bench_shape(torch, name: str, pages: list[int], reps: dict, rounds: int = 1) -> list[dict]:
    """Ours (split and NHD caches) and vLLM at every page. Every page's problem is built first; then
    ``rounds`` passes time each (page, peer), the pages in a rotated order each pass, and a row holds
    the median (the card's clocks drift by a few % over a run: one pass per page would read that
    drift as a page difference; bench/results/NOTES.md step 46)."""
    import statistics

    shape = SHAPES[name]
    calls: dict[int, list[tuple[str, object, str]]] = {}  # page -> [(peer, fn, note)]
    work: dict[int, tuple[float, float]] = {}
    keep = []  # problems and outputs stay alive until every round ran
    for page in pages:
        prob = make_problem(torch, shape, page)
        flops, nbytes = useful_work(prob)
        work[page] = (flops, max(floors_ms(flops, nbytes)))
        ours = call_ours(prob)
        ours()
        entries = [("ours", ours, "split layout (vLLM's)")]
        out_n = torch.empty_like(prob["q"])
        nhd = call_ours_nhd(prob, to_nhd(prob), out_n)
        nhd()
        diff = float((out_n.float() - prob["o"].float()).abs().max())
        note = f"NHD layout; max|nhd-split|={diff:.3g}"
        if SOFTCAP > 0:
            note = f"NHD layout, softcap {SOFTCAP:g} (split uncapped: max|nhd-split|={diff:.3g})"
        entries.append(("ours_nhd", nhd, note))
        out_v = torch.empty_like(prob["q"])
        vllm = call_vllm(prob, out_v)
        if vllm is not None:
            vllm()
            diff = float((out_v.float() - prob["o"].float()).abs().max())
            entries.append(("vllm", vllm, f"max|ours-vllm|={diff:.3g}"))
        calls[page] = entries
        keep.append((prob, out_n, out_v))
    times: dict[tuple[int, str], list[float]] = {}
    for rnd in range(rounds):
        for page in pages[rnd % len(pages) :] + pages[: rnd % len(pages)]:
            for peer, fn, _ in calls[page]:
                times.setdefault((page, peer), []).append(bench_ms(fn, **reps))
    rows = []
    for page in pages:
        flops, floor = work[page]
        new_rows = []
        for peer, _, note in calls[page]:
            t = times[page, peer]
            if rounds > 1:
                note += f"; median of {rounds} rounds " + "/".join(f"{x:.3f}" for x in t)
            new_rows.append(row(name, page, peer, statistics.median(t), flops, floor, note))
        print_rows(new_rows, KEYS)
        rows += new_rows
    del calls, keep
    torch.cuda.empty_cache()
    return rows


def bench_chunked(torch, reps: dict) -> list[dict]:
    """One 32768-token prompt in 16 chunks of 2048 at page 1056: total time of the 16 calls."""
    shape = dict(SHAPES["qwen"], batch=1, new=2048)
    chunks = 16
    prompt = chunks * shape["new"]
    prob = make_problem(torch, dict(shape, ctx=prompt - shape["new"]), 1056)  # cache sized for the prompt
    calls_ours, calls_vllm, flops, nbytes = [], [], 0.0, 0.0
    from prefix_prefill import context_attention_fwd

    try:
        from vllm.v1.attention.ops.prefix_prefill import context_attention_fwd as vllm_fwd
    except Exception as e:
        print(f"# vLLM peer unavailable: {e}", flush=True)
        vllm_fwd = None
    out_v = torch.empty_like(prob["q"])
    for i in range(chunks):
        ctx = i * shape["new"]
        seq_lens = torch.tensor([ctx + shape["new"]], dtype=torch.int32, device="cuda")
        part = dict(prob, ctxs=[ctx])
        f, nb = useful_work(part)
        flops, nbytes = flops + f, nbytes + nb
        args = (
            prob["block_table"], prob["cu"], seq_lens, ctx + shape["new"], shape["new"],
            prob["scale"], prob["scale"],
        )  # fmt: skip
        calls_ours.append((prob["o"], args))
        calls_vllm.append((out_v, args))

    def run(fwd, calls):
        def fn():
            for o, args in calls:
                fwd(prob["q"], prob["k"], prob["v"], o, "auto", prob["k_cache"], prob["v_cache"], *args)

        return fn

    floor = max(floors_ms(flops, nbytes))
    rows = []
    fn = run(context_attention_fwd, calls_ours)
    fn()
    rows.append(row("chunked", 1056, "ours", bench_ms(fn, **reps), flops, floor, "16 chunks of 2048, total"))
    from prefix_prefill import prefix_prefill

    k_nhd, v_nhd = to_nhd(prob)

    def run_nhd():
        for o, args in calls_ours:
            prefix_prefill(
                prob["q"], prob["k"], prob["v"], k_nhd, v_nhd, args[0], args[1], args[2], args[4],
                kv_layout="nhd", out=o,
            )  # fmt: skip

    run_nhd()
    note = "16 chunks of 2048, total, NHD layout"
    rows.append(row("chunked", 1056, "ours_nhd", bench_ms(run_nhd, **reps), flops, floor, note))
    if vllm_fwd is not None:
        fn = run(vllm_fwd, calls_vllm)
        fn()
        rows.append(
            row("chunked", 1056, "vllm", bench_ms(fn, **reps), flops, floor, "16 chunks of 2048, total")
        )
    print_rows(rows, KEYS)
    return rows


def sweep(torch, out_dir: Path, reps: dict) -> list[dict]:
    """Time our kernel over a config grid at pages 544 and 1024 for llama and qwen."""
    from paged_kv_offsets import describe_kv_cache
    from prefix_prefill.configs import KernelConfig
    from prefix_prefill.launch import forward

    rows = []
    for name in ("llama", "qwen"):
        for page in (544, 1024):
            prob = make_problem(torch, SHAPES[name], page)
            kc, vc = describe_kv_cache(prob["k_cache"], prob["v_cache"], "split")
            flops, _ = useful_work(prob)
            best = None
            for bm in (64, 128):
                for bnc in (32, 64, 128):
                    for w in (4, 8):
                        for s in (2, 3):
                            cfg = KernelConfig(bm, 64, bnc, w, s)

                            def fn(cfg=cfg, p=prob, kc=kc, vc=vc):
                                forward(
                                    p["q"], p["k"], p["v"], p["o"], p["k_cache"], p["v_cache"], kc, vc,
                                    p["block_table"], p["cu"], p["seq_lens"], p["max_q"], config=cfg,
                                )  # fmt: skip

                            try:
                                fn()
                                ms = bench_ms(fn, **reps)
                            except Exception as e:  # out of shared memory / registers
                                print(f"# {name} page {page} {cfg}: {type(e).__name__}", flush=True)
                                continue
                            r = {
                                "shape": name,
                                "page": page,
                                **cfg.as_dict(),
                                "ms": ms,
                                "tflops": tflops(flops, ms),
                            }
                            print_rows([r], list(r))
                            rows.append(r)
                            if best is None or ms < best["ms"]:
                                best = r
            if best is not None:
                print(f"BEST {name} page {page}: {best}", flush=True)
            del prob
            torch.cuda.empty_cache()
    write_rows(out_dir, "prefix_sweep", rows)
    return rows


def plot(rows: list[dict], out_dir: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        print(f"# no plot: {e}", flush=True)
        return None
    names = [n for n in SHAPES if any(r["shape"] == n for r in rows)]
    if not names:
        return None
    fig, axes = plt.subplots(1, len(names), figsize=(6.5 * len(names), 4.5), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        rs = [r for r in rows if r["shape"] == name]
        pages = sorted({r["page"] for r in rs if r["page"] != "-"})
        xs = list(range(len(pages)))
        labels = {"ours": "ours (split cache)", "ours_nhd": "ours (NHD cache)", "vllm": "vLLM 0.33 (split)"}
        for peer, style in (("ours", "o-"), ("ours_nhd", "^-"), ("vllm", "s-")):
            pts = {r["page"]: r["ms"] for r in rs if r["peer"] == peer}
            if pts:
                ax.plot([xs[pages.index(p)] for p in pts], list(pts.values()), style, label=labels[peer])
        floors = {r["page"]: r["floor_ms"] for r in rs if r["peer"] == "ours"}
        if floors:
            ax.plot(xs, [floors[p] for p in pages], "k-", lw=1, label="floor")
        for r in rs:
            if r["peer"] == "flex":
                ax.axhline(r["ms"], ls="--", color="tab:green", label="flex (contiguous)")
        ax.set_xticks(xs, [str(p) for p in pages])
        ax.set_xlabel("page size (tokens)")
        ax.set_ylabel("ms (median)")
        ax.set_ylim(bottom=0)
        s = SHAPES[name]
        ax.set_title(f"{name}: {s['heads']}/{s['kv_heads']} heads, d{s['head_size']}, {s['ctx']}+{s['new']}")
        ax.legend()
    fig.suptitle(f"prefix prefill, bf16, shuffled block tables ({gpu_name()})")
    fig.tight_layout()
    path = out_dir / "prefix_prefill.png"
    fig.savefig(path, dpi=120)
    return path


def rows_from_logs(paths: list[Path]) -> list[dict]:
    """The measurement lines (``shape=...  page=...  peer=...  ms=...``) of earlier runs, as rows; a
    later line for the same (shape, page, peer) replaces an earlier one."""
    found: dict[tuple, dict] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            if not line.startswith("shape=") or "  ms=" not in line:
                continue
            r = {}
            for field in line.split("  "):
                key, _, value = field.strip().partition("=")
                for conv in (int, float):
                    try:
                        value = conv(value)
                        break
                    except ValueError:
                        pass
                r[key] = value
            if set(KEYS) <= set(r):
                found[(r["shape"], r["page"], r["peer"])] = {k: r[k] for k in KEYS}
    return list(found.values())


def _write_all(rows: list[dict], out_dir: Path) -> None:
    csv_path, md_path = write_rows(out_dir, "prefix_prefill", rows)
    png = plot(rows, out_dir)
    print(f"# wrote {csv_path}, {md_path}" + (f", {png}" if png else ""), flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_logs:
        rows = rows_from_logs(args.from_logs)
        if not rows:
            print("no measurement lines in the logs", file=sys.stderr)
            return 2
        _write_all(rows, args.out)
        return 0
    import torch

    if not torch.cuda.is_available():
        print("this benchmark needs a CUDA/ROCm device", file=sys.stderr)
        return 2
    add_package_paths()
    from plan_override import overridden

    args.out.mkdir(parents=True, exist_ok=True)
    with overridden("prefix_prefill", args.consts):
        return _run(torch, args)


def _run(torch, args) -> int:
    reps = {"warmup": 10, "rep": 30} if args.quick else {"warmup": 25, "rep": 100}
    pages = QUICK_PAGES if args.quick else PAGES
    switches = args.set or "the plans'"
    global SOFTCAP, RETURN_LSE
    SOFTCAP, RETURN_LSE = args.softcap, args.return_lse
    cap = f", ours_nhd softcap {SOFTCAP:g}" if SOFTCAP > 0 else ""
    cap += ", ours_nhd returns the LSE" if RETURN_LSE else ""
    print(f"# {gpu_name()}, shapes {args.shapes}, pages {pages}, switches {switches}{cap}", flush=True)
    rows: list[dict] = []
    for name in args.shapes:
        if name == "chunked":
            rows += bench_chunked(torch, reps)
        else:
            rows += bench_shape(torch, name, pages, reps, args.rounds)
            extra = contiguous_peers(torch, name, SHAPES[name], args.quick, reps)
            print_rows(extra, KEYS)
            rows += extra
        if rows:  # after every shape: a run cut by its time limit keeps what it measured
            _write_all(rows, args.out)
    if args.sweep:
        sweep(torch, args.out, {"warmup": 5, "rep": 20})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
