"""Malformed device metadata on the default path (no ``validate``), meant to run under NVIDIA's memory
checker:

    compute-sanitizer --tool memcheck --error-exitcode 1 python bench/malformed_calls.py

What it checks: both packages' public functions (``prefix_prefill``, its ``context_attention_fwd``,
``window_prefill``, its ``context_attention_fwd``) over every cache layout (NHD, vLLM's split, HND) and
every kernel a plan picks on an H200 (the Gluon kernels ``gluon-nhd``, ``gluon-hnd``, ``gluon-split`` at
heads 64, 128 and 256, with 16-bit and fp8 caches, ``gluon`` of window-prefill, and the Triton kernels;
each problem's plan is checked with ``explain()``), called with each kind of malformed device metadata:
block ids past the cache, negative or huge, a block table too narrow for ``seq_lens``, ``seq_lens`` past
the table, shorter than the query or negative, ``cu_seqlens`` decreasing, negative or past the tokens,
vLLM's start/length form with negative or overlong entries, max lengths too small or 0, and all at once.
For every call: no
memcheck error (the run's exit status), no NaN/Inf in any row a sequence spans (the output is
NaN-poisoned first; spans as the kernels clamp them), the rows past a too small max length's grid
exactly 0, the ``status=`` tensor holding the malformation's bit (:mod:`prefill_runtime.status`), and
the same call with ``validate=True`` raising ``ValueError``. Some problems also run every case without
``status=`` (the kernels' other variant: the bounds must hold there too). Every tensor is its own
``cudaMalloc`` (``PYTORCH_NO_CUDA_MEMORY_CACHING=1``) of exactly the size the call needs, the index
tensors allocated last, so memcheck sees any read past one of them. Prints ``N cases OK`` (exit 0) or
the failing cases (exit 1); about two minutes on an H200 (most of it compiling).

Without a GPU it runs a tiny subset under the Triton interpreter (the Triton kernels, fp16):

    python bench/malformed_calls.py

``--only prefix|window`` runs one package's problems, ``--problems NAME,...`` some of them.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import sys
import time

os.environ.setdefault("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")
os.environ.setdefault("PREFIX_PREFILL_GLUON_TIERED", "0")  # the Gluon kernels' full forms from the start
sys.path.insert(0, os.path.dirname(__file__))
from common import exact_paged_layout, on_gpu_node, start

start(interpret=not on_gpu_node())

import torch  # noqa: E402

import window_prefill.plan as wp_plan  # noqa: E402
from prefill_runtime import status as st_bits  # noqa: E402
from prefix_prefill import context_attention_fwd as pp_caf  # noqa: E402
from prefix_prefill import explain as pp_explain  # noqa: E402
from prefix_prefill import prefix_prefill  # noqa: E402
from window_prefill import context_attention_fwd as wp_caf  # noqa: E402
from window_prefill import explain as wp_explain  # noqa: E402
from window_prefill import window_prefill  # noqa: E402

GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1"
DEV = "cuda" if GPU else "cpu"
SM90 = GPU and torch.version.hip is None and torch.cuda.get_device_capability() == (9, 0)
FAR = 1 << 30  # table entries past a sequence's pages (never read)
B = st_bits  # the status bits


def _exact(t: torch.Tensor) -> torch.Tensor:
    """A fresh allocation of exactly ``t``'s size on the device, holding ``t``."""
    out = torch.empty(t.shape, dtype=t.dtype, device=DEV)
    out.copy_(t)
    return out


def _i32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def _poisoned(shape, dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=DEV)


# ---------------------------------------------------------------------------------- prefix-prefill
# name: (form, layout, head, heads, kv, page, new tokens from the cache, cache, left window (or a
#        non-causal call's (left, right) window, "py" form), ALiBi, short queries, plan on sm90, also
#        without status=); a layout "L-interleaved": NHD / HND caches whose K and V pages interleave in
#        one FlashInfer-style ``[num_blocks, 2, ...]`` allocation; short queries (every query <= 64 rows)
#        take the short-query forms: the Gluon kernels' paired heads (an even group, the idle grid more
#        than one wave: 64 heads x 3 sequences) or idle second warpgroup (odd group), the Triton kernel's
#        packed GQA rows
# fmt: off
PREFIX = {
    "pp-gluon-nhd": ("py", "nhd", 128, 4, 2, 16, False, None, -1, False, False, "gluon-nhd", True),
    "pp-gluon-nhd-kvcache": ("py", "nhd", 64, 2, 1, 32, True, None, -1, False, False, "gluon-nhd", False),
    "pp-gluon-hnd": ("py", "hnd", 128, 4, 2, 16, False, None, -1, False, False, "gluon-hnd", True),
    "pp-gluon-hnd-interleaved": ("py", "hnd-interleaved", 64, 4, 1, 16, True, None, -1, False, False,
                                 "gluon-hnd", False),
    "pp-gluon-split-128": ("vllm", "split", 128, 4, 2, 16, False, None, -1, False, False, "gluon-split",
                           True),
    "pp-gluon-split-64": ("vllm", "split", 64, 4, 1, 16, False, None, -1, False, False, "gluon-split", False),
    "pp-gluon-split-256": ("py", "split", 256, 2, 1, 16, False, None, -1, False, False, "gluon-split", False),
    "pp-gluon-split-kvcache": ("py", "split", 128, 2, 1, 16, True, None, -1, False, False, "gluon-split",
                               False),
    "pp-triton-nhd": ("py", "nhd", 128, 4, 2, 16, False, None, 63, False, False, "triton", True),
    "pp-triton-split-fp8": ("vllm", "split", 128, 4, 2, 16, False, "fp8", -1, False, False, "triton", False),
    "pp-triton-hnd": ("py", "hnd", 80, 4, 1, 17, False, None, -1, True, False, "triton", False),
    "pp-triton-kvcache": ("py", "split", 96, 2, 2, 16, True, None, -1, True, False, "triton", False),
    "pp-gluon-nhd-short": ("py", "nhd", 128, 64, 16, 16, False, None, -1, True, True, "gluon-nhd", True),
    "pp-gluon-split-short": ("vllm", "split", 128, 3, 1, 16, False, None, -1, False, True, "gluon-split",
                             True),
    "pp-triton-fp8-short": ("vllm", "split", 128, 8, 2, 16, False, "fp8", -1, False, True, "triton", True),
    "pp-gluon-nhd-noncausal": ("py", "nhd", 128, 4, 2, 16, False, None, (-1, 40), True, False, "gluon-nhd",
                               True),
    "pp-gluon-split-noncausal": ("py", "split", 128, 4, 2, 16, True, None, (-1, -1), False, False,
                                 "gluon-split", False),
    "pp-gluon-nhd-fp8": ("py", "nhd", 128, 4, 2, 16, False, "fp8", -1, False, False, "gluon-nhd", True),
    "pp-gluon-hnd-fp8-kvcache": ("py", "hnd-interleaved", 64, 4, 1, 16, True, "fp8", -1, True, False,
                                 "gluon-hnd", False),
    "pp-gluon-nhd-fp8-short": ("py", "nhd", 128, 64, 16, 16, False, "fp8", -1, False, True, "gluon-nhd",
                               False),
}
# fmt: on
TINY_PREFIX = ("pp-gluon-nhd", "pp-gluon-split-128", "pp-triton-kvcache")  # (as Triton plans, head 32)


def _pp_seqs(short: bool) -> list[tuple[int, int]]:
    """(context, query) of the batch: on the GPU a query longer than a 128-row tile, or with ``short``
    every query at most 30 rows (the short-query forms)."""
    if not GPU:
        return [(20, 9), (0, 5), (33, 12)]
    return [(40, 9), (0, 30), (130, 17)] if short else [(40, 9), (0, 300), (130, 17)]


def _pp_base(spec) -> dict:
    """A well-formed call of problem ``spec`` (host index tensors; device tensors otherwise)."""
    layout, d, heads, kv, page, from_cache, cache, _, alibi, short = spec[1:11]
    layout, _, interleaved = layout.partition("-")
    dt = torch.bfloat16 if GPU else torch.float16
    if not GPU:  # the interpreter: small heads
        d, heads, kv = 32, 2, 1
    seqs = _pp_seqs(short)
    q_lens, seq_lens = [n for _, n in seqs], [c + n for c, n in seqs]
    read = seq_lens if from_cache else [c for c, _ in seqs]
    pages = [-(-n // page) for n in seq_lens]
    width = max(-(-n // page) for n in read)
    store = torch.float8_e4m3fn if cache == "fp8" else dt
    x = 16 // store.itemsize
    table, k_shape, v_shape = exact_paged_layout(torch, pages, width, FAR, layout, kv, d, page, x)
    total = sum(q_lens)
    cu = [0]
    for n in q_lens:
        cu.append(cu[-1] + n)
    return {
        "q": _exact(torch.randn(total, heads, d).to(dt)),
        "k": None if from_cache else _exact(torch.randn(total, kv, d).to(dt)),
        "v": None if from_cache else _exact(torch.randn(total, kv, d).to(dt)),
        **_caches(k_shape, v_shape, store, bool(interleaved)),
        "alibi": _exact(torch.rand(heads) * 0.2) if alibi else None,
        "table": table,
        "cu": _i32(cu),
        "seq_lens": _i32(seq_lens),
        "max_len": max(q_lens),
        "nb": sum(pages),
    }


def _caches(k_shape, v_shape, store, interleaved: bool) -> dict:
    """``k_cache``/``v_cache`` of the shapes, each its own allocation, or (``interleaved``, one shape)
    the two halves ``kv[:, 0]``/``kv[:, 1]`` of one ``[num_blocks, 2, ...]`` allocation."""
    if not interleaved:
        return {
            "k_cache": _exact(torch.randn(k_shape).to(store)),
            "v_cache": _exact(torch.randn(v_shape).to(store)),
        }
    kv = _exact(torch.randn(k_shape[0], 2, *k_shape[1:]).to(store))
    return {"k_cache": kv[:, 0], "v_cache": kv[:, 1]}


def _pp_cases(c: dict) -> list[tuple[str, dict, int]]:
    """(name, changed host metadata, status bit) of each malformation of call ``c``."""
    table, cu, sl, mq, nb = c["table"], c["cu"], c["seq_lens"], c["max_len"], c["nb"]
    total = int(cu[-1])

    def tab(b: int, j: int, value: int) -> torch.Tensor:
        t = table.clone()
        t[b, j] = value
        return t

    def lens(b: int, value: int) -> torch.Tensor:
        t = sl.clone()
        t[b] = value
        return t

    swapped = _i32([0, int(cu[2]), int(cu[1]), int(cu[3])])
    return [
        ("block-id-past-cache", {"table": tab(0, 1, nb + 7)}, B.BLOCK_ID),
        ("block-id-negative", {"table": tab(2, 0, -1)}, B.BLOCK_ID),
        ("block-id-huge", {"table": tab(2, 1, 2**31 - 1)}, B.BLOCK_ID),
        ("table-too-narrow", {"table": table[:, :1].clone()}, B.TABLE_WIDTH),
        ("seq-len-past-table", {"seq_lens": lens(1, int(sl[1]) + 5000)}, B.TABLE_WIDTH),
        ("seq-len-huge", {"seq_lens": lens(0, 2**31 - 1)}, B.TABLE_WIDTH),
        ("seq-len-short", {"seq_lens": lens(2, 3)}, B.SEQ_LEN),
        ("seq-len-negative", {"seq_lens": lens(0, -100)}, B.SEQ_LEN),
        ("cu-decreasing", {"cu": swapped}, B.ROWS),
        ("cu-past-tokens", {"cu": _i32([0, int(cu[1]), int(cu[2]), total + 1000])}, B.ROWS),
        ("cu-negative", {"cu": _i32([-7, int(cu[1]), int(cu[2]), total])}, B.ROWS),
        ("cu-huge", {"cu": _i32([0, int(cu[1]), 2**31 - 1, 2**31 - 1])}, B.ROWS),
        ("max-len-small", {"max_len": max(mq // 3, 1)}, B.MAX_LEN),
        ("max-len-zero", {"max_len": 0}, B.MAX_LEN),
        ("everything", {"table": tab(2, 0, -5), "cu": _i32([0, int(cu[1]), int(cu[2]), total + 9]),
                        "seq_lens": lens(1, 1), "max_len": 1}, B.BLOCK_ID | B.ROWS | B.SEQ_LEN | B.MAX_LEN),
    ]  # fmt: skip


def _pp_window(spec) -> dict:
    """``prefix_prefill``'s window (and ``causal``) keywords of problem ``spec``."""
    if isinstance(spec[8], tuple):
        return {"window": spec[8], "causal": False}
    return {"window": (spec[8], -1)}


def _pp_call(spec, c: dict, meta: dict, out: torch.Tensor, **kw) -> None:
    """Problem ``spec``'s call on ``c`` with the index tensors of ``meta`` (device, exact)."""
    form, layout, cache, left = spec[0], spec[1].partition("-")[0], spec[7], spec[8]
    fp8 = cache == "fp8"
    if form == "vllm":
        one = torch.ones(1, device=DEV)
        kc, vc = (c["k_cache"].view(torch.uint8), c["v_cache"].view(torch.uint8)) if fp8 else (
            c["k_cache"], c["v_cache"])  # fmt: skip
        pp_caf(c["q"], c["k"], c["v"], out, "fp8" if fp8 else "auto", kc, vc, meta["table"], meta["cu"],
               meta["seq_lens"], None, meta["max_len"], one, one, c["alibi"], left + 1 if left >= 0 else None,
               **kw)  # fmt: skip
    else:
        prefix_prefill(c["q"], c["k"], c["v"], c["k_cache"], c["v_cache"], meta["table"], meta["cu"],
                       meta["seq_lens"], meta["max_len"], alibi_slopes=c["alibi"], kv_layout=layout, out=out,
                       **_pp_window(spec), **kw)  # fmt: skip


def _pp_plan(spec, c: dict):
    return pp_explain(c["q"], c["k"], c["v"], c["k_cache"], c["v_cache"], _exact(c["table"]), _exact(c["cu"]),
                      _exact(c["seq_lens"]), c["max_len"], alibi_slopes=c["alibi"],
                      kv_layout=spec[1].partition("-")[0], **_pp_window(spec))  # fmt: skip


# ---------------------------------------------------------------------------------- window-prefill
# name: (form, head, heads, kv, left window, config, plan on sm90, also without status=)
WINDOW = {
    "wp-triton": ("py", 64, 4, 2, 31, None, "triton", True),
    "wp-triton-vllm": ("vllm", 128, 4, 1, 31, None, "triton", False),
    "wp-gluon": ("py", 128, 4, 2, -1, None, "gluon", True),
    "wp-gluon-vllm": ("vllm", 256, 2, 1, 63, None, "gluon", False),
}
TINY_WINDOW = ("wp-triton", "wp-triton-vllm")


def _wp_base(spec) -> dict:
    d, heads, kv = spec[1:4]
    dt = torch.bfloat16 if GPU else torch.float16
    if not GPU:  # the interpreter: small heads
        d, heads, kv = 32, 2, 1
    lens = [300, 17, 129] if GPU else [10, 14, 5]
    total = sum(lens)
    starts = [0]
    for n in lens[:-1]:
        starts.append(starts[-1] + n)
    return {
        "q": _exact(torch.randn(total, heads, d).to(dt)),
        "k": _exact(torch.randn(total, kv, d).to(dt)),
        "v": _exact(torch.randn(total, kv, d).to(dt)),
        "starts": _i32(starts),
        "lens": _i32(lens),
        "cu": _i32([*starts, total]),
        "max_len": max(lens),
    }


def _wp_cases(spec, c: dict) -> list[tuple[str, dict, int]]:
    cu, starts, lens, mq = c["cu"], c["starts"], c["lens"], c["max_len"]
    total = int(cu[-1])
    small = {"max_len": max(mq // 3, 1)}
    if spec[0] == "vllm":

        def at(t: torch.Tensor, b: int, value: int) -> torch.Tensor:
            t = t.clone()
            t[b] = value
            return t

        return [
            ("start-negative", {"starts": at(starts, 1, -4)}, B.ROWS),
            ("len-negative", {"lens": at(lens, 2, -9)}, B.ROWS),
            ("len-past-tokens", {"lens": at(lens, 2, 4000)}, B.ROWS),
            ("start-past-tokens", {"starts": at(starts, 0, total + 3)}, B.ROWS),
            ("len-huge", {"lens": at(lens, 0, 2**31 - 1)}, B.ROWS),
            ("max-len-small", small, B.MAX_LEN),
            ("max-len-zero", {"max_len": 0}, B.MAX_LEN),
        ]
    c1, c2 = int(cu[1]), int(cu[2])
    return [
        ("cu-decreasing", {"cu": _i32([0, c2, c1, total])}, B.ROWS),
        ("cu-past-tokens", {"cu": _i32([0, c1, c2, total + 1000])}, B.ROWS),
        ("cu-negative", {"cu": _i32([-3, c1, c2, total])}, B.ROWS),
        ("cu-huge", {"cu": _i32([0, c1, 2**31 - 1, 2**31 - 1])}, B.ROWS),
        ("max-len-small", small, B.MAX_LEN),
        ("max-len-zero", {"max_len": 0}, B.MAX_LEN),
        ("everything", {"cu": _i32([-1, c2, c1, total + 5]), "max_len": 1}, B.ROWS | B.MAX_LEN),
    ]


@contextlib.contextmanager
def _gluon_width(spec):
    """For a spec planned on the Gluon kernel: window-prefill's width rule at one key, so its tiny problems
    take that kernel (as the GPU tests of narrow windows do)."""
    if spec[6] != "gluon":
        yield
        return
    old = wp_plan._GLUON_MIN_WIDTH
    wp_plan._GLUON_MIN_WIDTH = dict.fromkeys(old, 1)
    try:
        yield
    finally:
        wp_plan._GLUON_MIN_WIDTH = old


def _wp_call(spec, c: dict, meta: dict, out: torch.Tensor, **kw) -> None:
    form, left, config = spec[0], spec[4], spec[5]
    with _gluon_width(spec):
        if form == "vllm":
            wp_caf(c["q"], c["k"], c["v"], out, meta["starts"], meta["lens"], meta["max_len"], True, None,
                   left if left > 0 else None, config=config, **kw)  # fmt: skip
        else:
            window_prefill(c["q"], c["k"], c["v"], meta["cu"], meta["max_len"], window=(left, -1), out=out,
                           config=config, **kw)  # fmt: skip


def _wp_plan(spec, c: dict):
    with _gluon_width(spec):
        return wp_explain(c["q"], c["k"], c["v"], _exact(c["cu"]), c["max_len"], window=(spec[4], -1),
                          config=spec[5])  # fmt: skip


# ---------------------------------------------------------------------------------------- checks
def _spans(meta: dict, total: int) -> list[tuple[int, int]]:
    """Every sequence's rows as the kernels clamp them into ``[0, total)``: from ``cu``, or from
    ``starts``/``lens`` (vLLM's window form)."""
    if "cu" in meta:
        pairs = list(itertools.pairwise(meta["cu"].tolist()))
    else:
        pairs = [(s, s + n) for s, n in zip(meta["starts"].tolist(), meta["lens"].tolist(), strict=True)]
    spans = []
    for a, b in pairs:
        s = min(max(a, 0), total)
        spans.append((s, min(max(b, s), total)))
    return spans


def _check(out: torch.Tensor, meta: dict, block_m: int) -> str | None:
    """What is wrong with ``out`` (None: nothing): a row a sequence spans not finite, or a row past its
    grid (``cdiv(max_len, block_m)`` tiles, at least one) not 0 where no other sequence's tiles cover
    it (malformed spans may overlap)."""
    grid_rows = max(-(-meta["max_len"] // block_m), 1) * block_m
    out = out.float().cpu()
    spans = _spans(meta, out.shape[0])
    computed = torch.zeros(out.shape[0], dtype=torch.bool)
    for s, e in spans:
        computed[s : min(e, s + grid_rows)] = True
    for s, e in spans:
        rows = out[s:e]
        if not torch.isfinite(rows).all():
            bad = int((~torch.isfinite(rows)).any(-1).any(-1).nonzero()[0])
            return f"row {s + bad} of span [{s}, {e}) not finite"
        past = ~computed[s + grid_rows : e]
        if past.any() and not (out[s + grid_rows : e][past] == 0).all():
            return f"a row past the grid ({grid_rows} rows) of span [{s}, {e}) is not 0"
    return None


def run_problem(name: str, spec, pkg: str) -> tuple[int, list[str]]:
    """Every malformation of one problem: (cases run, failures)."""
    prefix = pkg == "prefix"
    c = _pp_base(spec) if prefix else _wp_base(spec)
    if prefix:
        c["layout"] = spec[1]
        malformations, call, plan = _pp_cases(c), _pp_call, _pp_plan(spec, c)
        keys = ("table", "cu", "seq_lens")
    else:
        malformations, call, plan = _wp_cases(spec, c), _wp_call, _wp_plan(spec, c)
        keys = ("starts", "lens") if spec[0] == "vllm" else ("cu",)
    expected = spec[-2]
    failures: list[str] = []
    if SM90 and plan.kernel != expected:
        failures.append(f"{name}: planned {plan.kernel!r}, not {expected!r} ({plan.reason})")
    print(f"{name}: {plan.kernel} ({plan.reason})", flush=True)
    n = 0
    for case, change, bit in malformations:
        host = {k: c[k] for k in (*keys, "max_len")}
        host.update(change)
        for with_status in (True, False) if spec[-1] and GPU else (True,):
            meta = {k: (_exact(v) if k in keys else v) for k, v in host.items()}  # index tensors last
            status = _exact(torch.zeros(1, dtype=torch.int32)) if with_status else None
            out = _poisoned(c["q"].shape, c["q"].dtype)
            label = f"{name} {case}" + ("" if with_status else " (no status)")
            n += 1
            try:
                call(spec, c, meta, out, status=status)
                if GPU:
                    torch.cuda.synchronize()
            except Exception as e:  # a launch that fails is the finding
                failures.append(f"{label}: raised {type(e).__name__}: {e}")
                continue
            wrong = _check(out, host, plan.block_m)
            if wrong:
                failures.append(f"{label}: {wrong}")
            if status is not None and not int(status.item()) & bit:
                got = B.status_names(int(status.item()))
                failures.append(f"{label}: status {got} lacks {B.status_names(bit)}")
            if with_status:
                try:
                    call(spec, c, meta, _poisoned(c["q"].shape, c["q"].dtype), validate=True)
                    failures.append(f"{label}: validate=True did not raise")
                except ValueError:
                    pass
    return n, failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=["window", "prefix"], help="run one package's problems")
    ap.add_argument("--problems", default=None, metavar="NAME,...", help="run only these problems")
    args = ap.parse_args()
    chosen = set(args.problems.split(",")) if args.problems else None
    t0 = time.monotonic()
    torch.manual_seed(0)
    if not GPU:
        print("no GPU: the tiny subset under the Triton interpreter (Triton kernels, fp16)")
    n, failures = 0, []
    for pkg, table, tiny in (("window", WINDOW, TINY_WINDOW), ("prefix", PREFIX, TINY_PREFIX)):
        if args.only not in (None, pkg):
            continue
        for name, spec in table.items():
            if (chosen is not None and name not in chosen) or (not GPU and name not in tiny):
                continue
            k, f = run_problem(name, spec, pkg)
            n += k
            failures += f
            print(f"  {k} cases, {len(f)} failed ({time.monotonic() - t0:.0f} s)", flush=True)
    for f in failures:
        print("FAILED", f)
    if failures:
        print(f"{len(failures)} failures in {n} cases")
        return 1
    print(f"{n} cases OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
