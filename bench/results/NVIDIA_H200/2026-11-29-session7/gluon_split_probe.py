"""Offline probe (session 7, NOTES step 26): can Gluon copy a split-K tile with lanes along tokens?

vLLM's split K cache stores one page of one head as ``[D // 8, page, 8]``. Triton's ``tl`` coalescer
gives a K tile [D, BN] 16 lanes along D (16 x-groups 8 KiB apart per warp copy). Gluon lets the
kernel choose: this probe copies a [D // 8, BN, 8] pointer tensor with 32 lanes along tokens (512
contiguous bytes per warp copy) into a permuted/reshaped view of the [D, BN] K^T tile that wgmma
reads, then runs one wgmma. Compile-only (``python gluon_split_probe.py``; triton 3.6 or 3.8 with
the NVIDIA backend, no GPU needed): prints, per shared layout, whether it compiles and the cp.async
widths. Session 7: 128-byte swizzle (K-major, ``transposed=True``) compiles with 16-byte copies;
swizzle 0 asserts in the async-copy lowering (2-byte pieces), so Triton's unswizzled NVMMA layout
is not the core-matrix order [D // 8, BN, 8]. Whether the 128-byte-swizzle form removes the excess
shared wavefronts ncu saw (step 22) needs the card: the chunked ``tl`` kernel, whose lines also
scatter to 8 rows, kept them.
"""

import re

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as ttgl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia import hopper
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp


@gluon.jit
def _probe(Kc, Q, O, stride_c, SW: ttgl.constexpr, TR: ttgl.constexpr):
    # element (c, n, e) of the split tile at c * stride_c + n * 8 + e; lanes along n
    L3: ttgl.constexpr = ttgl.BlockedLayout([1, 1, 8], [1, 32, 1], [2, 2, 1], [2, 1, 0])
    c = ttgl.arange(0, 16, layout=ttgl.SliceLayout(1, ttgl.SliceLayout(2, L3)))
    n = ttgl.arange(0, 64, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(2, L3)))
    e = ttgl.arange(0, 8, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(1, L3)))
    off = c[:, None, None] * stride_c + n[None, :, None] * 8 + e[None, None, :]
    off = ttgl.multiple_of(off, [1, 1, 8])
    lay: ttgl.constexpr = ttgl.NVMMASharedLayout(
        swizzle_byte_width=SW, element_bitwidth=16, rank=2, transposed=TR
    )
    k_t = ttgl.allocate_shared_memory(ttgl.bfloat16, [128, 64], lay)  # K^T tile [D, BN]
    cp.async_copy_global_to_shared(k_t.reshape([16, 8, 64]).permute((0, 2, 1)), Kc + off)  # as [C, BN, 8]
    cp.commit_group()
    cp.wait_group(0)
    mma: ttgl.constexpr = ttgl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16]
    )
    QL: ttgl.constexpr = ttgl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    qm = ttgl.arange(0, 64, layout=ttgl.SliceLayout(1, QL))
    qd = ttgl.arange(0, 128, layout=ttgl.SliceLayout(0, QL))
    q = ttgl.load(Q + qm[:, None] * 128 + qd[None, :])
    q_lay: ttgl.constexpr = ttgl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    q_s = ttgl.allocate_shared_memory(ttgl.bfloat16, [64, 128], q_lay, q)
    hopper.fence_async_shared()
    acc = hopper.warpgroup_mma(q_s, k_t, ttgl.zeros([64, 64], ttgl.float32, layout=mma))
    om = ttgl.arange(0, 64, layout=ttgl.SliceLayout(1, mma))
    on = ttgl.arange(0, 64, layout=ttgl.SliceLayout(0, mma))
    ttgl.store(O + om[:, None] * 64 + on[None, :], acc)


def main() -> None:
    sig = {"Kc": "*bf16", "Q": "*bf16", "O": "*fp32", "stride_c": "i32", "SW": "constexpr", "TR": "constexpr"}
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(4)}
    for sw, tr in [(0, True), (0, False), (128, True), (128, False)]:
        src = GluonASTSource(_probe, sig, {"SW": sw, "TR": tr}, attrs)
        try:
            ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
        except Exception as exc:  # the lowering asserts or a pass fails: report and go on
            print(f"swizzle {sw} transposed {tr}: does not compile ({type(exc).__name__})")
            continue
        widths = sorted(set(re.findall(r"cp\.async\.\S+ \[[^\]]*\], \[[^\]]*\], (0x[0-9a-f]+|\d+)", ptx)))
        print(f"swizzle {sw} transposed {tr}: cp.async widths {widths}, wgmma {ptx.count('wgmma.mma_async')}")


if __name__ == "__main__":
    main()
