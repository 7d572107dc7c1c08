"""Call signatures seen before, and the launch a repeated one runs without the full checks.

A call signature is what the host-side checks, the problem and the plan depend on: every tensor's
strides, dtype, device and 16-byte alignment, its shape but for the token count (q/k/v/out/lse), the
batch (the index tensors) and the block table's size, and every option. A signature's first call runs
the full checks and leaves its :class:`prefix_prefill.launch.Prepared` in :data:`SEEN`; a later call
of that signature checks only what the signature leaves open (:func:`repeat`) and launches it
(:func:`prefix_prefill.launch.run_prepared`). Bounded (the oldest signature dropped first).
"""

from __future__ import annotations

import torch

from prefill_runtime.signatures import Seen, bump_versions, index_key, rows_key, table_key, whole_key
from prefix_prefill import checks, gluon_launch, launch, ops
from prefix_prefill.checks import FP8_DTYPES

# call signature -> the launch.Prepared it runs
SEEN = Seen(256)


def vllm_key(kv_cache_dtype, q, k, v, o, k_cache, v_cache, b_loc, b_start_loc, b_seq_len, k_scale, v_scale,
             alibi, sliding_window, sm_scale, skip_decode, fp8_out_scale, sinks, causal, status):  # fmt: skip
    """The signature of a ``context_attention_fwd`` call (its arguments in order); None where an argument
    is not of a type the key can read (the full checks reject it). The fp8 scales belong to it only with
    an fp8 cache (elsewhere they are not read)."""
    try:
        kc = whole_key(k_cache)
        fp8 = kv_cache_dtype != "auto" or kc[2] in FP8_DTYPES
        return ("vllm", kv_cache_dtype, rows_key(q), rows_key(k), rows_key(v), rows_key(o), kc,
                whole_key(v_cache), table_key(b_loc), index_key(b_start_loc), index_key(b_seq_len),
                whole_key(k_scale) if fp8 else None, whole_key(v_scale) if fp8 else None, whole_key(alibi),
                sliding_window, sm_scale, skip_decode, whole_key(fp8_out_scale), whole_key(sinks),
                causal, whole_key(status))  # fmt: skip
    except (AttributeError, TypeError, IndexError):
        return None


def py_key(q, k, v, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, causal, window, softmax_scale,
           alibi, sinks, k_scale, v_scale, kv_layout, softcap, out, return_lse, lse, status,
           fp8_out_scale=None):  # fmt: skip
    """The signature of a ``prefix_prefill`` call (its arguments in order); None as :func:`vllm_key`. The
    fp8 scales belong to it only with an fp8 (or uint8) cache."""
    try:
        kc = whole_key(k_cache)
        fp8 = kc[2] in FP8_DTYPES or kc[2] == torch.uint8
        lse_key = (
            None if lse is None else (lse.shape[0], lse.stride(1), lse.dtype, lse.device, lse.data_ptr() & 15)
        )
        return ("py", rows_key(q), rows_key(k), rows_key(v), kc, whole_key(v_cache), table_key(block_table),
                index_key(cu_seqlens_q), index_key(seq_lens), causal,
                tuple(window) if isinstance(window, list) else window, softmax_scale, whole_key(alibi),
                whole_key(sinks), whole_key(k_scale) if fp8 else None, whole_key(v_scale) if fp8 else None,
                kv_layout, softcap, rows_key(out), return_lse, lse_key,
                whole_key(status), whole_key(fp8_out_scale))  # fmt: skip
    except (AttributeError, TypeError, IndexError):
        return None


def repeat(
    prep,
    q,
    k,
    v,
    o,
    k_cache,
    v_cache,
    block_table,
    cu,
    sl,
    max_query_len,
    alibi,
    sinks,
    ks,
    vs,
    os_,
    lse,
    names,
    status=None,
) -> bool:
    """Launch a call of a signature seen before (``prep``, :func:`lookup`'s answer) and return True,
    after the checks the signature leaves open: every ``[tokens, ...]`` tensor has q's token count, the
    index tensors agree on the batch, the block table has a row per sequence, ``max_query_len`` is an
    int >= 0; ``status`` (the signature fixed its type, device and shape) is passed on. False: a check
    failed (the full checks say why)."""
    tokens = q.shape[0]
    batch = sl.shape[0]
    if (
        (k is not None and (k.shape[0] != tokens or v.shape[0] != tokens))
        or o.shape[0] != tokens
        or cu.shape[0] != batch + 1
        or block_table.shape[0] < batch
        or batch > checks.MAX_GRID_YZ
        or isinstance(max_query_len, bool)
        or not isinstance(max_query_len, int)
        or max_query_len < 0
        or (lse is not None and lse.shape[1] != tokens)
        or (
            k is not None
            and not prep.problem.new_rows_fit32
            and (tokens + 256) * max(k.stride(0), 1) >= 2**31
        )
    ):
        return False  # the full checks raise the error (or take the other plan)
    if prep.plan.kernel != "triton" and gluon_launch.warm(
        prep.plan, prep.key, q, k, v, o, k_cache, v_cache, block_table, cu, sl, max_query_len, prep.scale,
        lse, status, prep.options(sinks, alibi, os_, ks, vs),
    ):  # fmt: skip
        bump_versions(o, lse, status)
        return True
    with ops.on_device(q.device):
        launch.run_prepared(
            prep,
            q,
            k,
            v,
            o,
            k_cache,
            v_cache,
            block_table,
            cu,
            sl,
            max_query_len,
            alibi,
            sinks,
            ks,
            vs,
            os_,
            lse,
            status,
        )
    bump_versions(o, lse, status)
    return True
