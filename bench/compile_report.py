"""Compiler report for a kernel config without a GPU: registers, spills, shared memory, SASS counts.

Compiles the real ``_fwd_kernel`` of either package for a Hopper target (sm_90a) with Triton's
bundled toolchain, runs ``ptxas -v`` on the PTX and counts key SASS instructions (HGMMA = wgmma,
LDGSTS = cp.async, LDL/STL = local-memory spills). Use it before spending device time on a config:
a config that spills (``spill stores`` > 0) is slow on the card, and a page size that changes the
spill count changes the speed (seen on the H200, 2026-11-29: see bench/results/NOTES.md).

    python bench/compile_report.py prefix 128/32/32/8/2 --head-dim 256 --page 544
    python bench/compile_report.py window 128/128/8/2 --head-dim 128

Config strings: prefix ``BLOCK_M/BLOCK_N/BLOCK_N_CTX/num_warps/num_stages``; window
``BLOCK_M/BLOCK_N/num_warps/num_stages``. The device runs triton 3.6; this machine's triton may be
newer, so treat the numbers as close, not exact.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import add_package_paths

add_package_paths()

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

SASS_OPS = (
    "HGMMA", "HMMA", "LDGSTS", "LDG.E.128", "LDG.E.U16", "LDS", "STS", "LDL", "STL", "BAR.SYNC", "SHFL",
)  # fmt: skip


#: kernel SOFTCAP of every compile: 0 off, 1 tanh through exp2, 2 hardware tanh (``--softcap``)
SOFTCAP_FORM = 0


def _source(kernel, consts: dict, pointer_types: dict, other_types: dict | None = None) -> ASTSource:
    """Signature with 16-divisible pointers and strides (what real aligned tensors specialise to);
    ``other_types`` names any other argument's type (e.g. ``tensordesc<bf16[128, 128]>``)."""
    other_types = other_types or {}
    missing = [kernel.arg_names[i] for i in kernel.constexprs if kernel.arg_names[i] not in consts]
    if missing:  # a constexpr left out would compile as a runtime i32 argument: a different kernel
        raise SystemExit(f"constexpr parameters without a value: {missing}")
    sig, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in other_types:
            sig[name] = other_types[name]
        elif name in pointer_types:
            sig[name] = "*" + pointer_types[name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in consts:
            sig[name] = "constexpr"
        elif name in ("qk_scale", "softcap2", "tanh_scale"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
            if name.startswith("stride_") and name not in ("stride_bt_row", "stride_lse_h"):
                attrs[(i,)] = [["tt.divisibility", 16]]  # stride_lse_h is not specialised (total tokens)
    return ASTSource(kernel, sig, consts, attrs)


def _lse_args(lse: bool, consts: dict, ptrs: dict) -> None:
    """The softmax LSE output (kernel ``RETURN_LSE``): a float32 pointer and its head stride, or both
    None (constexprs, as the launchers pass them without ``return_lse``); no ``status=`` (``Status``
    None, a constexpr too)."""
    consts["RETURN_LSE"] = lse
    consts["Status"] = None
    if lse:
        ptrs["Lse"] = "fp32"
    else:
        consts.update(Lse=None, stride_lse_h=None)


def prefix_source(
    cfg: list[int],
    head_dim: int,
    page: int,
    causal: bool,
    tile_pages: bool = False,
    layout: str = "split",
    branch: bool = False,
    runtime_page: bool = False,
    bases: bool = False,
    page_walk: bool = False,
    walk_aligned: bool = False,
    rest_group: bool = False,
    offsets32: bool = False,
    granule_edges: bool = False,
    k_chunk: int = 0,
    kv_from_cache: bool = False,
    one_segment: bool = False,
    merge_new: bool = False,
    merge_interior: bool = True,
    lazy: float = 0.0,
    page_vector: bool = False,
    lse: bool = False,
    prefetch_ids: bool = False,
    kv_same: bool = False,
) -> tuple[ASTSource, int, int]:
    """The prefix kernel as the launcher specialises it for a bf16 cache in ``layout``: "split" (vLLM:
    K ``[blocks, H, D/8, page, 8]``, V ``[blocks, H, D, page]``) or "nhd" (``[blocks, page, H, D]``)."""
    from paged_kv_offsets import page_walk_rest_block
    from prefix_prefill.kernel import _fwd_kernel

    bm, bn, bnc, warps, stages = cfg
    walk = tile_pages and page_walk and not runtime_page and page > bnc
    walk = walk and (page_walk_rest_block(page, bnc) > 0 or walk_aligned)
    group_rest = page_walk_rest_block(page, bnc)  # rest groups need a rest that is exactly this wide
    group = bnc // group_rest if group_rest else 1
    if layout == "split":
        lay = dict(X=8, K_ALIGN16=True, V_ALIGN16_ANY=False, V_ALIGN16_RUNS=True,
                   V_CONTIG=min(math.gcd(page, bnc), 8), stride_kc_x=1, stride_vc_slot=1)  # fmt: skip
    elif layout == "nhd":
        lay = dict(X=1, K_ALIGN16=True, V_ALIGN16_ANY=True, V_ALIGN16_RUNS=False, V_CONTIG=1,
                   stride_kc_dim=1, stride_vc_dim=1)  # fmt: skip
    else:
        raise SystemExit(f"unknown layout {layout!r}")
    consts = dict(
        QUERIES_PER_KV=8, HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim),
        PAGE_SIZE=0 if tile_pages and runtime_page and page >= bnc else page,  # as interface._page_constexpr
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_N_CTX=bnc, CAUSAL=causal, USE_LEFT=False, USE_RIGHT=False,
        HAS_ALIBI=False, HAS_SINKS=False, KV_FROM_CACHE=kv_from_cache, CACHE_FP8=False, OUT_FP8=False,
        FP8_OUT_MAX=0.0, SKIP_DECODE=False, FOLD_SCALE=True, TILE_PAGES=tile_pages, STRADDLE_BRANCH=branch,
        TWO_PAGE_BASES=bases, WIDE_OFFSETS=not offsets32, GRANULE_EDGES=granule_edges,
        # as interface._page_walk
        PAGE_WALK=walk, REST_BLOCK=page_walk_rest_block(page, bnc) if walk else 0,
        REST_GROUP=group if walk and rest_group and page % bnc == group_rest else 1,
        DOT_PRECISION=None, K_CHUNK=k_chunk if head_dim >= k_chunk else 0, ONE_SEGMENT=one_segment,
        MERGE_NEW=merge_new, MERGE_INTERIOR=merge_interior, LAZY_RESCALE=lazy, SOFTCAP=SOFTCAP_FORM,
        stride_bt_col=1,
        PAGE_VECTOR=page_vector and tile_pages,
        PREFETCH_IDS=prefetch_ids and tile_pages,
        KV_SAME_STRIDES=kv_same,
        **lay,
    )  # fmt: skip
    ptrs = {n: "bf16" for n in ("Q", "K", "V", "O", "K_cache", "V_cache")}
    ptrs.update({n: "i32" for n in ("Block_table", "Cu_seqlens_q", "Seq_lens")})
    ptrs.update({n: "fp32" for n in ("Sinks", "Alibi_slopes", "K_scale", "V_scale", "Out_scale")})
    _lse_args(lse, consts, ptrs)
    return _source(_fwd_kernel, consts, ptrs), warps, stages


def window_source(
    cfg: list[int],
    head_dim: int,
    causal: bool,
    offsets32: bool = False,
    lazy: int = 0,
    fold: bool = False,
    band: bool = False,
    tma: bool = False,
    interior_first: bool = False,
    lse: bool = False,
) -> tuple[ASTSource, int, int]:
    from window_prefill.kernel import _fwd_kernel

    bm, bn, warps, stages = cfg
    consts = dict(
        HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim), BLOCK_M=bm, BLOCK_N=bn,
        IS_CAUSAL=causal, HAS_LEFT=True, HAS_RIGHT=not causal, HAS_SINKS=False, BIAS_KEY0=False,
        LENS_FROM_STARTS=True, IEEE_FP32=False, WIDE_OFFSETS=not offsets32, LAZY_RESCALE=lazy,
        FOLD_SCALE=fold, BAND_MASK=band, TMA_KV=tma, INTERIOR_FIRST=interior_first, SOFTCAP=SOFTCAP_FORM,
    )  # fmt: skip
    ptrs = {n: "bf16" for n in ("Q", "K", "V", "O")}
    ptrs.update({"Sinks": "fp32", "Starts": "i32", "Lens": "i32"})
    descs = {}
    if tma:
        descs = {n: f"tensordesc<bf16[{bn}, {head_dim}]>" for n in ("K_desc", "V_desc")}
    else:
        consts.update(K_desc=None, V_desc=None)
    _lse_args(lse, consts, ptrs)
    return _source(_fwd_kernel, consts, ptrs, descs), warps, stages


# extra ptxas flags (--ptxas-level N: "--register-usage-level=N"), for Triton's compile and the -v run
PTXAS_FLAGS: list[str] = []


def report(src: ASTSource, warps: int, stages: int, dump: str | None = None) -> str:
    t0 = time.perf_counter()
    options = {"num_warps": warps, "num_stages": stages}
    if PTXAS_FLAGS:
        options["ptx_options"] = " ".join(PTXAS_FLAGS)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    compile_s = time.perf_counter() - t0
    if dump:  # the TTGIR (layouts, shared encodings) and the PTX, for reading
        for ext in ("ttgir", "ptx"):
            with open(f"{dump}.{ext}", "w") as f:
                f.write(k.asm[ext])
    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "k.ptx"), "w") as f:
            f.write(k.asm["ptx"])
        r = subprocess.run(
            [os.path.join(bindir, "ptxas"), "-arch=sm_90a", "-v", *PTXAS_FLAGS, f"{d}/k.ptx", "-o",
             f"{d}/k.cubin"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        sass = subprocess.run(
            [os.path.join(bindir, "cuobjdump"), "-sass", f"{d}/k.cubin"], capture_output=True, text=True
        ).stdout
    if dump:
        with open(f"{dump}.sass", "w") as f:
            f.write(sass)
    lines = [
        ln.split(":", 1)[-1].strip() for ln in r.stderr.splitlines() if "registers" in ln or "spill" in ln
    ]
    ptxas = " ".join(lines)
    warn = [ln.strip() for ln in r.stderr.splitlines() if "warning" in ln.lower()]
    if warn:
        ptxas += " | ptxas warnings: " + " / ".join(warn)
    counts = " ".join("{}={}".format(op, len(re.findall(re.escape(op) + r"\b", sass))) for op in SASS_OPS)
    total = len(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+\S", sass, flags=re.M))
    head = f"compile={compile_s:.2f} s | shared={k.metadata.shared} B | {ptxas}"
    return f"{head} | SASS={total} {counts}{_loops(sass)}"


def _loops(sass: str) -> str:
    """`` | loops=N/H[/Ls] ...``: instructions N (H of them HGMMA, L local-memory spill loads/stores) in each
    loop body of the SASS (a branch back to an earlier address), the loops with a wgmma only: the main
    loops' per-iteration cost."""
    instrs = {}
    for ln in sass.splitlines():
        m = re.match(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", ln)
        if m:
            instrs[int(m.group(1), 16)] = m.group(2)
    loops = []
    for addr, ins in instrs.items():
        m = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", ins)
        if m and int(m.group(1), 16) <= addr:
            body = [v for a, v in instrs.items() if int(m.group(1), 16) <= a <= addr]
            spills = sum(bool(re.match(r"(LDL|STL)\b", b)) for b in body)
            loops.append((len(body), sum("HGMMA" in b for b in body), spills))
    loops = sorted((t for t in loops if t[1]), key=lambda t: -t[0])
    text = " ".join(f"{n}/{h}" + (f"/{sp}s" if sp else "") for n, h, sp in loops)
    return " | loops=" + text if loops else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kernel", choices=("prefix", "window"))
    ap.add_argument("config", help="prefix: BM/BN/BNCTX/warps/stages; window: BM/BN/warps/stages")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--page", type=int, default=16, help="prefix only")
    ap.add_argument("--non-causal", action="store_true")
    ap.add_argument("--tile-pages", action="store_true", help="prefix only: per-tile page addressing")
    ap.add_argument(
        "--straddle-branch", action="store_true", help="prefix, with --tile-pages: the BRANCH form"
    )
    ap.add_argument(
        "--runtime-page", action="store_true", help="prefix, with --tile-pages: page size at runtime"
    )
    ap.add_argument("--two-page-bases", action="store_true", help="prefix, with --tile-pages: the BASES form")
    ap.add_argument("--page-walk", action="store_true", help="prefix, with --tile-pages: context page walks")
    ap.add_argument("--walk-aligned", action="store_true", help="prefix, --page-walk: multiples too")
    ap.add_argument("--rest-group", action="store_true", help="prefix, --page-walk: rest tiles grouped")
    ap.add_argument(
        "--offsets32", action="store_true", help="int32 token offsets (prefix: with --tile-pages)"
    )
    ap.add_argument(
        "--granule-edges", action="store_true", help="prefix: masked context tiles load V by granule"
    )
    ap.add_argument("--layout", default="split", choices=("split", "nhd"), help="prefix only: cache layout")
    ap.add_argument("--k-chunk", type=int, default=0, help="prefix: q.k dot in feature chunks")
    ap.add_argument("--kv-from-cache", action="store_true", help="prefix: k=None (new tokens from the cache)")
    ap.add_argument("--one-segment", action="store_true", help="prefix: k=None as one cached segment")
    ap.add_argument("--lazy", type=float, default=0.0, help="lazy rescale threshold (log2 units)")
    ap.add_argument("--fold-scale", action="store_true", help="window: qk scale folded into exp2's FMA")
    ap.add_argument("--band-mask", action="store_true", help="window: one unsigned compare per score")
    ap.add_argument("--merge-new", action="store_true", help="prefix: context + new tokens in one loop pair")
    ap.add_argument("--page-vector", action="store_true", help="prefix: one block id per page (small pages)")
    ap.add_argument("--merge-masked", action="store_true", help="prefix: masked loops merged")
    ap.add_argument("--prefetch-ids", action="store_true", help="prefix: next tile's block ids read ahead")
    ap.add_argument("--kv-same", action="store_true", help="prefix: V block/slot strides are K's (NHD/HND)")
    ap.add_argument("--tma", action="store_true", help="window: interior K/V through tensor descriptors")
    ap.add_argument("--interior-first", action="store_true", help="window: interior blocks before the edges")
    ap.add_argument("--softcap", type=int, default=0, choices=(0, 1, 2),
                    help="logit soft-capping: 1 tanh through exp2, 2 hardware tanh (NVIDIA)")  # fmt: skip
    ap.add_argument("--lse", action="store_true", help="also store the softmax LSE (return_lse=True)")
    ap.add_argument("--ptxas-level", type=int, default=0,
                    help="ptxas --register-usage-level (0: not passed)")  # fmt: skip
    ap.add_argument("--dump", metavar="PREFIX", help="also write PREFIX.ttgir, PREFIX.ptx and PREFIX.sass")
    args = ap.parse_args()
    if args.ptxas_level:
        PTXAS_FLAGS.append(f"--register-usage-level={args.ptxas_level}")
    global SOFTCAP_FORM
    SOFTCAP_FORM = args.softcap
    cfg = [int(x) for x in args.config.split("/")]
    if args.kernel == "prefix":
        causal = not args.non_causal
        src, warps, stages = prefix_source(
            cfg,
            args.head_dim,
            args.page,
            causal,
            args.tile_pages,
            args.layout,
            args.straddle_branch,
            args.runtime_page,
            args.two_page_bases,
            args.page_walk,
            args.walk_aligned,
            args.rest_group,
            args.offsets32,
            args.granule_edges,
            args.k_chunk,
            args.kv_from_cache or args.one_segment,
            args.one_segment,
            args.merge_new or args.merge_masked,
            lazy=args.lazy,
            merge_interior=not args.merge_masked,
            page_vector=args.page_vector,
            lse=args.lse,
            prefetch_ids=args.prefetch_ids,
            kv_same=args.kv_same,
        )
    else:
        causal = not args.non_causal
        src, warps, stages = window_source(
            cfg,
            args.head_dim,
            causal,
            args.offsets32,
            int(args.lazy),
            args.fold_scale,
            args.band_mask,
            args.tma,
            args.interior_first,
            lse=args.lse,
        )
    what = f"{args.kernel} {args.config} D={args.head_dim} page={args.page}"
    if args.kernel == "prefix":
        what += f" {args.layout}" + (" tile-pages" if args.tile_pages else "")
        what += (" straddle-branch" if args.straddle_branch else "") + (
            " runtime-page" if args.runtime_page else ""
        )
        what += " two-page-bases" if args.two_page_bases else ""
        what += " page-walk" if args.page_walk else ""
        what += " walk-aligned" if args.walk_aligned else ""
        what += " rest-group" if args.rest_group else ""
        what += " offsets32" if args.offsets32 else ""
        what += " granule-edges" if args.granule_edges else ""
        what += f" k-chunk={args.k_chunk}" if args.k_chunk else ""
        what += " kv-from-cache" if args.kv_from_cache or args.one_segment else ""
        what += " one-segment" if args.one_segment else ""
        what += " merge-new" if args.merge_new else ""
        what += " merge-masked" if args.merge_masked else ""
        what += " page-vector" if args.page_vector else ""
        what += " prefetch-ids" if args.prefetch_ids else ""
        what += " kv-same" if args.kv_same else ""
        what += f" lazy={args.lazy:g}" if args.lazy else ""
    else:
        what += f" lazy={args.lazy:g}" if args.lazy else ""
        what += " fold-scale" if args.fold_scale else ""
        what += " band-mask" if args.band_mask else ""
        what += " tma" if args.tma else ""
        what += " interior-first" if args.interior_first else ""
    what += " lse" if args.lse else ""
    print(f"{what}: {report(src, warps, stages, args.dump)}")


if __name__ == "__main__":
    main()
