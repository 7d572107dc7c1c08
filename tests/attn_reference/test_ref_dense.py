"""attention_varlen against a naive per-query loop, for every option."""

from __future__ import annotations

import pytest
import torch
from attn_ref_naive import naive_attention

import attn_reference
from attn_reference import attention_varlen, compare
from attn_reference import dense as dense_mod

# (len_q, len_k) per sequence: length-1 sequences, len_q < len_k, len_q == len_k, an empty query.
RAGGED = [(1, 1), (3, 11), (7, 7), (1, 6), (0, 4), (5, 16), (9, 9)]


def make_batch(device, lens=RAGGED, num_heads=4, num_kv=2, d=8, dv=None):
    total_q = sum(lq for lq, _ in lens)
    total_k = sum(lk for _, lk in lens)
    q = torch.randn(total_q, num_heads, d, dtype=torch.float64, device=device)
    k = torch.randn(total_k, num_kv, d, dtype=torch.float64, device=device)
    v = torch.randn(total_k, num_kv, dv or d, dtype=torch.float64, device=device)
    cu_q, cu_k = [0], [0]
    for lq, lk in lens:
        cu_q.append(cu_q[-1] + lq)
        cu_k.append(cu_k[-1] + lk)
    return q, k, v, cu_q, cu_k


def cu(x, device):
    return torch.tensor(x, dtype=torch.int32, device=device)


def check_against_naive(device, heads=(4, 2), lens=RAGGED, dv=None, **opts):
    q, k, v, cu_q, cu_k = make_batch(device, lens, heads[0], heads[1], dv=dv)
    out = attention_varlen(q, k, v, cu(cu_q, device), cu(cu_k, device), **opts)
    ref = naive_attention(q, k, v, cu_q, cu_k, **opts)
    assert out.dtype == torch.float64 and out.device == q.device
    assert out.shape == (q.shape[0], q.shape[1], v.shape[2])
    err = (out.cpu() - ref).abs().max().item()
    assert err < 1e-12, f"{opts}: max abs err {err}"
    return out, ref


OPTIONS = {
    "plain": {},
    "causal": dict(causal=True),
    "left_only": dict(window=(3, -1)),
    "left_only_causal": dict(causal=True, window=(2, -1)),
    "right_only": dict(window=(-1, 2)),
    "right_only_causal": dict(causal=True, window=(-1, 0)),
    "both": dict(window=(2, 2)),
    "asymmetric": dict(window=(4, 1)),
    "asymmetric_causal": dict(causal=True, window=(1, 3)),
    "zero_window": dict(window=(0, 0)),
    "wider_than_seq": dict(causal=True, window=(100, 100)),
    "wider_noncausal": dict(window=(64, 50)),
    "scale": dict(softmax_scale=0.37),
    "alibi": dict(causal=True, alibi_slopes="heads"),
    "alibi_window": dict(window=(3, 2), alibi_slopes="heads"),
    "sinks_denominator": dict(causal=True, sinks="heads"),
    "sinks_bias_key0": dict(causal=True, sinks="heads", sinks_mode="bias_key0"),
    "sinks_bias_key0_window": dict(causal=True, window=(2, -1), sinks="heads", sinks_mode="bias_key0"),
    "sinks_denominator_window": dict(window=(1, 1), sinks="heads"),
    "softcap": dict(causal=True, softcap=2.0, softmax_scale=1.5),
    "everything": dict(
        causal=True, window=(4, -1), softmax_scale=0.6, alibi_slopes="heads", sinks="heads", softcap=3.0
    ),
}


def _materialise(opts, num_heads, device):
    opts = dict(opts)
    if opts.get("alibi_slopes") == "heads":
        opts["alibi_slopes"] = torch.rand(num_heads, device=device) * 0.5
    if opts.get("sinks") == "heads":
        opts["sinks"] = torch.randn(num_heads, device=device, dtype=torch.float32) + 1.0
    return opts


@pytest.mark.parametrize("name", list(OPTIONS))
def test_matches_naive(name, device):
    check_against_naive(device, **_materialise(OPTIONS[name], 4, device))


@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("causal", [False, True])
def test_head_grouping(heads, causal, device):
    check_against_naive(device, heads=heads, causal=causal, window=(3, 1))


def test_value_head_size_differs(device):
    check_against_naive(device, dv=5, causal=True)


def test_alibi_per_sequence_slopes(device):
    slopes = torch.rand(len(RAGGED), 4, device=device)
    check_against_naive(device, causal=True, alibi_slopes=slopes)


@pytest.mark.parametrize(
    "opts",
    [
        dict(causal=True),
        dict(causal=True, sinks="heads"),
        dict(causal=True, sinks="heads", sinks_mode="bias_key0"),
        dict(causal=True, window=(1, -1), alibi_slopes="heads", softcap=4.0),
    ],
    ids=["plain", "sinks_denominator", "sinks_bias_key0", "window_alibi_softcap"],
)
def test_fully_masked_rows_are_zero(opts, device):
    # len_q > len_k puts the first queries at negative positions (they see nothing under causal);
    # len_k == 0 leaves a whole sequence without keys.
    lens = [(5, 3), (2, 0), (4, 4), (3, 1)]
    out, ref = check_against_naive(device, lens=lens, **_materialise(opts, 4, device))
    masked = [0, 1, 5, 6, 11, 12]  # rows with no visible key
    assert torch.all(out[masked] == 0)
    assert torch.all(ref[masked] == 0)
    assert torch.isfinite(out).all()
    others = [r for r in range(out.shape[0]) if r not in masked]
    assert (out[others].abs().sum(dim=-1) > 0).all()


def test_chunked_rows_match(device, monkeypatch):
    q, k, v, cu_q, cu_k = make_batch(device, [(40, 50), (33, 33)])
    opts = dict(causal=True, window=(7, -1), sinks=torch.randn(4, device=device))
    full = attention_varlen(q, k, v, cu(cu_q, device), cu(cu_k, device), **opts)
    monkeypatch.setattr(dense_mod, "_CHUNK_ELEMS", 4 * 50 * 3)  # 3 query rows per chunk
    chunked = attention_varlen(q, k, v, cu(cu_q, device), cu(cu_k, device), **opts)
    torch.testing.assert_close(chunked, full, rtol=0, atol=1e-14)


def test_low_precision_inputs_and_float32_compute(device):
    q, k, v, cu_q, cu_k = make_batch(device)
    q16, k16, v16 = q.half(), k.half(), v.half()
    ref = naive_attention(q16, k16, v16, cu_q, cu_k, causal=True)
    out64 = attention_varlen(q16, k16, v16, cu(cu_q, device), cu(cu_k, device), causal=True)
    assert out64.dtype == torch.float64
    assert (out64.cpu() - ref).abs().max() < 1e-12
    out32 = attention_varlen(
        q16, k16, v16, cu(cu_q, device), cu(cu_k, device), causal=True, dtype=torch.float32
    )
    assert out32.dtype == torch.float32
    assert compare(out32.cpu(), ref)


def test_non_contiguous_inputs(device):
    q, k, v, cu_q, cu_k = make_batch(device, d=16)
    qs, ks, vs = q[..., ::2], k[..., ::2], v[..., 1::2]
    ref = naive_attention(qs, ks, vs, cu_q, cu_k, causal=True)
    out = attention_varlen(qs, ks, vs, cu(cu_q, device), cu(cu_k, device), causal=True)
    assert (out.cpu() - ref).abs().max() < 1e-12


@pytest.mark.parametrize(
    "mutate, exc, match",
    [
        (lambda a: a.update(q=a["q"][0]), ValueError, "q must be 3-D"),
        (lambda a: a.update(k=a["k"][..., :4]), ValueError, "head size"),
        (lambda a: a.update(v=a["v"][:-1]), ValueError, "v must have shape"),
        (lambda a: a.update(cu_seqlens_q=a["cu_seqlens_q"].float()), TypeError, "integer"),
        (lambda a: a.update(cu_seqlens_k=a["cu_seqlens_k"][:-1]), ValueError, "cu_seqlens_k"),
        (lambda a: a.update(cu_seqlens_q=a["cu_seqlens_q"] + 1), ValueError, r"cu_seqlens_q\[0\]"),
        (lambda a: a.update(window=(-2, 0)), ValueError, "window left"),
        (lambda a: a.update(window=3), TypeError, "window"),
        (lambda a: a.update(sinks_mode="bogus"), ValueError, "sinks_mode"),
        (lambda a: a.update(sinks=torch.zeros(3)), ValueError, "sinks must have shape"),
        (lambda a: a.update(alibi_slopes=torch.zeros(2)), ValueError, "alibi_slopes"),
        (lambda a: a.update(softcap=-1.0), ValueError, "softcap"),
        (
            lambda a: a.update(k=a["k"][:, :1].expand(-1, 3, -1), v=a["v"][:, :1].expand(-1, 3, -1)),
            ValueError,
            "multiple",
        ),
        (lambda a: a.update(dtype=torch.float16), TypeError, "dtype"),
    ],
)
def test_argument_validation(mutate, exc, match, device):
    q, k, v, cu_q, cu_k = make_batch(device)
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cu(cu_q, device), cu_seqlens_k=cu(cu_k, device))
    mutate(args)
    with pytest.raises(exc, match=match):
        attention_varlen(**args)


def test_version():
    assert attn_reference.__version__ == "0.2.0"


@pytest.mark.gpu
def test_long_sequence_gpu(device):
    # 8k-token causal sequence against torch's own float64 attention.
    n, h, d = 8192, 4, 64
    q = torch.randn(n, h, d, dtype=torch.float64, device=device)
    k = torch.randn(n, h, d, dtype=torch.float64, device=device)
    v = torch.randn(n, h, d, dtype=torch.float64, device=device)
    out = attention_varlen(q, k, v, cu([0, n], device), cu([0, n], device), causal=True)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True
    ).transpose(0, 1)
    assert (out - ref).abs().max().item() < 1e-10
