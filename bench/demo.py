"""Demo: one realistic prefill per kernel, checked against the float64 reference.

On a GPU: a windowed LLM prefill (window-prefill) and a chunked prefill over a paged cache with a
non-power-of-2 page (prefix-prefill), bf16, timed. Without a GPU: the same calls under the Triton
interpreter at a small size (fp16), with a note saying so. Prints one table per kernel: shape, time,
TFLOP/s of useful work, max abs error and relative L2 error against the reference.
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
    if GPU:
        return bench_ms(fn)
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def visible_pairs(len_q: int, len_k: int, causal: bool, left: int) -> int:
    n = 0
    for i in range(len_q):
        p = len_k - len_q + i
        hi = p if causal else len_k - 1
        lo = 0 if left < 0 else max(0, p - left)
        n += max(0, hi - lo + 1)
    return n


def row(name, shape, ms, flops, cmp) -> None:
    print(f"| {name} | {shape} | {ms:.3f} | {tflops(flops, ms):.1f} | {cmp.max_abs:.2e} | {cmp.rel_l2:.2e} |")


def demo_window() -> None:
    n, h, hkv, d, left = (8192, 32, 8, 128, 4095) if GPU else (96, 4, 2, 64, 31)
    cu = torch.tensor([0, n // 3, n], dtype=torch.int32, device=DEV)
    q = torch.randn(n, h, d, device=DEV, dtype=DT)
    k = torch.randn(n, hkv, d, device=DEV, dtype=DT)
    v = torch.randn(n, hkv, d, device=DEV, dtype=DT)
    fn = lambda: window_prefill.window_prefill(q, k, v, cu, n, causal=True, window=(left, -1))  # noqa: E731
    out = fn()
    want = ref.attention_varlen(q, k, v, cu, cu, causal=True, window=(left, -1))
    cmp = ref.compare(out, want)
    lens = [n // 3, n - n // 3]
    flops = sum(attn_flops(visible_pairs(m, m, True, left), d, h) for m in lens)
    row("window_prefill", f"N={n} H={h}/{hkv} D={d} causal left={left}", timed(fn), flops, cmp)


def demo_prefix() -> None:
    b, ctx, new, h, hkv, d, page = (4, 8192, 2048, 16, 2, 256, 1056) if GPU else (2, 40, 24, 4, 2, 64, 17)
    pb = uniform_prefix_problem(
        torch, batch=b, heads=h, kv_heads=hkv, head_dim=d, ctx=ctx, new=new, page=page, layout="nhd",
        device=DEV, dtype=DT, spare=5,
    )  # fmt: skip
    q, k, v, k_cache, v_cache = pb["q"], pb["k"], pb["v"], pb["k_cache"], pb["v_cache"]
    table, cu, seq_lens = pb["block_table"], pb["cu"], pb["seq_lens"]
    fn = lambda: prefix_prefill.prefix_prefill(q, k, v, k_cache, v_cache, table, cu, seq_lens, new)  # noqa: E731
    out = fn()
    want = ref.paged_prefix_attention(q, k, v, k_cache, v_cache, table, cu, seq_lens, layout="nhd")
    cmp = ref.compare(out, want)
    flops = b * attn_flops(visible_pairs(new, ctx + new, True, -1), d, h)
    row("prefix_prefill", f"B={b} ctx={ctx}+{new} H={h}/{hkv} D={d} page={page}", timed(fn), flops, cmp)


def main() -> None:
    note = "CPU, Triton interpreter (small sizes; times are not speeds)"
    where = torch.cuda.get_device_name() if GPU else note
    print(f"device: {where}, dtype {DT}")
    print("| kernel | shape | ms | TFLOP/s | max abs err | rel L2 err |")
    print("|---|---|---|---|---|---|")
    demo_window()
    demo_prefix()


if __name__ == "__main__":
    main()
