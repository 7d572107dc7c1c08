"""The warp-specialised Gluon kernel (window_prefill.gluon_kernel) and when the launcher picks it.

On the CPU: which inputs the launcher hands to it (never under the interpreter, never for fp32, padded
heads, sinks, soft-capping or strides TMA cannot take), the config table's flag, and that the kernel
compiles for sm90 with the installed Triton (offline, ``GPUTarget("cuda", 90, 32)``) within the shared
memory of one H100/H200 program. On an sm90 GPU: the kernel against the float64 reference (ragged
batches, windows, GQA, both 16-bit dtypes, heads 64 and 128, LSE, strided views, the vLLM form,
CUDA-graph capture) into NaN-poisoned buffers, with a count proving it ran; the skipping proof with
NaN at every position a tile may not see; a negative control (a wrong mask is caught); no recompiles
when lengths change; and the Triton kernel where the Gluon one does not apply.
"""

from __future__ import annotations

import pytest
import torch
from conftest import (
    compile_gluon_for_sm90,
    compiled_variants,
    count_gluon_launches,
    needs_sm90,
    poison,
    refuse_gluon,
)
from wp_util import check_graph_replay, make_qkv, reference, run, tile_key_range

import window_prefill.interface as itf
from attn_reference import compare
from window_prefill import context_attention_fwd, window_prefill
from window_prefill.configs import CONFIGS, Config

GLUON_CONFIG = Config(128, 128, 8, 3, True, True)  # routes any head 64/128 problem to the Gluon kernel


@pytest.fixture
def gluon_launches(monkeypatch):
    """Launches the Gluon kernel took (``conftest.count_gluon_launches``), forced past the config flag
    and the width rule (``_GLUON_FORCE``)."""
    taken = count_gluon_launches(monkeypatch, itf)
    monkeypatch.setattr(itf, "_GLUON_FORCE", True)
    return taken


# ------------------------------------------------------------------------- CPU: dispatch and table
def _launch_args(q, k, v, **over):
    starts = torch.tensor([0, q.shape[0]], dtype=torch.int32, device=q.device)
    kw = dict(
        causal=True, window_left=-1, window_right=-1, softmax_scale=0.1, sinks=None, softcap=0.0, lse=None,
        arch="sm90",
    )  # fmt: skip
    kw.update(over)
    return (q, k, v, torch.empty_like(q), starts, None, q.shape[0], 1), kw


@pytest.mark.parametrize(
    "case",
    [
        "interpreter_arch",
        "sm80",
        "fp32",
        "head_96",
        "head_32",
        "sinks",
        "softcap",
        "negative_scale",
        "k_head_gap",
    ],
)
def test_gluon_not_taken(case):
    """Inputs the Gluon kernel does not take: ``_gluon_launch`` returns False before any launch."""
    d = {"head_96": 96, "head_32": 32}.get(case, 128)
    dtype = torch.float32 if case == "fp32" else torch.float16
    q = torch.randn(8, 2, d, dtype=dtype)
    k = torch.randn(8, 1, d, dtype=dtype)
    v = torch.randn(8, 1, d, dtype=dtype)
    over = {
        "interpreter_arch": {"arch": "interpreter"},
        "sm80": {"arch": "sm80"},
        "sinks": {"sinks": torch.zeros(2)},
        "softcap": {"softcap": 30.0},
        "negative_scale": {"softmax_scale": -0.1},
    }.get(case, {})
    if case == "k_head_gap":  # one kv head's features are contiguous but heads are 2 * d apart
        if itf._gluon_fwd_kernel is None:
            pytest.skip("this Triton has no Gluon")
        k = torch.randn(8, 1, 2 * d, dtype=dtype)[:, :, :d]
    args, kw = _launch_args(q, k, v, **over)
    assert itf._gluon_launch(*args, **kw) is False


def test_gluon_config_flag(monkeypatch):
    """The table asks for the Gluon kernel at sm90 16-bit heads 64, 128, 256 only (the timed entries), and
    an explicit config's flag survives the custom op's int encoding."""
    from window_prefill import ops

    flagged = {key for key, cfg in CONFIGS.items() if cfg.gluon}
    assert flagged == {("sm90", hd, "16bit", causal) for hd in (64, 128, 256) for causal in (False, True)}
    assert Config(64, 32, 4, 3).gluon is False  # positional configs keep their meaning
    seen = []
    orig = itf._launch_fwd

    def spy(*args, **kwargs):
        seen.append(kwargs["config"])
        return orig(*args, **kwargs)

    monkeypatch.setattr(itf, "_launch_fwd", spy)
    q, k, v, cu = make_qkv([20, 9], 2, 1, 32, torch.float16)
    for cfg in (GLUON_CONFIG, Config(16, 16, 1, 1, True, False), Config(16, 16, 1, 1, False, True)):
        window_prefill(q, k, v, cu, 20, config=cfg)
    assert seen == [GLUON_CONFIG, Config(16, 16, 1, 1, True, False), Config(16, 16, 1, 1, False, True)]
    assert ops.config_ints(GLUON_CONFIG)[-1] == 3


_COMPILE_SCRIPT = """
import window_prefill.interface as itf

for head_dim, lse in ((128, False), (64, True), (256, False)):
    bn = 64 if head_dim == 256 else 128
    lay_q = gl.NVMMASharedLayout.get_default_for([64, head_dim], gl.bfloat16)
    lay_k = gl.NVMMASharedLayout.get_default_for([bn, head_dim], gl.bfloat16)
    sig = {
        "Q_desc": f"tensordesc<bf16[64, {head_dim}],{lay_q!r}>",
        "K_desc": f"tensordesc<bf16[{bn}, {head_dim}],{lay_k!r}>",
        "V_desc": f"tensordesc<bf16[{bn}, {head_dim}],{lay_k!r}>",
        "O": "*bf16", "Starts": "*i32", "Lens": "*i32", "qk_scale": "fp32", "window_left": "i32",
        "window_right": "i32", "group_size": "i32", "stride_ot": "i32", "stride_oh": "i32",
        "Lse": "*fp32" if lse else "constexpr", "stride_lse_h": "i32" if lse else "constexpr",
    }
    consts = dict(
        HEAD_DIM=head_dim, BLOCK_M=128, BLOCK_N=bn, IS_CAUSAL=True, HAS_LEFT=True, HAS_RIGHT=False,
        LENS_FROM_STARTS=True, RETURN_LSE=lse, NUM_STAGES=itf._GLUON_STAGES,
    )
    if not lse:
        consts.update(Lse=None, stride_lse_h=None)
    _, plain = compile_sm90(itf._gluon_fwd_kernel, sig, consts)
    if head_dim == 128:  # candidate FREE_WAITS: no barrier left before a free wait, none added
        import prefill_runtime.host as host

        _, free = compile_sm90(itf._gluon_fwd_kernel, sig, consts, free_waits=True)
        n = [p.asm["ptx"].count("bar.sync") + p.asm["ptx"].count("barrier.sync") for p in (plain, free)]
        assert host.drop_wait_barriers(free.asm["ptx"])[1] == 0 and n[1] <= n[0], n
"""


def test_gluon_kernel_compiles_for_sm90():
    """The kernel compiles for sm90 with the installed Triton (no GPU needed) in one program's shared
    memory (227 KiB), for both head sizes, with and without the LSE (and the candidate ``FREE_WAITS``
    at head 128)."""
    if itf._gluon_fwd_kernel is None:
        pytest.skip("this Triton has no Gluon")
    shared, out = compile_gluon_for_sm90(_COMPILE_SCRIPT)
    assert len(shared) == 4 and max(shared) <= 227 * 1024, out


@pytest.mark.parametrize(
    "causal,window,max_len,wide",
    [
        (True, (4095, -1), 32768, True),  # the LLM shape
        (True, (2046, -1), 32768, False),  # 2047 keys
        (True, (2047, -1), 32768, True),  # 2048 keys
        (False, (64, 64), 16384, False),  # the PR shape
        (False, (1024, 1024), 16384, True),  # 2049 keys
        (False, (1023, 1023), 16384, False),  # 2047
        (True, (-1, -1), 2047, False),  # unbounded, but no sequence is long enough
        (True, (-1, -1), 2048, True),
        (False, (-1, 0), 4096, True),  # non-causal, right side 0
        (False, (0, -1), 100000, True),
    ],
)
def test_gluon_width_rule(causal, window, max_len, wide):
    """Narrow bands (or short sequences) keep the Triton kernel: the rule is host arithmetic only."""
    assert itf._gluon_wide_enough(causal, window[0], window[1], max_len) is wide


# ------------------------------------------------------------------------- GPU (sm90)
GPU_CASES = [
    # lens, heads, kv_heads, head_dim, dtype, causal, window, lse
    ([4096], 8, 2, 128, torch.bfloat16, True, (1023, -1), False),
    ([300, 1000, 77, 1], 4, 1, 128, torch.float16, True, (200, -1), True),
    ([513, 129, 128, 700], 4, 4, 64, torch.bfloat16, False, (100, 30), True),
    ([1000, 33], 6, 2, 128, torch.bfloat16, False, (-1, -1), False),
    ([1000, 257], 6, 2, 128, torch.bfloat16, True, (-1, -1), True),
    ([900, 1300], 2, 1, 128, torch.bfloat16, False, (-1, 0), False),
    ([900, 1300], 2, 1, 64, torch.float16, True, (0, -1), False),
    ([2000], 4, 2, 128, torch.bfloat16, False, (5, 250), False),
    ([127, 128, 129, 255, 256, 257], 3, 1, 128, torch.float16, True, (128, -1), True),
    ([1500, 70], 4, 2, 256, torch.bfloat16, True, (700, -1), True),
    ([600, 65, 64], 2, 1, 256, torch.float16, False, (100, 40), False),
    ([5, 3], 2, 1, 128, torch.bfloat16, True, (-1, -1), False),
]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("free", [False, True])
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: f"{c[0][:2]}-h{c[3]}-{str(c[4])[6:]}-w{c[6]}")
def test_gpu_gluon_matches_reference(case, free, gluon_launches, monkeypatch):
    """The Gluon kernel against the reference (``free``: the candidate ``_GLUON_FREE_WAITS``)."""
    monkeypatch.setattr(itf, "_GLUON_FREE_WAITS", free)
    lens, heads, kv_heads, d, dtype, causal, window, want_lse = case
    q, k, v, cu = make_qkv(lens, heads, kv_heads, d, dtype)
    out = poison(torch.empty_like(q))
    res = window_prefill(
        q,
        k,
        v,
        cu,
        max(lens),
        causal=causal,
        window=window,
        out=out,
        return_lse=want_lse,
        config=GLUON_CONFIG,
    )
    assert len(gluon_launches) == 1, "the Gluon kernel did not run"
    ref = reference(q, k, v, cu, causal=causal, window=window)
    got = res[0] if want_lse else res
    c = compare(got, ref)
    assert c, c
    if want_lse:
        from attn_reference import attention_varlen

        _, ref_lse = attention_varlen(q, k, v, cu, cu, causal=causal, window=window, return_lse=True)
        assert torch.isfinite(res[1]).all()
        assert (res[1].double() - ref_lse).abs().max().item() < 1e-3


@pytest.mark.gpu
@needs_sm90
def test_gpu_gluon_default_route(gluon_launches, monkeypatch):
    """With no config given (the table) and nothing forced: a wide window takes the Gluon kernel at
    heads 64 and 128, a narrow one (or short sequences) the Triton kernel; both right."""
    monkeypatch.setattr(itf, "_GLUON_FORCE", False)
    for d in (64, 128):
        q, k, v, cu = make_qkv([2500, 300], 4, 1, d, torch.bfloat16)
        for causal, window, took in ((True, (2047, -1), 1), (False, (1500, 600), 1), (True, (255, -1), 0)):
            before = len(gluon_launches)
            out = run(q, k, v, cu, 2500, causal=causal, window=window)
            assert len(gluon_launches) - before == took, (d, causal, window)
            assert compare(out, reference(q, k, v, cu, causal=causal, window=window))
        q, k, v, cu = make_qkv([1000, 300], 4, 1, d, torch.bfloat16)
        before = len(gluon_launches)
        out = run(q, k, v, cu, 1000, causal=True)
        assert len(gluon_launches) == before, "sequences shorter than the width rule keep Triton"
        assert compare(out, reference(q, k, v, cu, causal=True))


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("causal,window", [(True, (150, -1)), (False, (40, 90)), (True, (-1, -1))])
def test_gpu_gluon_skipping_proof(causal, window, gluon_launches):
    """K/V NaN at every position no row of a 128-row tile may see (the rest of its sequence and the
    other sequence): each tile's rows stay finite and right. Edge blocks are read whole by TMA here, so
    this is what the V-row zeroing and the score mask must hold against."""
    lens = [600, 77]
    q, k, v, cu = make_qkv(lens, 2, 1, 128, torch.bfloat16)
    ref = reference(q, k, v, cu, causal=causal, window=window)
    for m0 in range(0, lens[0], 128):
        m1 = min(m0 + 128, lens[0])
        lo, hi = tile_key_range(m0, m1, lens[0], causal, window)
        k_nan, v_nan = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
        k_nan[lo:hi], v_nan[lo:hi] = k[lo:hi], v[lo:hi]
        out = run(q, k_nan, v_nan, cu, max(lens), causal=causal, window=window, config=GLUON_CONFIG)
        rows = slice(m0, m1)
        assert torch.isfinite(out[rows]).all(), f"tile [{m0}, {m1}) used a key outside [{lo}, {hi})"
        c = compare(out[rows], ref[rows])
        assert c, f"tile [{m0}, {m1}): {c}"
    assert len(gluon_launches) == -(-lens[0] // 128)


@pytest.mark.gpu
@needs_sm90
def test_gpu_gluon_negative_control(gluon_launches):
    """The harness catches a wrong kernel: the Gluon kernel run without its causal mask differs from the
    causal reference, and a NaN fill outside the window does poison rows when the window is dropped."""
    q, k, v, cu = make_qkv([500, 300], 2, 1, 128, torch.bfloat16)
    wrong = run(q, k, v, cu, 500, causal=False, window=(100, -1), config=GLUON_CONFIG)
    assert not compare(wrong, reference(q, k, v, cu, causal=True, window=(100, -1)))
    k_nan = k.clone()
    k_nan[:50] = float("nan")  # keys 0..49: outside the window of rows >= 150 of sequence 0
    out = run(q, k_nan, v, cu, 500, causal=True, window=(-1, -1), config=GLUON_CONFIG)
    assert not torch.isfinite(out[150:500]).all()
    assert len(gluon_launches) == 2


@pytest.mark.gpu
@needs_sm90
def test_gpu_gluon_strided_views_and_vllm_form(gluon_launches):
    """q/k/v as slices of one packed qkv tensor (token stride (H + 2 Hkv) * D) and the vLLM drop-in
    (starts + lengths) both take the Gluon kernel; a K whose heads are not D apart falls back."""
    lens, heads, kv_heads, d = [333, 901], 4, 2, 128
    total = sum(lens)
    qkv = torch.randn(total, heads + 2 * kv_heads, d, dtype=torch.bfloat16, device="cuda")
    q, k, v = qkv[:, :heads], qkv[:, heads : heads + kv_heads], qkv[:, heads + kv_heads :]
    cu = torch.tensor([0, lens[0], total], dtype=torch.int32, device="cuda")
    ref = reference(q, k, v, cu, causal=True, window=(200, -1))
    out = run(q, k, v, cu, max(lens), causal=True, window=(200, -1), config=GLUON_CONFIG)
    assert compare(out, ref) and len(gluon_launches) == 1
    o = poison(torch.empty_like(q))
    starts = cu[:-1].contiguous()
    seq_lens = (cu[1:] - cu[:-1]).contiguous()
    context_attention_fwd(q, k, v, o, starts, seq_lens, max(lens), is_causal=True, sliding_window_q=200)
    assert len(gluon_launches) == 2, "the vLLM form should take the Gluon kernel (default table)"
    assert compare(o, ref)
    k_gap = torch.randn(total, kv_heads, 2 * d, dtype=torch.bfloat16, device="cuda")[:, :, :d]
    k_gap.copy_(k)
    out = run(q, k_gap, v, cu, max(lens), causal=True, window=(200, -1), config=GLUON_CONFIG)
    assert len(gluon_launches) == 2, "a K whose heads are 2 D apart cannot be a TMA descriptor"
    assert compare(out, ref)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("what", ["softcap", "sinks", "fp32"])
def test_gpu_gluon_falls_back(what, gluon_launches):
    """Soft-capping, sinks and fp32 run the Triton kernel (right answers, no Gluon launch)."""
    dtype = torch.float32 if what == "fp32" else torch.bfloat16
    q, k, v, cu = make_qkv([300, 200], 4, 2, 128, dtype)
    kw = {"softcap": 20.0} if what == "softcap" else {}
    if what == "sinks":
        kw = {"sinks": torch.randn(4, device="cuda")}
    config = Config(16, 16, 4, 2, False, True) if what == "fp32" else GLUON_CONFIG  # fp32 tiles must fit
    out = run(q, k, v, cu, 300, causal=True, window=(100, -1), config=config, **kw)
    assert not gluon_launches
    assert compare(out, reference(q, k, v, cu, causal=True, window=(100, -1), **kw))


@pytest.mark.gpu
@needs_sm90
def test_gpu_gluon_cuda_graph_and_no_recompile(gluon_launches):
    """Captured in a CUDA graph it replays right; other lengths and batch sizes never recompile it."""
    q, k, v, cu = make_qkv([100, 1, 700], 4, 2, 128, torch.bfloat16)
    check_graph_replay(q, k, v, cu, 700, window=(63, -1))

    before = compiled_variants(itf._gluon_fwd_kernel)
    for lens in ([5], [333, 4000, 17], [2048] * 7):
        q, k, v, cu = make_qkv(lens, 4, 2, 128, torch.bfloat16)
        window_prefill(q, k, v, cu, max(lens), window=(63 + len(lens), -1))
    assert compiled_variants(itf._gluon_fwd_kernel) == before
    assert len(gluon_launches) == 5


def test_gluon_routing(monkeypatch):
    """The launcher's glue on the CPU: with a config that asks for the Gluon kernel, ``_gluon_launch`` is
    offered the call (window already normalised, ``cu_seqlens`` or ``(starts, lens)``, the LSE buffer)
    only when the width rule holds or ``_GLUON_FORCE`` is set, never with ``_GLUON`` off; returning
    False leaves the Triton kernel to write the right answer."""
    seen = refuse_gluon(monkeypatch, itf)
    monkeypatch.setattr(itf, "_GLUON_MIN_WIDTH", 24)  # the test sequences are short
    q, k, v, cu = make_qkv([30, 9], 2, 1, 32, torch.float16)
    cfg = Config(16, 16, 1, 1, False, True)
    out = run(q, k, v, cu, 30, causal=True, window=(40, -1), config=cfg)  # 30 keys visible: offered
    assert compare(out, reference(q, k, v, cu, causal=True, window=(40, -1)))
    assert len(seen) == 1 and seen[0]["window_left"] == 40 and seen[0]["window_right"] == -1
    assert seen[0]["lse"] is None and seen[0]["causal"] is True
    run(q, k, v, cu, 30, causal=True, window=(10, -1), config=cfg)  # 11 keys: not offered
    assert len(seen) == 1
    window_prefill(q, k, v, cu, 30, causal=False, window=(-1, -1), config=cfg, return_lse=True)
    assert len(seen) == 2 and seen[1]["lse"] is not None and seen[1]["causal"] is False
    run(q, k, v, cu, 30, causal=True, window=(40, -1), config=Config(16, 16, 1, 1))  # flag off
    assert len(seen) == 2
    monkeypatch.setattr(itf, "_GLUON_FORCE", True)
    run(q, k, v, cu, 30, causal=True, window=(3, -1), config=Config(16, 16, 1, 1))  # forced
    assert len(seen) == 3
    monkeypatch.setattr(itf, "_GLUON", False)
    run(q, k, v, cu, 30, causal=True, window=(40, -1), config=cfg)
    assert len(seen) == 3
