"""Random paged prefix-prefill problems and the float64 reference for them (shared by the tests)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from conftest import poison

from attn_reference import paged_prefix_attention
from paged_kv_offsets import describe_kv_cache
from prefix_prefill import context_attention_fwd, prefix_prefill
from prefix_prefill.configs import KernelConfig
from prefix_prefill.interface import _launch_fwd

FP8_E4M3 = torch.float8_e4m3fn
FP8_E5M2 = torch.float8_e5m2


@dataclass
class Case:
    q: torch.Tensor
    k: torch.Tensor | None
    v: torch.Tensor | None
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_table: torch.Tensor
    cu_seqlens_q: torch.Tensor
    seq_lens: torch.Tensor
    max_query_len: int
    layout: str
    ctx_lens: list[int]
    q_lens: list[int]
    page: int
    fp8_dtype: torch.dtype | None = None
    k_scale: float = 1.0
    v_scale: float = 1.0
    extra: dict = field(default_factory=dict)

    @property
    def num_blocks(self) -> int:
        return self.k_cache.shape[0]


def _fill(shape: tuple[int, ...], dtype: torch.dtype, device: str, fp8: torch.dtype | None) -> torch.Tensor:
    t = torch.randn(shape, dtype=torch.float32, device=device)
    if fp8 is not None:
        return (t * 2).to(fp8) if dtype != torch.uint8 else (t * 2).to(fp8).view(torch.uint8)
    return t.to(dtype)


def make_case(
    seqs: list[tuple[int, int]],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    page: int,
    dtype: torch.dtype,
    device: str,
    layout: str = "split",
    kv_from_cache: bool = False,
    cache_dtype: torch.dtype | None = None,
    spare_blocks: int = 3,
    table_pad: int | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> Case:
    """``seqs``: list of ``(ctx_len, query_len)``. Block ids are a random permutation (never the
    identity); the block table is exactly as wide as the longest sequence needs (context only
    when the new tokens come from ``k``/``v``), and entries past a sequence's need hold
    ``table_pad`` (default: an id outside the cache, which a kernel must never read).

    ``cache_dtype``: None (q's dtype), an fp8 dtype, or ``torch.uint8`` (bits of float8_e4m3fn)."""
    ctx_lens = [c for c, _ in seqs]
    q_lens = [n for _, n in seqs]
    seq_lens = [c + n for c, n in seqs]
    cached = seq_lens if kv_from_cache else ctx_lens  # tokens each sequence reads from the cache
    # pages to allocate: every token of every sequence lives in the cache (vLLM writes the new
    # tokens before the call), but the table only has to be as wide as what is read
    pages_all = [math.ceil(n / page) for n in seq_lens]
    width = max([math.ceil(n / page) for n in cached], default=0)
    num_blocks = sum(pages_all) + spare_blocks
    perm = torch.randperm(num_blocks)
    if num_blocks > 1 and bool((perm == torch.arange(num_blocks)).all()):
        perm = perm.roll(1)
    pad = num_blocks + 1000 if table_pad is None else table_pad
    table = torch.full((len(seqs), width), pad, dtype=torch.int32)
    at = 0
    for b, n in enumerate(pages_all):
        ids = perm[at : at + n]
        at += n
        m = min(n, width)
        table[b, :m] = ids[:m].to(torch.int32)

    fp8 = None
    store_dtype = dtype
    if cache_dtype is not None and cache_dtype != dtype:
        fp8 = FP8_E4M3 if cache_dtype == torch.uint8 else cache_dtype
        store_dtype = cache_dtype
    if layout == "split":
        x = 16 // (1 if fp8 is not None else torch.finfo(dtype).bits // 8)
        x = min(x, head_size)
        while head_size % x:
            x //= 2
        k_shape = (num_blocks, num_kv_heads, head_size // x, page, x)
        v_shape = (num_blocks, num_kv_heads, head_size, page)
    elif layout == "nhd":
        k_shape = v_shape = (num_blocks, page, num_kv_heads, head_size)
    else:
        k_shape = v_shape = (num_blocks, num_kv_heads, page, head_size)
    k_cache = _fill(k_shape, store_dtype, device, fp8)
    v_cache = _fill(v_shape, store_dtype, device, fp8)

    total_q = sum(q_lens)
    q = torch.randn(total_q, num_heads, head_size, device=device).to(dtype)
    if kv_from_cache:
        k = v = None
    else:
        k = torch.randn(total_q, num_kv_heads, head_size, device=device).to(dtype)
        v = torch.randn(total_q, num_kv_heads, head_size, device=device).to(dtype)
    cu = torch.zeros(len(seqs) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(q_lens, dtype=torch.int32), 0)
    return Case(
        q=q,
        k=k,
        v=v,
        k_cache=k_cache,
        v_cache=v_cache,
        block_table=table.to(device),
        cu_seqlens_q=cu.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        max_query_len=max(q_lens, default=0),
        layout=layout,
        ctx_lens=ctx_lens,
        q_lens=q_lens,
        page=page,
        fp8_dtype=fp8,
        k_scale=k_scale,
        v_scale=v_scale,
    )


def reference(case: Case, **kw) -> torch.Tensor:
    """float64 answer from attn_reference for ``case`` (``kw``: causal, window, alibi_slopes, ...)."""
    return paged_prefix_attention(
        case.q,
        case.k,
        case.v,
        case.k_cache,
        case.v_cache,
        case.block_table,
        case.cu_seqlens_q,
        case.seq_lens,
        layout=case.layout,
        k_scale=case.k_scale,
        v_scale=case.v_scale,
        fp8_dtype=case.fp8_dtype,
        **kw,
    )


def random_seqs(
    n: int, max_ctx: int, max_q: int, gen: torch.Generator | None = None
) -> list[tuple[int, int]]:
    """``n`` random ``(ctx_len, query_len)`` pairs, query length >= 1."""
    out = []
    for _ in range(n):
        c = int(torch.randint(0, max_ctx + 1, (1,), generator=gen))
        m = int(torch.randint(1, max_q + 1, (1,), generator=gen))
        out.append((c, m))
    return out


def alibi_slopes(num_heads: int, device: str) -> torch.Tensor:
    base = 2.0 ** (-8.0 / num_heads)
    return torch.tensor([base ** (h + 1) for h in range(num_heads)], dtype=torch.float32, device=device)


def run_py(case: Case, **kw) -> torch.Tensor:
    """prefix_prefill into a NaN-poisoned buffer (validate=True unless given)."""
    out = poison(torch.empty(case.q.shape, dtype=case.q.dtype, device=case.q.device))
    kw.setdefault("validate", True)
    if case.fp8_dtype is not None:
        kw.setdefault("k_scale", case.k_scale)
        kw.setdefault("v_scale", case.v_scale)
    res = prefix_prefill(
        case.q,
        case.k,
        case.v,
        case.k_cache,
        case.v_cache,
        case.block_table,
        case.cu_seqlens_q,
        case.seq_lens,
        case.max_query_len,
        kv_layout=case.layout,
        out=out,
        **kw,
    )
    assert res is out
    return out


def kv_cache_dtype_of(case: Case) -> str:
    if case.fp8_dtype is None:
        return "auto"
    return "fp8_e5m2" if case.fp8_dtype == FP8_E5M2 else "fp8"


def run_vllm(case: Case, o: torch.Tensor | None = None, **kw) -> torch.Tensor:
    """context_attention_fwd (vLLM signature, split layout) into a NaN-poisoned ``o``."""
    assert case.layout == "split"
    if o is None:
        o = poison(torch.empty(case.q.shape, dtype=case.q.dtype, device=case.q.device))
    kw.setdefault("validate", True)
    dev = case.q.device
    context_attention_fwd(
        case.q,
        case.k,
        case.v,
        o,
        kw.pop("kv_cache_dtype", kv_cache_dtype_of(case)),
        case.k_cache,
        case.v_cache,
        case.block_table,
        case.cu_seqlens_q,
        case.seq_lens,
        None,
        case.max_query_len,
        torch.tensor([case.k_scale], dtype=torch.float32, device=dev),
        torch.tensor([case.v_scale], dtype=torch.float32, device=dev),
        **kw,
    )
    return o


def run_cfg(case: Case, config: KernelConfig, **kw) -> torch.Tensor:
    """The shared launcher with an explicit config (tile shapes the table would not pick)."""
    out = poison(torch.empty(case.q.shape, dtype=case.q.dtype, device=case.q.device))
    k_cache, v_cache = case.k_cache, case.v_cache
    if k_cache.dtype == torch.uint8:
        k_cache, v_cache = k_cache.view(FP8_E4M3), v_cache.view(FP8_E4M3)
    kc, vc = describe_kv_cache(k_cache, v_cache, case.layout)
    dev = case.q.device
    scales = {}
    if case.fp8_dtype is not None:
        scales = {
            "k_scale": torch.tensor([case.k_scale], device=dev),
            "v_scale": torch.tensor([case.v_scale], device=dev),
        }
    _launch_fwd(
        case.q,
        case.k,
        case.v,
        out,
        k_cache,
        v_cache,
        kc,
        vc,
        case.block_table,
        case.cu_seqlens_q,
        case.seq_lens,
        case.max_query_len,
        config=config,
        **scales,
        **kw,
    )
    return out
