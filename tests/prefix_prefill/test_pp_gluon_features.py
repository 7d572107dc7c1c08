"""Prefix-prefill's Gluon kernels (NHD / HND caches, interleaved pages too, and vLLM's split cache) with
the model options: a left sliding window (whole key blocks before it never loaded, in the cached context
too), ALiBi, sinks, soft-capping, skip_decode and non-causal calls (with a window both ways), alone and
together.

CPU: the plans (the options as the kernels' constexprs, each in its reason; a window narrower than
:data:`prefix_prefill.plan.GLUON_MIN_WINDOW` keys keeps the Triton kernel);
the host glue with the kernels replaced by recorders (each option's argument, None where off; the logit
multiplier with soft-capping); warm calls through a frame taking each call's own sinks and slopes and a
frame per cap and window; the kernels compile for sm90 offline in every option form within one program's
shared memory. sm90 GPU: against the float64 reference (output and LSE) into NaN-poisoned outputs for the
page classes 16 / 544 / 1056, heads 64 / 128 / 256, every layout, ragged batches with empty contexts and
one-token queries, k given or read from the cache, with NaN in every cache slot no query may read (past
each context and before each window); ``explain()`` names the Gluon kernel; skip_decode leaves the
decode rows alone; negative controls; the vLLM form.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import DEVICE, check_tanh_forms, compile_gluon_for_sm90, needs_sm90, poison
from launch_stubs import pointers, stub_prefix_gluon
from pp_cases import (
    INTERLEAVED,
    alibi_slopes,
    make_layout_case,
    problem_of,
    random_seqs,
    reference,
    run_vllm,
)
from pp_gluon_compile import PP_COMPILE_HEAD

from attn_reference import compare
from paged_kv_offsets import describe_kv_cache
from prefill_runtime.checks import PINNED_SOFTCAP_MAX
from prefix_prefill import explain, gluon_launch, launch, plan, prefix_prefill

HAS_GLUON = gluon_launch._gluon_fwd_kernel is not None and gluon_launch._gluon_split_kernel is not None
WIDE = plan.GLUON_MIN_WINDOW - 1  # the narrowest left window the Gluon kernels take
OPTION_CONSTS = ("HAS_LEFT", "SOFTCAP", "HAS_ALIBI", "HAS_SINKS", "SKIP_DECODE", "HAS_RIGHT")


def _case(layout="nhd", head=128, page=16, seqs=((40, 5),), device="cpu", **kw):
    """A case of a layout id (``pp_cases.make_layout_case``: ``"nhd"``, ``"hnd"``, ``"split"`` or one of
    ``INTERLEAVED``)."""
    return make_layout_case(list(seqs), num_heads=4, num_kv_heads=2, head_size=head, page=page,
                            dtype=torch.bfloat16, device=device, layout=layout, **kw)  # fmt: skip


def _kernel(layout: str) -> str:
    """The Gluon plan's kernel of a layout id."""
    return f"gluon-{layout.partition('-')[0]}"


# ------------------------------------------------------------------------- CPU: plans
@pytest.mark.parametrize("layout", ["nhd", "hnd", "split", "nhd-interleaved"])
@pytest.mark.parametrize(
    "opts,want",
    [
        (dict(left=WIDE), dict(HAS_LEFT=True)),
        (dict(left=4095, right=0), dict(HAS_LEFT=True)),  # a right window is moot under causality
        (dict(alibi=True), dict(HAS_ALIBI=True)),
        (dict(sinks=True), dict(HAS_SINKS=True)),
        (dict(softcap_form=2), dict(SOFTCAP=2)),
        (dict(softcap_form=1, scale=-0.3), dict(SOFTCAP=1)),  # the cap's multiplier is positive
        (dict(skip_decode=True), dict(SKIP_DECODE=True)),
        (dict(left=4095, sinks=True), dict(HAS_LEFT=True, HAS_SINKS=True)),
        (dict(left=4095, softcap_form=2), dict(HAS_LEFT=True, SOFTCAP=2)),
        (dict(left=WIDE, alibi=True, sinks=True, softcap_form=2, skip_decode=True, lse=True),
         dict(HAS_LEFT=True, HAS_ALIBI=True, HAS_SINKS=True, SOFTCAP=2, SKIP_DECODE=True, RETURN_LSE=True)),
        (dict(causal=False), dict(CAUSAL=False)),
        (dict(causal=False, right=0), dict(CAUSAL=False, HAS_RIGHT=True)),
        (dict(causal=False, left=1000, right=1047, alibi=True, sinks=True),
         dict(CAUSAL=False, HAS_LEFT=True, HAS_RIGHT=True, HAS_ALIBI=True, HAS_SINKS=True)),
        (dict(softcap_form=3), dict(SOFTCAP=3)),  # a bounded cap: the consumers pin the softmax max
        (dict(left=4095, softcap_form=3), dict(HAS_LEFT=True, SOFTCAP=3)),
        (dict(softcap_form=3, sinks=True), dict(SOFTCAP=2, HAS_SINKS=True)),  # logits past the cap's bounds
        (dict(softcap_form=3, alibi=True), dict(SOFTCAP=2, HAS_ALIBI=True)),
    ],
)  # fmt: skip
def test_gluon_takes_options(layout, opts, want):
    """Each option (and the combinations models use) runs the layout's Gluon kernel, as its constexprs,
    named in the plan's reason; the options it does not have are off."""
    p = problem_of(_case(layout), arch="sm90", gluon=True, **opts)
    chosen = plan.plan(p)
    assert chosen.kernel == _kernel(layout), chosen.reason
    c = chosen.consts()
    assert {n: c[n] for n in want} == want
    assert all(not c[n] for n in OPTION_CONSTS if n not in want)
    assert c["CAUSAL"] is want.get("CAUSAL", True)
    names = {"HAS_LEFT": "left window", "SOFTCAP": "soft-capping", "HAS_ALIBI": "ALiBi", "HAS_SINKS": "sinks",
             "SKIP_DECODE": "skip_decode", "CAUSAL": "non-causal", "HAS_RIGHT": "right window"}  # fmt: skip
    assert all(names[n] in chosen.reason for n in want if n in names)


@pytest.mark.parametrize("layout", ["nhd", "hnd", "split"])
def test_window_width_rule(layout):
    """A left window lets the Gluon kernel run from :data:`~prefix_prefill.plan.GLUON_MIN_WINDOW` keys a
    row on (``left + 1``); one key fewer keeps the Triton kernel, the reason says why. Not causal, the
    width is ``left + right + 1`` (a side of -1 unbounded)."""
    case = _case(layout)
    assert plan.plan(problem_of(case, arch="sm90", left=WIDE)).kernel == _kernel(layout)
    narrow = plan.plan(problem_of(case, arch="sm90", left=WIDE - 1))
    assert narrow.kernel == "triton" and f"narrower than {plan.GLUON_MIN_WINDOW}" in narrow.reason
    assert plan.plan(problem_of(case, arch="sm90", left=WIDE - 1, sinks=True)).kernel == "triton"
    assert plan.plan(problem_of(case, arch="sm90", left=WIDE - 1, right=5)).kernel == "triton"  # (moot)
    both = [(WIDE // 2, WIDE - WIDE // 2), (-1, 0), (0, -1), (5, -1), (-1, 5)]
    for left, right in both:
        assert (
            plan.plan(problem_of(case, arch="sm90", causal=False, left=left, right=right)).kernel != "triton"
        )
    narrow = plan.plan(
        problem_of(case, arch="sm90", causal=False, left=WIDE // 2, right=WIDE - WIDE // 2 - 1)
    )
    assert narrow.kernel == "triton" and f"narrower than {plan.GLUON_MIN_WINDOW}" in narrow.reason


# ------------------------------------------------------------------------- CPU: host glue
class _Recorder:
    """A Gluon kernel stand-in: ``kernel[grid](*args, **kwargs)`` records the call."""

    def __init__(self, names):
        self.arg_names, self.calls = names, []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((grid, args, kwargs))


def record_gluon_kernel(layout: str, monkeypatch) -> _Recorder:
    """The layout's Gluon kernel replaced by a :class:`_Recorder` (full forms only: compile tiers off);
    skips where this Triton has no Gluon."""
    if not HAS_GLUON:
        pytest.skip("this Triton has no Gluon")
    name = "_gluon_split_kernel" if layout == "split" else "_gluon_fwd_kernel"
    rec = _Recorder(getattr(gluon_launch, name).arg_names)
    monkeypatch.setattr(gluon_launch, name, rec)
    monkeypatch.setenv("PREFIX_PREFILL_GLUON_TIERED", "0")
    return rec


@pytest.mark.parametrize("layout", ["nhd", "hnd", "split"])
def test_option_arguments(layout, monkeypatch):
    """The options reach the kernel as its arguments: ``Sinks`` / ``Slopes`` the call's tensors,
    ``tanh_scale`` = scale / softcap with the logit multiplier softcap * log2(e), ``window_left`` the
    window and ``window_right`` a non-causal call's right window (capped at 2**30); each None where its
    option is off (plain attention: all None, the multiplier scale * log2(e))."""
    rec = record_gluon_kernel(layout, monkeypatch)
    case = _case(layout, seqs=[(40, 5), (0, 19)])
    kc, vc = describe_kv_cache(case.k_cache, case.v_cache, layout)
    sinks, slopes = torch.randn(4), alibi_slopes(4, "cpu")
    qk = rec.arg_names.index("qk_scale")
    everything = dict(left=5000, softcap_form=2, sinks=True, alibi=True)
    for opts, popts in (
        (gluon_launch.Options(), {}),
        (gluon_launch.Options(30.0, 5000, sinks, slopes), everything),
        (gluon_launch.Options(0.0, 2**40, sinks, None), dict(left=2**40, sinks=True)),
        (gluon_launch.Options(0.0, 3000, None, None, 2**40), dict(left=3000, right=2**40, causal=False)),
        (gluon_launch.Options(right=7), dict(right=7)),  # causal: the right window is moot, not passed
    ):
        problem = problem_of(case, arch="sm90", **popts)
        chosen = plan.plan(problem)
        o = torch.empty_like(case.q)
        assert gluon_launch.launch(chosen, problem, case.q, case.k, case.v, o, case.k_cache, case.v_cache, kc,
                                   vc, case.block_table, case.cu_seqlens_q, case.seq_lens, case.max_query_len,
                                   0.1, None, opts=opts)  # fmt: skip
        _, args, kw = rec.calls[-1]
        capped = opts.softcap > 0
        assert args[qk] == pytest.approx((30.0 if capped else 0.1) * math.log2(math.e))
        assert kw["tanh_scale"] == (pytest.approx(0.1 / 30.0) if capped else None)
        assert kw["Sinks"] is opts.sinks and kw["Slopes"] is opts.alibi
        assert kw["window_left"] == (None if opts.left < 0 else min(opts.left, 2**30))
        causal = popts.get("causal", True)
        assert kw["window_right"] == (None if opts.right < 0 or causal else min(opts.right, 2**30))
        assert kw["CAUSAL"] is causal
        assert {n: kw[n] for n in OPTION_CONSTS} == {n: chosen.consts()[n] for n in OPTION_CONSTS}


@pytest.fixture
def warm_nhd(monkeypatch):
    """The NHD kernel replaced by a stand-in launched directly (full form from the first call), with a raw
    launcher over the stand-in's C launcher."""
    if not HAS_GLUON:
        pytest.skip("this Triton has no Gluon")
    return stub_prefix_gluon(monkeypatch, "_gluon_fwd_kernel", "_NHD")


@pytest.mark.parametrize("layout", ["nhd", "hnd-interleaved"])
def test_warm_frames_take_each_calls_options(layout, warm_nhd):
    """Warm calls of one signature (same caches; NHD, or HND with interleaved pages: the same kernel):
    a frame's call hands the C launcher what the generic direct launch hands it, with this call's sinks
    and slopes (per-call slots); another cap or window (another signature, the same compiled variant)
    gets a frame of its own."""
    case = _case(layout, seqs=[(40, 5), (0, 19), (70, 130)])
    kc, vc = describe_kv_cache(case.k_cache, case.v_cache, case.layout)
    problem = problem_of(case, arch="sm90", left=5000, softcap_form=2, sinks=True, alibi=True)
    chosen = plan.plan(problem)
    o = torch.empty_like(case.q)
    call = (case.q, case.k, case.v, o, case.k_cache, case.v_cache)
    index = (case.block_table, case.cu_seqlens_q, case.seq_lens, case.max_query_len, 0.1, None)

    def options(cap=30.0, left=5000):
        return gluon_launch.Options(cap, left, torch.randn(4), alibi_slopes(4, "cpu"))

    first = options()
    key = gluon_launch.launch_key(chosen, problem, *index[:3], None, opts=first)
    assert gluon_launch.launch(chosen, problem, *call, kc, vc, *index, key, opts=first)  # through Triton
    assert gluon_launch.launch(chosen, problem, *call, kc, vc, *index, key, opts=first)  # direct: a frame
    c_calls = warm_nhd.compiled.run.c_calls
    for cap, left, frames in ((30.0, 5000, 1), (30.0, 5000, 1), (20.0, 5000, 2), (30.0, 2047, 3)):
        opts = options(cap, left)
        if frames > len(gluon_launch._NHD._frames):  # a new cap or window: the generic launch makes it
            assert not gluon_launch.warm(chosen, key, *call, *index, opts=opts)
            gluon_launch._warm(
                gluon_launch._NHD, gluon_launch._nhd_call, chosen, key, *call, kc, vc, *index, opts=opts
            )
        assert gluon_launch.warm(chosen, key, *call, *index, opts=opts)
        framed = c_calls[-1]
        assert opts.sinks.data_ptr() in framed and opts.alibi.data_ptr() in framed
        gluon_launch._warm(
            gluon_launch._NHD, gluon_launch._nhd_call, chosen, key, *call, kc, vc, *index, opts=opts
        )
        assert framed == pointers(c_calls[-1])
        assert len(gluon_launch._NHD._frames) == frames


# ------------------------------------------------------------------------- CPU: offline compiles
_COMPILE_SCRIPT = """
ALL = dict(HAS_LEFT=True, SOFTCAP=2, HAS_ALIBI=True, HAS_SINKS=True, SKIP_DECODE=True)
FORMS = [
    ("nhd", lambda o: compile_nhd(128, 16, False, True, **o)),
    ("nhd", lambda o: compile_nhd(256, 64, True, True, **o)),
    ("nhd", lambda o: compile_nhd(64, 128, False, False, **o)),
    ("nhd-quick", lambda o: compile_nhd(128, 16, False, False, one=True, **o)),
    ("split", lambda o: compile_split(128, False, True, False, True, 1, True, **o)),
    ("split", lambda o: compile_split(256, False, True, True, True, 1, **o)),
    ("split", lambda o: compile_split(64, False, False, False, False, 0, **o)),
    ("split", lambda o: compile_split(128, True, True, False, True, 2, **o)),
]
OPTS = [ALL, dict(HAS_LEFT=True), dict(SOFTCAP=1, HAS_SINKS=True), dict(HAS_ALIBI=True, SKIP_DECODE=True)]
BOTH_WAYS = dict(CAUSAL=False, HAS_LEFT=True, HAS_RIGHT=True, HAS_ALIBI=True, HAS_SINKS=True)
for i, (name, form) in enumerate(FORMS):
    for opts in (OPTS + [BOTH_WAYS] if i < 2 else [ALL, BOTH_WAYS] if i == 4 else OPTS[:1]):
        _, kernel = form(opts)
        print("tanh", opts.get("SOFTCAP", 0), kernel.asm["ptx"].count("tanh.approx.f32"))
"""


@pytest.mark.compile_check
def test_option_forms_compile_for_sm90():
    """Both kernels compile for sm90 (no GPU needed) with every option, in every form a plan takes (heads
    64 / 128 / 256, k given or from the cache, the quick form, K/V by TMA or by gathers; non-causal with a
    window both ways) within one program's shared memory (227 KiB); the hardware tanh where ``SOFTCAP`` is
    2, none elsewhere."""
    if not HAS_GLUON:
        pytest.skip("this Triton has no Gluon")
    shared, out = compile_gluon_for_sm90(PP_COMPILE_HEAD + _COMPILE_SCRIPT)
    assert len(shared) == 17 and max(shared) <= 227 * 1024, out
    check_tanh_forms(out)


# ------------------------------------------------------------------------- GPU (sm90)
def _nan_invisible_slots(case, left: int) -> None:
    """NaN into every cache slot no query may read: past each sequence's cached tokens in its pages, every
    block no sequence owns, and (``left >= 0``) every slot before the first key the sequence's first query
    sees (``ctx - left``); the block table still points at those pages."""
    split, hnd = case.layout == "split", case.layout == "hnd"
    cached = [c + (n if case.k is None else 0) for c, n in zip(case.ctx_lens, case.q_lens, strict=True)]
    table = case.block_table.cpu()
    used = set()
    for b, (n, ctx) in enumerate(zip(cached, case.ctx_lens, strict=True)):
        first = max(0, ctx - left) if left >= 0 else 0
        for pg in range(math.ceil(n / case.page)):
            blk = int(table[b, pg])
            used.add(blk)
            lo, hi = pg * case.page, (pg + 1) * case.page
            for a, z in ((max(lo, n), hi), (lo, min(hi, first))):  # past the cached tokens, before the window
                if a < z:
                    sl = slice(a - lo, z - lo)
                    if split:
                        case.k_cache[blk, :, :, sl] = float("nan")
                        case.v_cache[blk, :, :, sl] = float("nan")
                    elif hnd:
                        case.k_cache[blk, :, sl] = float("nan")
                        case.v_cache[blk, :, sl] = float("nan")
                    else:
                        case.k_cache[blk, sl] = float("nan")
                        case.v_cache[blk, sl] = float("nan")
    for blk in range(case.k_cache.shape[0]):
        if blk not in used:
            case.k_cache[blk] = float("nan")
            case.v_cache[blk] = float("nan")


def _kw(opts: dict, heads: int) -> dict:
    """prefix_prefill / reference keyword arguments of a test's options."""
    kw = {}
    if "left" in opts or "right" in opts:
        kw["window"] = (opts.get("left", -1), opts.get("right", -1))
    if "causal" in opts:
        kw["causal"] = opts["causal"]
    if opts.get("alibi"):
        kw["alibi_slopes"] = alibi_slopes(heads, DEVICE)
    if opts.get("sinks"):
        s = torch.randn(heads, device=DEVICE) * 2
        s[0] = float("-inf")  # a head whose sink is off
        kw["sinks"] = s
    if opts.get("softcap"):
        kw["softcap"] = opts["softcap"]
    return kw


GPU_OPTIONS = {
    "window": dict(left=300),
    "window_sinks": dict(left=127, sinks=True),  # gpt-oss sliding layers
    "softcap_window": dict(left=500, softcap=30.0),  # Gemma 2 local layers
    "softcap": dict(softcap=50.0),
    "alibi": dict(alibi=True),
    "sinks": dict(sinks=True),
    "noncausal": dict(causal=False),  # encoder-style rows over a cached prefix, prefix-LM
    "noncausal_window": dict(causal=False, left=200, right=100),  # a window both ways
    "noncausal_right": dict(causal=False, right=0),  # each row sees the keys up to itself (and the context)
    "all": dict(left=700, alibi=True, sinks=True, softcap=20.0),
    "noncausal_all": dict(causal=False, left=700, right=300, alibi=True, sinks=True, softcap=20.0),
}


def _check_options(layout, from_cache, head, dtype, page, opts, monkeypatch, seqs=None, heads=(8, 2)) -> None:
    """One option set on a layout's Gluon kernel against the reference (output and LSE): ragged batches
    with empty contexts and one-token queries (or ``seqs``; ``heads``: query and KV heads), NaN in every
    slot no query may read;
    ``explain()`` names the Gluon kernel and one launch ran it (windows of any width: the width rule set
    aside)."""
    monkeypatch.setattr(plan, "GLUON_MIN_WINDOW", 1)
    launches = []
    orig = gluon_launch.launch
    monkeypatch.setattr(gluon_launch, "launch", lambda *a, **k: launches.append(1) or orig(*a, **k))
    if seqs is None:
        seqs = [*random_seqs(3, 2500, 600), (0, 300), (1700, 1), (129, 128), (37, 93), (900, 1)]
    case = make_layout_case(seqs, num_heads=heads[0], num_kv_heads=heads[1], head_size=head, page=page,
                            dtype=dtype, device=DEVICE, layout=layout, kv_from_cache=from_cache)  # fmt: skip
    kw = _kw(opts, heads[0])
    ref, ref_lse = reference(case, return_lse=True, **kw)
    _nan_invisible_slots(case, opts.get("left", -1))
    out = poison(torch.empty_like(case.q))
    lse = poison(torch.empty(heads[0], case.q.shape[0], dtype=torch.float32, device=DEVICE))
    args = (case.q, case.k, case.v, case.k_cache, case.v_cache, case.block_table, case.cu_seqlens_q,
            case.seq_lens, case.max_query_len)  # fmt: skip
    assert explain(*args, kv_layout=case.layout, **kw).kernel == _kernel(layout)
    prefix_prefill(*args, kv_layout=case.layout, out=out, return_lse=True, lse=lse, validate=True, **kw)
    assert len(launches) == 1, "the Gluon kernel did not run"
    c = compare(out, ref)
    assert c, c
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse.double()[finite] - ref_lse[finite]).abs().max().item() < 1e-3


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("new_sign", [-1.0, 1.0], ids=["all_at_minus_cap", "new_at_plus_cap"])
@pytest.mark.parametrize("layout", ["nhd", "split"])
def test_gpu_pinned_max_at_the_ends_of_its_range(layout, new_sign, monkeypatch):
    """The pinned-max soft-capping form (bfloat16, a cap of ``PINNED_SOFTCAP_MAX``, no sinks or ALiBi:
    ``SOFTCAP`` 3) with every tanh saturated (q.k * scale / cap = +-52): every context logit at ``-cap``
    (each p at its smallest) and the new tokens' at ``-cap`` or ``+cap``, against the reference, output
    and LSE, NaN in every slot no query may read."""
    launches = []
    orig = gluon_launch.launch
    monkeypatch.setattr(gluon_launch, "launch", lambda *a, **k: launches.append(1) or orig(*a, **k))
    seqs = [(300, 200), (0, 129), (1000, 1), (37, 300)]
    case = make_layout_case(seqs, num_heads=8, num_kv_heads=2, head_size=128, page=16, dtype=torch.bfloat16,
                            device=DEVICE, layout=layout, kv_from_cache=False)  # fmt: skip
    case.q.fill_(16.0)
    case.k_cache.fill_(-16.0)
    case.k.fill_(16.0 * new_sign)
    kw = dict(softcap=PINNED_SOFTCAP_MAX)
    ref, ref_lse = reference(case, return_lse=True, **kw)
    _nan_invisible_slots(case, -1)
    out = poison(torch.empty_like(case.q))
    lse = poison(torch.empty(8, case.q.shape[0], dtype=torch.float32, device=DEVICE))
    args = (case.q, case.k, case.v, case.k_cache, case.v_cache, case.block_table, case.cu_seqlens_q,
            case.seq_lens, case.max_query_len)  # fmt: skip
    chosen = explain(*args, kv_layout=case.layout, **kw)
    assert chosen.kernel == _kernel(layout) and chosen.consts()["SOFTCAP"] == 3, chosen.reason
    prefix_prefill(*args, kv_layout=case.layout, out=out, return_lse=True, lse=lse, **kw)
    assert len(launches) == 1, "the Gluon kernel did not run"
    c = compare(out, ref)
    assert c, c
    assert torch.isfinite(lse).all()
    assert (lse.double() - ref_lse).abs().max().item() < 1e-3


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("page", [16, 544, 1056])
@pytest.mark.parametrize("head,dtype", [(128, torch.bfloat16), (256, torch.float16), (64, torch.bfloat16)])
@pytest.mark.parametrize("from_cache", [False, True])
@pytest.mark.parametrize("layout", ["nhd", "split", "hnd", *INTERLEAVED])
def test_gpu_all_options_every_form(layout, from_cache, head, dtype, page, monkeypatch):
    """A window, ALiBi, sinks and a soft cap together on every form the plans take: NHD, split, HND and
    interleaved NHD / HND pages, k given or from the cache, heads 64 / 128 / 256, the page classes 16,
    544 and 1056."""
    _check_options(layout, from_cache, head, dtype, page, GPU_OPTIONS["all"], monkeypatch)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize(
    "page,head,dtype",
    [(24, 128, torch.bfloat16), (24, 256, torch.float16), (24, 64, torch.bfloat16), (1, 256, torch.float16),
     (12, 256, torch.bfloat16)],
)  # fmt: skip
@pytest.mark.parametrize("opts", ["all", "noncausal_all"])
@pytest.mark.parametrize("layout", ["nhd", "hnd", *INTERLEAVED])
def test_gpu_all_options_small_pages(layout, opts, head, dtype, page, monkeypatch):
    """Every option together, causal or not, over pages that are not multiples of 16 (24: boxes of 8
    rows; 1 and 12 at head 256: the gathering form), k given, and the short-query forms (paired heads)
    from the cache."""
    _check_options(layout, False, head, dtype, page, GPU_OPTIONS[opts], monkeypatch)
    monkeypatch.setenv("PREFIX_PREFILL_GLUON_TIERED", "0")
    _check_options(layout, True, head, dtype, page, GPU_OPTIONS[opts], monkeypatch, SHORT_SEQS, (32, 8))


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("page", [16, 544])
@pytest.mark.parametrize("head,dtype", [(128, torch.bfloat16), (256, torch.float16), (64, torch.bfloat16)])
@pytest.mark.parametrize("from_cache", [False, True])
@pytest.mark.parametrize("layout", ["nhd", "split"])
def test_gpu_noncausal_every_form(layout, from_cache, head, dtype, page, monkeypatch):
    """Non-causal calls with a window both ways, ALiBi (``|q - k|``), sinks and a soft cap on every form
    the plans take."""
    _check_options(layout, from_cache, head, dtype, page, GPU_OPTIONS["noncausal_all"], monkeypatch)


# queries of at most 64 rows (speculative decoding, decode-sized chunks): the idle-warpgroup form
SHORT_SEQS = [(2300, 4), (0, 64), (1700, 1), (129, 37), (600, 8), (37, 16)]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize(
    "head,dtype,page,opts",
    [(128, torch.bfloat16, 16, "all"), (256, torch.float16, 16, "all"), (64, torch.bfloat16, 16, "all"),
     (128, torch.bfloat16, 544, "plain"), (256, torch.bfloat16, 1056, "plain"),
     (128, torch.bfloat16, 16, "noncausal_all")],
)  # fmt: skip
@pytest.mark.parametrize("from_cache", [False, True])
@pytest.mark.parametrize("layout", ["nhd", "split", "hnd", *INTERLEAVED])
@pytest.mark.parametrize("heads", [(32, 8), (6, 2)], ids=["paired", "idle"])
def test_gpu_short_queries_every_form(heads, layout, from_cache, head, dtype, page, opts, monkeypatch):
    """Queries of at most 64 rows run the full form whose second consumer warpgroup takes the next query
    head (``PAIR_HEADS``, 32 / 8 heads over 6 sequences: 192 idle programs, more than one wave) or
    computes nothing and only keeps the rings' protocol (``IDLE_WG1``, 6 / 2: an odd number of query
    heads a KV head); a form with one consumer partition
    has neither. Every option or none, every layout (interleaved pages too), k given or from the cache
    (compile tiers off: the full form from the first call)."""
    monkeypatch.setenv("PREFIX_PREFILL_GLUON_TIERED", "0")
    case = make_layout_case(SHORT_SEQS, num_heads=heads[0], num_kv_heads=heads[1], head_size=head, page=page,
                            dtype=dtype, device=DEVICE, layout=layout, kv_from_cache=from_cache)  # fmt: skip
    chosen = plan.plan(problem_of(case, arch="sm90", gluon=True))
    one = chosen.consts().get("ONE_CONSUMER", False)
    assert plan.idle_second_warpgroup(chosen, case.max_query_len) is not one
    sms = torch.cuda.get_device_properties(DEVICE).multi_processor_count
    programs = heads[0] * len(SHORT_SEQS)  # the idle form's grid
    paired = not one and plan.pair_heads(heads[0] // heads[1], programs, sms)
    assert paired is (not one and heads[0] // heads[1] % 2 == 0)
    _check_options(layout, from_cache, head, dtype, page, GPU_OPTIONS.get(opts, {}), monkeypatch, SHORT_SEQS,
                   heads)  # fmt: skip


# queries of at most 8 tokens (speculative decoding): the packed form, where it applies
PACK_SEQS = [(2300, 4), (0, 8), (1700, 1), (129, 7), (600, 8), (37, 3)]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize(
    "head,dtype,page",
    [(128, torch.bfloat16, 16), (256, torch.float16, 16), (64, torch.bfloat16, 16),
     (128, torch.bfloat16, 544), (128, torch.bfloat16, 24)],
)  # fmt: skip
@pytest.mark.parametrize("opts", ["plain", "softcap_window", "noncausal_window", "window_sinks"])
@pytest.mark.parametrize("from_cache", [False, True])
@pytest.mark.parametrize("layout", ["nhd", "hnd", "split"])
@pytest.mark.parametrize("heads", [(32, 8), (16, 2), (6, 2)], ids=["g4", "g8", "g3"])
def test_gpu_packed_heads(heads, layout, from_cache, opts, head, dtype, page, monkeypatch):
    """Queries within :func:`prefill_runtime.plan.packed_tokens` rows a head run the packed form on every
    16-bit layout (``PACK``:
    a KV head's 4, 8 or 3 query heads in the first warpgroup's rows, 16, 8 and 16 rows each, the last
    with 16 padding rows; plain, soft-capped with a window, non-causal with windows both ways, gpt-oss's
    window 127 with sinks) against the reference, output and LSE, NaN in every slot no query may read;
    then the same call with packing turned off (the paired or idle form) gives the same bits. (vLLM's
    split cache at head 128 with pages of a key block or more and the new tokens given has one consumer
    partition: no short-query form, checked against the reference only.)"""
    monkeypatch.setenv("PREFIX_PREFILL_GLUON_TIERED", "0")
    group = heads[0] // heads[1]
    case = make_layout_case(PACK_SEQS, num_heads=heads[0], num_kv_heads=heads[1], head_size=head, page=page,
                            dtype=dtype, device=DEVICE, layout=layout, kv_from_cache=from_cache)  # fmt: skip
    chosen = plan.plan(problem_of(case, arch="sm90", gluon=True))
    one = chosen.consts().get("ONE_CONSUMER", False)  # (the split plan's one partition: no idle form)
    assert plan.pack_heads(chosen, group, case.max_query_len) == (0 if one else group)
    opts = GPU_OPTIONS.get(opts, {})
    _check_options(layout, from_cache, head, dtype, page, opts, monkeypatch, PACK_SEQS, heads)
    if one:
        return
    kw = _kw(opts, heads[0])
    args = (case.q, case.k, case.v, case.k_cache, case.v_cache, case.block_table, case.cu_seqlens_q,
            case.seq_lens, case.max_query_len)  # fmt: skip
    got, forms = [], []
    variant = gluon_launch._variant
    monkeypatch.setattr(gluon_launch, "_variant", lambda *a: forms.append(variant(*a)) or forms[-1])
    for packed in (True, False):
        if not packed:  # (the per-key rule's cache emptied, so the rule is asked again)
            monkeypatch.setattr(gluon_launch, "pack_heads", lambda *a: 0)
            monkeypatch.setattr(gluon_launch, "_KEY_HEADS", {})
        out = poison(torch.empty_like(case.q))
        lse = poison(torch.empty(heads[0], case.q.shape[0], dtype=torch.float32, device=DEVICE))
        prefix_prefill(*args, kv_layout=case.layout, out=out, return_lse=True, lse=lse, **kw)
        got.append((out, lse))
        assert (gluon_launch._form(forms[-1]) == "pack") is packed, forms[-1]
    assert torch.equal(got[0][0], got[1][0]) and torch.equal(got[0][1], got[1][1])


def _order_seqs(batch: int, q_len: int, seed: int) -> list[tuple[int, int]]:
    """``batch`` sequences of ``q_len`` new tokens for the short-query forms' order: contexts of few
    distinct lengths (ties the order breaks by index), some empty, one long."""
    rng = torch.Generator().manual_seed(seed)
    ctx = torch.randint(0, 4, (batch,), generator=rng) * 97
    ctx[batch // 2] = 1500
    return [(int(c), q_len) for c in ctx]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("batch", [1, 40, 128, 129])
@pytest.mark.parametrize("form", ["pack", "pair", "idle"])
@pytest.mark.parametrize("layout", ["nhd", "split"])
def test_gpu_short_query_order(layout, form, batch, monkeypatch):
    """The short-query forms take their sequences longest first (``gluon_kernel._longest_first``: a
    batch of up to ``ORDER_SEQS`` sequences, lengths with ties; one more keeps launch order): every
    sequence is computed once, right, against the reference, output and LSE, NaN in every slot no query
    may read, in each form (packed: 32 / 8 heads and 4 tokens; paired: 32 / 8 and 20 tokens, past the
    packed rows; idle: 6 / 2 and 20 tokens)."""
    monkeypatch.setenv("PREFIX_PREFILL_GLUON_TIERED", "0")
    heads, q_len = ((6, 2), 20) if form == "idle" else ((32, 8), 4 if form == "pack" else 20)
    seqs = _order_seqs(batch, q_len, batch)
    forms = []
    variant = gluon_launch._variant
    monkeypatch.setattr(gluon_launch, "_variant", lambda *a: forms.append(variant(*a)) or forms[-1])
    monkeypatch.setattr(gluon_launch, "pair_heads", lambda group, programs, sms: group % 2 == 0)
    _check_options(layout, False, 128, torch.bfloat16, 16, {}, monkeypatch, seqs, heads)
    assert [gluon_launch._form(f) for f in forms] == [form], forms


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("batch", [1, 2, 40, 128, 129])
@pytest.mark.parametrize("queries", ["3tiles", "4tiles", "decodes"])
@pytest.mark.parametrize("layout", ["nhd", "split", "hnd"])
def test_gpu_full_form_order(layout, queries, batch, monkeypatch):
    """The full forms (a query tile a program) take their sequences longest first from
    ``ORDER_MIN_TILES`` query tiles a sequence when at least half the grid's tiles may hold queries
    (``ORDER_LIVE_SHARE``), in a batch of 2 to ``ORDER_SEQS`` sequences: contexts with ties, some empty,
    one long; queries of 1 to 385 tokens (``4tiles``: 4 tiles of 128 rows, ordered), 1 to 384 (``3tiles``:
    launch order), or one of 385 among one-token ones (``decodes``: mostly tiles past their queries,
    launch order in batches of 40 and more); every sequence computed once, right, against the reference,
    output and LSE, NaN in every slot no query may read."""
    monkeypatch.setenv("PREFIX_PREFILL_GLUON_TIERED", "0")
    q_max = 384 if queries == "3tiles" else 385
    rng = torch.Generator().manual_seed(batch + q_max)
    q_lens = torch.randint(1, q_max + 1, (batch,), generator=rng)
    if queries == "decodes":
        q_lens.fill_(1)
    q_lens[batch // 3] = q_max
    seqs = [(c, int(n)) for (c, _), n in zip(_order_seqs(batch, 1, batch), q_lens, strict=True)]
    _check_options(layout, False, 128, torch.bfloat16, 16, {}, monkeypatch, seqs, (8, 2))


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("option", [o for o in GPU_OPTIONS if not o.endswith("all")])
@pytest.mark.parametrize("page", [16, 544])
@pytest.mark.parametrize("layout", ["nhd", "split", "hnd"])
def test_gpu_each_option(layout, page, option, monkeypatch):
    """Each option alone, and the pairs models use (gpt-oss's window and sinks, Gemma 2's window and
    cap), at head 128 on both layouts."""
    _check_options(layout, False, 128, torch.bfloat16, page, GPU_OPTIONS[option], monkeypatch)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("layout", ["nhd", "split", "hnd", "nhd-interleaved"])
def test_gpu_default_rule_and_warm_calls(layout):
    """With the shipped width rule: a 4095-key window with sinks and a soft cap takes the Gluon kernel;
    repeated calls of the signature (warm, through the frame) take each call's own sinks and lengths and
    stay right; the narrowest window the Gluon kernel takes (:data:`WIDE`) takes it, one key narrower keeps
    the Triton kernel, both right."""
    for step, seqs in enumerate(([(5000, 900), (0, 70)], [(300, 4000)], [(4100, 1), (9000, 300)])):
        case = _case(layout, head=128, page=16, seqs=seqs, device=DEVICE)
        kw = dict(window=(4095, -1), softcap=30.0, sinks=torch.randn(4, device=DEVICE) * (step + 1))
        args = (case.q, case.k, case.v, case.k_cache, case.v_cache, case.block_table, case.cu_seqlens_q,
                case.seq_lens, case.max_query_len)  # fmt: skip
        assert explain(*args, kv_layout=case.layout, **kw).kernel == _kernel(layout)
        out = poison(torch.empty_like(case.q))
        prefix_prefill(*args, kv_layout=case.layout, out=out, **kw)
        c = compare(out, reference(case, **kw))
        assert c, (step, c)
    for left, kernel in ((WIDE, _kernel(layout)), (WIDE - 1, "triton")):
        kw = dict(window=(left, -1), sinks=torch.randn(4, device=DEVICE))
        assert explain(*args, kv_layout=case.layout, **kw).kernel == kernel
        out = poison(torch.empty_like(case.q))
        prefix_prefill(*args, kv_layout=case.layout, out=out, **kw)
        c = compare(out, reference(case, **kw))
        assert c, (left, c)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("layout", ["nhd", "split", "hnd"])
def test_gpu_skip_decode(layout, monkeypatch):
    """skip_decode on the Gluon kernels: the one-token sequences' rows stay as they were (NaN) and their
    LSE is -inf; every other row matches the reference (the launch as both public functions make it;
    vLLM's form on the split cache)."""
    monkeypatch.setattr(plan, "GLUON_MIN_WINDOW", 1)
    case = _case(layout, seqs=[(300, 1), (120, 200), (0, 1), (400, 90)], device=DEVICE)
    kc, vc = describe_kv_cache(case.k_cache, case.v_cache, layout)
    decode = torch.tensor([0, 201], device=DEVICE)
    keep = torch.ones(case.q.shape[0], dtype=torch.bool, device=DEVICE)
    keep[decode] = False
    for kw, popts in (({}, {}), ({"window": (100, -1), "sinks": torch.randn(4, device=DEVICE)},
                                 {"left": 100, "sinks": True})):  # fmt: skip
        chosen = plan.plan(problem_of(case, skip_decode=True, lse=True, **popts))
        assert chosen.kernel == _kernel(layout) and chosen.consts()["SKIP_DECODE"]
        out = poison(torch.empty_like(case.q))
        lse = poison(torch.empty(4, case.q.shape[0], dtype=torch.float32, device=DEVICE))
        launch.forward(case.q, case.k, case.v, out, case.k_cache, case.v_cache, kc, vc, case.block_table,
                       case.cu_seqlens_q, case.seq_lens, case.max_query_len, skip_decode=True, lse=lse,
                       **kw)  # fmt: skip
        assert torch.isnan(out[decode].float()).all() and (lse[:, decode] == float("-inf")).all()
        ref = reference(case, **kw)
        c = compare(out[keep], ref[keep])
        assert c, c
        if layout == "split":
            vllm = {"sliding_window": 101, "sinks": kw["sinks"]} if kw else {}
            out = run_vllm(case, skip_decode=True, **vllm)
            assert torch.isnan(out[decode].float()).all() and compare(out[keep], ref[keep])


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("layout", ["nhd", "split", "hnd"])
def test_gpu_negative_controls(layout, monkeypatch):
    """The harness catches a wrong kernel: the Gluon answers with a window, ALiBi, sinks or a soft cap each
    differ from the reference with the window off by one, without ALiBi, without sinks, without the cap;
    a non-causal answer differs from the causal reference, and one with a right window from the answer
    with the right window one key wider."""
    monkeypatch.setattr(plan, "GLUON_MIN_WINDOW", 1)
    case = _case(layout, seqs=[(700, 300), (0, 200)], device=DEVICE)
    for kw, wrong in (
        (dict(window=(150, -1)), dict(window=(149, -1))),
        (dict(alibi_slopes=alibi_slopes(4, DEVICE)), {}),
        (dict(sinks=torch.full((4,), 4.0, device=DEVICE)), {}),
        (dict(softcap=2.0), {}),
        (dict(causal=False), {}),
        (dict(causal=False, window=(-1, 40)), dict(causal=False, window=(-1, 41))),
    ):
        out = poison(torch.empty_like(case.q))
        prefix_prefill(case.q, case.k, case.v, case.k_cache, case.v_cache, case.block_table,
                       case.cu_seqlens_q, case.seq_lens, case.max_query_len, kv_layout=layout, out=out,
                       **kw)  # fmt: skip
        assert compare(out, reference(case, **kw))
        assert not compare(out, reference(case, **wrong)), kw


@pytest.mark.gpu
@needs_sm90
def test_gpu_vllm_form(monkeypatch):
    """vLLM's ``context_attention_fwd`` with a sliding window, sinks and ALiBi on the split cache: the
    Gluon split kernel runs it, right."""
    monkeypatch.setattr(plan, "GLUON_MIN_WINDOW", 1)
    launches = []
    orig = gluon_launch.launch
    monkeypatch.setattr(gluon_launch, "launch", lambda *a, **k: launches.append(1) or orig(*a, **k))
    case = _case("split", seqs=[(900, 300), (0, 64), (2000, 1)], device=DEVICE)
    slopes, sinks = alibi_slopes(4, DEVICE), torch.randn(4, device=DEVICE)
    out = run_vllm(case, sliding_window=256, alibi_slopes=slopes, sinks=sinks)
    assert launches
    c = compare(out, reference(case, window=(255, -1), alibi_slopes=slopes, sinks=sinks))
    assert c, c
