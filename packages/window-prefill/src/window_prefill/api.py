"""The public functions and their host-side checks: :func:`window_prefill`, :func:`explain` and
:func:`context_attention_fwd`.

* :func:`window_prefill` -- Pythonic form: ``cu_seqlens`` and a FlashAttention-style inclusive
  ``window=(left, right)`` (``-1`` = unbounded), returns the output (and optionally the LSE);
* :func:`explain` -- the :class:`prefill_runtime.LaunchPlan` a :func:`window_prefill` call with the
  same arguments runs (which kernel and why), without launching anything;
* :func:`context_attention_fwd` -- drop-in for vLLM's
  ``vllm/v1/attention/ops/triton_prefill_attention.py::context_attention_fwd`` (writes into ``o``).

Each checks its arguments on the host (types, shapes, dtypes, devices, strides: tensor metadata only)
and calls the custom op ``torch.ops.window_prefill.fwd`` (:func:`window_prefill.ops.call`), which plans
and launches one kernel (:mod:`window_prefill.launch`). Neither synchronises with the device on the
default path (CUDA-graph capturable, ``torch.compile(fullgraph=True)``-clean). Checks that need device
values (lengths against tensors, ``cu_seqlens`` monotonic, ``max_seqlen`` large enough) run only
with ``validate=True`` or the environment variable ``PREFILL_VALIDATE=1``.
"""

from __future__ import annotations

import math
import numbers

import torch

from prefill_runtime import LaunchPlan, check_lse
from prefill_runtime.checks import validate_requested
from prefill_runtime.compiled_launch import launch_directly
from prefill_runtime.fp8 import FP8_DTYPES, Scale, check_fp8_supported, scale_of
from prefill_runtime.signatures import Seen, bump_versions, index_key, rows_key, whole_key
from prefill_runtime.status import check_status
from window_prefill import launch, ops  # ops registers torch.ops.window_prefill.fwd
from window_prefill.configs import MAX_HEAD_DIM, Config
from window_prefill.launch import _UNBOUNDED_WINDOW
from window_prefill.plan import plan

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # the dtypes the kernels compute in
_INDEX_DTYPES = (torch.int32, torch.int64)  # of cu_seqlens, b_start_loc, b_seq_len: read as they are
_MAX_BATCH = 65535  # the grid's z dimension holds one sequence each: CUDA's limit
_FP8_OUT_NEEDS_OUT = (
    "fp8_out_scale needs out: an fp8 tensor of q's shape [total_tokens, num_heads, head_dim] for the kernel "
    "to write"
)
# call signature (prefill_runtime.signatures) -> the launch.Prepared its later calls repeat: a signature's
# first call runs every check; a later one checks what the signature leaves open (token count, batch,
# max length) and launches (launch.repeat). Only calls whose checks pass their tensors on as they are
# (unit-stride index tensors and sinks) and that take the default config are kept.
SEEN = Seen(256)
SINKS_MODES = ("denominator", "bias_key0")


def window_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    *,
    causal: bool = True,
    window: tuple[int, int] = (-1, -1),
    softmax_scale: float | None = None,
    sinks: torch.Tensor | None = None,
    sinks_mode: str = "denominator",
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    fp8_out_scale: Scale = None,
    return_lse: bool = False,
    lse: torch.Tensor | None = None,
    validate: bool = False,
    config: Config | None = None,
    status: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Varlen (packed) self-attention prefill with a sliding window; cost O(tokens * window).

    Sequence ``b`` of the batch is tokens ``[cu_seqlens[b], cu_seqlens[b + 1])`` of ``q``, ``k`` and
    ``v`` (queries and keys share positions: token ``i`` of a sequence is query ``i`` and key ``i``).

    Args:
        q: ``[total_tokens, num_heads, head_dim]`` float16, bfloat16 or float32.
        k: ``[total_tokens, num_kv_heads, head_dim]``, q's dtype and device, ``num_heads`` a multiple
            of ``num_kv_heads``: query head ``h`` reads kv head ``h // (num_heads // num_kv_heads)``
            (MHA, GQA, MQA). ``head_dim`` is any value in 1..256 (padded inside the kernel to a power
            of two).
        v: like ``k``.
        cu_seqlens: int32 or int64 ``[batch + 1]``, non-decreasing, ``cu_seqlens[-1] <= total_tokens``
            (tokens past it belong to no sequence and are not written). ``batch`` <= 65535.
        max_seqlen: Python int >= the longest sequence; it only sizes the launch grid (and, with the
            window, tells whether a row may see 512+ keys, the Gluon kernel's rule).
        causal: query ``i`` sees keys ``j <= i`` only.
        window: ``(left, right)``, inclusive, FlashAttention's convention: key ``j`` is visible to
            query ``i`` iff ``(not causal or j <= i)`` and ``(left == -1 or i - j <= left)`` and
            ``(right == -1 or j - i <= right)``. ``-1`` = unbounded, ``(-1, -1)`` = full attention,
            ``0`` = that side stops at the diagonal; widths beyond any sequence are unbounded.
        softmax_scale: logits are ``softmax_scale * q.k``; default ``1 / sqrt(head_dim)``.
        sinks: optional ``[num_heads]`` float16/bfloat16/float32 (read as float32), one logit per head.
            ``-inf`` disables a head's sink.
        sinks_mode: ``"denominator"``: ``sinks[h]`` is an extra logit in the softmax denominator
            only (gpt-oss); ``"bias_key0"``: ``sinks[h]`` is added to the logit of key 0 of each
            sequence, where visible.
        softcap: ``> 0``: logits ``softcap * tanh(softmax_scale * q.k / softcap)`` (Gemma 2's
            soft-capping, FlashAttention's ``softcap``); a ``bias_key0`` sink is added after the cap,
            a denominator sink is not capped. ``0``: off.
        alibi_slopes: optional ``[num_heads]`` float16/bfloat16/float32 ALiBi slopes (FlashAttention's
            ``alibi_slopes``): ``- alibi_slopes[h] * |i - j|`` is added to the logit of query ``i`` and
            key ``j`` of head ``h``, after ``softmax_scale`` and ``softcap``, before a ``bias_key0``
            sink.
        out: optional ``[total_tokens, num_heads, head_dim]`` buffer of q's dtype, written in place;
            allocated (contiguous) when None. Tokens outside every sequence are left untouched. With
            ``fp8_out_scale``: required, q's shape in float8_e4m3fn or float8_e5m2 (float8_e4m3fnuz on
            MI300).
        fp8_out_scale: the output's fp8 quantisation scale (a float or a 1-element floating-point tensor
            on q's device, finite and > 0): ``out = clamp(attention / fp8_out_scale)`` to the fp8
            format's finite range, as vLLM's fused output quantisation (and prefix-prefill's
            ``fp8_out_scale``); None (default): ``out`` in q's dtype. A row that sees no key is 0.
        return_lse: also return each row's softmax log-sum-exp (FlashAttention's
            ``return_softmax_lse``, FlashInfer's ``return_lse``; engines merge partial attention
            states with it): natural log, ``lse[h, i] = log(sum_j exp(s_ij))`` over the keys row ``i``
            sees, ``s_ij`` the logit the softmax normalises (after ``softmax_scale``, ``softcap`` and
            a ``bias_key0`` sink); a ``"denominator"`` sink adds ``exp(sinks[h])`` to the sum. A row
            that sees no key (a ``bias_key0`` sink of ``-inf`` on the one key its window leaves) gets
            ``-inf``. Tokens outside every sequence are not written. ALiBi's term is part of ``s_ij``.
        lse: optional float32 ``[num_heads, total_tokens]`` buffer with a unit last stride (heads
            first, FlashAttention's varlen layout), written in place; only with ``return_lse=True``;
            allocated when None.
        validate: also check the device values (``cu_seqlens`` non-decreasing and within the
            tensors, ``max_seqlen`` large enough): one host sync. The environment variable
            ``PREFILL_VALIDATE=1`` turns it on for every call. Off, nothing is read from the device.
        config: a :class:`~window_prefill.configs.Config` replacing the per-architecture table entry
            (tests, benchmark sweeps); None: the table (see :func:`explain` for the launch it gives).
        status: optional int32 ``[1]`` device tensor (:func:`prefill_runtime.status.new_status`): the
            kernel ORs the bits of :mod:`prefill_runtime.status` into it when it meets malformed
            metadata (``ROWS`` 4: ``cu_seqlens`` decreasing, negative or past the tokens; ``MAX_LEN``
            8: a sequence longer than ``max_seqlen``), with no host sync and nothing written on
            well-formed calls: read it when convenient, clear it yourself.

    Memory safety without ``validate``: whatever ``cu_seqlens`` and ``max_seqlen`` hold, every load and
    store stays inside the tensors (each sequence's span clamped into ``[0, total_tokens)``), and every
    row of ``[cu_seqlens[0], cu_seqlens[-1])`` is written: rows past the grid of a too small
    ``max_seqlen`` are 0. A malformed sequence's rows are then wrong but finite; ``status`` says so.

    Strides: any, as long as each tensor's last dimension has unit stride (slices of a packed qkv
    projection work as they are, without copies). Every tensor must be on q's device.

    Rows that see no key are 0. No host synchronisation, no allocation besides ``out`` and ``lse``
    when not given, one kernel launch: the call can be captured in a CUDA graph and traced by
    ``torch.compile(fullgraph=True)``.

    Returns:
        ``out``, or ``(out, lse)`` with ``return_lse=True``.

    Example (two sequences of 5 and 3 tokens, 4 query heads over 2 kv heads, a 2-token left window)::

        import torch
        from window_prefill import window_prefill

        q = torch.randn(8, 4, 64, dtype=torch.float16, device="cuda")
        k = torch.randn(8, 2, 64, dtype=torch.float16, device="cuda")
        v = torch.randn_like(k)
        cu = torch.tensor([0, 5, 8], dtype=torch.int32, device="cuda")
        out, lse = window_prefill(q, k, v, cu, 5, causal=True, window=(2, -1), return_lse=True)
        assert out.shape == (8, 4, 64) and lse.shape == (4, 8)
    """
    key = None
    if _may_repeat(q, config, validate):
        key = _py_key(q, k, v, out, cu_seqlens, causal, window, softmax_scale, sinks, sinks_mode, softcap,
                      return_lse, lse, status, alibi_slopes, fp8_out_scale)  # fmt: skip
        prep = SEEN.lookup(key) if key is not None else None
        if prep is not None:
            tokens, batch = q.shape[0], cu_seqlens.shape[0] - 1
            if (
                k.shape[0] == tokens
                and v.shape[0] == tokens
                and (out is None or out.shape[0] == tokens)
                and (lse is None or lse.shape[1] == tokens)
                and 0 <= batch <= _MAX_BATCH
                and type(max_seqlen) is int
                and max_seqlen >= 0
                and launch.still_planned(prep)
            ):
                if out is None:
                    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
                if return_lse and lse is None:
                    lse = torch.empty((q.shape[1], tokens), dtype=torch.float32, device=q.device)
                os_ = None if fp8_out_scale is None else scale_of(fp8_out_scale, "fp8_out_scale", q.device)
                launch.repeat(prep, q, k, v, out, cu_seqlens, None, max_seqlen, batch, sinks, lse, status,
                              alibi_slopes, os_)  # fmt: skip
                bump_versions(out, lse, status)
                return (out, lse) if return_lse else out
    out_fp8 = fp8_out_scale is not None
    if out is None:
        _check_qkvo(q, k, v, q, "out")
        if out_fp8:
            raise ValueError(_FP8_OUT_NEEDS_OUT)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    else:
        _check_qkvo(q, k, v, out, "out", out_fp8)
    os_ = scale_of(fp8_out_scale, "fp8_out_scale", q.device) if out_fp8 else None
    lse = check_lse(return_lse, lse, q, "total_tokens")
    status = check_status(status, q.device)
    cu, max_len, left, right, scale, sinks_t, bias_key0, cap = _window_args(
        q, cu_seqlens, max_seqlen, window, softmax_scale, sinks, sinks_mode, softcap, validate
    )
    slopes = _check_alibi(alibi_slopes, q.shape[1], q.device)
    ops.call(
        q, k, v, out, cu, None, max_len, bool(causal), left, right, scale, sinks_t, bias_key0,
        *ops.config_ints(config), cap, lse, status, slopes, os_,
    )  # fmt: skip
    if (
        key is not None
        and cu is cu_seqlens
        and sinks_t is sinks
        and slopes is alibi_slopes
        and (lse is None or lse.stride(1) == 1)
    ):
        # (a signature whose checks passed its tensors on as they are; lse with a unit token stride)
        prep = launch.prepare(q, k, v, out, cu, None, max_len, causal=bool(causal),
                              window_left=left, window_right=right, softmax_scale=scale, sinks=sinks_t,
                              bias_key0=bias_key0, config=None, softcap=cap, lse=lse,
                              status=status, alibi_slopes=slopes, out_scale=os_)  # fmt: skip
        if prep is not None:
            SEEN.remember(key, prep)
    if return_lse:
        return out, lse
    return out


def explain(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    *,
    causal: bool = True,
    window: tuple[int, int] = (-1, -1),
    softmax_scale: float | None = None,
    sinks: torch.Tensor | None = None,
    sinks_mode: str = "denominator",
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    fp8_out_scale: Scale = None,
    return_lse: bool = False,
    lse: torch.Tensor | None = None,
    validate: bool = False,
    config: Config | None = None,
    status: torch.Tensor | None = None,
) -> LaunchPlan:
    """The launch :func:`window_prefill` makes with these arguments, without making it: a
    :class:`prefill_runtime.LaunchPlan` whose ``kernel`` is ``"triton"`` or ``"gluon"``, ``reason``
    the rule that chose it (and why the Gluon kernel does not apply), ``constexprs`` and ``options``
    what the kernel compiles with (:mod:`window_prefill.plan`). The arguments are checked as
    :func:`window_prefill` checks them (``status`` plays no part in the plan); nothing is allocated or
    launched. A call without sequences or tokens launches nothing at all; its plan is still returned."""
    out_fp8 = fp8_out_scale is not None
    _check_qkvo(q, k, v, q if out is None else out, "out", out_fp8 and out is not None)
    if out_fp8:
        if out is None:
            raise ValueError(_FP8_OUT_NEEDS_OUT)
        scale_of(fp8_out_scale, "fp8_out_scale", q.device)
    if lse is not None or not return_lse:
        check_lse(return_lse, lse, q, "total_tokens")
    elif not isinstance(return_lse, bool):  # pragma: no cover - True passes the test above
        raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    _cu, _max_len, left, right, scale, sinks_t, bias_key0, cap = _window_args(
        q, cu_seqlens, max_seqlen, window, softmax_scale, sinks, sinks_mode, softcap, validate
    )
    slopes = _check_alibi(alibi_slopes, q.shape[1], q.device)
    left = -1 if left >= _UNBOUNDED_WINDOW else left
    right = -1 if right >= _UNBOUNDED_WINDOW else right
    return plan(
        launch.describe(
            q, k, v, None, causal=bool(causal), window_left=left, window_right=right,
            softmax_scale=scale, sinks=sinks_t, bias_key0=bias_key0, softcap=cap, return_lse=bool(return_lse),
            config=config, alibi_slopes=slopes, out_dtype=None if out is None else out.dtype,
        )
    )  # fmt: skip


def _window_args(q, cu_seqlens, max_seqlen, window, softmax_scale, sinks, sinks_mode, softcap, validate):
    """The checked op arguments of the ``cu_seqlens`` form: ``(cu, max_len, left, right, scale, sinks,
    bias_key0, softcap)``, windows clipped to the op's unbounded width."""
    cu = _check_index("cu_seqlens", cu_seqlens, q.device, "[batch + 1]")
    if cu.shape[0] < 1:
        raise ValueError("cu_seqlens must have at least one entry [batch + 1], got 0")
    _check_batch(cu.shape[0] - 1)
    max_len = _check_max_len("max_seqlen", max_seqlen)
    left, right = _check_window(window)
    if sinks_mode not in SINKS_MODES:
        raise ValueError(f"sinks_mode must be one of {SINKS_MODES}, got {sinks_mode!r}")
    sinks_t = _check_sinks(sinks, q.shape[1], q.device)
    scale = _check_scale(softmax_scale, q.shape[2])
    cap = _check_softcap(softcap)
    if validate_requested(validate):
        _validate_cu_seqlens(cu, max_len, q.shape[0])
    # the op takes int64 windows: any width past the cap is unbounded
    left, right = min(left, _UNBOUNDED_WINDOW), min(right, _UNBOUNDED_WINDOW)
    return cu, max_len, left, right, scale, sinks_t, sinks_mode == "bias_key0", cap


def context_attention_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    b_start_loc: torch.Tensor,
    b_seq_len: torch.Tensor,
    max_input_len: int,
    is_causal: bool = True,
    softmax_scale: float | None = None,
    sliding_window_q: int | None = None,
    sliding_window_k: int | None = None,
    sinks: torch.Tensor | None = None,
    sinks_bias_key0: bool = False,
    *,
    validate: bool = False,
    config: Config | None = None,
    status: torch.Tensor | None = None,
) -> torch.Tensor:
    """Drop-in for vLLM's ``triton_prefill_attention.context_attention_fwd``; writes into ``o``.

    Tensors (token-major, packed over the batch; any strides with a unit last stride, no copies):

    * ``q``, ``o``: ``[total_tokens, num_heads, head_dim]`` float16 / bfloat16 / float32 (same dtype).
    * ``k``, ``v``: ``[total_tokens, num_kv_heads, head_dim]``, ``num_heads % num_kv_heads == 0``.
      ``head_dim`` <= 256.
    * ``b_start_loc``: int32/int64 ``[batch]``: first token of each sequence (sequences need not be
      adjacent; tokens between them are not written).
    * ``b_seq_len``: int32/int64 ``[batch]``: each sequence's length. ``b_start_loc`` and ``b_seq_len``
      of different lengths are a ``ValueError``.
    * ``max_input_len``: Python int >= every ``b_seq_len``; only sizes the launch grid.
    * ``sinks``: optional float16/bfloat16/float32 ``[num_heads]``: an extra logit in the softmax
      denominator, or, with ``sinks_bias_key0=True``, a bias added to the logit of key 0 of each sequence.

    Masking: key ``j`` visible to query ``i`` (positions within the sequence) iff
    ``(not is_causal or j <= i)`` and, when ``sliding_window_q`` is given and > 0,
    ``i - j <= sliding_window_q``, and, when ``sliding_window_k`` is given and > 0,
    ``j - i <= sliding_window_k``. (``None`` or ``<= 0`` means unbounded, as in vLLM;
    :func:`window_prefill` uses FlashAttention's ``-1`` instead, where ``0`` means "diagonal only".)

    ``validate=True`` (or env ``PREFILL_VALIDATE=1``) adds device-value checks (one host sync).
    ``status``: optional int32 ``[1]`` device tensor the kernel ORs the bits of
    :mod:`prefill_runtime.status` into on malformed metadata (``ROWS`` 4: a negative start or length, or
    a sequence past the tokens; ``MAX_LEN`` 8: a sequence longer than ``max_input_len``), as
    :func:`window_prefill`'s; without ``validate`` every load and store stays inside the tensors
    whatever ``b_start_loc``/``b_seq_len`` hold (overlapping sequences are not detected: each is
    computed, and their common rows written by one of them). Returns ``o``.
    """
    key = None
    if _may_repeat(q, config, validate):
        key = _caf_key(q, k, v, o, b_start_loc, b_seq_len, is_causal, softmax_scale, sliding_window_q,
                       sliding_window_k, sinks, sinks_bias_key0, status)  # fmt: skip
        prep = SEEN.lookup(key) if key is not None else None
        if prep is not None:
            tokens, batch = q.shape[0], b_seq_len.shape[0]
            if (
                k.shape[0] == tokens
                and v.shape[0] == tokens
                and o.shape[0] == tokens
                and b_start_loc.shape[0] == batch
                and batch <= _MAX_BATCH
                and type(max_input_len) is int
                and max_input_len >= 0
                and launch.still_planned(prep)
            ):
                launch.repeat(
                    prep, q, k, v, o, b_start_loc, b_seq_len, max_input_len, batch, sinks, None, status
                )
                bump_versions(o, None, status)
                return o
    _check_qkvo(q, k, v, o, "o")
    status = check_status(status, q.device)
    lens = _check_index("b_seq_len", b_seq_len, q.device, "[batch]")
    starts = _check_index("b_start_loc", b_start_loc, q.device, "[batch]")
    batch = lens.shape[0]
    if starts.shape[0] != batch:
        raise ValueError(
            f"b_start_loc and b_seq_len must have one entry per sequence each (batch = {batch} from "
            f"b_seq_len), got {starts.shape[0]} and {batch}"
        )
    _check_batch(batch)
    max_len = _check_max_len("max_input_len", max_input_len)
    left = _vllm_window("sliding_window_q", sliding_window_q)
    right = _vllm_window("sliding_window_k", sliding_window_k)
    sinks_t = _check_sinks(sinks, q.shape[1], q.device)
    scale = _check_scale(softmax_scale, q.shape[2])
    if validate_requested(validate):
        _validate_starts_lens(starts, lens, max_len, q.shape[0])
    left, right = min(left, _UNBOUNDED_WINDOW), min(right, _UNBOUNDED_WINDOW)  # (the op takes int64: any
    # width past the cap is unbounded)
    ops.call(
        q, k, v, o, starts, lens, max_len, bool(is_causal), left, right, scale, sinks_t,
        bool(sinks_bias_key0), *ops.config_ints(config), 0.0, None, status,
    )  # fmt: skip
    if key is not None and starts is b_start_loc and lens is b_seq_len and sinks_t is sinks:
        prep = launch.prepare(q, k, v, o, starts, lens, max_len, causal=bool(is_causal), window_left=left,
                              window_right=right, softmax_scale=scale, sinks=sinks_t,
                              bias_key0=bool(sinks_bias_key0), config=None, softcap=0.0,
                              lse=None, status=status)  # fmt: skip
        if prep is not None:
            SEEN.remember(key, prep)
    return o


# ------------------------------------------------------------------------------- call signatures
def _may_repeat(q: object, config: object, validate: bool) -> bool:
    """Whether a call may take its signature's warm path (:data:`SEEN`): a tensor q, the default config,
    no device-value checks, launched directly (not traced by ``torch.compile`` or a dispatch mode)."""
    return (
        isinstance(q, torch.Tensor)
        and config is None
        and launch_directly()
        and not validate_requested(validate)
    )


def _py_key(q, k, v, out, cu_seqlens, causal, window, softmax_scale, sinks, sinks_mode, softcap, return_lse,
            lse, status, alibi_slopes, fp8_out_scale) -> tuple | None:  # fmt: skip
    """The signature of a :func:`window_prefill` call; None where an argument is not of a type the key
    can read (the full checks reject it)."""
    try:
        lse_key = (
            None if lse is None else (lse.shape[0], lse.stride(), lse.dtype, lse.device, lse.data_ptr() & 15)
        )
        return ("py", rows_key(q), rows_key(k), rows_key(v), rows_key(out), index_key(cu_seqlens), causal,
                tuple(window) if isinstance(window, list) else window, softmax_scale, whole_key(sinks),
                sinks_mode, softcap, return_lse, lse_key,
                whole_key(status), whole_key(alibi_slopes), whole_key(fp8_out_scale))  # fmt: skip
    except (AttributeError, TypeError, IndexError):
        return None


def _caf_key(q, k, v, o, b_start_loc, b_seq_len, is_causal, softmax_scale, sliding_window_q, sliding_window_k,
             sinks, sinks_bias_key0, status) -> tuple | None:  # fmt: skip
    """The signature of a :func:`context_attention_fwd` call; None as :func:`_py_key`."""
    try:
        return ("caf", rows_key(q), rows_key(k), rows_key(v), rows_key(o), index_key(b_start_loc),
                index_key(b_seq_len), is_causal, softmax_scale, sliding_window_q, sliding_window_k,
                whole_key(sinks), sinks_bias_key0, whole_key(status))  # fmt: skip
    except (AttributeError, TypeError, IndexError):
        return None


# ------------------------------------------------------------------------------- host-side checks
def _check_batch(batch: int) -> None:
    if batch > _MAX_BATCH:
        raise ValueError(f"batch must be <= {_MAX_BATCH} sequences, got {batch}")


# the documented shape of each tensor argument, for the messages
_SHAPES = {
    "q": "[total_tokens, num_heads, head_dim]",
    "k": "[total_tokens, num_kv_heads, head_dim]",
    "v": "[total_tokens, num_kv_heads, head_dim]",
    "out": "[total_tokens, num_heads, head_dim]",
    "o": "[total_tokens, num_heads, head_dim]",
}


def _check_qkvo(q: object, k: object, v: object, o: object, out_name: str, out_fp8: bool = False) -> None:
    """Host-only (shape/dtype/device/stride) checks of q, k, v and the output buffer (``out_fp8``: an fp8
    output, quantised by a scale the caller gave; else one in q's dtype)."""
    named = (("q", q), ("k", k), ("v", v), (out_name, o))
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    assert isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)
    assert isinstance(v, torch.Tensor) and isinstance(o, torch.Tensor)
    for name, t in named:
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D {_SHAPES[name]}, got shape {tuple(t.shape)}")
    dtype, device = q.dtype, q.device
    if dtype not in _FLOAT_DTYPES:
        raise TypeError(f"q must be float16, bfloat16 or float32, got {dtype}")
    for name, t in named[1:]:
        if name == out_name and out_fp8:
            if t.dtype not in FP8_DTYPES:
                raise TypeError(f"{name} must be an fp8 tensor when fp8_out_scale is given, got {t.dtype}")
            check_fp8_supported(t.dtype, device, name)
        elif name == "out" and t.dtype in FP8_DTYPES:
            raise TypeError(f"{name} is {t.dtype}: an fp8 output needs its quantisation scale, fp8_out_scale")
        elif t.dtype != dtype:
            raise TypeError(f"{name} dtype {t.dtype} does not match q dtype {dtype}")
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but q is on {device}")
    if device.type == "cpu" and not launch.interpreted():
        raise ValueError(
            "q is a CPU tensor: the kernels run on a GPU (CUDA or ROCm), or on the CPU under the Triton "
            "interpreter (set TRITON_INTERPRET=1 in the environment before importing window_prefill)"
        )
    q_shape, k_shape = q.shape, k.shape
    total, heads, head_dim = q_shape
    if head_dim > MAX_HEAD_DIM or head_dim < 1:
        raise ValueError(f"q head_dim must be in [1, {MAX_HEAD_DIM}], got {head_dim}")
    if k_shape[0] != total:
        raise ValueError(
            f"k has {k_shape[0]} tokens but q has {total}; expected k {_SHAPES['k']} with {total} tokens"
        )
    if k_shape[2] != head_dim:
        raise ValueError(f"k head_dim {k_shape[2]} does not match q head_dim {head_dim}")
    if heads < 1:
        raise ValueError(f"q must have at least one head {_SHAPES['q']}, got num_heads = {heads}")
    if k_shape[1] < 1 or heads % k_shape[1] != 0:
        raise ValueError(f"q num_heads {heads} must be a multiple of k num_kv_heads {k_shape[1]}")
    if v.shape != k_shape:
        raise ValueError(f"v must have k's shape {tuple(k_shape)} {_SHAPES['v']}, got {tuple(v.shape)}")
    if o.shape != q_shape:
        raise ValueError(
            f"{out_name} must have q's shape {tuple(q_shape)} {_SHAPES[out_name]}, got {tuple(o.shape)}"
        )
    if head_dim > 1:  # a last dimension of one element has any stride
        for name, t in named:
            if t.stride(2) != 1:
                raise ValueError(
                    f"{name} must have unit stride in its last (head_dim) dimension, got strides {t.stride()}"
                )


def _check_index(name: str, t: object, device: torch.device, doc: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {doc}, got {type(t).__name__}")
    if t.dtype not in _INDEX_DTYPES:
        raise TypeError(f"{name} must be int32 or int64 {doc}, got {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D {doc}, got shape {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but q is on {device}")
    return t if t.stride(0) == 1 else t.contiguous()


def _check_max_len(name: str, value: object) -> int:
    if type(value) is int and value >= 0:  # the common case, without the abstract-class checks
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a Python int (the longest sequence), got {type(value).__name__}")
    if int(value) < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return int(value)


# the per-head float tensors' dtypes: the kernels read them as float32 whatever they are stored in
_PER_HEAD_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def _check_sinks(sinks: object, heads: int, device: torch.device) -> torch.Tensor | None:
    return _check_per_head("sinks", sinks, _PER_HEAD_FLOATS, "float16, bfloat16 or float32", heads, device)


def _check_alibi(slopes: object, heads: int, device: torch.device) -> torch.Tensor | None:
    return _check_per_head("alibi_slopes", slopes, _PER_HEAD_FLOATS, "float16, bfloat16 or float32", heads,
                           device)  # fmt: skip


def _check_per_head(name: str, t: object, dtypes: tuple, dtype_doc: str, heads: int,
                    device: torch.device) -> torch.Tensor | None:  # fmt: skip
    """A ``[num_heads]`` tensor of one of ``dtypes`` on q's device (None passes), unit-stride."""
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a {dtype_doc} torch.Tensor [num_heads], got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} must be {dtype_doc} [num_heads], got {t.dtype}")
    if tuple(t.shape) != (heads,):
        raise ValueError(f"{name} must have shape [num_heads] = ({heads},), got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but q is on {device}")
    return t if t.stride(0) == 1 else t.contiguous()


def _check_scale(softmax_scale: object, head_dim: int) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real):
        raise TypeError(f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}")
    if not math.isfinite(float(softmax_scale)):
        raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")
    return float(softmax_scale)


def _check_softcap(softcap: object) -> float:
    if type(softcap) is float and 0.0 <= softcap < math.inf:  # the common case (NaN fails it)
        return softcap
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be a float (0 = off), got {type(softcap).__name__}")
    if not math.isfinite(float(softcap)) or float(softcap) < 0:
        raise ValueError(f"softcap must be a finite float >= 0 (0 = off), got {softcap}")
    return float(softcap)


def _check_window(window: object) -> tuple[int, int]:
    if type(window) is tuple and len(window) == 2:  # the common case, without the abstract-class checks
        left, right = window
        if type(left) is int and type(right) is int and left >= -1 and right >= -1:
            return left, right
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise ValueError(f"window must be a (left, right) pair of ints, got {window!r}")
    out = []
    for side, w in zip(("left", "right"), window, strict=True):
        if isinstance(w, bool) or not isinstance(w, numbers.Integral):
            raise TypeError(f"window {side} must be an int, got {type(w).__name__}")
        if int(w) < -1:
            raise ValueError(f"window {side} must be >= -1 (-1 = unbounded), got {w}")
        out.append(int(w))
    return out[0], out[1]


def _vllm_window(name: str, value: object) -> int:
    """vLLM window convention -> inclusive width or -1: None or <= 0 means unbounded."""
    if value is None:
        return -1
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int or None, got {type(value).__name__}")
    return int(value) if int(value) > 0 else -1


def _validate_cu_seqlens(cu: torch.Tensor, max_len: int, total: int) -> None:
    """Device-value checks of cu_seqlens (one device-to-host copy)."""
    c = cu.detach().to("cpu", torch.int64)
    if int(c[0]) < 0:
        raise ValueError(f"cu_seqlens[0] must be >= 0, got {int(c[0])}")
    d = c[1:] - c[:-1]
    if d.numel() and int(d.min()) < 0:
        b = int(torch.nonzero(d < 0)[0])
        raise ValueError(f"cu_seqlens must be non-decreasing: cu_seqlens[{b + 1}] < cu_seqlens[{b}]")
    if int(c[-1]) > total:
        raise ValueError(f"cu_seqlens[-1] = {int(c[-1])} is beyond the {total} tokens of q/k/v")
    if d.numel() and int(d.max()) > max_len:
        raise ValueError(
            f"max_seqlen = {max_len} is smaller than the longest sequence ({int(d.max())} tokens)"
        )


def _validate_starts_lens(starts: torch.Tensor, lens: torch.Tensor, max_len: int, total: int) -> None:
    """Device-value checks of b_start_loc / b_seq_len (one device-to-host copy)."""
    s = starts.detach().to("cpu", torch.int64)
    n = lens.detach().to("cpu", torch.int64)
    if n.numel() == 0:
        return
    if int(n.min()) < 0:
        b = int(torch.nonzero(n < 0)[0])
        raise ValueError(f"b_seq_len[{b}] = {int(n[b])} is negative")
    if int(s.min()) < 0:
        b = int(torch.nonzero(s < 0)[0])
        raise ValueError(f"b_start_loc[{b}] = {int(s[b])} is negative")
    end = s + n
    order = torch.argsort(s, stable=True)
    s_sorted, e_sorted = s[order], end[order]
    overlap = (s_sorted[1:] < e_sorted[:-1]) & (n[order][1:] > 0) & (n[order][:-1] > 0)
    if bool(overlap.any()):
        i = int(torch.nonzero(overlap)[0])
        a, b = int(order[i]), int(order[i + 1])
        raise ValueError(
            f"b_start_loc/b_seq_len: sequence {b} (tokens [{int(s[b])}, {int(end[b])})) overlaps sequence "
            f"{a} (tokens [{int(s[a])}, {int(end[a])})); sequences must occupy disjoint token ranges"
        )
    if int(end.max()) > total:
        b = int(torch.nonzero(end > total)[0])
        raise ValueError(
            f"b_seq_len[{b}] = {int(n[b])} from b_start_loc[{b}] = {int(s[b])} runs beyond "
            f"the {total} tokens of q/k/v"
        )
    if int(n.max()) > max_len:
        raise ValueError(f"max_input_len = {max_len} is smaller than the longest b_seq_len ({int(n.max())})")
