"""Per-call argument helpers both kernel packages share: the soft-capping form, the LSE buffer and the
validation switch.

Owns :func:`softcap_form` (which ``SOFTCAP`` constexpr a kernel compiles for a device),
:func:`check_lse` (the softmax log-sum-exp buffer of a ``return_lse=True`` call, allocated or checked,
with errors that name the argument) and :func:`validate_requested` (``validate=True`` or the
environment variable ``PREFILL_VALIDATE=1``, read on every call).
"""

from __future__ import annotations

import os

import torch

ENV_VALIDATE = "PREFILL_VALIDATE"


def _environ_reader(env=os.environ):
    """A zero-argument function answering whether ``PREFILL_VALIDATE`` is ``"1"`` in ``env`` now.
    ``os.environ.get`` encodes the key and decodes the value on every call (about a microsecond, a few
    percent of a warm call); CPython's ``os._Environ`` keeps the encoded mapping it updates on every
    assignment and deletion in ``_data``, so where that structure is present the reader looks the
    encoded key up there (the same value, a dict lookup). Anywhere else it calls ``env.get``."""
    data = getattr(env, "_data", None)
    encodekey = getattr(env, "encodekey", None)
    encodevalue = getattr(env, "encodevalue", None)
    if isinstance(data, dict) and callable(encodekey) and callable(encodevalue):
        key, one = encodekey(ENV_VALIDATE), encodevalue("1")
        if (data.get(key) == one) == (env.get(ENV_VALIDATE) == "1"):  # (the structure as described)
            return lambda: data.get(key) == one
    return lambda: env.get(ENV_VALIDATE, "0") == "1"


_ENV_SET = _environ_reader()


def validate_requested(validate: object) -> bool:
    """Whether a call runs the checks that read device values: ``validate`` true, or the environment
    variable ``PREFILL_VALIDATE`` is ``"1"`` at the time of the call."""
    return bool(validate) or _ENV_SET()


#: The largest soft cap whose logits (in ``(-softcap, softcap)``, ``softcap * log2(e) <= 80`` in log2
#: units) let a bfloat16 call's Gluon consumers pin the softmax's running max instead of tracking it
#: (``SOFTCAP == 3``, :mod:`prefill_runtime.gluon`): every ``p`` then lies in ``[2**-120, 2**40]``,
#: normal in bfloat16 and float32. Gemma 2's attention cap is 50.
PINNED_SOFTCAP_MAX = 55.0


def softcap_form(softcap: float, q: torch.Tensor, fast: bool = True) -> int:
    """A kernel's ``SOFTCAP`` constexpr for logits capped at ``softcap`` on ``q``'s device: 0 off, 1
    tanh through exp2 (any backend, the interpreter), 2 the hardware tanh of
    :func:`prefill_runtime.device.tanh` (``fast`` and an NVIDIA GPU of compute capability 7.5 or
    newer, which has PTX ``tanh.approx.f32``; not ROCm, not Volta), 3 the hardware tanh with a cap of
    at most :data:`PINNED_SOFTCAP_MAX` on a bfloat16 ``q`` (the Gluon consumers may pin the softmax max;
    the Triton kernels run it as 2)."""
    if softcap <= 0:
        return 0
    nvidia = fast and q.is_cuda and torch.version.hip is None
    if not (nvidia and torch.cuda.get_device_capability(q.device) >= (7, 5)):
        return 1
    return 3 if softcap <= PINNED_SOFTCAP_MAX and q.dtype == torch.bfloat16 else 2


def kernel_softcap(form: int, *, gluon: bool, shifted: bool = False) -> int:
    """The ``SOFTCAP`` constexpr a kernel compiles for a call of :func:`softcap_form` ``form``: the pinned
    max (3) only on the Gluon consumers and only where nothing shifts the logits past the cap's bounds
    (``shifted``: sinks, ALiBi slopes, an fp8 cache's V scaling), else the hardware tanh (2); forms 0-2
    as they are."""
    return 2 if form == 3 and (shifted or not gluon) else form


def check_lse(
    return_lse: object, lse: object, q: torch.Tensor, tokens: str = "total_tokens"
) -> torch.Tensor | None:
    """The softmax-LSE buffer of a call: None without ``return_lse``; with it ``lse`` checked, or a
    new float32 ``[num_heads, <tokens>]`` tensor on ``q``'s device (``q`` is ``[<tokens>, num_heads,
    head_dim]``; ``tokens`` names that dimension in the messages). A non-bool ``return_lse`` is a
    ``TypeError``; ``lse`` without ``return_lse=True``, or of the wrong shape, device or token stride,
    a ``ValueError``; a wrong type or dtype a ``TypeError``, each naming the argument."""
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    if not return_lse:
        if lse is not None:
            raise ValueError("lse is given but return_lse is False: pass return_lse=True to have it written")
        return None
    total, heads = q.shape[0], q.shape[1]
    doc = f"float32 [num_heads, {tokens}] = [{heads}, {total}]"
    if lse is None:
        return torch.empty((heads, total), dtype=torch.float32, device=q.device)
    if not isinstance(lse, torch.Tensor):
        raise TypeError(f"lse must be a torch.Tensor {doc}, got {type(lse).__name__}")
    if lse.dtype != torch.float32:
        raise TypeError(f"lse must be {doc}, got dtype {lse.dtype}")
    if tuple(lse.shape) != (heads, total):
        raise ValueError(f"lse must have shape {doc}, got {tuple(lse.shape)}")
    if lse.device != q.device:
        raise ValueError(f"lse is on {lse.device} but q is on {q.device}; all tensors must share a device")
    if total > 1 and lse.stride(1) != 1:
        raise ValueError(
            f"lse must have unit stride in its last ({tokens}) dimension, got strides {tuple(lse.stride())} "
            "(call .contiguous())"
        )
    return lse
