"""Shared helpers of the window_prefill tests: random ragged batches, poisoned runs, the reference."""

from __future__ import annotations

import torch
from conftest import DEVICE, poison

from attn_reference import attention_varlen
from window_prefill import window_prefill
from window_prefill.configs import Config


def cu_of(lens: list[int], dtype: torch.dtype = torch.int32, device: str = DEVICE) -> torch.Tensor:
    """cu_seqlens [batch + 1] of ``lens``."""
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=dtype, device=device)


def make_qkv(
    lens: list[int], heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: str = DEVICE
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fresh random q [T, H, D], k/v [T, Hkv, D] and cu_seqlens for a ragged batch."""
    total = sum(lens)
    q = torch.randn(total, heads, head_dim, dtype=dtype, device=device)
    k = torch.randn(total, kv_heads, head_dim, dtype=dtype, device=device)
    v = torch.randn(total, kv_heads, head_dim, dtype=dtype, device=device)
    return q, k, v, cu_of(lens, device=device)


def run(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu: torch.Tensor,
    max_len: int,
    *,
    config: Config | None = None,
    **kwargs,
) -> torch.Tensor:
    """window_prefill into a NaN-poisoned output buffer."""
    out = poison(torch.empty(q.shape, dtype=q.dtype, device=q.device))
    res = window_prefill(q, k, v, cu, max_len, out=out, config=config, **kwargs)
    assert res is out
    return out


def reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu: torch.Tensor,
    *,
    causal: bool = True,
    window: tuple[int, int] = (-1, -1),
    softmax_scale: float | None = None,
    sinks: torch.Tensor | None = None,
    sinks_mode: str = "denominator",
    softcap: float = 0.0,
) -> torch.Tensor:
    """float64 reference (self-attention: cu_seqlens_q = cu_seqlens_k)."""
    return attention_varlen(
        q,
        k,
        v,
        cu,
        cu,
        causal=causal,
        window=window,
        softmax_scale=softmax_scale,
        sinks=sinks,
        sinks_mode=sinks_mode,
        softcap=softcap,
    )


def tile_key_range(m0: int, m1: int, seq_len: int, causal: bool, window: tuple[int, int]) -> tuple[int, int]:
    """[lo, hi): keys some row in [m0, m1) of one sequence may see (brute force, not the kernel's formula)."""
    left, right = window
    visible = set()
    for i in range(m0, m1):
        for j in range(seq_len):
            if causal and j > i:
                continue
            if left >= 0 and i - j > left:
                continue
            if right >= 0 and j - i > right:
                continue
            visible.add(j)
    lo, hi = min(visible), max(visible) + 1
    assert len(visible) == hi - lo, "the visible keys of a tile form one interval"
    return lo, hi


def check_graph_replay(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: int,
                       **kwargs) -> None:  # fmt: skip
    """window_prefill captured in a CUDA graph (compiled outside the capture) replays into a
    NaN-poisoned output and matches the float64 reference; ``kwargs`` go to both (e.g. ``window``)."""
    from attn_reference import compare

    out = torch.empty_like(q)
    window_prefill(q, k, v, cu, max_len, out=out, **kwargs)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        window_prefill(q, k, v, cu, max_len, out=out, **kwargs)
    poison(out)
    graph.replay()
    torch.cuda.synchronize()
    c = compare(out, reference(q, k, v, cu, **kwargs))
    assert c, c
