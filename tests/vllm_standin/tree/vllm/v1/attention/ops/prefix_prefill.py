"""Stand-in for ``vllm.v1.attention.ops.prefix_prefill`` (tests only): the ``context_attention_fwd`` the
prefix-prefill plugin replaces. It records each call in :data:`CALLS` and writes the float64 reference
(``attn_reference``) into ``o``, so a test sees which function ran and that the answer is right. It
takes the arguments by vLLM 0.33's names and implements what the plugin tests pass: a split cache in
``q``'s dtype, ALiBi, sinks, a sliding window, ``causal``."""

from __future__ import annotations

from attn_reference import paged_prefix_attention

CALLS: list[dict] = []


def context_attention_fwd(q, k, v, o, kv_cache_dtype, k_cache, v_cache, b_loc, b_start_loc, b_seq_len,
                          max_seq_len, max_input_len, k_scale, v_scale, alibi_slopes=None,
                          sliding_window=None, sm_scale=None, skip_decode=False, fp8_out_scale=None,
                          sinks=None, is_block_table_ptr=False, interleaved_v_pack_factor=0,
                          causal=True):  # fmt: skip
    CALLS.append({"o": o, "sliding_window": sliding_window, "causal": causal})
    if kv_cache_dtype != "auto" or skip_decode or fp8_out_scale is not None or is_block_table_ptr:
        raise NotImplementedError("the vLLM stand-in implements kv_cache_dtype='auto' calls only")
    if interleaved_v_pack_factor:
        raise NotImplementedError("the vLLM stand-in reads [blocks, heads, head_size, page] V caches only")
    window = (sliding_window - 1, -1) if sliding_window is not None and sliding_window > 0 else (-1, -1)
    ref = paged_prefix_attention(
        q, k, v, k_cache, v_cache, b_loc, b_start_loc, b_seq_len, layout="split", causal=causal,
        window=window, softmax_scale=sm_scale, alibi_slopes=alibi_slopes, sinks=sinks,
    )  # fmt: skip
    o.copy_(ref.to(o.dtype))
