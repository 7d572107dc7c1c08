"""The Gluon kernels' forms on small problems, meant to run under NVIDIA's race and sync checkers:

    compute-sanitizer --tool racecheck python bench/sanitize_gluon.py
    compute-sanitizer --tool synccheck python bench/sanitize_gluon.py

The Gluon kernels share memory between warps through mbarrier-guarded rings (TMA loads, wgmma reads),
which memcheck does not judge; racecheck reports shared-memory hazards and synccheck misuse of barriers.
Each case is one planned Gluon form (``explain()`` must name a Gluon kernel, else the case fails):
prefix-prefill's NHD kernel (heads 64/128/256, pages 16 and 544, new K/V given or read from the cache)
and its split-cache kernel (K by gathers, by 16-key TMA runs and by wide boxes; V by gathers and by
TMA), and window-prefill's kernel (heads 64/128/256, full causal and a wide left window). Each case
runs twice, before and after :func:`prefix_prefill.finish_compiles` (the first call may run the
quick-compiling form), and both answers are compared with ``attn_reference``. Prints ``N cases OK``
(exit 0) or the failing cases (exit 1); needs an sm90 GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_package_paths

add_package_paths()  # (and bench/ off sys.path: its prefix_prefill.py would shadow the package)

import torch  # noqa: E402

import attn_reference as ref  # noqa: E402
import prefix_prefill as pp  # noqa: E402
import window_prefill as wp  # noqa: E402

DEV, DT = "cuda", torch.bfloat16

# prefix: (layout, head, page, kv_from_cache, the Gluon kernel its plan must name)
PREFIX = [
    ("nhd", 64, 16, False, "gluon-nhd"),
    ("nhd", 128, 544, True, "gluon-nhd"),
    ("nhd", 256, 16, False, "gluon-nhd"),
    ("split", 64, 32, True, "gluon-split"),  # K and V by gathers
    ("split", 128, 16, False, "gluon-split"),  # K by 16-key TMA runs, V by gathers
    ("split", 128, 128, False, "gluon-split"),  # K by wide boxes
    ("split", 256, 16, False, "gluon-split"),  # K chunk-major and V by TMA
]
# window: (head, sequence lengths, window)
WINDOW = [(64, [2100, 300], (2047, -1)), (128, [2300], (-1, -1)), (256, [2100, 40], (-1, -1))]


def _prefix_case(layout: str, d: int, page: int, from_cache: bool, want_kernel: str) -> list[str]:
    ctx, new, h, hk = [300, 37], [150, 70], 8, 2
    seq = [c + n for c, n in zip(ctx, new, strict=True)]
    pages = [-(-s // page) for s in seq]
    nb = sum(pages) + 1
    if layout == "split":
        k_cache = torch.randn(nb, hk, d // 8, page, 8, device=DEV).to(DT)
        v_cache = torch.randn(nb, hk, d, page, device=DEV).to(DT)
    else:
        k_cache = torch.randn(nb, page, hk, d, device=DEV).to(DT)
        v_cache = torch.randn(nb, page, hk, d, device=DEV).to(DT)
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
    kernel = pp.explain(*args, kv_layout=layout).kernel
    if kernel != want_kernel:
        return [f"planned {kernel}, not {want_kernel}"]
    want = ref.paged_prefix_attention(*(t.cpu() if t is not None else None for t in args[:-1]), layout=layout)
    bad = []
    for when in ("first", "full"):
        out = pp.prefix_prefill(*args, kv_layout=layout)
        torch.cuda.synchronize()
        res = ref.compare(out.cpu(), want)
        if not res:
            bad.append(f"{when}: {res}")
        pp.finish_compiles()
    return bad


def _window_case(d: int, lens: list[int], window: tuple[int, int]) -> list[str]:
    n, h, hk = sum(lens), 4, 2
    q = torch.randn(n, h, d, device=DEV).to(DT)
    k = torch.randn(n, hk, d, device=DEV).to(DT)
    v = torch.randn(n, hk, d, device=DEV).to(DT)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
    kernel = wp.explain(q, k, v, cu, max(lens), causal=True, window=window).kernel
    if kernel != "gluon":
        return [f"planned {kernel}, not gluon"]
    want = ref.attention_varlen(q.cpu(), k.cpu(), v.cpu(), cu.cpu(), cu.cpu(), causal=True, window=window)
    out = wp.window_prefill(q, k, v, cu, max(lens), causal=True, window=window)
    torch.cuda.synchronize()
    res = ref.compare(out.cpu(), want)
    return [] if res else [str(res)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=["prefix", "window"], help="one package's cases")
    args = ap.parse_args()
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):
        print("needs an sm90 GPU (the Gluon kernels run there only)")
        return 1
    torch.manual_seed(0)
    cases = []
    if args.only != "window":
        cases += [(f"prefix {c[0]} d{c[1]} page {c[2]} from_cache={c[3]}", _prefix_case, c) for c in PREFIX]
    if args.only != "prefix":
        cases += [(f"window d{c[0]} lens {c[1]} window {c[2]}", _window_case, c) for c in WINDOW]
    failed = 0
    for name, run, case in cases:
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
