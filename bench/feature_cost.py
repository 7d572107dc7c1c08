"""What each model feature costs against the plain call, for both kernel packages (issue 46's table).

    python bench/feature_cost.py --out DIR [--quick] [--rounds N] [--packages prefix,window] [--dtype fp16]
                                 [--layouts nhd,split,hnd] [--pages 16,1056] [--heads 128,256]
                                 [--features a,b] [--set NAME=V ...]
    python bench/feature_cost.py --smoke --out DIR      # CPU: Triton interpreter, tiny shapes, fp16

Writes DIR/feature_cost.{csv,md}, rewritten after each group (package, layout, page, head) so that a run
cut by its time limit keeps what it measured; prints one line per row.

Problems (bf16, block tables a random permutation of the block ids):
  prefix  heads 64 (``--heads 64``, not in the default table) and 128: 8 sequences of 4096 cached + 4096
          new tokens, 32 q / 8 kv heads;
          head 256: 4 sequences of 8192 cached + 2048 new tokens, 16 q / 2 kv heads;
          vLLM's split cache and the NHD cache (``--layouts``: the HND cache too), pages 16 and 1056
          (``prefix_prefill.prefix_prefill`` with ``kv_layout``; ``skip_decode`` through
          ``context_attention_fwd``, split cache only)
  window  one 8192-token causal sequence: heads 64 and 128 with 32 q / 8 kv heads, head 256 with 16 / 2
          (``window_prefill.window_prefill``)

Features (one row each; ``plain`` first): fp8 e4m3 / e5m2 KV caches with per-tensor scales, sinks (both
modes in window-prefill), soft-capping 50, ALiBi, non-causal prefix calls, sliding windows left 4095,
1023, 511 and 127 (the narrow ones measure the plans' width rule), ``skip_decode``, the LSE, and the
combinations real models use: window 127 + sinks (gpt-oss sliding layers), soft-capping + window 4095
(Gemma 2 local layers), fp8 cache + window 4095, window 4095 + sinks; fp8 e4m3 / e5m2 outputs
(prefix-prefill).

Columns: ``kernel`` and ``reason`` are the plan's (``explain()``); ``ms`` the median over ``--rounds``
passes (>= 3; the row order rotated each pass, every pass in ``rounds_ms``) of
``triton.testing.do_bench`` medians, after ``prefix_prefill.finish_compiles()``; ``tflops`` the useful
TFLOP/s (visible query-key pairs * heads * 4 * head size); ``work`` the row's useful FLOPs over the
plain call's; ``ms_ratio`` its time over the plain call's; ``cost`` its time over the time of its useful
work at the plain call's TFLOP/s (``ms_ratio / work``: the ratio for a feature that keeps the work, the
inverse of the TFLOP/s ratio for a window); ``bound`` issue 46's acceptance bound on ``cost`` (1.05 a
feature; 1.0 an fp8 cache, against the bf16 cache; 1 / 0.9 a window whose rows see >= 2048 keys; 1.3 a
narrower window) and ``meets`` whether the row is within it; ``vs_nhd`` a split or HND row's time over
the NHD row's of the same page, head and feature (issue 46: <= 1.05).

``--set NAME=V``: an int or boolean constant of ``prefix_prefill.plan`` and/or ``window_prefill.plan``
(whichever has it) set before the first call, e.g. ``--set GLUON_MIN_WINDOW=1 --set _GLUON_MIN_WIDTH=1``
runs narrow windows on the Gluon kernels (the default run gives the Triton rows beside them).

``--quick``: head 128, page 16, both layouts, the features of :data:`QUICK` (under 4 minutes on an H200,
compiles included). The full table takes two device calls: ``--heads 128`` and ``--heads 256``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (
    alibi_slopes,
    bench_ms,
    run_device,
    set_constants,
    settle,
    start,
    tflops,
    uniform_prefix_problem,
    write_rows,
)

SMOKE = "--smoke" in sys.argv
start(interpret=SMOKE)

import torch  # noqa: E402

KEYS = ["package", "layout", "page", "head", "feature", "kernel", "ms", "tflops", "work", "ms_ratio", "cost",
        "bound", "meets", "vs_nhd", "rounds_ms", "reason"]  # fmt: skip
WIDE_KEYS = 2048  # issue 46: a window whose rows see at least this many keys keeps 0.9x the plain TFLOP/s


@dataclass(frozen=True)
class Feature:
    """One row's options. ``window``: the left window (causal calls), -1 off; ``sinks``: a sinks mode
    (``"denominator"``, or ``"bias_key0"`` in window-prefill), None off; ``fp8``: the KV cache's fp8
    format (``"e4m3"``, ``"e5m2"``), None a bf16 cache; ``out_fp8``: the output's fp8 format (written as
    ``clamp(out / fp8_out_scale)``), None q's dtype; ``causal`` False: every new
    token sees every other (prefix-prefill only)."""

    name: str
    window: int = -1
    sinks: str | None = None
    softcap: float = 0.0
    alibi: bool = False
    fp8: str | None = None
    out_fp8: str | None = None
    skip_decode: bool = False
    lse: bool = False
    causal: bool = True

    def bound(self) -> float:
        """Issue 46's acceptance bound on the row's ``cost``."""
        if self.window >= 0:
            return 1 / 0.9 if self.window + 1 >= WIDE_KEYS else 1.3
        return 1.0 if self.fp8 else 1.05


PLAIN = Feature("plain")
PREFIX = [
    PLAIN,
    Feature("fp8_e4m3", fp8="e4m3"),
    Feature("fp8_e5m2", fp8="e5m2"),
    Feature("sinks", sinks="denominator"),
    Feature("softcap50", softcap=50.0),
    Feature("alibi", alibi=True),
    Feature("window4095", window=4095),
    Feature("window63", window=63),
    Feature("window127", window=127),
    Feature("window511", window=511),
    Feature("window1023", window=1023),
    Feature("window1535", window=1535),
    Feature("window2047", window=2047),
    Feature("skip_decode", skip_decode=True),
    Feature("noncausal", causal=False),
    Feature("lse", lse=True),
    Feature("window127+sinks", window=127, sinks="denominator"),
    Feature("softcap50+window4095", window=4095, softcap=50.0),
    Feature("fp8_e4m3+window4095", window=4095, fp8="e4m3"),
    Feature("fp8_e4m3+window1023", window=1023, fp8="e4m3"),
    Feature("fp8_e4m3+window511", window=511, fp8="e4m3"),
    Feature("fp8_e4m3+window127", window=127, fp8="e4m3"),
    Feature("fp8_e4m3+window63", window=63, fp8="e4m3"),
    Feature("out_fp8_e4m3", out_fp8="e4m3"),
    Feature("out_fp8_e5m2", out_fp8="e5m2"),
]
WINDOW = [
    PLAIN,
    Feature("sinks", sinks="denominator"),
    Feature("sinks_bias_key0", sinks="bias_key0"),
    Feature("softcap50", softcap=50.0),
    Feature("alibi", alibi=True),
    Feature("window4095", window=4095),
    Feature("window63", window=63),
    Feature("window127", window=127),
    Feature("window511", window=511),
    Feature("window1023", window=1023),
    Feature("window1535", window=1535),
    Feature("window2047", window=2047),
    Feature("lse", lse=True),
    Feature("window127+sinks", window=127, sinks="denominator"),
    Feature("softcap50+window4095", window=4095, softcap=50.0),
    Feature("window4095+sinks", window=4095, sinks="denominator"),
    Feature("alibi+window4095", window=4095, alibi=True),
    Feature("out_fp8_e4m3", out_fp8="e4m3"),
]
#: the features of a --quick run
QUICK = ("plain", "fp8_e4m3", "sinks", "softcap50", "alibi", "window4095", "window127+sinks",
         "softcap50+window4095")  # fmt: skip

# (batch, heads, kv_heads, ctx, new) per head size; window-prefill: (tokens, heads, kv_heads)
PREFIX_SHAPES = {64: (8, 32, 8, 4096, 4096), 128: (8, 32, 8, 4096, 4096), 256: (4, 16, 2, 8192, 2048)}
WINDOW_SHAPES = {64: (8192, 32, 8), 128: (8192, 32, 8), 256: (8192, 16, 2)}
SMOKE_PREFIX = {64: (2, 2, 1, 40, 24)}
SMOKE_WINDOW = {64: (64, 2, 1)}
FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def visible_pairs(ctx: int, new: int, left: int) -> int:
    """Visible (query, key) pairs of one causal sequence whose queries sit at positions ``[ctx, ctx +
    new)`` and see keys ``[max(0, p - left), p]`` (``left`` -1: ``[0, p]``)."""
    lo, hi = ctx, ctx + new
    if left < 0:
        return (hi * (hi + 1) - lo * (lo + 1)) // 2
    cut = min(max(left, lo), hi)  # rows before it see every earlier key, rows from it left + 1 keys
    return (cut * (cut + 1) - lo * (lo + 1)) // 2 + (hi - cut) * (left + 1)


def per_head(heads: int, device: str, f: Feature) -> dict:
    """The per-head tensors of ``f``: sinks (float32, one logit a head) and ALiBi slopes (the usual
    geometric series ``2 ** (-8 (h + 1) / heads)``)."""
    kw = {}
    if f.sinks:
        kw["sinks"] = torch.randn(heads, device=device, dtype=torch.float32) * 2
    if f.alibi:
        kw["alibi_slopes"] = alibi_slopes(torch, heads, device)
    return kw


# ------------------------------------------------------------------------------------- prefix
def fp8_copy(kc, vc, layout: str, fdt) -> tuple:
    """fp8 (``fdt``) copies of the caches' values times 4 (read back with scales 0.25), as vLLM keeps
    them: a split K cache re-packed with vLLM's ``x = 16 // element size = 16`` features a slot."""
    if layout == "split":
        nb, h, dx, page, x = kc.shape
        rows = kc.permute(0, 1, 3, 2, 4).reshape(nb, h, page, dx * x // 16, 16)  # [nb, H, page, D/16, 16]
        kc = rows.permute(0, 1, 3, 2, 4).contiguous()  # [nb, H, D/16, page, 16]
    return (kc * 4).to(fdt), (vc * 4).to(fdt)


def prefix_entries(layout: str, page: int, head: int, features: list[Feature], device: str, dtype) -> list:
    """``(feature, fn, plan, flops)`` of every feature on one prefix problem (see the module docstring);
    ``fn()`` runs the call and returns its output."""
    from prefix_prefill import context_attention_fwd, explain, prefix_prefill
    from prefix_prefill import launch as pp_launch
    from prefix_prefill.api import _py_args

    batch, heads, kv_heads, ctx, new = (SMOKE_PREFIX if SMOKE else PREFIX_SHAPES)[head]
    gen = torch.Generator().manual_seed(0)
    prob = uniform_prefix_problem(
        torch, batch=batch, heads=heads, kv_heads=kv_heads, head_dim=head, ctx=ctx, new=new, page=page,
        layout=layout, device=device, dtype=dtype, gen=gen,
    )  # fmt: skip
    q, k, v = prob["q"], prob["k"], prob["v"]
    fp8_caches: dict[str, tuple] = {}
    entries = []
    for f in features:
        if f.skip_decode and layout != "split":
            continue  # context_attention_fwd takes vLLM's split cache only
        kc, vc, scales = prob["k_cache"], prob["v_cache"], {}
        if f.fp8:
            if f.fp8 not in fp8_caches:
                fp8_caches[f.fp8] = fp8_copy(kc, vc, layout, FP8[f.fp8])
            kc, vc = fp8_caches[f.fp8]
            scales = {"k_scale": 0.25, "v_scale": 0.25}
        out = torch.empty_like(q)
        if f.out_fp8:
            out = torch.empty_like(q, dtype=FP8[f.out_fp8])
            scales["fp8_out_scale"] = 0.5
        kw = dict(window=(f.window, -1), softcap=f.softcap, kv_layout=layout, causal=f.causal, **scales,
                  **per_head(heads, device, f))  # fmt: skip
        args = (q, k, v, kc, vc, prob["block_table"], prob["cu"], prob["seq_lens"], new)
        if f.lse:
            kw.update(return_lse=True, lse=torch.empty(heads, q.shape[0], device=device, dtype=torch.float32))
        if f.skip_decode:
            names = ("window", "softmax_scale", "alibi_slopes", "sinks", "k_scale", "v_scale", "kv_layout")
            checked = _py_args(*args, True, *(kw.get(n) for n in names), f.softcap, out, False, None)
            plan = pp_launch.plan_of(*checked[:21], True, *checked[22:])  # explain() with skip_decode

            def fn(out=out, kc=kc, vc=vc):
                context_attention_fwd(q, k, v, out, "auto", kc, vc, prob["block_table"], prob["cu"],
                                      prob["seq_lens"], None, new, 1.0, 1.0, skip_decode=True)  # fmt: skip
                return out
        else:
            plan = explain(*args, out=out, **kw)

            def fn(args=args, out=out, kw=kw):
                prefix_prefill(*args, out=out, **kw)
                return out

        pairs = visible_pairs(ctx, new, f.window) if f.causal else new * (ctx + new)
        flops = pairs * batch * heads * 4.0 * head
        entries.append((f, fn, plan, flops))
    return entries


# ------------------------------------------------------------------------------------- window
def window_entries(head: int, features: list[Feature], device: str, dtype) -> list:
    """``(feature, fn, plan, flops)`` of every feature on the window-prefill problem of ``head``."""
    from window_prefill import explain, window_prefill

    n, heads, kv_heads = (SMOKE_WINDOW if SMOKE else WINDOW_SHAPES)[head]
    q = torch.randn(n, heads, head, device=device, dtype=dtype)
    k = torch.randn(n, kv_heads, head, device=device, dtype=dtype)
    v = torch.randn(n, kv_heads, head, device=device, dtype=dtype)
    cu = torch.tensor([0, n], device=device, dtype=torch.int32)
    entries = []
    for f in features:
        out = torch.empty_like(q, dtype=FP8[f.out_fp8]) if f.out_fp8 else torch.empty_like(q)
        kw = dict(causal=True, window=(f.window, -1), softcap=f.softcap, out=out)
        if f.out_fp8:
            kw.update(fp8_out_scale=0.5)
        kw.update(per_head(heads, device, f))
        if f.sinks:
            kw.update(sinks_mode=f.sinks)
        if f.lse:
            kw.update(return_lse=True, lse=torch.empty(heads, n, device=device, dtype=torch.float32))
        plan = explain(q, k, v, cu, n, **kw)

        def fn(kw=kw, out=out):
            window_prefill(q, k, v, cu, n, **kw)
            return out

        entries.append((f, fn, plan, visible_pairs(0, n, f.window) * heads * 4.0 * head))
    return entries


# ------------------------------------------------------------------------------------- timing
def time_group(group: dict, entries: list, rounds: int, reps: dict) -> list[dict]:
    """Rows of one group: each entry run once (compiles; a non-finite output is noted, a failing call
    printed and left out), then ``rounds`` passes timing every entry, the order rotated each pass. No
    rows when the plain call fails."""
    notes, ran = {}, []
    for entry in entries:
        f, fn = entry[:2]
        try:
            o = fn()
        except Exception as e:  # one failing feature is reported; the group's others still run
            print(f"# {group} {f.name}: failed: {type(e).__name__}: {e}", flush=True)
            continue
        notes[f.name] = "" if bool(torch.isfinite(o.float()).all()) else "NON-FINITE OUTPUT"
        ran.append(entry)
    if not ran or ran[0][0] is not PLAIN:
        return []
    entries = ran
    if not SMOKE:
        settle()
    times: dict[str, list[float]] = {f.name: [] for f, *_ in entries}
    for rnd in range(rounds):
        r = rnd % len(entries)
        for f, fn, _, _ in entries[r:] + entries[:r]:
            if SMOKE:
                t0 = time.perf_counter()
                fn()
                times[f.name].append((time.perf_counter() - t0) * 1e3)
            else:
                times[f.name].append(bench_ms(fn, **reps))
    plain_ms = statistics.median(times[PLAIN.name])
    plain_flops = entries[0][3]
    rows = []
    for f, _, plan, flops in entries:
        ms = statistics.median(times[f.name])
        work = flops / plain_flops
        cost = ms / plain_ms / work
        reason = plan.reason + (f"; {notes[f.name]}" if notes[f.name] else "")
        row = {**group, "feature": f.name, "kernel": plan.kernel, "ms": ms, "tflops": tflops(flops, ms),
               "work": work, "ms_ratio": ms / plain_ms, "cost": cost, "bound": f.bound(),
               "meets": cost <= f.bound(), "vs_nhd": "", "reason": reason,
               "rounds_ms": "/".join(f"{t:.4f}" for t in times[f.name])}  # fmt: skip
        rows.append({k: row[k] for k in KEYS})
    return rows


def fill_vs_nhd(rows: list[dict]) -> None:
    """``vs_nhd`` of every split or HND row whose NHD twin (same page, head, feature) was measured."""
    nhd = {(r["page"], r["head"], r["feature"]): r["ms"] for r in rows if r["layout"] == "nhd"}
    for r in rows:
        twin = nhd.get((r["page"], r["head"], r["feature"]))
        if r["layout"] in ("split", "hnd") and twin:
            r["vs_nhd"] = r["ms"] / twin


def print_row(r: dict) -> None:
    cells = [f"{k}={r[k]:.4g}" if isinstance(r[k], float) else f"{k}={r[k]}" for k in KEYS]
    print("  ".join(cells), flush=True)


def pick(features: list[Feature], names: str | None, quick: bool) -> list[Feature]:
    """``features`` restricted to ``names`` (a comma list) or to :data:`QUICK`; ``plain`` always first."""
    keep = set(names.split(",")) if names else set(QUICK) if quick else None
    return [f for f in features if keep is None or f.name in keep or f is PLAIN]


def apply_sets(sets: list[str], error) -> None:
    """``--set NAME=V`` on each package's plan module that has the constant NAME (``error`` if none)."""
    import importlib

    modules = [importlib.import_module(m) for m in ("prefix_prefill.plan", "window_prefill.plan")]
    for kv in sets:
        owners = [m.__name__ for m in modules if hasattr(m, kv.partition("=")[0])]
        if not owners:
            error(f"--set {kv}: no constant of that name in prefix_prefill.plan or window_prefill.plan")
        for name in owners:
            set_constants([kv], error, module=name)


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="directory for feature_cost.{csv,md}")
    ap.add_argument("--quick", action="store_true", help="head 128, page 16, the QUICK features")
    ap.add_argument("--smoke", action="store_true", help="CPU, Triton interpreter, tiny shapes, fp16")
    ap.add_argument("--rounds", type=int, default=3, help="timing passes (>= 3; medians reported)")
    ap.add_argument("--packages", default="prefix,window")
    ap.add_argument("--layouts", default="nhd,split",
                    help="prefix caches: nhd, split, hnd (split and HND rows after NHD: vs_nhd)")  # fmt: skip
    ap.add_argument("--pages", default=None, help="prefix page sizes (default 16,1056; --quick 16)")
    ap.add_argument("--heads", default=None, help="head sizes (default 128,256; --quick 128)")
    ap.add_argument("--features", default=None, help="comma list of feature names (plain always runs)")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"), help="q's dtype on the GPU")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=V",
                    help="a plan constant of either package (repeatable)")  # fmt: skip
    args = ap.parse_args(argv)
    if not set(args.layouts.split(",")) <= {"nhd", "split", "hnd"}:
        ap.error(f"--layouts {args.layouts!r}: a comma list of nhd, split, hnd")
    apply_sets(args.set, ap.error)
    if args.rounds < 3 and not args.smoke:
        ap.error("--rounds must be >= 3 (issue 46: medians of at least 3 rounds)")
    known = {f.name for f in PREFIX + WINDOW}
    if args.features and not set(args.features.split(",")) <= known:
        ap.error(f"unknown features {sorted(set(args.features.split(',')) - known)}; known: {sorted(known)}")
    run = run_device(args.smoke, {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype])
    if run is None:
        return 2
    device, dtype = run
    if args.smoke:
        heads, pages, rounds = [64], [16], 1
    else:
        rounds = args.rounds
        heads = ints(args.heads or ("128" if args.quick else "128,256"))
        pages = ints(args.pages or ("16" if args.quick else "16,1056"))
    reps = {"warmup": 10, "rep": 30} if args.quick else {"warmup": 25, "rep": 100}
    packages = args.packages.split(",")
    print(f"# feature cost: packages {packages}, heads {heads}, pages {pages}, rounds {rounds}, {dtype}",
          flush=True)  # fmt: skip
    rows: list[dict] = []
    groups = []
    if "prefix" in packages:
        feats = pick(PREFIX, args.features, args.quick)
        groups += [(dict(package="prefix", layout=lay, page=pg, head=h),
                    lambda lay=lay, pg=pg, h=h: prefix_entries(lay, pg, h, feats, device, dtype))
                   for h in heads for pg in pages for lay in args.layouts.split(",")]  # fmt: skip
    if "window" in packages:
        feats_w = pick(WINDOW, args.features, args.quick)
        groups += [(dict(package="window", layout="-", page="-", head=h),
                    lambda h=h: window_entries(h, feats_w, device, dtype)) for h in heads]  # fmt: skip
    for group, build in groups:
        entries = build()
        new_rows = time_group(group, entries, rounds, reps)
        rows += new_rows
        fill_vs_nhd(rows)
        for r in new_rows:
            print_row(r)
        write_rows(args.out, "feature_cost", rows)  # after every group: a cut run keeps what it measured
        del entries
        if device == "cuda":
            torch.cuda.empty_cache()
    print(f"# wrote {args.out / 'feature_cost.csv'} and .md", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
