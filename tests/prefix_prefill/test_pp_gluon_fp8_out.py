"""fp8 outputs on prefix-prefill's Gluon kernels (NHD and vLLM's split cache): ``o = clamp(out /
fp8_out_scale)`` in float8_e4m3fn or float8_e5m2, the Triton kernel's ``OUT_FP8`` semantics.

CPU: the plans (an NVIDIA fp8 output takes the layout's Gluon kernel with ``OUT_MAX``, named in the
reason; the fnuz outputs, fp8 caches and other architectures keep the Triton kernel; an fp8 output
without its scale is refused); the host glue with the kernels replaced by recorders (the scale reaches
the kernel as ``OutScale``, None without an fp8 output; warm calls through one frame take each call's
scale; both public paths of ``context_attention_fwd``, cold and repeated, hand the launch their call's
scale); both kernels compile for sm90 offline with either fp8 output in every form (full, quick, paired,
idle) with the saturating conversion in their PTX. sm90 GPU: against the float64 reference quantised the
same way (within one fp8 step and the 16-bit kernels' error, most elements exact), scales that saturate
and scales that fit, both layouts, heads 64 / 128 / 256, pages 16 / 544, k given or read from the cache,
every option or none, causal or not, short queries (paired and idle forms), the quick compile tier, the
Triton kernel's answer, a wrong scale as a negative control, NaN-poisoned outputs, and vLLM's form
(repeated calls taking each call's scale).
"""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE, compile_gluon_for_sm90, needs_sm90, poison
from launch_stubs import pointers, stub_prefix_gluon
from pp_cases import make_case, problem_of, reference
from pp_gluon_compile import PP_COMPILE_HEAD
from test_pp_gluon_features import (
    GPU_OPTIONS,
    SHORT_SEQS,
    _kw,
    _nan_invisible_slots,
    record_gluon_kernel,
)

import prefill_runtime as runtime
from paged_kv_offsets import describe_kv_cache
from prefix_prefill import checks, context_attention_fwd, gluon_launch, launch, plan, signatures
from prefix_prefill import prefix_prefill as prefix_prefill_fn

HAS_GLUON = gluon_launch._gluon_fwd_kernel is not None and gluon_launch._gluon_split_kernel is not None
FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
FNUZ = [getattr(torch, n) for n in ("float8_e4m3fnuz", "float8_e5m2fnuz") if hasattr(torch, n)]


def _case(layout="nhd", head=128, page=16, seqs=((40, 5),), device="cpu", dtype=torch.bfloat16, **kw):
    return make_case(list(seqs), num_heads=4, num_kv_heads=2, head_size=head, page=page, dtype=dtype,
                     device=device, layout=layout, **kw)  # fmt: skip


def _fp8_out(case, dtype) -> torch.Tensor:
    return torch.empty(case.q.shape, dtype=dtype, device=case.q.device)


# ------------------------------------------------------------------------- CPU: plans
@pytest.mark.parametrize("fp8", list(FP8))
@pytest.mark.parametrize("layout", ["nhd", "split"])
@pytest.mark.parametrize(
    "opts",
    [
        {},
        dict(left=5000, alibi=True, sinks=True, softcap_form=2, lse=True),
        dict(causal=False, left=3000, right=9),
    ],
)
def test_plan_takes_fp8_outputs(layout, fp8, opts):
    """An e4m3fn or e5m2 output over a 16-bit q and cache runs the layout's Gluon kernel with ``OUT_MAX`` =
    the dtype's largest finite value (with every other option too), "fp8 output" in the reason; a
    16-bit output has ``OUT_MAX`` 0.0 and no such note."""
    case = _case(layout)
    dtype = FP8[fp8]
    assert set(plan.GLUON_FP8_OUTS) == set(FP8.values())
    chosen = plan.plan(problem_of(case, out=_fp8_out(case, dtype), arch="sm90", **opts))
    assert chosen.kernel == f"gluon-{layout}", chosen.reason
    assert chosen.consts()["OUT_MAX"] == float(torch.finfo(dtype).max) and "fp8 output" in chosen.reason
    plain = plan.plan(problem_of(case, arch="sm90", **opts))
    assert plain.kernel == f"gluon-{layout}" and plain.consts()["OUT_MAX"] == 0.0
    assert "fp8 output" not in plain.reason


@pytest.mark.parametrize("layout", ["nhd", "split"])
def test_plan_keeps_triton_for_other_fp8_outputs(layout):
    """The fnuz outputs (AMD's), other architectures and Gluon turned off keep the Triton kernel with its
    ``OUT_FP8`` / ``FP8_OUT_MAX``; the reason names the output dtype where it is the cause (an fp8 output
    over an fp8 cache: the Gluon kernels' ``CACHE_FP8`` forms, test_pp_gluon_fp8.py)."""
    case = _case(layout)
    for dtype in FNUZ:
        chosen = plan.plan(problem_of(case, out=_fp8_out(case, dtype), arch="sm90"))
        assert chosen.kernel == "triton" and "output dtype" in chosen.reason, chosen.reason
        assert chosen.consts()["OUT_FP8"] and chosen.consts()["FP8_OUT_MAX"] == float(torch.finfo(dtype).max)
    o = _fp8_out(case, torch.float8_e4m3fn)
    for kw in (dict(arch="sm80"), dict(arch="sm90", gluon=False)):
        chosen = plan.plan(problem_of(case, out=o, **kw))
        assert chosen.kernel == "triton" and chosen.consts()["OUT_FP8"], (kw, chosen.reason)
    fp8_cache = _case(layout, cache_dtype=torch.float8_e4m3fn)
    chosen = plan.plan(problem_of(fp8_cache, out=_fp8_out(fp8_cache, torch.float8_e4m3fn), arch="sm90"))
    assert chosen.kernel == f"gluon-{layout}" and chosen.consts()["OUT_MAX"] == 448.0
    assert chosen.consts()["CACHE_FP8"]


def test_fp8_output_needs_its_scale():
    """An fp8 output without its scale is refused: by the launcher (ValueError), by
    ``context_attention_fwd`` (an fp8 ``o`` without ``fp8_out_scale``: ``o`` must have q's dtype) and by
    ``prefix_prefill``, which has no fp8 output (``out`` must have q's dtype)."""
    case = _case("split", dtype=torch.float16, device=DEVICE)
    o = _fp8_out(case, torch.float8_e4m3fn)
    kc, vc = describe_kv_cache(case.k_cache, case.v_cache, "split")
    with pytest.raises(ValueError, match="needs its scale"):
        launch.forward(case.q, case.k, case.v, o, case.k_cache, case.v_cache, kc, vc, case.block_table,
                       case.cu_seqlens_q, case.seq_lens, case.max_query_len)  # fmt: skip
    one = torch.ones(1, device=DEVICE)
    with pytest.raises(TypeError, match="o must have q's dtype"):
        context_attention_fwd(case.q, case.k, case.v, o, "auto", case.k_cache, case.v_cache,
                              case.block_table, case.cu_seqlens_q, case.seq_lens, None, case.max_query_len,
                              one, one)  # fmt: skip
    with pytest.raises(TypeError, match="out must have q's dtype"):
        prefix_prefill_fn(case.q, case.k, case.v, case.k_cache, case.v_cache, case.block_table,
                          case.cu_seqlens_q, case.seq_lens, case.max_query_len, out=o)  # fmt: skip


# ------------------------------------------------------------------------- CPU: host glue
@pytest.mark.parametrize("layout", ["nhd", "split"])
def test_out_scale_argument(layout, monkeypatch):
    """The call's scale reaches the kernel as ``OutScale`` with ``OUT_MAX`` the plan's; a 16-bit output
    passes None and 0.0 (a scale given with it is not passed on)."""
    rec = record_gluon_kernel(layout, monkeypatch)
    case = _case(layout, seqs=[(40, 5), (0, 19)])
    kc, vc = describe_kv_cache(case.k_cache, case.v_cache, layout)
    scale = torch.tensor([0.02])
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2, None):
        o = _fp8_out(case, dtype) if dtype is not None else torch.empty_like(case.q)
        problem = problem_of(case, out=o, arch="sm90")
        chosen = plan.plan(problem)
        opts = gluon_launch.Options(out_scale=scale)
        assert gluon_launch.launch(chosen, problem, case.q, case.k, case.v, o, case.k_cache, case.v_cache, kc,
                                   vc, case.block_table, case.cu_seqlens_q, case.seq_lens, case.max_query_len,
                                   0.1, None, opts=opts)  # fmt: skip
        _, args, kw = rec.calls[-1]
        assert args[rec.arg_names.index("O")] is o
        if dtype is None:
            assert kw["OutScale"] is None and kw["OUT_MAX"] == 0.0
        else:
            assert kw["OutScale"] is scale and kw["OUT_MAX"] == float(torch.finfo(dtype).max)


@pytest.mark.parametrize("layout", ["nhd", "split"])
def test_warm_frames_take_each_calls_scale(layout, monkeypatch):
    """Warm calls of one fp8-output signature (same caches) through one frame: each hands the C launcher
    its own scale's pointer (a per-call slot), as the generic direct launch does; the scale never makes
    another frame."""
    if not HAS_GLUON:
        pytest.skip("this Triton has no Gluon")
    nhd = layout == "nhd"
    kernel, fast_name = ("_gluon_fwd_kernel", "_NHD") if nhd else ("_gluon_split_kernel", "_SPLIT")
    stub = stub_prefix_gluon(monkeypatch, kernel, fast_name)
    fast = getattr(gluon_launch, fast_name)
    call_of = gluon_launch._nhd_call if nhd else gluon_launch._split_call
    case = _case(layout, seqs=[(40, 5), (0, 19), (70, 130)])
    kc, vc = describe_kv_cache(case.k_cache, case.v_cache, layout)
    o = _fp8_out(case, torch.float8_e4m3fn)
    problem = problem_of(case, out=o, arch="sm90", sinks=True)
    chosen = plan.plan(problem)
    call = (case.q, case.k, case.v, o, case.k_cache, case.v_cache)
    index = (case.block_table, case.cu_seqlens_q, case.seq_lens, case.max_query_len, 0.1, None)

    def options():
        return gluon_launch.Options(sinks=torch.randn(4), out_scale=torch.rand(1) + 0.01)

    first = options()
    key = gluon_launch.launch_key(chosen, problem, *index[:3], None, opts=first)
    assert gluon_launch.launch(chosen, problem, *call, kc, vc, *index, key, opts=first)  # through Triton
    assert gluon_launch.launch(chosen, problem, *call, kc, vc, *index, key, opts=first)  # direct: a frame
    c_calls = stub.compiled.run.c_calls
    for _ in range(3):
        opts = options()
        assert gluon_launch.warm(chosen, key, *call, *index, opts=opts)
        framed = c_calls[-1]
        assert opts.out_scale.data_ptr() in framed and first.out_scale.data_ptr() not in framed
        gluon_launch._warm(fast, call_of, chosen, key, *call, kc, vc, *index, opts=opts)
        assert framed == pointers(c_calls[-1])
        assert len(fast._frames) == 1


@pytest.mark.parametrize("as_tensor", [True, False], ids=["tensor", "float"])
def test_vllm_calls_pass_each_calls_scale(as_tensor, monkeypatch):
    """``context_attention_fwd`` with an fp8 ``o`` and ``fp8_out_scale`` plans the split Gluon kernel (as
    an H200 would) and hands the launch its call's scale, on the cold path and on the repeated one (the
    signature seen before: each call's own scale tensor; a float becomes a float32 tensor of its value,
    its signature's own)."""
    offered = []

    def record(chosen, *args):
        offered.append((chosen, args[-1]))
        return True

    monkeypatch.setattr(gluon_launch, "launch", record)
    monkeypatch.setattr(launch, "detect_arch", lambda device: "sm90")  # plan as an H200 would
    monkeypatch.setattr(checks, "interpreted", lambda: True)  # (CPU tensors stand in for a GPU's)
    monkeypatch.setattr(launch, "gluon_allowed", lambda: True)
    monkeypatch.setattr(signatures, "SEEN", runtime.signatures.Seen(256))
    case = _case("split", seqs=[(40, 90), (0, 70)], dtype=torch.float16)
    one = torch.ones(1)
    scales = [0.5, 0.125, 0.5, 2.0]
    for s in scales:
        o = _fp8_out(case, torch.float8_e5m2)
        given = torch.tensor([s]) if as_tensor else s
        context_attention_fwd(case.q, case.k, case.v, o, "auto", case.k_cache, case.v_cache, case.block_table,
                              case.cu_seqlens_q, case.seq_lens, None, case.max_query_len, one, one,
                              fp8_out_scale=given)  # fmt: skip
        chosen, opts = offered[-1]
        assert chosen.kernel == "gluon-split" and chosen.consts()["OUT_MAX"] == 57344.0
        assert opts.out_scale is not None and opts.out_scale.item() == s
        if as_tensor:
            assert opts.out_scale.data_ptr() == given.data_ptr()
    # one signature for every scale tensor; a float is part of its call's signature, as sm_scale
    assert len(offered) == len(scales) and len(signatures.SEEN) == (1 if as_tensor else 3)


# ------------------------------------------------------------------------- CPU: offline compiles
_COMPILE_SCRIPT = """
import re

ALL = dict(HAS_LEFT=True, SOFTCAP=2, HAS_ALIBI=True, HAS_SINKS=True, SKIP_DECODE=True)
BOTH = dict(ALL, HAS_RIGHT=True)  # (non-causal: a window both ways)
E4, E5 = ("fp8e4nv", dict(OUT_MAX=448.0)), ("fp8e5", dict(OUT_MAX=57344.0))
FORMS = [
    ("e4m3", lambda t, o: compile_nhd(128, 16, False, True, out=t, **ALL, **o), E4),
    ("e5m2", lambda t, o: compile_nhd(256, 64, True, True, out=t, **o), E5),
    ("e4m3", lambda t, o: compile_nhd(64, 128, False, False, one=True, out=t, **o), E4),
    ("e5m2", lambda t, o: compile_nhd(128, 16, False, False, out=t, PAIR_HEADS=True, **ALL, **o), E5),
    ("e4m3", lambda t, o: compile_split(128, False, True, False, True, 1, True, out=t, **ALL, **o), E4),
    ("e5m2", lambda t, o: compile_split(256, False, True, True, True, 1, out=t, **o), E5),
    ("e4m3", lambda t, o: compile_split(64, True, False, False, False, 0, out=t, IDLE_WG1=True, **o), E4),
    ("e5m2", lambda t, o: compile_split(128, False, False, False, True, 2, out=t, PAIR_HEADS=True, **o), E5),
    ("e4m3", lambda t, o: compile_nhd(128, 16, False, True, out=t, CAUSAL=False, **BOTH, **o), E4),
]
for name, form, (ty, opts) in FORMS:
    _, kernel = form(ty, opts)
    ptx = kernel.asm["ptx"]
    cvts = re.findall(r"cvt\\.rn\\.satfinite\\.(e4m3|e5m2)x2\\.f32", ptx)
    print("fp8", name, cvts.count("e4m3"), cvts.count("e5m2"))
"""


@pytest.mark.compile_check
def test_fp8_output_forms_compile_for_sm90():
    """Both kernels compile for sm90 (no GPU needed) with an e4m3fn or e5m2 output in the forms plans and
    launches take (heads 64 / 128 / 256, k given or from the cache, K/V by TMA or by gathers, the quick
    one-partition form, the paired and idle short-query forms, every option, non-causal with a window both
    ways) within one program's
    shared memory (227 KiB), each writing O through Triton's saturating conversion of its own type
    (``cvt.rn.satfinite.<type>x2.f32``) and no other."""
    if not HAS_GLUON:
        pytest.skip("this Triton has no Gluon")
    shared, out = compile_gluon_for_sm90(PP_COMPILE_HEAD + _COMPILE_SCRIPT)
    assert len(shared) == 9 and max(shared) <= 227 * 1024, out
    lines = [line.split() for line in out.splitlines() if line.startswith("fp8 ")]
    assert len(lines) == 9, out
    for _, name, e4, e5 in lines:
        mine, other = (int(e4), int(e5)) if name == "e4m3" else (int(e5), int(e4))
        assert mine > 0 and other == 0, (name, e4, e5)


# ------------------------------------------------------------------------- GPU (sm90)
def _quantise(ref: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """The float64 reference as the kernels write it: ``clamp(ref / scale)`` to the fp8 range, in fp8."""
    top = float(torch.finfo(dtype).max)
    return (ref.double() / scale).clamp(-top, top).to(dtype)


# a bound on the 16-bit kernels' error before quantisation (output units; bf16 P in the P @ V product),
# which fp8's finer steps (subnormals, small values at a saturating scale) can resolve
ATOL = 1e-2


def _fp8_check(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, scale: float,
               exact: float = 0.5) -> str:  # fmt: skip
    """Empty when ``got`` (an fp8 output at ``scale``) is finite and within one fp8 step of ``want``
    everywhere (the step at the larger magnitude of the two: rounding near a boundary may go either way)
    plus :data:`ATOL` in output units (``ATOL / scale``), and at least ``exact`` of its elements equal
    ``want``; else what failed."""
    g, w = got.double(), want.double()
    if not torch.isfinite(g).all():
        return f"{int((~torch.isfinite(g)).sum())} non-finite elements"
    mantissa = 3 if dtype == torch.float8_e4m3fn else 2
    mag = torch.maximum(g.abs(), w.abs()).clamp(min=torch.finfo(dtype).tiny)
    step = torch.exp2(torch.floor(torch.log2(mag)) - mantissa)
    far = (g - w).abs() > step + ATOL / scale
    same = (g == w).double().mean().item()
    if far.any() or same < exact:
        i = int(far.flatten().nonzero()[0]) if far.any() else 0
        return (f"{int(far.sum())} elements more than one step off (first: got {g.flatten()[i].item()}, "
                f"want {w.flatten()[i].item()}); {same:.3f} exact")  # fmt: skip
    return ""


def _scale_for(ref: torch.Tensor, dtype: torch.dtype, kind: str) -> float:
    """A scale that saturates the largest quarter of the range (``"saturate"``: small values and clamped
    ones both), or fits every value at half the fp8 range (``"fit"``)."""
    top = float(torch.finfo(dtype).max)
    peak = float(ref.abs().max())
    return peak / (4 * top) if kind == "saturate" else peak / (0.5 * top)


def _run_fp8(case, layout, dtype, scale, kw) -> torch.Tensor:
    """``launch.forward`` (the launch both public functions make) into a NaN-poisoned fp8 output."""
    kc, vc = describe_kv_cache(case.k_cache, case.v_cache, layout)
    o = poison(torch.empty(case.q.shape, dtype=dtype, device=DEVICE))
    s = torch.tensor([scale], dtype=torch.float32, device=DEVICE)
    launch.forward(case.q, case.k, case.v, o, case.k_cache, case.v_cache, kc, vc, case.block_table,
                   case.cu_seqlens_q, case.seq_lens, case.max_query_len, out_scale=s, **kw)  # fmt: skip
    return o


def _gluon_launches(monkeypatch) -> list:
    """Launches the Gluon kernels took from here on (``gluon_launch.launch`` returned True)."""
    taken: list[int] = []
    orig = gluon_launch.launch

    def counted(*args, **kwargs):
        ok = orig(*args, **kwargs)
        taken.extend([1] if ok else [])
        return ok

    monkeypatch.setattr(gluon_launch, "launch", counted)
    return taken


def _check_fp8(layout, from_cache, head, dtype, page, fp8, opts, monkeypatch, seqs=None, heads=(8, 2),
               triton=False) -> None:  # fmt: skip
    """One form against the reference quantised the same way, a saturating scale and a fitting one, each
    failing against a wrong scale (1.5x); ``triton``: also within one step of the Triton kernel's output
    (``PREFIX_PREFILL_GLUON=0``), most elements the same."""
    monkeypatch.setattr(plan, "GLUON_MIN_WINDOW", 1)
    monkeypatch.setattr(plan, "GLUON_MIN_WINDOW_FP8", 1)
    taken = _gluon_launches(monkeypatch)
    if seqs is None:
        seqs = [(900, 300), (0, 200), (1700, 1), (129, 128), (37, 93)]
    case = make_case(seqs, num_heads=heads[0], num_kv_heads=heads[1], head_size=head, page=page, dtype=dtype,
                     device=DEVICE, layout=layout, kv_from_cache=from_cache)  # fmt: skip
    kw = _kw(opts, heads[0])
    ref = reference(case, **kw)
    _nan_invisible_slots(case, opts.get("left", -1))
    out_dtype = FP8[fp8]
    top = float(torch.finfo(out_dtype).max)
    for kind in ("saturate", "fit"):
        scale = _scale_for(ref, out_dtype, kind)
        want = _quantise(ref, scale, out_dtype)
        assert bool((want.double().abs() == top).any()) is (kind == "saturate")
        got = _run_fp8(case, layout, out_dtype, scale, kw)
        bad = _fp8_check(got, want, out_dtype, scale)
        assert not bad, (kind, bad)
        wrong = _quantise(ref, scale * 1.5, out_dtype)
        assert _fp8_check(got, wrong, out_dtype, scale), "a wrong scale passes"
    assert len(taken) == 2, "the Gluon kernel did not run"
    if triton:
        monkeypatch.setenv("PREFIX_PREFILL_GLUON", "0")
        other = _run_fp8(case, layout, out_dtype, scale, kw)
        assert len(taken) == 2
        bad = _fp8_check(got, other, out_dtype, scale)
        assert not bad, ("against the Triton kernel", bad)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("fp8,opts", [("e4m3", "all"), ("e5m2", "noncausal_all")])
@pytest.mark.parametrize("head,dtype,page", [(128, torch.bfloat16, 16), (256, torch.float16, 544),
                                             (64, torch.bfloat16, 544)])  # fmt: skip
@pytest.mark.parametrize("from_cache", [False, True])
@pytest.mark.parametrize("layout", ["nhd", "split"])
def test_gpu_fp8_out_every_form(layout, from_cache, head, dtype, page, fp8, opts, monkeypatch):
    """An fp8 output on every form the plans take: both layouts, k given or from the cache, heads 64 / 128
    / 256, pages 16 and 544, every option (window, ALiBi, sinks, soft cap), causal or not (a window both
    ways)."""
    _check_fp8(layout, from_cache, head, dtype, page, fp8, GPU_OPTIONS.get(opts, {}), monkeypatch)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("fp8", list(FP8))
@pytest.mark.parametrize("layout", ["nhd", "split"])
def test_gpu_fp8_out_matches_triton(layout, fp8, monkeypatch):
    """The Gluon kernels' fp8 output is the Triton kernel's (``OUT_FP8``) but for rounding order: within
    one fp8 step (and the 16-bit kernels' error) everywhere, most elements the same; every option on."""
    _check_fp8(layout, False, 128, torch.bfloat16, 16, fp8, GPU_OPTIONS["all"], monkeypatch, triton=True)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("fp8,opts", [("e4m3", "all"), ("e5m2", "plain")])
@pytest.mark.parametrize("layout", ["nhd", "split"])
@pytest.mark.parametrize("heads", [(32, 8), (6, 2)], ids=["paired", "idle"])
def test_gpu_fp8_out_short_queries(heads, layout, fp8, opts, monkeypatch):
    """Queries of at most 64 rows: the paired form (32 / 8 heads) and the idle one (6 / 2) write the fp8
    output of each warpgroup's head (compile tiers off: the full form from the first call)."""
    monkeypatch.setenv("PREFIX_PREFILL_GLUON_TIERED", "0")
    _check_fp8(layout, False, 128, torch.bfloat16, 16, fp8, GPU_OPTIONS.get(opts, {}), monkeypatch,
               SHORT_SEQS, heads)  # fmt: skip


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("layout", ["nhd", "split"])
def test_gpu_fp8_out_quick_tier(layout, monkeypatch):
    """The quick-compiling form (one 8-warp consumer partition, the first call of a new form) and the full
    form write the same fp8 output bit for bit, both right."""
    monkeypatch.setattr(gluon_launch, "_TIERS", runtime.CompileTiers())
    monkeypatch.delenv("PREFIX_PREFILL_GLUON_TIERED", raising=False)
    case = make_case([(700, 300), (0, 129), (2000, 64)], num_heads=12, num_kv_heads=3, head_size=128, page=16,
                     dtype=torch.bfloat16, device=DEVICE, layout=layout)  # fmt: skip
    ref = reference(case)
    dtype = torch.float8_e4m3fn
    scale = _scale_for(ref, dtype, "saturate")
    first = _run_fp8(case, layout, dtype, scale, {})
    assert gluon_launch.finish_compiles(timeout=300) is True
    full = _run_fp8(case, layout, dtype, scale, {})
    want = _quantise(ref, scale, dtype)
    assert not _fp8_check(first, want, dtype, scale) and not _fp8_check(full, want, dtype, scale)
    assert torch.equal(first.view(torch.uint8), full.view(torch.uint8))


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("fp8", list(FP8))
def test_gpu_vllm_fp8_out(fp8, monkeypatch):
    """vLLM's ``context_attention_fwd`` with an fp8 ``o`` and ``fp8_out_scale`` on the split cache (a
    sliding window, sinks): the split Gluon kernel runs it; repeated calls of the signature (the warm
    path, through its frame) with another scale tensor each, or a float, write each call's quantisation."""
    monkeypatch.setattr(plan, "GLUON_MIN_WINDOW", 1)
    monkeypatch.setattr(plan, "GLUON_MIN_WINDOW_FP8", 1)
    taken = _gluon_launches(monkeypatch)
    dtype = FP8[fp8]
    case = _case("split", seqs=[(900, 300), (0, 64), (2000, 1)], device=DEVICE, dtype=torch.float16)
    sinks = torch.randn(4, device=DEVICE)
    ref = reference(case, window=(255, -1), sinks=sinks)
    one = torch.ones(1, device=DEVICE)
    base = _scale_for(ref, dtype, "saturate")
    for step, s in enumerate((base, base * 3, base * 0.5, base * 3)):
        o = poison(torch.empty(case.q.shape, dtype=dtype, device=DEVICE))
        given = s if step == 3 else torch.tensor([s], dtype=torch.float32, device=DEVICE)
        context_attention_fwd(case.q, case.k, case.v, o, "auto", case.k_cache, case.v_cache, case.block_table,
                              case.cu_seqlens_q, case.seq_lens, None, case.max_query_len, one, one,
                              sliding_window=256, sinks=sinks, fp8_out_scale=given,
                              validate=step == 0)  # fmt: skip
        bad = _fp8_check(o, _quantise(ref, s, dtype), dtype, s)
        assert not bad, (step, bad)
    assert taken, "the Gluon kernel did not run"
