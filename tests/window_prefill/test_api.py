"""window_prefill API: both entry points agree, strided views, skipping proof, bad inputs, validation."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE, ON_GPU, compiled_variants, poison
from wp_util import check_graph_replay, cu_of, make_qkv, reference, run, tile_key_range

from attn_reference import compare
from window_prefill import context_attention_fwd, window_prefill
from window_prefill.configs import Config


# ------------------------------------------------------------------------- both forms agree
@pytest.mark.parametrize(
    "sw_q,sw_k,window",
    [(None, None, (-1, -1)), (0, 0, (-1, -1)), (6, None, (6, -1)), (None, 4, (-1, 4)), (10, 3, (10, 3))],
)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidir"])
def test_forms_agree(sw_q, sw_k, window, causal):
    lens = [1, 37, 22]
    q, k, v, cu = make_qkv(lens, 2, 1, 32, torch.float16)
    sinks = torch.randn(2, dtype=torch.float32, device=DEVICE)
    for bias_key0 in (False, True):
        mode = "bias_key0" if bias_key0 else "denominator"
        ours = run(q, k, v, cu, 37, causal=causal, window=window, sinks=sinks, sinks_mode=mode)
        o = poison(torch.empty_like(q))
        lens_t = torch.tensor(lens, dtype=torch.int64, device=DEVICE)
        context_attention_fwd(
            q, k, v, o, cu[:-1].long(), lens_t, 37, causal, None, sw_q, sw_k, sinks, bias_key0
        )
        assert torch.equal(o, ours), f"bias_key0={bias_key0}"
    ref = reference(q, k, v, cu, causal=causal, window=window, sinks=sinks, sinks_mode="bias_key0")
    assert compare(ours, ref)


def test_context_attention_fwd_start_loc_forms_and_gaps():
    """b_start_loc int32 or int64; sequences need not be packed back to back: tokens in the gaps are
    never written."""
    lens = [12, 30, 5]
    starts = [3, 20, 55]  # gaps at 0..2, 15..19, 50..54, 60..63
    total = 64
    q = torch.randn(total, 2, 32, dtype=torch.float16, device=DEVICE)
    k = torch.randn(total, 1, 32, dtype=torch.float16, device=DEVICE)
    v = torch.randn(total, 1, 32, dtype=torch.float16, device=DEVICE)
    b_seq_len = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    outs = []
    for b_start_loc in (
        torch.tensor(starts, dtype=torch.int32, device=DEVICE),
        torch.tensor(starts, dtype=torch.int64, device=DEVICE),
    ):
        o = poison(torch.empty_like(q))
        ret = context_attention_fwd(
            q, k, v, o, b_start_loc, b_seq_len, 30, True, sliding_window_q=7, validate=True
        )
        assert ret is o
        outs.append(o)
    written = torch.zeros(total, dtype=torch.bool)
    for s, n in zip(starts, lens, strict=True):
        written[s : s + n] = True
        sl = slice(s, s + n)
        ref = reference(q[sl], k[sl], v[sl], cu_of([n]), causal=True, window=(7, -1))
        assert compare(outs[0][sl], ref)
    assert torch.equal(outs[0][written.to(DEVICE)], outs[1][written.to(DEVICE)])
    assert torch.isnan(outs[0][~written.to(DEVICE)]).all(), "tokens outside every sequence were written"


def test_noncontiguous_views():
    """q/k/v as slices of one packed qkv projection, o as a slice of a wider buffer: no copies needed."""
    lens = [19, 40]
    total, heads, kv_heads, d = sum(lens), 4, 2, 32
    qkv = torch.randn(total, (heads + 2 * kv_heads) * d, dtype=torch.float16, device=DEVICE)
    q = qkv[:, : heads * d].view(total, heads, d)
    k = qkv[:, heads * d : (heads + kv_heads) * d].view(total, kv_heads, d)
    v = qkv[:, (heads + kv_heads) * d :].view(total, kv_heads, d)
    assert not q.is_contiguous() and not k.is_contiguous()
    wide = poison(torch.empty(total, heads, d + 16, dtype=torch.float16, device=DEVICE))
    out = wide[:, :, :d]
    cu = cu_of(lens)
    window_prefill(q, k, v, cu, 40, causal=False, window=(5, 9), out=out)
    ref = reference(q.contiguous(), k.contiguous(), v.contiguous(), cu, causal=False, window=(5, 9))
    assert compare(out, ref)
    assert torch.isnan(wide[:, :, d:]).all(), "padding columns of the output buffer were written"
    # the same data contiguous gives the same bits
    assert torch.equal(
        run(q.contiguous(), k.contiguous(), v.contiguous(), cu, 40, causal=False, window=(5, 9)), out
    )


def test_returns_fresh_output():
    q, k, v, cu = make_qkv([9, 17], 2, 1, 32, torch.float16)
    out = window_prefill(q, k, v, cu, 17, window=(4, -1))
    assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
    assert compare(out, reference(q, k, v, cu, window=(4, -1)))


def test_empty_inputs():
    q, k, v, _ = make_qkv([0], 2, 1, 32, torch.float16)
    out = window_prefill(q, k, v, cu_of([0]), 0)
    assert out.shape == (0, 2, 32)
    q, k, v, cu = make_qkv([0, 5, 0], 2, 1, 32, torch.float16)
    out = run(q, k, v, cu, 5, window=(2, -1))
    assert compare(out, reference(q, k, v, cu, window=(2, -1)))
    out = window_prefill(q, k, v, cu_of([]), 0)  # batch 0: nothing launched
    assert out.shape == q.shape


def test_huge_window_is_unbounded():
    q, k, v, cu = make_qkv([30, 7], 2, 1, 32, torch.float16)
    a = run(q, k, v, cu, 30, causal=False, window=(2**31 - 1, 2**40))
    b = run(q, k, v, cu, 30, causal=False, window=(-1, -1))
    assert torch.equal(a, b)


# ------------------------------------------------------------------------- skipping proof
SKIP_CONFIGS = [Config(16, 16, 1, 1), Config(32, 16, 1, 1), Config(16, 32, 1, 1)]
SKIP_CASES = [
    (False, (20, 5), None),
    (True, (20, -1), None),
    (True, (9, -1), "bias_key0"),
    (False, (-1, 3), None),
]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the NaN control run
@pytest.mark.parametrize("causal,window,sinks_mode", SKIP_CASES)
@pytest.mark.parametrize("config", SKIP_CONFIGS, ids=lambda c: f"{c.block_m}x{c.block_n}")
def test_skipping_proof(causal, window, sinks_mode, config):
    """For each query tile (BLOCK_M of the config in use), K/V at every position no row of the tile may
    see -- the rest of its own sequence and all other sequences -- is NaN. The tile's rows must stay
    finite and match the reference computed from the clean inputs: those positions are never read."""
    lens = [70, 23]
    seq = 0
    q, k, v, cu = make_qkv(lens, 2, 1, 32, torch.float16)
    sinks = torch.randn(2, dtype=torch.float32, device=DEVICE) if sinks_mode else None
    mode = sinks_mode or "denominator"
    ref = reference(q, k, v, cu, causal=causal, window=window, sinks=sinks, sinks_mode=mode)
    bm = config.block_m
    most_skipped, control = 0, None
    for m0 in range(0, lens[seq], bm):
        m1 = min(m0 + bm, lens[seq])
        lo, hi = tile_key_range(m0, m1, lens[seq], causal, window)
        k_nan = torch.full_like(k, float("nan"))
        v_nan = torch.full_like(v, float("nan"))
        k_nan[lo:hi] = k[lo:hi]
        v_nan[lo:hi] = v[lo:hi]
        out = run(q, k_nan, v_nan, cu, max(lens), causal=causal, window=window, sinks=sinks, sinks_mode=mode,
                  config=config)  # fmt: skip
        rows = slice(m0, m1)
        assert torch.isfinite(out[rows]).all(), f"tile rows [{m0}, {m1}) read a key outside [{lo}, {hi})"
        c = compare(out[rows], ref[rows])
        assert c, f"tile [{m0}, {m1}): {c}"
        if lens[seq] - (hi - lo) > most_skipped:
            most_skipped, control = lens[seq] - (hi - lo), (rows, k_nan, v_nan)
    assert control is not None, "the case never skips anything: the test would prove nothing"
    # control: the same NaN fill with the mask switched off (full attention) does poison the tile
    rows, k_nan, v_nan = control
    out = run(q, k_nan, v_nan, cu, max(lens), causal=False, window=(-1, -1), config=config)
    assert not torch.isfinite(out[rows]).all()


# ------------------------------------------------------------------------- bad inputs
def _inputs(total=24, heads=4, kv_heads=2, d=32, dtype=torch.float16):
    q = torch.randn(total, heads, d, dtype=dtype, device=DEVICE)
    k = torch.randn(total, kv_heads, d, dtype=dtype, device=DEVICE)
    v = torch.randn(total, kv_heads, d, dtype=dtype, device=DEVICE)
    return q, k, v


def _wp(**over):
    q, k, v = _inputs()
    args = dict(q=q, k=k, v=v, cu_seqlens=cu_of([10, 14]), max_seqlen=14)
    args.update(over)
    kw = {n: args.pop(n) for n in list(args) if n not in ("q", "k", "v", "cu_seqlens", "max_seqlen")}
    return lambda: window_prefill(
        args["q"], args["k"], args["v"], args["cu_seqlens"], args["max_seqlen"], **kw
    )


def _caf(**over):
    q, k, v = _inputs()
    cu = cu_of([10, 14])
    args = dict(
        q=q, k=k, v=v, o=torch.empty_like(q), b_start_loc=cu[:-1], b_seq_len=cu.diff(), max_input_len=14
    )
    args.update(over)
    return lambda: context_attention_fwd(**args)


_q, _k, _v = _inputs()
BAD_INPUTS = [
    ("q 2-D", _wp(q=_q[:, 0]), ValueError, "q"),
    ("k 4-D", _wp(k=_k[None]), ValueError, "k"),
    ("k head_dim", _wp(k=_inputs(d=16)[1]), ValueError, "head_dim"),
    (
        "heads not divisible",
        _wp(k=_inputs(kv_heads=3)[1], v=_inputs(kv_heads=3)[2]),
        ValueError,
        "num_kv_heads",
    ),
    ("k tokens", _wp(k=_k[:20]), ValueError, "k"),
    ("v shape", _wp(v=_inputs(kv_heads=1)[2]), ValueError, "v"),
    ("k dtype", _wp(k=_k.float()), TypeError, "k"),
    ("v dtype", _wp(v=_v.float()), TypeError, "v"),
    ("q int dtype", _wp(q=_q.to(torch.int32), k=_k.to(torch.int32), v=_v.to(torch.int32)), TypeError, "q"),
    ("q not a tensor", _wp(q=_q.tolist()), TypeError, "q"),
    ("o dtype", _caf(o=torch.empty_like(_q, dtype=torch.float32)), TypeError, "o"),
    ("o shape", _caf(o=torch.empty(24, 4, 16, dtype=torch.float16, device=DEVICE)), ValueError, "o"),
    ("out shape", _wp(out=torch.empty(24, 2, 32, dtype=torch.float16, device=DEVICE)), ValueError, "out"),
    ("q last stride", _wp(q=_inputs(d=32)[0].transpose(1, 2).contiguous().transpose(1, 2)), ValueError, "q"),
    ("k device", _wp(k=torch.empty(24, 2, 32, dtype=torch.float16, device="meta")), ValueError, "k"),
    ("head_dim > 256", _wp(**dict(zip("qkv", _inputs(d=320), strict=True))), ValueError, "head_dim"),
    ("window < -1", _wp(window=(-2, 4)), ValueError, "window"),
    ("window right < -1", _wp(window=(4, -5)), ValueError, "window"),
    ("window not a pair", _wp(window=(3,)), ValueError, "window"),
    ("window float", _wp(window=(3.0, 1)), TypeError, "window"),
    ("sinks shape", _wp(sinks=torch.zeros(2, dtype=torch.float32, device=DEVICE)), ValueError, "sinks"),
    ("sinks dtype", _wp(sinks=torch.zeros(4, dtype=torch.float64, device=DEVICE)), TypeError, "sinks"),
    ("sinks_mode", _wp(sinks_mode="bias"), ValueError, "sinks_mode"),
    ("cu_seqlens dtype", _wp(cu_seqlens=cu_of([10, 14]).float()), TypeError, "cu_seqlens"),
    ("cu_seqlens 2-D", _wp(cu_seqlens=cu_of([10, 14])[None]), ValueError, "cu_seqlens"),
    ("max_seqlen tensor", _wp(max_seqlen=torch.tensor(14)), TypeError, "max_seqlen"),
    ("max_seqlen < 0", _wp(max_seqlen=-1), ValueError, "max_seqlen"),
    ("softmax_scale", _wp(softmax_scale="0.1"), TypeError, "softmax_scale"),
    ("softcap negative", _wp(softcap=-1.0), ValueError, "softcap"),
    ("softcap nan", _wp(softcap=float("nan")), ValueError, "softcap"),
    ("softcap bool", _wp(softcap=True), TypeError, "softcap"),
    (
        "b_start_loc length",
        _caf(b_start_loc=torch.zeros(5, dtype=torch.int32, device=DEVICE)),
        ValueError,
        "b_start_loc",
    ),
    ("b_seq_len dtype", _caf(b_seq_len=torch.tensor([10.0, 14.0], device=DEVICE)), TypeError, "b_seq_len"),
    ("b_seq_len 2-D", _caf(b_seq_len=torch.tensor([[10, 14]], device=DEVICE)), ValueError, "b_seq_len"),
    ("sliding_window_q float", _caf(sliding_window_q=2.5), TypeError, "sliding_window_q"),
    ("max_input_len float", _caf(max_input_len=14.0), TypeError, "max_input_len"),
    (
        "batch > 65535",
        _wp(cu_seqlens=torch.zeros(65537, dtype=torch.int32, device=DEVICE)),
        ValueError,
        "batch",
    ),
]


@pytest.mark.parametrize("n_starts", [1, 3, 4])
def test_start_loc_and_seq_len_lengths_must_match(n_starts, monkeypatch):
    """b_start_loc and b_seq_len of different lengths (also b_start_loc = cu_seqlens, one entry more)
    are rejected with a message naming both, without validate and without reading device values."""
    monkeypatch.delenv("PREFILL_VALIDATE", raising=False)
    fn = _caf(b_start_loc=torch.zeros(n_starts, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError) as info:
        fn()
    msg = str(info.value)
    assert "b_start_loc" in msg and "b_seq_len" in msg and f"got {n_starts} and 2" in msg, msg


@pytest.mark.parametrize("fn,exc,needle", [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS])
def test_bad_inputs(fn, exc, needle):
    with pytest.raises(exc) as info:
        fn()
    assert needle in str(info.value), f"message does not name {needle!r}: {info.value}"


# ------------------------------------------------------------------------- device-value validation
VALIDATE_CASES = [
    ("b_seq_len beyond tensors", _caf(b_seq_len=torch.tensor([10, 15], device=DEVICE)), "b_seq_len"),
    ("negative b_seq_len", _caf(b_seq_len=torch.tensor([10, -1], device=DEVICE)), "b_seq_len"),
    ("max_input_len too small", _caf(max_input_len=12), "max_input_len"),
    ("cu_seqlens decreasing", _wp(cu_seqlens=torch.tensor([0, 14, 10], device=DEVICE)), "cu_seqlens"),
    ("cu_seqlens beyond tensors", _wp(cu_seqlens=torch.tensor([0, 10, 25], device=DEVICE)), "cu_seqlens"),
    ("max_seqlen too small", _wp(max_seqlen=13), "max_seqlen"),
]


@pytest.mark.parametrize("fn,needle", [c[1:] for c in VALIDATE_CASES], ids=[c[0] for c in VALIDATE_CASES])
def test_validate_env(fn, needle, monkeypatch):
    monkeypatch.setenv("PREFILL_VALIDATE", "1")
    with pytest.raises(ValueError) as info:
        fn()
    assert needle in str(info.value), str(info.value)


def test_validate_flag():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match="cu_seqlens"):
        window_prefill(q, k, v, torch.tensor([0, 14, 10], device=DEVICE), 14, validate=True)
    with pytest.raises(ValueError, match="max_input_len"):
        context_attention_fwd(q, k, v, torch.empty_like(q), cu_of([10, 14])[:-1], cu_of([10, 14]).diff(), 9,
                              validate=True)  # fmt: skip


@pytest.mark.skipif(ON_GPU, reason="CPU check; on GPU the same call path is graph-captured in the GPU tests")
def test_default_path_never_syncs(monkeypatch):
    """validate=False: no .item() / .tolist() / .cpu() on the call path (checked by patching them)."""
    q, k, v, cu = make_qkv([9, 17], 2, 1, 32, torch.float16)
    ref = reference(q, k, v, cu, window=(4, -1))

    def boom(*args, **kwargs):
        raise AssertionError("host sync on the default call path")

    for name in ("item", "tolist", "cpu"):
        monkeypatch.setattr(torch.Tensor, name, boom)
    out = window_prefill(q, k, v, cu, 17, window=(4, -1))
    monkeypatch.undo()
    assert compare(out, ref)


@pytest.mark.gpu
def test_gpu_cuda_graph_capture():
    q, k, v, cu = make_qkv([100, 1, 700], 4, 2, 64, torch.float16)
    check_graph_replay(q, k, v, cu, 700, window=(63, -1))


@pytest.mark.gpu
def test_gpu_compiled_variants_do_not_depend_on_lengths():
    from window_prefill.kernel import _fwd_kernel

    q, k, v, cu = make_qkv([100, 1, 700], 4, 2, 64, torch.float16)
    window_prefill(q, k, v, cu, 700, window=(63, -1))
    before = compiled_variants(_fwd_kernel)
    for lens in ([5], [333, 4000, 17], [2048] * 7):
        q, k, v, cu = make_qkv(lens, 4, 2, 64, torch.float16)
        window_prefill(q, k, v, cu, max(lens), window=(63 + len(lens), -1))
    assert compiled_variants(_fwd_kernel) == before


# ------------------------------------------------------------------------- drop-in for vLLM
def _vllm_context_attention_fwd():
    import sys
    from pathlib import Path

    peers = Path(__file__).resolve().parents[2] / ".peers"
    if str(peers) not in sys.path:
        sys.path.append(str(peers))
    try:
        from vllm.v1.attention.ops.triton_prefill_attention import context_attention_fwd as peer
    except Exception as exc:  # pragma: no cover - peers are optional
        pytest.skip(f"vLLM peer not importable: {exc}")
    return peer


@pytest.mark.parametrize(
    "is_causal,sw_q,sw_k,sinks_form",
    [
        (True, None, None, "denominator"),
        (True, 8, None, "bias_key0"),
        (False, 5, 7, None),
        (False, None, 3, "bias_key0"),
    ],
)
def test_matches_vllm_peer(is_causal, sw_q, sw_k, sinks_form):
    """Same arguments, same answer as vLLM 0.33's context_attention_fwd (run from .peers)."""
    peer = _vllm_context_attention_fwd()
    lens = [1, 37, 50, 16]
    q, k, v, cu = make_qkv(lens, 4, 2, 32, torch.float16)
    b_start_loc, b_seq_len = cu[:-1].clone(), cu.diff()
    sinks = torch.randn(4, dtype=torch.float32, device=DEVICE) if sinks_form else None
    bias_key0 = sinks_form == "bias_key0"
    theirs, ours = poison(torch.empty_like(q)), poison(torch.empty_like(q))
    peer(q, k, v, theirs, b_start_loc, b_seq_len, 50, is_causal, None, sw_q, sw_k, sinks, bias_key0)
    context_attention_fwd(
        q, k, v, ours, b_start_loc, b_seq_len, 50, is_causal, None, sw_q, sw_k, sinks, bias_key0
    )
    c = compare(ours, theirs.double())
    assert c, str(c)


def test_offsets_fit_int32_host_check():
    """The host check behind int32 token offsets (``Problem.wide_offsets``): every element of a 3-D
    K/V within 2**31 - 1 elements of its first one, strides >= 0; an empty tensor fits."""
    from window_prefill.launch import _fits_int32

    assert _fits_int32((2**20, 2, 8), (16, 8, 1))
    assert _fits_int32((2**27, 2, 8), (16, 8, 1)) and not _fits_int32((2**27 + 1, 2, 8), (16, 8, 1))
    assert not _fits_int32((2**20, 1, 8), (2**11 + 8, 8, 1))  # a wide token stride
    assert not _fits_int32((4, 2, 8), (16, -8, 1))
    assert _fits_int32((0, 2, 8), (2**40, 8, 1))


def test_prime_triton_on_gpu_launches_only(monkeypatch):
    """Triton's one-time setup (``launch._prime_triton``) runs before a first launch on a GPU only (a
    CPU launch, in the interpreter, never calls it); it marks itself done and never raises (here
    perhaps without a GPU driver)."""
    import window_prefill.launch as wl

    calls = []
    monkeypatch.setattr(wl, "_primed", False)
    real = wl._prime_triton
    monkeypatch.setattr(wl, "_prime_triton", lambda: calls.append(1))
    q, k, v, cu = make_qkv([5, 3], 2, 1, 16, torch.float32)
    window_prefill(q, k, v, cu, 5, causal=True)
    assert calls == ([1] if q.is_cuda else []) and wl._primed is False
    real()
    assert wl._primed is True
