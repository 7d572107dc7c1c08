"""Launch records of a matrix of problems, made on the CPU as Hopper (sm90) launches, with PTX.

Calls the public functions of both kernel packages with CPU tensors while the launchers believe they
run on an H200 (``detect_arch`` answers ``"sm90"``), catches every kernel launch at
``JITFunction.run`` (the Triton and the Gluon kernels, full and quick compile tiers alike), and
compiles each caught launch offline for sm_90a through the kernel's own compile step (so the
package's compiler hooks apply). A record holds the kernel, the grid, the launch options, every
runtime argument (tensors by shape, strides and dtype; TMA descriptors by shape, strides, block and
layout; numbers by value) and the SHA-256 of the PTX (without line information), of the cubin and
of its SASS (``nvdisasm -c``: code sections only). The cubin embeds line tables with source paths,
so two trees compare by PTX and SASS; the cubin digest is kept for the record.

Two trees whose records are equal launch the same kernels with the same arguments and the same
machine code: a refactor that keeps them equal changes no output bit and no speed.

    python bench/launch_equivalence.py --out before.json          # PYTHONPATH = one tree's src dirs
    python bench/launch_equivalence.py --out after.json
    python bench/launch_equivalence.py --compare before.json after.json

Needs the Triton the GPU runs (3.6) for PTX that means anything; no GPU. ``--only SUBSTR[,SUBSTR...]``
selects cases by name; ``--no-compile`` records launches only (seconds instead of minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import sys
import time

os.environ["TRITON_INTERPRET"] = "0"  # compiled JIT functions, not the interpreter's
# bench/ holds scripts named like the packages (bench/prefix_prefill.py): import the packages
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import torch  # noqa: E402
from triton.runtime import jit as _jit  # noqa: E402

TARGET = None  # GPUTarget("cuda", 90, 32), made on first use
DEV = 0  # the device-cache slot the offline compiles use


# --------------------------------------------------------------------------- problems
def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _prefix_problem(layout, page, heads, kv_heads, d, dtype, seqs, *, from_cache=False, fp8=None, seed=0):
    """Tensors of a prefix-prefill call: ``seqs`` = [(context, query)], a random block table."""
    g = _gen(seed)
    tot_q = sum(q for _, q in seqs)
    pages = [-(-(c + q) // page) for c, q in seqs]
    nblocks = sum(pages) + 2
    cdt = fp8 or dtype
    if layout == "split":
        x = 16 // torch.tensor([], dtype=cdt).element_size()
        kc = torch.randn(nblocks, kv_heads, d // x, page, x, generator=g).to(cdt)
        vc = torch.randn(nblocks, kv_heads, d, page, generator=g).to(cdt)
    elif layout == "nhd":
        kc = torch.randn(nblocks, page, kv_heads, d, generator=g).to(cdt)
        vc = torch.randn(nblocks, page, kv_heads, d, generator=g).to(cdt)
    else:
        kc = torch.randn(nblocks, kv_heads, page, d, generator=g).to(cdt)
        vc = torch.randn(nblocks, kv_heads, page, d, generator=g).to(cdt)
    perm = torch.randperm(nblocks, generator=g)
    bt = torch.zeros(len(seqs), max(pages), dtype=torch.int32)
    i = 0
    for b, n in enumerate(pages):
        bt[b, :n] = perm[i : i + n].to(torch.int32)
        i += n
    cu = torch.tensor([0] + [sum(q for _, q in seqs[: i + 1]) for i in range(len(seqs))], dtype=torch.int32)
    sl = torch.tensor([c + q for c, q in seqs], dtype=torch.int32)
    q = torch.randn(tot_q, heads, d, generator=g).to(dtype)
    k = None if from_cache else torch.randn(tot_q, kv_heads, d, generator=g).to(dtype)
    v = None if from_cache else torch.randn(tot_q, kv_heads, d, generator=g).to(dtype)
    return dict(q=q, k=k, v=v, k_cache=kc, v_cache=vc, block_table=bt, cu_seqlens_q=cu, seq_lens=sl,
                max_query_len=max(q for _, q in seqs), layout=layout)  # fmt: skip


def _window_problem(heads, kv_heads, d, dtype, lens, seed=0):
    g = _gen(seed)
    n = sum(lens)
    cu = torch.tensor([0] + [sum(lens[: i + 1]) for i in range(len(lens))], dtype=torch.int32)
    return dict(
        q=torch.randn(n, heads, d, generator=g).to(dtype),
        k=torch.randn(n, kv_heads, d, generator=g).to(dtype),
        v=torch.randn(n, kv_heads, d, generator=g).to(dtype),
        cu=cu,
        max_len=max(lens),
    )


SEQS = [(40, 5), (0, 19), (300, 130)]
LONG = [(1100, 300), (2000, 129)]


def prefix_cases():
    """(name, call) pairs: every layout, page class, head class, dtype and option the launchers split on."""
    import prefix_prefill as pp

    bf, fp, f32 = torch.bfloat16, torch.float16, torch.float32
    e4m3 = torch.float8_e4m3fn
    cases = []

    def py(name, layout, page, d, dtype=bf, seqs=SEQS, heads=8, kvh=2, fp8=None, from_cache=False, **kw):
        def call():
            p = _prefix_problem(layout, page, heads, kvh, d, dtype, seqs, from_cache=from_cache, fp8=fp8)
            if fp8 is not None:
                kw.setdefault("k_scale", 0.5)
                kw.setdefault("v_scale", 0.25)
            pp.prefix_prefill(p["q"], p["k"], p["v"], p["k_cache"], p["v_cache"], p["block_table"],
                              p["cu_seqlens_q"], p["seq_lens"], p["max_query_len"], kv_layout=layout,
                              **kw)  # fmt: skip

        cases.append((name, call))

    def vllm(name, page, d, dtype=bf, seqs=SEQS, heads=8, kvh=2, **kw):
        def call():
            p = _prefix_problem("split", page, heads, kvh, d, dtype, seqs)
            o = torch.empty_like(p["q"])
            pp.context_attention_fwd(p["q"], p["k"], p["v"], o, "auto", p["k_cache"], p["v_cache"],
                                     p["block_table"], p["cu_seqlens_q"], p["seq_lens"], None,
                                     p["max_query_len"], 1.0, 1.0, **kw)  # fmt: skip

        cases.append((name, call))

    for layout in ("split", "nhd", "hnd"):
        for page in (1, 16, 64, 512, 544, 1056):
            for d in (64, 128, 256):
                py(f"pp-{layout}-p{page}-d{d}", layout, page, d)
            py(f"pp-{layout}-p{page}-d128-cache", layout, page, 128, from_cache=True)
        py(f"pp-{layout}-p16-d80", layout, 16, 80)
        py(f"pp-{layout}-p544-d192", layout, 544, 192)
        py(f"pp-{layout}-p16-d128-fp16", layout, 16, 128, dtype=fp)
        py(f"pp-{layout}-p16-d128-fp32", layout, 16, 128, dtype=f32)
        py(f"pp-{layout}-p544-d256-long", layout, 544, 256, seqs=LONG)
        py(f"pp-{layout}-p16-d128-lse", layout, 16, 128, return_lse=True)
        py(f"pp-{layout}-p16-d128-window", layout, 16, 128, window=(100, -1))
        py(f"pp-{layout}-p16-d128-alibi", layout, 16, 128, alibi_slopes=torch.rand(8))
        py(f"pp-{layout}-p16-d128-sinks", layout, 16, 128, sinks=torch.randn(8))
        py(f"pp-{layout}-p16-d128-softcap", layout, 16, 128, softcap=30.0)
        py(f"pp-{layout}-p16-d128-noncausal", layout, 16, 128, causal=False)
        py(f"pp-{layout}-p16-d128-fp8", layout, 16, 128, fp8=e4m3)
        py(f"pp-{layout}-p544-d256-fp8-cache", layout, 544, 256, fp8=e4m3, from_cache=True)
        py(f"pp-{layout}-p16-d128-mqa", layout, 16, 128, heads=8, kvh=1)
    vllm("ctx-p16-d128", 16, 128)
    vllm("ctx-p544-d256", 544, 256)
    vllm("ctx-p16-d128-skipdecode", 16, 128, seqs=[(40, 1), (30, 7), (5, 1)], skip_decode=True)
    vllm("ctx-p16-d128-window", 16, 128, sliding_window=64)
    return cases


def window_cases():
    import window_prefill as wp

    bf, fp, f32 = torch.bfloat16, torch.float16, torch.float32
    cases = []

    def py(name, d, dtype=bf, lens=(300, 700), heads=8, kvh=2, **kw):
        def call():
            p = _window_problem(heads, kvh, d, dtype, list(lens))
            wp.window_prefill(p["q"], p["k"], p["v"], p["cu"], max_seqlen=p["max_len"], **kw)

        cases.append((name, call))

    def vllm(name, d, dtype=bf, lens=(300, 700), heads=8, kvh=2, **kw):
        def call():
            p = _window_problem(heads, kvh, d, dtype, list(lens))
            o = torch.empty_like(p["q"])
            lens_t = p["cu"][1:] - p["cu"][:-1]
            wp.context_attention_fwd(p["q"], p["k"], p["v"], o, p["cu"][:-1], lens_t, p["max_len"], **kw)

        cases.append((name, call))

    for d in (64, 128, 256):
        py(f"wp-d{d}-causal", d, causal=True)
        py(f"wp-d{d}-full", d, causal=False)
        py(f"wp-d{d}-w255", d, causal=True, window=(255, -1))
        py(f"wp-d{d}-w4095-long", d, causal=True, window=(4095, -1), lens=(6000, 3000))
        py(f"wp-d{d}-causal-long", d, causal=True, lens=(6000, 3000))
    py("wp-d80", 80, causal=True)
    py("wp-d128-fp16-long", 128, dtype=fp, causal=True, lens=(6000,))
    py("wp-d128-fp32", 128, dtype=f32, causal=True)
    py("wp-d128-lse", 128, causal=True, return_lse=True)
    py("wp-d128-lse-long", 128, causal=True, return_lse=True, lens=(6000, 3000))
    py("wp-d128-sinks", 128, causal=True, sinks=torch.randn(8))
    py("wp-d128-softcap", 128, causal=True, softcap=30.0)
    py("wp-d128-right", 128, causal=False, window=(100, 50))
    py("wp-d128-mqa", 128, causal=True, kvh=1)
    vllm("wctx-d128", 128)
    vllm("wctx-d128-window", 128, sliding_window_q=128)
    return cases


# --------------------------------------------------------------------------- capture
def _describe(a):
    """A launch argument as plain data (tensors by shape/strides/dtype, descriptors by geometry)."""
    if isinstance(a, torch.Tensor):
        return ["tensor", list(a.shape), list(a.stride()), str(a.dtype), a.data_ptr() % 16 == 0]
    if type(a).__name__ in ("TensorDescriptor",):
        base = a.base
        return ["desc", list(base.shape), list(base.stride()), str(base.dtype), list(a.shape),
                list(a.strides), list(a.block_shape), repr(getattr(a, "layout", None))]  # fmt: skip
    if isinstance(a, (bool, int, float, str)) or a is None:
        return a
    if isinstance(a, torch.dtype):
        return str(a)
    if isinstance(a, (tuple, list)):
        return [_describe(x) for x in a]
    return repr(a)


class Capture:
    """``JITFunction.run`` replaced: every launch (and warm-up) is recorded, nothing runs."""

    def __init__(self):
        self.calls = []

    def __enter__(self):
        self._orig = _jit.JITFunction.run
        cap = self

        def run(fn, *args, grid, warmup, **kwargs):
            cap.calls.append((fn, args, dict(kwargs), grid, warmup))
            return None

        _jit.JITFunction.run = run
        return self

    def __exit__(self, *exc):
        _jit.JITFunction.run = self._orig


def _both_tiers(self, key, launch):
    """``CompileTiers.run`` in the harness: the quick form's launch, then the full form's compile."""
    launch(False, False)
    launch(True, True)
    return False


def _patch_arch(stack: contextlib.ExitStack) -> None:
    """Every ``detect_arch`` the packages hold answers sm90; CUDA-only host checks see a Hopper GPU;
    compile tiers record both forms in order (no background thread)."""
    import prefill_runtime

    stack.enter_context(_setattr(torch.cuda, "device", lambda *a, **k: contextlib.nullcontext()))
    stack.enter_context(_setattr(prefill_runtime.CompileTiers, "run", _both_tiers))
    for name, mod in list(sys.modules.items()):
        if not name.startswith(("prefix_prefill", "window_prefill", "prefill_runtime")) or mod is None:
            continue
        for attr in ("detect_arch", "_detect_arch"):
            if callable(getattr(mod, attr, None)):
                stack.enter_context(_setattr(mod, attr, lambda *a, **k: "sm90"))
        if callable(getattr(mod, "interpreted", None)):  # the CPU-tensor check: these run nowhere
            stack.enter_context(_setattr(mod, "interpreted", lambda: True))


@contextlib.contextmanager
def _setattr(obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _install_hooks() -> None:
    """The packages' compile hooks, as their first launch on a GPU installs them."""
    for modname in ("prefix_prefill.launch", "window_prefill.launch"):
        mod = sys.modules.get(modname)
        for attr in ("_prime_triton", "install_hooks"):
            f = getattr(mod, attr, None) if mod is not None else None
            if callable(f):
                with contextlib.suppress(Exception):
                    f()


# --------------------------------------------------------------------------- offline compile
_LOC = re.compile(r"^\s*(\.loc|\.file)\b.*$|^\s*//.*$", re.M)
_DEBUG = re.compile(r"\.section\s+\.debug\w*\s*\{.*?\n\s*\}", re.S)


def _ptx_digest(ptx: str) -> str:
    text = _DEBUG.sub("", _LOC.sub("", ptx))
    text = "\n".join(line.rstrip() for line in text.splitlines() if line.strip())
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def compile_call(fn, args, kwargs):
    """(ptx digest, cubin digest, shared bytes, compile seconds, sass digest) of one caught launch,
    for sm_90a."""
    global TARGET
    from triton.backends.compiler import GPUTarget
    from triton.compiler import CompiledKernel, make_backend
    from triton.compiler import compile as tcompile

    if TARGET is None:
        TARGET = GPUTarget("cuda", 90, 32)
    backend = make_backend(TARGET)
    if DEV not in fn.device_caches or fn.device_caches[DEV][2] != TARGET:
        binder = _jit.create_function_from_signature(fn.signature, fn.params, backend)
        fn.device_caches[DEV] = ({}, {}, TARGET, backend, binder)
        fn.CompiledKernel, fn.compile = CompiledKernel, tcompile
        if hasattr(fn, "is_gluon") and fn.is_gluon():
            from triton.experimental.gluon._runtime import GluonASTSource

            fn.ASTSource = GluonASTSource
        else:
            from triton.compiler import ASTSource

            fn.ASTSource = ASTSource
    kwargs = dict(kwargs)
    kwargs["debug"] = kwargs.get("debug", fn.debug) or False
    binder = fn.device_caches[DEV][4]
    bound_args, specialization, options = binder(*args, **kwargs)
    key = _jit.compute_cache_key(fn.device_caches[DEV][1], specialization, options)
    packed = fn._pack_args(backend, kwargs, bound_args, specialization, options)
    options, signature, constexprs, attrs = packed
    t0 = time.perf_counter()
    ck = fn._do_compile(key, signature, DEV, constexprs, options, attrs, True)
    dt = time.perf_counter() - t0
    ptx = ck.asm["ptx"]
    cubin = ck.asm.get("cubin", b"")
    cub = hashlib.sha256(cubin).hexdigest()[:16]
    return _ptx_digest(ptx), cub, ck.metadata.shared, round(dt, 2), _sass_digest(cubin)


def _sass_digest(cubin: bytes) -> str | None:
    """SHA-256 of the cubin's code sections as ``nvdisasm -c`` prints them (no line tables, so no
    source paths); None without nvdisasm."""
    import subprocess
    import tempfile

    from triton.backends.nvidia import compiler as nv

    tool = os.path.join(os.path.dirname(nv.__file__), "bin", "nvdisasm")
    if not cubin or not os.path.exists(tool):
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-c", f.name], capture_output=True, text=True, check=False).stdout
    return hashlib.sha256(out.encode()).hexdigest()[:16] if out else None


def record(cases, do_compile: bool) -> dict:
    out = {}
    compiled: dict[str, list] = {}
    for name, call in cases:
        with contextlib.ExitStack() as stack:
            _patch_arch(stack)
            cap = stack.enter_context(Capture())
            try:
                call()
                err = None
            except Exception as e:  # a case the tree rejects is recorded as such
                err = f"{type(e).__name__}: {e}"
        recs = []
        for fn, args, kwargs, grid, warmup in cap.calls:
            consts = {fn.arg_names[i] for i in fn.constexprs}
            names = fn.arg_names
            runtime = {names[i]: _describe(a) for i, a in enumerate(args) if names[i] not in consts}
            runtime.update({k: _describe(v) for k, v in kwargs.items() if k in names and k not in consts})
            options = {k: _describe(v) for k, v in kwargs.items() if k not in names}
            rec = dict(kernel=fn.__name__, grid=_describe(grid), warmup=warmup, runtime=runtime,
                       options=options)  # fmt: skip
            if do_compile:
                ckey = json.dumps([fn.__name__, _describe(args), _describe(kwargs)], sort_keys=True)
                if ckey not in compiled:
                    try:
                        compiled[ckey] = list(compile_call(fn, args, kwargs))
                    except Exception as e:
                        compiled[ckey] = [f"compile error {type(e).__name__}: {str(e)[:300]}"]
                rec["ptx"] = compiled[ckey]
            recs.append(rec)
        out[name] = dict(error=err, launches=recs)
        status = err or ", ".join(f"{r['kernel']}{'(w)' if r['warmup'] else ''}" for r in recs)
        print(f"{name}: {status}", flush=True)
    return out


def _fields(rec: dict, sass: bool) -> list[tuple]:
    """What two trees must share per launch: kernel, grid, runtime arguments, options, and the PTX
    digest with (``sass``: both records have it) the SASS digest."""
    keys = ("kernel", "grid", "runtime", "options")
    out = []
    for r in rec["launches"]:
        p = r.get("ptx", [None])
        out.append((*(r[k] for k in keys), [p[0], p[4] if sass and len(p) > 4 else None]))
    return out


def _has_sass(rec: dict) -> bool:
    return all(len(r.get("ptx", [])) > 4 and r["ptx"][4] for r in rec["launches"])


def compare(a_path: str, b_path: str) -> int:
    a, b = json.load(open(a_path)), json.load(open(b_path))
    bad = 0
    for name in sorted(set(a) | set(b)):
        ra, rb = a.get(name), b.get(name)
        if ra is None or rb is None:
            print(f"ONLY IN {'B' if ra is None else 'A'}: {name}")
            bad += 1
            continue
        sass = _has_sass(ra) and _has_sass(rb)
        la, lb = _fields(ra, sass), _fields(rb, sass)
        if (ra["error"] is None) != (rb["error"] is None) or la != lb:
            bad += 1
            print(f"DIFF {name}")
            print(f"  A: error={ra['error']}")
            print(f"  B: error={rb['error']}")
            for i, (x, y) in enumerate(zip(la, lb, strict=False)):
                for field, xa, ya in zip(("kernel", "grid", "runtime", "options", "ptx"), x, y, strict=True):
                    if xa != ya:
                        if isinstance(xa, dict) and isinstance(ya, dict):
                            keys = sorted(set(xa) | set(ya), key=str)
                            d = {k: (xa.get(k), ya.get(k)) for k in keys if xa.get(k) != ya.get(k)}
                            print(f"  launch {i} {field}: {d}")
                        else:
                            print(f"  launch {i} {field}: {xa} != {ya}")
            if len(la) != len(lb):
                print(f"  launches: {len(la)} != {len(lb)}")
    print(f"{len(set(a) | set(b)) - bad} equal, {bad} different")
    return 1 if bad else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--only", default="")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--compare", nargs=2)
    args = ap.parse_args()
    if args.compare:
        sys.exit(compare(*args.compare))
    import prefix_prefill  # noqa: F401
    import window_prefill  # noqa: F401

    _install_hooks()
    only = args.only.split(",")
    cases = [c for c in prefix_cases() + window_cases() if any(s in c[0] for s in only)]
    t0 = time.time()
    res = record(cases, not args.no_compile)
    print(f"{len(cases)} cases in {time.time() - t0:.0f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
