"""Our kernels' time and output bits on fixed problems for several package trees, their processes
interleaved: the A/B of kernel code that has no switch (a branch against main).

    python bench/trees_ab.py --tree main=/tmp/main/packages --tree new= --rounds 2 --out DIR \
        [--rows causal8k,llama,...] [--hang-check prompts8]
    python bench/trees_ab.py --smoke --tree a= --tree b= --rounds 1 --out DIR      # CPU, interpreter

A tree is ``NAME=DIR`` as in bench/engine_ab.py (DIR holds a checkout's ``packages/``; empty: this
checkout's). Each round runs this script's child once per tree, the trees in the given order, each in
a fresh process with ``BENCH_PACKAGES=DIR`` and ``-W error::RuntimeWarning`` (a warned fallback to
another kernel fails the run instead of timing the wrong kernel). With ``--hang-check ROWS`` every tree
but the first first runs those rows alone under a 60 s limit, and the A/B stops if one fails: a
deadlocked kernel ends the check, not the device call.

The child times ``ours`` (and ``ours_kv`` on prefix rows) of bench/anchors.py's rows plus the
``EXTRA_ROWS`` below: inputs from fixed seeds, ``finish_compiles()``, then ``--passes`` do_bench medians
and a hash of the output's bits. Writes ``DIR/<tree>_<round>.jsonl`` (one line per row and
implementation) and ``DIR/trees_ab.md``: per row the median ms of each tree (all passes of all rounds),
its ratio to the first tree, and whether every run's output bits equal the first tree's.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from engine_ab import parse_tree, run_in_tree  # noqa: E402

_RAGGED = tuple((0, n) for n in (8192, 100, 3000, 1, 700, 5000, 129))
_RND = random.Random(7)
_RAND16 = tuple((0, _RND.randint(1, 4096)) for _ in range(16))
_RAND64 = tuple((0, _RND.randint(64, 1024)) for _ in range(64))
_SPEC = tuple((_RND.randint(2048, 8192), 4) for _ in range(32))  # 32 x 4 new tokens on 2k-8k contexts
_DECODE = tuple((_RND.randint(1024, 4096), 1) for _ in range(64))  # 64 one-token rows on 1k-4k contexts
_TINY = tuple((_RND.randint(32, 256), 4) for _ in range(64))  # 64 x 4 new tokens on 32-256 contexts
EXTRA_ROWS = (  # name, kind, seqs, tokens, heads, kv_heads, head, then keywords (anchors.Row)
    ("causal8k_d64", "varlen", 1, 8192, 32, 8, 64, {}),
    ("causal8k_d256", "varlen", 1, 8192, 16, 2, 256, {}),
    ("short1k_d256", "varlen", 16, 1024, 16, 2, 256, {}),
    ("rand16_4k_d256", "varlen", 0, 0, 16, 2, 256, {"lens": _RAND16}),
    ("noncausal8k", "varlen", 1, 8192, 32, 8, 128, {"causal": False}),
    ("batch4x16k", "varlen", 4, 16384, 32, 8, 128, {}),
    ("ragged", "varlen", 0, 0, 32, 8, 128, {"lens": _RAGGED}),
    ("one_long", "varlen", 0, 0, 32, 8, 128, {"lens": ((0, 8192), *((0, 64),) * 15)}),
    ("engine_mix", "varlen", 0, 0, 32, 8, 128, {"lens": tuple((0, n) for n in (2000, 1500, 800, 300))}),
    ("rand16_4k", "varlen", 0, 0, 32, 8, 128, {"lens": _RAND16}),
    ("rand64_1k", "varlen", 0, 0, 32, 8, 128, {"lens": _RAND64}),
    ("llama_split", "prefix", 8, 4096, 32, 8, 128, {"ctx": 4096, "layout": "split"}),
    ("llama_p1056", "prefix", 8, 4096, 32, 8, 128, {"ctx": 4096, "page": 1056}),
    ("llama_w127_p1056", "prefix", 8, 4096, 32, 8, 128, {"ctx": 4096, "page": 1056, "left": 127}),
    ("llama_w511", "prefix", 8, 4096, 32, 8, 128, {"ctx": 4096, "left": 511}),
    ("llama_fp8_w127", "prefix", 8, 4096, 32, 8, 128, {"ctx": 4096, "left": 127, "fp8": True}),
    # pages of 8 tokens or 8 times an odd number (the NHD/HND Gluon kernel's boxes of 8 rows)
    ("llama_p8", "prefix", 8, 4096, 32, 8, 128, {"ctx": 4096, "page": 8}),
    ("llama_p24", "prefix", 8, 4096, 32, 8, 128, {"ctx": 4096, "page": 24}),
    ("qwen_p8", "prefix", 4, 2048, 16, 2, 256, {"ctx": 8192, "page": 8}),
    ("llama_fp8_p8", "prefix", 8, 4096, 32, 8, 128, {"ctx": 4096, "page": 8, "fp8": True}),
    ("llama_w127_p8", "prefix", 8, 4096, 32, 8, 128, {"ctx": 4096, "page": 8, "left": 127}),
    ("specdec_p8", "prefix", 0, 0, 32, 8, 128, {"lens": _SPEC, "page": 8}),
    # the short-query forms beside the packed one (32 x 4 packed): paired (20 tokens, past the packed
    # rows), idle (MHA: one query head a KV head), vLLM's split cache, one-token rows
    ("specdec_q20", "prefix", 0, 0, 32, 8, 128, {"lens": tuple((c, 20) for c, _ in _SPEC)}),
    ("specdec_mha", "prefix", 0, 0, 32, 32, 128, {"lens": _SPEC}),
    ("specdec_split", "prefix", 0, 0, 32, 8, 128, {"lens": _SPEC, "layout": "split"}),
    ("decode64", "prefix", 0, 0, 32, 8, 128, {"lens": _DECODE}),
    # the full forms with most tiles past their queries (a vLLM step's decodes beside two prompts of 512:
    # 4 query tiles a sequence, at most 72 of 264 a head with queries)
    ("decode_mix", "prefix", 0, 0, 32, 8, 128, {"lens": (*_DECODE, (1536, 512), (3072, 512))}),
    ("specdec_tinyctx", "prefix", 0, 0, 32, 8, 128, {"lens": _TINY}),
    # a ragged non-causal batch (the window kernel's one-tile form: its causal calls run the persistent one)
    ("ragged_noncausal", "varlen", 0, 0, 32, 8, 128, {"lens": _RAGGED, "causal": False}),
    # pages that are no multiple of 8 (the NHD/HND Gluon kernel's gathering form)
    ("llama_p1", "prefix", 8, 4096, 32, 8, 128, {"ctx": 4096, "page": 1}),
    ("qwen_p1", "prefix", 4, 2048, 16, 2, 256, {"ctx": 8192, "page": 1}),
    ("llama_p12", "prefix", 8, 4096, 32, 8, 128, {"ctx": 4096, "page": 12}),
    ("specdec_p1", "prefix", 0, 0, 32, 8, 128, {"lens": _SPEC, "page": 1}),
    ("llama_d64_p1", "prefix", 8, 4096, 32, 8, 64, {"ctx": 4096, "page": 1}),
    ("qwen_p12", "prefix", 4, 2048, 16, 2, 256, {"ctx": 8192, "page": 12}),
    ("llama_split_p8", "prefix", 8, 4096, 32, 8, 128, {"ctx": 4096, "layout": "split", "page": 8}),
    # ALiBi (issue 46's feature rows; the soft-capped ones are anchors' *_cap50)
    ("causal8k_alibi", "varlen", 1, 8192, 32, 8, 128, {"alibi": True}),
    ("llama_alibi", "prefix", 8, 4096, 32, 8, 128, {"ctx": 4096, "alibi": True}),
)


def row_table(smoke: bool) -> list:
    """The rows this script times: ``anchors``' rows and :data:`EXTRA_ROWS` (``--smoke``: anchors' smoke
    rows). Imports ``anchors``, which sets up the packages' paths from ``BENCH_PACKAGES`` before torch."""
    import anchors

    if smoke:
        return list(anchors.SMOKE_ROWS)
    extra = [anchors.Row(n, k, s, t, h, hk, d, **kw) for n, k, s, t, h, hk, d, kw in EXTRA_ROWS]
    return [*anchors.ROWS, *extra]


def child(rows: str, passes: int, out: Path, smoke: bool) -> int:
    """One tree's process: time and hash each row, one JSON line per row and implementation to ``out``."""
    table = row_table(smoke)
    import anchors
    import torch

    wanted = rows.split(",") if rows else [r.name for r in table]
    unknown = set(wanted) - {r.name for r in table}
    if unknown:
        print(f"unknown rows {sorted(unknown)}", file=sys.stderr)
        return 2
    device, dtype = ("cpu", torch.float16) if smoke else ("cuda", torch.bfloat16)
    for row in (r for r in table if r.name in wanted):
        torch.manual_seed(0)
        build = anchors.varlen_calls if row.kind == "varlen" else anchors.prefix_calls
        calls, _ = build(row, device, dtype)
        flops = anchors.attn_flops(anchors.visible_pairs(row), row.head, row.heads)
        for impl in ("ours", "ours_kv"):
            if impl not in calls:
                continue
            fn = calls[impl]
            got = fn()
            anchors.settle()
            got = fn()
            if device == "cuda":
                torch.cuda.synchronize()
            # the output's bits weighted by position, summed where the output lies (no host copy of it)
            bits = got.contiguous().view(torch.int16).reshape(-1).long()
            weights = torch.arange(bits.numel(), device=bits.device) % 65521 + 1
            digest = int((bits * weights).sum())
            ms = [anchors._ms(fn, device) for _ in range(passes)]
            tf = anchors.tflops(flops, statistics.median(ms))
            line = {"row": row.name, "impl": impl, "ms": ms, "tflops": tf, "hash": digest,
                    "nan": bool(got.isnan().any())}  # fmt: skip
            with out.open("a") as f:
                f.write(json.dumps(line) + "\n")
            print(f"{row.name:14s} {impl:8s} {statistics.median(ms):9.4f} ms  hash {digest}", flush=True)
        del calls
    return 0


def summary(out: Path, trees: list[str], rounds: int) -> str:
    """The runs' medians as a Markdown table: per row and implementation each tree's median ms (over all
    passes of all rounds) with its ratio to the first tree, and the bits against the first tree's."""
    runs: dict[tuple[str, str], dict[str, list[dict]]] = {}
    for tree in trees:
        for r in range(1, rounds + 1):
            path = out / f"{tree}_{r}.jsonl"
            for line in path.read_text().splitlines() if path.exists() else []:
                rec = json.loads(line)
                runs.setdefault((rec["row"], rec["impl"]), {}).setdefault(tree, []).append(rec)
    base = trees[0]
    head = " | ".join(trees)
    lines = [f"| row | impl | {head} | bits vs {base} |", "|---|---|" + "---|" * len(trees) + "---|"]
    for (row, impl), per in runs.items():
        if base not in per:
            continue
        med = {t: statistics.median(m for rec in per[t] for m in rec["ms"]) for t in trees if t in per}
        cells = [f"{med[base]:.4f}"] + [
            f"{med[t]:.4f} ({med[t] / med[base]:.3f})" if t in med else "-" for t in trees[1:]]  # fmt: skip
        hashes = {rec["hash"] for t in per for rec in per[t]}
        nan = any(rec["nan"] for t in per for rec in per[t])
        bits = ("NaN " if nan else "") + ("equal" if len(hashes) == 1 else "DIFFER")
        lines.append(f"| {row} | {impl} | {' | '.join(cells)} | {bits} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", dest="trees", action="append", type=parse_tree, default=[],
                    help="NAME=DIR of a packages/ (empty: this checkout's); the first: base")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=2, help="processes per tree, interleaved")
    ap.add_argument("--passes", type=int, default=3, help="do_bench medians per row in each process")
    ap.add_argument("--rows", default="", help="comma list of rows (default: all)")
    ap.add_argument("--hang-check", default="", help="rows each new tree runs alone first, under 60 s")
    ap.add_argument("--timeout-s", type=float, default=240.0, help="limit of one tree's process")
    ap.add_argument("--out", type=Path, required=True, help="directory (A/B) or JSON-lines file (--child)")
    ap.add_argument("--smoke", action="store_true", help="CPU: the Triton interpreter, anchors' smoke rows")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args.rows, args.passes, args.out, args.smoke)
    names = [n for n, _ in args.trees]
    if len(names) < 2 or len(set(names)) != len(names):
        ap.error(f"give two or more --tree NAME=DIR with distinct names, got {names}")
    args.out.mkdir(parents=True, exist_ok=True)

    def run(name: str, path: str, rows: str, dest: Path, timeout: float) -> object:
        smoke = ["--smoke"] if args.smoke else []
        cmd = [sys.executable, "-W", "error::RuntimeWarning", __file__, "--child", "--rows", rows,
               "--passes", str(args.passes), "--out", str(dest), *smoke]  # fmt: skip
        extra = {"TRITON_INTERPRET": "1"} if args.smoke else None
        return run_in_tree(cmd, path, dest.with_suffix(".log"), timeout, extra)

    if args.hang_check:
        for name, path in args.trees[1:]:
            rc = run(name, path, args.hang_check, args.out / f"hang_{name}.jsonl", 60.0)
            print(f"[hang check {name}] rc={rc}", flush=True)
            if rc != 0:
                return 1
    failed = 0
    for r in range(1, args.rounds + 1):
        for name, path in args.trees:
            rc = run(name, path, args.rows, args.out / f"{name}_{r}.jsonl", args.timeout_s)
            failed += rc != 0
            print(f"[{name} {r}] rc={rc}", flush=True)
    title = f"# trees A/B: {', '.join(names)} ({args.rounds} rounds interleaved, {args.passes} passes)\n\n"
    text = title + summary(args.out, names, args.rounds)
    (args.out / "trees_ab.md").write_text(text)
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
