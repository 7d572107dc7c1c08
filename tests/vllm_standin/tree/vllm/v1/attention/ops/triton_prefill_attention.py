"""Stand-in for ``vllm.v1.attention.ops.triton_prefill_attention`` (tests only): the
``context_attention_fwd`` the window-prefill plugin replaces. It records each call in :data:`CALLS` and
writes the float64 reference (``attn_reference``) of each sequence into ``o``; arguments by vLLM 0.33's
names."""

from __future__ import annotations

from attn_reference import attention_varlen

CALLS: list[dict] = []


def context_attention_fwd(q, k, v, o, b_start_loc, b_seq_len, max_input_len, is_causal=True,
                          softmax_scale=None, sliding_window_q=None, sliding_window_k=None, sinks=None,
                          sinks_bias_key0=False):  # fmt: skip
    CALLS.append({"o": o, "sliding_window_q": sliding_window_q, "is_causal": is_causal})
    left = sliding_window_q if sliding_window_q is not None and sliding_window_q > 0 else -1
    right = sliding_window_k if sliding_window_k is not None and sliding_window_k > 0 else -1
    for start, n in zip(b_start_loc.tolist(), b_seq_len.tolist(), strict=True):
        rows = slice(start, start + n)
        cu = b_seq_len.new_tensor([0, n])
        ref = attention_varlen(
            q[rows], k[rows], v[rows], cu, cu, causal=is_causal, window=(left, right),
            softmax_scale=softmax_scale, sinks=sinks,
            sinks_mode="bias_key0" if sinks_bias_key0 else "denominator",
        )  # fmt: skip
        o[rows] = ref.to(o.dtype)
