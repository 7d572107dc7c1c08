"""Offline probe (no GPU): can a Gluon kernel feed vLLM's split K cache layout to wgmma?

vLLM's K cache is ``[num_blocks, kv_heads, D/8, page, 8]`` (16-bit): a key block of ``BN`` tokens inside
one page is, per head, a ``[D/8, BN, 8]`` box. Each variant below compiles one Gluon kernel for sm_90a
(Triton's bundled toolchain) that copies such a box by TMA and runs ``Q K^T`` on it with wgmma, and
prints whether it lowers, whether shared memory is re-staged through registers, and the B operand's
wgmma descriptor (leading / stride byte offsets, swizzle mode):

* ``granules``: the box as one 3-D TMA copy into a rank-3 no-swizzle buffer, viewed as ``[BN, D]``
  through a ``SharedLinearLayout`` that states the granule order (offset = (d // 8) * BN * 8 + n * 8 +
  d % 8); the layout wgmma's no-swizzle K-major mode reads with LBO = BN * 16 B, SBO = 128 B;
* ``nvmma0``: the same view as ``NVMMASharedLayout(swizzle_byte_width=0)``;
* ``runs16``: a block across pages as 16-token runs, each run dense (``[BN/16][D/8][16][8]``): what
  one TMA box per page run would leave in shared memory.

    python bench/split_layout_probe.py        # Triton >= 3.5 with Gluon (the device runs 3.6)
    python bench/split_layout_probe.py --gpu  # also runs ``granules`` on an sm90 GPU against torch

(A variant that does not lower makes Triton print its MLIR pipeline to stderr; the verdict is on stdout.)

Findings (Triton 3.6, 2026-11-30, NOTES step 58): ``granules`` lowers to one 3-D TMA copy and wgmma
with no-swizzle descriptors (LBO 2048 B, SBO 128 B at BN = D = 128), no re-staging; ``nvmma0`` and
``runs16`` fail ("Failed to find a valid layout").
"""

from __future__ import annotations

import re
import sys


def _variant(name: str, bn: int = 128, d: int = 128, gpu: bool = False) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
    )

    f_bits = [[0, 1], [0, 2], [0, 4]]  # the 8 features of a granule
    g_bits = [[0, 8 << i] for i in range((d // 8).bit_length() - 1)]  # granules
    if name == "runs16":
        n_bits = [[1 << i, 0] for i in range(4)]  # tokens inside a 16-token run
        c_bits = [[16 << i, 0] for i in range((bn // 16).bit_length() - 1)]  # runs
        view = gl.SharedLinearLayout(offset_bases=f_bits + n_bits + g_bits + c_bits)
    elif name == "nvmma0":
        view = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
    else:
        n_bits = [[1 << i, 0] for i in range(bn.bit_length() - 1)]
        view = gl.SharedLinearLayout(offset_bases=f_bits + n_bits + g_bits)
    box = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=3)
    q_layout = gl.NVMMASharedLayout.get_default_for([64, d], gl.bfloat16)

    @gluon.jit
    def probe(Q_desc, K_desc, Out, BN: gl.constexpr, D: gl.constexpr, VIEW: gl.constexpr):
        q = gl.allocate_shared_memory(gl.bfloat16, [64, D], Q_desc.layout)
        kb = gl.allocate_shared_memory(gl.bfloat16, [D // 8, BN, 8], K_desc.layout)  # [D/8, BN, 8]
        bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(bar, count=1)
        fence_async_shared()
        mbarrier.expect(bar, (64 + BN) * D * 2)
        tma.async_copy_global_to_shared(Q_desc, [0, 0], bar, q)
        tma.async_copy_global_to_shared(K_desc, [0, 0, 0], bar, kb)
        mbarrier.wait(bar, 0)
        k2 = kb._reinterpret(gl.bfloat16, [BN, D], VIEW)  # [BN, D], granule order
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16]
        )
        b_s = warpgroup_mma(q, k2.permute((1, 0)), gl.zeros([64, BN], gl.float32, layout=s_layout))
        offs_m = gl.arange(0, 64, layout=gl.SliceLayout(1, s_layout))  # [64]
        offs_n = gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))  # [BN]
        gl.store(Out + offs_m[:, None] * BN + offs_n[None, :], b_s)

    sig = {
        "Q_desc": f"tensordesc<bf16[64, {d}],{q_layout!r}>",
        "K_desc": f"tensordesc<bf16[{d // 8}, {bn}, 8],{box!r}>",
        "Out": "*fp32",
        "BN": "constexpr",
        "D": "constexpr",
        "VIEW": "constexpr",
    }
    if gpu:  # run it: S against torch on random data (q [64, D], the K box [D/8, BN, 8])
        import torch
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        gen = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(64, d, device="cuda", generator=gen).to(torch.bfloat16)
        k_box = torch.randn(d // 8, bn, 8, device="cuda", generator=gen).to(torch.bfloat16)
        k = k_box.permute(1, 0, 2).reshape(bn, d)  # [BN, D]: feature d of token n is k_box[d // 8, n, d % 8]
        out = torch.full((64, bn), float("nan"), device="cuda")
        q_desc = TensorDescriptor.from_tensor(q, [64, d], q_layout)
        k_desc = TensorDescriptor.from_tensor(k_box, [d // 8, bn, 8], box)
        probe[(1,)](q_desc, k_desc, out, BN=bn, D=d, VIEW=view, num_warps=4)
        ref = q.double() @ k.double().T
        err = (out.double() - ref).abs().max().item()
        rel = ((out.double() - ref).norm() / ref.norm()).item()
        return f"{name} on the GPU: max|S - ref| {err:.3g}, relative norm {rel:.3g}"
    src = GluonASTSource(probe, sig, {"BN": bn, "D": d, "VIEW": view}, {})
    try:
        kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    except Exception as exc:  # the lowering refuses the layout
        return f"{name}: does not lower ({type(exc).__name__})"
    ptx = kernel.asm["ptx"]
    staged = len(re.findall(r"\b(?:ld|st)\.shared", ptx))
    consts = [int(c) for c in re.findall(r"or\.b64\s+%rd\d+, %rd\d+, (\d+);", ptx)]
    fields = [(((c >> 16) & 0x3FFF) << 4, ((c >> 32) & 0x3FFF) << 4, c >> 62) for c in consts]
    desc = ", ".join(f"LBO {lbo} B SBO {sbo} B swizzle {sw}" for lbo, sbo, sw in fields)
    tma3d = "cp.async.bulk.tensor.3d" in ptx
    return f"{name}: lowers; 3-D TMA copy {tma3d}; shared loads/stores {staged}; wgmma descriptors: {desc}"


def main() -> int:
    try:
        import triton.experimental.gluon  # noqa: F401
    except ImportError:
        print("this Triton has no Gluon")
        return 1
    for name in ("granules", "nvmma0", "runs16"):
        print(_variant(name), flush=True)
    if "--gpu" in sys.argv:
        print(_variant("granules", gpu=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
