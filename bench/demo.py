"""Demo: one realistic prefill per kernel, checked against the float64 reference (attn-reference).

On a GPU: a windowed LLM prefill (window-prefill) and a chunked prefill over a paged cache with a
non-power-of-2 page (prefix-prefill), bf16, timed with CUDA events. Without a GPU: the same calls
under the Triton interpreter on CPU tensors at a small size in fp16 (the dtype the CPU test suite
checks), with a line saying so. Prints one short table per kernel: shape, which kernel ran (the
package's ``explain`` with the call's own arguments, where the package has it), time, TFLOP/s of useful
work (GPU only), max abs error and relative L2 error against the reference. Exits 1 if an output does
not match the reference.

    python bench/demo.py            # from a checkout, or: nox -s demo
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import attn_flops, bench_ms, on_gpu_node, start, tflops, uniform_prefix_problem

start(interpret=not on_gpu_node())

import torch  # noqa: E402

import attn_reference as ref  # noqa: E402
import prefix_prefill  # noqa: E402
import window_prefill  # noqa: E402

GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1"
DEV = "cuda" if GPU else "cpu"
DT = torch.bfloat16 if GPU else torch.float16


def timed(fn) -> float:
    """Milliseconds: the median of do_bench on a GPU; one wall-clock call under the interpreter."""
    if GPU:
        return bench_ms(fn)
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def which_kernel(pkg, args: tuple, kwargs: dict) -> str:
    """``pkg.explain(*args, **kwargs)`` (the same arguments as the real call) names the kernel that
    runs; "-" where the package has no ``explain``."""
    explain = getattr(pkg, "explain", None)
    if explain is None:
        return "-"
    return str(explain(*args, **kwargs).kernel)


def visible_pairs(len_q: int, len_k: int, causal: bool, left: int) -> int:
    """Query-key pairs a causal (left-windowed) prefill of ``len_q`` queries over ``len_k`` keys sees."""
    n = 0
    for i in range(len_q):
        p = len_k - len_q + i
        hi = p if causal else len_k - 1
        lo = 0 if left < 0 else max(0, p - left)
        n += max(0, hi - lo + 1)
    return n


def table(title: str, shape: str, kernel: str, ms: float, flops: float, cmp) -> bool:
    rate = f"{tflops(flops, ms):.1f}" if GPU else "-"
    print(f"\n{title}")
    print("| shape | kernel | ms | TFLOP/s | max abs err | rel L2 err | ok |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {shape} | {kernel} | {ms:.3f} | {rate} | {cmp.max_abs:.2e} | {cmp.rel_l2:.2e} | {bool(cmp)} |")
    return bool(cmp)


def demo_window() -> bool:
    n, h, hkv, d, left = (8192, 32, 8, 128, 4095) if GPU else (96, 4, 2, 64, 31)
    cu = torch.tensor([0, n // 3, n], dtype=torch.int32, device=DEV)
    q = torch.randn(n, h, d, device=DEV, dtype=DT)
    k = torch.randn(n, hkv, d, device=DEV, dtype=DT)
    v = torch.randn(n, hkv, d, device=DEV, dtype=DT)
    args, kwargs = (q, k, v, cu, n - n // 3), {"causal": True, "window": (left, -1)}
    kernel = which_kernel(window_prefill, args, kwargs)
    out = window_prefill.window_prefill(*args, **kwargs)
    cmp = ref.compare(out, ref.attention_varlen(q, k, v, cu, cu, causal=True, window=(left, -1)))
    ms = timed(lambda: window_prefill.window_prefill(*args, **kwargs))
    flops = sum(attn_flops(visible_pairs(m, m, True, left), d, h) for m in (n // 3, n - n // 3))
    shape = f"2 sequences, {n} tokens, heads {h}/{hkv}, D {d}, causal, window ({left}, -1)"
    return table("window_prefill.window_prefill", shape, kernel, ms, flops, cmp)


def demo_prefix() -> bool:
    b, ctx, new, h, hkv, d, page = (4, 8192, 2048, 16, 2, 256, 1056) if GPU else (2, 40, 24, 4, 2, 64, 17)
    pb = uniform_prefix_problem(
        torch, batch=b, heads=h, kv_heads=hkv, head_dim=d, ctx=ctx, new=new, page=page, layout="nhd",
        device=DEV, dtype=DT, spare=5,
    )  # fmt: skip
    q, k, v, k_cache, v_cache = pb["q"], pb["k"], pb["v"], pb["k_cache"], pb["v_cache"]
    table_, cu, seq_lens = pb["block_table"], pb["cu"], pb["seq_lens"]
    args, kwargs = (q, k, v, k_cache, v_cache, table_, cu, seq_lens, new), {"kv_layout": "nhd"}
    kernel = which_kernel(prefix_prefill, args, kwargs)
    out = prefix_prefill.prefix_prefill(*args, **kwargs)
    want = ref.paged_prefix_attention(q, k, v, k_cache, v_cache, table_, cu, seq_lens, layout="nhd")
    cmp = ref.compare(out, want)
    ms = timed(lambda: prefix_prefill.prefix_prefill(*args, **kwargs))
    flops = b * attn_flops(visible_pairs(new, ctx + new, True, -1), d, h)
    shape = f"{b} x ({ctx} cached + {new} new), heads {h}/{hkv}, D {d}, page {page}, NHD cache"
    return table("prefix_prefill.prefix_prefill", shape, kernel, ms, flops, cmp)


def main() -> int:
    if GPU:
        print(f"device: {torch.cuda.get_device_name()}, {DT}, torch {torch.__version__}")
    else:
        print(
            f"device: CPU. This ran on the Triton interpreter (TRITON_INTERPRET=1) at a small size, {DT}: "
            "it shows the kernels' answers, not their speed (times are interpreter times; no TFLOP/s)."
        )
    print(
        f"window-prefill {window_prefill.__version__}, prefix-prefill {prefix_prefill.__version__}, "
        f"attn-reference {ref.__version__}"
    )
    ok = demo_window() & demo_prefix()
    print("\nall outputs match the float64 reference" if ok else "\nAN OUTPUT DOES NOT MATCH THE REFERENCE")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
