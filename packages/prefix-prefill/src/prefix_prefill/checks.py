"""Host-side checks of prefix-prefill's arguments (shapes, dtypes, devices, strides: no device reads),
and the opt-in checks that read device values (``validate=True`` or ``PREFILL_VALIDATE=1``).

Every check raises a ``TypeError`` (wrong type or dtype) or ``ValueError`` (wrong shape, device, stride
or value) naming the argument and what was expected, before anything is launched.
"""

from __future__ import annotations

import math

import torch

from paged_kv_offsets import LAYOUTS, CacheView, describe_kv_cache, validate_block_table
from prefill_runtime.fp8 import FP8_DTYPES, Scale, check_fp8_supported, scale_tensor  # noqa: F401 (re-exported)
from prefix_prefill.configs import MAX_GRID_YZ, MAX_HEAD_SIZE, detect_arch

Q_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")


def is_tensor(t: object, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def check_device(t: torch.Tensor, name: str, device: torch.device) -> None:
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but q is on {device}; all tensors must share a device")


def check_last_stride(t: torch.Tensor, name: str) -> None:
    if t.numel() > 0 and t.stride(-1) != 1:
        raise ValueError(
            f"{name} must have unit stride in its last dimension, got strides {tuple(t.stride())} "
            f"(call .contiguous())"
        )


def check_index_tensor(t: object, name: str, ndim: int, device: torch.device) -> torch.Tensor:
    t = is_tensor(t, name)
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
    if t.dim() != ndim:
        shape = "[batch, max_pages]" if ndim == 2 else "[n]"
        raise ValueError(f"{name} must be {ndim}-D {shape}, got shape {tuple(t.shape)}")
    check_device(t, name, device)
    return t


def e4m3_dtype(device: torch.device) -> torch.dtype:
    """The platform's fp8 e4m3 type: fnuz on MI300 (gfx942), OCP e4m3fn elsewhere."""
    if device.type == "cuda" and getattr(torch.version, "hip", None) and detect_arch(device) == "gfx942":
        return torch.float8_e4m3fnuz
    return torch.float8_e4m3fn


def check_per_head(t: object, name: str, num_heads: int, device: torch.device) -> torch.Tensor | None:
    if t is None:
        return None
    t = is_tensor(t, name)
    if not t.dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if t.dim() != 1 or t.shape[0] != num_heads:
        raise ValueError(f"{name} must have shape [num_heads] = [{num_heads}], got {tuple(t.shape)}")
    check_device(t, name, device)
    return t


def interpreted() -> bool:
    """Whether this process's kernels run under the Triton interpreter (``TRITON_INTERPRET=1`` was set
    before the kernels were defined): then they take CPU tensors."""
    from prefix_prefill.kernel import _fwd_kernel

    return type(_fwd_kernel).__name__ == "InterpretedFunction"


def _layout_hint(k_cache: torch.Tensor, v_cache: torch.Tensor, layout: str, head_size: int,
                 num_kv_heads: int | None) -> str:  # fmt: skip
    """``"; the caches' shapes fit kv_layout='...'"`` when another layout than ``layout`` describes them
    with q's head size (and k's kv heads), else ``""``."""
    for other in LAYOUTS:
        if other == layout:
            continue
        try:
            kc, _ = describe_kv_cache(k_cache, v_cache, other)
        except ValueError:
            continue
        if kc.head_size == head_size and num_kv_heads in (None, kc.num_kv_heads):
            return f"; the caches' shapes fit kv_layout={other!r}"
    return ""


def check_inputs(
    q: object,
    k: object,
    v: object,
    o: object,
    k_cache: object,
    v_cache: object,
    kv_layout: str,
    block_table: object,
    cu_seqlens_q: object,
    seq_lens: object,
    max_query_len: object,
    *,
    names: dict[str, str],
    out_fp8: bool,
) -> tuple[CacheView, CacheView]:
    """Every host-side check shared by both API forms; ``names`` maps roles to argument names."""
    q = is_tensor(q, "q")
    if q.dim() != 3:
        raise ValueError(f"q must be 3-D [total_q, num_heads, head_size], got shape {tuple(q.shape)}")
    if q.dtype not in Q_DTYPES:
        raise TypeError(f"q must be float16, bfloat16 or float32, got {q.dtype}")
    check_last_stride(q, "q")
    total_q, num_heads, head_size = q.shape
    if head_size > MAX_HEAD_SIZE:
        raise ValueError(f"q head size must be <= {MAX_HEAD_SIZE}, got {head_size}")
    if head_size < 1 or num_heads < 1:
        raise ValueError(f"q must have at least one head of at least one feature, got {tuple(q.shape)}")
    device = q.device
    if device.type == "cpu" and not interpreted():
        raise ValueError(
            "q is a CPU tensor: the kernels run on a GPU (CUDA or ROCm), or on the CPU under the Triton "
            "interpreter (set TRITON_INTERPRET=1 in the environment before importing prefix_prefill)"
        )

    if (k is None) != (v is None):
        raise ValueError("k and v must both be tensors or both be None (new tokens read from the cache)")
    num_kv_heads = None
    if k is not None:
        for name, t in (("k", k), ("v", v)):
            t = is_tensor(t, name)
            if t.dim() != 3 or t.shape[0] != total_q or t.shape[2] != head_size:
                raise ValueError(
                    f"{name} must have shape [total_q, num_kv_heads, head_size] = "
                    f"[{total_q}, *, {head_size}], got {tuple(t.shape)}"
                )
            if t.dtype != q.dtype:
                raise TypeError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
            check_last_stride(t, name)
            check_device(t, name, device)
        assert isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)
        if v.shape != k.shape:
            raise ValueError(f"v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
        num_kv_heads = k.shape[1]

    k_cache = is_tensor(k_cache, "k_cache")
    v_cache = is_tensor(v_cache, "v_cache")
    try:
        kc, vc = describe_kv_cache(k_cache, v_cache, kv_layout)
    except ValueError as e:
        hint = _layout_hint(k_cache, v_cache, kv_layout, head_size, num_kv_heads)
        raise ValueError(f"{e}{hint}") from None
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != q.dtype and t.dtype not in FP8_DTYPES:
            raise TypeError(f"{name} must have q's dtype {q.dtype} or an fp8 dtype, got {t.dtype}")
        check_last_stride(t, name)
        check_device(t, name, device)
        check_fp8_supported(t.dtype, device, name)
    if k_cache.dtype != v_cache.dtype:
        raise TypeError(f"k_cache and v_cache must share a dtype, got {k_cache.dtype} and {v_cache.dtype}")
    if kc.head_size != head_size:
        hint = _layout_hint(k_cache, v_cache, kv_layout, head_size, num_kv_heads)
        raise ValueError(f"k_cache head size {kc.head_size} does not match q head size {head_size}{hint}")
    if num_kv_heads is not None and kc.num_kv_heads != num_kv_heads:
        hint = _layout_hint(k_cache, v_cache, kv_layout, head_size, num_kv_heads)
        raise ValueError(f"k_cache has {kc.num_kv_heads} kv heads but k has {num_kv_heads}{hint}")
    num_kv_heads = kc.num_kv_heads
    if num_kv_heads < 1 or num_heads % num_kv_heads != 0:
        raise ValueError(
            f"q has {num_heads} heads, which is not a multiple of the {num_kv_heads} kv heads of k_cache"
        )

    oname = names["o"]
    o = is_tensor(o, oname)
    if tuple(o.shape) != tuple(q.shape):
        raise ValueError(f"{oname} must have q's shape {tuple(q.shape)}, got {tuple(o.shape)}")
    if out_fp8:
        if o.dtype not in FP8_DTYPES:
            raise TypeError(f"{oname} must be an fp8 tensor when fp8_out_scale is given, got {o.dtype}")
        check_fp8_supported(o.dtype, device, oname)
    elif o.dtype != q.dtype:
        raise TypeError(f"{oname} must have q's dtype {q.dtype}, got {o.dtype}")
    check_last_stride(o, oname)
    check_device(o, oname, device)

    bt = check_index_tensor(block_table, names["block_table"], 2, device)
    cu = check_index_tensor(cu_seqlens_q, names["cu_seqlens_q"], 1, device)
    sl = check_index_tensor(seq_lens, names["seq_lens"], 1, device)
    batch = sl.shape[0]
    if cu.shape[0] != batch + 1:
        raise ValueError(
            f"{names['cu_seqlens_q']} must have batch + 1 = {batch + 1} entries "
            f"({names['seq_lens']} has {batch}), got {cu.shape[0]}"
        )
    if bt.shape[0] < batch:
        raise ValueError(f"{names['block_table']} has {bt.shape[0]} rows for {batch} sequences")
    if batch > MAX_GRID_YZ:
        raise ValueError(f"{names['seq_lens']}: at most {MAX_GRID_YZ} sequences per launch, got {batch}")
    mq = names["max_query_len"]
    if isinstance(max_query_len, bool) or not isinstance(max_query_len, int):
        raise TypeError(f"{mq} must be a Python int, got {type(max_query_len).__name__}")
    if max_query_len < 0:
        raise ValueError(f"{mq} must be >= 0, got {max_query_len}")
    return kc, vc


def check_device_values(
    q: torch.Tensor,
    kv_from_cache: bool,
    kc: CacheView,
    block_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    max_query_len: int,
    skip_decode: bool,
    names: dict[str, str],
) -> None:
    """The checks that read device values (one device-to-host copy each): opt-in."""
    cu = cu_seqlens_q.detach().to("cpu", torch.int64)
    sl = seq_lens.detach().to("cpu", torch.int64)
    cn, sn = names["cu_seqlens_q"], names["seq_lens"]
    if cu.numel() and int(cu[0]) < 0:
        raise ValueError(f"{cn}[0] must be >= 0, got {int(cu[0])}")
    q_lens = cu[1:] - cu[:-1]
    if bool((q_lens < 0).any()):
        b = int(torch.nonzero(q_lens < 0)[0])
        raise ValueError(f"{cn} must be non-decreasing, but {cn}[{b + 1}] < {cn}[{b}]")
    if cu.numel() and int(cu[-1]) > q.shape[0]:
        raise ValueError(f"{cn}[-1] = {int(cu[-1])} exceeds the {q.shape[0]} query rows of q")
    if bool((sl < q_lens).any()):
        b = int(torch.nonzero(sl < q_lens)[0])
        raise ValueError(
            f"{sn}[{b}] = {int(sl[b])} is smaller than the query length {int(q_lens[b])} of sequence {b}"
        )
    if q_lens.numel() and int(q_lens.max()) > max_query_len:
        raise ValueError(
            f"{names['max_query_len']} = {max_query_len} is smaller than the longest query "
            f"({int(q_lens.max())})"
        )
    need = sl.clone() if kv_from_cache else sl - q_lens  # cached tokens each sequence reads
    if skip_decode:
        need[q_lens == 1] = 0
    validate_block_table(block_table, need, kc.page_size, kc.num_blocks, name=names["block_table"])


def check_window(window: object) -> tuple[int, int]:
    if (
        not isinstance(window, (tuple, list))
        or len(window) != 2
        or not all(isinstance(w, int) and not isinstance(w, bool) for w in window)
    ):
        raise TypeError(f"window must be a pair of ints (left, right), got {window!r}")
    left, right = int(window[0]), int(window[1])
    if left < -1 or right < -1:
        raise ValueError(f"window entries must be >= -1 (-1 = unbounded), got {window!r}")
    return left, right


def check_softcap(softcap: object) -> float:
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise TypeError(f"softcap must be a float (0 = off), got {type(softcap).__name__}")
    if not math.isfinite(float(softcap)) or float(softcap) < 0:
        raise ValueError(f"softcap must be a finite float >= 0 (0 = off), got {softcap}")
    return float(softcap)


def check_softmax_scale(s: object, name: str) -> float | None:
    if s is None:
        return None
    if isinstance(s, bool) or not isinstance(s, (int, float)):
        raise TypeError(f"{name} must be a float or None, got {type(s).__name__}")
    if not math.isfinite(float(s)):
        raise ValueError(f"{name} must be finite, got {s}")
    return float(s)
