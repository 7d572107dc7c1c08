"""Compile the Triton kernel's planned variants for NVIDIA/AMD targets without a GPU (Triton's bundled
toolchains).

The interpreter accepts things the compiler rejects (a non-constexpr global, a bad constexpr
expression); this compiles, in a subprocess without ``TRITON_INTERPRET``, the constexprs that
:func:`prefix_prefill.plan.triton_plan` gives a matrix of problems (every table entry's head bucket,
cache layouts, page classes, fp8 caches and outputs, windows, ALiBi, sinks, soft-capping, k=None, the
LSE, skip_decode) and the other form of each choice the plan makes, and checks the compiled shared
memory against each architecture's budget. The problems are meta tensors: no memory, no device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from paged_kv_offsets import describe_kv_cache
from prefix_prefill.configs import SHARED_MEMORY_BUDGET
from prefix_prefill.kernel import _fwd_kernel
from prefix_prefill.plan import make_problem, triton_plan

DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp8e4nv": torch.float8_e4m3fn}
TT = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32", "fp8e4nv": "fp8e4nv"}
PTRS = ("Q", "K", "V", "O", "K_cache", "V_cache", "Block_table", "Cu_seqlens_q", "Seq_lens", "Sinks",
        "Alibi_slopes", "K_scale", "V_scale", "Out_scale", "Lse")
DNS = ("window_left", "window_right", "n_bt_cols", "page_size", "stride_bt_row", "stride_lse_h", "num_blocks",
       "n_tokens", "max_query_len")


def problem(arch, dtype, cache, out, layout, d, page, opts):
    qd, cd, od = DT[dtype], DT[cache], DT[out]
    meta = lambda *s, dt=qd: torch.empty(*s, dtype=dt, device="meta")
    q, o = meta(64, 8, d), meta(64, 8, d, dt=od)
    k = v = None if opts.get("kv_from_cache") else meta(64, 2, d)
    x = 16 // cd.itemsize
    if layout == "split":
        kc, vc = meta(8, 2, d // x, page, x, dt=cd), meta(8, 2, d, page, dt=cd)
    elif layout == "nhd":
        kc = vc = meta(8, page, 2, d, dt=cd)
    else:
        kc = vc = meta(8, 2, page, d, dt=cd)
    kcv, vcv = describe_kv_cache(kc, vc, layout)
    bt = meta(2, 4, dt=torch.int32)
    p = make_problem(q, k, v, o, kc, vc, kcv, vcv, bt, arch=arch, gluon=False,
                     causal=opts.get("causal", True), left=opts.get("left", -1), right=opts.get("right", -1),
                     scale=0.1, alibi=opts.get("alibi", False), sinks=opts.get("sinks", False),
                     softcap_form=opts.get("softcap", 0), skip_decode=opts.get("skip_decode", False),
                     lse=opts.get("lse", False))
    return p


def source(p, consts, dtype, cache, out):
    c = dict(consts, Status=None)  # (no status=: a constexpr None)
    if not c["RETURN_LSE"]:
        c.update(Lse=None, stride_lse_h=None)
    types = {"Q": TT[dtype], "K": TT[dtype], "V": TT[dtype], "O": TT[out], "K_cache": TT[cache],
             "V_cache": TT[cache], "Block_table": "i32", "Cu_seqlens_q": "i32", "Seq_lens": "i32"}
    sig, attrs = {}, {}
    for i, n in enumerate(_fwd_kernel.arg_names):
        if n in c:
            sig[n] = "constexpr"
        elif n in PTRS:
            sig[n] = "*" + types.get(n, "fp32")
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif n in ("qk_scale", "softcap2"):
            sig[n] = "fp32"
        else:
            sig[n] = "i32"
            if n not in DNS:
                attrs[(i,)] = [["tt.divisibility", 16]]
    missing = [_fwd_kernel.arg_names[i] for i in _fwd_kernel.constexprs if _fwd_kernel.arg_names[i] not in c]
    assert not missing, f"constexpr parameters the plan leaves out: {missing}"
    return ASTSource(_fwd_kernel, sig, c, attrs)


results = []
for target, arch, dtype, cache, out, layout, d, page, opts, forms in json.loads(sys.argv[1]):
    p = problem(arch, dtype, cache, out, layout, d, page, opts)
    chosen = triton_plan(p)
    for form in [{}, *forms]:
        plan = chosen.replace(constexprs=form) if form else chosen
        src = source(p, plan.consts(), dtype, cache, out)
        opt = plan.opts()
        k = triton.compile(src, target=GPUTarget(*target),
                           options={"num_warps": opt["num_warps"], "num_stages": opt["num_stages"]})
        results.append([arch, d, dtype, layout, page, form, k.metadata.shared, SHARED_MEMORY_BUDGET[arch]])
print(json.dumps(results))
"""

H90 = ["cuda", 90, 32]
H80 = ["cuda", 80, 32]
MI300 = ["hip", "gfx942", 64]
CASES = [
    # (target, table arch, q / cache / out dtype, layout, head size, page, options, other forms)
    [H90, "sm90", "bf16", "bf16", "bf16", "split", 128, 544, {"left": 100, "alibi": True, "sinks": True},
     [{"WIDE_OFFSETS": True}]],
    [H90, "sm90", "fp16", "fp8e4nv", "fp8e4nv", "split", 256, 1056,
     {"kv_from_cache": True, "causal": False, "right": 7}, [{"GRANULE": 0}]],
    [H90, "sm90", "bf16", "bf16", "bf16", "split", 64, 544, {}, []],
    [H90, "sm90", "bf16", "bf16", "bf16", "split", 256, 1040, {}, [{"PREFETCH_IDS": True}]],
    [H90, "sm90", "bf16", "bf16", "bf16", "nhd", 128, 16, {"softcap": 2, "lse": True},
     [{"MERGE_NEW": False}]],
    [H90, "sm90", "bf16", "bf16", "bf16", "nhd", 128, 1056, {}, [{"PREFETCH_IDS": False}]],
    [H90, "sm90", "bf16", "bf16", "bf16", "hnd", 128, 544, {"kv_from_cache": True}, []],
    [H90, "sm90", "fp32", "fp32", "fp32", "nhd", 80, 16, {"skip_decode": True, "lse": True}, []],
    [H80, "sm80", "fp16", "fp16", "fp16", "split", 64, 16, {"skip_decode": True, "lse": True}, []],
    [H80, "sm80", "fp32", "fp32", "fp32", "nhd", 80, 16, {}, []],
    [MI300, "gfx942", "fp16", "fp16", "fp16", "split", 128, 544, {"left": 31, "alibi": True}, []],
]  # fmt: skip


@pytest.mark.compile_check
def test_kernel_compiles_for_gpu_targets_offline():
    try:
        import triton.backends.nvidia  # noqa: F401
    except Exception:
        pytest.skip("Triton's NVIDIA backend is not available")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(
        [
            str(ROOT / "packages" / p / "src")
            for p in ("paged-kv-offsets", "prefill-runtime", "prefix-prefill")
        ]
        + [env.get("PYTHONPATH", "")]
    )
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(CASES)], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == sum(1 + len(c[-1]) for c in CASES)
    for arch, d, dtype, layout, page, form, shared, budget in results:
        assert 0 < shared <= budget, (arch, d, dtype, layout, page, form, shared, budget)
