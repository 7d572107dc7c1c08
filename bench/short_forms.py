"""The Gluon prefix kernels' two short-query forms against each other (``max_query_len <= 64``, sm90):
the second consumer warpgroup on the next query head (``PAIR_HEADS``) or idle (``IDLE_WG1``), forced in
turn, GPU time per call from a CUDA graph of 20 calls (median of 7 replays), over batch sizes, contexts
(16 and 2048 tokens), both cache layouts and head sizes 64/128/256, with each pair's outputs compared
bit for bit. The data behind ``prefix_prefill.plan.pair_heads``'s rule (pair once the idle grid, heads x
sequences, is more than one wave of the multiprocessors), printed beside the rule's choice:

    python bench/short_forms.py --out DIR          # DIR/short_forms.{csv,md}

Needs an sm90 GPU (the Gluon kernels); about a minute with a warm Triton cache.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from common import commit, gpu_name, start

start(interpret=False)
os.environ.setdefault("PREFIX_PREFILL_GLUON_TIERED", "0")  # the full forms from the first call

import torch  # noqa: E402

import prefix_prefill.gluon_launch as gl  # noqa: E402
from prefix_prefill import finish_compiles, plan, prefix_prefill  # noqa: E402

# (layout, head size, query heads, KV heads)
CONFIGS = [("split", 128, 32, 8), ("nhd", 128, 32, 8), ("split", 128, 8, 2), ("nhd", 128, 8, 2),
           ("split", 256, 16, 2), ("nhd", 256, 16, 2), ("split", 64, 32, 8)]  # fmt: skip
BATCHES = (1, 2, 4, 8, 16, 32, 64)
RULE = gl.pair_heads


def _force(form: str) -> None:
    gl.pair_heads = RULE if form == "pair" else (lambda *a, **k: False)


def _case(layout: str, d: int, h: int, hk: int, batch: int, ctx: int, new: int, page: int = 16):
    """``batch`` sequences of ``ctx`` cached + ``new`` new tokens, a shuffled block table, bf16."""
    g = torch.Generator().manual_seed(batch * 7 + ctx)
    per = -(-(ctx + new) // page)
    nb = batch * per + 1
    shape = (nb, hk, d // 8, page, 8) if layout == "split" else (nb, page, hk, d)
    vshape = (nb, hk, d, page) if layout == "split" else (nb, page, hk, d)
    k_cache = torch.randn(shape, generator=g).to("cuda", torch.bfloat16)
    v_cache = torch.randn(vshape, generator=g).to("cuda", torch.bfloat16)
    table = (torch.randperm(nb - 1, generator=g)[: batch * per] + 1).view(batch, per).to("cuda", torch.int32)
    total = batch * new
    q = torch.randn(total, h, d, generator=g).to("cuda", torch.bfloat16)
    k = torch.randn(total, hk, d, generator=g).to("cuda", torch.bfloat16)
    v = torch.randn(total, hk, d, generator=g).to("cuda", torch.bfloat16)
    cu = torch.arange(0, total + 1, new, dtype=torch.int32, device="cuda")
    seq_lens = torch.full((batch,), ctx + new, dtype=torch.int32, device="cuda")
    args = (q, k, v, k_cache, v_cache, table, cu, seq_lens, new)
    return lambda: prefix_prefill(*args, kv_layout=layout)


def _graph_us(fn, n: int = 20, reps: int = 7) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n):
            fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1000 / n)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for short_forms.{csv,md}")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for layout, d, h, hk in CONFIGS:
        for ctx in (16, 2048):
            for batch in BATCHES:
                if ctx == 16 and batch > 16:
                    continue
                new = 16 if ctx == 16 else 4
                fn = _case(layout, d, h, hk, batch, ctx, new)
                us, outs = {}, {}
                for form in ("idle", "pair"):
                    _force(form)
                    fn()
                    torch.cuda.synchronize()
                    finish_compiles()
                    outs[form] = fn().clone()
                    us[form] = _graph_us(fn)
                _force("pair")
                rule = "pair" if plan.pair_heads(h // hk, h * batch, sms) else "idle"
                row = {"layout": layout, "head": d, "heads": f"{h}/{hk}", "batch": batch, "ctx": ctx,
                       "new": new, "idle_programs": h * batch, "idle_us": round(us["idle"], 2),
                       "pair_us": round(us["pair"], 2), "pair_over_idle": round(us["pair"] / us["idle"], 3),
                       "rule": rule, "bitwise": torch.equal(outs["idle"], outs["pair"])}  # fmt: skip
                rows.append(row)
                print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    with open(args.out / "short_forms.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with open(args.out / "short_forms.md", "w") as f:
        f.write(f"<!-- {gpu_name()}, {sms} SMs, commit {commit()} -->\n")
        f.write("| " + " | ".join(rows[0]) + " |\n|" + "---|" * len(rows[0]) + "\n")
        for r in rows:
            f.write("| " + " | ".join(str(v) for v in r.values()) + " |\n")
    # the rule's form against the faster one per row (rows within a few per mille are timing noise, so
    # the time the rule's choice gives away says more than the count of rows on the faster side)
    wrong = [r for r in rows if (r["pair_over_idle"] < 1) != (r["rule"] == "pair")]
    loss = [max(r["pair_over_idle"], 1 / r["pair_over_idle"]) if r in wrong else 1.0 for r in rows]
    print(f"rule against the measurement: {len(rows) - len(wrong)} of {len(rows)} rows on the faster form; "
          f"the rule's form at most {max(loss):.3f}x the faster one's time; "
          f"bitwise equal in {sum(r['bitwise'] for r in rows)} of {len(rows)}")  # fmt: skip
    return 0 if all(r["bitwise"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
