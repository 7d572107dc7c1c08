"""Public launchers: input validation, config lookup and one shared ``_launch_fwd``.

Two entry points share the kernel:

* :func:`window_prefill` -- Pythonic form: ``cu_seqlens`` and a FlashAttention-style inclusive
  ``window=(left, right)`` (``-1`` = unbounded), returns the output;
* :func:`context_attention_fwd` -- drop-in for vLLM's
  ``vllm/v1/attention/ops/triton_prefill_attention.py::context_attention_fwd`` (writes into ``o``).

Neither synchronises with the device on the default path (CUDA-graph capturable). Checks that need
device values (lengths against tensors, ``cu_seqlens`` monotonic, ``max_seqlen`` large enough) run
only with ``validate=True`` or the environment variable ``PREFILL_VALIDATE=1``.
"""

from __future__ import annotations

import math
import numbers
import os

import torch

import prefill_runtime as runtime  # runtime.gluon_*: the Gluon kernel's host side
from prefill_runtime import check_lse, hook_compiles, prime_triton, ptxas_launch_options, softcap_form
from window_prefill import ops  # registers torch.ops.window_prefill.fwd
from window_prefill.configs import MAX_HEAD_DIM, Config, block_d, detect_arch, get_config
from window_prefill.kernel import _fwd_kernel

try:  # triton >= 3.4; older versions run without descriptors
    from triton.tools.tensor_descriptor import TensorDescriptor as _TensorDescriptor
except ImportError:  # pragma: no cover
    _TensorDescriptor = None

try:  # Gluon (triton >= 3.5) with its Hopper module; without it the Triton kernel runs everywhere
    from window_prefill.gluon_kernel import _gluon_fwd_kernel
except Exception:  # pragma: no cover - any import failure means "no Gluon"
    _gluon_fwd_kernel = None

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_INDEX_DTYPES = (torch.int32, torch.int64)
# Windows at least this wide cover any sequence a launch can hold: treated as unbounded (and never
# passed to the kernel, whose position arithmetic is int32).
_UNBOUNDED_WINDOW = 1 << 30
_MAX_BATCH = 65535  # grid z limit
# Key/value token offsets in int32 instead of int64 when every element of K and V lies less than 2**31
# elements from the tensor's start (a K of up to 2M tokens at 8 heads x 128): less integer work per
# lane. Both forms are tested. A batch past that size takes the int64 kernel: the one way K/V sizes
# (not lengths) pick a compiled variant. Timed slower in session 6 (head 128 spilled, NOTES step 14);
# on today's kernel (NOTES step 53, H200, 5 rounds, CUDA graphs) PR shape 0.0397 -> 0.0386 ms, LLM
# shape (Triton kernel) 4.56 -> 4.51 (within its drift): on.
_OFFSETS_32 = True
# Lazy rescaling of the interior blocks (kernel LAZY_RESCALE, _attn_block): acc [BM, BD] is rescaled
# only when some row's running max grows by more than this many log2 units in a block (0: every
# block, the classic online softmax). The max only stabilises exp2, so a stale one changes no result
# beyond rounding (p stays <= 2**_LAZY_RESCALE); it saves BM * BD / threads multiplies per block at
# the price of one tile-wide max (two barriers). Candidate (NOTES step 29), off until timed.
_LAZY_RESCALE = 0
# Softmax arithmetic of each block (NOTES step 30; ncu put the PR shape at 62% of the issue slots,
# its masked blocks at 455 SASS instructions a warp against 229 for an interior one):
# _FOLD_SCALE: the row max on the raw q.k, scaled once per row, and the scale folded into exp2's FMA
# (qk_scale > 0, no key-0 bias); _BAND_MASK: the window/causal test of a masked block as one unsigned
# compare of q - k against the band. Offline (sm_90a): PR config 64/32/4/3 masked loop 453 -> 321 and
# interior 229 -> 214 SASS per iteration; LLM 128/128/8/2 1691 -> 1220 and 599 -> 537. Both forms
# are tested; the H200 A/B is in NOTES step 30.
_FOLD_SCALE = True
_BAND_MASK = True
# Interior K/V blocks through TMA tensor descriptors (kernel TMA_KV) where the config asks for it
# (``Config.tma``) and the inputs allow it (sm90 16-bit, unpadded head dims, K/V rows of whole 16-byte
# granules, one head's features contiguous): one bulk copy per tile instead of per-lane address
# arithmetic and loads. Masked edge blocks keep lane-masked loads. False turns it off everywhere.
# The descriptor form also runs the interior before the edges (kernel INTERIOR_FIRST): edges first,
# ptxas serialises the wgmma (C7515). NOTES step 32: LLM 4.52 -> 4.33 ms with 3 stages.
_TMA_KV = True
# Triton's one-time process setup, run side by side before the first launch (_prime_triton).
_TRITON_PRIMED = False
# Build the kernel's launcher (a C module Triton compiles with gcc, 0.25-0.35 s) in a thread while the
# kernel itself compiles (prefill_runtime.hook_compiles). H200, NOTES step 49: cold first call (k
# given, bf16) 2.70 / 2.89 -> 2.16 / 2.42 s at head 128 with the (dropped) line-table shortcut too.
# The Gluon kernel's too (its descriptors are all TMA: step 56, 3.58 / 3.27 -> 3.08 / 2.97 s).
_PREBUILD_LAUNCHER = True
# The interior blocks before the masked edge blocks without descriptors too (offline, LLM 128/128/8/2:
# interior loop 537 -> 517 SASS); timed: no gain (NOTES step 32), off.
_INTERIOR_FIRST = False
# Soft-capping on NVIDIA GPUs through the hardware tanh (PTX tanh.approx.f32, kernel SOFTCAP=2: one
# MUFU op per logit instead of exp2 + a divide; relative error ~2**-11, as FlashAttention's and
# FlashInfer's soft-capping). The interpreter and AMD take the exp2 form (SOFTCAP=1). NOTES step 41.
_FAST_TANH = True
# ptxas's --register-usage-level for this kernel (prefill_runtime.ptxas_launch_options; 0: not passed,
# ptxas's default 5). prefix-prefill takes 3 (NOTES step 47); here a candidate, off until timed.
_PTXAS_REGISTER_USAGE_LEVEL = 0
# The warp-specialised Gluon kernel (window_prefill.gluon_kernel: a TMA producer warp, two consumer
# warpgroups, each block's softmax overlapping the previous block's P @ V) where the config asks for it
# (``Config.gluon``) and it applies (_gluon_launch: sm90, 16-bit, head 64/128, no sinks, no softcap,
# TMA-able q/k/v). H200, LLM shape: 4.50 -> 3.84-3.87 ms (NOTES step 53). False: the Triton kernel
# everywhere (env WINDOW_PREFILL_GLUON=0 sets that for a process).
_GLUON = os.environ.get("WINDOW_PREFILL_GLUON", "1") != "0"
# Set when the Gluon kernel failed to build or launch once (another Triton's Gluon): Triton from then on.
_GLUON_FAILED = False
# The Gluon kernel wherever it applies, whatever the config and the width rule say: an A/B and test aid
# (bench/ab_window.py --switch _GLUON_FORCE), off.
_GLUON_FORCE = False
# The Gluon kernel's 128-row tiles pay a fixed cost per program that narrow bands do not repay: it runs
# only when a row may see at least this many keys (window width, capped by the longest sequence).
# H200, head 64, N=16384, window (w, w), CUDA graphs (NOTES step 53): w=64 0.038 (Triton) vs 0.098 ms
# (Gluon), 256 0.072 vs 0.099, 1024 0.212 vs 0.206, 4096 0.731 vs 0.591, full 1.62 vs 1.29.
_GLUON_MIN_WIDTH = 2048
# K/V ring slots of the Gluon kernel: 2 and 3 timed alike (3.87 / 3.84 ms); 2 needs 160 KiB, 3 224.
_GLUON_STAGES = 2
# The Gluon kernel compiled with LLVM's module optimisation at O0 instead of Triton's O3 (kernel
# constexpr LLVM_O0, read by prefill_runtime.hook_compiles; NOTES step 64): the compile 0.3-0.5 s
# shorter offline, ptxas's output within 1-3% in instruction mix. H200, LLM shape (7 rounds): 3.723 ->
# 3.742 ms plain, 3.751 -> 3.818 under CUDA graphs. Candidate.
_GLUON_LLVM_O0 = False
# The Gluon kernel's consumers wait for ready slots without the partition-wide barrier Triton 3.6 puts
# before each wait (kernel constexpr FREE_WAITS; prefill_runtime.gluon.free_wait, dropped from the PTX
# by prefill_runtime.hook_compiles). prefix-prefill's kernels (the same consumer): 0.2-1% faster on
# the H200 (NOTES step 68). Candidate.
_GLUON_FREE_WAITS = False


def _tma_descriptors(k: torch.Tensor, v: torch.Tensor, head_dim: int, block_n: int, arch: str):
    """(K_desc, V_desc) over K/V viewed as [total_tokens, kv_heads * head_dim], block
    [block_n, head_dim], or (None, None) when the descriptor form does not apply (see ``_TMA_KV``)."""
    if (
        _TensorDescriptor is None
        or arch not in ("sm90", "interpreter")
        or k.dtype not in (torch.float16, torch.bfloat16)
    ):
        return None, None
    if head_dim != block_d(head_dim) or k.shape[0] >= 2**31:
        return None, None
    descs = []
    for t in (k, v):
        ok = (
            t.stride(2) == 1
            and t.stride(1) == head_dim
            and t.stride(0) >= t.shape[1] * head_dim
            and (t.stride(0) * t.element_size()) % 16 == 0
            and t.data_ptr() % 16 == 0
        )
        if not ok:
            return None, None
        descs.append(
            _TensorDescriptor(t, [t.shape[0], t.shape[1] * head_dim], [t.stride(0), 1], [block_n, head_dim])
        )
    return descs[0], descs[1]


def _gluon_wide_enough(causal: bool, window_left: int, window_right: int, max_len: int) -> bool:
    """Whether a row may see at least ``_GLUON_MIN_WIDTH`` keys: the window's width (``-1`` sides
    unbounded; a causal right side is 0), capped by the longest sequence. Host ints only (no sync)."""
    left = max_len if window_left < 0 else window_left
    right = 0 if causal else (max_len if window_right < 0 else window_right)
    return min(left + right + 1, max_len) >= _GLUON_MIN_WIDTH


def _gluon_launch(
    q, k, v, o, starts, lens, max_len, batch, *, causal, window_left, window_right, softmax_scale, sinks,
    softcap, lse, arch,
) -> bool:  # fmt: skip
    """Run :func:`window_prefill.gluon_kernel._gluon_fwd_kernel` when it applies (see ``_GLUON``);
    False when it does not (the caller then runs the Triton kernel)."""
    global _GLUON_FAILED
    head_dim = q.shape[2]
    if (
        _gluon_fwd_kernel is None
        or _GLUON_FAILED
        or not runtime.gluon_applies(q, arch, sinks=sinks, softcap=softcap, scale=softmax_scale)
    ):
        return False
    block_m, block_n = 128, (64 if head_dim == 256 else 128)  # head 256: [64, 256] O tiles need the registers
    descs = [
        runtime.gluon_token_rows(q, block_m // 2),
        runtime.gluon_token_rows(k, block_n),
        runtime.gluon_token_rows(v, block_n),
    ]
    if any(d is None for d in descs):
        return False
    grid = (-(-max_len // block_m), q.shape[1], batch)
    args = (
        descs[0], descs[1], descs[2], o, starts, lens if lens is not None else starts,
        softmax_scale * math.log2(math.e), max(window_left, 0), max(window_right, 0),
        q.shape[1] // k.shape[1], o.stride(0), o.stride(1), lse, lse.stride(0) if lse is not None else None,
    )  # fmt: skip
    flags = dict(
        HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, IS_CAUSAL=bool(causal),
        HAS_LEFT=window_left >= 0, HAS_RIGHT=window_right >= 0, LENS_FROM_STARTS=lens is None,
        RETURN_LSE=lse is not None, NUM_STAGES=_GLUON_STAGES, LLVM_O0=_GLUON_LLVM_O0,
        FREE_WAITS=_GLUON_FREE_WAITS,
    )  # fmt: skip
    if runtime.gluon_try_launch(
        lambda: _gluon_fwd_kernel[grid](*args, **flags, num_warps=4),
        "window_prefill",
    ):
        return True
    _GLUON_FAILED = True
    return False


def _offsets_fit_int32(*tensors: torch.Tensor) -> bool:
    """Every element of each tensor within 2**31 - 1 elements of its first one, through strides >= 0.
    Spelled out for the 3-D K/V of every call (~1 us of host time; the loop over ``zip(shape,
    stride)`` took ~3)."""
    for t in tensors:
        st, sh = t.stride(), t.shape
        if len(sh) == 3:
            span = (sh[0] - 1) * st[0] + (sh[1] - 1) * st[1] + (sh[2] - 1) * st[2]
        else:
            span = sum((n - 1) * s for n, s in zip(sh, st, strict=True))
        if t.numel() and (span >= 2**31 or min(st) < 0):
            return False
    return True


SINKS_MODES = ("denominator", "bias_key0")


def _validate_requested(validate: bool) -> bool:
    return bool(validate) or os.environ.get("PREFILL_VALIDATE", "0") == "1"


def _check_qkvo(q: object, k: object, v: object, o: object, out_name: str) -> None:
    """Host-only (shape/dtype/device/stride) checks of q, k, v and the output buffer."""
    for name, t in (("q", q), ("k", k), ("v", v), (out_name, o)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    assert isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)
    assert isinstance(v, torch.Tensor) and isinstance(o, torch.Tensor)
    docs = {
        "q": "[total_tokens, num_heads, head_dim]",
        "k": "[total_tokens, num_kv_heads, head_dim]",
        "v": "[total_tokens, num_kv_heads, head_dim]",
        out_name: "[total_tokens, num_heads, head_dim]",
    }
    for name, t in (("q", q), ("k", k), ("v", v), (out_name, o)):
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D {docs[name]}, got shape {tuple(t.shape)}")
    if q.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"q must be float16, bfloat16 or float32, got {q.dtype}")
    for name, t in (("k", k), ("v", v), (out_name, o)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} dtype {t.dtype} does not match q dtype {q.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    total, heads, head_dim = q.shape
    if head_dim > MAX_HEAD_DIM or head_dim < 1:
        raise ValueError(f"q head_dim must be in [1, {MAX_HEAD_DIM}], got {head_dim}")
    if k.shape[0] != total:
        raise ValueError(
            f"k has {k.shape[0]} tokens but q has {total}; expected k {docs['k']} with {total} tokens"
        )
    if k.shape[2] != head_dim:
        raise ValueError(f"k head_dim {k.shape[2]} does not match q head_dim {head_dim}")
    if heads < 1:
        raise ValueError(f"q must have at least one head {docs['q']}, got num_heads = {heads}")
    if k.shape[1] < 1 or heads % k.shape[1] != 0:
        raise ValueError(f"q num_heads {heads} must be a multiple of k num_kv_heads {k.shape[1]}")
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v must have k's shape {tuple(k.shape)} {docs['v']}, got {tuple(v.shape)}")
    if tuple(o.shape) != tuple(q.shape):
        raise ValueError(
            f"{out_name} must have q's shape {tuple(q.shape)} {docs[out_name]}, got {tuple(o.shape)}"
        )
    for name, t in (("q", q), ("k", k), ("v", v), (out_name, o)):
        if t.stride(2) != 1 and t.shape[2] > 1:
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
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a Python int (the longest sequence), got {type(value).__name__}")
    if int(value) < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return int(value)


def _check_sinks(sinks: object, heads: int, device: torch.device) -> torch.Tensor | None:
    if sinks is None:
        return None
    if not isinstance(sinks, torch.Tensor):
        raise TypeError(f"sinks must be a float32 torch.Tensor [num_heads], got {type(sinks).__name__}")
    if sinks.dtype != torch.float32:
        raise TypeError(f"sinks must be float32 [num_heads], got {sinks.dtype}")
    if tuple(sinks.shape) != (heads,):
        raise ValueError(f"sinks must have shape [num_heads] = ({heads},), got {tuple(sinks.shape)}")
    if sinks.device != device:
        raise ValueError(f"sinks is on {sinks.device} but q is on {device}")
    return sinks if sinks.stride(0) == 1 else sinks.contiguous()


def _check_scale(softmax_scale: object, head_dim: int) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real):
        raise TypeError(f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}")
    if not math.isfinite(float(softmax_scale)):
        raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")
    return float(softmax_scale)


def _check_softcap(softcap: object) -> float:
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be a float (0 = off), got {type(softcap).__name__}")
    if not math.isfinite(float(softcap)) or float(softcap) < 0:
        raise ValueError(f"softcap must be a finite float >= 0 (0 = off), got {softcap}")
    return float(softcap)


def _check_window(window: object) -> tuple[int, int]:
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


def _prime_triton() -> None:
    """Triton's one-time process setup side by side before this package's first launch
    (:func:`prefill_runtime.prime_triton`, NOTES step 35); ``_TRITON_PRIMED`` marks it done here."""
    global _TRITON_PRIMED
    _TRITON_PRIMED = True
    prime_triton()
    hook_compiles(_fwd_kernel, lambda: _PREBUILD_LAUNCHER)
    if _gluon_fwd_kernel is not None:  # Gluon lowers every descriptor argument to a TMA descriptor
        hook_compiles(
            _gluon_fwd_kernel,
            lambda: _PREBUILD_LAUNCHER,
            tma_descriptors=True,
            llvm_o0_flag="LLVM_O0",
            free_waits_flag="FREE_WAITS",
        )


def _launch_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    starts: torch.Tensor,
    lens: torch.Tensor | None,
    max_len: int,
    *,
    causal: bool,
    window_left: int,
    window_right: int,
    softmax_scale: float,
    sinks: torch.Tensor | None,
    sinks_bias_key0: bool,
    config: Config | None = None,
    softcap: float = 0.0,
    lse: torch.Tensor | None = None,
) -> torch.Tensor:
    """Launch :func:`window_prefill.kernel._fwd_kernel` on checked inputs (see :func:`window_prefill`).

    ``starts``: first token of each sequence; ``lens``: their lengths, or None when ``starts`` is a
    ``cu_seqlens`` array (length = next start - start). ``window_left``/``window_right``: inclusive,
    -1 = unbounded. ``config`` overrides the table (tests, benchmark sweeps). ``softcap`` > 0: logits
    ``softcap * tanh(softmax_scale * q.k / softcap)``. ``lse``: a float32 ``[num_heads, total_tokens]``
    buffer with a unit token stride for each row's softmax log-sum-exp (kernel ``RETURN_LSE``), or None
    (the kernel compiles without it: no LSE argument, no store).
    """
    batch = starts.shape[0] - 1 if lens is None else lens.shape[0]
    if batch > _MAX_BATCH:
        raise ValueError(f"batch must be <= {_MAX_BATCH} sequences, got {batch}")
    total, heads, head_dim = q.shape
    if batch <= 0 or max_len <= 0 or total == 0:
        return o
    arch = detect_arch(q.device)
    if config is None:
        config = get_config(head_dim, q.dtype, bool(causal), arch)
    k_desc, v_desc = None, None
    if _TMA_KV and config.tma:
        k_desc, v_desc = _tma_descriptors(k, v, head_dim, config.block_n, arch)
    window_left = -1 if window_left >= _UNBOUNDED_WINDOW else window_left
    window_right = -1 if window_right >= _UNBOUNDED_WINDOW else window_right
    grid = (-(-max_len // config.block_m), heads, batch)  # plain ints: triton.cdiv costs ~2 us
    if not _TRITON_PRIMED and q.is_cuda:
        _prime_triton()
    wide = _GLUON_FORCE or (config.gluon and _gluon_wide_enough(causal, window_left, window_right, max_len))
    if _GLUON and wide and _gluon_launch(
        q, k, v, o, starts, lens, max_len, batch, causal=causal, window_left=window_left,
        window_right=window_right, softmax_scale=softmax_scale, sinks=sinks, softcap=softcap, lse=lse,
        arch=arch,
    ):  # fmt: skip
        return o
    _fwd_kernel[grid](
        q,
        k,
        v,
        o,
        sinks if sinks is not None else q,
        starts,
        lens if lens is not None else starts,
        (softcap if softcap > 0 else softmax_scale) * math.log2(math.e),
        max(window_left, 0),
        max(window_right, 0),
        heads // k.shape[1],
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        o.stride(0),
        o.stride(1),
        k_desc,
        v_desc,
        softmax_scale / softcap if softcap > 0 else 1.0,
        lse,  # None without return_lse: a constexpr, so the kernel keeps today's signature
        lse.stride(0) if lse is not None else None,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d(head_dim),
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        IS_CAUSAL=bool(causal),
        HAS_LEFT=window_left >= 0,
        HAS_RIGHT=window_right >= 0,
        HAS_SINKS=sinks is not None,
        BIAS_KEY0=sinks is not None and bool(sinks_bias_key0),
        LENS_FROM_STARTS=lens is None,
        IEEE_FP32=q.dtype == torch.float32,
        WIDE_OFFSETS=not (_OFFSETS_32 and _offsets_fit_int32(k, v)),
        LAZY_RESCALE=_LAZY_RESCALE,
        FOLD_SCALE=_FOLD_SCALE
        and (softmax_scale > 0 or softcap > 0)  # with softcap the scale folded is softcap * log2(e)
        and not (sinks is not None and bool(sinks_bias_key0)),
        BAND_MASK=_BAND_MASK,
        TMA_KV=k_desc is not None,
        INTERIOR_FIRST=_INTERIOR_FIRST or k_desc is not None,
        SOFTCAP=softcap_form(softcap, q, _FAST_TANH),
        RETURN_LSE=lse is not None,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        **ptxas_launch_options(_PTXAS_REGISTER_USAGE_LEVEL, q.device),
    )
    return o


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
    out: torch.Tensor | None = None,
    return_lse: bool = False,
    lse: torch.Tensor | None = None,
    validate: bool = False,
    config: Config | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Varlen (packed) self-attention prefill with a sliding window; cost O(tokens * window).

    Tensors (token-major, packed over the batch; any strides with a unit last stride, no copies):

    * ``q``: ``[total_tokens, num_heads, head_dim]`` float16 / bfloat16 / float32.
    * ``k``, ``v``: ``[total_tokens, num_kv_heads, head_dim]``, q's dtype and device;
      ``num_heads % num_kv_heads == 0`` (query head ``h`` reads kv head ``h // (num_heads // num_kv_heads)``:
      MHA, GQA, MQA). ``head_dim`` <= 256, any value (non-powers of two are padded inside the kernel).
    * ``cu_seqlens``: int32/int64 ``[batch + 1]``, non-decreasing; sequence ``b`` is tokens
      ``[cu_seqlens[b], cu_seqlens[b + 1])`` of q, k and v (queries and keys share positions).
    * ``max_seqlen``: Python int >= the longest sequence. Only sizes the launch grid.
    * ``sinks``: optional float32 ``[num_heads]``. ``sinks_mode="denominator"``: an extra logit
      ``sinks[h]`` in the softmax denominator only; ``"bias_key0"``: ``sinks[h]`` added to the logit of key
      0 of each sequence (where visible). ``-inf`` disables a head's sink.
    * ``out``: optional ``[total_tokens, num_heads, head_dim]`` buffer (q's dtype, unit last stride);
      allocated when None. Tokens outside every sequence are left untouched.
    * ``return_lse``: also return the softmax log-sum-exp of every row (FlashAttention's
      ``return_softmax_lse``, FlashInfer's ``return_lse``; serving engines merge partial attention
      states with it): ``(out, lse)``, ``lse`` float32 ``[num_heads, total_tokens]`` (heads first,
      FlashAttention's varlen layout), natural log: ``lse[h, i] = log(sum_j exp(s_ij))`` over the keys
      row ``i`` sees, ``s_ij`` the logit the softmax normalises (after ``softmax_scale``, ``softcap`` and
      a ``bias_key0`` sink); a ``"denominator"`` sink is part of the denominator, so ``exp(sinks[h])``
      is one more term of the sum. A row that sees no key (only possible when a ``bias_key0`` sink of
      ``-inf`` removes the one key its window leaves) gets ``-inf``, and its ``out`` row is 0 as
      always. Tokens outside every sequence are not written (like ``out``).
    * ``lse``: optional preallocated float32 ``[num_heads, total_tokens]`` buffer with a unit last
      stride, written in place (only with ``return_lse=True``); allocated when None.

    Masking (positions relative to the sequence start, query ``i`` is key position ``i``): key ``j`` is
    visible to query ``i`` iff ``(not causal or j <= i)`` and ``(left == -1 or i - j <= left)`` and
    ``(right == -1 or j - i <= right)`` for ``window=(left, right)`` (inclusive, FlashAttention's
    convention; ``(-1, -1)`` = full attention). Logits are ``softmax_scale * q.k`` (default
    ``1/sqrt(head_dim)``), or with ``softcap > 0`` (Gemma 2's logit soft-capping, FlashAttention's
    ``softcap``) ``softcap * tanh(softmax_scale * q.k / softcap)``; a ``bias_key0`` sink is added after
    the cap, a denominator sink is not capped. Rows that see no key are 0.

    ``validate=True`` (or env ``PREFILL_VALIDATE=1``) adds device-value checks (one host sync).
    ``config`` overrides the per-architecture launch config (see :mod:`window_prefill.configs`).
    Returns ``out``, or ``(out, lse)`` with ``return_lse=True``.
    """
    if out is None:
        _check_qkvo(q, k, v, q, "out")
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    else:
        _check_qkvo(q, k, v, out, "out")
    lse = check_lse(return_lse, lse, q, "total_tokens")
    cu = _check_index("cu_seqlens", cu_seqlens, q.device, "[batch + 1]")
    if cu.shape[0] < 1:
        raise ValueError("cu_seqlens must have at least one entry [batch + 1], got 0")
    max_len = _check_max_len("max_seqlen", max_seqlen)
    left, right = _check_window(window)
    if sinks_mode not in SINKS_MODES:
        raise ValueError(f"sinks_mode must be one of {SINKS_MODES}, got {sinks_mode!r}")
    sinks_t = _check_sinks(sinks, q.shape[1], q.device)
    scale = _check_scale(softmax_scale, q.shape[2])
    cap = _check_softcap(softcap)
    if _validate_requested(validate):
        _validate_cu_seqlens(cu, max_len, q.shape[0])
    torch.ops.window_prefill.fwd(
        q,
        k,
        v,
        out,
        cu,
        None,
        max_len,
        bool(causal),
        min(left, _UNBOUNDED_WINDOW),  # the op takes int64: any width past the cap is unbounded
        min(right, _UNBOUNDED_WINDOW),
        scale,
        sinks_t,
        sinks_mode == "bias_key0",
        *ops.config_ints(config),
        cap,
        lse,
    )
    if return_lse:
        return out, lse
    return out


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
) -> torch.Tensor:
    """Drop-in for vLLM's ``triton_prefill_attention.context_attention_fwd``; writes into ``o``.

    Tensors (token-major, packed over the batch; any strides with a unit last stride, no copies):

    * ``q``, ``o``: ``[total_tokens, num_heads, head_dim]`` float16 / bfloat16 / float32 (same dtype).
    * ``k``, ``v``: ``[total_tokens, num_kv_heads, head_dim]``, ``num_heads % num_kv_heads == 0``.
      ``head_dim`` <= 256.
    * ``b_start_loc``: int32/int64 ``[batch]`` (or ``[batch + 1]``, e.g. ``cu_seqlens``; the last entry is
      ignored): first token of each sequence.
    * ``b_seq_len``: int32/int64 ``[batch]``: each sequence's length.
    * ``max_input_len``: Python int >= every ``b_seq_len``; only sizes the launch grid.
    * ``sinks``: optional float32 ``[num_heads]``: an extra logit in the softmax denominator, or, with
      ``sinks_bias_key0=True``, a bias added to the logit of key 0 of each sequence.

    Masking: key ``j`` visible to query ``i`` (positions within the sequence) iff
    ``(not is_causal or j <= i)`` and, when ``sliding_window_q`` is given and > 0,
    ``i - j <= sliding_window_q``, and, when ``sliding_window_k`` is given and > 0,
    ``j - i <= sliding_window_k``. (``None`` or ``<= 0`` means unbounded, as in vLLM;
    :func:`window_prefill` uses FlashAttention's ``-1`` instead, where ``0`` means "diagonal only".)

    ``validate=True`` (or env ``PREFILL_VALIDATE=1``) adds device-value checks (one host sync).
    Returns ``o``.
    """
    _check_qkvo(q, k, v, o, "o")
    lens = _check_index("b_seq_len", b_seq_len, q.device, "[batch]")
    starts = _check_index("b_start_loc", b_start_loc, q.device, "[batch] or [batch + 1]")
    batch = lens.shape[0]
    if starts.shape[0] not in (batch, batch + 1):
        raise ValueError(
            f"b_start_loc must have batch = {batch} entries (or batch + 1), got {starts.shape[0]}"
        )
    max_len = _check_max_len("max_input_len", max_input_len)
    left = _vllm_window("sliding_window_q", sliding_window_q)
    right = _vllm_window("sliding_window_k", sliding_window_k)
    sinks_t = _check_sinks(sinks, q.shape[1], q.device)
    scale = _check_scale(softmax_scale, q.shape[2])
    if _validate_requested(validate):
        _validate_starts_lens(starts[:batch], lens, max_len, q.shape[0])
    torch.ops.window_prefill.fwd(
        q,
        k,
        v,
        o,
        starts,
        lens,
        max_len,
        bool(is_causal),
        min(left, _UNBOUNDED_WINDOW),  # the op takes int64: any width past the cap is unbounded
        min(right, _UNBOUNDED_WINDOW),
        scale,
        sinks_t,
        bool(sinks_bias_key0),
        *ops.config_ints(config),
    )
    return o


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
