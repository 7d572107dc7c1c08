"""Probe (NOTES.md 2026-12-01, a03ab6a): ``S = Q K^T`` by one wgmma chain from a no-swizzle K slot, read
through two views, to find why a chunk-major K ring (one TMA box per 16-key run) faults on the H200.

* ``parts``: the shipped part-major slot (``[D/64][BN/8][8 feature groups][8 keys][8 features]``) read 64
  features at a time (``prefix_prefill.gluon_launch._k_view``: leading byte offset 128, stride byte
  offset 1024).
* ``full``: a chunk-major slot (``[BN/8][D/8][8][8]``) read as one ``[BN, D]`` view (stride byte offset
  ``D * 16``); ``runs`` / ``runsneg``: the same slot filled by 16-key run boxes ``[2, D/8, 64]`` of a
  page-16 split K cache (``runsneg``: the last run's box from row -8, as past the context's end).
* ``addr MODE D BN SLOT``: Q one-hot rows against a slot holding each element's own offset: prints which
  offset the wgmma read for each (key, feature).

Finding (H200, Triton 3.6): ``full``/``runs`` read wrong data (D = 128, BN = 64) or fault ("Out-of-range
shared or local address", D = 256 or BN = 128) while ``parts`` and D = 64 are right. ``addr`` shows the
k-steps at view offsets 512 and 768 bytes (mod 1024) read nothing, the others right: Triton sets the
descriptor's matrix-base-offset field to ``(offset / 128) % 8`` even without swizzle (its mask is
``swizzle / 16 - 1``), which PTX says no-swizzle ignores; on the H200 values 4 and 6 break the read
once the stride byte offset is not 1024. A ``[BN, 16]`` slice of either view per k-step (offset 0) does
not compile in Triton 3.6 (``Failed to find a valid layout`` / ``size == llSize``).

Usage: ``python bench/probe_wgmma_kview.py MODE D BN SLOT [compile]`` (``compile``: sm90 offline, no GPU).
"""

import os
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)


def part_view(bn):
    bits = [[0, 1], [0, 2], [0, 4], [1, 0], [2, 0], [4, 0], [0, 8], [0, 16], [0, 32]]
    bits += [[8 << i, 0] for i in range((bn // 8).bit_length() - 1)]
    return gl.SharedLinearLayout(offset_bases=bits)


def full_view(bn, d):
    bits = [[0, 1], [0, 2], [0, 4], [1, 0], [2, 0], [4, 0]]
    bits += [[0, 8 << i] for i in range((d // 8).bit_length() - 1)]
    bits += [[8 << i, 0] for i in range((bn // 8).bit_length() - 1)]
    return gl.SharedLinearLayout(offset_bases=bits)


@gluon.jit
def _probe(
    Q_desc,
    K_desc,
    BT,
    S,
    BN: gl.constexpr,
    D: gl.constexpr,
    SLOT: gl.constexpr,
    MODE: gl.constexpr,
    VIEW: gl.constexpr,
    RING_LAYOUT: gl.constexpr,
):
    """``S = Q K^T`` ``[64, BN]`` from ring slot ``SLOT`` of a two-slot no-swizzle ring ``[2, BN * D / 64,
    64]``. MODE 0 / 1: the slot filled from ``K_desc`` ``[rows, 64]`` (the slot's image, built on the host),
    read through the part views (0) or the one ``[BN, D]`` view (1); MODE 3 / 4: filled by 16-key run
    boxes ``[2, D/8, 64]`` of ``K_desc`` (a page-16 split K cache, pages ``BT``), read through the one view
    (4: the last run's box from row -8, as past the context's end)."""
    R: gl.constexpr = BN * D // 64
    NP: gl.constexpr = D // 64
    S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16]
    )
    q_smem = gl.allocate_shared_memory(Q_desc.dtype, [2, 64, D], Q_desc.layout)
    k_smem = gl.allocate_shared_memory(K_desc.dtype, [2, R, 64], RING_LAYOUT)
    bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    mbarrier.init(bar.index(0), count=1)
    fence_async_shared()
    mbarrier.expect(bar.index(0), 64 * D * 2 + R * 64 * 2)
    tma.async_copy_global_to_shared(Q_desc, [0, 0], bar.index(0), q_smem.index(1))
    if MODE >= 3:  # one box per 16-key run into the chunk-major slot [BN/8, D/8, 64]
        G: gl.constexpr = D // 8
        slots = k_smem._reinterpret(k_smem.dtype, [2, BN // 8, G, 64], K_desc.layout)
        for r in gl.static_range(BN // 16):
            row = gl.load(BT + r) * G
            if MODE == 4:
                if r == BN // 16 - 1:
                    row = -8
            dst = slots.index(SLOT).slice(r * 2, 2)  # [2, D/8, 64]
            tma.async_copy_global_to_shared(K_desc, [0, row, 0], bar.index(0), dst)
    else:  # the slot's image, RB rows a box
        RB: gl.constexpr = K_desc.block_shape[0]
        rows = k_smem.index(SLOT)
        for i in gl.static_range(R // RB):
            tma.async_copy_global_to_shared(K_desc, [i * RB, 0], bar.index(0), rows.slice(i * RB, RB, dim=0))
    mbarrier.wait(bar.index(0), 0)
    q_buf = q_smem.index(1)
    b_s = gl.zeros([64, BN], gl.float32, layout=S_LAYOUT)
    if MODE == 0:  # part-major slot, rank-2 part view
        parts = k_smem._reinterpret(k_smem.dtype, [2 * NP, BN, 64], VIEW)
        for p in gl.static_range(NP):
            b_k = parts.index(SLOT * NP + p)  # [BN, 64]
            b_s = warpgroup_mma(
                q_buf.slice(p * 64, 64, dim=1), b_k.permute((1, 0)), b_s, use_acc=p > 0, is_async=True
            )
    else:  # one [BN, D] view of the slot
        full = k_smem._reinterpret(k_smem.dtype, [2, BN, D], VIEW)
        b_s = warpgroup_mma(q_buf, full.index(SLOT).permute((1, 0)), b_s, use_acc=False, is_async=True)
    b_s = warpgroup_mma_wait(0, deps=[b_s])
    offs_m = gl.arange(0, 64, layout=gl.SliceLayout(1, S_LAYOUT))
    offs_n = gl.arange(0, BN, layout=gl.SliceLayout(0, S_LAYOUT))
    gl.store(S + offs_m[:, None] * BN + offs_n[None, :], b_s)


def slot_offsets(bn, d, part_major):
    """Element offset in a slot of K[n, f]: part-major (the shipped ring) or chunk-major."""
    n = torch.arange(bn)[:, None]
    f = torch.arange(d)[None, :]
    if part_major:
        return (f // 64) * bn * 64 + (n // 8) * 512 + ((f % 64) // 8) * 64 + (n % 8) * 8 + f % 8
    return (n // 8) * (d * 8) + (f // 8) * 64 + (n % 8) * 8 + f % 8


def image(k, part_major):
    """The slot's bytes for K [BN, D] as [BN * D / 64, 64]."""
    bn, d = k.shape
    out = torch.empty(bn * d, dtype=k.dtype)
    out[slot_offsets(bn, d, part_major).reshape(-1)] = k.reshape(-1)
    return out.view(bn * d // 64, 64)


def layouts(d):
    """(Q's layout, the ring's / image boxes' no-swizzle layout, the run boxes' rank-3 one)."""
    q_lay = gl.NVMMASharedLayout.get_default_for([64, d], gl.bfloat16)
    k_lay = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
    r3 = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=3)
    return q_lay, k_lay, r3


def launch(q, kdesc, bt, s, bn, d, slot, mode):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    q_lay, k_lay, _ = layouts(d)
    view = part_view(bn) if mode == 0 else full_view(bn, d)
    q_desc = TensorDescriptor(q, [64, d], [d, 1], [64, d], q_lay)
    _probe[(1,)](
        q_desc, kdesc, bt, s, BN=bn, D=d, SLOT=slot, MODE=mode, VIEW=view, RING_LAYOUT=k_lay, num_warps=4
    )


def image_descriptor(img, bn, d):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    r = bn * d // 64
    return TensorDescriptor(img, [r, 64], [64, 1], [min(r, 256), 64], layouts(d)[1])


def addr_map(mode, d, bn, slot):
    """Which slot element the wgmma reads for each (key n, feature f): Q one-hot rows, the slot filled with
    element codes (two launches: offset % 64 and offset // 64, exact in bf16)."""
    o = torch.arange(bn * d, dtype=torch.float32)
    bt = torch.zeros(1, dtype=torch.int32, device="cuda")  # (no run boxes)
    read = torch.zeros(bn, d, dtype=torch.long)
    for f0 in range(0, d, 64):
        q = torch.zeros(64, d, dtype=torch.bfloat16)
        q[torch.arange(64), f0 + torch.arange(64)] = 1
        q = q.cuda()
        got = []
        for code in (o % 64, o // 64):
            img = code.to(torch.bfloat16).view(bn * d // 64, 64).cuda()
            s = torch.full((64, bn), float("nan"), device="cuda")
            launch(q, image_descriptor(img, bn, d), bt, s, bn, d, slot, mode)
            torch.cuda.synchronize()
            got.append(s.cpu())
        read[:, f0 : f0 + 64] = (got[0] + 64 * got[1]).round().long().T
    want = slot_offsets(bn, d, mode == 0)
    bad = read != want
    print(f"ADDR mode={mode} d={d} bn={bn} slot={slot} wrong={int(bad.sum())}/{bad.numel()}")
    cols = [f for f in (0, 1, 7, 8, 15, 16, 17, 24, 56, 63, 64, 72, 127) if f < d]
    for nn in (0, 1, 7, 8, 9, 15, 16, 24, 56, 63):
        row = " ".join(str(int(read[nn, f])) for f in cols)
        exp = " ".join(str(int(want[nn, f])) for f in cols)
        print(f"  n={nn}: read {row} | want {exp}")


def compile_only(name, mode, d, bn, slot):
    """sm90 offline (no GPU): writes /tmp/probe_NAME_D_BN.ptx."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    q_lay, k_lay, r3 = layouts(d)
    k_sig = (
        f"tensordesc<bf16[2, {d // 8}, 64],{r3!r}>"
        if mode >= 3
        else (f"tensordesc<bf16[{min(bn * d // 64, 256)}, 64],{k_lay!r}>")
    )
    sig = {"Q_desc": f"tensordesc<bf16[64, {d}],{q_lay!r}>", "K_desc": k_sig, "BT": "*i32", "S": "*fp32"}
    view = part_view(bn) if mode == 0 else full_view(bn, d)
    consts = dict(BN=bn, D=d, SLOT=slot, MODE=mode, VIEW=view, RING_LAYOUT=k_lay)
    sig.update({c: "constexpr" for c in consts})
    k = triton.compile(GluonASTSource(_probe, sig, consts, {}), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": 4})  # fmt: skip
    ptx = k.asm["ptx"]
    open(f"/tmp/probe_{name}_{d}_{bn}.ptx", "w").write(ptx)
    print("compiled", [name, d, bn, slot], "shared", k.metadata.shared, "wgmma", ptx.count("wgmma.mma_async"))


def main():
    if sys.argv[1] == "addr":
        return addr_map(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    name = sys.argv[1]
    mode = {"parts": 0, "full": 1, "runs": 3, "runsneg": 4}[name]
    d, bn, slot = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    if len(sys.argv) > 5 and sys.argv[5] == "compile":
        return compile_only(name, mode, d, bn, slot)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    torch.manual_seed(0)
    q = torch.randn(64, d, device="cuda", dtype=torch.bfloat16)
    s = torch.full((64, bn), float("nan"), device="cuda")
    if mode >= 3:  # vLLM's split K cache [blocks, 1, D/8, 16, 8], the block's 16-key runs in shuffled pages
        nblk = 3 * bn // 16
        cache = torch.randn(nblk, 1, d // 8, 16, 8, dtype=torch.bfloat16)
        bt = torch.randperm(nblk)[: bn // 16].to(torch.int32)
        kk = torch.cat([cache[b, 0].permute(1, 0, 2).reshape(16, d) for b in bt.tolist()])  # [BN, D]
        box = [2, d // 8, 64]
        kdesc = TensorDescriptor(cache.cuda(), [2, nblk * d // 8, 64], [64, 128, 1], box, layouts(d)[2])
        launch(q, kdesc, bt.cuda(), s, bn, d, slot, mode)
        if mode == 4:  # the last run is stale / zeros: compare the others
            s, kk = s[:, : bn - 16], kk[: bn - 16]
    else:
        kk = torch.randn(bn, d, dtype=torch.bfloat16)
        img = image(kk, mode == 0).cuda()
        launch(q, image_descriptor(img, bn, d), torch.zeros(1, dtype=torch.int32, device="cuda"), s, bn, d,
               slot, mode)  # fmt: skip
    torch.cuda.synchronize()
    ref = q.float() @ kk.cuda().float().T
    err = (s - ref).abs().max().item()
    print(
        f"RESULT mode={name} d={d} bn={bn} slot={slot} max_err={err:.3g} "
        f"ok={err < 1e-2 * ref.abs().max().item()}"
    )


if __name__ == "__main__":
    os.environ.setdefault("TRITON_INTERPRET", "0")
    if os.environ.get("PROBE_FIX") == "1":  # the PTX through prefill_runtime's base-offset fix
        from prefill_runtime import host

        assert host._asm_wrapper()
        host._DESC_FIX.value = True
    main()
