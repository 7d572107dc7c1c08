"""window_prefill.plan: the one kernel choice, as data, on the CPU.

Every head size, dtype, causal/window/sinks/softcap/LSE option and both API forms against the
rules (sm90 against the other architectures, the Gluon/Triton boundary of every Gluon condition);
what ``describe`` reads from tensors (TMA-able rows, alignment, int64 offsets); the cache (bounded,
keyed without lengths) never serving a stale plan or descriptor to a call with new pointers,
lengths or batch; and that a call issues no torch op besides the one custom op.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import DEVICE, ON_GPU
from wp_util import cu_of, make_qkv, reference, run, spy_triton

import window_prefill.launch as wl
import window_prefill.plan as wp_plan
from attn_reference import compare
from window_prefill import Config, context_attention_fwd, explain, window_prefill
from window_prefill.configs import ARCHS, CONFIGS, block_d, dtype_class, head_dim_bucket
from window_prefill.plan import Problem, plan, wide_window

HEADS = [32, 64, 80, 96, 128, 192, 256]
DTYPES = [torch.float16, torch.bfloat16, torch.float32]
LENGTH_WORDS = ("len", "batch", "seq", "token", "max", "num_q", "total")


def problem(**over) -> Problem:
    """A problem the Gluon kernel takes (sm90, bf16, head 128, causal, wide, TMA-able), changed by
    ``over``."""
    base = dict(
        dtype=torch.bfloat16, heads=8, kv_heads=2, head_dim=128, arch="sm90", causal=True, has_left=False,
        has_right=False, wide_window=True, sinks=False, bias_key0=False, alibi=False, softcap=0,
        scale_positive=True, cumulative_starts=True, return_lse=False, wide_offsets=False, q_tma=True,
        kv_tma=True, gluon=True, narrow_window=False,
    )  # fmt: skip
    return Problem(**{**base, **over})


def gluon_expected(p: Problem) -> bool:
    """The documented rule, restated."""
    cfg = p.config or CONFIGS[(p.arch if p.arch in ARCHS else "default", head_dim_bucket(p.head_dim),
                               dtype_class(p.dtype), p.causal)]  # fmt: skip
    return (
        cfg.gluon
        and p.gluon
        and p.arch == "sm90"
        and p.dtype != torch.float32
        and p.head_dim in (64, 128, 256)
        and (p.scale_positive or p.softcap > 0)
        and p.q_tma
        and p.kv_tma
        and p.wide_window
    )


# ------------------------------------------------------------------------------- the rules
@pytest.mark.parametrize("arch", ["sm90", "sm80", "gfx942", "gfx950", "default", "interpreter", "sm100"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", HEADS)
@pytest.mark.parametrize("causal", [True, False])
def test_plan_every_head_dtype_arch(arch, dtype, head_dim, causal):
    """Gluon exactly where the rule says (sm90 16-bit heads 64/128/256 only); otherwise Triton with the
    table's tiles, the padded head tile, IEEE dots for fp32, and TMA K/V only where the entry asks."""
    p = problem(arch=arch, dtype=dtype, head_dim=head_dim, causal=causal)
    lp = plan(p)
    cfg = CONFIGS[
        (arch if arch in ARCHS else "default", head_dim_bucket(head_dim), dtype_class(dtype), causal)
    ]
    assert lp.kernel == ("gluon" if gluon_expected(p) else "triton"), lp.reason
    c = lp.consts()
    assert c["HEAD_DIM"] == head_dim and c["IS_CAUSAL"] is causal
    if lp.kernel == "gluon":
        assert arch == "sm90" and dtype != torch.float32 and head_dim in (64, 128, 256)
        assert (lp.block_m, c["BLOCK_N"]) == (128, 64 if head_dim == 256 else 128)
        assert c["NUM_STAGES"] == wp_plan._GLUON_STAGES and lp.opts() == {"num_warps": 4}
        assert lp.reason.startswith("gluon:")
        fb = lp.get("fallback")
        assert fb.kernel == "triton" and fb.block_m == cfg.block_m
    else:
        assert (lp.block_m, c["BLOCK_N"], c["BLOCK_D"]) == (cfg.block_m, cfg.block_n, block_d(head_dim))
        assert lp.opts() == {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
        assert c["IEEE_FP32"] is (dtype == torch.float32)
        tma = cfg.tma and arch in ("sm90", "interpreter") and dtype != torch.float32
        assert c["TMA_KV"] is (tma and head_dim == block_d(head_dim))
        assert "not gluon:" in lp.reason


def test_wide_offsets_plan_64_rows_at_head_256():
    """64-bit offsets at head 256: the Triton plan (and a Gluon plan's fallback) takes 64 query rows."""
    entry = CONFIGS[("sm90", 256, "16bit", True)]
    narrow = plan(problem(head_dim=256, has_left=True, wide_window=False, wide_offsets=True))
    assert narrow.kernel == "triton" and narrow.block_m == 64 and narrow.consts()["WIDE_OFFSETS"]
    assert narrow.consts()["BLOCK_N"] == entry.block_n
    assert plan(problem(head_dim=256, has_left=True, wide_window=False)).block_m == entry.block_m
    wide = plan(problem(head_dim=256, wide_offsets=True))
    assert wide.kernel == "gluon" and wide.get("fallback").block_m == 64


GLUON_CFG = Config(128, 128, 8, 3, True, True)
REFUSALS = [
    ("no-gluon", dict(gluon=False), "no Gluon kernel"),
    ("sm80-table", dict(arch="sm80"), "table does not ask"),
    ("sm80-config", dict(arch="sm80", config=GLUON_CFG), "not sm90"),
    ("interpreter-config", dict(arch="interpreter", config=GLUON_CFG), "not sm90"),
    ("fp32-config", dict(dtype=torch.float32, config=GLUON_CFG), "float32"),
    ("head-96", dict(head_dim=96), "head size 96"),
    ("head-32", dict(head_dim=32), "head size 32"),
    ("scale", dict(scale_positive=False), "softmax_scale"),
    ("q-rows", dict(q_tma=False), "TMA"),
    ("kv-rows", dict(kv_tma=False), "TMA"),
    ("narrow", dict(wide_window=False), f"fewer than {wp_plan._GLUON_MIN_WIDTH[128]} keys"),
    ("config", dict(config=Config(64, 32, 4, 3)), "config does not ask"),
]


@pytest.mark.parametrize("over,why", [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_gluon_boundary(over, why):
    """Each Gluon condition alone, broken, gives the Triton kernel, and the reason names it."""
    assert plan(problem()).kernel == "gluon" and plan(problem(config=GLUON_CFG)).kernel == "gluon"
    lp = plan(problem(**over))
    assert lp.kernel == "triton" and why in lp.reason, lp.reason


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "opts",
    [dict(), dict(has_left=True), dict(has_left=True, has_right=True, causal=False), dict(return_lse=True),
     dict(cumulative_starts=False), dict(causal=False)],
    ids=["causal", "left", "band", "lse", "vllm-form", "bidir"],
)  # fmt: skip
def test_gluon_options_reach_its_constexprs(head_dim, dtype, opts):
    """The options the Gluon kernel takes (window sides, causality, the LSE, the vLLM form) are its
    constexprs; the fallback plan carries the same ones."""
    lp = plan(problem(head_dim=head_dim, dtype=dtype, **opts))
    assert lp.kernel == "gluon"
    p = problem(head_dim=head_dim, dtype=dtype, **opts)
    for plan_ in (lp, lp.get("fallback")):
        c = plan_.consts()
        assert (c["IS_CAUSAL"], c["HAS_LEFT"], c["HAS_RIGHT"]) == (p.causal, p.has_left, p.has_right)
        assert c["RETURN_LSE"] is p.return_lse and c["LENS_FROM_STARTS"] is p.cumulative_starts
    assert lp.consts()["SOFTCAP"] == 0 and lp.consts()["SINKS"] == 0


@pytest.mark.parametrize(
    "over,want",
    [
        (dict(sinks=True), dict(SINKS=1, SOFTCAP=0)),
        (dict(sinks=True, bias_key0=True), dict(SINKS=2)),
        (dict(softcap=2), dict(SOFTCAP=2, SINKS=0)),
        (dict(softcap=1, scale_positive=False), dict(SOFTCAP=1)),
        (dict(softcap=2, sinks=True, has_left=True), dict(SOFTCAP=2, SINKS=1, HAS_LEFT=True)),
        (dict(sinks=True, bias_key0=True, causal=False, has_left=True, has_right=True), dict(SINKS=2)),
        (dict(softcap=3), dict(SOFTCAP=3, SINKS=0)),  # a bounded cap: the consumers pin the max
        (dict(softcap=3, sinks=True), dict(SOFTCAP=2, SINKS=1)),  # a sink is past the cap's bounds
        (dict(softcap=3, sinks=True, bias_key0=True), dict(SOFTCAP=2, SINKS=2)),
        (dict(alibi=True), dict(HAS_ALIBI=True, SINKS=0, SOFTCAP=0)),
        (dict(alibi=True, softcap=3), dict(HAS_ALIBI=True, SOFTCAP=2)),  # ALiBi is past the cap's bounds
        (dict(alibi=True, sinks=True, has_left=True, narrow_window=True), dict(HAS_ALIBI=True, SINKS=1)),
    ],
)
def test_gluon_takes_sinks_and_softcap(over, want):
    """Sinks (both modes), soft-capping (either tanh form; with it a scale <= 0 too) and ALiBi run the
    Gluon kernel, as its ``SINKS`` / ``SOFTCAP`` / ``HAS_ALIBI`` constexprs (the pinned-max form 3 only
    without sinks or ALiBi); its Triton fallback keeps its own flags, the hardware tanh of form 3 as 2."""
    lp = plan(problem(**over))
    assert lp.kernel == "gluon", lp.reason
    c = lp.consts()
    assert {k: c[k] for k in want} == want
    fb = lp.get("fallback").consts()
    assert fb["HAS_SINKS"] is over.get("sinks", False) and fb["SOFTCAP"] == min(over.get("softcap", 0), 2)
    assert c["HAS_ALIBI"] is fb["HAS_ALIBI"] is over.get("alibi", False)


@pytest.mark.parametrize(
    "over,want",
    [
        (dict(sinks=True), dict(HAS_SINKS=True, BIAS_KEY0=False, FOLD_SCALE=True)),
        (dict(sinks=True, bias_key0=True), dict(HAS_SINKS=True, BIAS_KEY0=True, FOLD_SCALE=False)),
        (dict(scale_positive=False), dict(FOLD_SCALE=False)),
        (dict(scale_positive=False, softcap=2), dict(FOLD_SCALE=True, SOFTCAP=2)),
        (dict(softcap=1), dict(SOFTCAP=1, FOLD_SCALE=True)),
        (dict(wide_offsets=True), dict(WIDE_OFFSETS=True)),
        (dict(return_lse=True, sinks=True), dict(RETURN_LSE=True)),
        (dict(cumulative_starts=False, sinks=True), dict(LENS_FROM_STARTS=False)),
        (dict(kv_tma=False), dict(TMA_KV=False)),
        (dict(alibi=True), dict(HAS_ALIBI=True, FOLD_SCALE=False)),  # the bias is in log2 units
        (dict(alibi=True, softcap=2, sinks=True), dict(HAS_ALIBI=True, FOLD_SCALE=False, SOFTCAP=2)),
        (dict(), dict(FP8_OUT_MAX=0.0)),
        (dict(fp8_out_limit=57344.0, sinks=True), dict(FP8_OUT_MAX=57344.0, HAS_SINKS=True)),
    ],
)
def test_triton_options_reach_its_constexprs(over, want):
    """sm90 head 128 causal 16-bit (its entry asks for TMA K/V): each option sets its constexpr."""
    lp = plan(problem(**{"wide_window": False, **over}))
    assert lp.kernel == "triton"
    c = lp.consts()
    assert {k: c[k] for k in want} == want
    if "kv_tma" not in over:
        assert c["TMA_KV"] is True


@pytest.mark.parametrize(
    "causal,window,head,wide",
    [
        (True, (4095, -1), 128, True),  # the LLM shape
        (True, (62, -1), 128, False),  # 63 keys
        (True, (63, -1), 128, True),  # 64 keys
        (True, (126, -1), 256, False),  # 127 keys
        (True, (127, -1), 256, True),  # 128 keys
        (True, (127, -1), 64, False),  # head 64: from 1024 keys
        (True, (1022, -1), 64, False),  # 1023 keys
        (True, (1023, -1), 64, True),  # 1024 keys
        (True, (2047, -1), 64, True),
        (False, (32, 31), 128, True),  # 64 keys
        (False, (64, 64), 64, False),  # the PR shape (head 64): 129 keys
        (False, (31, 31), 128, False),  # 63
        (False, (512, 511), 64, True),  # 1024 keys
        (False, (256, 256), 64, False),  # 513 keys
        (True, (-1, -1), 64, True),  # unbounded: however short the sequences
        (True, (-1, 5), 128, True),  # a causal right side is 0 whatever it says
        (False, (-1, 0), 128, True),  # non-causal, right side 0
        (False, (0, -1), 64, True),
        (False, (10, 10), 128, False),
        (True, (4095, -1), 96, False),  # a head size the Gluon kernel has no entry for
    ],
)
def test_width_rule(causal, window, head, wide):
    """Narrow bands keep the Triton kernel: host arithmetic on the window and the head size alone (no
    length of the call), one flag of the problem."""
    assert wide_window(causal, window[0], window[1], head) is wide


def test_width_rule_covers_the_gluon_heads():
    """Every head size the Gluon kernel is written for has its own width (and no other does)."""
    assert set(wp_plan._GLUON_MIN_WIDTH) == set(wp_plan._GLUON_HEADS)
    assert all(type(w) is int and w >= 1 for w in wp_plan._GLUON_MIN_WIDTH.values())


def test_kernel_choice_does_not_depend_on_the_batch(monkeypatch):
    """On sm90 with the Gluon kernel offered, a sequence plans the same kernel and tiles alone and
    beside longer or shorter ones (an unbounded causal window, a wide band, a narrow one on the persistent
    form, a narrower one on the Triton kernel): the choice never reads a length, so a sequence's rows do
    not change with the batch around it."""
    monkeypatch.setattr(wl, "detect_arch", lambda device: "sm90")
    monkeypatch.setattr(wl, "_gluon_ok", True)
    monkeypatch.setenv("PREFILL_GLUON", "1")
    kw = dict(softmax_scale=0.1, sinks=None, bias_key0=False, softcap=0.0, return_lse=False)
    for window, kernel in (((-1, -1), "gluon"), ((4095, -1), "gluon"), ((127, -1), "gluon"),
                           ((62, -1), "triton")):  # fmt: skip
        plans = set()
        for lens in ([1000], [4000, 1000], [1000, 2500], [17, 1000, 1]):
            q, k, v, _ = make_qkv(lens, 16, 4, 128, torch.bfloat16)
            p = wl.describe(q, k, v, None, causal=True, window_left=window[0], window_right=window[1], **kw)
            plans.add(plan(p))
        assert len(plans) == 1, (window, plans)
        assert plans.pop().kernel == kernel, window


def test_table_flags_and_explicit_config(monkeypatch):
    """The table asks for the Gluon kernel at sm90 16-bit heads 64, 128, 256 only, and an explicit
    config's flags survive the custom op's int encoding on their way to the plan."""
    from window_prefill import ops

    flagged = {key for key, cfg in CONFIGS.items() if cfg.gluon}
    assert flagged == {("sm90", hd, "16bit", causal) for hd in (64, 128, 256) for causal in (False, True)}
    assert Config(64, 32, 4, 3).gluon is False  # positional configs keep their meaning
    seen = []
    orig = wl.forward

    def spy(*args, **kwargs):
        seen.append(kwargs["config"])
        return orig(*args, **kwargs)

    monkeypatch.setattr(wl, "forward", spy)
    q, k, v, cu = make_qkv([20, 9], 2, 1, 32, torch.float16)
    cfgs = [
        Config(128, 128, 8, 3, True, True),
        Config(16, 16, 1, 1, True, False),
        Config(16, 16, 1, 1, False, True),
    ]
    for cfg in cfgs:
        window_prefill(q, k, v, cu, 20, config=cfg)
    assert seen == cfgs
    assert ops.config_ints(cfgs[0])[-1] == 3
    assert explain(q, k, v, cu, 20, config=cfgs[1]).consts()["BLOCK_M"] == 16


def test_problem_holds_no_length():
    """No field of a problem is a sequence length, batch size or token count: one plan serves every
    batch of an engine (the Gluon width rule is the one boolean ``wide_window``)."""
    names = [f.name for f in dataclasses.fields(Problem)]
    assert not [n for n in names if any(w in n for w in LENGTH_WORDS)], names
    assert hash(problem()) == hash(problem()) and problem() == problem()


# ------------------------------------------------------------------------------- from tensors
def test_describe_reads_metadata_only():
    """``describe`` on CPU tensors: the options, TMA-able rows (packed qkv slices are; K whose heads are
    not ``head_dim`` apart, a base 2 bytes past 16-byte alignment, fp32 rows of 3 floats are not)."""
    q, k, v, _ = make_qkv([20, 9], 4, 2, 64, torch.float16)
    kw = dict(causal=True, window_left=5, window_right=-1, softmax_scale=0.1, sinks=None, bias_key0=False,
              softcap=0.0, return_lse=False)  # fmt: skip
    p = wl.describe(q, k, v, None, **kw)
    assert (p.heads, p.kv_heads, p.head_dim, p.dtype) == (4, 2, 64, torch.float16)
    assert p.has_left and not p.has_right and p.cumulative_starts and not p.wide_window
    assert p.q_tma and p.kv_tma and not p.wide_offsets and p.gluon is wl.gluon_offered()
    assert p.fp8_out_limit == 0.0 and wl.describe(q, k, v, None, out_dtype=q.dtype, **kw).fp8_out_limit == 0.0
    for fp8, top in ((torch.float8_e4m3fn, 448.0), (torch.float8_e5m2, 57344.0)):
        assert wl.describe(q, k, v, None, out_dtype=fp8, **kw).fp8_out_limit == top
    qkv = torch.randn(29, 8, 64, dtype=torch.float16, device=DEVICE)
    assert wl.describe(qkv[:, :4], qkv[:, 4:6], qkv[:, 6:], None, **kw).kv_tma
    gap = torch.randn(29, 2, 128, dtype=torch.float16, device=DEVICE)[:, :, :64]
    assert not wl.describe(q, gap, v, None, **kw).kv_tma
    flat = torch.randn(29 * 2 * 64 + 1, dtype=torch.float16, device=DEVICE)
    off = flat[1:].view(29, 2, 64)
    assert not wl.describe(q, k, off, None, **kw).kv_tma
    q3, k3, v3, _ = make_qkv([20, 9], 2, 1, 3, torch.float32)
    assert not wl.describe(q3, k3, v3, None, **kw).kv_tma  # 12-byte rows


def test_plan_cache_is_bounded_and_shared():
    assert plan.cache_info().maxsize == 256
    assert plan(problem()) is plan(problem())


def test_new_pointers_lengths_batch_reuse_the_plan_never_its_descriptors(monkeypatch):
    """Calls that differ in lengths, batch, max_len (same width class) and pointers share one plan
    (it holds no length or pointer); each launch still gets its own tensors, grid and freshly built TMA
    descriptors over the call's K and V, and each answer is right. A misaligned K is a new problem
    (pointer loads), never the aligned plan."""
    spy = spy_triton(monkeypatch)
    cfg = Config(16, 16, 1, 1, True)
    plans, calls = [], []
    for lens in ([37, 5], [50], [9, 30, 17, 1]):
        q, k, v, cu = make_qkv(lens, 2, 1, 32, torch.float16)
        plans.append(explain(q, k, v, cu, max(lens), window=(20, -1), config=cfg))
        out = run(q, k, v, cu, max(lens), window=(20, -1), config=cfg)
        assert compare(out, reference(q, k, v, cu, window=(20, -1)))
        calls.append((q, k, v, cu, len(lens), max(lens)))
    assert plans[0] is plans[1] is plans[2] and plans[0].consts()["TMA_KV"]
    for (grid, args, _), (q, k, v, cu, batch, n) in zip(spy.launches, calls, strict=True):
        assert grid == (-(-n // 16), 2, batch)
        assert args["Q"] is q and args["K"] is k and args["Starts"] is cu
        assert args["K_desc"].base is k and args["V_desc"].base is v
        assert list(args["K_desc"].shape) == [k.shape[0], 32]
    q, k, v, cu = make_qkv([37, 5], 2, 1, 32, torch.float16)
    flat = torch.randn(k.numel() + 1, dtype=torch.float16, device=DEVICE)
    k_off = flat[1:].view_as(k)
    k_off.copy_(k)
    p = explain(q, k_off, v, cu, 37, window=(20, -1), config=cfg)
    assert p is not plans[0] and p.consts()["TMA_KV"] is False
    out = run(q, k_off, v, cu, 37, window=(20, -1), config=cfg)
    assert spy.launches[-1][1]["K_desc"] is None
    assert compare(out, reference(q, k, v, cu, window=(20, -1)))


@pytest.mark.skipif(ON_GPU, reason="CPU check of the host path")
def test_default_path_issues_only_the_op(monkeypatch):
    """Per call the host issues exactly one torch op, the custom op (no copies, allocations or index
    math when ``out`` is given), and the op's body none at all: it only launches (a recorder here)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    launched = []

    class Recorder:
        arg_names = wl._fwd_kernel.arg_names

        def __getitem__(self, grid):
            return lambda *a, **k: launched.append(grid)

    monkeypatch.setattr(wl, "_fwd_kernel", Recorder())
    q, k, v, cu = make_qkv([9, 17], 2, 1, 32, torch.float16)
    out = torch.empty_like(q)
    lens, starts = cu.diff(), cu[:-1]
    sinks = torch.zeros(2, dtype=torch.float32)
    with Ops() as mode:
        window_prefill(q, k, v, cu, 17, window=(4, -1), out=out, sinks=sinks)
        context_attention_fwd(q, k, v, out, starts, lens, 17, True, None, 4)
    assert mode.ops == ["window_prefill.fwd.default"] * 2, mode.ops
    with Ops() as mode:
        wl.forward(q, k, v, out, cu, None, 17, causal=True, window_left=4, window_right=-1, softmax_scale=0.1,
                   sinks=None, bias_key0=False)  # fmt: skip
    assert mode.ops == [] and len(launched) == 3


def test_explain_matches_the_launch(monkeypatch):
    """``explain`` returns the plan the same call launches (here: the interpreter's table), checks
    its arguments like the call and launches nothing."""
    spy = spy_triton(monkeypatch)
    q, k, v, cu = make_qkv([12, 30], 4, 2, 64, torch.float16)
    kw = dict(causal=False, window=(3, 9), sinks=torch.randn(4, device=DEVICE), sinks_mode="bias_key0",
              return_lse=True)  # fmt: skip
    p = explain(q, k, v, cu, 30, **kw)
    assert not spy.launches
    window_prefill(q, k, v, cu, 30, **kw)
    ((grid, _, launched),) = spy.launches
    assert launched == {**p.consts(), **p.opts()} and grid[0] == -(-30 // p.block_m)
    with pytest.raises(ValueError, match="window"):
        explain(q, k, v, cu, 30, window=(-3, 1))
    # an empty batch launches nothing and plans as any batch of its window does
    assert explain(q, k, v, cu_of([]), 0).kernel == explain(q, k, v, cu, 30).kernel


@pytest.mark.parametrize("limit", [448.0, 57344.0])
def test_gluon_takes_fp8_outputs(limit):
    """An fp8 output runs the Gluon kernel, its format's largest value as ``OUT_MAX`` (the consumers'
    epilogue); the Triton fallback has it as ``FP8_OUT_MAX``; a 16-bit output compiles neither."""
    lp = plan(problem(fp8_out_limit=limit))
    assert lp.kernel == "gluon", lp.reason
    assert lp.consts()["OUT_MAX"] == limit and lp.get("fallback").consts()["FP8_OUT_MAX"] == limit
    plain = plan(problem())
    assert plain.consts()["OUT_MAX"] == 0.0 and plain.get("fallback").consts()["FP8_OUT_MAX"] == 0.0
