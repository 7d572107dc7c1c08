"""fp8 caches (``float8_e4m3fn`` / ``float8_e5m2`` with per-tensor ``k_scale`` / ``v_scale``) on the Gluon
kernels' ``CACHE_FP8`` forms (:mod:`prefix_prefill.gluon_kernel`: the context's fp8 blocks land by TMA in
staging slots, or by the split kernel's gathers (:mod:`prefix_prefill.gluon_split_kernel`), a partition of 4
warps (2 at head 256) converts them into float16 rings, the consumers fold the scales into each context
block's terms; a bfloat16 call runs as a float16 one, its q/k/v copied first).

CPU: the plan rule (NHD, HND and interleaved caches and vLLM's split caches at heads 64, 128 and 256 take a
Gluon kernel with ``CACHE_FP8``; AMD's fnuz types keep the Triton kernel and the reason says why); the
launcher's
arguments (fp8 cache descriptors in the no-swizzle staging layout at the rows the producer reads, the rings'
layout, the scale tensors; a launch without them is refused); a bfloat16 call's float16 copies (exact in their
stated range); warm frames taking each call's scale tensors; the rings' protocol played in random
interleavings (``fp8_rings_model``) with its negative control (no wait for the converter's last context
block); offline sm90 compiles of both kernels' forms (marker ``compile_check``: registers, spills, shared
memory). sm90 GPU (NHD, and the split layout's forms, options, short queries, quick form and fp8 output):
against the float64 reference of the dequantised cache into NaN-poisoned outputs, with spare cache blocks NaN:
e4m3 and e5m2, bfloat16 and float16 queries, scales 0.02 / 1.9 / 300 (a float16 ring's V shift both ways),
pages 16 / 544 / 1056, ragged batches with empty contexts and one-token queries, k given or from the cache,
the options (sinks, soft cap, ALiBi, windows, non-causal, the LSE), the short-query forms, warm calls with new
scale values, each asserting that the Gluon kernel ran.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random

import pytest
import torch
from conftest import DEVICE, compile_gluon_for_sm90, needs_sm90, poison
from fp8_rings_model import Protocol, play
from launch_stubs import stub_prefix_gluon
from pp_cases import INTERLEAVED, make_layout_case, problem_of, random_seqs, reference
from pp_gluon_compile import PP_COMPILE_HEAD
from test_pp_gluon_features import _kw

from attn_reference import compare, tolerance
from paged_kv_offsets import describe_kv_cache
from prefix_prefill import explain, gluon_launch, plan, prefix_prefill

HAS_GLUON = gluon_launch._gluon_fwd_kernel is not None and gluon_launch._gluon_split_kernel is not None
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _case(layout="nhd", head=128, page=16, seqs=((40, 5),), cache=E4M3, dtype=torch.bfloat16, device="cpu",
          heads=(4, 2), **kw):  # fmt: skip
    """A case with an fp8 cache (``pp_cases.make_layout_case``)."""
    kw.setdefault("k_scale", 0.5)
    kw.setdefault("v_scale", 1.5)
    return make_layout_case(list(seqs), num_heads=heads[0], num_kv_heads=heads[1], head_size=head, page=page,
                            dtype=dtype, device=device, layout=layout, cache_dtype=cache, **kw)  # fmt: skip


# ------------------------------------------------------------------------- CPU: plans
@pytest.mark.parametrize("cache", [E4M3, E5M2])
@pytest.mark.parametrize("head", [64, 128, 256])
@pytest.mark.parametrize("layout", ["nhd", "hnd", *INTERLEAVED, "split"])
@pytest.mark.parametrize("from_cache", [False, True])
def test_fp8_caches_planned_on_gluon(layout, head, cache, from_cache):
    """fp8 e4m3fn / e5m2 caches run a Gluon kernel with ``CACHE_FP8``, whatever the query dtype, k given or
    not: the NHD/HND kernel over caches TMA reads as views of rows (NHD, HND, interleaved pages) at heads
    64, 128 and 256, the split kernel over vLLM's split layout (``x = 16``) at the same heads, whose form
    gathers K and V (no TMA producer, no V staging, two consumer partitions); the reason names the fp8
    cache; a 16-bit cache's plan has ``CACHE_FP8`` off."""
    for dtype in (torch.bfloat16, torch.float16):
        case = _case(layout, head, cache=cache, dtype=dtype, kv_from_cache=from_cache)
        chosen = plan.plan(problem_of(case, arch="sm90", gluon=True))
        assert chosen.kernel == f"gluon-{case.layout}", chosen.reason
        assert chosen.consts()["CACHE_FP8"] is True and "fp8 cache" in chosen.reason
        if layout == "split":
            c = chosen.consts()
            assert not (c["K_TMA"] or c["V_TMA"] or c["V_STAGE"] or c["ONE_CONSUMER"]), c
    plain = _case(layout, head, cache=None)
    assert plan.plan(problem_of(plain, arch="sm90", gluon=True)).consts()["CACHE_FP8"] is False


@pytest.mark.parametrize(
    "what,why",
    [("fnuz", "cache dtype torch.float8_e4m3fnuz"), ("e5m2_fnuz", "cache dtype torch.float8_e5m2fnuz")],
)  # fmt: skip
def test_fp8_caches_keep_triton(what, why):
    """AMD's fnuz types keep the Triton kernel, its plan's ``CACHE_FP8`` on and the reason saying why; the
    same call with an e4m3fn cache takes a Gluon kernel."""
    cache = {"fnuz": torch.float8_e4m3fnuz, "e5m2_fnuz": torch.float8_e5m2fnuz}[what]
    chosen = plan.plan(problem_of(_case("nhd", 128, cache=cache), arch="sm90", gluon=True))
    assert chosen.kernel == "triton" and why in chosen.reason, chosen.reason
    assert chosen.consts()["CACHE_FP8"] is True
    control = plan.plan(problem_of(_case("nhd", 128, cache=E4M3), arch="sm90", gluon=True))
    assert control.kernel == "gluon-nhd"


@pytest.mark.parametrize("layout", ["nhd", "split"])
def test_fp8_window_floor(layout):
    """Over an fp8 cache a window must let a row see :data:`~prefix_prefill.plan.GLUON_MIN_WINDOW_FP8` keys
    for the Gluon kernels (``left + 1``; not causal ``left + right + 1``); one key fewer keeps the Triton
    kernel, the reason naming that floor, where the same window over a 16-bit cache takes a Gluon kernel."""
    fp8_floor = plan.GLUON_MIN_WINDOW_FP8
    assert fp8_floor > plan.GLUON_MIN_WINDOW
    case = _case(layout, 128, seqs=((900, 300),), cache=E4M3)
    plain = _case(layout, 128, seqs=((900, 300),), cache=None)
    wide = plan.plan(problem_of(case, arch="sm90", gluon=True, left=fp8_floor - 1))
    assert wide.kernel == f"gluon-{layout}" and wide.consts()["CACHE_FP8"] is True, wide.reason
    for kw in (dict(left=fp8_floor - 2), dict(causal=False, left=fp8_floor // 2, right=fp8_floor // 2 - 2)):
        narrow = plan.plan(problem_of(case, arch="sm90", gluon=True, **kw))
        assert narrow.kernel == "triton" and f"narrower than {fp8_floor} keys" in narrow.reason, narrow.reason
        assert plan.plan(problem_of(plain, arch="sm90", gluon=True, **kw)).kernel == f"gluon-{layout}"
    not_causal = plan.plan(problem_of(case, arch="sm90", gluon=True, causal=False, left=fp8_floor // 2,
                                      right=fp8_floor // 2 - 1))  # fmt: skip
    assert not_causal.kernel == f"gluon-{layout}", not_causal.reason


def test_fp8_split_cache_with_8_feature_slots_keeps_triton():
    """An fp8 split cache whose K slots hold 8 features (``x = 8``, not vLLM's 16 for one-byte types) is
    not what the split kernel's 16-byte gathers read: the Triton kernel runs it."""
    case = _case("split", 128, cache=E4M3)
    nb, hk, dx, page, _ = case.k_cache.shape
    k8 = case.k_cache.permute(0, 1, 2, 4, 3).reshape(nb, hk, dx * 2, 8, page).permute(0, 1, 2, 4, 3)
    k8_case = dataclasses.replace(case, k_cache=k8.contiguous())
    chosen = plan.plan(problem_of(k8_case, arch="sm90", gluon=True))
    assert chosen.kernel == "triton", chosen.reason


def test_pinned_softcap_form_is_16_bit_only():
    """The pinned-max soft-capping form (``SOFTCAP`` 3) runs on 16-bit caches; an fp8 cache's Gluon plan
    takes the hardware tanh with a tracked max (2: its V scaling shifts the logits' exponent range), and
    the Triton kernel takes 2 wherever it runs."""
    fp8 = plan.plan(problem_of(_case(cache=E4M3), arch="sm90", gluon=True, softcap_form=3))
    assert fp8.kernel == "gluon-nhd" and fp8.consts()["SOFTCAP"] == 2
    bf16 = plan.plan(problem_of(_case(cache=None), arch="sm90", gluon=True, softcap_form=3))
    assert bf16.kernel == "gluon-nhd" and bf16.consts()["SOFTCAP"] == 3
    triton = plan.plan(problem_of(_case(cache=None), arch="sm90", gluon=False, softcap_form=3))
    assert triton.kernel == "triton" and triton.consts()["SOFTCAP"] == 2


def test_fp8_cache_of_uint8_bits():
    """A uint8 cache (vLLM's ``kv_cache_dtype="fp8"`` bits, seen as e4m3fn) plans as e4m3fn."""
    case = _case(cache=torch.uint8)
    assert plan.plan(problem_of(case, arch="sm90", gluon=True)).consts()["CACHE_FP8"] is True


# ------------------------------------------------------------------------- CPU: host glue
class _Recorder:
    """The NHD/HND kernel's stand-in: ``kernel[grid](*args, **kwargs)`` records the call."""

    def __init__(self, names):
        self.arg_names, self.calls = names, []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((grid, args, kwargs))


def _scales(case, device="cpu") -> gluon_launch.Options:
    return gluon_launch.Options(k_scale=torch.tensor([case.k_scale], device=device),
                                v_scale=torch.tensor([case.v_scale], device=device))  # fmt: skip


def _torch_copies(monkeypatch) -> None:
    """The host-side tests' CPU tensors with the Triton interpreter off (a GPU machine): the float16 copies
    of a bfloat16 call (``gluon_launch.float16_copies`` and the warm path's ``float16_copy_pointers``, a
    Triton kernel) by torch, the same values
    (``test_bf16_call_as_float16`` checks the kernel on the device the suite runs on)."""
    if os.environ.get("TRITON_INTERPRET") != "1":

        def copies(q, k, v, mul):
            half = (
                (None, None)
                if k is None
                else (k.to(torch.float16).contiguous(), v.to(torch.float16).contiguous())
            )
            return ((q.float() * mul).to(torch.float16).contiguous(), *half)

        def copy_pointers(q, k, v, mul, stream):
            q16, k16, v16 = copies(q, k, v, mul)
            qp = q16.data_ptr()
            return (q16, k16, v16), qp, *(qp if t is None else t.data_ptr() for t in (k16, v16))

        monkeypatch.setattr(gluon_launch, "float16_copies", copies)
        monkeypatch.setattr(gluon_launch, "float16_copy_pointers", copy_pointers)


def _launch(case, opts: gluon_launch.Options) -> bool:
    kc, vc = describe_kv_cache(case.k_cache, case.v_cache, case.layout)
    problem = problem_of(case, arch="sm90", gluon=True)
    chosen = plan.plan(problem)
    o = torch.empty_like(case.q)
    return gluon_launch.launch(chosen, problem, case.q, case.k, case.v, o, case.k_cache, case.v_cache, kc, vc,
                               case.block_table, case.cu_seqlens_q, case.seq_lens, case.max_query_len, 0.1,
                               None, opts=opts)  # fmt: skip


@pytest.mark.parametrize("layout", ["nhd", "hnd-interleaved"])
@pytest.mark.parametrize("from_cache,page,head,dtype", [(False, 16, 128, torch.bfloat16),
                                                        (True, 32, 64, torch.float16),
                                                        (False, 544, 64, torch.bfloat16)])  # fmt: skip
def test_fp8_launch_host_side(layout, from_cache, page, head, dtype, monkeypatch):
    """The fp8 form's arguments (kernel replaced by a recorder): the four cache descriptors are fp8 views of
    rows in the no-swizzle 8-bit layout, at the rows the producer reads every cached slot
    (``test_pp_gluon._producer_reads_every_slot`` over the bytes); ``RING`` the default layout of a
    float16 ``[BLOCK_N, D]`` block; ``KScale`` / ``VScale`` the call's tensors; q and the new tokens'
    descriptors are float16 rows (a float16 call's own k/v, a bfloat16 call's float16 copies, q shifted
    by ``_Q_SHIFT`` and the logit multiplier by its inverse; k None: the cache's stand in); the launch
    binds to the kernel."""
    if not HAS_GLUON:
        pytest.skip("this Triton has no Gluon")
    from test_pp_gluon import _producer_reads_every_slot
    from triton.experimental.gluon import language as gl

    rec = _Recorder(gluon_launch._gluon_fwd_kernel.arg_names)
    monkeypatch.setattr(gluon_launch, "_gluon_fwd_kernel", rec)
    monkeypatch.setenv("PREFIX_PREFILL_GLUON_TIERED", "0")
    _torch_copies(monkeypatch)
    case = _case(layout, head, page, seqs=[(40, 5), (0, 19), (70, 130), (3 * page + 1, 1)], dtype=dtype,
                 kv_from_cache=from_cache)  # fmt: skip
    opts = _scales(case)
    assert _launch(case, opts) is True
    ((_, args, kw),) = rec.calls
    names = rec.arg_names
    assert len(args) <= len(names) and set(kw) - {"num_warps"} <= set(names[len(args) :])
    a = dict(zip(names, args, strict=False)) | kw
    assert a["CACHE_FP8"] is True and a["KScale"] is opts.k_scale and a["VScale"] is opts.v_scale
    bn = plan.GLUON_BLOCK_N[head]
    assert a["RING"] == gl.NVMMASharedLayout.get_default_for([bn, head], gl.float16)
    shift = 1.0 if dtype == torch.float16 else gluon_launch._Q_SHIFT
    assert a["Q_desc"].base.dtype == torch.float16
    # (float16's subnormal step, 2**-24, is the bound below its normals)
    assert (a["Q_desc"].base.double() - case.q.double() * shift).abs().max() <= 2.0**-25
    assert a["qk_scale"] == pytest.approx(0.1 / shift * gluon_launch.LOG2E, rel=1e-12)
    staging = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2)
    for name in ("KC_desc", "VC_desc", "KCB_desc", "VCB_desc"):
        assert a[name].layout == staging and a[name].base.dtype == case.k_cache.dtype
    if not from_cache and dtype == torch.float16:
        assert a["K_desc"].base is case.k and a["V_desc"].base is case.v
    elif not from_cache:
        for name, t in (("K_desc", case.k), ("V_desc", case.v)):
            assert a[name].base.dtype == torch.float16
            assert (a[name].base.double() - t.double()).abs().max() <= 2.0**-25
    as_bytes = dataclasses.replace(case, k_cache=case.k_cache.view(torch.uint8),
                                   v_cache=case.v_cache.view(torch.uint8))  # fmt: skip
    assert _producer_reads_every_slot(as_bytes, args, kw)


@pytest.mark.parametrize("from_cache,head,dtype,cache", [(False, 128, torch.bfloat16, E4M3),
                                                          (True, 64, torch.float16, E5M2),
                                                          (False, 64, torch.float16, E4M3)])  # fmt: skip
def test_fp8_split_launch_host_side(from_cache, head, dtype, cache, monkeypatch):
    """The split kernel's fp8 form's arguments (kernel replaced by a recorder): the caches by pointer as
    they are (fp8, gathered), no TMA producer or V staging, two consumer partitions (4 warps launched),
    ``V_RING`` the float16 ``[D, BLOCK_N]`` layout, ``KScale`` / ``VScale`` the call's tensors, q and the
    new tokens' descriptors float16 rows (a bfloat16 call's shifted copies); the call binds to the
    kernel's parameters."""
    from test_pp_gluon import _binds_split_kernel, _record_split
    from triton.experimental.gluon import language as gl

    rec = _record_split(monkeypatch)
    _torch_copies(monkeypatch)
    case = _case("split", head, 16, seqs=[(40, 5), (0, 19), (70, 130)], cache=cache, dtype=dtype,
                 kv_from_cache=from_cache)  # fmt: skip
    opts = _scales(case)
    assert _launch(case, opts) is True
    ((_, args, kw),) = rec.calls
    assert _binds_split_kernel(args, kw)
    assert kw["CACHE_FP8"] is True and kw["KScale"] is opts.k_scale and kw["VScale"] is opts.v_scale
    assert not (kw["K_TMA"] or kw["V_TMA"] or kw["V_STAGE"] or kw["ONE_CONSUMER"]) and kw["num_warps"] == 4
    assert args[3] is case.k_cache and args[4] is case.v_cache
    bn = plan.GLUON_BLOCK_N[head]
    assert kw["V_RING"] == gl.NVMMASharedLayout.get_default_for([head, bn], gl.float16)
    shift = 1.0 if dtype == torch.float16 else gluon_launch._Q_SHIFT
    q_desc, k_desc, v_desc = args[:3]
    assert q_desc.base.dtype == torch.float16 and list(q_desc.block_shape) == [64, head]
    assert (q_desc.base.double() - case.q.double() * shift).abs().max() <= 2.0**-25
    for desc, t in ((k_desc, case.k), (v_desc, case.v)):
        assert desc.base.dtype == torch.float16 and list(desc.block_shape) == [bn, head]
        if not from_cache:
            assert (desc.base.double() - t.double()).abs().max() <= 2.0**-25


@pytest.mark.parametrize("with_k", [True, False])
def test_bf16_call_as_float16(with_k):
    """``gluon_launch._float16_operands`` (one launch of ``float16_copies``): q times ``_Q_SHIFT`` in float16
    and the scale over it (the same logits), k and v (contiguous or strided) as contiguous float16 copies
    (None stays None), each exact for values in its stated
    range (q in [2**-6, 2**23] after the shift's 2**-8: bfloat16's 8 significant bits fit float16's
    normals; k/v in [2**-14, 65504]); a q of 2**24 overflows (the documented bound)."""
    gen = torch.Generator().manual_seed(5)

    def spread(shape, lo, hi):  # random signs and significands, exponents in [lo, hi)
        sig = (1 + torch.rand(shape, generator=gen, dtype=torch.float64)) * torch.sign(
            torch.randn(shape, generator=gen)
        )
        return (sig * 2.0 ** torch.randint(lo, hi, shape, generator=gen).double()).to(DEVICE, torch.bfloat16)

    q = spread((64, 4, 32), -6, 23)
    kv = spread((64, 2, 32), -14, 15)
    wide = spread((64, 5, 32), -14, 15)  # (v: a strided view, as a fused qkv buffer's slice)
    k, v = (kv, wide[:, 1:3]) if with_k else (None, None)
    q16, k16, v16, scale = gluon_launch._float16_operands(q, k, v, 0.125)
    assert q16.dtype == torch.float16 and q16.is_contiguous()
    assert torch.equal(q16.double() / gluon_launch._Q_SHIFT, q.double())
    assert scale == 0.125 / gluon_launch._Q_SHIFT
    if with_k:
        for got, want in ((k16, k), (v16, v)):
            assert got.dtype == torch.float16 and got.is_contiguous()
            assert torch.equal(got.double(), want.double())
    else:
        assert k16 is None and v16 is None
    tiny = spread((64, 4, 32), -40, -6)  # below the exact range: float16's subnormal step in q's units
    err = (
        gluon_launch._float16_operands(tiny, None, None, 1.0)[0].double() / gluon_launch._Q_SHIFT
        - tiny.double()
    )
    assert 0 < err.abs().max() <= 2.0**-17
    big = torch.full((1, 1, 8), 2.0**24, dtype=torch.bfloat16, device=DEVICE)
    assert torch.isinf(gluon_launch._float16_operands(big, None, None, 1.0)[0]).all()


def _at(buf: torch.Tensor, ptr: int, shape: tuple) -> torch.Tensor:
    """The float16 ``shape`` elements at data pointer ``ptr`` inside ``buf``'s storage."""
    whole = torch.empty(0, dtype=torch.float16, device=buf.device).set_(buf.untyped_storage())
    start = ptr - whole.data_ptr()
    assert start % 2 == 0 and 0 <= start and start // 2 + math.prod(shape) <= whole.numel()
    return whole[start // 2 : start // 2 + math.prod(shape)].view(shape)


@pytest.mark.parametrize("with_k", [True, False])
def test_copy_pointers_address_the_copies(with_k):
    """``float16_copy_pointers`` (a warm call's copies, as pointers into the allocation it returns): over
    token counts, head counts, contiguous or strided sources, 16-byte aligned or not, each call's
    pointers hold what ``float16_copies`` writes (q times the shift, k and v in float16), bit for bit;
    later calls of a geometry go through the frame its first call kept (on a GPU with Triton 3.6;
    elsewhere through ``float16_copies`` again), so a frame that kept a wrong stride, row count or
    pointer shows here.
    Negative control: a pointer one row off does not match."""
    from prefix_prefill import float16_copies as fc

    gen = torch.Generator().manual_seed(11)
    stream = torch.cuda.current_stream().cuda_stream if DEVICE == "cuda" else 0
    for tokens, heads, kv_heads, d in ((5, 4, 2, 64), (37, 8, 2, 128), (1, 2, 1, 256), (70, 8, 2, 128)):
        for shift in (0, 0, 1, 0):  # (a repeat, then sources 2 bytes off 16-byte alignment)
            width = heads + 2 * kv_heads + 1
            wide = torch.randn(tokens + 1, width, d, generator=gen).to(DEVICE, torch.bfloat16)
            fused = wide.flatten()[shift : shift + tokens * width * d].view(tokens, width, d)  # (qkv slices)
            q = fused[:, :heads]
            k, v = (
                (fused[:, heads : heads + kv_heads], fused[:, heads + kv_heads + 1 :])
                if with_k
                else (None,) * 2
            )
            if tokens == 37:  # (contiguous sources)
                q, k, v = (None if t is None else t.contiguous() for t in (q, k, v))
            want = fc.float16_copies(q, k, v, gluon_launch._Q_SHIFT)
            for _ in range(2):
                buf, qp, kp, vp = fc.float16_copy_pointers(q, k, v, gluon_launch._Q_SHIFT, stream)
                if DEVICE == "cuda":
                    torch.cuda.synchronize()
                assert torch.equal(_at(buf, qp, q.shape), want[0]), (tokens, heads, d, shift)
                if with_k:
                    assert torch.equal(_at(buf, kp, k.shape), want[1]), (tokens, heads, d, shift)
                    assert torch.equal(_at(buf, vp, v.shape), want[2]), (tokens, heads, d, shift)
                    assert not torch.equal(_at(buf, vp - 2 * d, v.shape), want[2])  # (the negative control)
                else:
                    assert kp == vp == qp


def test_fp8_launch_needs_scales(monkeypatch):
    """An fp8 plan's launch without the scale tensors is refused with a ValueError (never a kernel reading
    None)."""
    if not HAS_GLUON:
        pytest.skip("this Triton has no Gluon")
    rec = _Recorder(gluon_launch._gluon_fwd_kernel.arg_names)
    monkeypatch.setattr(gluon_launch, "_gluon_fwd_kernel", rec)
    monkeypatch.setenv("PREFIX_PREFILL_GLUON_TIERED", "0")
    with pytest.raises(ValueError, match="k_scale and v_scale"):
        _launch(_case(), gluon_launch.Options())
    assert not rec.calls


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["nhd", "split"])
def test_fp8_warm_frames_take_each_calls_scales(layout, dtype, monkeypatch):
    """Warm calls of one fp8 signature (same caches, new scale tensors each call) go through one frame whose
    per-call slots carry each call's ``k_scale`` / ``v_scale`` pointers: the C launcher gets what the
    generic direct launch gives it (float16; a bfloat16 call's fresh float16 copies put new q/k/v pointers
    in every launch, and its warm calls find the frame its launch made: the same shifted scale)."""
    if not HAS_GLUON:
        pytest.skip("this Triton has no Gluon")
    from launch_stubs import pointers

    nhd = layout == "nhd"
    kernel, fast_name = ("_gluon_fwd_kernel", "_NHD") if nhd else ("_gluon_split_kernel", "_SPLIT")
    stub = stub_prefix_gluon(monkeypatch, kernel, fast_name)
    _torch_copies(monkeypatch)
    case = _case(layout, seqs=[(40, 5), (0, 19), (70, 130)], dtype=dtype)
    kc, vc = describe_kv_cache(case.k_cache, case.v_cache, case.layout)
    problem = problem_of(case, arch="sm90", gluon=True)
    chosen = plan.plan(problem)
    o = torch.empty_like(case.q)
    call = (case.q, case.k, case.v, o, case.k_cache, case.v_cache)
    index = (case.block_table, case.cu_seqlens_q, case.seq_lens, case.max_query_len, 0.1, None)
    first = _scales(case)
    key = gluon_launch.launch_key(chosen, problem, *index[:3], None, opts=first)
    assert gluon_launch.launch(chosen, problem, *call, kc, vc, *index, key, opts=first)  # through Triton
    assert gluon_launch.launch(chosen, problem, *call, kc, vc, *index, key, opts=first)  # direct: a frame
    c_calls = stub.compiled.run.c_calls
    for _ in range(3):
        opts = _scales(case)
        assert gluon_launch.warm(chosen, key, *call, *index, opts=opts)
        framed = c_calls[-1]
        assert opts.k_scale.data_ptr() in framed and opts.v_scale.data_ptr() in framed
        if dtype == torch.bfloat16:
            continue
        fast = getattr(gluon_launch, fast_name)
        call_of = gluon_launch._nhd_call if nhd else gluon_launch._split_call
        gluon_launch._warm(fast, call_of, chosen, key, *call, kc, vc, *index, opts=opts)
        assert framed == pointers(c_calls[-1])
    assert len(getattr(gluon_launch, fast_name)._frames) == 1


# ------------------------------------------------------------------------- CPU: the rings' protocol
def _blocks(rng: random.Random, context: bool = False) -> tuple[int, int]:
    n_a = rng.randint(1 if context else 0, 7)
    return n_a, n_a + rng.randint(1 if context or n_a == 0 else 0, 5)


@pytest.mark.parametrize("staging", [2, 1], ids=["heads-64-128", "head-256"])
def test_fp8_rings_protocol(staging):
    """The fp8 forms' barriers (staging slots, the rings' ready and empty barriers and their parities,
    copies landing at random later turns, the consumers' K-ahead-of-V order) played in 3000 random
    interleavings of programs with 0..7 context blocks and 0..5 new-token blocks, with each head size's
    staging slots (:func:`test_fp8_staging_slots`): no read sees its slot overwritten, nothing deadlocks,
    every block reaches both consumers."""
    for seed in range(3000):
        rng = random.Random(seed)
        n_a, n_blocks = _blocks(rng)
        seen = play(n_a, n_blocks, rng, staging=staging)
        want = sorted((kv, j) for kv in "KV" for j in range(n_blocks))
        assert sorted(seen[0]) == want and sorted(seen[1]) == want, (seed, n_a, n_blocks)


def test_fp8_staging_slots():
    """The staging slots a ring (``gluon_kernel.fp8_staging``) and the converter's warps and registers the
    kernel takes at each head size: 2 slots and 4 warps at 32 registers at heads 64 and 128; 1 slot and 2
    warps at 40 at head 256, within the multiprocessor's shared memory and registers (the compile tests
    check the kernels)."""
    if not HAS_GLUON:
        pytest.skip("this Triton has no Gluon")
    from prefix_prefill import gluon_kernel as gk

    got = {d: (gk.fp8_staging.fn(d), gk.fp8_converter_warps.fn(d), gk.fp8_converter_regs.fn(d))
           for d in (64, 128, 256)}  # fmt: skip
    assert got == {64: (2, 4, 32), 128: (2, 4, 32), 256: (1, 2, 40)}, got
    for d, (slots, warps, regs) in got.items():
        rings = (
            2 * d * 2 * (plan.GLUON_STAGES * plan.GLUON_BLOCK_N[d] + 64)
        )  # Q halves and K/V rings, float16
        assert rings + 2 * slots * plan.GLUON_BLOCK_N[d] * d <= 227 * 1024 - 1024, (d, rings)
        consumer_warps = 8
        assert 32 * (consumer_warps * 232 + warps * regs + 2 * 24) <= 65536, (d, warps, regs)


def test_fp8_rings_protocol_negative_control():
    """Without the producers' wait for the converter's last context block, a producer that ran ahead of the
    converter by its staging slots passes its first new-token ring wait two rounds early (a parity wait)
    and overwrites a slot a consumer still reads (or, its early fill's arrival counted in the wrong phase,
    the partitions deadlock): the model finds both."""
    found = []
    for seed in range(400):
        rng = random.Random(seed)
        try:
            play(*_blocks(rng, context=True), rng, wait_for_converter=False)
        except Protocol as e:
            found.append(str(e))
    assert any("overwritten" in f for f in found) and any("deadlock" in f for f in found), found[:3]


# ------------------------------------------------------------------------- CPU: offline compiles
_COMPILE_SCRIPT = """
import re
ALL = dict(HAS_LEFT=True, SOFTCAP=2, HAS_ALIBI=True, HAS_SINKS=True, SKIP_DECODE=True)
BOTH_WAYS = dict(CAUSAL=False, HAS_LEFT=True, HAS_RIGHT=True, HAS_ALIBI=True, HAS_SINKS=True)
FORMS = [
    dict(head=128, box=16, from_cache=False, lse=False, out="bf16"),
    dict(head=128, box=16, from_cache=False, lse=True, cache="fp8e5"),
    dict(head=64, box=16, from_cache=False, lse=False),
    dict(head=64, box=64, from_cache=True, lse=True, cache="fp8e5", out="bf16"),
    dict(head=128, box=128, from_cache=False, lse=True, HAS_SINKS=True, HAS_ALIBI=True),
    dict(head=128, box=32, from_cache=False, lse=False, out="bf16", **ALL),
    dict(head=128, box=16, from_cache=True, lse=True, **BOTH_WAYS),
    dict(head=128, box=16, from_cache=False, lse=False, PAIR_HEADS=True, HAS_ALIBI=True, SOFTCAP=2,
         out="bf16"),
    dict(head=128, box=16, from_cache=False, lse=False, IDLE_WG1=True),
    dict(head=128, box=16, from_cache=False, lse=False, one=True, out="bf16"),
    dict(head=64, box=16, from_cache=False, lse=False, one=True, llvm_o0=True, cache="fp8e5", **ALL),
    dict(head=128, box=16, from_cache=False, lse=False, out="fp8e4nv", OUT_MAX=448.0),
    dict(head=256, box=16, from_cache=False, lse=True, out="bf16"),
    dict(head=256, box=64, from_cache=True, lse=False, cache="fp8e5", **ALL),
    dict(head=256, box=16, from_cache=False, lse=False, PAIR_HEADS=True, SOFTCAP=2, out="bf16"),
    dict(head=256, box=16, from_cache=False, lse=False, one=True, llvm_o0=True, out="bf16", **BOTH_WAYS),
    dict(head=128, box=16, from_cache=False, lse=True, IDLE_WG1=True, PACK=4, q_rows=16, HAS_SINKS=True,
         SOFTCAP=2, out="bf16"),
]
for form in FORMS:
    _, kernel = compile_nhd_fp8(**form)
    ptx = kernel.asm["ptx"]
    cvts = re.findall(r"cvt\\.rn\\.f16x2\\.(e4m3|e5m2)x2", ptx)
    print("fp8", form.get("cache", "fp8e4nv"), cvts.count("e4m3"), cvts.count("e5m2"))
"""


@pytest.mark.compile_check
def test_fp8_cache_forms_compile_for_sm90():
    """The ``CACHE_FP8`` forms compile for sm90 (no GPU needed) in the forms plans and launches take (heads
    64 / 128 / 256, e4m3 / e5m2, float16 queries with bfloat16 or float16 outputs (a bfloat16 call runs as a
    float16 one), k given or from the cache, every option, non-causal
    with a window both ways, the LSE, an fp8 output, the paired, idle and quick one-partition forms, the
    quick one with LLVM at O0 as the compile tiers build it)
    within one program's shared memory (227 KiB), each converting its own fp8 type and no other (e4m3
    by the hardware's conversion; e5m2 into float16 by byte moves)."""
    _check_fp8_compiles(_COMPILE_SCRIPT, 17)


def _check_fp8_compiles(script: str, forms: int) -> None:
    """``script``'s ``forms`` fp8-cache compiles (each printing ``fp8 <cache> <e4m3 cvts> <e5m2 cvts>``) fit
    one program's shared memory (227 KiB) and each converts its own fp8 type and no other (e4m3 by the
    hardware's conversion; e5m2, float16's top byte, into float16 by byte moves, no cvt)."""
    if not HAS_GLUON:
        pytest.skip("this Triton has no Gluon")
    shared, out = compile_gluon_for_sm90(PP_COMPILE_HEAD + script)
    assert len(shared) == forms and max(shared) <= 227 * 1024, out
    lines = [line.split() for line in out.splitlines() if line.startswith("fp8 ")]
    assert len(lines) == forms, out
    for _, cache, e4, e5 in lines:
        mine, other = (int(e4), int(e5)) if cache == "fp8e4nv" else (int(e5), int(e4))
        assert other == 0 and (mine > 0 or cache == "fp8e5"), (cache, e4, e5)


_SPLIT_COMPILE_SCRIPT = """
import re
ALL = dict(HAS_LEFT=True, SOFTCAP=2, HAS_ALIBI=True, HAS_SINKS=True, SKIP_DECODE=True)
FORMS = [
    dict(head=128, from_cache=False, lse=False, out="bf16"),
    dict(head=64, from_cache=False, lse=True, cache="fp8e5", **ALL),
    dict(head=128, from_cache=True, lse=True, CAUSAL=False, HAS_LEFT=True, HAS_RIGHT=True),
    dict(head=128, from_cache=False, lse=False, PAIR_HEADS=True, SOFTCAP=2, out="bf16"),
    dict(head=128, from_cache=False, lse=False, one=True, llvm_o0=True, out="bf16", **ALL),
    dict(head=256, from_cache=False, lse=True, out="bf16"),
    dict(head=256, from_cache=True, lse=False, cache="fp8e5", **ALL),
    dict(head=256, from_cache=False, lse=False, PAIR_HEADS=True, SOFTCAP=2, out="bf16"),
    dict(head=256, from_cache=False, lse=False, one=True, llvm_o0=True, out="bf16"),
    dict(head=128, from_cache=False, lse=True, IDLE_WG1=True, PACK=4, q_rows=16, HAS_SINKS=True),
]
for form in FORMS:
    _, kernel = compile_split_fp8(**form)
    cvts = re.findall(r"cvt\\.rn\\.f16x2\\.(e4m3|e5m2)x2", kernel.asm["ptx"])
    print("fp8", form.get("cache", "fp8e4nv"), cvts.count("e4m3"), cvts.count("e5m2"))
"""


@pytest.mark.compile_check
def test_fp8_split_cache_forms_compile_for_sm90():
    """The split kernel's ``CACHE_FP8`` forms compile for sm90 in the forms plans and launches take (heads
    64 / 128 / 256 (one gathering warp a ring there), e4m3 / e5m2, k given or from the cache, every option,
    non-causal with a window both ways, the LSE, the paired form, the quick one-partition form at LLVM
    O0) within one program's shared memory, each converting its own fp8 type and no other."""
    _check_fp8_compiles(_SPLIT_COMPILE_SCRIPT, 10)


# ------------------------------------------------------------------------- GPU (sm90)
#: (k_scale, v_scale): float16 rings' V shift clamped both ways (300: e4m3 -7, e5m2 0; 0.02: 6) and
#: K's scale far from 1 each way (K converts unscaled: a K times V's shift is off by 2**-c)
SCALES = [(0.02, 300.0), (1.9, 0.02), (300.0, 1.9)]


def _nan_spare_blocks(case) -> None:
    """NaN in every cache block no sequence's table names (the kernel never reads them)."""
    used = {int(b) for b in case.block_table.flatten().tolist()}
    for blk in range(case.k_cache.shape[0]):
        if blk not in used:
            case.k_cache[blk] = float("nan")
            case.v_cache[blk] = float("nan")


def _check(layout, from_cache, head, dtype, cache, page, scales, monkeypatch, opts=None, seqs=None,
           heads=(8, 2), lse=False) -> None:  # fmt: skip
    """One fp8 call against the float64 reference of the dequantised cache (tolerances of q's dtype, the
    absolute one times twice the values' scale: ``v_scale``, or with the new tokens' V given (~N(0, 1)) at
    least 1), into a NaN-poisoned output (and LSE), spare cache blocks NaN; ``explain()`` names the Gluon
    kernel with ``CACHE_FP8`` and one Gluon launch ran."""
    opts = opts or {}
    monkeypatch.setattr(plan, "GLUON_MIN_WINDOW", 1)
    monkeypatch.setattr(plan, "GLUON_MIN_WINDOW_FP8", 1)
    launches = []
    orig = gluon_launch.launch

    def counted(*a, **k):
        ok = orig(*a, **k)
        if ok:
            launches.append(1)
        return ok

    monkeypatch.setattr(gluon_launch, "launch", counted)
    if seqs is None:
        seqs = [*random_seqs(3, 2500, 600), (0, 300), (1700, 1), (129, 128), (37, 93), (900, 1)]
    k_scale, v_scale = scales
    case = _case(layout, head, page, seqs, cache=cache, dtype=dtype, device=DEVICE, heads=heads,
                 kv_from_cache=from_cache, k_scale=k_scale, v_scale=v_scale)  # fmt: skip
    _nan_spare_blocks(case)
    kw = _kw(opts, heads[0])
    args = (case.q, case.k, case.v, case.k_cache, case.v_cache, case.block_table, case.cu_seqlens_q,
            case.seq_lens, case.max_query_len)  # fmt: skip
    chosen = explain(*args, kv_layout=case.layout, k_scale=k_scale, v_scale=v_scale, **kw)
    assert chosen.kernel == f"gluon-{case.layout}" and chosen.consts()["CACHE_FP8"], chosen.reason
    out = poison(torch.empty_like(case.q))
    extra = {}
    if lse:
        extra["lse"] = poison(torch.empty(heads[0], case.q.shape[0], dtype=torch.float32, device=DEVICE))
        extra["return_lse"] = True
    prefix_prefill(*args, kv_layout=case.layout, out=out, k_scale=k_scale, v_scale=v_scale, validate=True,
                   **kw, **extra)  # fmt: skip
    assert len(launches) == 1, "the Gluon kernel did not run"
    atol, rtol = tolerance(dtype)
    if lse:
        ref, ref_lse = reference(case, return_lse=True, **kw)
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(extra["lse"]), finite)
        assert (extra["lse"].double()[finite] - ref_lse[finite]).abs().max().item() < 1e-3
    else:
        ref = reference(case, **kw)
    # the values a row averages: the cache's ~ v_scale * N(0, 1), the new tokens' given V ~ N(0, 1)
    c = compare(out, ref, atol=atol * 2 * (v_scale if from_cache else max(v_scale, 1.0)), rtol=rtol)
    assert c, c


#: (head, q dtype, fp8 type, page): every head, q dtype and fp8 type, the page classes
FORMS = [
    (128, torch.bfloat16, E4M3, 16),
    (128, torch.float16, E4M3, 16),
    (128, torch.float16, E5M2, 544),
    (128, torch.bfloat16, E5M2, 1056),
    (64, torch.float16, E4M3, 1056),
    (64, torch.bfloat16, E5M2, 16),
    (64, torch.float16, E5M2, 544),
    (256, torch.bfloat16, E4M3, 16),
    (256, torch.float16, E5M2, 544),
    (256, torch.bfloat16, E4M3, 1056),
    (128, torch.bfloat16, E4M3, 8),  # pages of 8 (NHD/HND only): boxes of 8 rows
    (64, torch.float16, E5M2, 24),
    (256, torch.float16, E4M3, 40),
]
#: vLLM's split layout (``x = 16``): the split kernel's gathered fp8 form, every head, q dtype, fp8 type and
#: page class
SPLIT_FORMS = [
    (128, torch.bfloat16, E4M3, 16),
    (128, torch.float16, E5M2, 544),
    (64, torch.float16, E4M3, 1056),
    (64, torch.bfloat16, E5M2, 16),
    (256, torch.bfloat16, E4M3, 16),
    (256, torch.float16, E5M2, 1056),
]
LAYOUT_FORMS = [("nhd", *f) for f in FORMS] + [("split", *f) for f in SPLIT_FORMS]
FORM_IDS = [f"{lay}-d{h}-{str(t)[6:]}-{str(c)[6:]}-p{p}" for lay, h, t, c, p in LAYOUT_FORMS]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("scales", SCALES, ids=["k0.02-v300", "k1.9-v0.02", "k300-v1.9"])
@pytest.mark.parametrize("layout,head,dtype,cache,page", LAYOUT_FORMS, ids=FORM_IDS)
@pytest.mark.parametrize("from_cache", [False, True], ids=["kv", "from_cache"])
def test_gpu_fp8_matches_reference(from_cache, layout, head, dtype, cache, page, scales, monkeypatch):
    """Plain causal attention over an fp8 NHD cache (the split layout's too: the split kernel's gathers into
    fp8 staging): every head, query dtype, fp8 type and page class, k given or from the cache, scales far
    from 1 each way."""
    _check(layout, from_cache, head, dtype, cache, page, scales, monkeypatch)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("layout", ["hnd", *INTERLEAVED])
@pytest.mark.parametrize("dtype,cache", [(torch.float16, E4M3), (torch.bfloat16, E5M2)],
                         ids=["float16-e4m3", "bfloat16-e5m2"])  # fmt: skip
def test_gpu_fp8_tma_layouts(layout, dtype, cache, monkeypatch):
    """HND caches and interleaved K/V pages ride the same kernel."""
    _check(layout, False, 128, dtype, cache, 16, SCALES[0], monkeypatch)


GPU_OPTIONS = {
    "sinks": dict(sinks=True),
    "softcap": dict(softcap=30.0),
    "alibi": dict(alibi=True),
    "window": dict(left=300),
    "noncausal_window": dict(causal=False, left=200, right=100),
    "all": dict(left=700, alibi=True, sinks=True, softcap=20.0),
    "noncausal_all": dict(causal=False, left=700, right=300, alibi=True, sinks=True, softcap=20.0),
}


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("option", list(GPU_OPTIONS))
@pytest.mark.parametrize("from_cache", [False, True])
@pytest.mark.parametrize("dtype,cache,page", [(torch.float16, E4M3, 16), (torch.bfloat16, E5M2, 544)],
                         ids=["float16-e4m3-p16", "bfloat16-e5m2-p544"])  # fmt: skip
def test_gpu_fp8_options(dtype, cache, page, from_cache, option, monkeypatch):
    """Each option on the fp8 form (head 128), with the LSE: the scales fold into the soft cap's argument,
    the ALiBi slopes and the sinks' start per segment."""
    _check("nhd", from_cache, 128, dtype, cache, page, SCALES[1], monkeypatch, GPU_OPTIONS[option], lse=True)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("option", ["softcap", "window", "all", "noncausal_all"])
@pytest.mark.parametrize("from_cache", [False, True])
def test_gpu_fp8_head256_options(from_cache, option, monkeypatch):
    """The options on the head-256 fp8 form (its 2-warp converter and one staging slot a ring; bfloat16
    over e4m3, page 16), with the LSE."""
    _check("nhd", from_cache, 256, torch.bfloat16, E4M3, 16, SCALES[1], monkeypatch, GPU_OPTIONS[option],
           lse=True)  # fmt: skip


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("option", ["softcap", "noncausal_window", "all", "noncausal_all"])
@pytest.mark.parametrize("from_cache", [False, True])
def test_gpu_fp8_split_options(from_cache, option, monkeypatch):
    """The options on the split kernel's fp8 form (head 128, bfloat16 over e4m3, page 32), with the LSE."""
    _check("split", from_cache, 128, torch.bfloat16, E4M3, 32, SCALES[1], monkeypatch, GPU_OPTIONS[option],
           lse=True)  # fmt: skip


SHORT_SEQS = [(2300, 4), (0, 64), (1700, 1), (129, 37), (600, 8), (37, 16)]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("opts", ["plain", "all"])
@pytest.mark.parametrize("from_cache", [False, True])
@pytest.mark.parametrize("heads", [(32, 8), (6, 2)], ids=["paired", "idle"])
@pytest.mark.parametrize("layout", ["nhd", "split"])
def test_gpu_fp8_short_queries(layout, heads, from_cache, opts, monkeypatch):
    """Queries of at most 64 rows: the paired-heads and idle-warpgroup forms over an fp8 cache."""
    monkeypatch.setenv("PREFIX_PREFILL_GLUON_TIERED", "0")
    _check(layout, from_cache, 128, torch.float16, E4M3, 16, SCALES[0], monkeypatch, GPU_OPTIONS.get(opts),
           SHORT_SEQS, heads)  # fmt: skip


# queries of at most 8 tokens (speculative decoding): the packed form
PACK_SEQS = [(2300, 4), (0, 8), (1700, 1), (129, 7), (600, 8), (37, 3)]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("opts", ["plain", "sinks", "softcap", "noncausal_window"])
@pytest.mark.parametrize("from_cache", [False, True])
@pytest.mark.parametrize("heads", [(32, 8), (6, 2)], ids=["g4", "g3"])
@pytest.mark.parametrize(
    "layout,head", [("nhd", 128), ("split", 128), ("nhd", 256), ("hnd", 64), ("split", 64)]
)
def test_gpu_fp8_packed_heads(layout, head, heads, from_cache, opts, monkeypatch):
    """Queries within ``packed_tokens`` rows a head over an fp8 cache: a KV head's query heads packed into
    the first warpgroup's rows (``PACK``, beside the converter partition), every launch of the call in that
    form, against the reference (output and LSE)."""
    monkeypatch.setenv("PREFIX_PREFILL_GLUON_TIERED", "0")
    forms = []
    variant = gluon_launch._variant
    monkeypatch.setattr(gluon_launch, "_variant", lambda *a: forms.append(variant(*a)) or forms[-1])
    _check(layout, from_cache, head, torch.float16, E4M3, 16, SCALES[0], monkeypatch, GPU_OPTIONS.get(opts),
           PACK_SEQS, heads, lse=True)  # fmt: skip
    assert forms and all(gluon_launch._form(f) == "pack" for f in forms), forms


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("opts", ["plain", "all"])
@pytest.mark.parametrize("heads", [(32, 8), (6, 2)], ids=["paired", "idle"])
def test_gpu_fp8_head256_short_queries(heads, opts, monkeypatch):
    """Queries of at most 64 rows at head 256 over an fp8 NHD cache: the paired-heads and idle-warpgroup
    forms with the 2-warp converter."""
    monkeypatch.setenv("PREFIX_PREFILL_GLUON_TIERED", "0")
    _check("nhd", False, 256, torch.float16, E5M2, 16, SCALES[2], monkeypatch, GPU_OPTIONS.get(opts),
           SHORT_SEQS, heads)  # fmt: skip


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("layout,head", [("nhd", 128), ("split", 128), ("nhd", 256), ("split", 256)])
def test_gpu_fp8_quick_form(layout, head, monkeypatch):
    """The compile tiers' quick form (one 8-warp consumer partition) over an fp8 cache: a fresh tier key
    runs it first."""
    monkeypatch.setenv("PREFIX_PREFILL_GLUON_TIERED", "1")
    import prefill_runtime as runtime

    monkeypatch.setattr(gluon_launch, "_TIERS", runtime.CompileTiers())
    monkeypatch.setattr(gluon_launch, "_NHD", gluon_launch.CompiledLaunches(gluon_launch._gluon_fwd_kernel))
    split = gluon_launch.CompiledLaunches(gluon_launch._gluon_split_kernel)
    monkeypatch.setattr(gluon_launch, "_SPLIT", split)
    _check(layout, False, head, torch.bfloat16, E4M3, 16, SCALES[2], monkeypatch)
    gluon_launch.finish_compiles()


@pytest.mark.gpu
@needs_sm90
def test_gpu_fp8_warm_calls_new_scales(monkeypatch):
    """Repeated calls of one signature (the warm path's frame) with new scale tensors and values each call
    answer each call's scales."""
    monkeypatch.setenv("PREFIX_PREFILL_GLUON_TIERED", "0")
    case = _case("nhd", 128, 16, [(300, 40), (0, 17), (1000, 200)], cache=E4M3, dtype=torch.float16,
                 device=DEVICE)  # fmt: skip
    args = (case.q, case.k, case.v, case.k_cache, case.v_cache, case.block_table, case.cu_seqlens_q,
            case.seq_lens, case.max_query_len)  # fmt: skip
    for k_scale, v_scale in [(0.5, 1.5), *SCALES, (0.7, 0.3)]:
        ks = torch.tensor([k_scale], device=DEVICE)
        vs = torch.tensor([v_scale], device=DEVICE)
        out = poison(torch.empty_like(case.q))
        prefix_prefill(*args, kv_layout="nhd", out=out, k_scale=ks, v_scale=vs)
        ref = reference(dataclasses.replace(case, k_scale=k_scale, v_scale=v_scale))
        atol, rtol = tolerance(torch.float16)
        c = compare(out, ref, atol=atol * 2 * max(v_scale, 1.0), rtol=rtol)  # (k given: as _check)
        assert c, (k_scale, v_scale, c)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("out", ["e4m3", "e5m2"])
@pytest.mark.parametrize("from_cache", [False, True], ids=["kv", "from_cache"])
@pytest.mark.parametrize("layout", ["nhd", "split"])
def test_gpu_fp8_cache_fp8_output(layout, from_cache, out, monkeypatch):
    """An fp8 output (``fp8_out_scale``, its epilogue unchanged) over an fp8 cache: within one fp8 step of
    the reference quantised alike, at a saturating and a fitting scale; a wrong scale (1.5x) fails."""
    from test_pp_gluon_fp8_out import _fp8_check, _quantise, _scale_for

    monkeypatch.setenv("PREFIX_PREFILL_GLUON_TIERED", "0")
    launches = []
    orig = gluon_launch.launch
    monkeypatch.setattr(gluon_launch, "launch", lambda *a, **k: orig(*a, **k) and not launches.append(1))
    case = _case(layout, 128, 16, [(900, 300), (0, 200), (1700, 1), (129, 128), (37, 93)], cache=E4M3,
                 dtype=torch.float16, device=DEVICE, heads=(8, 2), kv_from_cache=from_cache, k_scale=1.9,
                 v_scale=0.02)  # fmt: skip
    ref = reference(case)
    out_dtype = E4M3 if out == "e4m3" else E5M2
    args = (case.q, case.k, case.v, case.k_cache, case.v_cache, case.block_table, case.cu_seqlens_q,
            case.seq_lens, case.max_query_len)  # fmt: skip
    for kind in ("saturate", "fit"):
        scale = _scale_for(ref, out_dtype, kind)
        got = poison(torch.empty(case.q.shape, dtype=out_dtype, device=DEVICE))
        prefix_prefill(*args, kv_layout=layout, out=got, k_scale=1.9, v_scale=0.02, fp8_out_scale=scale)
        bad = _fp8_check(got, _quantise(ref, scale, out_dtype), out_dtype, scale)
        assert not bad, (kind, bad)
        assert _fp8_check(got, _quantise(ref, scale * 1.5, out_dtype), out_dtype, scale), (
            "a wrong scale passes"
        )
    assert len(launches) == 2, "the Gluon kernel did not run"
