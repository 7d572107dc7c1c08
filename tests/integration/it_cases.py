"""Small random problems (and their float64 references) shared by the integration tests.

Shapes are tiny on purpose: under the Triton interpreter every launch runs on the CPU. Sequences
cross the interpreter's 16-row tiles and (prefix) several pages, with GQA and a head dim that is not a
power of two, so the tests exercise masked edge tiles and page walks, not just one tile.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from paged_cases import make_case

from attn_reference import attention_varlen, paged_prefix_attention

H, HKV, D = 4, 2, 24  # GQA 2:1, D padded to 32 inside the kernels


def _rand(*shape: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float32, device=device).to(dtype)


@dataclass
class Dense:
    """A varlen self-attention problem for window-prefill (both API forms)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu: torch.Tensor  # int32 [batch + 1]
    max_len: int
    window: tuple[int, int]  # FlashAttention inclusive convention
    sinks: torch.Tensor | None

    @property
    def starts(self) -> torch.Tensor:
        return self.cu[:-1]

    @property
    def lens(self) -> torch.Tensor:
        return (self.cu[1:] - self.cu[:-1]).contiguous()

    def reference(self, *, sinks_mode: str = "denominator") -> torch.Tensor:
        return attention_varlen(
            self.q, self.k, self.v, self.cu, self.cu, causal=True, window=self.window,
            sinks=self.sinks, sinks_mode=sinks_mode,
        )  # fmt: skip


def dense_case(
    dtype: torch.dtype = torch.float16,
    device: str = "cpu",
    lens: tuple[int, ...] = (7, 21),
    window: tuple[int, int] = (5, -1),
    with_sinks: bool = True,
) -> Dense:
    total = sum(lens)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    return Dense(
        q=_rand(total, H, D, dtype=dtype, device=device),
        k=_rand(total, HKV, D, dtype=dtype, device=device),
        v=_rand(total, HKV, D, dtype=dtype, device=device),
        cu=cu,
        max_len=max(lens),
        window=window,
        sinks=torch.randn(H, device=device) if with_sinks else None,
    )


@dataclass
class Paged:
    """A prefix-prefill problem: cached context in a vLLM "split" paged cache plus new tokens."""

    q: torch.Tensor
    k: torch.Tensor  # new tokens' keys [total_q, HKV, D]
    v: torch.Tensor
    k_cache: torch.Tensor  # [num_blocks, HKV, D // x, page, x]
    v_cache: torch.Tensor  # [num_blocks, HKV, D, page]
    block_table: torch.Tensor  # int32 [batch, max_pages]
    cu_q: torch.Tensor  # int32 [batch + 1]
    seq_lens: torch.Tensor  # int32 [batch]: context + query
    max_q: int
    sliding_window: int | None  # vLLM convention (W > 0: p - j < W), None = off
    extra: dict = field(default_factory=dict)

    def reference(self) -> torch.Tensor:
        window = (self.sliding_window - 1, -1) if self.sliding_window else (-1, -1)
        return paged_prefix_attention(
            self.q, self.k, self.v, self.k_cache, self.v_cache, self.block_table, self.cu_q,
            self.seq_lens, layout="split", causal=True, window=window,
        )  # fmt: skip

    def vllm_args(self, o: torch.Tensor) -> tuple:
        """Positional arguments of vLLM 0.33's ``prefix_prefill.context_attention_fwd``."""
        one = torch.ones(1, dtype=torch.float32, device=self.q.device)
        return (
            self.q, self.k, self.v, o, "auto", self.k_cache, self.v_cache, self.block_table, self.cu_q,
            self.seq_lens, None, self.max_q, one, one,
        )  # fmt: skip


def paged_case(
    dtype: torch.dtype = torch.float16,
    device: str = "cpu",
    ctx_lens: tuple[int, ...] = (9, 0, 18),
    q_lens: tuple[int, ...] = (5, 17, 3),
    page: int = 4,
    sliding_window: int | None = None,
) -> Paged:
    """The shared :func:`paged_cases.make_case` problem (shuffled block ids, a table exactly as wide as
    needed, entries past a sequence's need pointing outside the cache) in vLLM's split layout."""
    seqs = list(zip(ctx_lens, q_lens, strict=True))
    c = make_case(seqs, num_heads=H, num_kv_heads=HKV, head_size=D, page=page, dtype=dtype, device=device)
    return Paged(
        q=c.q,
        k=c.k,
        v=c.v,
        k_cache=c.k_cache,
        v_cache=c.v_cache,
        block_table=c.block_table,
        cu_q=c.cu_seqlens_q,
        seq_lens=c.seq_lens,
        max_q=c.max_query_len,
        sliding_window=sliding_window,
    )
