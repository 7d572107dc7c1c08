"""The Gluon kernels' forms on small problems, meant to run under the synchronisation checkers:

    compute-sanitizer --tool synccheck python bench/sanitize_gluon.py
    python bench/sanitize_gluon.py --consan-all --jobs 12 --out DIR   # Triton's ConSan, every case

The Gluon kernels share memory between warps through mbarrier-guarded rings (TMA loads, wgmma reads),
which memcheck does not judge; synccheck reports misuse of barriers. Triton's concurrency sanitizer
(ConSan: ``TRITON_INSTRUMENTATION_MODE=consan``, global scratch from ``triton.set_allocator``) checks
the rings themselves: it instruments every shared-memory access, mbarrier, TMA copy and wgmma commit
group of the kernel and traps on an access that no barrier orders. ``--consan --case I`` runs one case
instrumented (a trap ends the process, so each case runs in its own); ``--consan-all`` runs every case
in ``--jobs`` child processes for each ``--variants`` entry (``default``: the plans as shipped; ``o1``:
ptxas at ``--opt-level 1``; ``modeled``: with ``--modeled-arrivals``) and writes one log per run and
``consan.md`` into ``--out``. ``--set NAME=VALUE`` overrides a constexpr of both
packages' Gluon plans (``bench/plan_override.py``).
Each case is one planned Gluon form (``explain()`` must name a Gluon kernel, else the case fails):
prefix-prefill's NHD kernel (heads 64/128/256, pages 16 and 544, and pages of 1 to 40 tokens: boxes
of 8 rows or gathered rows, new K/V given or read from the cache) and its split-cache kernel (K by
gathers, by 16-key TMA runs and by wide boxes; V by gathers and by TMA), and window-prefill's kernel
(heads 64/128/256, full causal and a wide left window). Each case runs twice, before and after
:func:`prefix_prefill.finish_compiles` (the first call may run the quick-compiling form), and both answers
are compared with ``attn_reference``. Prints ``N cases OK`` (exit 0) or the failing cases (exit 1); needs
an sm90 GPU.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import subprocess
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_package_paths
from plan_override import overridden, parse_sets

add_package_paths()  # (and bench/ off sys.path: its prefix_prefill.py would shadow the package)
if "--consan" in sys.argv:  # before triton is imported: its compiles read the mode
    os.environ["TRITON_INSTRUMENTATION_MODE"] = "consan"

import contextlib  # noqa: E402

import torch  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.ampere import async_copy  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import mbarrier  # noqa: E402

import attn_reference as ref  # noqa: E402
import prefix_prefill as pp  # noqa: E402
import window_prefill as wp  # noqa: E402

DEV, DT = "cuda", torch.bfloat16

# prefix: (layout, head, page, kv_from_cache, return_lse, the Gluon kernel its plan must name)
PREFIX = [
    ("nhd", 64, 16, False, False, "gluon-nhd"),
    ("nhd", 128, 544, True, False, "gluon-nhd"),
    ("nhd", 128, 16, False, True, "gluon-nhd"),
    ("nhd", 256, 16, False, False, "gluon-nhd"),
    ("split", 64, 32, True, False, "gluon-split"),  # K and V by gathers
    ("split", 64, 16, False, True, "gluon-split"),  # the new tokens' V transposed by the V producer
    ("split", 128, 16, False, False, "gluon-split"),  # K by 16-key TMA runs, V by gathers
    ("split", 128, 128, False, True, "gluon-split"),  # K by wide boxes, one consumer partition
    ("split", 128, 544, True, False, "gluon-split"),
    ("split", 256, 16, False, False, "gluon-split"),  # K chunk-major and V by TMA
]
# the model options the Gluon kernels take, all on (a left window wider than the plan's Gluon rule)
OPTIONS = {"window": (2100, -1), "softcap": 30.0, "sinks": True, "alibi": True}
PREFIX_OPTIONS = [
    ("nhd", 128, 16, False, True, "gluon-nhd"),
    ("split", 128, 16, False, False, "gluon-split"),
    ("split", 64, 544, True, False, "gluon-split"),
]
# queries of <= 64 rows, plain and with every option: with 32 / 8 heads the forms whose second consumer
# warpgroup takes the next head (PAIR_HEADS), with 6 / 2 those whose second warpgroup only drains the
# rings (IDLE_WG1): (layout, head, page, kv_from_cache, return_lse, plan, options, heads)
PREFIX_SHORT = [
    ("nhd", 128, 16, False, True, "gluon-nhd", False, (32, 8)),
    ("nhd", 256, 16, True, False, "gluon-nhd", False, (32, 8)),
    ("split", 64, 16, False, False, "gluon-split", False, (32, 8)),  # the new tokens' V transposed (V_STAGE)
    ("split", 128, 16, False, True, "gluon-split", False, (32, 8)),  # K by 16-key TMA runs, V by gathers
    ("split", 128, 544, True, False, "gluon-split", False, (32, 8)),  # K by wide boxes, two consumers
    ("split", 256, 16, False, False, "gluon-split", False, (32, 8)),  # K chunk-major and V by TMA
    ("nhd", 128, 16, False, False, "gluon-nhd", True, (32, 8)),
    ("split", 128, 16, False, True, "gluon-split", True, (32, 8)),
    ("nhd", 128, 16, False, True, "gluon-nhd", False, (6, 2)),
    ("split", 64, 16, False, False, "gluon-split", False, (6, 2)),
    ("split", 256, 16, False, False, "gluon-split", False, (6, 2)),
    ("split", 128, 16, False, True, "gluon-split", True, (6, 2)),
    ("hnd", 128, 16, False, True, "gluon-hnd", True, (32, 8)),
]
# HND caches on the NHD/HND kernel (numbered after the cases above, which keep their numbers)
PREFIX_HND = [
    ("hnd", 128, 544, False, True, "gluon-hnd"),
    ("hnd", 256, 16, True, False, "gluon-hnd"),
]
# fp8 caches on the NHD/HND kernel (CACHE_FP8: staging slots, the converter partition) and, last, on the
# split kernel (the gathering producers fill the staging slots; vLLM's x = 16), numbered after the cases
# above: (layout, head, page, kv_from_cache, return_lse, plan, options, queries <= 64, heads, fp8 dtype,
# aligned), with k_scale 0.5 and v_scale 1.5; aligned: every context and new-token length a multiple of the
# key block, so no block sticks out of its segment and the consumers zero no V rows
PREFIX_FP8 = [
    ("nhd", 128, 16, False, True, "gluon-nhd", False, False, (8, 2), torch.float8_e4m3fn, False),
    ("nhd", 64, 544, True, False, "gluon-nhd", True, False, (8, 2), torch.float8_e5m2, False),
    ("nhd", 128, 16, False, False, "gluon-nhd", True, True, (32, 8), torch.float8_e4m3fn, False),  # paired
    ("hnd", 128, 16, False, True, "gluon-hnd", False, True, (6, 2), torch.float8_e5m2, False),  # idle
    ("nhd", 128, 16, False, True, "gluon-nhd", False, False, (8, 2), torch.float8_e4m3fn, True),
    ("nhd", 64, 544, True, False, "gluon-nhd", False, False, (8, 2), torch.float8_e5m2, True),
    ("split", 128, 16, False, True, "gluon-split", False, False, (8, 2), torch.float8_e4m3fn, False),
    ("split", 64, 32, True, False, "gluon-split", True, False, (8, 2), torch.float8_e5m2, False),
    ("split", 128, 16, False, False, "gluon-split", True, True, (32, 8), torch.float8_e4m3fn, False),
    ("split", 256, 16, False, True, "gluon-split", True, False, (8, 2), torch.float8_e4m3fn, False),
]
# the persistent form of the NHD/HND kernel (a narrow left window, 127, with sinks; PERSISTENT), numbered
# after the cases above: the fields of PREFIX_FP8 (no fp8 cache) and ``narrow``; with 32 / 8 heads the
# launch has several tiles a program (the tile slots' handoff and the rings carried from tile to tile).
# Both calls of these cases run the persistent form (the compile tiers off): the quick tier's form has
# 8-warp consumers whose per-thread slot releases Triton 3.6's ConSan does not model (see
# ``_modeled_arrivals``), so under the shipped arrivals it faults there; the cases above check that form.
PREFIX_PERSISTENT = [
    ("nhd", 128, 16, False, True, "gluon-nhd", False, False, (32, 8), None, False, True),
    ("hnd", 64, 544, True, False, "gluon-hnd", False, False, (8, 2), None, False, True),
]
# pages that are not multiples of 16 on the NHD/HND kernel (numbered after the cases above): 8 tokens or 8
# times an odd number, boxes of 8 rows (16 a key block at heads 64/128, the producers' larger register
# budget), and the others at head 256, the context's rows gathered by cp.async (GATHER, the four after them);
# vLLM's split cache at pages of 8 and 24 (K and V gathered, the last two): the fields of PREFIX_FP8 and,
# last, ``narrow`` (the persistent form)
PREFIX_SMALL_PAGES = [
    ("nhd", 128, 8, False, True, "gluon-nhd", False, False, (8, 2), None, False, False),
    ("hnd", 64, 24, True, False, "gluon-hnd", True, False, (8, 2), None, False, False),
    ("nhd", 256, 40, False, False, "gluon-nhd", False, False, (8, 2), None, False, False),
    ("nhd", 128, 24, False, True, "gluon-nhd", False, True, (32, 8), None, False, False),  # paired
    ("nhd", 128, 8, False, True, "gluon-nhd", False, False, (8, 2), torch.float8_e4m3fn, False, False),
    ("nhd", 128, 8, False, True, "gluon-nhd", False, False, (32, 8), None, False, True),  # persistent
    ("nhd", 256, 1, False, True, "gluon-nhd", False, False, (8, 2), None, False, False),
    ("hnd", 256, 12, True, False, "gluon-hnd", True, False, (8, 2), None, False, False),
    ("nhd", 256, 3, False, False, "gluon-nhd", False, True, (32, 8), None, False, False),  # paired
    ("nhd", 256, 5, True, True, "gluon-nhd", True, True, (6, 2), None, False, False),  # idle
    ("split", 128, 8, False, True, "gluon-split", False, False, (8, 2), None, False, False),  # K, V gathered
    ("split", 64, 24, True, False, "gluon-split", True, True, (32, 8), None, False, False),
]
# queries of at most 8 tokens on the 16-bit forms: a KV head's query heads packed into the first consumer
# warpgroup's rows (PACK: 4, 8 and 3 heads a KV head, 16, 8 and 16 rows each, the last with 16 padding rows),
# numbered after the cases above: (layout, head, page, kv_from_cache, return_lse, plan, heads[, fp8 cache])
PREFIX_PACKED = [
    ("nhd", 128, 16, False, True, "gluon-nhd", (32, 8)),
    ("hnd", 64, 544, True, False, "gluon-hnd", (16, 2)),
    ("nhd", 256, 24, False, True, "gluon-nhd", (6, 2)),
    ("split", 128, 16, False, True, "gluon-split", (32, 8)),  # K by 16-key TMA runs, V by gathers
    ("split", 64, 24, True, False, "gluon-split", (16, 2)),  # K and V gathered
    ("nhd", 128, 16, False, True, "gluon-nhd", (32, 8), torch.float8_e4m3fn),  # beside the converter
    ("split", 128, 16, True, False, "gluon-split", (16, 2), torch.float8_e5m2),
]
# window: (head, sequence lengths, window, return_lse)
WINDOW = [
    (64, [2100, 300], (2047, -1), False),
    (128, [2300], (-1, -1), True),
    (256, [2100, 40], (-1, -1), False),
]


def _prefix_case(
    layout: str,
    d: int,
    page: int,
    from_cache: bool,
    lse: bool,
    want_kernel: str,
    options: bool = False,
    short: bool = False,
    heads: tuple[int, int] = (8, 2),
    fp8: torch.dtype | None = None,
    aligned: bool = False,
    narrow: bool = False,
    packed: bool = False,
) -> list[str]:
    ctx, new = ([2400, 37], [300, 70]) if options else ([300, 37], [150, 70])
    if narrow:  # (one long query, a short one, a one-token one: live and dead tiles of the persistent form)
        ctx, new = [300, 37, 900], [1500, 70, 1]
    if aligned:  # (every segment whole key blocks of 128: the kernels' BLOCK_N at heads 64 and 128)
        ctx, new = [256, 128], [128, 256]
    h, hk = heads
    if short:  # max_query_len <= 64: the second consumer warpgroup pairs heads (with 32 / 8 heads over
        # these 6 sequences the idle grid, 192 programs, is more than one wave) or idles (6 / 2)
        ctx, new = [2400, 37, 600, 0, 129, 1700], [4, 60, 8, 64, 37, 1]
    if packed:  # max_query_len <= 8: a KV head's query heads packed into one warpgroup's rows
        ctx, new = [2400, 37, 600, 0, 129, 1700], [4, 8, 8, 3, 7, 1]
    seq = [c + n for c, n in zip(ctx, new, strict=True)]
    pages = [-(-s // page) for s in seq]
    nb = sum(pages) + 1
    cdt = DT if fp8 is None else fp8  # (an fp8 cache: values of 2 * N(0, 1), scales 0.5 / 1.5)
    if layout == "split":  # (x = 16 bytes of features a slot: 8 for 16-bit, 16 for fp8)
        x = 8 if fp8 is None else 16
        k_cache = (torch.randn(nb, hk, d // x, page, x, device=DEV) * (1 if fp8 is None else 2)).to(cdt)
        v_cache = (torch.randn(nb, hk, d, page, device=DEV) * (1 if fp8 is None else 2)).to(cdt)
    elif layout == "hnd":
        k_cache = (torch.randn(nb, hk, page, d, device=DEV) * (1 if fp8 is None else 2)).to(cdt)
        v_cache = (torch.randn(nb, hk, page, d, device=DEV) * (1 if fp8 is None else 2)).to(cdt)
    else:
        k_cache = (torch.randn(nb, page, hk, d, device=DEV) * (1 if fp8 is None else 2)).to(cdt)
        v_cache = (torch.randn(nb, page, hk, d, device=DEV) * (1 if fp8 is None else 2)).to(cdt)
    table = torch.zeros(len(seq), max(pages), dtype=torch.int32)
    perm, at = torch.randperm(nb - 1) + 1, 0
    for b, n in enumerate(pages):
        table[b, :n] = perm[at : at + n].to(torch.int32)
        at += n
    table = table.to(DEV)
    cu = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
    sl = torch.tensor(seq, dtype=torch.int32, device=DEV)
    q = torch.randn(sum(new), h, d, device=DEV).to(DT)
    k = v = None
    if not from_cache:
        k = torch.randn(sum(new), hk, d, device=DEV).to(DT)
        v = torch.randn(sum(new), hk, d, device=DEV).to(DT)
    args = (q, k, v, k_cache, v_cache, table, cu, sl, max(new))
    kw = {}
    if options:
        kw = dict(window=OPTIONS["window"], softcap=OPTIONS["softcap"],
                  sinks=torch.randn(h, device=DEV), alibi_slopes=torch.rand(h, device=DEV) * 0.1)  # fmt: skip
    if fp8 is not None:
        kw.update(k_scale=0.5, v_scale=1.5)
    if narrow:
        kw = dict(window=(127, -1), sinks=torch.randn(h, device=DEV))
    kernel = pp.explain(*args, kv_layout=layout, return_lse=lse, **kw).kernel
    if kernel != want_kernel:
        return [f"planned {kernel}, not {want_kernel}"]
    ref_kw = {n: (t.cpu() if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
    if fp8 is not None:
        ref_kw["fp8_dtype"] = fp8
    want = ref.paged_prefix_attention(*(t.cpu() if t is not None else None for t in args[:-1]), layout=layout,
                                      **ref_kw)  # fmt: skip
    bad = []
    for when in ("first", "full"):
        with _tiers_off() if narrow else contextlib.nullcontext():  # (PREFIX_PERSISTENT: that form alone)
            res = pp.prefix_prefill(*args, kv_layout=layout, return_lse=lse, **kw)
        out = res[0] if lse else res
        torch.cuda.synchronize()
        res = ref.compare(out.cpu(), want)
        if not res:
            bad.append(f"{when}: {res}")
        pp.finish_compiles()
    return bad


@contextlib.contextmanager
def _tiers_off():
    """prefix-prefill's compile tiers off for the calls inside (``PREFIX_PREFILL_GLUON_TIERED=0``)."""
    before = os.environ.get("PREFIX_PREFILL_GLUON_TIERED")
    os.environ["PREFIX_PREFILL_GLUON_TIERED"] = "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ["PREFIX_PREFILL_GLUON_TIERED"]
        else:
            os.environ["PREFIX_PREFILL_GLUON_TIERED"] = before


def _window_case(
    d: int, lens: list[int], window: tuple[int, int], lse: bool, options: bool = False
) -> list[str]:
    n, h, hk = sum(lens), 4, 2
    q = torch.randn(n, h, d, device=DEV).to(DT)
    k = torch.randn(n, hk, d, device=DEV).to(DT)
    v = torch.randn(n, hk, d, device=DEV).to(DT)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
    kw = dict(sinks=torch.randn(h, device=DEV), softcap=OPTIONS["softcap"]) if options else {}
    kernel = wp.explain(q, k, v, cu, max(lens), causal=True, window=window, **kw).kernel
    if kernel != "gluon":
        return [f"planned {kernel}, not gluon"]
    ref_kw = {n: (t.cpu() if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
    want = ref.attention_varlen(q.cpu(), k.cpu(), v.cpu(), cu.cpu(), cu.cpu(), causal=True, window=window,
                                **ref_kw)  # fmt: skip
    res = wp.window_prefill(q, k, v, cu, max(lens), causal=True, window=window, return_lse=lse, **kw)
    out = res[0] if lse else res
    torch.cuda.synchronize()
    res = ref.compare(out.cpu(), want)
    return [] if res else [str(res)]


def _cases() -> list[tuple[str, object, tuple]]:
    cases = [
        (f"prefix {c[0]} d{c[1]} page {c[2]} from_cache={c[3]} lse={c[4]}", _prefix_case, c) for c in PREFIX
    ]
    cases += [
        (f"prefix {c[0]} d{c[1]} page {c[2]} kv_from_cache={c[3]} lse={c[4]} all options", _prefix_case,
         (*c, True))
        for c in PREFIX_OPTIONS
    ]  # fmt: skip
    cases += [(f"window d{c[0]} lens {c[1]} window {c[2]} lse={c[3]}", _window_case, c) for c in WINDOW]
    cases += [(f"window d{c[0]} lens {c[1]} window {c[2]} sinks softcap", _window_case, (*c, True))
              for c in WINDOW[:2]]  # fmt: skip
    return cases + [
        (f"prefix {c[0]} d{c[1]} page {c[2]} kv_from_cache={c[3]} lse={c[4]} queries <= 64, heads "
         f"{c[7][0]}/{c[7][1]} ({'paired' if c[7][0] // c[7][1] % 2 == 0 else 'idle'})"
         f"{' all options' if c[6] else ''}", _prefix_case, (*c[:7], True, c[7]))
        for c in PREFIX_SHORT
    ] + [(f"prefix {c[0]} d{c[1]} page {c[2]} from_cache={c[3]} lse={c[4]}", _prefix_case, c)
         for c in PREFIX_HND] + [
        (f"prefix {c[0]} d{c[1]} page {c[2]} kv_from_cache={c[3]} lse={c[4]} fp8 cache {str(c[9])[6:]}, "
         f"heads {c[8][0]}/{c[8][1]}{', queries <= 64' if c[7] else ''}{' all options' if c[6] else ''}"
         f"{', aligned (no V-row zeroing)' if c[10] else ''}", _prefix_case, c)
        for c in PREFIX_FP8
    ] + [
        (f"prefix {c[0]} d{c[1]} page {c[2]} kv_from_cache={c[3]} lse={c[4]} persistent (left 127, sinks), "
         f"heads {c[8][0]}/{c[8][1]}", _prefix_case, c)
        for c in PREFIX_PERSISTENT
    ] + [
        (f"prefix {c[0]} d{c[1]} page {c[2]} kv_from_cache={c[3]} lse={c[4]} "
         f"{'rows gathered' if c[2] % 8 or c[0] == 'split' else 'boxes of 8 rows'}, heads "
         f"{c[8][0]}/{c[8][1]}{', queries <= 64' if c[7] else ''}{' all options' if c[6] else ''}"
         f"{f', fp8 cache {str(c[9])[6:]}' if c[9] is not None else ''}"
         f"{', persistent (left 127, sinks)' if c[11] else ''}", _prefix_case, c)
        for c in PREFIX_SMALL_PAGES
    ] + [
        (f"prefix {c[0]} d{c[1]} page {c[2]} kv_from_cache={c[3]} lse={c[4]} queries <= 8, heads "
         f"{c[6][0]}/{c[6][1]} packed{f', fp8 cache {str(c[7])[6:]}' if len(c) > 7 else ''}", _prefix_case,
         (*c[:6], False, False, c[6], c[7] if len(c) > 7 else None, False, False, True))
        for c in PREFIX_PACKED
    ]  # fmt: skip


# --consan-all variants: (extra arguments, extra environment) of a child process
VARIANTS = {
    "default": ([], {}),
    "o1": ([], {"PTXAS_OPTIONS": "--opt-level 1"}),
    "modeled": (["--modeled-arrivals"], {}),
}


def _modeled_arrivals():
    """Both per-thread ``cp.async.mbarrier.arrive.noinc`` arrivals of the Gluon kernels replaced by the
    form Triton 3.6's ConSan models, with the same ordering (installed before the first compile):

    * the gathering threads (the split kernel's, the NHD/HND kernel's ``GATHER`` form) publish a slot
      after ``commit_group`` / ``wait_group(0)`` (their copies landed) by one elected arrival of the
      partition's thread count;
    * a consumer partition of 8 warps (``WARPGROUPS == 2``: the NHD kernel's quick form, the split
      kernel's one-consumer forms) releases a slot by one elected arrival of its 256 threads' count
      (Triton puts a barrier of the partition before an elected arrival, so every thread's wgmma wait
      precedes it).

    Triton 3.6's ConSan does not take ``cp.async.mbarrier.arrive`` as an arrival
    (triton-lang/triton#11626 adds it), so with the shipped arrivals it reports the slot's accesses as
    unordered: the gathers as pending at the consumers' reads, and the consumers' reads as outstanding at
    the producers' next write (where the report's own text is lost: ``__assertfail`` faults as an
    illegal instruction in the producer warp)."""
    import prefill_runtime.gluon as rt_gluon
    import prefix_prefill.gluon_kernel as nhd
    import prefix_prefill.gluon_split_kernel as split

    split._publish_gathers = nhd._publish_gathers = _publish_waited  # (the split kernel imports it by name)
    rt_gluon._release = _release_elected


@gluon.jit
def _publish_waited(bar):
    """``_modeled_arrivals``' gather publish: the thread's copies completed, then one elected arrival."""
    async_copy.commit_group()
    async_copy.wait_group(0)
    mbarrier.arrive(bar, count=32 * gl.num_warps())


@gluon.jit
def _release_elected(bar, WARPGROUPS: gl.constexpr):
    """``_modeled_arrivals``' slot release: one elected arrival of the partition's count."""
    if WARPGROUPS == 2:
        mbarrier.arrive(bar, count=256)
    else:
        mbarrier.arrive(bar, count=1)


def _consan_all(args) -> int:
    """Every (variant, case) in a child process under ConSan; one log each and a table in consan.md."""
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    names = [c[0] for c in _cases()]
    chosen = [int(i) for i in args.cases.split(",")] if args.cases else range(len(names))
    runs = [(v, i) for v in args.variants.split(",") for i in chosen]

    def one(run):
        variant, i = run
        extra, env = VARIANTS[variant]
        sets = [a for kv in args.set for a in ("--set", kv)]
        # the child dumps its Python stacks shortly before the hang guard: a compile or a kernel wait
        stacks = ["--stacks-after", str(max(args.timeout - 15, 1))]
        cmd = [sys.executable, __file__, "--consan", "--case", str(i), *stacks, *extra, *sets]
        t0 = time.time()
        try:
            proc = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True,
                                  timeout=args.timeout)  # fmt: skip
            rc, text = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as e:
            raw = (e.stdout, e.stderr)
            parts = [p.decode(errors="replace") if isinstance(p, bytes) else p or "" for p in raw]
            rc, text = "timeout", "".join(parts) + f"\nhang guard: no exit after {args.timeout:.0f} s"
        (out / f"consan_{variant}_{i}.log").write_text(text)
        return variant, i, rc, time.time() - t0, text

    rows, failed = [], 0
    with ThreadPoolExecutor(args.jobs) as pool:
        for variant, i, rc, secs, text in pool.map(one, runs):
            ok = rc == 0 and " ok" in text
            failed += not ok
            lines = [ln for ln in text.splitlines() if ln.strip()]
            why = "" if ok else (lines[-1][:160] if lines else "no output")
            verdict = "ok" if ok else "FAILED"
            rows.append(f"| {variant} | {names[i]} | {verdict} | {rc} | {secs:.0f} | {why} |")
            print(rows[-1], flush=True)
    head = "| variant | case | verdict | exit | s | last line |\n|---|---|---|---|---|---|\n"
    table = head + "\n".join(rows)
    (out / "consan.md").write_text(table + "\n")
    print(f"consan: {len(runs) - failed} of {len(runs)} runs clean")
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=["prefix", "window"], help="one package's cases")
    ap.add_argument("--list", action="store_true", help="print the cases, numbered, and exit")
    ap.add_argument("--case", type=int, default=None, help="run only case I (see --list)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a constexpr of both packages' Gluon plans, overridden")  # fmt: skip
    ap.add_argument("--consan", action="store_true", help="run under Triton's ConSan instrumentation")
    ap.add_argument("--modeled-arrivals", action="store_true",
                    help="the per-thread cp.async arrivals in the form ConSan 3.6 models")  # fmt: skip
    ap.add_argument("--consan-all", action="store_true", help="every case and variant under ConSan")
    ap.add_argument("--variants", default="default", help=f"--consan-all: comma list of {sorted(VARIANTS)}")
    ap.add_argument("--jobs", type=int, default=8, help="--consan-all: child processes at once")
    ap.add_argument("--cases", default="", help="--consan-all: comma list of case numbers (default all)")
    ap.add_argument("--timeout", type=float, default=420, help="--consan-all: a child's hang guard (s)")
    ap.add_argument("--out", type=Path, default=Path("consan-out"), help="--consan-all: log folder")
    ap.add_argument("--stacks-after", type=float, default=0, help="dump every thread's stack after S s")
    args = ap.parse_args()
    if args.stacks_after > 0:
        faulthandler.dump_traceback_later(args.stacks_after)
    # a Gluon kernel that fails to build or launch falls back to the Triton kernel with a warning: here
    # that is the case's failure (with the compile error's whole chain), not a pass of the other kernel
    warnings.filterwarnings("error", message=r".*the Gluon kernel failed", category=RuntimeWarning)
    cases = _cases()
    if args.list:
        for i, (name, _, _) in enumerate(cases):
            print(i, name)
        return 0
    if args.consan_all:
        return _consan_all(args)
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):
        print("needs an sm90 GPU (the Gluon kernels run there only)")
        return 1
    if args.consan:
        import triton

        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=DEV))
    if args.modeled_arrivals:
        _modeled_arrivals()
    torch.manual_seed(0)
    if args.case is not None:
        cases = [cases[args.case]]
    elif args.only:
        cases = [c for c in cases if c[0].startswith(args.only)]
    consts = parse_sets(args.set, ap.error)
    failed = 0
    for name, run, case in cases:
        with contextlib.ExitStack() as stack:
            if consts:
                stack.enter_context(overridden("prefix_prefill", consts, kernel="gluon"))
                stack.enter_context(overridden("window_prefill", consts, kernel="gluon"))
            bad = run(*case)
        print(name, "ok" if not bad else f"FAILED {bad}", flush=True)
        failed += bool(bad)
    if failed:
        print(f"{failed} of {len(cases)} cases FAILED")
        return 1
    print(f"{len(cases)} cases OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
