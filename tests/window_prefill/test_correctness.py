"""window_prefill against the float64 reference: attn_reference.attention_varlen, cu_seqlens_q = cu_seqlens_k.

CPU (Triton interpreter): fp16/fp32, short ragged batches with 16x16 tiles so every case crosses several
query and key tiles, including length-1 sequences and lengths that are not multiples of a tile.
GPU-marked: bf16, every head dim at moderate lengths, long sequences (4k-16k) with windows.
"""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE, DTYPES, ON_GPU, poison
from wp_util import cu_of, make_qkv, reference, run, run_plan, spy_triton

from attn_reference import attention_varlen, compare, compare_lse, negative_control
from window_prefill import explain, window_prefill
from window_prefill.configs import Config

LENS = [1, 37, 50, 16]  # ragged; 37 and 50 are not multiples of any tile
MAX_LEN = max(LENS)

# Every window form: none, left only, right only, both, asymmetric, diagonal only, wider than any sequence.
WINDOWS = [(-1, -1), (4, -1), (-1, 5), (9, 9), (3, 17), (20, 0), (0, 0), (200, 300)]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidir"])
@pytest.mark.parametrize("window", WINDOWS, ids=lambda w: f"w{w[0]}_{w[1]}")
def test_windows(window, causal):
    """Every window form: two-sided bands take the one-compare band mask, one-sided ones the plain
    masks (kernel ``_attn_block``)."""
    q, k, v, cu = make_qkv(LENS, 2, 1, 32, torch.float16)
    out = run(q, k, v, cu, MAX_LEN, causal=causal, window=window)
    ref = reference(q, k, v, cu, causal=causal, window=window)
    c = compare(out, ref)
    assert c, f"window={window} causal={causal}: {c}"


@pytest.mark.parametrize("causal,window", [(True, (9, -1)), (False, (3, 17)), (False, (-1, 5))])
def test_int64_offsets(causal, window):
    """The kernel's int64 token offsets (``WIDE_OFFSETS``, planned for K/V past 2**31 elements; the GPU
    test builds such views) give the int32 form's bits, run here by plan on small inputs."""
    q, k, v, cu = make_qkv(LENS, 2, 1, 32, torch.float16)
    p = explain(q, k, v, cu, MAX_LEN, causal=causal, window=window)
    assert p.consts()["WIDE_OFFSETS"] is False
    wide = run_plan(p.replace(constexprs={"WIDE_OFFSETS": True}), q, k, v, cu, MAX_LEN, window=window)
    assert torch.equal(wide, run(q, k, v, cu, MAX_LEN, causal=causal, window=window))
    assert compare(wide, reference(q, k, v, cu, causal=causal, window=window))


@pytest.mark.parametrize("window,causal", [((7, -1), True), ((4, 9), False)])
def test_unfolded_scale(window, causal):
    """A scale <= 0 keeps the scale out of exp2's FMA (``FOLD_SCALE`` False): negative logits right."""
    q, k, v, cu = make_qkv(LENS, 2, 1, 32, torch.float16)
    assert (
        explain(q, k, v, cu, MAX_LEN, causal=causal, window=window, softmax_scale=-0.2).consts()["FOLD_SCALE"]
        is False
    )
    out = run(q, k, v, cu, MAX_LEN, causal=causal, window=window, softmax_scale=-0.2)
    assert compare(out, reference(q, k, v, cu, causal=causal, window=window, softmax_scale=-0.2))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("window,causal", [((13, -1), True), ((6, 11), False)])
def test_dtypes(dtype, window, causal):
    q, k, v, cu = make_qkv(LENS, 2, 2, 48, dtype)
    out = run(q, k, v, cu, MAX_LEN, causal=causal, window=window, softmax_scale=0.3)
    ref = reference(q, k, v, cu, causal=causal, window=window, softmax_scale=0.3)
    c = compare(out, ref)
    assert c, f"{dtype}: {c}"


def test_fp32_is_ieee_accurate():
    """fp32 inputs use input_precision="ieee": far tighter than the tf32-tolerant default tolerance."""
    q, k, v, cu = make_qkv([29, 40], 2, 1, 64, torch.float32)
    out = run(q, k, v, cu, 40, causal=True, window=(11, -1))
    ref = reference(q, k, v, cu, causal=True, window=(11, -1))
    c = compare(out, ref, atol=2e-5, rtol=2e-6)
    assert c, str(c)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (6, 1)], ids=["mha", "gqa", "mqa"])
def test_gqa_mqa(heads, kv_heads):
    q, k, v, cu = make_qkv([23, 9, 40], heads, kv_heads, 32, torch.float16)
    out = run(q, k, v, cu, 40, causal=True, window=(7, -1))
    ref = reference(q, k, v, cu, causal=True, window=(7, -1))
    c = compare(out, ref)
    assert c, str(c)
    if kv_heads > 1:  # the harness notices a wrong head mapping
        wrong = negative_control(q, k, v, cu, cu, "kv_head", causal=True, window=(7, -1))
        assert not compare(out, wrong)


@pytest.mark.parametrize("sinks_mode", ["denominator", "bias_key0"])
@pytest.mark.parametrize("window,causal", [((-1, -1), True), ((10, -1), True), ((5, 8), False)])
def test_sinks(sinks_mode, window, causal):
    q, k, v, cu = make_qkv(LENS, 4, 2, 32, torch.float16)
    sinks = torch.randn(4, dtype=torch.float32, device=DEVICE) * 2
    sinks[1] = float("-inf")  # a disabled sink on one head
    out = run(q, k, v, cu, MAX_LEN, causal=causal, window=window, sinks=sinks, sinks_mode=sinks_mode)
    ref = reference(q, k, v, cu, causal=causal, window=window, sinks=sinks, sinks_mode=sinks_mode)
    c = compare(out, ref)
    assert c, f"{sinks_mode}: {c}"
    plain = reference(q, k, v, cu, causal=causal, window=window)
    assert not compare(out, plain), "sinks had no effect"


@pytest.mark.parametrize("sinks_mode", ["denominator", "bias_key0"])
def test_sinks_all_minus_inf_equal_no_sinks(sinks_mode):
    q, k, v, cu = make_qkv([20, 33], 2, 1, 32, torch.float16)
    sinks = torch.full((2,), float("-inf"), dtype=torch.float32, device=DEVICE)
    out = run(q, k, v, cu, 33, causal=False, window=(6, 6), sinks=sinks, sinks_mode=sinks_mode)
    ref = reference(q, k, v, cu, causal=False, window=(6, 6), sinks=sinks, sinks_mode=sinks_mode)
    assert compare(out, ref)
    if sinks_mode == "denominator":
        no_sinks = run(q, k, v, cu, 33, causal=False, window=(6, 6))
        assert torch.equal(out, no_sinks)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("sinks_mode", ["denominator", "bias_key0"])
def test_sinks_16_bit(dtype, sinks_mode):
    """16-bit sinks (a checkpoint's dtype) give the bits of the same values held in float32; a sink of the
    other mode does not (the comparison can fail)."""
    q, k, v, cu = make_qkv(LENS, 4, 2, 32, torch.float16)
    sinks = (torch.randn(4, dtype=torch.float32, device=DEVICE) * 2).to(dtype)
    sinks[2] = float("-inf")
    kw = dict(causal=True, window=(10, -1), sinks_mode=sinks_mode)
    out = run(q, k, v, cu, MAX_LEN, sinks=sinks, **kw)
    assert torch.equal(out, run(q, k, v, cu, MAX_LEN, sinks=sinks.float(), **kw))
    other = "bias_key0" if sinks_mode == "denominator" else "denominator"
    assert not torch.equal(out, run(q, k, v, cu, MAX_LEN, sinks=sinks.float(), **{**kw, "sinks_mode": other}))
    ref = reference(q, k, v, cu, causal=True, window=(10, -1), sinks=sinks.float(), sinks_mode=sinks_mode)
    c = compare(out, ref)
    assert c, str(c)


def test_rows_without_visible_key_are_zero():
    """Causal + bias_key0 sink of -inf: row 0 of each sequence only sees key 0, whose logit is -inf."""
    lens = [1, 18, 35]
    q, k, v, cu = make_qkv(lens, 2, 1, 32, torch.float16)
    sinks = torch.tensor([float("-inf"), 0.5], dtype=torch.float32, device=DEVICE)
    out = run(q, k, v, cu, 35, causal=True, window=(12, -1), sinks=sinks, sinks_mode="bias_key0")
    assert torch.isfinite(out).all()
    for start in cu[:-1].tolist():
        assert torch.equal(out[start, 0], torch.zeros_like(out[start, 0]))
    ref = reference(q, k, v, cu, causal=True, window=(12, -1), sinks=sinks, sinks_mode="bias_key0")
    assert compare(out, ref)


def test_diagonal_window_returns_v():
    """window (0, 0): every query sees only its own key, so the output is exactly v (broadcast over GQA)."""
    q, k, v, cu = make_qkv(LENS, 4, 2, 32, torch.float16)
    for causal in (True, False):
        out = run(q, k, v, cu, MAX_LEN, causal=causal, window=(0, 0))
        assert torch.equal(out, v.repeat_interleave(2, dim=1))


# Tile shapes of the GPU tables (BLOCK_M > BLOCK_N, BLOCK_M < BLOCK_N, several key blocks per edge), so the
# edge/interior split is exercised with the shapes the GPU runs, not only the interpreter's 16x16.
TILE_CONFIGS = [Config(32, 16, 1, 1), Config(16, 32, 1, 1), Config(64, 32, 4, 1), Config(128, 64, 4, 1)]


@pytest.mark.parametrize("config", TILE_CONFIGS, ids=lambda c: f"{c.block_m}x{c.block_n}")
@pytest.mark.parametrize(
    "causal,window", [(True, (20, -1)), (False, (5, 9)), (True, (-1, -1)), (False, (70, 3)), (True, (100, 0))]
)
def test_tile_shapes(config, causal, window):
    """The edge/interior split at the GPU tables' tile shapes, with a key-0 sink bias (the unfolded
    scale: the bias is added in log2 units)."""
    lens = [1, 37, 150, 16]
    q, k, v, cu = make_qkv(lens, 2, 1, 32, torch.float16)
    sinks = torch.randn(2, dtype=torch.float32, device=DEVICE)
    out = run(
        q, k, v, cu, 150, causal=causal, window=window, sinks=sinks, sinks_mode="bias_key0", config=config
    )
    ref = reference(q, k, v, cu, causal=causal, window=window, sinks=sinks, sinks_mode="bias_key0")
    c = compare(out, ref)
    assert c, f"{config} causal={causal} window={window}: {c}"


# Head dims: powers of two and not. CPU covers all at tiny lengths (cheap), GPU at real lengths.
HEAD_DIMS = [32, 64, 80, 96, 112, 128, 192, 256]


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_head_dims(head_dim):
    q, k, v, cu = make_qkv([1, 21], 2, 1, head_dim, torch.float16)
    out = run(q, k, v, cu, 21, causal=True, window=(5, -1))
    ref = reference(q, k, v, cu, causal=True, window=(5, -1))
    c = compare(out, ref)
    assert c, f"D={head_dim}: {c}"


def test_odd_small_head_dim():
    """head_dim below 16 and odd: padded to the 16-wide minimum tile and masked."""
    q, k, v, cu = make_qkv([17, 5], 2, 2, 9, torch.float32)
    out = run(q, k, v, cu, 17, causal=False, window=(3, 2))
    assert compare(out, reference(q, k, v, cu, causal=False, window=(3, 2)))


def test_negative_control():
    """The harness catches a kernel whose window is off by one key: the reference passes, the shifted
    band (attn_reference.negative_control) fails; likewise an off-by-one diagonal and a wrong scale."""
    q, k, v, cu = make_qkv(LENS, 2, 1, 32, torch.float16)
    kw = dict(causal=True, window=(8, -1))
    out = run(q, k, v, cu, MAX_LEN, **kw)
    assert compare(out, reference(q, k, v, cu, **kw))
    for kind in ("window_shift", "diagonal", "scale"):
        wrong = negative_control(q, k, v, cu, cu, kind, **kw)
        assert not compare(out, wrong), f"negative control {kind!r} was not caught"


# --------------------------------------------------------------------------------------- GPU only


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_gpu_head_dims_dtypes(head_dim, dtype):
    lens = [1, 300, 777, 64, 1500]
    q, k, v, cu = make_qkv(lens, 8, 2, head_dim, dtype)
    for causal, window in ((True, (255, -1)), (False, (100, 37)), (True, (-1, -1))):
        out = run(q, k, v, cu, max(lens), causal=causal, window=window)
        c = compare(out, reference(q, k, v, cu, causal=causal, window=window))
        assert c, f"D={head_dim} {dtype} causal={causal} window={window}: {c}"


@pytest.mark.gpu
@pytest.mark.parametrize("window", WINDOWS, ids=lambda w: f"w{w[0]}_{w[1]}")
@pytest.mark.parametrize("sinks_mode", [None, "denominator", "bias_key0"])
def test_gpu_bf16_windows_sinks(window, sinks_mode):
    lens = [1, 129, 1000, 255, 2048]
    q, k, v, cu = make_qkv(lens, 8, 1, 128, torch.bfloat16)
    sinks = torch.randn(8, dtype=torch.float32, device=DEVICE) if sinks_mode else None
    mode = sinks_mode or "denominator"
    for causal in (True, False):
        out = run(q, k, v, cu, max(lens), causal=causal, window=window, sinks=sinks, sinks_mode=mode)
        ref = reference(q, k, v, cu, causal=causal, window=window, sinks=sinks, sinks_mode=mode)
        c = compare(out, ref)
        assert c, f"causal={causal}: {c}"


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("sinks_mode", [None, "bias_key0"])
def test_gpu_bf16_softcap(head_dim, sinks_mode):
    """Soft-capped logits in bf16 on the shipped configs (head 128 causal: the descriptor form)."""
    lens = [1, 129, 1000, 2048]
    q, k, v, cu = make_qkv(lens, 8, 2, head_dim, torch.bfloat16)
    q = q * 3
    sinks = torch.randn(8, dtype=torch.float32, device=DEVICE) if sinks_mode else None
    mode = sinks_mode or "denominator"
    for causal, window in ((True, (511, -1)), (False, (100, 37))):
        kw = dict(causal=causal, window=window, sinks=sinks, sinks_mode=mode)
        out = run(q, k, v, cu, max(lens), softcap=20.0, **kw)
        c = compare(out, reference(q, k, v, cu, softcap=20.0, **kw))
        assert c, f"D={head_dim} causal={causal}: {c}"


@pytest.mark.gpu
@pytest.mark.parametrize(
    "seq_len,heads,kv_heads,head_dim,causal,window",
    [
        (4096, 8, 8, 64, False, (64, 64)),
        (8192, 8, 2, 128, True, (4095, -1)),
        (16384, 8, 8, 64, False, (64, 64)),
        (16384, 4, 1, 128, True, (1023, -1)),
    ],
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_gpu_long_sequences(seq_len, heads, kv_heads, head_dim, causal, window, dtype):
    lens = [seq_len, 333]
    q, k, v, cu = make_qkv(lens, heads, kv_heads, head_dim, dtype)
    out = run(q, k, v, cu, seq_len, causal=causal, window=window, validate=True)
    c = compare(out, reference(q, k, v, cu, causal=causal, window=window))
    assert c, str(c)


@pytest.mark.gpu
def test_gpu_int64_offsets():
    """q/k/v views whose token * stride offsets exceed 2**31 elements."""
    tokens, heads, head_dim = 40000, 2, 64
    width = 1 << 16  # token stride in elements: 40000 * 65536 > 2**31
    base = torch.randn(tokens, width, dtype=torch.float16, device=DEVICE)
    q = base[:, : heads * head_dim].view(tokens, heads, head_dim)
    k = base[:, 1024 : 1024 + heads * head_dim].view(tokens, heads, head_dim)
    v = base[:, 2048 : 2048 + heads * head_dim].view(tokens, heads, head_dim)
    lens = [tokens - 1000, 1000]
    from wp_util import cu_of

    cu = cu_of(lens)
    out = run(q, k, v, cu, max(lens), causal=True, window=(127, -1))
    tail = slice(tokens - 3000, tokens)  # check the rows at the far end of the buffer only
    ref = reference(q[tail].contiguous(), k[tail].contiguous(), v[tail].contiguous(), cu_of([2000, 1000]),
                    causal=True, window=(127, -1))  # fmt: skip
    # the first 127 rows of the cut-out lack their left context; compare from row 127 on
    c = compare(out[tail][127:], ref[127:])
    assert c, str(c)


TMA_CONFIGS = [Config(16, 16, 1, 1, True), Config(32, 16, 1, 1, True), Config(16, 32, 1, 1, True)]


@pytest.mark.parametrize("config", TMA_CONFIGS, ids=lambda c: f"{c.block_m}x{c.block_n}")
@pytest.mark.parametrize("causal,window", [(True, (40, -1)), (False, (20, 33)), (True, (-1, -1))])
def test_tma_kv(monkeypatch, config, causal, window):
    """Interior K/V blocks through tensor descriptors (``Config.tma``; the interpreter runs them; the
    interior blocks then come before the edges): K and V as slices of one packed qkv buffer (token
    stride > kv_heads * head_dim), GQA, sinks; the launch must carry descriptors over this call's K
    and V, and the result match the reference."""
    spy = spy_triton(monkeypatch)
    lens = [150, 37, 96]
    heads, kv_heads, d = 2, 1, 32
    qkv = torch.randn(sum(lens), heads + 2 * kv_heads, d, dtype=torch.float16, device=DEVICE)
    q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=1)
    cu = cu_of(lens)
    sinks = torch.randn(heads, dtype=torch.float32, device=DEVICE)
    out = run(q, k, v, cu, max(lens), causal=causal, window=window, sinks=sinks, config=config)
    ((_, args, kwargs),) = spy.launches
    assert kwargs["TMA_KV"] is True, "the descriptor form was not taken"
    assert args["K_desc"].base is k and args["V_desc"].base is v
    assert list(args["K_desc"].block_shape) == [config.block_n, d]
    c = compare(out, reference(q, k, v, cu, causal=causal, window=window, sinks=sinks))
    assert c, f"{config} causal={causal} window={window}: {c}"


def test_tma_kv_falls_back():
    """Where descriptors do not apply (padded head dim, one head's features not contiguous, fp32, a
    base not 16-byte aligned) the plan takes the pointer form, and the result still matches."""
    cfg = TMA_CONFIGS[0]

    def tma(q, k, v, cu, n):
        return explain(q, k, v, cu, n, config=cfg).consts()["TMA_KV"]

    q, k, v, cu = make_qkv([40, 9], 2, 1, 80, torch.float16)  # head dim 80 pads to 128
    assert not tma(q, k, v, cu, 40)
    out = run(q, k, v, cu, 40, causal=True, window=(7, -1), config=cfg)
    assert compare(out, reference(q, k, v, cu, causal=True, window=(7, -1)))
    q32, k32, v32, cu = make_qkv([40, 9], 2, 1, 32, torch.float32)
    assert not tma(q32, k32, v32, cu, 40)
    q16, k16, v16 = q32.half(), k32.half(), v32.half()
    assert tma(q16, k16, v16, cu, 40)  # the control: these take descriptors
    wide = torch.randn(49, 1, 48, dtype=torch.float16, device=DEVICE)  # heads' features not adjacent
    assert not tma(q16, wide[:, :, :32], wide[:, :, 16:], cu, 40)
    flat = torch.randn(49 * 32 + 8, dtype=torch.float16, device=DEVICE)
    k_al = flat[8 : 8 + 49 * 32].view(49, 1, 32)  # 16-byte aligned base: descriptors
    k_off = flat[1 : 1 + 49 * 32].view(49, 1, 32)  # 2 bytes past it: pointer loads
    assert tma(q16, k_al, v16, cu, 40) and not tma(q16, k_off, v16, cu, 40)
    out = run(q16, k_off, v16, cu, 40, causal=True, window=(7, -1), config=cfg)
    assert compare(out, reference(q16, k_off, v16, cu, causal=True, window=(7, -1)))


@pytest.mark.parametrize(
    "causal,window,sinks_mode,config",
    [
        (True, (20, -1), None, None),
        (False, (9, 30), "denominator", Config(32, 16, 1, 1)),
        (True, (-1, -1), "bias_key0", Config(16, 32, 1, 1)),
        (True, (40, -1), "denominator", TMA_CONFIGS[0]),
    ],
)
def test_softcap(causal, window, sinks_mode, config):
    """Logit soft-capping (``softcap``): logits ``c * tanh(scale * q.k / c)`` large enough that the cap
    bites (|scale * q.k| up to ~4c), with every sink mode and the descriptor form; the reference
    caps independently (torch.tanh), and the uncapped result is far from it (the negative control)."""
    lens = [150, 37, 96]
    q, k, v, cu = make_qkv(lens, 4, 2, 32, torch.float16)
    q = q * 3  # logits of tens: the cap of 10 bends most of them
    sinks = torch.randn(4, dtype=torch.float32, device=DEVICE) if sinks_mode else None
    mode = sinks_mode or "denominator"
    kw = dict(causal=causal, window=window, sinks=sinks, sinks_mode=mode, softmax_scale=0.4)
    out = run(q, k, v, cu, max(lens), softcap=10.0, config=config, **kw)
    c = compare(out, reference(q, k, v, cu, softcap=10.0, **kw))
    assert c, f"causal={causal} window={window} sinks={sinks_mode}: {c}"
    assert not compare(out, reference(q, k, v, cu, **kw)), "the cap changed nothing: the test proves nothing"


@pytest.mark.parametrize(
    "causal,window,extra,config",
    [
        (True, (-1, -1), {}, None),
        (True, (10, -1), dict(sinks_mode="denominator"), Config(32, 16, 1, 1)),
        (False, (5, 8), dict(sinks_mode="bias_key0"), None),
        (False, (-1, -1), dict(softcap=10.0), TMA_CONFIGS[0]),
        (True, (40, -1), dict(softcap=10.0, sinks_mode="bias_key0"), TMA_CONFIGS[2]),
    ],
)
def test_alibi(causal, window, extra, config):
    """ALiBi (``alibi_slopes``: ``- slope * |i - j|`` on each logit, after the scale and cap, before a
    key-0 sink) with windows on both sides, sinks of both modes, soft-capping and the descriptor form,
    output and LSE against the reference; the answer without the slopes is far from it (the negative
    control), and the plan takes the scale out of exp2's FMA (the bias is in log2 units)."""
    lens = [150, 1, 37, 96]
    q, k, v, cu = make_qkv(lens, 4, 2, 32, torch.float16)
    slopes = torch.tensor([0.5, 0.25, 0.0625, 0.0], dtype=torch.float32, device=DEVICE)  # one head without
    kw = dict(causal=causal, window=window, softcap=extra.get("softcap", 0.0))
    if "sinks_mode" in extra:
        sinks = torch.randn(4, dtype=torch.float32, device=DEVICE) * 2
        kw.update(sinks=sinks, sinks_mode=extra["sinks_mode"])
    chosen = explain(q, k, v, cu, max(lens), alibi_slopes=slopes, config=config, **kw)
    assert chosen.consts()["FOLD_SCALE"] is False
    out = run(q, k, v, cu, max(lens), alibi_slopes=slopes, config=config, **kw)
    ref = reference(q, k, v, cu, alibi_slopes=slopes, **kw)
    c = compare(out, ref)
    assert c, f"causal={causal} window={window} {extra}: {c}"
    assert not compare(out, reference(q, k, v, cu, **kw)), "the slopes changed nothing: the test is void"
    _, lse = window_prefill(q, k, v, cu, max(lens), alibi_slopes=slopes, config=config, return_lse=True, **kw)
    _, ref_lse = attention_varlen(q, k, v, cu, cu, alibi_slopes=slopes, return_lse=True, **kw)
    c_lse = compare_lse(lse, ref_lse)  # finite rows within 1e-3, -inf rows exactly -inf
    assert c_lse, c_lse


def test_alibi_slopes_in_other_dtypes():
    """float16 / bfloat16 slopes (read as float32) and a strided slope tensor give the float32 slopes'
    answer."""
    q, k, v, cu = make_qkv([40, 9], 2, 1, 32, torch.float16)
    slopes = torch.tensor([0.5, 0.125], dtype=torch.float32, device=DEVICE)
    want = run(q, k, v, cu, 40, window=(7, -1), alibi_slopes=slopes)
    for s in (slopes.half(), slopes.bfloat16(), torch.stack([slopes, slopes], 1)[:, 0]):
        assert torch.equal(run(q, k, v, cu, 40, window=(7, -1), alibi_slopes=s), want), s


_FP8_OUTS = [torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.mark.parametrize("out_dtype", _FP8_OUTS, ids=str)
@pytest.mark.parametrize(
    "causal,window,extra",
    [
        (True, (-1, -1), {}),
        (True, (10, -1), dict(sinks_mode="bias_key0")),
        (False, (5, 8), dict(softcap=10.0)),
    ],
)
def test_fp8_output(out_dtype, causal, window, extra):
    """``out=<fp8>, fp8_out_scale=s`` writes ``clamp(attention / s)`` in the fp8 format, with windows, a
    key-0 sink (whose ``-inf`` on one head leaves rows that see no key: 0) and soft-capping; warm calls take
    each call's scale (a float, then a tensor; on the GPU then both again, other values); the LSE beside an
    fp8 output is the softmax's, unscaled. On the GPU the values match the float64 reference within the fp8
    tolerance; the interpreter rounds float32 to fp8 wrongly near a power of two (7.98 -> 4), so on the CPU
    the values are checked within half their size, the sign, and rows without a key exactly 0."""
    lens = [150, 1, 37, 96]
    q, k, v, cu = make_qkv(lens, 4, 2, 32, torch.float16)
    kw = dict(causal=causal, window=window, softcap=extra.get("softcap", 0.0))
    if "sinks_mode" in extra:
        sinks = torch.tensor([1.0, float("-inf"), 0.5, -2.0], device=DEVICE)
        kw.update(sinks=sinks, sinks_mode=extra["sinks_mode"])
    ref = reference(q, k, v, cu, **kw)
    assert explain(q, k, v, cu, max(lens), out=torch.empty(q.shape, dtype=out_dtype, device=DEVICE),
                   fp8_out_scale=0.5, **kw).kernel == "triton"  # fmt: skip
    _, ref_lse = attention_varlen(q, k, v, cu, cu, return_lse=True, **kw)
    scales = (0.25, torch.tensor([0.5], device=DEVICE), 0.25, torch.tensor(0.125, device=DEVICE))
    for scale in scales if ON_GPU else scales[:2]:  # (the interpreter: a float, then a tensor)
        out = poison(torch.empty(q.shape, dtype=out_dtype, device=DEVICE))
        assert window_prefill(q, k, v, cu, max(lens), out=out, fp8_out_scale=scale, **kw) is out
        res, lse = window_prefill(q, k, v, cu, max(lens), out=torch.empty_like(out), fp8_out_scale=scale,
                                  return_lse=True, **kw)  # fmt: skip
        assert torch.equal(res.view(torch.uint8), out.view(torch.uint8))  # the LSE changes no output bit
        c_lse = compare_lse(lse, ref_lse)  # the scale is not the softmax's: the LSE is the 16-bit call's
        assert c_lse, c_lse
        s = float(scale)
        got = out.double() * s
        assert torch.isfinite(got).all()
        if ON_GPU:
            c = compare(got, ref, out_dtype)
            assert c, c
        else:
            assert ((got - ref).abs() <= 0.55 * ref.abs() + 0.05 * s).all(), s
            assert torch.equal(got.sign(), torch.where(ref.abs() < 0.05 * s, got.sign(), ref.sign()))
        assert torch.equal(got[ref == 0], ref[ref == 0])  # rows that see no key (and only those exact 0s)


@pytest.mark.parametrize("out_dtype", _FP8_OUTS, ids=str)
def test_fp8_output_clamps(out_dtype):
    """A scale far below the values saturates: every output is the fp8 format's largest finite value with
    the reference's sign (exact: the clamp's bound is representable); the 16-bit call's output divided by
    a larger scale is not clamped (the negative control: the clamp is the scale's doing)."""
    q, k, v, cu = make_qkv([40, 9], 2, 1, 32, torch.float16)
    v = v.abs() + 0.5  # every output element >= 0.5
    ref = reference(q, k, v, cu, window=(7, -1))
    top = torch.finfo(out_dtype).max
    out = poison(torch.empty(q.shape, dtype=out_dtype, device=DEVICE))
    window_prefill(q, k, v, cu, 40, window=(7, -1), out=out, fp8_out_scale=1e-6)
    assert torch.equal(out.double(), torch.full_like(ref, top))
    window_prefill(q, k, v, cu, 40, window=(7, -1), out=out, fp8_out_scale=1.0)
    assert (out.double() < top).all()


def test_fp8_output_bf16():
    """A bfloat16 call with an fp8 output (under the interpreter computed in float32 and quantised on the
    host, as the kernel's epilogue does): the bf16 answer divided by the scale, within the fp8 check."""
    q, k, v, cu = make_qkv([40, 9], 2, 1, 32, torch.bfloat16)
    ref = reference(q, k, v, cu, window=(7, -1))
    out = poison(torch.empty(q.shape, dtype=torch.float8_e4m3fn, device=DEVICE))
    window_prefill(q, k, v, cu, 40, window=(7, -1), out=out, fp8_out_scale=0.5)
    got = out.double() * 0.5
    assert torch.isfinite(got).all()
    if ON_GPU:
        c = compare(got, ref, torch.float8_e4m3fn)
        assert c, c
    else:
        assert ((got - ref).abs() <= 0.55 * ref.abs() + 0.03).all()
