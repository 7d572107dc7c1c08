"""Shared helpers of the hardening tests: random problems for both kernels, poisoned runs of all four
public functions, and the float64 references. Independent of the per-package test helpers."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from conftest import DEVICE, poison
from paged_cases import Case, make_case

from attn_reference import attention_varlen, paged_prefix_attention
from prefix_prefill import context_attention_fwd as pp_caf
from prefix_prefill import prefix_prefill
from window_prefill import context_attention_fwd as wp_caf
from window_prefill import window_prefill

FP8 = torch.float8_e4m3fn


def cu_of(lens: list[int], dtype: torch.dtype = torch.int32, device: str = DEVICE) -> torch.Tensor:
    """``cu_seqlens`` ``[batch + 1]`` of ``lens``."""
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=dtype, device=device)


# ------------------------------------------------------------------------------- window-prefill
@dataclass
class Dense:
    """A packed self-attention problem: q ``[T, H, D]``, k/v ``[T, Hkv, D]``, ``cu`` ``[B + 1]``."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu: torch.Tensor
    lens: list[int]

    @property
    def max_len(self) -> int:
        return max(self.lens, default=0)


def dense_case(
    lens: list[int], heads: int, kv_heads: int, head: int, dtype: torch.dtype, device: str = DEVICE
) -> Dense:
    total = sum(lens)
    q = torch.randn(total, heads, head, device=device).to(dtype)
    k = torch.randn(total, kv_heads, head, device=device).to(dtype)
    v = torch.randn(total, kv_heads, head, device=device).to(dtype)
    return Dense(q, k, v, cu_of(lens, device=device), list(lens))


def dense_ref(c: Dense, *, causal: bool = True, **kw) -> torch.Tensor:
    """float64 reference; ``causal`` defaults to True like the kernels (the reference's default is False)."""
    return attention_varlen(c.q, c.k, c.v, c.cu, c.cu, causal=causal, **kw)


def run_wp(c: Dense, **kw) -> torch.Tensor:
    """window_prefill into a NaN-poisoned buffer."""
    out = poison(torch.empty(c.q.shape, dtype=c.q.dtype, device=c.q.device))
    res = window_prefill(c.q, c.k, c.v, c.cu, c.max_len, out=out, **kw)
    assert res is out
    return out


def run_wcaf(c: Dense, *, causal: bool = True, window: tuple[int, int] = (-1, -1), sinks=None,
             sinks_mode: str = "denominator", **kw) -> torch.Tensor:  # fmt: skip
    """window_prefill.context_attention_fwd (vLLM form) into a NaN-poisoned ``o``; ``window`` is
    translated to ``sliding_window_q/k`` (FlashAttention -1 = vLLM None; 0 is not expressible)."""
    assert window[0] != 0 and window[1] != 0, "vLLM's window 0 means unbounded"
    o = poison(torch.empty_like(c.q))
    lens = torch.tensor(c.lens, dtype=torch.int32, device=c.q.device)
    res = wp_caf(
        c.q, c.k, c.v, o, c.cu[:-1], lens, c.max_len, causal, None,
        None if window[0] < 0 else window[0], None if window[1] < 0 else window[1],
        sinks, sinks_mode == "bias_key0", **kw,
    )  # fmt: skip
    assert res is o
    return o


# ------------------------------------------------------------------------------- prefix-prefill
@dataclass
class Paged(Case):
    """A paged prefix problem (see :func:`paged_case`): the shared :class:`paged_cases.Case` plus the
    ``fp8`` flag and the ``cu_q`` name these helpers use."""

    fp8: bool = False

    @property
    def cu_q(self) -> torch.Tensor:
        return self.cu_seqlens_q


def paged_case(
    seqs: list[tuple[int, int]],
    *,
    heads: int,
    kv_heads: int,
    head: int,
    page: int,
    dtype: torch.dtype,
    layout: str = "nhd",
    kv_from_cache: bool = False,
    fp8: bool = False,
    spare_blocks: int = 2,
    table_pad: int | None = None,
    device: str = DEVICE,
    gen: torch.Generator | None = None,
) -> Paged:
    """``seqs``: ``(ctx_len, query_len)`` pairs, built by the shared :func:`paged_cases.make_case`
    (shuffled block ids, a table exactly as wide as the longest read, entries past a sequence's need
    pointing outside the cache). ``fp8``: float8_e4m3fn cache, scales 0.5 / 1.5."""
    c = make_case(
        seqs, num_heads=heads, num_kv_heads=kv_heads, head_size=head, page=page, dtype=dtype,
        device=device, layout=layout, kv_from_cache=kv_from_cache, cache_dtype=FP8 if fp8 else None,
        spare_blocks=spare_blocks, table_pad=table_pad, k_scale=0.5 if fp8 else 1.0,
        v_scale=1.5 if fp8 else 1.0, gen=gen,
    )  # fmt: skip
    return Paged(**{f.name: getattr(c, f.name) for f in fields(c)}, fp8=fp8)


def paged_ref(c: Paged, **kw) -> torch.Tensor:
    return paged_prefix_attention(
        c.q, c.k, c.v, c.k_cache, c.v_cache, c.block_table, c.cu_q, c.seq_lens, layout=c.layout,
        k_scale=c.k_scale, v_scale=c.v_scale, **kw,
    )  # fmt: skip


def run_pp(c: Paged, **kw) -> torch.Tensor:
    """prefix_prefill into a NaN-poisoned buffer."""
    out = poison(torch.empty(c.q.shape, dtype=c.q.dtype, device=c.q.device))
    if c.fp8:
        kw.setdefault("k_scale", c.k_scale)
        kw.setdefault("v_scale", c.v_scale)
    res = prefix_prefill(
        c.q, c.k, c.v, c.k_cache, c.v_cache, c.block_table, c.cu_q, c.seq_lens, c.max_query_len,
        kv_layout=c.layout, out=out, **kw,
    )  # fmt: skip
    assert res is out
    return out


def run_pcaf(c: Paged, *, window: tuple[int, int] = (-1, -1), **kw) -> torch.Tensor:
    """prefix_prefill.context_attention_fwd (vLLM form, split layout) into a NaN-poisoned ``o``;
    ``window`` must be ``(W - 1, -1)`` or unbounded (vLLM's ``sliding_window=W``)."""
    assert c.layout == "split" and window[1] == -1
    o = poison(torch.empty(c.q.shape, dtype=c.q.dtype, device=c.q.device))
    dev = c.q.device
    ret = pp_caf(
        c.q, c.k, c.v, o, "fp8" if c.fp8 else "auto", c.k_cache, c.v_cache, c.block_table, c.cu_q,
        c.seq_lens, None, c.max_query_len, torch.tensor([c.k_scale], device=dev),
        torch.tensor([c.v_scale], device=dev), sliding_window=None if window[0] < 0 else window[0] + 1,
        **kw,
    )  # fmt: skip
    assert ret is None
    return o
