"""Edge-case suite for both kernels, meant to run under NVIDIA's memory checker:

    compute-sanitizer --tool memcheck python bench/sanitize_edge.py

Every case allocates its tensors at exactly the size the call needs -- no spare tokens, no spare
cache blocks -- and allocates the index tensors (block table, ``cu_seqlens``) LAST, with ``torch.empty``
after everything else, so an out-of-bounds read of any of them leaves its allocation. The PyTorch
caching allocator would hide such reads inside its larger segments, so this script turns it off
(``PYTORCH_NO_CUDA_MEMORY_CACHING=1``, set before torch is imported): every tensor is its own
``cudaMalloc`` and memcheck sees its exact bounds. Block-table entries past a sequence's last page
hold an id far outside the cache, so using one would fault too.

Edges covered: query lengths 1 and just below/at/above every tile size; context 0; page size 1 and
non-powers of two (17, 544); sequences ending at every offset inside a page (pages 1, 16, 17; for
544 every offset next to a tile edge and the page end); head sizes 80, 96, 112,
192 (and 64/128/256); fp8 caches (e4m3 via the vLLM ``uint8`` path, e5m2); k=None; windows, sinks and
ALiBi; both API forms of both kernels. Each case is checked against ``attn_reference``; the script
prints ``N cases OK`` (exit 0) or the failing cases (exit 1).

Without a GPU it runs a small subset under the Triton interpreter (fp16), to check the script itself;
``--quick`` selects that subset on a GPU too.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator

os.environ.setdefault("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")
sys.path.insert(0, os.path.dirname(__file__))
from common import exact_paged_layout, on_gpu_node, start

start(interpret=not on_gpu_node())

import torch  # noqa: E402

import attn_reference as ref  # noqa: E402
from prefix_prefill import context_attention_fwd as pp_caf  # noqa: E402
from prefix_prefill import prefix_prefill  # noqa: E402
from window_prefill import context_attention_fwd as wp_caf  # noqa: E402
from window_prefill import window_prefill  # noqa: E402

GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1"
DEV = "cuda" if GPU else "cpu"


def _host(t):
    """The reference runs on the CPU: under memcheck every GPU kernel is instrumented, and the
    float64 reference's kernels would cost more sanitizer time than the kernels under test."""
    return t.cpu() if isinstance(t, torch.Tensor) else t


FAR = 1 << 30  # block id used for table entries a sequence never needs


def _exact(t: torch.Tensor) -> torch.Tensor:
    """A fresh allocation of exactly ``t``'s size on the device, holding ``t``."""
    out = torch.empty(t.shape, dtype=t.dtype, device=DEV)
    out.copy_(t)
    return out


# ---------------------------------------------------------------------------------- window-prefill
def window_cases(quick: bool, dtype: torch.dtype) -> Iterator[dict]:
    heads_dims = (
        [(4, 1, 80), (2, 2, 112)]
        if quick
        else [(4, 1, 80), (4, 2, 96), (2, 2, 112), (4, 2, 192), (4, 1, 64), (2, 1, 128), (2, 1, 256)]
    )
    if quick:
        batches = [[1], [1, 15, 16, 17], [33, 2]]
    else:
        tiles = [16, 32, 64, 128]
        below = sorted({n for t in tiles for n in (t - 1, t, t + 1)})
        batches = [[1], [1, 1, 1], below, [1000, 1], [2, 777, 63], [4097]]
    windows = [(True, (-1, -1)), (True, (0, -1)), (True, (63, -1)), (False, (5, 5)), (False, (-1, 3))]
    i = 0
    for heads, kv, d in heads_dims:
        for lens in batches:
            causal, window = windows[i % len(windows)]
            mode = [None, "denominator", "bias_key0"][i % 3]
            i += 1
            yield {
                "lens": lens,
                "heads": heads,
                "kv": kv,
                "d": d,
                "causal": causal,
                "window": window,
                "sinks_mode": mode,
                "dtype": dtype,
            }


def run_window(c: dict) -> list[tuple[str, ref.Comparison]]:
    lens, heads, kv, d, dt = c["lens"], c["heads"], c["kv"], c["d"], c["dtype"]
    total = sum(lens)
    q = _exact(torch.randn(total, heads, d).to(dt))
    k = _exact(torch.randn(total, kv, d).to(dt))
    v = _exact(torch.randn(total, kv, d).to(dt))
    sinks = _exact(torch.randn(heads) * 2) if c["sinks_mode"] else None
    o1 = torch.empty(total, heads, d, dtype=dt, device=DEV)
    o2 = torch.empty(total, heads, d, dtype=dt, device=DEV)
    cu_host = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu_host[1:] = torch.cumsum(torch.tensor(lens), 0)
    b_seq_len = _exact(torch.tensor(lens, dtype=torch.int32))
    cu = _exact(cu_host)  # last
    mode = c["sinks_mode"] or "denominator"
    window_prefill(
        q, k, v, cu, max(lens), causal=c["causal"], window=c["window"], sinks=sinks, sinks_mode=mode, out=o1
    )
    left, right = c["window"]
    b_start_loc = cu[:-1]  # a view of the last allocation: its last entry is never read past
    wp_caf(
        q,
        k,
        v,
        o2,
        b_start_loc,
        b_seq_len,
        max(lens),
        c["causal"],
        None,
        left if left > 0 else None,
        right if right > 0 else None,
        sinks,
        mode == "bias_key0",
    )
    if left == 0 or right == 0:  # vLLM's 0 means unbounded: compare the second form with that
        left, right = (-1 if left == 0 else left), (-1 if right == 0 else right)
    if GPU:
        torch.cuda.synchronize()
    q, k, v, cu, sinks = (_host(t) for t in (q, k, v, cu, sinks))
    want1 = ref.attention_varlen(
        q, k, v, cu, cu, causal=c["causal"], window=c["window"], sinks=sinks, sinks_mode=mode
    )
    want2 = ref.attention_varlen(
        q, k, v, cu, cu, causal=c["causal"], window=(left, right), sinks=sinks, sinks_mode=mode
    )
    return [
        ("window_prefill", ref.compare(_host(o1), want1)),
        ("window context_attention_fwd", ref.compare(_host(o2), want2)),
    ]


# ---------------------------------------------------------------------------------- prefix-prefill
def _every_offset(page: int, q_len: int, limit: int) -> list[tuple[int, int]]:
    """Sequences whose last token sits at every slot of a page up to 64 tokens (up to ``limit``
    sequences), and for wider pages at every slot next to a tile edge (0-2, k-1..k+1 for every tile
    width k in 16..512, the page's last two slots: 23 sequences for a page of 544, where all 544
    took memcheck over 160 s per case on the H200), context lengths spanning 0, 1 and 2 pages."""
    out = []
    if page <= 64:
        ends = list(range(page))
    else:
        edges = {0, 1, 2, page - 2, page - 1}
        edges |= {k + d for k in (16, 32, 64, 128, 256, 512) for d in (-1, 0, 1)}
        ends = sorted(r for r in edges if 0 <= r < page)
    for r in ends:
        seq_len = (len(out) % 3) * page + r + 1
        q = min(q_len, seq_len)
        out.append((seq_len - q, q))
        if len(out) >= limit:
            break
    return out


def prefix_cases(quick: bool, dtype: torch.dtype) -> Iterator[dict]:
    if quick:
        pages = [(1, "nhd"), (5, "split"), (17, "hnd")]
        dims = [(4, 1, 80)]
    else:
        pages = [
            (1, "nhd"),
            (1, "split"),
            (16, "split"),
            (16, "hnd"),
            (17, "nhd"),
            (544, "split"),
            (544, "hnd"),
        ]
        dims = [(4, 1, 80), (4, 2, 96), (2, 2, 112), (4, 2, 192), (4, 1, 128)]
    limit = 8 if quick else 600
    q_lens = [1, 7] if quick else [1, 15, 16, 17, 63, 64, 65, 127, 128, 129]
    i = 0
    for page, layout in pages:
        for heads, kv, d in dims:
            base = {"heads": heads, "kv": kv, "d": d, "page": page, "layout": layout, "dtype": dtype}
            # every end offset inside a page, query length 1 (decode-like) and a short chunk
            for q_len in (1, 7):
                yield dict(base, seqs=_every_offset(page, q_len, limit), opts=i)
                i += 1
            # query lengths around every tile size, context 0 and a 3-page context
            yield dict(base, seqs=[(0, n) for n in q_lens], opts=i)
            i += 1
            yield dict(base, seqs=[(3 * page + 1, n) for n in q_lens], opts=i)
            i += 1
            # a single sequence with a table exactly one row by exactly the pages it needs
            yield dict(base, seqs=[(2 * page + 3, q_lens[-1])], opts=i)
            i += 1


_PREFIX_OPTS = [  # rotated over the cases: (kv_from_cache, cache, causal, window, alibi, sinks, form)
    (False, None, True, (-1, -1), False, False, "pp"),
    (True, None, True, (-1, -1), False, True, "pp"),
    (False, "fp8", True, (31, -1), False, False, "pcaf"),
    (False, None, False, (9, 4), True, False, "pp"),
    (True, "e5m2", True, (-1, -1), True, True, "pp"),
    (False, None, True, (0, -1), False, True, "pcaf"),
]


def run_prefix(c: dict) -> list[tuple[str, ref.Comparison]]:
    seqs, heads, kv, d, page, layout, dt = (
        c["seqs"],
        c["heads"],
        c["kv"],
        c["d"],
        c["page"],
        c["layout"],
        c["dtype"],
    )
    from_cache, cache, causal, window, alibi, with_sinks, form = _PREFIX_OPTS[c["opts"] % len(_PREFIX_OPTS)]
    if layout != "split":
        form = "pp"
    q_lens = [n for _, n in seqs]
    seq_lens = [a + n for a, n in seqs]
    read = seq_lens if from_cache else [a for a, _ in seqs]
    pages_all = [-(-n // page) for n in seq_lens]
    need = [-(-n // page) for n in read]
    width = max(max(need), 1)
    fp8 = {"fp8": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}.get(cache)
    store = fp8 or dt
    x = 16 // (1 if fp8 else torch.finfo(dt).bits // 8)
    while d % x:
        x //= 2
    # no spare block: the cache ends right after the last used page
    table, k_shape, v_shape = exact_paged_layout(torch, pages_all, width, FAR, layout, kv, d, page, x)
    total = sum(q_lens)
    q = _exact(torch.randn(total, heads, d).to(dt))
    k = v = None
    if not from_cache:
        k = _exact(torch.randn(total, kv, d).to(dt))
        v = _exact(torch.randn(total, kv, d).to(dt))
    k_cache = _exact(torch.randn(k_shape).to(store))
    v_cache = _exact(torch.randn(v_shape).to(store))
    k_scale, v_scale = (0.5, 1.25) if fp8 else (1.0, 1.0)
    slopes = _exact(torch.rand(heads) * 0.2) if alibi else None
    sinks = _exact(torch.randn(heads)) if with_sinks else None
    out = torch.empty(total, heads, d, dtype=dt, device=DEV)
    cu_host = torch.zeros(len(seqs) + 1, dtype=torch.int32)
    cu_host[1:] = torch.cumsum(torch.tensor(q_lens), 0)
    seq_lens_t = _exact(torch.tensor(seq_lens, dtype=torch.int32))
    cu = _exact(cu_host)
    block_table = _exact(table)  # allocated last
    if form == "pp":
        prefix_prefill(
            q,
            k,
            v,
            k_cache,
            v_cache,
            block_table,
            cu,
            seq_lens_t,
            max(q_lens),
            causal=causal,
            window=window,
            alibi_slopes=slopes,
            sinks=sinks,
            k_scale=k_scale,
            v_scale=v_scale,
            kv_layout=layout,
            out=out,
        )
    else:
        pp_caf(
            q,
            k,
            v,
            out,
            "fp8" if fp8 else "auto",
            k_cache.view(torch.uint8) if fp8 else k_cache,
            v_cache.view(torch.uint8) if fp8 else v_cache,
            block_table,
            cu,
            seq_lens_t,
            None,
            max(q_lens),
            k_scale,
            v_scale,
            slopes,
            window[0] + 1 if window[0] >= 0 else None,
            None,
            sinks=sinks,
            causal=causal,
        )
    if GPU:
        torch.cuda.synchronize()
    want = ref.paged_prefix_attention(
        *(_host(t) for t in (q, k, v, k_cache, v_cache, block_table, cu, seq_lens_t)),
        layout=layout,
        causal=causal,
        window=window,
        alibi_slopes=_host(slopes),
        sinks=_host(sinks),
        k_scale=k_scale,
        v_scale=v_scale,
        fp8_dtype=fp8,
    )
    out = _host(out)
    name = f"prefix {'prefix_prefill' if form == 'pp' else 'context_attention_fwd'}"
    return [(name, ref.compare(out, want))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the small subset (default without a GPU)")
    ap.add_argument("--only", choices=["window", "prefix"], help="run one kernel's cases")
    ap.add_argument("--budget-s", type=float, default=None, help="start no case after this many seconds")
    ap.add_argument("--shard", default="0/1", metavar="I/N",
                    help="run cases I, I+N, I+2N, ... (one of N parallel processes)")  # fmt: skip
    ap.add_argument("--cases", default=None, metavar="I,J,...",
                    help="run only these global case indices (window cases first, then prefix)")  # fmt: skip
    args = ap.parse_args()
    only_cases = {int(x) for x in args.cases.split(",")} if args.cases else None
    shard, n_shards = (int(x) for x in args.shard.split("/"))
    if not 0 <= shard < n_shards:
        ap.error(f"--shard expects I/N with 0 <= I < N, got {args.shard}")
    t0 = time.monotonic()
    stopped = False
    quick = args.quick or not GPU
    dtype = torch.bfloat16 if GPU else torch.float16
    torch.manual_seed(0)
    if not GPU:
        print("no GPU: running the quick subset under the Triton interpreter (fp16)")
    n, failures = 0, []
    suites = []
    if args.only in (None, "window"):
        suites.append((window_cases(quick, dtype), run_window))
    if args.only in (None, "prefix"):
        suites.append((prefix_cases(quick, dtype), run_prefix))
    index = -1
    for cases, runner in suites:
        for case in cases:
            index += 1
            if index % n_shards != shard or (only_cases is not None and index not in only_cases):
                continue
            if args.budget_s is not None and time.monotonic() - t0 > args.budget_s:
                stopped = True
                break
            for name, cmp in runner(case):
                n += 1
                verdict = "ok" if cmp else "FAILED"
                print(
                    f"case {n} (index {index}) {name}: {verdict} ({time.monotonic() - t0:.0f} s)", flush=True
                )
                if not cmp:
                    shown = {
                        k: (v if k != "seqs" else f"{len(v)} seqs, first {v[:3]}") for k, v in case.items()
                    }
                    failures.append(f"{name}: {cmp} for {shown}")
    for f in failures:
        print("FAILED", f)
    if failures:
        print(f"{len(failures)} of {n} cases FAILED")
        return 1
    print(
        f"{n} cases OK"
        + (f" (stopped at the {args.budget_s:.0f} s budget: not every case ran)" if stopped else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
