"""Random paged prefix problems shared by the test suites (prefix-prefill, hardening).

One builder for "a batch of (context, query) sequences in a paged KV cache with a shuffled,
exactly-wide block table", so every suite tests the kernels on the same kind of input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

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


def _randn(shape: tuple[int, ...], device: str, gen: torch.Generator | None) -> torch.Tensor:
    """float32 normal samples on ``device``; drawn on the CPU from ``gen`` when one is given
    (reproducible across devices), else directly on the device."""
    if gen is None:
        return torch.randn(shape, dtype=torch.float32, device=device)
    return torch.randn(shape, dtype=torch.float32, generator=gen).to(device)


def _fill(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: str,
    fp8: torch.dtype | None,
    gen: torch.Generator | None = None,
) -> torch.Tensor:
    t = _randn(shape, device, gen)
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
    num_blocks: int | None = None,
    table_pad: int | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    gen: torch.Generator | None = None,
) -> Case:
    """``seqs``: list of ``(ctx_len, query_len)``. Block ids are a random permutation (never the
    identity); the block table is exactly as wide as the longest sequence needs (context only
    when the new tokens come from ``k``/``v``), and entries past a sequence's need hold
    ``table_pad`` (default: an id outside the cache, which a kernel must never read).

    ``num_blocks``: the cache's blocks (default: the sequences' pages plus ``spare_blocks``), e.g. one
    cache size across calls, as an engine's.
    ``cache_dtype``: None (q's dtype), an fp8 dtype, or ``torch.uint8`` (bits of float8_e4m3fn).
    ``gen``: draw everything from this CPU generator (reproducible), else from the global RNG."""
    ctx_lens = [c for c, _ in seqs]
    q_lens = [n for _, n in seqs]
    seq_lens = [c + n for c, n in seqs]
    cached = seq_lens if kv_from_cache else ctx_lens  # tokens each sequence reads from the cache
    # pages to allocate: every token of every sequence lives in the cache (vLLM writes the new
    # tokens before the call), but the table only has to be as wide as what is read
    pages_all = [math.ceil(n / page) for n in seq_lens]
    width = max([math.ceil(n / page) for n in cached], default=0)
    if num_blocks is None:
        num_blocks = sum(pages_all) + spare_blocks
    elif num_blocks < sum(pages_all):
        raise ValueError(f"num_blocks={num_blocks}: the sequences need {sum(pages_all)} pages")
    perm = torch.randperm(num_blocks, generator=gen)
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
    k_cache = _fill(k_shape, store_dtype, device, fp8, gen)
    v_cache = _fill(v_shape, store_dtype, device, fp8, gen)

    total_q = sum(q_lens)
    q = _randn((total_q, num_heads, head_size), device, gen).to(dtype)
    if kv_from_cache:
        k = v = None
    else:
        k = _randn((total_q, num_kv_heads, head_size), device, gen).to(dtype)
        v = _randn((total_q, num_kv_heads, head_size), device, gen).to(dtype)
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


def interleave_pages(case: Case) -> Case:
    """``case``'s K and V caches (NHD or HND) rebuilt as the two halves of one FlashInfer-style tensor
    ``kv = [num_blocks, 2, ...]`` (``k_cache = kv[:, 0]``, ``v_cache = kv[:, 1]``: each block's K page,
    then its V page; block stride twice a page's elements), the same values; ``case.extra["kv"]`` holds
    ``kv``. Returns ``case``."""
    if case.layout not in ("nhd", "hnd"):
        raise ValueError(f"interleaved pages are NHD or HND caches, not {case.layout!r}")
    kv = torch.stack([case.k_cache, case.v_cache], dim=1)
    case.k_cache, case.v_cache = kv[:, 0], kv[:, 1]
    case.extra["kv"] = kv
    return case
