"""Benchmark: attention cost per engine step, ours vs vLLM 0.33's Triton kernels.

    python bench/engine_step.py [--out DIR] [--quick] [--layers 32] [--scenarios a,b] [--no-vllm]
    python bench/engine_step.py --smoke          # CPU: Triton interpreter, L=2, tiny sizes, fp16

An engine step runs one attention call per layer (``--layers``, default 32), each layer with its own
q/k/v/o and KV cache (fresh tensors per layer; the metadata, block table, cu_seqlens and seq_lens, is
shared by the layers of a step, as in vLLM), launched back to back with no sync and no CUDA graph
(vLLM runs attention outside its piecewise CUDA graphs), one sync at the end of the step.

Tables (CSV + Markdown in ``--out``, default bench/results/<gpu>/<date>-<commit>/; also printed):

* ``engine_step``: per scenario and implementation, ``wall_ms`` (median host + GPU time of a step after
  warm-up), ``graph_ms`` (the same L calls captured in one CUDA graph and replayed: GPU time only),
  ``wall_over_graph``, ``vs_vllm`` (our wall / vLLM's wall), ``graph_vs_vllm`` (our graph / vLLM's
  graph), ``launches`` (CUDA kernels of one call, torch.profiler), ``diff_vs_vllm`` (max |ours - vLLM|
  on layer 0: a broken call shows) and ``accept`` (the acceptance rule: wall <= vLLM's wall, and <= 1.15 x our
  graph time where that is >= 2 ms).
* ``engine_host``: a tiny problem (1 sequence of 16 new tokens on a 16-token context, 8/2 heads, d128,
  page 16) called ``--host-calls`` (3000) times without a sync, in rounds over every entry in turn:
  ``host_us`` (enqueue time per call in the best round; the GPU is faster than the host here, so this is
  the host's cost of a call), ``host_median_us`` (the median round), ``wall_us`` (including the final
  sync), ``vs_vllm`` / ``vs_sdpa`` (median same-round ratio to vLLM's / torch SDPA's host time),
  ``graph_us`` (GPU time per call of the same call replayed from a CUDA graph of 50).
* ``engine_launches``: CUDA kernels (and memcpy/memset, cudaMalloc, launch API calls) of one call of
  each entry point, cache layout, K/V source and return_lse, on the tiny problem.

Implementations: prefix scenarios: ``ours_caf`` (prefix_prefill.context_attention_fwd on vLLM's split
cache, what an engine replacing vLLM's kernel calls), ``ours_pp_split`` / ``ours_pp_nhd``
(prefix_prefill.prefix_prefill on the split cache / an NHD copy of it, same contents and block table),
``vllm`` (vLLM 0.33's prefix_prefill.context_attention_fwd, same arguments as ours_caf). Varlen
scenarios: ``ours_caf`` (window_prefill.context_attention_fwd), ``ours_wp`` (window_prefill.window_prefill),
``vllm`` (vLLM's triton_prefill_attention.context_attention_fwd) and, for equal-length batches,
``sdpa`` (torch scaled_dot_product_attention on [B, H, S, D] views, default backend).
vLLM's kernels come from ``.peers`` (``bash ../shared/peers/get-vllm-kernels.sh .peers``); without
them their rows are skipped. bf16 on the GPU; fixed seeds; block tables a random permutation of the
block ids. ``--quick`` takes fewer steps and calls (about 3-4 minutes on an H200 with the peers,
compiles included); ``--budget-s`` skips the scenarios left once a run has taken that long.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, commit, gpu_name, print_rows, start, today, write_rows

STEP_KEYS = [
    "scenario", "impl", "layers", "steps", "wall_ms", "graph_ms", "wall_over_graph", "vs_vllm",
    "graph_vs_vllm", "launches", "diff_vs_vllm", "diff_vs_ref", "accept", "note",
]  # fmt: skip
HOST_KEYS = [
    "impl", "calls", "host_us", "host_median_us", "wall_us", "graph_us", "target_us", "vs_vllm", "vs_sdpa",
    "launches", "note",
]  # fmt: skip
LAUNCH_KEYS = [
    "entry", "layout", "kv", "return_lse", "kernels", "memops", "mallocs", "launch_api_calls", "kernel_names",
    "note",
]  # fmt: skip
# host-time targets per call (us)
HOST_TARGET_US = {"ours_pp_caf": 30, "ours_wp_caf": 30, "ours_pp_split": 40, "ours_pp_nhd": 40, "ours_wp": 40}
GRAPH_CALLS = 50  # calls captured per CUDA graph in the host table


@dataclass
class Scenario:
    """One engine step's attention problem. ``seqs``: (context tokens, new tokens) per sequence
    (varlen: context 0)."""

    name: str
    kind: str  # "prefix" (paged cache) or "varlen" (packed q/k/v, no cache)
    heads: int
    kv_heads: int
    head_dim: int
    seqs: list[tuple[int, int]]
    page: int = 16
    causal: bool = True
    skip_decode: bool = False
    cache_fp8: bool = False  # the caches in float8_e4m3fn (scales 1; vLLM's kv_cache_dtype "fp8")
    note: str = ""
    total_q: int = field(init=False)

    def __post_init__(self) -> None:
        self.total_q = sum(n for _, n in self.seqs)

    @property
    def equal_lengths(self) -> bool:
        return self.kind == "varlen" and len({n for _, n in self.seqs}) == 1


def scenarios(smoke: bool) -> list[Scenario]:
    """The five scenarios of the acceptance table, then the other steps a server runs. ``smoke``: the same
    structure at interpreter sizes."""
    rng = random.Random(32)
    if smoke:  # the interpreter's cost grows with programs and tiles: 2/1 heads, a few short sequences
        h, hk, d = 2, 1, 16
        return [
            Scenario("prefix_512_on_4k", "prefix", h, hk, d, [(12, 8)]),
            Scenario("prefix_4chunks_0-8k", "prefix", h, hk, d, [(0, 8), (9, 5)]),
            Scenario("prefix_8prompts_64-300", "prefix", h, hk, d, [(0, 3), (0, 8)]),
            Scenario("varlen_8prompts_100-500", "varlen", h, hk, d, [(0, 5), (0, 12)]),
            Scenario("prefix_2048_on_16k_d256", "prefix", 2, 1, 32, [(40, 8)], page=48),
            Scenario("decode_mix_skip_decode", "prefix", h, hk, d, [(10, 1), (21, 1), (5, 8)],
                     skip_decode=True),
            Scenario("specdec_32x4", "prefix", h, hk, d, [(14, 4), (7, 4)]),
            Scenario("specdec_32x8", "prefix", h, hk, d, [(14, 8), (7, 8)]),
            Scenario("specdec_32x4_fp8", "prefix", h, hk, d, [(14, 4), (7, 4)], cache_fp8=True),
            Scenario("vision_16x1024_d64", "varlen", 2, 2, d, [(0, 8)] * 2, causal=False),
            Scenario("long_8192_on_32k", "prefix", h, hk, d, [(16, 16)]),
        ]  # fmt: skip
    dec = [(rng.randint(1024, 4096), 1) for _ in range(64)]
    spec = [rng.randint(2048, 8192) for _ in range(32)]
    return [
        Scenario("prefix_512_on_4k", "prefix", 32, 8, 128, [(4096, 512)],
                 note="one chunk of 512 on a 4096-token context"),
        Scenario("prefix_4chunks_0-8k", "prefix", 32, 8, 128,
                 [(0, 1024), (2600, 768), (5300, 512), (8000, 256)],
                 note="4 chunks of 1024/768/512/256 on contexts 0/2600/5300/8000"),
        Scenario("prefix_8prompts_64-300", "prefix", 32, 8, 128,
                 [(0, n) for n in (64, 300, 137, 211, 96, 256, 180, 122)], note="8 prompts, no context"),
        Scenario("varlen_8prompts_100-500", "varlen", 32, 8, 128,
                 [(0, n) for n in (100, 500, 230, 370, 150, 440, 280, 330)], note="causal"),
        Scenario("prefix_2048_on_16k_d256", "prefix", 16, 2, 256, [(16384, 2048)], page=544,
                 note="one chunk of 2048 on a 16k context, page 544"),
        Scenario("decode_mix_skip_decode", "prefix", 32, 8, 128, [*dec, (1536, 512), (3072, 512)],
                 skip_decode=True, note="64 decodes on 1-4k contexts + 2 chunks of 512; skip_decode=True "
                 "(vLLM's chunked_prefill_paged_decode); prefix_prefill() has no skip_decode"),
        Scenario("specdec_32x4", "prefix", 32, 8, 128, [(c, 4) for c in spec],
                 note="speculative verification: 32 x 4 query tokens on 2-8k contexts"),
        Scenario("specdec_32x8", "prefix", 32, 8, 128, [(c, 8) for c in spec],
                 note="speculative verification: 32 x 8 query tokens on 2-8k contexts"),
        Scenario("specdec_32x4_fp8", "prefix", 32, 8, 128, [(c, 4) for c in spec], cache_fp8=True,
                 note="specdec_32x4 over an fp8 e4m3 cache (scales 1)"),
        Scenario("vision_16x1024_d64", "varlen", 16, 16, 64, [(0, 1024)] * 16, causal=False,
                 note="vision encoder: 16 x 1024, non-causal"),
        Scenario("long_8192_on_32k", "prefix", 32, 8, 128, [(32768, 8192)],
                 note="8192 new tokens on a 32k context"),
    ]  # fmt: skip


# ------------------------------------------------------------------------------------ environment
class Env:
    """torch, the device, the dtype and the entry points (vLLM's may be None)."""

    def __init__(self, smoke: bool, no_vllm: bool) -> None:
        import torch

        import prefix_prefill
        import window_prefill

        self.torch = torch
        self.smoke = smoke
        self.cuda = torch.cuda.is_available() and not smoke
        self.device = "cuda" if self.cuda else "cpu"
        self.dtype = torch.float16 if smoke else torch.bfloat16
        self.pp = prefix_prefill
        self.wp = window_prefill
        self.vllm_pp = self.vllm_wp = None
        if not no_vllm:
            try:
                from vllm.v1.attention.ops.prefix_prefill import context_attention_fwd as vpp
                from vllm.v1.attention.ops.triton_prefill_attention import context_attention_fwd as vwp

                self.vllm_pp, self.vllm_wp = vpp, vwp
            except Exception as e:  # .peers missing or broken
                print(
                    f"# vLLM peers unavailable ({type(e).__name__}: {e}); their rows are skipped", flush=True
                )

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def finish_compiles(self) -> None:
        """Wait for prefix-prefill's background compiles (its quick first-call forms are replaced by
        the full ones), so that timings and captures see what an engine runs after warm-up."""
        fin = getattr(self.pp, "finish_compiles", None)
        if fin is not None:
            fin()

    def free(self) -> None:
        gc.collect()
        if self.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------- inputs
def split_to_nhd(kc, vc):
    """vLLM's split caches (K ``[nb, Hkv, D/x, page, x]``, V ``[nb, Hkv, D, page]``) as NHD copies
    ``[nb, page, Hkv, D]`` (same contents)."""
    nb, hkv, dx, page, x = kc.shape
    k = kc.permute(0, 3, 1, 2, 4).reshape(nb, page, hkv, dx * x).contiguous()
    return k, vc.permute(0, 3, 1, 2).contiguous()


def nhd_to_hnd(t):
    return t.permute(0, 2, 1, 3).contiguous()


def make_meta(env: Env, sc: Scenario, seed: int) -> dict:
    """Metadata shared by a step's layers: cu_seqlens, seq_lens, starts/lens, a block table that is
    a random permutation of the block ids (prefix scenarios), the row mask of the rows computed."""
    torch, dev = env.torch, env.device
    q_lens = [n for _, n in sc.seqs]
    seq_lens = [c + n for c, n in sc.seqs]
    cu = [0]
    for n in q_lens:
        cu.append(cu[-1] + n)
    meta = {
        "cu": torch.tensor(cu, dtype=torch.int32, device=dev),
        "seq_lens": torch.tensor(seq_lens, dtype=torch.int32, device=dev),
        "lens": torch.tensor(q_lens, dtype=torch.int32, device=dev),
        "max_q": max(q_lens),
        "max_seq": max(seq_lens),
        "scale": torch.ones(1, dtype=torch.float32, device=dev),
    }
    meta["starts"] = meta["cu"][:-1]  # vLLM's b_start_loc for triton_prefill_attention, made once
    rows = torch.ones(sc.total_q, dtype=torch.bool)
    if sc.skip_decode:
        for b, n in enumerate(q_lens):
            if n == 1:
                rows[cu[b]] = False
    meta["rows"] = rows.to(dev)
    if sc.kind == "prefix":
        pages = [math.ceil(s / sc.page) for s in seq_lens]
        nb = sum(pages) + 1  # one spare block no sequence owns
        g = torch.Generator().manual_seed(seed)
        perm = torch.randperm(nb, generator=g)
        if bool((perm == torch.arange(nb)).all()):
            perm = perm.roll(1)
        table = torch.zeros(len(pages), max(pages), dtype=torch.int32)
        at = 0
        for i, n in enumerate(pages):
            table[i, :n] = perm[at : at + n].to(torch.int32)
            at += n
        meta["block_table"] = table.to(dev)
        meta["num_blocks"] = nb
    return meta


def layer_bytes(env: Env, sc: Scenario, meta: dict, nhd: bool) -> int:
    e = env.torch.finfo(env.dtype).bits // 8
    qo = 2 * sc.total_q * sc.heads * sc.head_dim
    kv = 2 * sc.total_q * sc.kv_heads * sc.head_dim
    cache = 0
    if sc.kind == "prefix":
        cache = 2 * meta["num_blocks"] * sc.page * sc.kv_heads * sc.head_dim * (2 if nhd else 1)
    return (qo + kv) * e + cache * (1 if sc.cache_fp8 else e)


def make_layer(env: Env, sc: Scenario, meta: dict, gen, nhd: bool) -> dict:
    """One layer's own tensors: q/k/v of the new tokens, an output buffer, and (prefix) the split
    cache plus, with ``nhd``, an NHD copy of it."""
    torch, dev, dt = env.torch, env.device, env.dtype
    t, h, hk, d = sc.total_q, sc.heads, sc.kv_heads, sc.head_dim

    def randn(*shape):
        return torch.randn(*shape, device=dev, dtype=dt, generator=gen)

    lay = {"q": randn(t, h, d), "k": randn(t, hk, d), "v": randn(t, hk, d)}
    lay["o"] = torch.zeros_like(lay["q"])
    if sc.kind == "prefix":
        cache_dt = torch.float8_e4m3fn if sc.cache_fp8 else dt
        nb, x = meta["num_blocks"], 16 // (torch.finfo(cache_dt).bits // 8)  # vLLM's x: 16 bytes
        lay["k_cache"] = randn(nb, hk, d // x, sc.page, x).to(cache_dt)
        lay["v_cache"] = randn(nb, hk, d, sc.page).to(cache_dt)
        if nhd:
            lay["k_nhd"], lay["v_nhd"] = split_to_nhd(lay["k_cache"], lay["v_cache"])
    elif sc.equal_lengths:  # [B, H, S, D] views for SDPA (what a vision encoder passes), no copies
        b, s = len(sc.seqs), sc.seqs[0][1]
        for n in ("q", "k", "v"):
            lay[n + "4"] = lay[n].view(b, s, lay[n].shape[1], d).transpose(1, 2)
    return lay


def impls_for(env: Env, sc: Scenario) -> list[str]:
    """vLLM first (its output on layer 0 is the reference of the agreement check)."""
    if sc.kind == "prefix":
        names = ["vllm"] if env.vllm_pp is not None else []
        names.append("ours_caf")
        if not sc.skip_decode:  # prefix_prefill() has no skip_decode
            names += ["ours_pp_split", "ours_pp_nhd"]
        return names
    names = ["vllm"] if env.vllm_wp is not None else []
    names += ["ours_caf", "ours_wp"]
    if sc.equal_lengths:
        names.append("sdpa")
    return names


def as_tokens(out, sc: Scenario):
    """An output as ``[T, H, D]``: SDPA's ``[B, H, S, D]`` transposed back (a copy); others as they are."""
    return out.transpose(1, 2).reshape(sc.total_q, sc.heads, sc.head_dim) if out.dim() == 4 else out


def make_call(env: Env, sc: Scenario, impl: str, meta: dict, lay: dict):
    """A no-argument callable running ``impl`` on one layer; returns its output (``o`` itself, or SDPA's
    ``[B, H, S, D]`` result)."""
    m, o = meta, lay["o"]
    if sc.kind == "prefix":
        kw = {"skip_decode": True} if sc.skip_decode else {}
        if impl in ("ours_caf", "vllm"):
            f = env.pp.context_attention_fwd if impl == "ours_caf" else env.vllm_pp
            kv_dtype = "fp8" if sc.cache_fp8 else "auto"
            args = (
                lay["q"], lay["k"], lay["v"], o, kv_dtype, lay["k_cache"], lay["v_cache"], m["block_table"],
                m["cu"], m["seq_lens"], m["max_seq"], m["max_q"], m["scale"], m["scale"],
            )  # fmt: skip

            def call():
                f(*args, **kw)
                return o

            return call
        nhd = impl == "ours_pp_nhd"
        kc, vc = (lay["k_nhd"], lay["v_nhd"]) if nhd else (lay["k_cache"], lay["v_cache"])
        pp = env.pp.prefix_prefill
        args = (lay["q"], lay["k"], lay["v"], kc, vc, m["block_table"], m["cu"], m["seq_lens"], m["max_q"])
        layout = "nhd" if nhd else "split"
        scales = {"k_scale": m["scale"], "v_scale": m["scale"]} if sc.cache_fp8 else {}
        return lambda: pp(*args, kv_layout=layout, out=o, causal=sc.causal, **scales)
    q, k, v = lay["q"], lay["k"], lay["v"]
    if impl in ("ours_caf", "vllm"):
        f = env.wp.context_attention_fwd if impl == "ours_caf" else env.vllm_wp
        args = (q, k, v, o, m["starts"], m["lens"], m["max_q"], sc.causal)

        def call():
            f(*args)
            return o

        return call
    if impl == "ours_wp":
        wp = env.wp.window_prefill
        return lambda: wp(q, k, v, m["cu"], m["max_q"], causal=sc.causal, out=o)
    if impl == "sdpa":
        sdpa = env.torch.nn.functional.scaled_dot_product_attention
        q4, k4, v4 = lay["q4"], lay["k4"], lay["v4"]
        return lambda: sdpa(q4, k4, v4, is_causal=sc.causal)  # [B, H, S, D] (see as_tokens)
    raise ValueError(impl)


def reference(env: Env, sc: Scenario, meta: dict, lay: dict):
    """float64 reference output of one layer (attn_reference; small problems only)."""
    import attn_reference as ar

    m = meta
    if sc.kind == "prefix":
        return ar.paged_prefix_attention(
            lay["q"], lay["k"], lay["v"], lay["k_cache"], lay["v_cache"], m["block_table"], m["cu"],
            m["seq_lens"], layout="split", causal=sc.causal,
        )  # fmt: skip
    return ar.attention_varlen(lay["q"], lay["k"], lay["v"], m["cu"], m["cu"], causal=sc.causal)


# ------------------------------------------------------------------------------ counting launches
_MEMOP_TYPES = ("gpu_memcpy", "gpu_memset")
_NOT_KERNEL_TYPES = ("gpu_user_annotation", "overhead", "external_correlation", "cpu_instant_event")
_MALLOC_APIS = (
    "cudaMalloc",
    "cudaMallocAsync",
    "cuMemAlloc",
    "cuMemAlloc_v2",
    "cuMemAllocAsync",
    "hipMalloc",
)
_LAUNCH_APIS = (
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
    "cudaLaunchCooperativeKernel", "hipLaunchKernel", "hipModuleLaunchKernel", "hipExtModuleLaunchKernel",
)  # fmt: skip


def classify_events(events) -> dict:
    """Counts over torch.profiler events (``prof.events()``): device events split into kernels and
    memcpy/memset (by activity type, or by name where the activity type is unknown); host events
    counted for cudaMalloc-like and kernel-launch API calls."""
    kernels, memops, mallocs, launches, names = 0, 0, 0, 0, []
    for e in events:
        name = str(e.name)
        act = str(getattr(e, "activity_type", None) or "").lower()
        on_device = str(getattr(e, "device_type", "")).split(".")[-1] in ("CUDA", "PrivateUse1")
        if on_device:
            if act in _MEMOP_TYPES or name.lower().startswith(("memcpy", "memset")):
                memops += 1
            elif act not in _NOT_KERNEL_TYPES:
                kernels += 1
                names.append(name)
        elif name in _MALLOC_APIS:
            mallocs += 1
        elif name in _LAUNCH_APIS:
            launches += 1
    return {
        "kernels": kernels, "memops": memops, "mallocs": mallocs, "launch_api_calls": launches,
        "kernel_names": ";".join(sorted(set(names)))[:300],
    }  # fmt: skip


def count_launches(env: Env, fn) -> tuple[dict, object]:
    """Profile one call of ``fn`` (after two warm-up calls and the background compiles); returns the
    counts and what the profiled call returned. Without CUDA the profile runs on the CPU only, with no
    warm-up, and the device counts are None."""
    from torch.profiler import ProfilerActivity, profile

    if env.cuda:  # (the interpreter compiles nothing: one call is enough there)
        fn()
        env.sync()
        env.finish_compiles()
        fn()
        env.sync()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if env.cuda else [])
    with profile(activities=acts) as prof:
        out = fn()
        env.sync()
    res = classify_events(prof.events())
    if not env.cuda:
        res.update(kernels=None, memops=None, mallocs=None, launch_api_calls=None, kernel_names="")
    return res, out


# -------------------------------------------------------------------------------------- timing
def _reps(est_ms: float, budget_ms: float, lo: int, hi: int) -> int:
    return max(lo, min(hi, int(budget_ms / max(est_ms, 1e-3))))


def wall_ms(env: Env, step, cfg: dict) -> tuple[float, int]:
    """Median wall time (ms) of ``step()`` + one sync, after warm-up; and the number of steps timed."""
    for _ in range(cfg["warmup"]):
        step()
        env.sync()
    env.finish_compiles()
    t0 = time.perf_counter()
    step()
    env.sync()
    est = (time.perf_counter() - t0) * 1e3
    if not env.cuda:  # --smoke: the code path only
        return est, 1
    n = _reps(est, cfg["budget_ms"], cfg["min_steps"], cfg["steps"])
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        env.sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), n


def graph_ms(env: Env, step, cfg: dict) -> float:
    """Median GPU time (ms) of one replay of a CUDA graph holding one ``step()``."""
    torch = env.torch
    env.finish_compiles()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture (lazy inits), as torch's docs advise
        step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            step()
        torch.cuda.synchronize()
        times: list[float] = []
        n = 1  # the first replay estimates the time of one, which sets the number of replays
        while len(times) < n + 1:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            graph.replay()
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1))
            if len(times) == 1:
                n = _reps(times[0], cfg["budget_ms"], cfg["min_steps"], cfg["steps"])
        return statistics.median(times[1:])
    finally:
        try:  # frees the graph's memory pool now; never hides the capture's own error
            graph.reset()
            torch.cuda.synchronize()
        except Exception as e:
            print(f"# graph reset: {type(e).__name__}: {e}", flush=True)


# ------------------------------------------------------------------------------------- scenarios
def _diff(a, b, rows) -> float:
    return float((a.float() - b.float())[rows].abs().max()) if a.numel() else 0.0


def run_scenario(env: Env, sc: Scenario, args, cfg: dict, seed: int) -> list[dict]:
    torch = env.torch
    env.free()  # the previous scenario's tensors back to the device before the memory check
    impls = impls_for(env, sc)
    nhd = "ours_pp_nhd" in impls
    meta = make_meta(env, sc, seed)
    need = layer_bytes(env, sc, meta, nhd) * args.layers
    if env.cuda:
        free, _ = torch.cuda.mem_get_info()
        if need > 0.85 * free:
            print(
                f"# {sc.name}: skipped, needs {need / 2**30:.1f} GiB of {free / 2**30:.1f} free", flush=True
            )
            return [{"scenario": sc.name, "impl": "-", "note": f"skipped: needs {need / 2**30:.1f} GiB"}]
    gen = torch.Generator(device=env.device).manual_seed(seed)
    layers = [make_layer(env, sc, meta, gen, nhd) for _ in range(args.layers)]
    rows_mask = meta["rows"]
    ref = reference(env, sc, meta, layers[0]) if env.smoke else None
    base = None  # vLLM's output on layer 0
    rows: list[dict] = []
    for impl in impls:
        row = {"scenario": sc.name, "impl": impl, "layers": args.layers}
        t0 = time.perf_counter()
        try:
            calls = [make_call(env, sc, impl, meta, lay) for lay in layers]
            layers[0]["o"].zero_()  # (rows skip_decode skips stay 0 for every implementation)
            counts, out = count_launches(env, calls[0])  # the first calls compile
            row["launches"] = counts["kernels"]
            out = as_tokens(out, sc).clone()
            if impl == "vllm":
                base = out
            elif base is not None:
                row["diff_vs_vllm"] = _diff(out, base, rows_mask)
            if ref is not None:
                row["diff_vs_ref"] = _diff(out, ref, rows_mask)

            def step(calls=calls):
                for c in calls:
                    c()

            row["wall_ms"], row["steps"] = wall_ms(env, step, cfg)
            if env.cuda and not args.no_graph:
                try:
                    row["graph_ms"] = graph_ms(env, step, cfg)
                    row["wall_over_graph"] = row["wall_ms"] / row["graph_ms"]
                except Exception as e:  # a call that cannot be captured is a finding, not a crash
                    row["note"] = f"graph capture failed: {type(e).__name__}: {str(e)[:120]}"
                    env.sync()
        except Exception as e:
            row["note"] = f"failed: {type(e).__name__}: {str(e)[:160]}"
            print(f"# {sc.name} {impl}: {row['note']}", flush=True)
            env.sync()
        row["time_s"] = round(time.perf_counter() - t0, 1)
        rows.append(row)
    vl = next((r for r in rows if r["impl"] == "vllm"), None)
    for r in rows:
        if r["impl"] == "vllm" or vl is None:
            continue
        if r.get("wall_ms") and vl.get("wall_ms"):
            r["vs_vllm"] = r["wall_ms"] / vl["wall_ms"]
        if r.get("graph_ms") and vl.get("graph_ms"):
            r["graph_vs_vllm"] = r["graph_ms"] / vl["graph_ms"]
        if r["impl"] != "sdpa" and r.get("vs_vllm") is not None:
            g = r.get("graph_ms")
            ok = r["vs_vllm"] <= 1.0 and (g is None or g < 2.0 or r["wall_ms"] <= 1.15 * g)
            r["accept"] = "yes" if ok else "no"
    for r in rows:
        r.setdefault("note", sc.note)
    return rows


# ------------------------------------------------------------------------------- tiny problems
def tiny_problem(env: Env, dt=None) -> dict:
    """1 sequence, 16 new tokens on a 16-token context, 8/2 heads, d128, page 16 (--smoke: 8 new tokens,
    2/1 heads, d16)."""
    torch, dev = env.torch, env.device
    dt = dt or env.dtype
    h, hk, d, page, ctx, new = 8, 2, 128, 16, 16, 16
    if env.smoke:  # interpreter sizes
        h, hk, d, new = 2, 1, 16, 8
    g = torch.Generator(device=dev).manual_seed(7)

    def randn(*shape):
        return torch.randn(*shape, device=dev, dtype=dt, generator=g)

    pages = -(-(ctx + new) // page)
    nb = pages + 1  # one spare block
    x = 16 // (torch.finfo(dt).bits // 8)
    p = {"q": randn(new, h, d), "k": randn(new, hk, d), "v": randn(new, hk, d)}
    p["k_cache"], p["v_cache"] = randn(nb, hk, d // x, page, x), randn(nb, hk, d, page)
    p["k_nhd"], p["v_nhd"] = split_to_nhd(p["k_cache"], p["v_cache"])
    p["k_hnd"], p["v_hnd"] = nhd_to_hnd(p["k_nhd"]), nhd_to_hnd(p["v_nhd"])
    perm = torch.randperm(nb, generator=torch.Generator().manual_seed(7))[:pages]
    p["block_table"] = perm.view(1, pages).to(device=dev, dtype=torch.int32)
    p["cu"] = torch.tensor([0, new], dtype=torch.int32, device=dev)
    p["seq_lens"] = torch.tensor([ctx + new], dtype=torch.int32, device=dev)
    p["lens"] = torch.tensor([new], dtype=torch.int32, device=dev)
    p["starts"] = p["cu"][:-1]
    p["scale"] = torch.ones(1, dtype=torch.float32, device=dev)
    p["o"] = torch.zeros_like(p["q"])
    p["lse"] = torch.zeros(h, new, dtype=torch.float32, device=dev)
    p["max_seq"], p["max_q"] = ctx + new, new
    # the model options' inputs (FEATURES): fp8 e4m3 caches, per-head ALiBi slopes and sinks, an fp8 output
    f8 = torch.float8_e4m3fn
    p["k_cache8"] = randn(nb, hk, d // 16, page, 16).to(f8)  # an fp8 split cache packs 16 features a slot
    p["v_cache8"] = p["v_cache"].to(f8)
    p["k_nhd8"], p["v_nhd8"] = p["k_nhd"].to(f8), p["v_nhd"].to(f8)
    p["k_hnd8"], p["v_hnd8"] = p["k_hnd"].to(f8), p["v_hnd"].to(f8)
    p["slopes"] = torch.linspace(0.5, 0.01, h, device=dev, dtype=torch.float32)
    p["sinks"] = torch.zeros(h, device=dev, dtype=torch.float32)
    p["o8"] = torch.zeros(new, h, d, device=dev, dtype=f8)
    p["q4"] = p["q"].transpose(0, 1).unsqueeze(0)  # [1, H, S, D]
    p["k4"] = randn(1, h, new, d)  # equal heads: the plainest SDPA call
    p["v4"] = randn(1, h, new, d)
    return p


def tiny_call(
    env: Env, p: dict, entry: str, layout: str = "split", kv: str = "given", lse: bool = False,
    left: int = -1, feature: str = "",
):  # fmt: skip
    """A callable for one entry point on the tiny problem (None when it does not exist); ``left`` >= 0: a
    causal window of ``left`` keys behind each query (``ours_pp`` / ``ours_wp``); ``feature``: one model
    option of :data:`FEATURES` on that call (``fp8_cache``: ``ours_pp`` only)."""
    q, o = p["q"], p["o"]
    k, v = (p["k"], p["v"]) if kv == "given" else (None, None)
    kc, vc = {"split": ("k_cache", "v_cache"), "nhd": ("k_nhd", "v_nhd"), "hnd": ("k_hnd", "v_hnd")}[layout]
    fp8 = "8" if feature == "fp8_cache" else ""  # the fp8 copies of the caches
    kc, vc = p[kc + fp8], p[vc + fp8]
    if entry in ("ours_pp_caf", "vllm_pp"):
        f = env.pp.context_attention_fwd if entry == "ours_pp_caf" else env.vllm_pp
        if f is None:
            return None
        args = (
            q, k, v, o, "auto", kc, vc, p["block_table"], p["cu"], p["seq_lens"], p["max_seq"], p["max_q"],
            p["scale"], p["scale"],
        )  # fmt: skip
        return lambda: f(*args)
    if entry == "ours_pp":
        pp = env.pp.prefix_prefill
        args = (q, k, v, kc, vc, p["block_table"], p["cu"], p["seq_lens"], p["max_q"])
        extra = {"return_lse": True, "lse": p["lse"]} if lse else {}
        if left >= 0:
            extra["window"] = (left, -1)
        extra.update(feature_options(p, feature))
        if feature == "fp8_out":
            o = p["o8"]
        return lambda: pp(*args, kv_layout=layout, out=o, **extra)
    kk, vv = p["k"], p["v"]  # varlen: the new tokens' own K/V (8/2 heads)
    if entry in ("ours_wp_caf", "vllm_wp"):
        f = env.wp.context_attention_fwd if entry == "ours_wp_caf" else env.vllm_wp
        if f is None:
            return None
        args = (q, kk, vv, o, p["starts"], p["lens"], p["max_q"], True)
        return lambda: f(*args)
    if entry == "ours_wp":
        wp = env.wp.window_prefill
        extra = {"return_lse": True, "lse": p["lse"]} if lse else {}
        if left >= 0:
            extra["window"] = (left, -1)
        if feature == "fp8_cache":
            return None
        extra.update(feature_options(p, feature))
        if feature == "fp8_out":
            o = p["o8"]
        return lambda: wp(q, kk, vv, p["cu"], p["max_q"], causal=True, out=o, **extra)
    if entry == "sdpa":
        sdpa = env.torch.nn.functional.scaled_dot_product_attention
        q4, k4, v4 = p["q4"], p["k4"], p["v4"]
        return lambda: sdpa(q4, k4, v4, is_causal=True)
    raise ValueError(entry)


#: The model options a host row may add to ``ours_pp`` / ``ours_wp`` (``tiny_call``'s ``feature``).
FEATURES = ("alibi", "sinks", "cap50", "fp8_out", "fp8_cache")


def feature_options(p: dict, feature: str) -> dict:
    """The keyword arguments of one of :data:`FEATURES` on the tiny problem ``p`` (``fp8_cache``: its
    scales; ``tiny_call`` swaps in the fp8 caches); ``""``: none."""
    return {
        "": {},
        "alibi": {"alibi_slopes": p["slopes"]},
        "sinks": {"sinks": p["sinks"]},
        "cap50": {"softcap": 50.0},
        "fp8_out": {"fp8_out_scale": p["scale"]},
        "fp8_cache": {"k_scale": p["scale"], "v_scale": p["scale"]},
    }[feature]


HOST_ROWS = [  # (row name, entry, layout, left window or -1, feature of FEATURES or "")
    ("ours_pp_caf", "ours_pp_caf", "split", -1, ""),
    ("ours_pp_split", "ours_pp", "split", -1, ""),
    ("ours_pp_nhd", "ours_pp", "nhd", -1, ""),
    ("ours_pp_nhd_w127", "ours_pp", "nhd", 127, ""),
    *[(f"ours_pp_nhd_{f}", "ours_pp", "nhd", -1, f) for f in FEATURES],
    ("ours_wp_caf", "ours_wp_caf", "split", -1, ""),
    ("ours_wp", "ours_wp", "split", -1, ""),
    ("ours_wp_w127", "ours_wp", "split", 127, ""),
    *[(f"ours_wp_{f}", "ours_wp", "split", -1, f) for f in FEATURES if f != "fp8_cache"],
    ("vllm_pp", "vllm_pp", "split", -1, ""),
    ("vllm_wp", "vllm_wp", "split", -1, ""),
    ("sdpa", "sdpa", "split", -1, ""),
]
FEATURE_NOTES = {
    "alibi": "per-head ALiBi slopes (float32)",
    "sinks": "per-head sinks (float32)",
    "cap50": "softcap 50",
    "fp8_out": "an fp8 e4m3 output (fp8_out_scale: a 1-element tensor)",
    "fp8_cache": "fp8 e4m3 caches (k_scale / v_scale: 1-element tensors)",
}
HOST_NOTES = {
    "ours_pp_caf": "prefix_prefill.context_attention_fwd, split cache",
    "ours_pp_split": "prefix_prefill.prefix_prefill(), split cache",
    "ours_pp_nhd": "prefix_prefill.prefix_prefill(), NHD cache",
    "ours_pp_nhd_w127": "prefix_prefill.prefix_prefill(), NHD cache, window (127, -1) (the persistent form)",
    "ours_wp_caf": "window_prefill.context_attention_fwd",
    "ours_wp": "window_prefill.window_prefill()",
    "ours_wp_w127": "window_prefill.window_prefill(), window (127, -1) (the Gluon kernel on sm90)",
    **{
        f"ours_pp_nhd_{f}": f"prefix_prefill.prefix_prefill(), NHD cache, {n}"
        for f, n in FEATURE_NOTES.items()
    },
    **{
        f"ours_wp_{f}": f"window_prefill.window_prefill(), {n}"
        for f, n in FEATURE_NOTES.items()
        if f != "fp8_cache"
    },
    "vllm_pp": "vLLM 0.33 prefix_prefill.context_attention_fwd",
    "vllm_wp": "vLLM 0.33 triton_prefill_attention.context_attention_fwd",
    "sdpa": "torch SDPA [1, 8, 16, 128] (q, k, v), default backend",
}
VLLM_OF = {"ours_pp_caf": "vllm_pp", "ours_pp_split": "vllm_pp", "ours_pp_nhd": "vllm_pp",
           "ours_wp_caf": "vllm_wp", "ours_wp": "vllm_wp"}  # fmt: skip


def host_table(env: Env, cfg: dict) -> list[dict]:
    """Host time per call of the tiny problem: ``calls`` calls without a sync, after warm-up, in rounds
    that take every entry in turn. The H200 machine's host (a virtual machine) runs whole stretches up to
    1.8x slower, every entry alike (torch SDPA's calls too), so ``host_us`` / ``wall_us`` are the best
    round (noise only adds), ``host_median_us`` the median one, and ``vs_vllm`` / ``vs_sdpa`` the median
    over rounds of the ratio to that peer's time in the same round. Every entry is timed before any is
    profiled (a torch.profiler session, which counts the launches, can leave the process's launches
    slower after it), then each entry's launches and CUDA-graph time."""
    p = tiny_problem(env)
    rows, fns = [], []
    for name, entry, layout, left, feature in HOST_ROWS:
        fn = tiny_call(env, p, entry, layout, left=left, feature=feature)
        if fn is None:
            continue
        row = {
            "impl": name,
            "calls": cfg["host_calls"],
            "target_us": HOST_TARGET_US.get(name),
            "note": HOST_NOTES[name],
        }
        try:
            fn()  # compile, and let the compile tiers finish
            env.sync()
            env.finish_compiles()
            for _ in range(cfg["host_warmup"]):
                fn()
            env.sync()
            fns.append((row, fn))
        except Exception as e:
            row["note"] += f"; failed: {type(e).__name__}: {str(e)[:160]}"
            env.sync()
        rows.append(row)
    n = cfg["host_calls"]
    times: dict[str, tuple[list, list]] = {row["impl"]: ([], []) for row, _ in fns}
    for _ in range(cfg["host_rounds"]):
        for row, fn in fns:
            host, wall = times[row["impl"]]
            env.sync()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            t1 = time.perf_counter()
            env.sync()
            t2 = time.perf_counter()
            host.append((t1 - t0) / n * 1e6)
            wall.append((t2 - t0) / n * 1e6)
    for row, _ in fns:
        host, wall = times[row["impl"]]
        best = min(range(len(host)), key=host.__getitem__)
        row["host_us"], row["wall_us"] = host[best], wall[best]
        row["host_median_us"] = statistics.median(host)
        for col, peer in (("vs_vllm", VLLM_OF.get(row["impl"])), ("vs_sdpa", "sdpa")):
            if peer in times and peer != row["impl"]:
                row[col] = statistics.median(a / b for a, b in zip(host, times[peer][0], strict=True))
    for row, fn in fns:
        try:
            row["launches"] = count_launches(env, fn)[0]["kernels"]
            if env.cuda and not cfg["no_graph"]:
                try:
                    row["graph_us"] = (
                        graph_ms(env, lambda fn=fn: [fn() for _ in range(GRAPH_CALLS)], cfg)
                        * 1e3
                        / GRAPH_CALLS
                    )
                except Exception as e:
                    row["note"] += f"; graph capture failed: {type(e).__name__}: {str(e)[:100]}"
                    env.sync()
        except Exception as e:
            row["note"] += f"; failed: {type(e).__name__}: {str(e)[:160]}"
            env.sync()
    return rows


LAUNCH_ROWS = (
    [("ours_pp_caf", "split", kv, False) for kv in ("given", "cache")]
    + [("ours_pp", lay, kv, lse) for lay in ("split", "nhd", "hnd") for kv in ("given", "cache")
       for lse in (False, True)]
    + [("ours_wp_caf", "-", "given", False), ("ours_wp", "-", "given", False),
       ("ours_wp", "-", "given", True)]
    + [("vllm_pp", "split", kv, False) for kv in ("given", "cache")]
    + [("vllm_wp", "-", "given", False), ("sdpa", "-", "given", False)]
)  # fmt: skip


def launch_table(env: Env) -> list[dict]:
    """CUDA kernels per call of each entry point / layout / K-V source / return_lse (tiny problem)."""
    p = tiny_problem(env)
    rows = []
    for entry, layout, kv, lse in LAUNCH_ROWS:
        fn = tiny_call(env, p, entry, "split" if layout == "-" else layout, kv, lse)
        if fn is None:
            continue
        row = {"entry": entry, "layout": layout, "kv": kv, "return_lse": lse}
        try:
            row.update(count_launches(env, fn)[0])
        except Exception as e:
            row["note"] = f"failed: {type(e).__name__}: {str(e)[:160]}"
            env.sync()
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results directory (default bench/results/<gpu>/<date>-<commit>)",
    )
    ap.add_argument(
        "--quick", action="store_true", help="fewer steps and calls (fits one 10-minute GPU call)"
    )
    ap.add_argument(
        "--smoke", action="store_true", help="CPU: Triton interpreter, L=2, tiny sizes, fp16, no graphs"
    )
    ap.add_argument("--sweep", action="store_true", help="accepted for bench/run_all.py; no effect")
    ap.add_argument(
        "--layers", type=int, default=None, help="attention calls per step (default 32; 2 with --smoke)"
    )
    ap.add_argument("--scenarios", default="", help="comma list of scenario names (default all)")
    ap.add_argument("--tables", default="host,launches,steps", help="comma list of host, launches, steps")
    ap.add_argument("--host-calls", type=int, default=None, help="calls per round of the host table (3000)")
    ap.add_argument("--no-vllm", action="store_true", help="skip vLLM's kernels even when importable")
    ap.add_argument("--no-graph", action="store_true", help="no CUDA-graph timings")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="skip the scenarios left after this many s (default 210 with --quick)")  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.layers is None:
        args.layers = 2 if args.smoke else 32
    if args.budget_s is None:
        args.budget_s = 210.0 if args.quick else 0.0
    args.tables = {t.strip() for t in args.tables.split(",") if t.strip()}
    bad = args.tables - {"host", "launches", "steps"}
    if bad:
        ap.error(f"unknown tables {sorted(bad)}")
    return args


def config(args) -> dict:
    if args.smoke:
        return {"warmup": 0, "steps": 1, "min_steps": 1, "budget_ms": 0.0, "host_calls": args.host_calls or 2,
                "host_warmup": 0, "host_rounds": 1, "no_graph": True}  # fmt: skip
    if args.quick:
        return {"warmup": 1, "steps": 8, "min_steps": 3, "budget_ms": 1500.0,
                "host_calls": args.host_calls or 3000, "host_warmup": 100, "host_rounds": 5,
                "no_graph": args.no_graph}  # fmt: skip
    return {"warmup": 2, "steps": 30, "min_steps": 5, "budget_ms": 5000.0,
            "host_calls": args.host_calls or 3000, "host_warmup": 300, "host_rounds": 5,
            "no_graph": args.no_graph}  # fmt: skip


def _emit(out: Path, stem: str, rows: list[dict], keys: list[str]) -> None:
    ordered = [{k: r.get(k, "") for k in keys + [k for k in r if k not in keys]} for r in rows]
    write_rows(out, stem, [{k: ("" if v is None else v) for k, v in r.items()} for r in ordered])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # also where a GPU session exports TRITON_INTERPRET=0
    start(interpret=args.smoke)
    env = Env(args.smoke, args.no_vllm)
    if not env.cuda and not args.smoke:
        print("this benchmark needs a CUDA/ROCm device (or --smoke for a CPU run)", file=sys.stderr)
        return 2
    torch = env.torch
    torch.manual_seed(args.seed)
    cfg = config(args)
    gpu = gpu_name() if env.cuda else "cpu"
    out = args.out or ROOT / "bench" / "results" / gpu.replace(" ", "_") / f"{today()}-{commit()}"
    out.mkdir(parents=True, exist_ok=True)
    print(
        f"# {gpu}, torch {torch.__version__}, {env.dtype}, layers {args.layers}, "
        f"vLLM {'yes' if env.vllm_pp is not None else 'no'}, quick {args.quick}, out {out}",
        flush=True,
    )
    t_start = time.perf_counter()
    tables = {}
    if "host" in args.tables:
        rows = host_table(env, cfg)
        print_rows(rows, HOST_KEYS)
        _emit(out, "engine_host", rows, HOST_KEYS)
        tables["engine_host"] = rows
        print(f"# host table done at {time.perf_counter() - t_start:.0f} s", flush=True)
    if "launches" in args.tables:
        rows = launch_table(env)
        print_rows(rows, LAUNCH_KEYS[:-2])
        _emit(out, "engine_launches", rows, LAUNCH_KEYS)
        tables["engine_launches"] = rows
        print(f"# launch table done at {time.perf_counter() - t_start:.0f} s", flush=True)
    if "steps" in args.tables:
        chosen = [s for s in args.scenarios.split(",") if s.strip()]
        all_sc = scenarios(args.smoke)
        unknown = set(chosen) - {s.name for s in all_sc}
        if unknown:
            print(
                f"unknown scenarios {sorted(unknown)}; choose from {[s.name for s in all_sc]}",
                file=sys.stderr,
            )
            return 2
        rows = []
        for i, sc in enumerate(s for s in all_sc if not chosen or s.name in chosen):
            elapsed = time.perf_counter() - t_start
            if args.budget_s and elapsed > args.budget_s:
                print(
                    f"# {sc.name}: skipped, {elapsed:.0f} s past the {args.budget_s:.0f} s budget", flush=True
                )
                rows.append({"scenario": sc.name, "impl": "-", "note": "skipped: time budget"})
                continue
            new = run_scenario(env, sc, args, cfg, args.seed + i)
            env.free()
            print_rows(
                new,
                ["scenario", "impl", "wall_ms", "graph_ms", "vs_vllm", "launches", "diff_vs_vllm", "time_s"],
            )
            rows += new
            _emit(out, "engine_step", rows, STEP_KEYS)  # after every scenario: a cut run keeps its rows
        tables["engine_step"] = rows
    print(f"# done in {time.perf_counter() - t_start:.0f} s", flush=True)
    for stem in tables:
        print(f"\n## {stem}\n" + (out / f"{stem}.md").read_text(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
