"""Which kernel runs a window-prefill call, and how: :class:`Problem` and :func:`plan`, the one place
a kernel is chosen.

A :class:`Problem` is what the host knows of a call without reading device memory: dtype, head counts
and size, the options, which tensors TMA can read, the architecture, whether this process has the
Gluon kernel. It holds no sequence length, batch size or pointer (the Gluon width rule is one flag,
:attr:`Problem.wide_window`), so one plan serves every step of an engine. :func:`plan` maps it to a
:class:`prefill_runtime.LaunchPlan` by the rules below; :mod:`window_prefill.launch` runs what the plan
says, and benchmarks run a changed plan (:meth:`~prefill_runtime.LaunchPlan.replace`).

Rules, first match wins (tiles: :data:`window_prefill.configs.CONFIGS`, per architecture, head-size
bucket, dtype class and causality, with a few fields changed for 64-bit offsets
(:func:`window_prefill.configs.wide_offsets_config`); an explicit ``config`` replaces the table entry):

==========  =========================================================================================
kernel      when
==========  =========================================================================================
``gluon``   the entry asks for it (``Config.gluon``: sm90 16-bit heads 64/128/256), this process has
            Gluon, sm90, 16-bit, head 64/128/256, ``softmax_scale > 0`` or soft-capping, q/k/v
            readable by TMA, and a row may see at least :data:`_GLUON_MIN_WIDTH` keys (per head size);
            sinks (both modes), soft-capping, ALiBi and an fp8 output are the kernel's ``SINKS``,
            ``SOFTCAP``, ``HAS_ALIBI`` and ``OUT_MAX``; windows of at most
            :data:`_PERSISTENT_MAX_WIDTH` keys and causal calls run its persistent form
            (``PERSISTENT``).
            Tiles 128 x 128 (128 x 64 at head 256), :data:`_GLUON_STAGES` K/V slots, 4 warps.
``triton``  every other call: the entry's tiles, warps and stages; interior K/V blocks through TMA
            descriptors (``TMA_KV``) where the entry asks for it (``Config.tma``) on sm90 (or the
            interpreter), 16-bit, an unpadded head size and K/V readable by TMA; an fp8 output
            quantised in the epilogue (``FP8_OUT_MAX``).
==========  =========================================================================================

A Gluon plan carries its call's Triton plan as ``extra["fallback"]``: the launch runs it if this
Triton's Gluon cannot build or launch the kernel.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from prefill_runtime import LaunchPlan
from prefill_runtime.checks import kernel_softcap
from window_prefill.configs import Config, block_d, get_config, wide_offsets_config

# A row's window must hold at least this many keys (the window alone, whatever the lengths) for the Gluon
# kernel, per head size: its 128-row tiles pay a fixed cost per tile that narrower bands do not repay.
# Narrow windows run its persistent form (below), which hides much of that cost: at head 128 it is the
# faster from 64 keys (by 10%; narrower bands are not measured), at head 256 from 128 keys (by 26%, the
# one-tile form). At head 64 the Triton kernel is the faster up to 512 keys (1.6x at 64 and 128, 1.1x at
# 512) and the slower from 1024 (by 5%; 4-7% at 1536, 18% at 4096), so head 64 takes the Gluon kernel from
# 1024 keys.
_GLUON_MIN_WIDTH = {64: 1024, 128: 64, 256: 128}
# Causal calls and windows that let a row see at most this many keys run the Gluon kernel's persistent form
# (``PERSISTENT``: one program a multiprocessor, each taking the launch's next tile from a counter until
# none is left, the latest query tiles first): a program overlaps a tile's Q load, first block and
# epilogue with the previous tile's work, and the tiles, whose costs grow with their position in a causal
# sequence, go to whichever program is free first. Wider non-causal windows and non-causal calls, whose
# tiles all cost alike, keep one program a tile (the persistent form gains nothing there and costs a
# head-64 call 11%).
_PERSISTENT_MAX_WIDTH = 1024
# K/V ring slots of the Gluon kernel: 2 and 3 run alike on the H200, and 2 needs less shared memory.
_GLUON_STAGES = 2
# Head sizes the Gluon kernel is written for (its tiles need an unpadded power of two of 64+): those of the
# width table.
_GLUON_HEADS = tuple(_GLUON_MIN_WIDTH)


@dataclass(frozen=True, slots=True)
class Problem:
    """What the host knows of a call without device reads; the key of the plan cache.

    ``config``: an explicit launch config replacing the table entry (None: the table). ``alibi``: the call
    passes ALiBi slopes.
    ``cumulative_starts``: the call gives ``cu_seqlens`` (lengths are differences of successive
    starts), not starts and lengths (vLLM's form). ``softcap``:
    the kernel's soft-capping form (0 none, 1 tanh through exp2, 2 the hardware tanh, 3 the hardware
    tanh with a cap the Gluon consumers may pin the softmax max for;
    :func:`prefill_runtime.softcap_form`). ``wide_offsets``: some element of K or V lies 2**31 or more
    elements from its tensor's start (int64 token offsets). ``q_tma`` / ``kv_tma``: q (k and v) can be
    TMA descriptors over ``[tokens, heads * head_dim]``: unit feature stride, heads ``head_dim`` apart,
    16-byte aligned base and token rows, fewer than 2**31 tokens (``kv_tma`` also: this Triton has host
    tensor descriptors). ``wide_window``: a row may see at least ``_GLUON_MIN_WIDTH[head_dim]`` keys
    (:func:`wide_window`); ``narrow_window``: at most :data:`_PERSISTENT_MAX_WIDTH` (:func:`narrow_window`).
    ``gluon``: this process runs the Gluon kernel (Triton has Gluon,
    ``WINDOW_PREFILL_GLUON`` is not 0, no launch of it failed). ``fp8_out_limit``: the output is fp8 (with
    its quantisation scale), this the format's largest finite value; 0.0: the output is in q's dtype."""

    dtype: torch.dtype
    heads: int
    kv_heads: int
    head_dim: int
    arch: str
    causal: bool
    has_left: bool
    has_right: bool
    wide_window: bool
    narrow_window: bool
    sinks: bool
    bias_key0: bool
    alibi: bool
    softcap: int
    scale_positive: bool
    cumulative_starts: bool
    return_lse: bool
    wide_offsets: bool
    q_tma: bool
    kv_tma: bool
    gluon: bool
    config: Config | None = None
    fp8_out_limit: float = 0.0


def window_keys(causal: bool, window_left: int, window_right: int) -> int | None:
    """The keys a window lets a row see: ``left + 1`` causal (a right side is moot), else ``left + right +
    1``; None when a side it needs is unbounded (``-1``)."""
    if window_left < 0 or (not causal and window_right < 0):
        return None
    return window_left + (0 if causal else window_right) + 1


def wide_window(causal: bool, window_left: int, window_right: int, head_dim: int) -> bool:
    """Whether the window lets a row see at least ``_GLUON_MIN_WIDTH[head_dim]`` keys (:func:`window_keys`;
    unbounded: always; a head size the Gluon kernel has no entry for: never). The window and the head size
    alone decide, never a length of the call: a sequence runs the same kernel whatever batch it is in
    (batch invariance)."""
    keys = window_keys(causal, window_left, window_right)
    if keys is None:
        return True
    need = _GLUON_MIN_WIDTH.get(head_dim)
    return need is not None and keys >= need


def narrow_window(causal: bool, window_left: int, window_right: int) -> bool:
    """Whether the window lets a row see at most :data:`_PERSISTENT_MAX_WIDTH` keys (:func:`window_keys`;
    unbounded: never)."""
    keys = window_keys(causal, window_left, window_right)
    return keys is not None and keys <= _PERSISTENT_MAX_WIDTH


def _gluon_refusal(p: Problem, cfg: Config) -> str | None:
    """Why the Gluon kernel does not run this problem, or None when it does."""
    if not cfg.gluon:
        return "the config does not ask for it" if p.config is not None else "the table does not ask for it"
    checks = (
        (p.gluon, "this process has no Gluon kernel"),
        (p.arch == "sm90", f"arch {p.arch} is not sm90"),
        (p.dtype in (torch.float16, torch.bfloat16), "float32"),
        (p.head_dim in _GLUON_HEADS, f"head size {p.head_dim}"),
        (p.scale_positive or p.softcap > 0, "softmax_scale <= 0"),
        (p.q_tma and p.kv_tma, "q/k/v not readable by TMA"),
        (p.wide_window, f"a row sees fewer than {_GLUON_MIN_WIDTH.get(p.head_dim)} keys"),
    )
    return next((why for ok, why in checks if not ok), None)


def _triton_plan(p: Problem, cfg: Config, source: str, why_not_gluon: str) -> LaunchPlan:
    tma = (
        cfg.tma
        and p.kv_tma
        and p.arch in ("sm90", "interpreter")
        and p.dtype in (torch.float16, torch.bfloat16)
        and p.head_dim == block_d(p.head_dim)
    )
    consts = dict(
        HEAD_DIM=p.head_dim,
        BLOCK_D=block_d(p.head_dim),
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        IS_CAUSAL=p.causal,
        HAS_LEFT=p.has_left,
        HAS_RIGHT=p.has_right,
        HAS_SINKS=p.sinks,
        BIAS_KEY0=p.bias_key0,
        LENS_FROM_STARTS=p.cumulative_starts,
        IEEE_FP32=p.dtype == torch.float32,
        WIDE_OFFSETS=p.wide_offsets,
        # the scale folds into exp2's FMA unless it is <= 0 or a key-0 bias or ALiBi term must be added in
        # log2 units
        FOLD_SCALE=(p.scale_positive or p.softcap > 0) and not p.bias_key0 and not p.alibi,
        TMA_KV=tma,
        SOFTCAP=kernel_softcap(p.softcap, gluon=False),
        RETURN_LSE=p.return_lse,
        HAS_ALIBI=p.alibi,
        FP8_OUT_MAX=p.fp8_out_limit,
    )
    tiles = f"{cfg.block_m}x{cfg.block_n}, {cfg.num_warps} warps, {cfg.num_stages} stages"
    return LaunchPlan(
        kernel="triton",
        reason=f"triton: {source} ({tiles}{', TMA K/V' if tma else ''}); not gluon: {why_not_gluon}",
        block_m=cfg.block_m,
        constexprs=LaunchPlan.items(consts),
        options=LaunchPlan.items({"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}),
    )


@functools.lru_cache(maxsize=256)
def plan(problem: Problem) -> LaunchPlan:
    """The launch of ``problem`` (see the module docstring for the rules). Pure and cached."""
    p = problem
    if p.config is not None:
        cfg, source = p.config, "the given config"
    else:
        cfg = get_config(p.head_dim, p.dtype, p.causal, p.arch)
        if p.wide_offsets:
            cfg = wide_offsets_config(cfg, p.head_dim, p.dtype, p.arch)
        source = f"the {p.arch} table"
    why_not = _gluon_refusal(p, cfg)
    if why_not is not None:
        return _triton_plan(p, cfg, source, why_not)
    block_n = 64 if p.head_dim == 256 else 128  # head 256: the [64, 256] output tiles take the registers
    persistent = p.narrow_window or p.causal
    consts = dict(
        HEAD_DIM=p.head_dim,
        BLOCK_M=128,
        BLOCK_N=block_n,
        IS_CAUSAL=p.causal,
        HAS_LEFT=p.has_left,
        HAS_RIGHT=p.has_right,
        LENS_FROM_STARTS=p.cumulative_starts,
        RETURN_LSE=p.return_lse,
        NUM_STAGES=_GLUON_STAGES,
        # (sinks and ALiBi shift logits past the cap's bounds: no pinned max)
        SOFTCAP=kernel_softcap(p.softcap, gluon=True, shifted=p.sinks or p.alibi),
        # sinks: 1 an extra logit of the denominator, 2 a bias on key 0 (sinks_mode "bias_key0")
        SINKS=(2 if p.bias_key0 else 1) if p.sinks else 0,
        HAS_ALIBI=p.alibi,
        OUT_MAX=p.fp8_out_limit,  # an fp8 output: clamp(out / scale) in the consumers' epilogue
        # narrow windows and causal calls: one program a multiprocessor takes tile after tile
        PERSISTENT=persistent,
    )
    form = ", persistent" if persistent else ""
    return LaunchPlan(
        kernel="gluon",
        reason=f"gluon: {source} asks for it and it applies (128x{block_n}, {_GLUON_STAGES} stages{form})",
        block_m=128,
        constexprs=LaunchPlan.items(consts),
        options=LaunchPlan.items({"num_warps": 4}),
        extra=LaunchPlan.items({"fallback": _triton_plan(p, cfg, source, "its launch failed")}),
    )
