"""Dense variable-length reference attention (float64 by default), torch only.

Everything here is written for clarity first: one sequence at a time in Python, full score matrices
per sequence (chunked over query rows so an 8k x 8k sequence fits in memory), no fused tricks.
"""

from __future__ import annotations

import itertools
import math

import torch

SINKS_MODES = ("denominator", "bias_key0")
NEGATIVE_CONTROL_KINDS = ("window_shift", "diagonal", "scale", "kv_head")

# Budget for one [H, rows, keys] score chunk, in elements (about 1 GiB of float64).
_CHUNK_ELEMS = 1 << 27


def _check_tensor(t: object, name: str, ndim: int, shape_doc: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {shape_doc}, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D {shape_doc}, got shape {tuple(t.shape)}")
    return t


def _check_cu_seqlens(cu: object, name: str, total: int) -> list[int]:
    cu = _check_tensor(cu, name, 1, "[batch + 1]")
    if cu.dtype.is_floating_point or cu.dtype.is_complex or cu.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got {cu.dtype}")
    if cu.numel() < 1:
        raise ValueError(f"{name} must have batch + 1 >= 1 entries, got {cu.numel()}")
    vals = [int(x) for x in cu.tolist()]
    if vals[0] != 0:
        raise ValueError(f"{name}[0] must be 0, got {vals[0]}")
    if any(b < a for a, b in itertools.pairwise(vals)):
        raise ValueError(f"{name} must be non-decreasing, got {vals}")
    if vals[-1] != total:
        raise ValueError(f"{name}[-1] must equal the number of tokens ({total}), got {vals[-1]}")
    return vals


def _check_window(window: object) -> tuple[int, int]:
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"window must be a (left, right) pair of ints, got {window!r}")
    left, right = window
    for side, w in (("left", left), ("right", right)):
        if isinstance(w, bool) or not isinstance(w, int):
            raise TypeError(f"window {side} must be an int (-1 = unbounded), got {w!r}")
        if w < -1:
            raise ValueError(f"window {side} must be >= -1 (-1 = unbounded), got {w}")
    return int(left), int(right)


def _check_options(
    q: torch.Tensor,
    num_kv_heads: int,
    batch: int,
    softmax_scale: float | None,
    alibi_slopes: torch.Tensor | None,
    sinks: torch.Tensor | None,
    sinks_mode: str,
    softcap: float,
    dtype: torch.dtype,
) -> float:
    num_heads = q.shape[1]
    if num_kv_heads < 1 or num_heads % num_kv_heads != 0:
        raise ValueError(
            f"number of query heads ({num_heads}) must be a multiple of "
            f"the number of kv heads ({num_kv_heads})"
        )
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point or dtype.itemsize < 4:
        raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[2]) if q.shape[2] > 0 else 1.0
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        raise TypeError(f"softmax_scale must be a float or None, got {softmax_scale!r}")
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or softcap < 0:
        raise ValueError(f"softcap must be a float >= 0 (0 = off), got {softcap!r}")
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, torch.Tensor):
            raise TypeError(f"alibi_slopes must be a tensor [num_heads], got {type(alibi_slopes).__name__}")
        if tuple(alibi_slopes.shape) not in ((num_heads,), (batch, num_heads)):
            raise ValueError(
                f"alibi_slopes must have shape [num_heads] = [{num_heads}] or [batch, num_heads] = "
                f"[{batch}, {num_heads}], got {tuple(alibi_slopes.shape)}"
            )
    if sinks is not None:
        if not isinstance(sinks, torch.Tensor):
            raise TypeError(f"sinks must be a tensor [num_heads], got {type(sinks).__name__}")
        if tuple(sinks.shape) != (num_heads,):
            raise ValueError(f"sinks must have shape [num_heads] = [{num_heads}], got {tuple(sinks.shape)}")
    if sinks_mode not in SINKS_MODES:
        raise ValueError(f"sinks_mode must be one of {SINKS_MODES}, got {sinks_mode!r}")
    return float(softmax_scale)


def _visible(
    pos_q: torch.Tensor,
    pos_k: torch.Tensor,
    causal: bool,
    left: int,
    right: int,
    window_shift: int = 0,
    diag_offset: int = 0,
) -> torch.Tensor:
    """Mask [rows, keys]: key j visible from a query at key position p.

    ``window_shift``/``diag_offset`` are only used by :func:`negative_control`.
    """
    p = pos_q[:, None]
    j = pos_k[None, :]
    vis = torch.ones(p.shape[0], j.shape[1], dtype=torch.bool, device=pos_q.device)
    if causal:
        vis &= j <= p + diag_offset
    pw = p - window_shift
    if left >= 0:
        vis &= pw - j <= left
    if right >= 0:
        vis &= j - pw <= right + diag_offset
    return vis


def _attend_sequence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    left: int,
    right: int,
    scale: float,
    slopes: torch.Tensor | None,
    sinks: torch.Tensor | None,
    sinks_mode: str,
    softcap: float,
    window_shift: int = 0,
    diag_offset: int = 0,
    kv_head_shift: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence. q [Lq, H, D], k [Lk, Hkv, D], v [Lk, Hkv, Dv] (all already in the compute dtype),
    slopes/sinks [H] in the compute dtype. Returns ``(out [Lq, H, Dv], lse [H, Lq])``: ``lse`` is the
    natural log of each row's softmax denominator, ``torch.logsumexp`` over the visible logits and the
    denominator sink (``-inf`` when there is neither)."""
    len_q, num_heads, _ = q.shape
    len_k, num_kv_heads, dv = v.shape
    out = q.new_zeros(len_q, num_heads, dv)
    denominator_sink = sinks is not None and sinks_mode == "denominator"
    if denominator_sink:
        lse = sinks[:, None].expand(num_heads, len_q).clone()  # no key: the sink alone
    else:
        lse = q.new_full((num_heads, len_q), float("-inf"))
    if len_q == 0 or len_k == 0:
        return out, lse  # nothing visible: zeros
    group = num_heads // num_kv_heads
    kv_index = (torch.arange(num_heads, device=q.device) // group + kv_head_shift) % num_kv_heads
    kh = k.permute(1, 0, 2)[kv_index]  # [H, Lk, D]
    vh = v.permute(1, 0, 2)[kv_index]  # [H, Lk, Dv]
    pos_k = torch.arange(len_k, device=q.device)
    rows = max(1, _CHUNK_ELEMS // max(1, num_heads * len_k))
    for r0 in range(0, len_q, rows):
        r1 = min(len_q, r0 + rows)
        qh = q[r0:r1].permute(1, 0, 2)  # [H, R, D]
        pos_q = torch.arange(r0, r1, device=q.device) + (len_k - len_q)
        s = torch.matmul(qh, kh.transpose(1, 2)) * scale  # [H, R, Lk]
        if softcap > 0:
            s = torch.tanh(s / softcap) * softcap
        if slopes is not None:
            dist = (pos_q[:, None] - pos_k[None, :]).abs().to(s.dtype)  # [R, Lk]
            s = s - slopes[:, None, None] * dist[None]
        if sinks is not None and sinks_mode == "bias_key0":
            s[:, :, 0] += sinks[:, None]
        vis = _visible(pos_q, pos_k, causal, left, right, window_shift, diag_offset)  # [R, Lk]
        any_vis = vis.any(dim=1)  # [R]
        s = s.masked_fill(~vis[None], float("-inf"))
        # the log of the denominator, straight from the logits (not from m and denom below)
        logits = s
        if denominator_sink:
            logits = torch.cat([s, sinks[:, None, None].expand(num_heads, r1 - r0, 1)], dim=2)
        lse[:, r0:r1] = torch.logsumexp(logits, dim=2)  # [H, R]; a row of only -inf gives -inf
        m = s.amax(dim=2, keepdim=True)  # [H, R, 1]
        if sinks is not None and sinks_mode == "denominator":
            m = torch.maximum(m, sinks[:, None, None].expand_as(m))
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        p = torch.exp(s - m)  # [H, R, Lk]; masked -> 0
        denom = p.sum(dim=2, keepdim=True)
        if sinks is not None and sinks_mode == "denominator":
            denom = denom + torch.exp(sinks[:, None, None] - m)
        o = torch.matmul(p, vh) / torch.where(denom > 0, denom, torch.ones_like(denom))  # [H, R, Dv]
        o = torch.where(any_vis[None, :, None], o, torch.zeros_like(o))  # fully masked rows -> exactly 0
        out[r0:r1] = o.permute(1, 0, 2)
    return out, lse


def _attention_varlen_impl(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    causal: bool,
    window: tuple[int, int],
    softmax_scale: float | None,
    alibi_slopes: torch.Tensor | None,
    sinks: torch.Tensor | None,
    sinks_mode: str,
    softcap: float,
    dtype: torch.dtype,
    window_shift: int = 0,
    diag_offset: int = 0,
    kv_head_shift: int = 0,
    scale_mult: float = 1.0,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    q = _check_tensor(q, "q", 3, "[total_q, num_heads, head_size]")
    k = _check_tensor(k, "k", 3, "[total_k, num_kv_heads, head_size]")
    v = _check_tensor(v, "v", 3, "[total_k, num_kv_heads, head_size_v]")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not t.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"k head size ({k.shape[2]}) must equal q head size ({q.shape[2]})")
    if tuple(v.shape[:2]) != tuple(k.shape[:2]):
        raise ValueError(
            f"v must have shape [total_k, num_kv_heads, head_size_v] = [{k.shape[0]}, {k.shape[1]}, *], "
            f"got {tuple(v.shape)}"
        )
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    left, right = _check_window(window)
    cu_q = _check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", q.shape[0])
    cu_k = _check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k", k.shape[0])
    if len(cu_q) != len(cu_k):
        raise ValueError(
            "cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1), "
            f"got {len(cu_q)} and {len(cu_k)}"
        )
    batch = len(cu_q) - 1
    scale = _check_options(
        q, k.shape[1], batch, softmax_scale, alibi_slopes, sinks, sinks_mode, softcap, dtype
    )
    scale *= scale_mult
    device = q.device
    slopes = alibi_slopes.to(device=device, dtype=dtype) if alibi_slopes is not None else None
    sinks_c = sinks.to(device=device, dtype=dtype) if sinks is not None else None
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[2], dtype=dtype, device=device)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=dtype, device=device)
    for b in range(batch):
        qs, qe, ks, ke = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        if qe == qs:
            continue
        slopes_b = None if slopes is None else (slopes if slopes.dim() == 1 else slopes[b])
        out[qs:qe], lse[:, qs:qe] = _attend_sequence(
            q[qs:qe].to(device=device, dtype=dtype),
            k[ks:ke].to(device=device, dtype=dtype),
            v[ks:ke].to(device=device, dtype=dtype),
            causal=causal,
            left=left,
            right=right,
            scale=scale,
            slopes=slopes_b,
            sinks=sinks_c,
            sinks_mode=sinks_mode,
            softcap=float(softcap),
            window_shift=window_shift,
            diag_offset=diag_offset,
            kv_head_shift=kv_head_shift,
        )
    if return_lse:
        return out, lse
    return out


def attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    causal: bool = False,
    window: tuple[int, int] = (-1, -1),
    softmax_scale: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    sinks_mode: str = "denominator",
    softcap: float = 0.0,
    dtype: torch.dtype = torch.float64,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Reference attention over a ragged batch, computed in ``dtype`` on ``q``'s device.

    Args:
        q: ``[total_q, H, D]`` queries of all sequences, packed (any strides, any float dtype).
        k: ``[total_k, Hkv, D]`` keys, packed the same way; ``H % Hkv == 0`` (GQA: query head ``h``
            reads kv head ``h // (H // Hkv)``).
        v: ``[total_k, Hkv, Dv]`` values.
        cu_seqlens_q: int ``[B + 1]``, ``cu_seqlens_q[0] == 0``, non-decreasing, last == ``total_q``;
            sequence ``b``'s queries are rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]``.
        cu_seqlens_k: int ``[B + 1]``, the same for keys/values.
        causal: query ``i`` of a sequence sits at key position ``p = len_k - len_q + i`` (aligned to
            the end of its keys) and sees keys ``j <= p`` only.
        window: ``(left, right)``, inclusive, ``-1`` = unbounded: key ``j`` visible iff
            ``p - j <= left`` and ``j - p <= right`` (FlashAttention convention).
        softmax_scale: logit scale, default ``1 / sqrt(D)``.
        alibi_slopes: ``[H]`` (or ``[B, H]``); adds ``-slope[h] * |p - j|`` to the logit.
        sinks: ``[H]`` per-head sink logits, see ``sinks_mode``.
        sinks_mode: ``"denominator"``: an extra logit ``sinks[h]`` that only enters the softmax
            denominator; ``"bias_key0"``: ``sinks[h]`` is added to the logit of key 0 of each
            sequence (if visible).
        softcap: if > 0, ``s = softcap * tanh(s / softcap)`` (applied before ALiBi and sinks).
        dtype: compute and output dtype (float64 default, float32 allowed).
        return_lse: also return the log-sum-exp of each row's softmax (FlashAttention's
            ``return_softmax_lse``), for merging partial attention states.

    Logits are ``s = softcap(scale * q . k) - slope * |p - j| (+ sinks for key 0)``; rows with no
    visible key are exactly 0 (also with denominator sinks).

    Returns:
        ``[total_q, H, Dv]`` in ``dtype``; with ``return_lse``, ``(out, lse)`` where ``lse`` is
        ``[H, total_q]`` in ``dtype``, natural log: ``lse[h, i] = log(sum_j exp(s_ij))`` over the keys
        row ``i`` sees (``torch.logsumexp`` of the logits above), plus ``exp(sinks[h])`` in the sum with
        ``"denominator"`` sinks. A row with no visible key gets ``-inf``, or with a denominator sink
        ``sinks[h]`` (its denominator is the sink alone; its output is 0).
    """
    return _attention_varlen_impl(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        causal=causal,
        window=window,
        softmax_scale=softmax_scale,
        alibi_slopes=alibi_slopes,
        sinks=sinks,
        sinks_mode=sinks_mode,
        softcap=softcap,
        dtype=dtype,
        return_lse=return_lse,
    )


def negative_control(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    kind: str = "window_shift",
    *,
    causal: bool = False,
    window: tuple[int, int] = (-1, -1),
    softmax_scale: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    sinks_mode: str = "denominator",
    softcap: float = 0.0,
    dtype: torch.dtype = torch.float64,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """A plausible but WRONG attention output, to prove a test harness catches a buggy kernel.

    Same arguments as :func:`attention_varlen` (``return_lse``: also the wrong problem's LSE), plus
    ``kind``:

    - ``"window_shift"``: the visible band shifted by one key to the left. With a finite window the
      bounds become ``left + 1`` / ``right - 1`` (``right == 0`` then means ``j <= p - 1``; unbounded
      sides stay unbounded); with no window and ``causal``, queries see one key less (strictly
      causal, ``j < p``). Raises ``ValueError`` with neither a window nor ``causal``.
    - ``"diagonal"``: the causal limit off by one (key ``p + 1`` is visible too; a finite right
      bound is widened by one as well). Raises ``ValueError`` unless ``causal``.
    - ``"scale"``: softmax scale x1.25.
    - ``"kv_head"``: GQA mapping shifted, query head ``h`` reads kv head ``(h // G + 1) % Hkv``.
      Raises ``ValueError`` if ``Hkv == 1``.
    """
    extra: dict[str, float | int] = {}
    left, right = _check_window(window)
    if kind == "window_shift":
        if left < 0 and right < 0 and not causal:
            raise ValueError(
                "negative_control kind 'window_shift' does not apply: no finite window and not causal"
            )
        if left < 0 and right < 0:
            extra["diag_offset"] = -1
        else:
            extra["window_shift"] = 1
    elif kind == "diagonal":
        if not causal:
            raise ValueError("negative_control kind 'diagonal' does not apply: attention is not causal")
        extra["diag_offset"] = 1
    elif kind == "scale":
        extra["scale_mult"] = 1.25
    elif kind == "kv_head":
        if not isinstance(k, torch.Tensor) or k.dim() != 3:
            raise ValueError("k must be 3-D [total_k, num_kv_heads, head_size]")
        if k.shape[1] == 1:
            raise ValueError("negative_control kind 'kv_head' does not apply: only one kv head")
        extra["kv_head_shift"] = 1
    else:
        raise ValueError(f"negative_control kind must be one of {NEGATIVE_CONTROL_KINDS}, got {kind!r}")
    return _attention_varlen_impl(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        causal=causal,
        window=(left, right),
        softmax_scale=softmax_scale,
        alibi_slopes=alibi_slopes,
        sinks=sinks,
        sinks_mode=sinks_mode,
        softcap=softcap,
        dtype=dtype,
        return_lse=return_lse,
        **extra,  # type: ignore[arg-type]
    )
