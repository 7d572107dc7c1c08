"""Our kernels beside the Hopper anchors, FlashAttention-3 and FlashInfer, in one process (issue 47's table).

    python bench/anchors.py --out DIR [--rounds 3] [--rows causal8k,short1k,...] [--peers fa3]
    python bench/anchors.py --smoke --out DIR      # CPU: Triton interpreter, tiny shapes, ours only
    python bench/anchors.py --out DIR --processes 3 [...]   # the same in 3 fresh processes, merged

Writes DIR/anchors.{csv,md} (rewritten after each row, so a run cut by its time limit keeps what it
measured) and prints one line per implementation.

Rows (bf16; ``useful`` FLOPs = visible (query, key) pairs * heads * 4 * head size):
  causal8k    one 8192-token causal sequence, 32 q / 8 kv heads, head 128 (``window_prefill``)
  short1k     16 causal sequences of 1024 tokens, 32/8, head 128 (``window_prefill``)
  short2k     16 causal sequences of 2048 tokens, 32/8, head 128 (``window_prefill``)
  window32k   one 32768-token causal sequence, left window 4095, 32/8, head 128 (``window_prefill``)
  llama       8 x (4096 cached + 4096 new) tokens, 32/8, head 128, NHD cache, page 16 (``prefix_prefill``)
  llama_w127  llama with a left window of 127 keys (gpt-oss's sliding layers; FlashInfer's windowed form)
  llama_p2048  llama on a page-2048 cache (one TMA box a key block: the paging's cost beside llama)
  window8k_w127  causal8k with a left window of 127 keys (``window_prefill``)
  ragged_w127    one 8192-token and seven 128-token causal sequences, left window 127 (``window_prefill``)
  llama_ragged_w127  8 x 4096 cached tokens, one with 4096 new, seven with 128, left window 127
  qwen        4 x (8192 cached + 2048 new) tokens, 16/2, head 256, NHD cache, page 16 (``prefix_prefill``)
  (one layer of bench/engine_step.py's scenarios, 32/8 heads, head 128, NHD page 16 where paged:)
  prompts8    8 causal prompts of 100-500 tokens (``window_prefill``; varlen_8prompts_100-500)
  chunks4     chunks of 1024/768/512/256 new tokens on contexts 0/2600/5300/8000 (prefix_4chunks_0-8k)
  specdec     32 x 4 new tokens on contexts of 2048-8192 (specdec_32x4)
  (issue 46's features beside the same peers' own forms of them:)
  causal8k_cap50  causal8k with soft-capping 50 (Gemma 2)
  llama_cap50     llama with soft-capping 50
  llama_fp8       llama on an fp8 e4m3 cache (the bf16 cache's values times 4, ``k_scale = v_scale =
                  0.25``); FA3's fp8 forward takes fp8 q too (q cast to e4m3, descale 1: its only fp8
                  form), FlashInfer bf16 q with the fp8 paged cache and the scales

Implementations, each timed by ``triton.testing.do_bench`` medians in ``--rounds`` passes (the
implementations' order rotated each pass; the median pass reported):
  ours        the row's function, after ``finish_compiles()`` (prefix rows: ``k=None``, every token's
              K/V read from the paged cache, the same data the peers read)
  ours_kv     prefix rows: the new tokens' K/V given as tensors (an engine's usual call)
  fa3         ``fa3_fwd_interface.flash_attn_varlen_func`` (FlashAttention-3's Hopper forward, wheel
              0.0.3): contiguous K/V (the wheel has no paged KV and no local attention: prefix rows run
              on the gathered cache, an upper bound for paging; no window row)
  flashinfer  FlashInfer 0.7.2, FA3 backend: ``BatchPrefillWithRaggedKVCacheWrapper`` (varlen rows),
              ``BatchPrefillWithPagedKVCacheWrapper`` over our NHD cache and block table (prefix rows);
              planned once per row, the run timed
  ours_set    with ``--set NAME=V`` (repeatable): ours with those constexprs of the row's Gluon plans changed
              (``bench/plan_override.py``: window_prefill's ``gluon`` plans on varlen rows, prefix_prefill's
              NHD/HND ones on prefix rows, every token's K/V from the cache), timed in the same passes: an
              A/B of a plan setting beside the peers (``diff_vs_ours`` 0: the same bits)
With ``--sustained S``, each pass also runs every implementation back to back for ``S`` seconds
(``bench/sustained.py``): ``sust_ms`` per call, the median SM clock ``sm_mhz`` and board power
``power_w``, and ``mcycles`` (their product: the call in millions of SM cycles). At the card's power
cap an implementation's clock depends on its energy per cycle, so ``mcycles`` separates a schedule's
cost from a clock's.
With ``--processes P`` (P >= 2) the run is P fresh processes one after another (``DIR/proc1`` ..), each as
above, and ``DIR/anchors_processes.{csv,md}`` gives per row and implementation the median of the
processes' times and, for ours, each peer's ratio per process (``x_fa3_processes``) and their median: a
peer's time moves 3-4% between processes on one card (NOTES entry 139), so a verdict against a bar reads
the ratios' spread, not one process.
A peer that cannot be imported or fails is a row note, not an error. ``x_fa3`` / ``x_flashinfer``: the
peer's time over ours (> 1: ours is faster); ``diff_vs_ours``: max |peer - ours| on the row (a peer
called wrongly shows here). The peers come from ``../shared/peers/wheels/`` (install them into a folder
on ``PYTHONPATH``, see that folder's README).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib
import itertools
import os
import random
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sustained as sustained_runs
from common import alibi_slopes, attn_flops, prefix_problem, run_device, settle, start, tflops, write_rows
from plan_override import overridden, parse_sets

SMOKE = "--smoke" in sys.argv
start(interpret=SMOKE)

import torch  # noqa: E402

PEERS = ("fa3", "flashinfer")


@dataclass(frozen=True)
class Row:
    """One problem: ``kind`` "varlen" (``seqs`` sequences of ``tokens``, ``left`` window or -1, causal
    unless ``causal`` is False) or "prefix" (``seqs`` x (``ctx`` cached + ``tokens`` new), always causal,
    a ``layout`` cache of ``page``: "nhd", or "split" (vLLM's; ours only, the peers read NHD)); ``lens``
    (``(ctx, new)`` per sequence, ctx 0 for varlen) replaces ``seqs``, ``ctx`` and ``tokens`` for a
    ragged batch."""

    name: str
    kind: str
    seqs: int
    tokens: int
    heads: int
    kv_heads: int
    head: int
    left: int = -1
    ctx: int = 0
    page: int = 16
    lens: tuple[tuple[int, int], ...] = ()
    layout: str = "nhd"
    causal: bool = True
    softcap: float = 0.0
    fp8: bool = False
    alibi: bool = False

    def pairs(self) -> list[tuple[int, int]]:
        """``(ctx, new)`` of each sequence."""
        return list(self.lens) if self.lens else [(self.ctx, self.tokens)] * self.seqs


# engine_step.py's draws: 64 decode contexts, then the 32 speculative-decoding contexts
_RNG = random.Random(32)
_DECODE_CTX = [_RNG.randint(1024, 4096) for _ in range(64)]
_SPEC = tuple((_RNG.randint(2048, 8192), 4) for _ in range(32))
_PROMPTS8 = tuple((0, n) for n in (100, 500, 230, 370, 150, 440, 280, 330))
# one long sequence among short ones (a persistent form's balance across sequences)
_RAGGED = ((0, 8192),) + ((0, 128),) * 7
_RAGGED_PREFIX = ((4096, 4096),) + ((4096, 128),) * 7


ROWS = [
    Row("causal8k", "varlen", 1, 8192, 32, 8, 128),
    Row("short1k", "varlen", 16, 1024, 32, 8, 128),
    Row("short2k", "varlen", 16, 2048, 32, 8, 128),
    Row("window32k", "varlen", 1, 32768, 32, 8, 128, left=4095),
    Row("llama", "prefix", 8, 4096, 32, 8, 128, ctx=4096),
    Row("qwen", "prefix", 4, 2048, 16, 2, 256, ctx=8192),
    Row("llama_w127", "prefix", 8, 4096, 32, 8, 128, ctx=4096, left=127),
    Row("llama_p2048", "prefix", 8, 4096, 32, 8, 128, ctx=4096, page=2048),
    Row("window8k_w127", "varlen", 1, 8192, 32, 8, 128, left=127),
    Row("ragged_w127", "varlen", 0, 0, 32, 8, 128, left=127, lens=_RAGGED),
    Row("llama_ragged_w127", "prefix", 0, 0, 32, 8, 128, left=127, lens=_RAGGED_PREFIX),
    Row("prompts8", "varlen", 0, 0, 32, 8, 128, lens=_PROMPTS8),
    Row("chunks4", "prefix", 0, 0, 32, 8, 128, lens=((0, 1024), (2600, 768), (5300, 512), (8000, 256))),
    Row("specdec", "prefix", 0, 0, 32, 8, 128, lens=_SPEC),
    Row("causal8k_cap50", "varlen", 1, 8192, 32, 8, 128, softcap=50.0),
    Row("llama_cap50", "prefix", 8, 4096, 32, 8, 128, ctx=4096, softcap=50.0),
    Row("llama_fp8", "prefix", 8, 4096, 32, 8, 128, ctx=4096, fp8=True),
]
SMOKE_ROWS = [
    Row("causal8k", "varlen", 1, 48, 2, 1, 64),
    Row("window32k", "varlen", 2, 40, 2, 1, 64, left=7),
    Row("noncausal8k", "varlen", 2, 33, 2, 1, 64, causal=False),
    Row("llama", "prefix", 2, 16, 2, 1, 64, ctx=24),
    Row("llama_w127", "prefix", 2, 16, 2, 1, 64, ctx=24, left=7),
    Row("prompts8", "varlen", 0, 0, 2, 1, 64, lens=((0, 9), (0, 30))),
    Row("specdec", "prefix", 0, 0, 2, 1, 64, lens=((40, 4), (17, 4), (0, 6))),
    Row("causal8k_cap50", "varlen", 1, 48, 2, 1, 64, softcap=50.0),
    Row("llama_fp8", "prefix", 2, 16, 2, 1, 64, ctx=24, fp8=True),
]


def visible_pairs(row: Row) -> int:
    """Visible (query, key) pairs of the row, all sequences: causal over ``ctx + new`` keys for the
    ``new`` last queries (every key when not ``causal``), within ``left`` keys behind each query where a
    window is set."""
    total = 0
    for ctx, new in row.pairs():
        if not row.causal:
            total += new * (ctx + new)
            continue
        for i in range(new):
            seen = ctx + i + 1
            total += seen if row.left < 0 else min(seen, row.left + 1)
    return total


# ------------------------------------------------------------------------------------- the calls
def alibi_kw(row: Row, device: str) -> dict:
    """Our calls' ``alibi_slopes`` for a row with ``alibi`` (``common.alibi_slopes``), else nothing."""
    return {"alibi_slopes": alibi_slopes(torch, row.heads, device)} if row.alibi else {}


def varlen_problem(row: Row, device: str, dtype) -> tuple:
    """A varlen row's random ``(q, k, v, cu_seqlens, longest)``: q ``[tokens, heads, head]``, k and v
    ``[tokens, kv_heads, head]``, the sequences packed in order."""
    lens = [new for _, new in row.pairs()]
    n, longest = sum(lens), max(lens)
    q = torch.randn(n, row.heads, row.head, device=device, dtype=dtype)
    k = torch.randn(n, row.kv_heads, row.head, device=device, dtype=dtype)
    v = torch.randn_like(k)
    starts = [0]
    for length in lens:
        starts.append(starts[-1] + length)
    cu = torch.tensor(starts, dtype=torch.int32, device=device)
    return q, k, v, cu, longest


def varlen_calls(row: Row, device: str, dtype) -> tuple[dict, list[str]]:
    """``{impl: fn}`` (each ``fn()`` returns its output ``[tokens, heads, head]``) and notes."""
    from window_prefill import window_prefill

    q, k, v, cu, longest = varlen_problem(row, device, dtype)
    out = torch.empty_like(q)
    ab = alibi_kw(row, device)
    calls = {"ours": lambda: window_prefill(q, k, v, cu, longest, causal=row.causal, window=(row.left, -1),
                                            softcap=row.softcap, out=out, **ab)}  # fmt: skip
    if _SETS:
        out_set = torch.empty_like(q)
        calls["ours_set"] = lambda: window_prefill(q, k, v, cu, longest, causal=row.causal,
                                                   softcap=row.softcap, window=(row.left, -1),
                                                   out=out_set, **ab)  # fmt: skip
        _SET_PLANS["ours_set"] = ("window_prefill", "gluon")
    notes: list[str] = []
    if device != "cuda" or row.alibi:
        return calls, ["peers: no CUDA device" if device != "cuda" else "peers: not on ALiBi rows"]
    if row.left < 0:
        fa3 = _fa3(notes)
        if fa3 is not None:
            calls["fa3"] = lambda: fa3(q, k, v, cu, cu, longest, longest, causal=row.causal,
                                       softcap=row.softcap)  # fmt: skip
    else:
        notes.append("fa3: the wheel is built without local attention")
    fi = _flashinfer(notes)
    if fi is not None:
        try:
            w = fi.BatchPrefillWithRaggedKVCacheWrapper(_workspace(device), "NHD", backend="fa3")
            w.plan(cu, cu, row.heads, row.kv_heads, row.head, causal=row.causal, window_left=row.left,
                   logits_soft_cap=row.softcap or None, q_data_type=dtype, kv_data_type=dtype)  # fmt: skip
            calls["flashinfer"] = lambda: w.run(q, k, v)
        except Exception as e:  # a peer's failure is a note
            notes.append(f"flashinfer: {type(e).__name__}: {str(e)[:120]}")
    return calls, notes


def prefix_calls(row: Row, device: str, dtype) -> tuple[dict, list[str]]:
    """As :func:`varlen_calls` for a prefix row: every sequence's ``ctx + tokens`` keys are in the NHD
    cache (block table a random permutation), read through it by ours and FlashInfer, and gathered into
    contiguous K/V for FA3."""
    from prefix_prefill import prefix_prefill

    if not row.causal:
        raise ValueError(f"row {row.name}: prefix rows are causal (causal=False is for varlen rows)")

    gen = torch.Generator().manual_seed(0)
    pairs = row.pairs()
    p = prefix_problem(torch, seqs=pairs, heads=row.heads, kv_heads=row.kv_heads, head_dim=row.head,
                       page=row.page, layout=row.layout, device=device, dtype=dtype, gen=gen)  # fmt: skip
    q, kc, vc, bt, cu, sl = p["q"], p["k_cache"], p["v_cache"], p["block_table"], p["cu"], p["seq_lens"]
    longest = max(new for _, new in pairs)
    out, out_kv = torch.empty_like(q), torch.empty_like(q)
    kw: dict = {"softcap": row.softcap, "window": (row.left, -1), **alibi_kw(row, device)}
    fp8 = torch.float8_e4m3fn if row.fp8 else None
    if fp8 is not None:  # the cache's values times 4 in e4m3, read back with scales 0.25
        kc, vc = (kc * 4).to(fp8), (vc * 4).to(fp8)
        kw.update(k_scale=_FP8_SCALE, v_scale=_FP8_SCALE)
    calls = {
        "ours": lambda: prefix_prefill(q, None, None, kc, vc, bt, cu, sl, longest, out=out, **kw),
        "ours_kv": lambda: prefix_prefill(q, p["k"], p["v"], kc, vc, bt, cu, sl, longest, out=out_kv, **kw),
    }
    if _SETS:
        out_set = torch.empty_like(q)
        calls["ours_set"] = lambda: prefix_prefill(
            q, None, None, kc, vc, bt, cu, sl, longest, out=out_set, **kw
        )
        _SET_PLANS["ours_set"] = ("prefix_prefill", "gluon-tma")
    notes = ["ours_kv: other new-token K/V than the cache's (no diff)"]
    if device != "cuda" or row.layout != "nhd" or row.alibi:
        why = "not on ALiBi rows" if row.alibi else "NHD rows only"
        why = "no CUDA device" if device != "cuda" else why
        return calls, [*notes, f"peers: {why}"]
    keys = [c + n for c, n in pairs]
    pages = p["pages"]
    if row.left >= 0:
        fa3 = None
        notes.append("fa3: the wheel is built without local attention")
    else:
        fa3 = _fa3(notes)
    if fa3 is not None:
        k_all, v_all, cu_k = gathered_kv(p)
        fa_kw: dict = {"softcap": row.softcap}
        q_fa = q
        if fp8 is not None:  # FA3's fp8 forward: q, k and v in e4m3 with per-(sequence, KV head) descales
            q_fa, k_all, v_all = q.to(fp8), (k_all * 4).to(fp8), (v_all * 4).to(fp8)
            ones = torch.ones(len(pairs), row.kv_heads, dtype=torch.float32, device=device)
            fa_kw.update(q_descale=ones, k_descale=ones * _FP8_SCALE, v_descale=ones * _FP8_SCALE)
        # (causal with more keys than queries: FlashAttention aligns the mask to the bottom right)
        calls["fa3"] = lambda: fa3(q_fa, k_all, v_all, cu, cu_k, longest, max(keys), causal=True, **fa_kw)
    fi = _flashinfer(notes)
    if fi is not None:
        try:
            w = fi.BatchPrefillWithPagedKVCacheWrapper(_workspace(device), "NHD", backend="fa3")
            indptr = torch.tensor([0, *itertools.accumulate(pages)], dtype=torch.int32, device=device)
            ids = torch.cat([bt[b, : pages[b]] for b in range(len(pairs))]).contiguous()
            last = torch.tensor([k - (n - 1) * row.page for k, n in zip(keys, pages, strict=True)],
                                dtype=torch.int32, device=device)  # fmt: skip
            w.plan(cu, indptr, ids, last, row.heads, row.kv_heads, row.head, row.page, causal=True,
                   window_left=row.left, logits_soft_cap=row.softcap or None, q_data_type=dtype,
                   kv_data_type=kc.dtype)  # fmt: skip
            fi_kw = {"k_scale": _FP8_SCALE, "v_scale": _FP8_SCALE} if fp8 is not None else {}
            calls["flashinfer"] = lambda: w.run(q, (kc, vc), **fi_kw)
        except Exception as e:
            notes.append(f"flashinfer: {type(e).__name__}: {str(e)[:120]}")
    return calls, notes


_FP8_SCALE = 0.25  # a row with ``fp8``: its cache holds the values times 4 in e4m3


def gathered_kv(p: dict) -> tuple:
    """``(k, v, cu_k)`` of a :func:`common.prefix_problem` NHD cache for a peer without paged KV: each
    sequence's ``seq_lens`` keys gathered in order (``attn_reference.gather_paged``), packed ``[sum(keys),
    kv_heads, head]``, and the int32 ``[batch + 1]`` starts of each sequence's keys."""
    from attn_reference import gather_paged

    keys = p["seq_lens"].tolist()
    k = gather_paged(p["k_cache"], p["block_table"], keys, layout="nhd", role="k")
    v = gather_paged(p["v_cache"], p["block_table"], keys, layout="nhd", role="v")
    cu_k = torch.tensor([0, *itertools.accumulate(keys)], dtype=torch.int32, device=k.device)
    return k, v, cu_k


_RUN_PEERS = set(PEERS)  # (main's --peers)
_SETS: dict = {}  # (main's --set: constexprs of ours_set's plans)
_SET_PLANS: dict = {}  # implementation -> (package, plan filter) whose plans --set changes


def _plans(impl: str):
    """The context an implementation runs in: ``--set``'s plan override for ``ours_set``, else none."""
    if impl not in _SET_PLANS:
        return contextlib.nullcontext()
    package, kernel = _SET_PLANS[impl]
    return overridden(package, _SETS, kernel=kernel)


def _peer(peer: str, module: str, notes: list[str], attr: str | None = None):
    """``module`` (or its ``attr``) for ``peer``, or None with a note where it cannot be imported or is
    left out (``--peers``)."""
    if peer not in _RUN_PEERS:
        notes.append(f"{peer}: left out (--peers)")
        return None
    try:
        found = importlib.import_module(module)
    except Exception as e:
        notes.append(f"{peer}: not importable ({type(e).__name__})")
        return None
    return getattr(found, attr) if attr else found


def _fa3(notes: list[str]):
    return _peer("fa3", "fa3_fwd_interface", notes, "flash_attn_varlen_func")


def _flashinfer(notes: list[str]):
    return _peer("flashinfer", "flashinfer", notes)


_WORKSPACE: dict = {}


def _workspace(device: str) -> torch.Tensor:
    """FlashInfer's float workspace (128 MB, its recommended size), one per process."""
    if device not in _WORKSPACE:
        _WORKSPACE[device] = torch.empty(128 << 20, dtype=torch.uint8, device=device)
    return _WORKSPACE[device]


# ------------------------------------------------------------------------------------- timing
def time_row(
    row: Row, calls: dict, notes: list[str], rounds: int, device: str, sustained: float = 0.0
) -> list[dict]:
    """One result row per implementation that ran (its first call checked against ours); with
    ``sustained`` seconds, each also run back to back that long in each pass (``bench/sustained.py``)."""
    ref = calls["ours"]().float()
    if device == "cuda":
        from prefix_prefill import finish_compiles

        torch.cuda.synchronize()
        finish_compiles()
    diffs, live = {}, {}
    for impl, fn in calls.items():
        try:
            with _plans(impl):
                got = fn()
            got = got[0] if isinstance(got, tuple) else got
            diffs[impl] = float((got.float() - ref).abs().max()) if impl not in ("ours", "ours_kv") else None
            live[impl] = fn
        except Exception as e:
            notes.append(f"{impl}: {type(e).__name__}: {str(e)[:120]}")
    passes: dict[str, list[float]] = {impl: [] for impl in live}
    runs: dict[str, list[dict]] = {impl: [] for impl in live}
    sustain = sustained > 0 and device == "cuda" and sustained_runs.available()
    order = list(live)
    for r in range(rounds):
        for impl in order[r % len(order) :] + order[: r % len(order)]:
            with _plans(impl):
                passes[impl].append(_ms(live[impl], device))
                if sustain:
                    runs[impl].append(sustained_runs.run(live[impl], sustained))
    flops = attn_flops(visible_pairs(row), row.head, row.heads)
    ours_ms = statistics.median(passes["ours"])
    rows = []
    for impl, ms_all in passes.items():
        ms = statistics.median(ms_all)
        rows.append({
            "row": row.name, "impl": impl, "ms": ms, "tflops": tflops(flops, ms),
            "diff_vs_ours": "" if diffs[impl] is None else diffs[impl],
            "passes_ms": "/".join(f"{m:.4g}" for m in ms_all), "note": "; ".join(notes),
        })  # fmt: skip
        if sustain:
            rows[-1].update(sustained_runs.median_runs(runs[impl]))
    peer_ms = {x["impl"]: x["ms"] for x in rows if x["impl"] in PEERS}
    for x in rows:  # (every row has the columns; the ours row holds the ratios)
        for peer in PEERS:
            x[f"x_{peer}"] = peer_ms[peer] / ours_ms if x["impl"] == "ours" and peer in peer_ms else ""
    return rows


def print_row(r: dict) -> None:
    """One line per implementation: ms, useful TFLOP/s, the difference from ours and the ratios."""
    ratios = "  ".join(f"{k}={r[k]:.3g}" for k in ("x_fa3", "x_flashinfer") if isinstance(r.get(k), float))
    diff = f"  diff={r['diff_vs_ours']:.3g}" if isinstance(r["diff_vs_ours"], float) else ""
    line = f"{r['row']:14s} {r['impl']:11s} {r['ms']:9.3f} ms {r['tflops']:7.1f} TFLOP/s{diff}  {ratios}"
    if "sust_ms" in r:
        line += (f"  sustained {r['sust_ms']:.4f} ms at {r['sm_mhz']:.0f} MHz {r['power_w']:.0f} W"
                 f" ({r['mcycles']:.4g} Mcycles)")  # fmt: skip
    print(line, flush=True)


def _ms(fn, device: str) -> float:
    if device != "cuda":  # (smoke: one call, wall time; the interpreter's time means nothing)
        import time

        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    import triton

    settle()
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def across_processes(outs: list[Path]) -> list[dict]:
    """The rows of several processes' ``anchors.csv`` (``outs``: their folders, a missing file skipped)
    merged: per row and implementation (in first-seen order) ``ms`` and ``tflops``, the medians over the
    processes that measured them, ``ms_processes`` their times; on ours' rows, for each peer column
    ``x_<peer>``, the median of the per-process ratios and ``x_<peer>_processes`` the ratios themselves
    (each ratio from one process: the peer's time over ours in the same run)."""
    merged: dict[tuple[str, str], dict[str, list[float]]] = {}
    for out in outs:
        path = out / "anchors.csv"
        if not path.exists():
            continue
        with path.open(newline="") as f:
            for r in csv.DictReader(f):
                cols = merged.setdefault((r["row"], r["impl"]), {})
                for key, value in r.items():
                    if (key in ("ms", "tflops") or key.startswith("x_")) and value not in ("", None):
                        cols.setdefault(key, []).append(float(value))
    rows = []
    for (row, impl), cols in merged.items():
        r: dict = {"row": row, "impl": impl}
        for key, values in cols.items():
            r[key] = statistics.median(values)
            if key != "tflops":
                r[f"{key}_processes"] = "/".join(f"{v:.4g}" for v in values)
        rows.append(r)
    return rows


def _in_processes(args: argparse.Namespace) -> int:
    """``args``' run in ``args.processes`` fresh processes, one after another, then their merge
    (:func:`across_processes`) into ``args.out / "anchors_processes.{csv,md}"``."""
    child = [sys.executable, str(Path(__file__).resolve()), "--rounds", str(args.rounds)]
    child += ["--peers", args.peers]
    child += ["--smoke"] if args.smoke else []
    child += ["--rows", args.rows] if args.rows else []
    child += ["--sustained", str(args.sustained)] if args.sustained else []
    for s in args.set:
        child += ["--set", s]
    outs = [args.out / f"proc{i + 1}" for i in range(args.processes)]
    failed = 0
    for out in outs:
        print(f"# process {out.name}", flush=True)
        failed += subprocess.run([*child, "--out", str(out)]).returncode != 0
    rows = across_processes(outs)
    if not rows:
        print("# no process measured a row", flush=True)
        return 1
    write_rows(args.out, "anchors_processes", rows)
    for r in rows:
        ratios = "  ".join(f"{k}={r[k]:.3g} ({r[k + '_processes']})" for k in r if k.startswith("x_")
                           and not k.endswith("_processes"))  # fmt: skip
        print(f"{r['row']:<14} {r['impl']:<14} {r['ms']:8.4g} ms  {ratios}", flush=True)
    print(f"# wrote {args.out / 'anchors_processes.csv'} and .md ({failed} of {len(outs)} processes failed)")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="directory for anchors.{csv,md}")
    ap.add_argument("--smoke", action="store_true", help="CPU, Triton interpreter, tiny shapes, ours only")
    ap.add_argument("--rounds", type=int, default=3, help="timing passes (>= 3; medians reported)")
    ap.add_argument("--rows", default="", help=f"comma list of {', '.join(r.name for r in ROWS)}")
    ap.add_argument(
        "--peers",
        default=",".join(PEERS),
        help="the peers to run (one left out is a row note; FlashInfer's first fp8 call builds for minutes)",
    )
    ap.add_argument("--sustained", type=float, default=0.0, metavar="SECONDS",
                    help="also run each implementation back to back this long per pass, with its SM clock "
                    "and power (bench/sustained.py)")  # fmt: skip
    ap.add_argument("--set", action="append", default=[], metavar="NAME=V",
                    help="a Gluon plan constexpr of ours_set, e.g. PERSISTENT=1")  # fmt: skip
    ap.add_argument("--processes", type=int, default=1,
                    help="run in this many fresh processes, merged (anchors_processes.csv)")  # fmt: skip
    args = ap.parse_args(argv)
    _SETS.update(parse_sets(args.set, ap.error))
    if args.rounds < 3 and not args.smoke:
        ap.error("--rounds must be >= 3 (issue 47: medians of at least 3 rounds)")
    if args.processes < 1:
        ap.error("--processes must be >= 1")
    if args.processes > 1:
        return _in_processes(args)
    table = SMOKE_ROWS if args.smoke else ROWS
    wanted = set(args.rows.split(",")) if args.rows else None
    if wanted and not wanted <= {r.name for r in table}:
        ap.error(f"unknown rows {sorted(wanted - {r.name for r in table})}")
    run = run_device(args.smoke, torch.bfloat16)
    if run is None:
        return 2
    device, dtype = run
    rounds = 1 if args.smoke else args.rounds
    _RUN_PEERS.clear()
    _RUN_PEERS.update(args.peers.split(",") if args.peers else ())
    if not _RUN_PEERS <= set(PEERS):
        ap.error(f"unknown peers {sorted(_RUN_PEERS - set(PEERS))}")
    rows: list[dict] = []
    for row in table:
        if wanted and row.name not in wanted:
            continue
        build = varlen_calls if row.kind == "varlen" else prefix_calls
        calls, notes = build(row, device, dtype)
        new = time_row(row, calls, notes, rounds, device, args.sustained)
        for r in new:
            print_row(r)
        rows += new
        write_rows(args.out, "anchors", rows)  # after every row: a cut run keeps what it measured
        del calls
        if device == "cuda":
            torch.cuda.empty_cache()
    print(f"# wrote {args.out / 'anchors.csv'} and .md", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
