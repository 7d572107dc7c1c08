"""A deliberately naive attention: one query row and one head at a time, the mask and the softmax
in plain Python floats. The reference package is checked against this."""

from __future__ import annotations

import math

import torch


def visible(p: int, j: int, causal: bool, left: int, right: int) -> bool:
    if causal and j > p:
        return False
    if left >= 0 and p - j > left:
        return False
    if right >= 0 and j - p > right:
        return False
    return True


def naive_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: list[int],
    cu_k: list[int],
    *,
    causal: bool = False,
    window: tuple[int, int] = (-1, -1),
    softmax_scale: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    sinks_mode: str = "denominator",
    softcap: float = 0.0,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``[total_q, H, Dv]`` float64; with ``return_lse`` also ``[H, total_q]``: ``log(sum(exp(logit)))``
    per row over the visible logits and a denominator sink (``-inf`` when that sum is empty or 0)."""
    q, k, v = (t.detach().cpu().double() for t in (q, k, v))
    total_q, num_heads, d = q.shape
    num_kv = k.shape[1]
    group = num_heads // num_kv
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else softmax_scale
    left, right = window
    out = torch.zeros(total_q, num_heads, v.shape[2], dtype=torch.float64)
    lse = torch.full((num_heads, total_q), float("-inf"), dtype=torch.float64)
    for b in range(len(cu_q) - 1):
        len_q, len_k = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
        kb, vb = k[cu_k[b] : cu_k[b + 1]], v[cu_k[b] : cu_k[b + 1]]
        for i in range(len_q):
            p = len_k - len_q + i
            for h in range(num_heads):
                qv = q[cu_q[b] + i, h]
                dots = (kb[:, h // group] @ qv).tolist()
                logits, keys = [], []
                for j in range(len_k):
                    if not visible(p, j, causal, left, right):
                        continue
                    s = scale * dots[j]
                    if softcap > 0:
                        s = softcap * math.tanh(s / softcap)
                    if alibi_slopes is not None:
                        slope = alibi_slopes[h] if alibi_slopes.dim() == 1 else alibi_slopes[b, h]
                        s -= float(slope) * abs(p - j)
                    if sinks is not None and sinks_mode == "bias_key0" and j == 0:
                        s += float(sinks[h])
                    logits.append(s)
                    keys.append(j)
                extra = [float(sinks[h])] if sinks is not None and sinks_mode == "denominator" else []
                terms = [t for t in logits + extra if t != float("-inf")]
                if terms:
                    m = max(terms)
                    lse[h, cu_q[b] + i] = m + math.log(sum(math.exp(t - m) for t in terms))
                if not keys:
                    continue  # fully masked row -> 0
                m = max(logits + extra)
                w = [math.exp(s - m) for s in logits]
                denom = sum(w) + sum(math.exp(s - m) for s in extra)
                weights = torch.tensor([x / denom for x in w], dtype=torch.float64)
                out[cu_q[b] + i, h] = weights @ vb[keys, h // group]
    return (out, lse) if return_lse else out
