"""The window-prefill Gluon kernel's score options: sinks (an extra logit of the denominator, or a bias
on key 0), soft-capping and ALiBi, each alone and with windows, the LSE, every head size and both 16-bit
dtypes.

CPU: a call with these options is planned for the Gluon kernel (the launcher believing it runs on sm90) with
the options as its ``SINKS`` / ``SOFTCAP`` / ``HAS_ALIBI`` constexprs, and its Triton fallback answers right
when it does not launch; every such form compiles for sm90 offline within one program's shared memory, with
the hardware ``tanh.approx.f32`` where asked. sm90 GPU: against the float64 reference (ragged batches,
one-token sequences, GQA) into NaN-poisoned buffers with a count proving the Gluon kernel ran, ``explain()``
naming it, warm calls of one signature taking each call's own sinks (the frame's per-call slot), and negative
controls (the options dropped, or the other sinks mode, are caught).
"""

from __future__ import annotations

import pytest
import torch
from conftest import ON_GPU, check_tanh_forms, compile_gluon_for_sm90, needs_sm90, poison
from wp_util import (
    WP_COMPILE_HEAD,
    any_width_is_wide,
    count_gluon_launches,
    make_qkv,
    reference,
    refuse_gluon,
    run,
)

import window_prefill.launch as wl
from attn_reference import attention_varlen, compare
from prefill_runtime.checks import PINNED_SOFTCAP_MAX
from window_prefill import explain, window_prefill


# ------------------------------------------------------------------------- CPU: the planned launch
@pytest.mark.skipif(ON_GPU, reason="the interpreter's planned launch (the GPU tests below run the kernel)")
@pytest.mark.parametrize(
    "opts,want",
    [
        (dict(sinks_mode="denominator"), dict(SINKS=1, SOFTCAP=0)),
        (dict(sinks_mode="bias_key0"), dict(SINKS=2, SOFTCAP=0)),
        (dict(softcap=7.0), dict(SINKS=0, SOFTCAP=1)),
        (dict(softcap=7.0, sinks_mode="bias_key0", causal=False, window=(9, 4)), dict(SINKS=2, SOFTCAP=1)),
        (dict(alibi=True), dict(SINKS=0, SOFTCAP=0, HAS_ALIBI=True)),
        (
            dict(alibi=True, softcap=7.0, sinks_mode="denominator", window=(9, -1)),
            dict(SINKS=1, SOFTCAP=1, HAS_ALIBI=True),
        ),
    ],
)
def test_options_are_offered_to_gluon(opts, want, monkeypatch):
    """Sinks and soft-capping no longer keep a call off the Gluon kernel: it is offered the plan with them
    as constexprs (soft-capping through exp2 on the CPU, the hardware tanh on a GPU), and the fallback's
    answer is right when it refuses. ALiBi likewise (``HAS_ALIBI``)."""
    offered = refuse_gluon(monkeypatch)
    any_width_is_wide(monkeypatch, 8)
    q, k, v, cu = make_qkv([30, 9], 2, 1, 64, torch.float16)
    kw = dict(causal=opts.get("causal", True), window=opts.get("window", (-1, -1)),
              softcap=opts.get("softcap", 0.0))  # fmt: skip
    if "sinks_mode" in opts:
        kw.update(sinks=torch.randn(2), sinks_mode=opts["sinks_mode"])
    if opts.get("alibi"):
        kw.update(alibi_slopes=torch.tensor([0.5, 0.125]))
    out = run(q, k, v, cu, 30, **kw)
    assert len(offered) == 1 and offered[0].kernel == "gluon"
    c = offered[0].consts()
    assert {n: c[n] for n in want} == want
    assert explain(q, k, v, cu, 30, **kw).kernel == "gluon"
    got = compare(out, reference(q, k, v, cu, **kw))
    assert got, got


@pytest.mark.skipif(ON_GPU, reason="the interpreter's planned launch (the GPU tests below run the kernel)")
def test_fp8_output_is_offered_to_gluon(monkeypatch):
    """An fp8 output is offered to the Gluon kernel (``OUT_MAX``, the format's largest value; its fallback's
    ``FP8_OUT_MAX`` too), and the fallback's answer is ``clamp(out / scale)`` (within the interpreter's fp8
    rounding: see ``test_correctness.test_fp8_output``)."""
    offered = refuse_gluon(monkeypatch)
    any_width_is_wide(monkeypatch, 8)
    q, k, v, cu = make_qkv([30, 9], 2, 1, 64, torch.float16)
    out = poison(torch.empty(q.shape, dtype=torch.float8_e5m2))
    window_prefill(q, k, v, cu, 30, out=out, fp8_out_scale=0.5)
    assert len(offered) == 1 and offered[0].kernel == "gluon"
    assert offered[0].consts()["OUT_MAX"] == 57344.0 == offered[0].get("fallback").consts()["FP8_OUT_MAX"]
    ref = reference(q, k, v, cu)
    got = out.double() * 0.5
    assert torch.isfinite(got).all() and ((got - ref).abs() <= 0.55 * ref.abs() + 0.03).all()


_COMPILE_SCRIPT = """
# head, softcap form, sinks mode, left window, causal, lse, ALiBi, persistent, fp8 O
CASES = ((128, 2, 1, True, True, True, False, False, 0), (64, 0, 2, False, True, False, False, False, 0),
         (256, 2, 2, True, False, True, False, False, 0), (128, 1, 0, False, True, False, False, False, 0),
         (64, 2, 1, True, True, True, False, False, 0), (256, 0, 1, False, True, False, False, False, 0),
         (128, 3, 0, True, True, True, False, False, 0), (128, 0, 0, True, False, False, True, False, 0),
         (64, 2, 2, False, False, True, True, False, 0), (128, 0, 1, False, True, True, True, True, 0),
         (256, 0, 0, True, True, True, True, True, 0), (128, 0, 0, False, False, False, False, False, 448.0),
         (128, 2, 1, True, True, True, False, True, 448.0), (256, 0, 2, True, True, False, True, True, 448.0))
for head_dim, softcap, sinks, left, causal, lse, alibi, persistent, out_max in CASES:
    kernel = compile_wp(head_dim, lse, sinks, softcap, IS_CAUSAL=causal, HAS_LEFT=left, HAS_RIGHT=not causal,
                        HAS_ALIBI=alibi, PERSISTENT=persistent, OUT_MAX=out_max)
    print("tanh", softcap, kernel.asm["ptx"].count("tanh.approx.f32"))
"""


@pytest.mark.compile_check
def test_feature_forms_compile_for_sm90():
    """Every sinks mode and soft-capping form, with and without windows, the LSE, ALiBi and an fp8 output
    (one-tile and persistent), at heads 64 / 128 / 256, compiles for sm90 (no GPU needed) within one
    program's shared memory (227 KiB); the hardware tanh forms (2, and 3 with the pinned max) hold
    ``tanh.approx.f32``, the others none."""
    if wl._gluon_fwd_kernel is None:
        pytest.skip("this Triton has no Gluon")
    shared, out = compile_gluon_for_sm90(WP_COMPILE_HEAD + _COMPILE_SCRIPT)
    assert len(shared) == 14 and max(shared) <= 227 * 1024, out
    check_tanh_forms(out)


# ------------------------------------------------------------------------- GPU (sm90)
GPU_CASES = [
    # lens, heads, kv_heads, head_dim, dtype, causal, window, sinks mode, softcap, lse[, ALiBi]
    ([3000, 1, 700], 8, 2, 128, torch.bfloat16, True, (-1, -1), "denominator", 0.0, True),
    ([2500, 129], 4, 1, 128, torch.float16, True, (1023, -1), "denominator", 0.0, False),
    ([2000, 5, 300], 4, 2, 128, torch.bfloat16, True, (-1, -1), None, 50.0, True),
    ([1500, 2100], 4, 2, 128, torch.bfloat16, True, (511, -1), "denominator", 30.0, True),
    ([1300, 1, 64], 4, 4, 64, torch.bfloat16, False, (200, 60), "bias_key0", 0.0, True),
    ([900, 640], 4, 2, 64, torch.float16, True, (-1, -1), "bias_key0", 20.0, False),
    ([1800, 77], 4, 2, 256, torch.bfloat16, True, (700, -1), "denominator", 50.0, True),
    ([600, 65, 64], 2, 1, 256, torch.float16, False, (-1, -1), "bias_key0", 0.0, False),
    ([1000, 33], 6, 2, 128, torch.bfloat16, False, (-1, -1), None, 10.0, False),
    ([127, 128, 129, 1], 3, 1, 128, torch.bfloat16, True, (0, -1), "bias_key0", 5.0, True),
    ([3000, 1, 700], 8, 2, 128, torch.bfloat16, True, (-1, -1), None, 0.0, True, True),
    ([2500, 129], 4, 1, 128, torch.float16, True, (511, -1), "denominator", 0.0, True, True),
    ([1300, 1, 64], 4, 4, 64, torch.bfloat16, False, (200, 60), "bias_key0", 20.0, True, True),
    ([1800, 77], 4, 2, 256, torch.bfloat16, True, (700, -1), None, 50.0, True, True),
    ([1000, 33], 6, 2, 128, torch.bfloat16, False, (-1, -1), "denominator", 0.0, False, True),
    ([127, 128, 129, 1], 3, 1, 64, torch.float16, True, (-1, -1), "bias_key0", 0.0, True, True),
]


def _alibi(heads: int, on: bool) -> dict:
    """ALiBi's geometric slopes (2 ** (-8 (h + 1) / heads)), the last head's 0, or nothing."""
    if not on:
        return {}
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], device="cuda")
    slopes[-1] = 0.0
    return {"alibi_slopes": slopes}


def _sinks(heads: int, mode: str | None) -> dict:
    if mode is None:
        return {}
    s = torch.randn(heads, device="cuda") * 2
    s[0] = float("-inf")  # a head whose sink is off
    return {"sinks": s, "sinks_mode": mode}


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize(
    "case", GPU_CASES, ids=lambda c: f"{c[0][:2]}-h{c[3]}-{c[7]}-cap{c[8]:g}-w{c[6]}{'-alibi' * len(c[10:])}"
)
def test_gpu_features_match_reference(case, monkeypatch):
    """Sinks, soft-capping and ALiBi on the Gluon kernel against the reference, output and LSE."""
    any_width_is_wide(monkeypatch)
    launches = count_gluon_launches(monkeypatch)
    lens, heads, kv_heads, d, dtype, causal, window, mode, cap, want_lse = case[:10]
    q, k, v, cu = make_qkv(lens, heads, kv_heads, d, dtype)
    kw = dict(causal=causal, window=window, softcap=cap, **_sinks(heads, mode))
    kw.update(_alibi(heads, bool(case[10:])))
    assert explain(q, k, v, cu, max(lens), **kw).kernel == "gluon"
    out = poison(torch.empty_like(q))
    res = window_prefill(q, k, v, cu, max(lens), out=out, return_lse=want_lse, **kw)
    assert len(launches) == 1, "the Gluon kernel did not run"
    got = res[0] if want_lse else res
    c = compare(got, reference(q, k, v, cu, **kw))
    assert c, c
    if want_lse:
        _, ref_lse = attention_varlen(q, k, v, cu, cu, return_lse=True, **kw)
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(res[1]), finite)
        assert (res[1].double()[finite] - ref_lse[finite]).abs().max().item() < 1e-3


FP8_OUT_CASES = [
    # lens, head_dim, causal, window, extra: persistent causal; persistent narrow with a key-0 sink whose
    # -inf head leaves rows of 0; one-tile non-causal with soft-capping; head 256 with ALiBi; a wide band
    ([3000, 1, 700], 128, True, (-1, -1), {}),
    ([2500, 129], 128, True, (511, -1), dict(sinks_mode="bias_key0")),
    ([1300, 1, 64], 64, False, (-1, -1), dict(softcap=20.0)),
    ([1800, 77], 256, True, (700, -1), dict(alibi=True)),
    ([1000, 33], 128, False, (2047, 2047), {}),
]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("out_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
@pytest.mark.parametrize("case", FP8_OUT_CASES, ids=lambda c: f"{c[0][:2]}-h{c[1]}-w{c[3]}-{sorted(c[4])}")
def test_gpu_fp8_output(out_dtype, case, monkeypatch):
    """An fp8 output on the Gluon kernel (one-tile and persistent forms; a sink, soft-capping, ALiBi):
    ``clamp(out / scale)`` against the float64 reference in the fp8 tolerance, warm calls taking each
    call's own scale (a float, a tensor, the float again); the output read without its scale is far from
    the reference (the negative control)."""
    any_width_is_wide(monkeypatch)
    launches = count_gluon_launches(monkeypatch)
    lens, d, causal, window, extra = case
    q, k, v, cu = make_qkv(lens, 4, 2, d, torch.bfloat16)
    kw = dict(causal=causal, window=window, softcap=extra.get("softcap", 0.0))
    if "sinks_mode" in extra:
        kw.update(_sinks(4, extra["sinks_mode"]))
    kw.update(_alibi(4, extra.get("alibi", False)))
    ref = reference(q, k, v, cu, **kw)
    for step, scale in enumerate((0.25, torch.tensor([0.5], device="cuda"), 0.25)):
        out = poison(torch.empty(q.shape, dtype=out_dtype, device="cuda"))
        assert explain(q, k, v, cu, max(lens), out=out, fp8_out_scale=scale, **kw).kernel == "gluon"
        assert window_prefill(q, k, v, cu, max(lens), out=out, fp8_out_scale=scale, **kw) is out
        c = compare(out.double() * float(scale), ref, out_dtype)
        assert c, (step, c)
    assert not compare(out.double(), ref, out_dtype), "the scale changed nothing: the test is void"
    assert len(launches) == 3


@pytest.mark.gpu
@needs_sm90
def test_gpu_default_route_and_warm_calls(monkeypatch):
    """With the shipped table and width rule, a wide window with sinks and soft-capping (Gemma 2 / gpt-oss
    layers) takes the Gluon kernel; warm calls of one signature (the frame) take each call's own sinks
    and lengths and stay right; sinks held in float32, bfloat16 and float16."""
    launches = count_gluon_launches(monkeypatch)
    q, k, v, cu = make_qkv([4096, 300], 8, 2, 128, torch.bfloat16)
    for step, sinks_dtype in enumerate((torch.float32, torch.bfloat16, torch.float16)):
        sinks = (torch.randn(8, device="cuda") * (step + 1)).to(sinks_dtype)
        kw = dict(causal=True, window=(2047, -1), softcap=50.0, sinks=sinks)
        assert explain(q, k, v, cu, 4096, **kw).kernel == "gluon"
        out = run(q, k, v, cu, 4096, **kw)
        c = compare(out, reference(q, k, v, cu, **kw))
        assert c, (step, c)
    assert len(launches) == 3


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("window", [(-1, -1), (2047, -1), (511, 300), (2047, 2047)])
def test_gpu_alibi_warm_calls(window, monkeypatch):
    """ALiBi on the shipped path (the frame of a signature's warm calls): each call's own slopes and lengths,
    causal or not, persistent (causal, narrow) and one-tile forms, against the reference."""
    launches = count_gluon_launches(monkeypatch)
    causal = window[1] < 0
    for step, lens in enumerate(([4096, 300], [2500, 1, 1700], [4096, 300], [900])):
        q, k, v, cu = make_qkv(lens, 8, 2, 128, torch.bfloat16)
        kw = dict(causal=causal, window=window, alibi_slopes=_alibi(8, True)["alibi_slopes"] * (step + 1))
        assert explain(q, k, v, cu, max(lens), **kw).kernel == "gluon"
        out = run(q, k, v, cu, max(lens), **kw)
        c = compare(out, reference(q, k, v, cu, **kw))
        assert c, (step, c)
    assert len(launches) == 4


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("cap", [50.0, PINNED_SOFTCAP_MAX])
def test_gpu_pinned_max_at_the_ends_of_its_range(cap, monkeypatch):
    """The pinned-max soft-capping form (bfloat16, a cap up to ``PINNED_SOFTCAP_MAX``: ``SOFTCAP`` 3) at the
    ends of its range, against the reference, output and LSE: a sequence whose every logit is ``-cap``
    (each p its smallest), one whose every logit is ``+cap`` (its largest), one of both in turn (tanh
    saturated exactly: q.k * scale / cap = +-2896 / cap)."""
    any_width_is_wide(monkeypatch)
    launches = count_gluon_launches(monkeypatch)
    lens = [700, 300, 1000]
    q, k, v, cu = make_qkv(lens, 4, 2, 128, torch.bfloat16)
    u = torch.full((128,), 16.0, dtype=torch.bfloat16, device="cuda")  # q.k = +-32768
    q[:700], k[:700] = u, -u
    q[700:1000], k[700:1000] = u, u
    q[1000:], k[1000::2], k[1001::2] = u, u, -u
    kw = dict(causal=True, softcap=cap)
    chosen = explain(q, k, v, cu, max(lens), **kw)
    assert chosen.kernel == "gluon" and chosen.consts()["SOFTCAP"] == 3, chosen.reason
    out = poison(torch.empty_like(q))
    got, lse = window_prefill(q, k, v, cu, max(lens), out=out, return_lse=True, **kw)
    assert len(launches) == 1, "the Gluon kernel did not run"
    c = compare(got, reference(q, k, v, cu, **kw))
    assert c, c
    _, ref_lse = attention_varlen(q, k, v, cu, cu, return_lse=True, **kw)
    assert torch.isfinite(lse).all()
    assert (lse.double() - ref_lse).abs().max().item() < 1e-3


@pytest.mark.gpu
@needs_sm90
def test_gpu_negative_controls(monkeypatch):
    """The harness catches a kernel that drops an option: the Gluon answers with sinks, with the other
    sinks mode, with soft-capping and with ALiBi each differ from the reference without them."""
    any_width_is_wide(monkeypatch)
    launches = count_gluon_launches(monkeypatch)
    q, k, v, cu = make_qkv([700, 300], 4, 1, 128, torch.bfloat16)
    sinks = torch.full((4,), 3.0, device="cuda")
    plain = reference(q, k, v, cu, window=(200, -1))
    for kw in (dict(sinks=sinks), dict(sinks=sinks, sinks_mode="bias_key0"), dict(softcap=2.0),
               _alibi(4, True)):  # fmt: skip
        out = run(q, k, v, cu, 700, window=(200, -1), **kw)
        assert compare(out, reference(q, k, v, cu, window=(200, -1), **kw))
        assert not compare(out, plain), kw
    denom = run(q, k, v, cu, 700, window=(200, -1), sinks=sinks)
    assert not compare(denom, reference(q, k, v, cu, window=(200, -1), sinks=sinks, sinks_mode="bias_key0"))
    assert len(launches) == 5
