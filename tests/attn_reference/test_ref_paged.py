"""gather_paged and paged_prefix_attention against the dense reference on the same tokens.

The caches are filled token by token with per-layout slicing written here (not the package's
addressing), so a wrong gather or a wrong layout permutation shows up."""

from __future__ import annotations

import random

import pytest
import torch

from attn_reference import attention_varlen, gather_paged, paged_prefix_attention

# (context length, query length) per sequence.
SEQS = [(0, 3), (5, 1), (17, 4), (2, 2), (33, 6)]
FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def write_token(cache, layout, role, blk, slot, tok):
    """Store ``tok`` [Hkv, D] as token slot ``slot`` of block ``blk``."""
    if layout == "nhd":
        cache[blk, slot] = tok
    elif layout == "hnd":
        cache[blk, :, slot] = tok
    elif role == "k":  # split K: [nb, H, D // x, page, x]
        cache[blk, :, :, slot, :] = tok.reshape(tok.shape[0], cache.shape[2], cache.shape[4])
    else:  # split V: [nb, H, D, page]
        cache[blk, :, :, slot] = tok


def empty_cache(layout, role, nb, page, heads, d, x, dtype, padded):
    if layout == "nhd":
        shape = [nb, page, heads, d]
    elif layout == "hnd":
        shape = [nb, heads, page, d]
    elif role == "k":
        shape = [nb, heads, d // x, page, x]
    else:
        shape = [nb, heads, d, page]
    if padded:  # a strided view: extra blocks interleaved and a padded last dim
        big = torch.randn([2 * nb, *shape[1:-1], shape[-1] + 3]).to(dtype)
        return big[::2, ..., : shape[-1]]
    return torch.randn(shape).to(dtype)  # garbage everywhere the table does not point


def build_paged(seq_lens, page, layout, heads=2, d=8, dv=8, dtype=torch.float64, padded=False, extra_cols=0):
    """Random per-token K/V (logical, packed) and a paged cache holding them at shuffled blocks."""
    need = [-(-n // page) for n in seq_lens]
    nb = sum(need) + 3
    perm = list(range(nb))
    random.Random(page * 7 + len(layout)).shuffle(perm)
    cols = max(need) + extra_cols
    table = torch.full((len(seq_lens), cols), -1, dtype=torch.int32)  # unused entries: garbage (-1)
    it = iter(perm)
    for b, n in enumerate(need):
        for c in range(n):
            table[b, c] = next(it)
    total = sum(seq_lens)
    k_tok = torch.randn(total, heads, d).to(dtype)
    v_tok = torch.randn(total, heads, dv).to(dtype)
    x = 4 if d % 4 == 0 else 1
    k_cache = empty_cache(layout, "k", nb, page, heads, d, x, dtype, padded)
    v_cache = empty_cache(layout, "v", nb, page, heads, dv, x, dtype, padded)
    kc, vc = k_cache, v_cache
    if dtype.itemsize == 1:  # write through byte views (index_put is not there for every fp8 dtype)
        kc, vc = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
        k_w, v_w = k_tok.view(torch.uint8), v_tok.view(torch.uint8)
    else:
        k_w, v_w = k_tok, v_tok
    t0 = 0
    for b, n in enumerate(seq_lens):
        for t in range(n):
            blk, slot = int(table[b, t // page]), t % page
            write_token(kc, layout, "k", blk, slot, k_w[t0 + t])
            write_token(vc, layout, "v", blk, slot, v_w[t0 + t])
        t0 += n
    return k_tok, v_tok, k_cache, v_cache, table


def cu_of(lens):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32)


@pytest.mark.parametrize("layout", ["split", "nhd", "hnd"])
@pytest.mark.parametrize("page", [1, 3, 16, 17])
def test_gather_and_prefix_attention(layout, page):
    ctx = [c for c, _ in SEQS]
    qlen = [lq for _, lq in SEQS]
    k_ctx, v_ctx, k_cache, v_cache, table = build_paged(ctx, page, layout, padded=(page == 3))
    assert torch.equal(gather_paged(k_cache, table, torch.tensor(ctx), layout=layout, role="k"), k_ctx)
    assert torch.equal(gather_paged(v_cache, table, ctx, layout=layout, role="v"), v_ctx)

    heads, hkv, d = 4, 2, 8
    q = torch.randn(sum(qlen), heads, d, dtype=torch.float64)
    k_new = torch.randn(sum(qlen), hkv, d).half()
    v_new = torch.randn(sum(qlen), hkv, d).half()
    seq_lens = torch.tensor([c + lq for c, lq in SEQS], dtype=torch.int32)
    opts = dict(causal=True, window=(9, -1), sinks=torch.randn(heads), softcap=5.0)
    out = paged_prefix_attention(
        q, k_new, v_new, k_cache, v_cache, table, cu_of(qlen), seq_lens, layout=layout, **opts
    )
    # Dense: keys = context tokens then the new tokens, per sequence.
    ks, vs, c0, q0 = [], [], 0, 0
    for c, lq in SEQS:
        ks += [k_ctx[c0 : c0 + c], k_new[q0 : q0 + lq].double()]
        vs += [v_ctx[c0 : c0 + c], v_new[q0 : q0 + lq].double()]
        c0, q0 = c0 + c, q0 + lq
    ref = attention_varlen(q, torch.cat(ks), torch.cat(vs), cu_of(qlen), cu_of(seq_lens.tolist()), **opts)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("layout", ["split", "nhd", "hnd"])
def test_k_new_none_reads_new_tokens_from_cache(layout):
    qlen = [lq for _, lq in SEQS]
    seq_lens = [c + lq for c, lq in SEQS]
    k_tok, v_tok, k_cache, v_cache, table = build_paged(seq_lens, 16, layout, heads=1, d=16, dv=8)
    q = torch.randn(sum(qlen), 3, 16, dtype=torch.float64)
    slopes = torch.rand(3)
    out = paged_prefix_attention(
        q,
        None,
        None,
        k_cache,
        v_cache,
        table,
        cu_of(qlen),
        torch.tensor(seq_lens),
        layout=layout,
        alibi_slopes=slopes,
    )
    assert torch.equal(
        out, attention_varlen(q, k_tok, v_tok, cu_of(qlen), cu_of(seq_lens), causal=True, alibi_slopes=slopes)
    )
    ref = attention_varlen(q, k_tok, v_tok, cu_of(qlen), cu_of(seq_lens), causal=True)
    assert out.shape == (sum(qlen), 3, 8)
    out_plain = paged_prefix_attention(
        q, None, None, k_cache, v_cache, table, cu_of(qlen), torch.tensor(seq_lens), layout=layout
    )
    assert torch.equal(out_plain, ref)
    assert not torch.equal(out, ref)  # ALiBi did something


def test_huge_page_short_table():
    seq_lens = [300, 1, 543, 100]
    k_tok, v_tok, k_cache, v_cache, table = build_paged(seq_lens, 544, "hnd", heads=1, d=4, dv=4)
    assert table.shape == (4, 1)
    assert torch.equal(gather_paged(k_cache, table, seq_lens, layout="hnd"), k_tok)
    qlen = [3, 1, 5, 0]
    q = torch.randn(sum(qlen), 2, 4, dtype=torch.float64)
    out = paged_prefix_attention(
        q, None, None, k_cache, v_cache, table, cu_of(qlen), seq_lens, layout="hnd", window=(50, -1)
    )
    ref = attention_varlen(q, k_tok, v_tok, cu_of(qlen), cu_of(seq_lens), causal=True, window=(50, -1))
    assert torch.equal(out, ref)


@pytest.mark.parametrize(
    "kind, view_as, k_scale, v_scale",
    [
        ("e4m3", None, 0.5, 2.0),
        ("e5m2", None, torch.tensor([1.5]), torch.tensor(0.25)),
        ("uint8", None, 0.75, torch.tensor([3.0])),
        ("uint8", "e5m2", 2.0, 0.5),
    ],
)
@pytest.mark.parametrize("layout", ["split", "nhd"])
def test_fp8_caches(kind, view_as, k_scale, v_scale, layout):
    stored = FP8[view_as or "e4m3"] if kind == "uint8" else FP8[kind]
    ctx = [c for c, _ in SEQS]
    qlen = [lq for _, lq in SEQS]
    k_ctx, v_ctx, k_cache, v_cache, table = build_paged(ctx, 3, layout, dtype=stored)
    if kind == "uint8":
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    q = torch.randn(sum(qlen), 2, 8, dtype=torch.float64)
    k_new = torch.randn(sum(qlen), 2, 8)
    v_new = torch.randn(sum(qlen), 2, 8)
    seq_lens = [c + lq for c, lq in SEQS]
    out = paged_prefix_attention(
        q,
        k_new,
        v_new,
        k_cache,
        v_cache,
        table,
        cu_of(qlen),
        seq_lens,
        layout=layout,
        k_scale=k_scale,
        v_scale=v_scale,
        fp8_dtype=FP8[view_as] if view_as else None,
    )
    ks_f, vs_f = float(torch.as_tensor(k_scale)), float(torch.as_tensor(v_scale))
    ks, vs, c0, q0 = [], [], 0, 0
    for c, lq in SEQS:  # cache tokens dequantised as value * scale; new tokens unscaled
        ks += [k_ctx[c0 : c0 + c].double() * ks_f, k_new[q0 : q0 + lq].double()]
        vs += [v_ctx[c0 : c0 + c].double() * vs_f, v_new[q0 : q0 + lq].double()]
        c0, q0 = c0 + c, q0 + lq
    ref = attention_varlen(q, torch.cat(ks), torch.cat(vs), cu_of(qlen), cu_of(seq_lens), causal=True)
    assert torch.equal(out, ref)
    if kind == "uint8" and view_as is None:  # reading the bytes as the other fp8 format is different
        wrong = paged_prefix_attention(
            q,
            k_new,
            v_new,
            k_cache,
            v_cache,
            table,
            cu_of(qlen),
            seq_lens,
            layout=layout,
            k_scale=k_scale,
            v_scale=v_scale,
            fp8_dtype=torch.float8_e5m2,
        )
        assert not torch.allclose(wrong, ref)


def test_fp16_cache_ignores_scales():
    ctx = [c for c, _ in SEQS]
    qlen = [lq for _, lq in SEQS]
    _, _, k_cache, v_cache, table = build_paged(ctx, 16, "nhd", dtype=torch.float16)
    q = torch.randn(sum(qlen), 2, 8)
    kn, vn = torch.randn(sum(qlen), 2, 8), torch.randn(sum(qlen), 2, 8)
    seq_lens = [c + lq for c, lq in SEQS]
    a = paged_prefix_attention(q, kn, vn, k_cache, v_cache, table, cu_of(qlen), seq_lens)
    b = paged_prefix_attention(q, kn, vn, k_cache, v_cache, table, cu_of(qlen), seq_lens, k_scale=3.0)
    assert torch.equal(a, b)


def test_paged_validation():
    ctx = [4, 9]
    _, _, k_cache, v_cache, table = build_paged(ctx, 3, "nhd")
    with pytest.raises(ValueError, match="outside"):
        bad = table.clone()
        bad[1, 0] = k_cache.shape[0]
        gather_paged(k_cache, bad, ctx, layout="nhd")
    with pytest.raises(ValueError, match="columns"):
        gather_paged(k_cache, table[:, :2], ctx, layout="nhd")
    with pytest.raises(ValueError, match="5-D"):
        gather_paged(k_cache, table, ctx, layout="split", role="k")
    with pytest.raises(ValueError, match="layout"):
        gather_paged(k_cache, table, ctx, layout="nchw")
    with pytest.raises(TypeError, match="integer"):
        gather_paged(k_cache, table.float(), ctx, layout="nhd")
    q = torch.randn(3, 2, 8)
    kn = torch.randn(3, 2, 8)
    args = (k_cache, v_cache, table, torch.tensor([0, 1, 3]))
    with pytest.raises(ValueError, match="both"):
        paged_prefix_attention(q, kn, None, *args, [5, 11])
    with pytest.raises(ValueError, match="query length"):
        paged_prefix_attention(q, kn, kn, *args, [5, 1])
    with pytest.raises(ValueError, match="k_new must have shape"):
        paged_prefix_attention(q, kn[:, :1], kn, *args, [5, 11])
    with pytest.raises(ValueError, match="seq_lens has"):
        paged_prefix_attention(q, kn, kn, *args, [5, 11, 2])
    with pytest.raises(ValueError, match="disagree"):
        paged_prefix_attention(q, kn, kn, k_cache, v_cache[:, :2], table, torch.tensor([0, 1, 3]), [5, 11])
