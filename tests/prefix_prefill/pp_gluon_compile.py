"""Offline sm90 compiles of prefix-prefill's Gluon kernels (the compile_check tests): the head of the
scripts that ``conftest.compile_gluon_for_sm90`` runs after its preamble."""

# compile_nhd(head, box, from_cache, lse, one, llvm_o0, out, **opts) / compile_nhd_fp8(head, box, from_cache,
# lse, one, q, cache, out, llvm_o0, **opts) (an fp8 cache, CACHE_FP8) / compile_split(head, from_cache, lse,
# v_tma, k_tma, k_wide, one, llvm_o0, out, **opts) / compile_split_fp8(head, from_cache, lse, one, q, cache,
# out, llvm_o0, **opts) (an fp8 split cache): one form of each kernel (bf16, 128-row tiles, the
# plan's key blocks, ring slots and V staging; ``one``: one 8-warp consumer partition, Q in one box, 8
# warps; ``out``: O's Triton type, bf16 or an fp8 one with OUT_MAX in ``opts``), its score and window
# options in ``opts`` (HAS_LEFT, SOFTCAP, HAS_ALIBI, HAS_SINKS, SKIP_DECODE, CAUSAL, HAS_RIGHT, OUT_MAX,
# GATHER (compile_nhd: the gathering form; pass box = the key block);
# each option's argument typed as the launcher passes it, None where off); returns ``(source, compiled
# kernel)``.
PP_COMPILE_HEAD = """
import prefix_prefill.gluon_launch as itf
import prefix_prefill.plan as itf_plan


def option_sig(opts):
    on = {"Sinks": opts.get("HAS_SINKS"), "Slopes": opts.get("HAS_ALIBI"), "tanh_scale": opts.get("SOFTCAP"),
          "window_left": opts.get("HAS_LEFT"), "window_right": opts.get("HAS_RIGHT"),
          "OutScale": opts.get("OUT_MAX")}
    types = {"Sinks": "*fp32", "Slopes": "*fp32", "tanh_scale": "fp32", "window_left": "i32",
             "window_right": "i32", "OutScale": "*fp32"}
    sig = {n: types[n] if on[n] else "constexpr" for n in on}
    if opts.get("PERSISTENT"):  # the persistent form's batch and tile counter (NHD/HND kernel only)
        sig["n_seqs"] = "i32"
        sig["TileCounter"] = "*i32"
    if opts.get("GATHER"):  # the gathering form's caches and strides (NHD/HND kernel only)
        sig.update(K_cache="*bf16", V_cache="*bf16", c_block="i32", c_slot="i32", c_head="i32")
    return sig


def finish(sig, consts, lse):
    # the bounds' arguments; a status= tensor with the LSE (both forms of Status compiled)
    sig.update(n_bt_cols="i32", num_blocks="i32", max_query_len="i32", Status="*i32" if lse else "constexpr")
    if not lse:
        sig.update(Lse="constexpr", stride_lse_h="constexpr")
    else:
        sig.update(Lse="*fp32", stride_lse_h="i32")
    consts.update({n: None for n, t in sig.items() if t == "constexpr"})


def compile_nhd(head, box, from_cache, lse, one=False, llvm_o0=False, out="bf16", q_rows=0, **opts):
    # q_rows: Q's box rows when not the form's half (or whole) tile: a packed form's, in the half's layout
    bn = itf_plan.GLUON_BLOCK_N[head]
    rows = 128 if one else 64
    lq = gl.NVMMASharedLayout.get_default_for([rows, head], gl.bfloat16)
    lk = gl.NVMMASharedLayout.get_default_for([bn, head], gl.bfloat16)
    lb = gl.NVMMASharedLayout.get_default_for([box, head], gl.bfloat16)
    sig = {
        "Q_desc": f"tensordesc<bf16[{q_rows or rows}, {head}],{lq!r}>",
        "K_desc": f"tensordesc<bf16[{bn}, {head}],{lk!r}>",
        "V_desc": f"tensordesc<bf16[{bn}, {head}],{lk!r}>",
        "KC_desc": f"tensordesc<bf16[{box}, {head}],{lb!r}>",
        "VC_desc": f"tensordesc<bf16[{box}, {head}],{lb!r}>",
        "KCB_desc": f"tensordesc<bf16[{bn}, {head}],{lk!r}>",
        "VCB_desc": f"tensordesc<bf16[{bn}, {head}],{lk!r}>", "O": f"*{out}", "BlockTable": "*i32",
        "CuSeqlensQ": "*i32", "SeqLens": "*i32", "qk_scale": "fp32", "group_size": "i32", "stride_ot": "i32",
        "stride_oh": "i32", "stride_bt": "i32", "page_size": "i32", "oob_row": "i32", "block_rows": "i32",
        "head_rows": "i32", "head_cols": "i32", **option_sig(opts),
    }
    consts = dict(HEAD_DIM=head, BLOCK_M=128, BLOCK_N=bn, BOX=box, KV_FROM_CACHE=from_cache, RETURN_LSE=lse,
                  NUM_STAGES=itf_plan.GLUON_STAGES, ONE_CONSUMER=one, **opts)
    finish(sig, consts, lse)
    aligned = ("K_cache", "V_cache") if opts.get("GATHER") else ()  # (the gathers' 16-byte copies)
    return compile_sm90(itf._gluon_fwd_kernel, sig, consts, aligned=aligned, num_warps=8 if one else 4,
                        llvm_o0=llvm_o0)


def compile_nhd_fp8(head, box, from_cache, lse, one=False, q="fp16", cache="fp8e4nv", out=None, llvm_o0=False,
                    q_rows=0, **opts):  # fmt: skip
    # an fp8 cache (CACHE_FP8): the caches' descriptors fp8 with no swizzle, the rings float16 (RING), q
    # float16 (a bfloat16 call's too, launched as a float16 one with ``out="bf16"``), k_scale / v_scale
    # tensors; ``cache``: "fp8e4nv" or "fp8e5"
    bn = itf_plan.GLUON_BLOCK_N[head]
    rows = 128 if one else 64
    qt = gl.bfloat16 if q == "bf16" else gl.float16
    lq = gl.NVMMASharedLayout.get_default_for([rows, head], qt)
    lk = gl.NVMMASharedLayout.get_default_for([bn, head], qt)
    l8 = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2)
    new_rows = f"tensordesc<{q}[{bn}, {head}],{lk!r}>"
    if from_cache:  # (the caches' descriptors stand in)
        new_rows = f"tensordesc<{cache}[{bn}, {head}],{l8!r}>"
    sig = {
        "Q_desc": f"tensordesc<{q}[{q_rows or rows}, {head}],{lq!r}>", "K_desc": new_rows, "V_desc": new_rows,
        "KC_desc": f"tensordesc<{cache}[{box}, {head}],{l8!r}>",
        "VC_desc": f"tensordesc<{cache}[{box}, {head}],{l8!r}>",
        "KCB_desc": f"tensordesc<{cache}[{bn}, {head}],{l8!r}>",
        "VCB_desc": f"tensordesc<{cache}[{bn}, {head}],{l8!r}>", "O": f"*{out or q}", "BlockTable": "*i32",
        "CuSeqlensQ": "*i32", "SeqLens": "*i32", "qk_scale": "fp32", "group_size": "i32", "stride_ot": "i32",
        "stride_oh": "i32", "stride_bt": "i32", "page_size": "i32", "oob_row": "i32", "block_rows": "i32",
        "head_rows": "i32", "head_cols": "i32", "KScale": "*fp32", "VScale": "*fp32", **option_sig(opts),
    }
    consts = dict(HEAD_DIM=head, BLOCK_M=128, BLOCK_N=bn, BOX=box, KV_FROM_CACHE=from_cache, RETURN_LSE=lse,
                  NUM_STAGES=itf_plan.GLUON_STAGES, ONE_CONSUMER=one, CACHE_FP8=True, RING=lk, **opts)
    finish(sig, consts, lse)
    return compile_sm90(itf._gluon_fwd_kernel, sig, consts, num_warps=8 if one else 4, llvm_o0=llvm_o0)


def compile_split(head, from_cache, lse, v_tma, k_tma, k_wide, one=False, llvm_o0=False, out="bf16", q_rows=0,
                  **opts):  # fmt: skip
    # q_rows: as compile_nhd's
    lc = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
    lw = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=3)
    l4 = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=4)
    bn = itf_plan.GLUON_BLOCK_N[head]
    cm = k_tma and head in itf_plan.SPLIT_K_CM_HEADS
    rows = 128 if one else 64
    lq = gl.NVMMASharedLayout.get_default_for([rows, head], gl.bfloat16)
    lk = gl.NVMMASharedLayout.get_default_for([bn, head], gl.bfloat16)
    lv = gl.NVMMASharedLayout.get_default_for([head, 16 if v_tma else bn], gl.bfloat16)
    g = head // 8 if cm else 8
    # the new tokens' V staged by half blocks and transposed, as the plan sets it (its one-partition rule)
    plan_one = not from_cache and head in itf_plan.SPLIT_ONE_CONSUMER_HEADS and k_wide == 1
    v_stage = not (from_cache or v_tma or plan_one) and head <= 128
    vn = bn // 2 if v_stage else bn
    lvn = gl.NVMMASharedLayout.get_default_for([vn, head], gl.bfloat16)
    sig = {
        "Q_desc": f"tensordesc<bf16[{q_rows or rows}, {head}],{lq!r}>",
        "K_desc": f"tensordesc<bf16[8, 8, 8],{lw!r}>" if k_tma else f"tensordesc<bf16[{bn}, {head}],{lk!r}>",
        "V_desc": f"tensordesc<bf16[{vn}, {head}],{lvn!r}>",
        "K_cache": f"tensordesc<bf16[8, 64],{lc!r}>" if k_tma else "*bf16",
        "V_cache": f"tensordesc<bf16[{head}, 16],{lv!r}>" if v_tma else "*bf16",
        "O": f"*{out}", "BlockTable": "*i32", "CuSeqlensQ": "*i32", "SeqLens": "*i32", "qk_scale": "fp32",
        "group_size": "i32", "stride_ot": "i32", "stride_oh": "i32", "stride_bt": "i32", "page_size": "i32",
        "kc_block": "i32", "kc_head": "i32", "kc_group": "i32", "vc_block": "i64", "vc_head": "i32",
        "vc_dim": "i32", **option_sig(opts),
    }
    if k_tma:
        sig["KR_desc"] = f"tensordesc<bf16[2, {g}, 64],{lw!r}>"
        sig["KN_desc"] = f"tensordesc<bf16[{bn // 8}, {g}, 8, 8],{l4!r}>"
        if k_wide == 1:
            sig["KW_desc"] = f"tensordesc<bf16[{bn // 8}, {g}, 64],{lw!r}>"
    consts = dict(HEAD_DIM=head, BLOCK_M=128, BLOCK_N=bn, KV_FROM_CACHE=from_cache, RETURN_LSE=lse,
                  NUM_STAGES=itf_plan.GLUON_STAGES, V_TMA=v_tma, ONE_CONSUMER=one, K_TMA=k_tma, K_WIDE=k_wide,
                  K_CM=cm, K_VIEW=itf._k_view(bn, head, cm) if k_tma else None, V_RING=lv, V_STAGE=v_stage,
                  **opts)
    finish(sig, consts, lse)
    aligned = tuple(n for n, on in (("K_cache", not k_tma), ("V_cache", not v_tma)) if on)
    return compile_sm90(itf._gluon_split_kernel, sig, consts, aligned=aligned, num_warps=8 if one else 4,
                        llvm_o0=llvm_o0)


def compile_split_fp8(head, from_cache, lse, one=False, q="fp16", cache="fp8e4nv", out=None, llvm_o0=False,
                      q_rows=0, **opts):  # fmt: skip
    # an fp8 split cache (CACHE_FP8): K and V gathered by pointer into fp8 staging, the rings float16 (q
    # float16; a bfloat16 call's output ``out="bf16"``), k_scale / v_scale tensors, no V staging
    bn = itf_plan.GLUON_BLOCK_N[head]
    rows = 128 if one else 64
    qt = gl.bfloat16 if q == "bf16" else gl.float16
    lq = gl.NVMMASharedLayout.get_default_for([rows, head], qt)
    lk = gl.NVMMASharedLayout.get_default_for([bn, head], qt)
    lv = gl.NVMMASharedLayout.get_default_for([head, bn], qt)
    sig = {
        "Q_desc": f"tensordesc<{q}[{q_rows or rows}, {head}],{lq!r}>",
        "K_desc": f"tensordesc<{q}[{bn}, {head}],{lk!r}>", "V_desc": f"tensordesc<{q}[{bn}, {head}],{lk!r}>",
        "K_cache": f"*{cache}", "V_cache": f"*{cache}", "O": f"*{out or q}", "BlockTable": "*i32",
        "CuSeqlensQ": "*i32", "SeqLens": "*i32", "qk_scale": "fp32", "group_size": "i32", "stride_ot": "i32",
        "stride_oh": "i32", "stride_bt": "i32", "page_size": "i32", "kc_block": "i32", "kc_head": "i32",
        "kc_group": "i32", "vc_block": "i64", "vc_head": "i32", "vc_dim": "i32", "KScale": "*fp32",
        "VScale": "*fp32", **option_sig(opts),
    }
    consts = dict(HEAD_DIM=head, BLOCK_M=128, BLOCK_N=bn, KV_FROM_CACHE=from_cache, RETURN_LSE=lse,
                  NUM_STAGES=itf_plan.GLUON_STAGES, V_TMA=False, ONE_CONSUMER=one, K_TMA=False, K_WIDE=0,
                  K_CM=False, K_VIEW=None, V_RING=lv, V_STAGE=False, CACHE_FP8=True, **opts)
    finish(sig, consts, lse)
    return compile_sm90(itf._gluon_split_kernel, sig, consts, aligned=("K_cache", "V_cache"),
                        num_warps=8 if one else 4, llvm_o0=llvm_o0)
"""
