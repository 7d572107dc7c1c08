"""Diagnostic: does prefix-prefill's page-size spread (NHD cache) come from where the cache blocks lie?

    PROBE_SHAPE=llama PROBE_PAGES=16,512,544,1024,1056 [PROBE_ROUNDS=3] python bench/placement_probe.py

Same problem as bench/prefix_prefill.py (its llama/qwen shapes), same cache contents, four placements:
``rand`` (the bench's: random block table, K and V separate tensors), ``seq`` (identity block table:
each sequence's pages consecutive in memory), ``kv1`` (K and V halves of one ``[nb, 2, page, H, D]``
tensor, random table), ``pad`` (block stride padded by one token: ``[nb, page + 1, H, D]`` sliced to
``page``, so no block starts at a power-of-two offset). Rounds interleave pages and placements; prints
every timing, then per page the median per placement and the max/min spread over pages. On the H200
(2026-11-30, 8b17cea; bench/results/NOTES.md): no placement moved a page by more than the
round-to-round spread.
"""

import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import bench_ms, prefix_bench_module, start

start(interpret=False)
import torch  # noqa: E402

import prefix_prefill as pp  # noqa: E402

bpp = prefix_bench_module()


def placements(prob: dict, page: int) -> dict:
    """name -> (k_cache, v_cache, block_table), all holding the problem's cache contents."""
    k_nhd, v_nhd = bpp.to_nhd(prob)
    nb, table = k_nhd.shape[0], prob["block_table"]
    seq_table, at = table.clone(), 0
    for i in range(table.shape[0]):
        n = -(-int(prob["seq_lens"][i]) // page)
        seq_table[i, :n] = torch.arange(at, at + n, dtype=torch.int32, device="cuda")
        at += n
    both = torch.stack([k_nhd, v_nhd], dim=1).contiguous()  # [nb, 2, page, H, D]
    pad_k = torch.empty(nb, page + 1, *k_nhd.shape[2:], dtype=k_nhd.dtype, device="cuda")
    pad_v = torch.empty_like(pad_k)
    pad_k[:, :page], pad_v[:, :page] = k_nhd, v_nhd
    return {
        "rand": (k_nhd, v_nhd, table),
        "seq": (k_nhd, v_nhd, seq_table),
        "kv1": (both[:, 0], both[:, 1], table),
        "pad": (pad_k[:, :page], pad_v[:, :page], table),
    }


def main() -> None:
    name = os.environ.get("PROBE_SHAPE", "llama")
    pages = [int(p) for p in os.environ.get("PROBE_PAGES", "16,512,1024,1056").split(",")]
    names = os.environ.get("PROBE_VARIANTS", "rand,seq,kv1,pad").split(",")
    rounds = int(os.environ.get("PROBE_ROUNDS", "3"))
    problems = {}
    for page in pages:
        prob = bpp.make_problem(torch, bpp.SHAPES[name], page)
        problems[page] = (prob, placements(prob, page), torch.empty_like(prob["q"]))
    res: dict[tuple[int, str], list[float]] = {}
    for r in range(rounds):
        for page in pages:
            prob, forms, out = problems[page]
            for v in names:
                kc, vc, table = forms[v]

                def fn(prob=prob, kc=kc, vc=vc, table=table, out=out):
                    pp.prefix_prefill(prob["q"], prob["k"], prob["v"], kc, vc, table, prob["cu"],
                                      prob["seq_lens"], prob["max_q"], kv_layout="nhd", out=out)  # fmt: skip

                ms = bench_ms(fn, warmup=10, rep=50)
                res.setdefault((page, v), []).append(ms)
                print(f"round={r} page={page} placement={v} ms={ms:.3f}", flush=True)
    print("SUMMARY shape=" + name)
    for page in pages:
        med = " ".join(f"{v}={statistics.median(res[page, v]):.3f}" for v in names)
        each = " ".join(f"{v}:" + "/".join(f"{x:.2f}" for x in res[page, v]) for v in names)
        print(f"page={page} {med}  rounds: {each}")
    for v in names:
        meds = [statistics.median(res[p, v]) for p in pages]
        print(f"spread {v}: max/min over pages = {max(meds) / min(meds):.3f}")


if __name__ == "__main__":
    main()
