"""Host side of the two Gluon kernels (:mod:`prefix_prefill.gluon_kernel`, NHD and HND caches;
:mod:`prefix_prefill.gluon_split_kernel`, vLLM's split cache): TMA descriptors, compile
tiers, the compiled variants launched directly, the fallback when a Gluon kernel cannot run.

:func:`launch` runs a plan of kernel ``"gluon-nhd"``, ``"gluon-hnd"`` (the same kernel over the HND
cache's view of rows, :func:`paged_kv_offsets.tma_rows`) or ``"gluon-split"`` (see
:mod:`prefix_prefill.plan` for when they apply); it returns False when the kernel failed to build or
launch (another Triton's Gluon): from then on :func:`available` is False and the Triton kernel runs.

Options (:class:`Options`: soft-capping, the windows, sinks, ALiBi slopes, an fp8 output's scale)
become the kernels' keyword arguments as :func:`_option_args` says; each is None, a constexpr, where the
plan has it off.

Warm calls: a compiled and loaded key's full form is launched directly (light descriptors, Triton 3.6's
C launcher), and its first direct launch over a pair of caches keeps a frame of the C-launcher arguments
(:class:`prefill_runtime.compiled_launch.Frame`, per key, cache pointers, logit scale, cap and windows); a
repeated call signature goes to :func:`warm`, which fills the frame's per-call slots (grid, stream, the
new tokens' descriptors, the output and index pointers, the block table's stride and width, the LSE,
the status, the sinks, ALiBi slopes and fp8 output scale) and launches.

Short-query forms: a call whose queries all fit half a tile (``max_query_len <= 64``) runs the full form
with ``PACK`` where the first warpgroup's rows hold all of a KV head's query heads (grid over KV heads;
``prefix_prefill.plan.pack_heads``: no ALiBi, no gathering form), else with ``PAIR_HEADS``
where each KV head has an even number of query heads and the idle form's grid would take more than one
wave of the device's multiprocessors (the two warpgroups on two heads, grid over head pairs;
``prefix_prefill.plan.pair_heads``), else with ``IDLE_WG1``
(``prefix_prefill.plan.idle_second_warpgroup``): each a compiled variant, frame and compile tier of its
own (:func:`_variant`, which decides it once per call; the launch code reads it back from the
variant's key), the same rows bit for bit.

Persistent plans (``PERSISTENT``: narrow windows): the full form's grid is ``(programs, 1, 1)``, one
program a multiprocessor, at most the one-tile grid's tiles (:func:`_grid`, and inline in :func:`warm`),
the batch given as ``n_seqs``; the quick form and the short-query forms run one tile a program.

Compile tiers: the first call of a (kernel, constexprs, dtype) runs the kernel's quick-compiling form
(both consumer warpgroups as one 8-warp partition, LLVM at O0: it compiles the consumer once) while a
daemon thread compiles the full form (two warpgroups ping-ponging over the tensor cores; for a split
plan with ``ONE_CONSUMER`` the same one partition at full LLVM optimisation); calls after
that compile finished run the full form. The two compute the same output bit for bit. Inside a CUDA
graph capture a full form never launched before is not loaded: call :func:`finish_compiles` before
capturing. ``PREFIX_PREFILL_GLUON_TIERED=0``: the full form from the first call.
"""

from __future__ import annotations

import functools
import itertools
import os
from typing import NamedTuple

import torch

import prefill_runtime as runtime
from paged_kv_offsets import TmaRows
from prefill_runtime import LaunchPlan
from prefill_runtime.compiled_launch import CompiledLaunches, Descriptor
from prefill_runtime.gluon_host import multiprocessors as _multiprocessors
from prefill_runtime.gluon_host import persistent_grid, tile_counter
from prefill_runtime.plan import packed_tokens
from prefix_prefill.float16_copies import float16_copies, float16_copy_pointers
from prefix_prefill.kernel import LOG2E
from prefix_prefill.plan import (
    TMA_KERNELS,
    cache_views,
    idle_second_warpgroup,
    pack_heads,
    pair_heads,
)

try:  # Gluon (triton >= 3.5) with its Hopper module; without it the Triton kernel runs everywhere
    from prefix_prefill.gluon_kernel import _gluon_fwd_kernel
    from prefix_prefill.gluon_split_kernel import _gluon_split_kernel
except Exception:  # pragma: no cover - any import failure means "no Gluon"
    _gluon_fwd_kernel = _gluon_split_kernel = None

# Set when a Gluon kernel failed to build or launch once (another Triton's Gluon): Triton from then on.
_FAILED = False
# the full forms' compiled variants, launched directly once compiled and loaded
_NHD = CompiledLaunches(_gluon_fwd_kernel) if _gluon_fwd_kernel is not None else None
_SPLIT = CompiledLaunches(_gluon_split_kernel) if _gluon_split_kernel is not None else None
_TIERS = runtime.CompileTiers()
# (kernel, problem, plan, index tensors' spec) -> the int every later lookup of such a call uses (ids are
# never reused, so a dropped key's id cannot name another problem's variant)
_KEY_IDS: dict[tuple, int] = {}
_KEY_IDS_MAX = 4096
# key id -> (query heads, query heads a KV head, the device's multiprocessors, the packed form's rows a head
# or 0): what the short-query form weighs per call (:func:`_variant`), read once per key (cleared with
# _KEY_IDS)
_KEY_HEADS: dict[int, tuple[int, int, int, int]] = {}
_NEXT_ID = itertools.count()
# Windows at least this wide reach past any position (int32 in the kernels): passed as this
_WINDOW_CAP = 1 << 30


class Options(NamedTuple):
    """A call's options beyond plain attention, as the Gluon launch takes them: ``softcap`` (0: none),
    ``left`` (the left window, -1: none), ``sinks`` and ``alibi`` (``[num_heads]`` float32 tensors, or
    None), ``right`` (the right window of a non-causal call, -1: none), ``out_scale`` (an fp8 output's
    scale, a 1-element float tensor: ``o = clamp(out / out_scale)``; None for an output in q's dtype),
    ``k_scale``/``v_scale`` (an fp8 cache's dequantisation scales, 1-element float tensors; None for a
    16-bit cache)."""

    softcap: float = 0.0
    left: int = -1
    sinks: torch.Tensor | None = None
    alibi: torch.Tensor | None = None
    right: int = -1
    out_scale: torch.Tensor | None = None
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None


PLAIN = Options()


def _option_args(consts: dict, scale: float, opts: Options) -> float:
    """The kernels' logit multiplier (softmax scale, or with ``SOFTCAP`` the cap, times log2(e)); adds the
    option arguments (``Sinks``, ``Slopes``, ``tanh_scale``, ``window_left``, ``window_right``,
    ``OutScale``) to ``consts`` (a call's parameters, the plan's constexprs), each None (a constexpr) where
    its option is off there."""
    capped = consts.get("SOFTCAP", 0) > 0
    consts.update(
        Sinks=opts.sinks if consts.get("HAS_SINKS") else None,
        Slopes=opts.alibi if consts.get("HAS_ALIBI") else None,
        tanh_scale=scale / opts.softcap if capped else None,
        window_left=min(opts.left, _WINDOW_CAP) if consts.get("HAS_LEFT") else None,
        window_right=min(opts.right, _WINDOW_CAP) if consts.get("HAS_RIGHT") else None,
        OutScale=opts.out_scale if consts.get("OUT_MAX", 0.0) > 0 else None,
    )
    return (opts.softcap if capped else scale) * LOG2E


#: A bfloat16 call over an fp8 cache runs as a float16 one (:func:`_float16_operands`): q's shift.
_Q_SHIFT = 2.0**-8


def _runs_as_float16(plan: LaunchPlan, q) -> bool:
    """Whether a call of ``plan`` runs as a float16 one (:func:`_float16_operands`): bfloat16 q over an
    fp8 cache (``CACHE_FP8``)."""
    return q.dtype == torch.bfloat16 and plan.constexpr_map.get("CACHE_FP8", False)


def _float16_operands(q, k, v, scale: float) -> tuple:
    """A bfloat16 call over an fp8 cache (``CACHE_FP8``) as a float16 one: ``(q, k, v, scale)`` with q times
    ``_Q_SHIFT`` and the new tokens' k and v (None with ``k=None``) as contiguous float16 copies, the scale
    divided by the shift, so the logits are the same. Every fp8 value is a float16: the converter turns
    a pair into float16 in one instruction where bfloat16 takes an integer sequence, and P and V multiply
    in float16 (11 significant bits to bfloat16's 8). Exact for every q of magnitude in ``[2**-6,
    2**23]`` and every k, v in ``[2**-14, 65504]`` (float16's normal range: the new tokens' K/V go into
    the same fp8 cache, e4m3 holding at most 448 times its scale); smaller ones round to float16's
    subnormal step (2**-24, for q 2**-16)."""
    q16, k, v = float16_copies(q, k, v, _Q_SHIFT)  # (one launch)
    return q16, k, v, scale / _Q_SHIFT


def available() -> bool:
    """Both Gluon kernels imported, this Triton supported for them (``prefill_runtime``'s allowlist, if it
    has one) and none failed in this process."""
    if _gluon_fwd_kernel is None or _gluon_split_kernel is None or _FAILED:
        return False
    supported = getattr(runtime, "gluon_supported", None)
    return supported is None or supported()[0]


def install_hooks() -> None:
    """The Gluon kernels' compile hooks (:func:`prefill_runtime.hook_compiles`): their launchers built
    beside a cold compile (every descriptor argument is a TMA descriptor), LLVM at O0 where ``LLVM_O0``
    (the quick form), and for the split kernel the no-swizzle descriptor fix where ``K_CM`` (the
    chunk-major K ring)."""
    for kernel in (_gluon_fwd_kernel, _gluon_split_kernel):
        if kernel is not None:
            runtime.hook_compiles(
                kernel,
                tma_descriptors=True,
                llvm_o0_flag="LLVM_O0",
                desc_fix_flag="K_CM" if kernel is _gluon_split_kernel else None,
            )


def finish_compiles(timeout: float | None = None) -> bool:
    """Wait (at most ``timeout`` seconds) for the Gluon kernels' full forms compiling in the background
    (module docstring). Call it before capturing CUDA graphs, or before timing. True when none is left."""
    return _TIERS.finish(timeout)


def _tiered() -> bool:
    return os.environ.get("PREFIX_PREFILL_GLUON_TIERED", "1") != "0"


def _run_tiers(key: tuple, launch) -> None:
    """Launch a Gluon kernel in its full form, or per the compile tiers (module docstring)."""
    if not _tiered():
        launch(True, False)
    else:
        _TIERS.run(key, launch)


def launch_key(
    plan: LaunchPlan, problem, block_table, cu_seqlens_q, seq_lens, lse, status=None, opts: Options = PLAIN
) -> int:
    """The id of a call's key for the compiled variants launched directly: its kernel, problem and plan
    (which fix every descriptor's geometry and every constexpr), the dtypes and 16-byte alignment of
    the index tensors, ``lse``, ``status`` and the option tensors (the specialisations the problem leaves
    open) and the device (a variant is loaded on one). One call signature has one id
    (:class:`prefix_prefill.launch.Prepared` keeps it). Bounded: past ``_KEY_IDS_MAX`` keys the table
    starts over, with new ids."""
    full = (
        plan.kernel,
        problem,
        plan,
        _spec(
            block_table,
            cu_seqlens_q,
            seq_lens,
            lse,
            status,
            opts.sinks,
            opts.alibi,
            opts.out_scale,
            opts.k_scale,
            opts.v_scale,
        ),
        seq_lens.get_device(),
    )
    key = _KEY_IDS.get(full)
    if key is None:
        if len(_KEY_IDS) >= _KEY_IDS_MAX:
            _KEY_IDS.clear()
            _KEY_HEADS.clear()
        key = _KEY_IDS[full] = next(_NEXT_ID)
    return key


def warm(plan: LaunchPlan, key: int, q, k, v, o, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens,
         max_query_len: int, scale: float, lse, status=None, opts: Options = PLAIN) -> bool:  # fmt: skip
    """A warm call of a Gluon plan (``key``: its :func:`launch_key`) through the frame kept for its caches,
    scale, cap and windows: True when launched (or nothing to launch), False when there is no usable
    frame (no direct launch yet over these caches, a launch hook installed, a test's stand-in kernel,
    another current device): then :func:`launch` runs it."""
    nhd = plan.kernel in TMA_KERNELS
    fast = _NHD if nhd else _SPLIT
    if fast is None or fast.verify or fast.jit_fn is not (_gluon_fwd_kernel if nhd else _gluon_split_kernel):
        return False
    batch = seq_lens.shape[0]
    half = _runs_as_float16(plan, q)
    if half:
        scale = scale / _Q_SHIFT  # (the copies once the device is known to be q's)
    key = _variant(plan, key, max_query_len, q, k_cache, batch)
    frame = fast.frame(
        (key, k_cache.data_ptr(), v_cache.data_ptr(), scale, opts.softcap, opts.left, opts.right)
    )
    if frame is None:
        return False
    index = q.get_device()
    # (Triton launches on the current device: launch() sets it; CUDA is initialised, q is on it)
    if index != torch._C._cuda_getDevice():
        return False
    tokens = q.shape[0]
    if batch == 0 or tokens == 0:
        return True
    stream = torch._C._cuda_getCurrentRawStream(index)
    if half:  # (copies: the float16 allocation, held until this call's launch is enqueued)
        copies, qp, kp, vp = float16_copy_pointers(q, k, v, _Q_SHIFT, stream)
        bases = (qp, qp, qp, qp) if k is None else (qp, kp, vp, kp)
    else:
        qp = q.data_ptr()
        if k is None:
            bases = (qp, qp, qp, qp)
        else:
            kp = k.data_ptr()
            bases = (qp, kp, v.data_ptr(), kp)  # (the bases of _per_call_descs, in its order)
    plain = (
        o.data_ptr(),
        block_table.data_ptr(),
        cu_seqlens_q.data_ptr(),
        seq_lens.data_ptr(),
        block_table.stride(0),
        None if lse is None else lse.data_ptr(),
        None if lse is None else lse.stride(0),
        block_table.shape[1],
        max_query_len,
        None if status is None else status.data_ptr(),
        None if opts.sinks is None else opts.sinks.data_ptr(),
        None if opts.alibi is None else opts.alibi.data_ptr(),
        None if opts.out_scale is None else opts.out_scale.data_ptr(),
    )
    if opts.k_scale is not None:  # an fp8 cache's plan (the frame has the scales' slots: _per_call_plain)
        plain += (opts.k_scale.data_ptr(), opts.v_scale.data_ptr())
    heads = q.shape[1]  # (:func:`_grid`'s grid, inline on this per-call path)
    n_m = max(-(-max_query_len // plan.block_m), 1)
    if key.__class__ is tuple:
        if key[1] == "pair":  # grid over head pairs
            heads //= 2
        elif key[1] == "pack":  # grid over KV heads
            heads //= _KEY_HEADS[key[0]][1]
    elif plan.constexpr_map.get("PERSISTENT", False):  # one program a multiprocessor, tile after tile
        n_m, heads, batch = persistent_grid(n_m * heads * batch, _multiprocessors(index))
        plain += (seq_lens.shape[0], tile_counter(index, stream))  # (_per_call_plain's last two slots)
    frame(n_m, heads, batch, stream, tokens, bases, plain)
    if half:
        del copies  # (after the launch that reads them is enqueued)
    return True


def launch(plan: LaunchPlan, problem, q, k, v, o, k_cache, v_cache, kc, vc, block_table, cu_seqlens_q,
           seq_lens, max_query_len, scale, lse, key: int | None = None, status=None,
           opts: Options = PLAIN) -> bool:  # fmt: skip
    """Run ``plan``'s Gluon kernel for ``problem`` (:class:`prefix_prefill.plan.Problem`) with the call's
    options ``opts``; False when it failed to build or launch (then :func:`available` answers False for
    the rest of the process). ``key``: :func:`launch_key` of the call (computed here when None)."""
    global _FAILED
    # (before the launch guard: missing scales are the caller's error, not a kernel that failed to build)
    if (opts.k_scale is None or opts.v_scale is None) and plan.constexpr_map.get("CACHE_FP8", False):
        raise ValueError("an fp8 cache's Gluon launch needs k_scale and v_scale tensors")
    if key is None:
        key = launch_key(plan, problem, block_table, cu_seqlens_q, seq_lens, lse, status, opts)
    if _runs_as_float16(plan, q):
        q, k, v, scale = _float16_operands(q, k, v, scale)
    key = _variant(plan, key, max_query_len, q, k_cache, seq_lens.shape[0])
    nhd = plan.kernel in TMA_KERNELS
    fast = _NHD if nhd else _SPLIT
    args = (plan, key, q, k, v, o, k_cache, v_cache, kc, vc, block_table, cu_seqlens_q, seq_lens,
            max_query_len, scale, lse, status, opts)  # fmt: skip
    if fast is not None and not fast.verify and fast.has(key):  # compiled and loaded: straight to it
        run = functools.partial(_warm, fast, _nhd_call if nhd else _split_call, *args)
    else:
        run = _through_tiers(*args)
    if runtime.gluon_try_launch(run, "prefix_prefill"):
        return True
    _FAILED = True
    return False


def _variant(plan: LaunchPlan, key: int, max_query_len: int, q, k_cache, batch: int):
    """The compiled variant's key of a call over ``batch`` sequences with :func:`launch_key` ``key``:
    ``key``, or ``(key, form)`` for a short-query form (:func:`prefix_prefill.plan.idle_second_warpgroup`):
    ``"pack"`` where :func:`prefix_prefill.plan.pack_heads` says so, ``"pair"`` where
    :func:`prefix_prefill.plan.pair_heads` does, else ``"idle"``. The key fixes the head counts, the
    device and the packed form's rows (the rule's part that is not the call's length), read once per key."""
    if not idle_second_warpgroup(plan, max_query_len):
        return key
    heads = _KEY_HEADS.get(key)
    if heads is None:
        kv_heads = k_cache.shape[2] if plan.kernel == "gluon-nhd" else k_cache.shape[1]  # (HND, split: dim 1)
        n = q.shape[1]
        group = n // kv_heads
        rows = packed_tokens(plan.block_m // 2, group) if pack_heads(plan, group, 1) else 0
        heads = _KEY_HEADS[key] = (n, group, _multiprocessors(q.get_device()), rows)
    if max_query_len <= heads[3]:  # (pack_heads(plan, group, max_query_len), its length test alone)
        return (key, "pack")
    return (key, "pair" if pair_heads(heads[1], heads[0] * batch, heads[2]) else "idle")


def _form(key, full: bool = True) -> str | None:
    """The short-query form a variant key names (:func:`_variant`); None for the quick form (``full``
    False: one consumer partition, no second warpgroup to pair or idle)."""
    return key[1] if full and key.__class__ is tuple else None


def _form_consts(form: str | None, group: int, rows: int) -> tuple[int, dict]:
    """The rows of a form's Q box and its short-query constexprs (``IDLE_WG1``, ``PAIR_HEADS``, ``PACK``)
    for a launch of ``group`` query heads a KV head (both kernels): ``rows``, a consumer partition's rows
    (half a tile, or the whole tile for one partition), or for the packed form ``packed_tokens(rows,
    group)``, one head's rows."""
    pack = form == "pack"
    box = packed_tokens(rows, group) if pack else rows
    return box, dict(IDLE_WG1=form in ("idle", "pack"), PAIR_HEADS=form == "pair", PACK=group if pack else 0)


def _grid(block_m: int, max_query_len: int, heads: int, batch: int, form: str | None,
          persistent: bool = False, device: int = -1, group: int = 1) -> tuple[int, int, int]:  # fmt: skip
    """The grid of a launch: (query tiles, heads or, for the ``"pair"`` form, head pairs, for the
    ``"pack"`` form KV heads (``group`` query heads each), sequences); a ``persistent`` launch's: (one
    program a multiprocessor of CUDA device ``device``, at most the one-tile grid's tiles; 1; 1)."""
    n_m = max(-(-max_query_len // block_m), 1)
    if persistent:
        return persistent_grid(n_m * heads * batch, _multiprocessors(device))
    return n_m, heads // 2 if form == "pair" else heads // group if form == "pack" else heads, batch


def _warm(fast, call, plan, key, q, k, v, o, k_cache, v_cache, kc, vc, block_table, cu_seqlens_q, seq_lens,
          max_query_len, scale, lse, status=None, opts: Options = PLAIN) -> None:  # fmt: skip
    """A compiled key's full form, launched directly with light descriptors, then kept as a frame over
    these caches (:class:`prefill_runtime.compiled_launch.Frame`): the key's later calls over them fill
    only the per-call slots (:func:`warm`)."""
    args, params, grid = call(plan, key, q, k, v, o, k_cache, v_cache, kc, vc, block_table, cu_seqlens_q,
                              seq_lens, max_query_len, scale, lse, status, opts, True, True)  # fmt: skip
    fast.launch(key, grid, args, params, _options(params), q.device)
    # (the frame holds the caches' descriptors, the logit scale, the cap and the window, which the key
    # leaves open)
    frame_key = (key, k_cache.data_ptr(), v_cache.data_ptr(), scale, opts.softcap, opts.left, opts.right)
    if fast.frame(frame_key) is None:
        descs = dict(_per_call_descs(nhd=call is _nhd_call, k=k, params=params))
        fast.make_frame(key, frame_key, args, params, descs, _per_call_plain(params))


# A frame's per-call plain arguments (both kernels name them alike), in the order warm() passes them
_PER_CALL_PLAIN = ("O", "BlockTable", "CuSeqlensQ", "SeqLens", "stride_bt", "Lse", "stride_lse_h",
                   "n_bt_cols", "max_query_len", "Status", "Sinks", "Slopes", "OutScale")  # fmt: skip


def _per_call_plain(params: dict) -> tuple[str, ...]:
    """A frame's per-call plain arguments: :data:`_PER_CALL_PLAIN`, then with an fp8 cache (``CACHE_FP8``)
    its scales, in the order warm() passes them (it adds them where the call's options hold them:
    :class:`prefix_prefill.launch.Prepared` gives them to fp8 plans only), then a persistent form's
    ``n_seqs`` and tile counter (one a stream)."""
    return (_PER_CALL_PLAIN + (("KScale", "VScale") if params.get("CACHE_FP8") else ())
            + (("n_seqs", "TileCounter") if params.get("PERSISTENT") else ()))  # fmt: skip


def _per_call_descs(nhd: bool, k, params: dict) -> list[tuple[str, int]]:
    """A frame's per-call descriptors (parameter, the dimension of its shape that is the token count), in
    the order of the bases warm() passes (q, K rows, V rows, K rows): Q's rows; the new tokens' K and V
    unless they come from the cache (NHD/HND: the cache's descriptors stand in); the split kernel's K by TMA
    is ``[kv_heads * D/8, tokens, 8]`` and its full key blocks ``KN_desc`` ``[..., tokens, 8]``."""
    if nhd:
        return [("Q_desc", 0)] if k is None else [("Q_desc", 0), ("K_desc", 0), ("V_desc", 0)]
    k_tma = params["K_TMA"]
    return [("Q_desc", 0), ("K_desc", 1 if k_tma else 0), ("V_desc", 0)] + ([("KN_desc", 2)] if k_tma else [])


# a form's launch options, by its ONE_CONSUMER: the default partition's warps, 8 for the one 8-warp consumer
# partition, else 4 (the first consumer warpgroup); the other partitions bring their own
_OPTIONS = {True: {"num_warps": 8}, False: {"num_warps": 4}}


def _options(params: dict) -> dict:
    """The launch options of the form ``params`` describe (:data:`_OPTIONS`)."""
    return _OPTIONS[params["ONE_CONSUMER"]]


def _tma(base: torch.Tensor, shape: list, strides: list, block: list, layout, light: bool):
    """A TMA descriptor over ``base`` seen as ``shape``/``strides`` (elements), block ``block`` in
    ``layout``; ``light``: the per-call part only (:class:`Descriptor`)."""
    if light:
        return Descriptor(base, shape, strides)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return TensorDescriptor(base, shape, strides, block, layout)


@functools.cache
def _swizzled(rows: int, cols: int, half: bool):
    """The default NVMMA shared layout of a 16-bit ``[rows, cols]`` block (128-byte swizzle for 64+)."""
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout.get_default_for([rows, cols], gl.float16 if half else gl.bfloat16)


@functools.cache
def _unswizzled(rank: int):
    """The no-swizzle NVMMA shared layout of a 16-bit block of ``rank`` dimensions (lands dense)."""
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=rank)


def _rows(t: torch.Tensor, block: int, light: bool, layout_rows: int = 0):
    """``t`` ``[tokens, heads, D]`` (the plan checked TMA can read it) as ``[tokens, heads * D]`` rows,
    block ``[block, D]`` in the shared layout of a ``[layout_rows, D]`` block (0: of ``block`` rows)."""
    d = t.shape[2]
    layout = None if light else _swizzled(layout_rows or block, d, t.dtype == torch.float16)
    return _tma(t, [t.shape[0], t.shape[1] * d], [t.stride(0), 1], [block, d], layout, light)


@functools.cache
def _fp8_staging():
    """The no-swizzle NVMMA shared layout of a ``[rows, D]`` fp8 block: an fp8 cache's staging slots (the
    converter partition reads them, see :mod:`prefix_prefill.gluon_kernel`)."""
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2)


def _cache_rows(cache: torch.Tensor, view: TmaRows, d: int, rows: int, light: bool):
    """A cache seen as its view of rows ``view`` (``[view.rows, view.row_elems]``, strides
    ``[view.row_stride, 1]``, the plan checked that TMA can read it), block ``[rows, d]`` (an fp8 cache's
    in :func:`_fp8_staging`'s layout)."""
    if light:
        layout = None
    elif cache.element_size() == 1:
        layout = _fp8_staging()
    else:
        layout = _swizzled(rows, d, cache.dtype == torch.float16)
    return _tma(cache, [view.rows, view.row_elems], [view.row_stride, 1], [rows, d], layout, light)


def _go(kernel, fast, key, grid, args, params, num_warps, device) -> None:
    """``kernel[grid](*args, **params, num_warps=...)``, or its compiled variant launched directly
    (:class:`prefill_runtime.compiled_launch.CompiledLaunches`) for a ``key`` seen before; ``key`` None:
    through Triton. The key covers the problem, the plan and the tensors' dtypes and alignment outside
    the problem: with them, every other argument is a descriptor (typed by its block and layout) or an
    integer the problem fixes or the kernel does not specialise."""
    if fast is None or kernel is not fast.jit_fn:  # (tests' recorders)
        kernel[grid](*args, **params, num_warps=num_warps)
        return
    fast.launch(key, grid, args, params, {"num_warps": num_warps}, device)


def _spec(*tensors) -> tuple:
    return tuple(None if t is None else (t.dtype, t.data_ptr() % 16 == 0) for t in tensors)


def _nhd_call(plan, key, q, k, v, o, k_cache, v_cache, kc, vc, block_table, cu_seqlens_q, seq_lens,
              max_query_len, scale, lse, status, opts, full: bool, light: bool) -> tuple:  # fmt: skip
    """The NHD/HND kernel's ``(args, params, grid)``: the full form (two consumer warpgroups) or the quick
    one (one 8-warp consumer partition, Q in one box); ``light``: descriptors for a direct launch. The
    caches as their views of rows (:func:`cache_views`), ``oob_row`` the first row past both."""
    consts = plan.consts()
    block_m, block_n, box = consts["BLOCK_M"], consts["BLOCK_N"], consts["BOX"]
    form = _form(key, full)
    # the persistent form is the full form's for calls past the short-query forms
    persistent = consts.get("PERSISTENT", False) and full and form is None
    group = q.shape[1] // kc.num_kv_heads
    grid = _grid(block_m, max_query_len, q.shape[1], seq_lens.shape[0], form, persistent, q.get_device(),
                 group)  # fmt: skip
    views = cache_views(kc, vc, k_cache.element_size())
    if views is None:
        raise ValueError("the NHD/HND Gluon kernel needs caches TMA reads as one view of rows (see plan())")
    kv, vv = views
    d = kc.head_size
    kcb, vcb = _cache_rows(k_cache, kv, d, block_n, light), _cache_rows(v_cache, vv, d, block_n, light)
    kbox, vbox = _cache_rows(k_cache, kv, d, box, light), _cache_rows(v_cache, vv, d, box, light)
    if k is None:  # the new tokens' K/V come from the cache: K_desc/V_desc only give the rings' layout
        k_desc, v_desc = kcb, vcb  # (an fp8 cache: RING gives it)
    else:
        k_desc, v_desc = _rows(k, block_n, light), _rows(v, block_n, light)
    # Q's box: half a tile (the full form), a whole one (the quick form), a packed head's rows ("pack")
    q_rows = block_m // 2 if full else block_m
    q_box, short = _form_consts(form, group, q_rows)
    args = (_rows(q, q_box, light, q_rows), k_desc, v_desc, kbox, vbox, kcb, vcb,
            o, block_table, cu_seqlens_q, seq_lens, _option_args(consts, scale, opts), group, o.stride(0),
            o.stride(1), block_table.stride(0), kc.page_size, max(kv.rows, vv.rows), *kv.kernel_args(), lse,
            lse.stride(0) if lse is not None else None, block_table.shape[1], kc.num_blocks, max_query_len,
            status)  # fmt: skip
    consts.update(ONE_CONSUMER=not full, **short, LLVM_O0=not full and _tiered(), PERSISTENT=persistent,
                  n_seqs=seq_lens.shape[0] if persistent else None,
                  TileCounter=tile_counter(q.get_device()) if persistent else None)  # fmt: skip
    # an fp8 cache's scales and the float16 rings' layout (its descriptors are fp8; q is float16 there:
    # launch() and warm() make a bfloat16 call a float16 one); every parameter given,
    # so that the compiled variant launches directly (CompiledLaunches keeps no key with one left out)
    fp8 = consts["CACHE_FP8"]  # (launch() refused an fp8 call without its scales)
    consts.update(KScale=opts.k_scale if fp8 else None, VScale=opts.v_scale if fp8 else None,
                  RING=_swizzled(block_n, d, True) if fp8 else None)  # fmt: skip
    # the GATHER form's caches by pointer and element strides (K and V of one geometry: the plan checked)
    gather = consts["GATHER"]
    consts.update(K_cache=k_cache if gather else None, V_cache=v_cache if gather else None,
                  c_block=kc.stride_block if gather else None, c_slot=kc.stride_slot if gather else None,
                  c_head=kc.stride_head if gather else None)  # fmt: skip
    return args, consts, grid


def _start(kernel, fast, key, full, warmup, grid, args, params, device) -> None:
    """One form's launch (``full``: through ``fast``, the compiled variants launched directly) or, for a
    background compile (``warmup``), its compile."""
    warps = _options(params)["num_warps"]
    if warmup:  # (a background thread: its CUDA device is not the caller's)
        with torch.cuda.device(device):
            kernel.warmup(*args, grid=grid, **params, num_warps=warps)
    else:
        _go(kernel, fast, key if full else None, grid, args, params, warps, device)


# --------------------------------------------------------------------------- vLLM's split layout
@functools.cache
def _k_view(block_n: int, head: int, cm: bool):
    """How the split kernel's consumers read a K slot filled by TMA: ``[block_n, head]`` (``cm``: the
    chunk-major ring, one view of all features) or ``[block_n, 64]`` (one view per 64 features), stored as
    ``block_n / 8`` chunks of ``[feature groups, 8 keys, 8 features]`` dense, i.e. element offset ``d % 8
    + (n % 8) * 8 + (d // 8) * 64 + (n // 8) * cols * 8``: wgmma's no-swizzle K-major core matrices
    (leading byte offset 128, stride byte offset ``cols * 16``). A view whose stride byte offset is not
    1024 reads right only with its PTX's no-swizzle descriptor base offsets cleared (the compile hook's
    ``desc_fix_flag``)."""
    from triton.experimental.gluon import language as gl

    cols = head if cm else 64
    bits = [[0, 1], [0, 2], [0, 4], [1, 0], [2, 0], [4, 0]]  # d % 8, n % 8
    bits += [[0, 8 << i] for i in range((cols // 8).bit_length() - 1)]  # d // 8
    bits += [[8 << i, 0] for i in range((block_n // 8).bit_length() - 1)]  # n // 8
    return gl.SharedLinearLayout(offset_bases=bits)


def _k_wide_descriptor(k_cache: torch.Tensor, rows: int, page: int, block_n: int, groups: int, light: bool):
    """vLLM's contiguous split K cache (``rows`` = num_blocks * kv_heads * D/8 feature groups of ``page * 8``
    elements) seen as ``[page / 8, rows, 64]`` with strides ``[64, page * 8, 1]`` (a page's key groups of 8,
    the feature groups, one group's 8 keys x 8 features), block ``[block_n / 8, groups, 64]`` in the
    no-swizzle layout: a box lands as ``block_n / 8`` dense chunks, the K ring's layout (:func:`_k_view`).
    The strides are not in decreasing order (TMA asks only that they be multiples of 16 bytes); the box
    stays inside its page (the kernel uses it only for blocks that do). ``groups``: feature groups a box
    spans (8: 64 features, one part of the part-major ring; D / 8: every feature, the chunk-major one)."""
    return _tma(k_cache, [page // 8, rows, 64], [64, page * 8, 1], [block_n // 8, groups, 64], _unswizzled(3),
                light)  # fmt: skip


def _new_k_chunks(t: torch.Tensor, light: bool):
    """The split kernel's descriptor of the new tokens' K with K by TMA: ``t`` ``[tokens, kv_heads, D]``
    (heads adjacent, unit feature stride: the plan checked) seen as ``[kv_heads * D/8, tokens, 8]`` with
    strides ``[8, token stride, 1]`` (feature groups, tokens, one group's 8 features), block ``[8, 8, 8]``
    in the no-swizzle layout: a box lands as one dense 8-key chunk of the K ring (8 groups of 8 keys x 8
    features); rows past the tensor's end read zeros."""
    tokens, heads, d = t.shape
    return _tma(t, [heads * d // 8, tokens, 8], [8, t.stride(0), 1], [8, 8, 8], _unswizzled(3), light)


def _new_k_blocks(t: torch.Tensor, block_n: int, groups: int, light: bool):
    """The split kernel's descriptor of the new tokens' full key blocks with K by TMA: ``t`` as
    :func:`_new_k_chunks` sees it, seen as ``[block_n / 8, kv_heads * D/8, tokens, 8]`` with strides
    ``[8 * token stride, 8, token stride, 1]`` (key groups of 8, feature groups, keys, features), block
    ``[block_n / 8, groups, 8, 8]`` in the no-swizzle layout: a box at token ``tok`` lands as the
    ``block_n / 8`` dense chunks of keys ``[tok, tok + block_n)`` (``groups``: 8, one 64-feature part of
    the part-major ring; D / 8, every feature, the chunk-major one). The first dimension overlaps the
    third (TMA bounds each dimension alone), so only a block that lies inside ``t`` may use it."""
    tokens, heads, d = t.shape
    ts, nc = t.stride(0), block_n // 8
    shape, strides = [nc, heads * d // 8, tokens, 8], [8 * ts, 8, ts, 1]
    return _tma(t, shape, strides, [nc, groups, 8, 8], _unswizzled(4), light)


def _split_call(plan, key, q, k, v, o, k_cache, v_cache, kc, vc, block_table, cu_seqlens_q, seq_lens,
                max_query_len, scale, lse, status, opts, full: bool, light: bool) -> tuple:  # fmt: skip
    """The split kernel's ``(args, params, grid)`` (forms and ``light`` as :func:`_nhd_call`, except that
    a plan with ``ONE_CONSUMER`` has the one-partition consumer in its full form too); the new tokens' K
    and V are read where they are."""
    consts = plan.consts()
    head, hk, page = q.shape[2], kc.num_kv_heads, kc.page_size
    block_m, block_n = consts["BLOCK_M"], consts["BLOCK_N"]
    k_tma, v_tma, k_wide, k_cm = consts["K_TMA"], consts["V_TMA"], consts["K_WIDE"], consts["K_CM"]
    g = head // 8
    groups = g if k_cm else 8  # feature groups a K box spans
    half = q.dtype == torch.float16
    strides = (kc.stride_block, kc.stride_head, kc.stride_dim, vc.stride_block, vc.stride_head, vc.stride_dim)
    # the V ring's [D, BLOCK_N] slots: [D, 16] TMA boxes (32-byte swizzle) or [D, BLOCK_N] gathers
    v_ring = _swizzled(head, 16 if v_tma else block_n, half)
    # the new tokens' rows (with k = None never read: q's rows give the descriptors' types)
    k_rows, v_rows = (q, q) if k is None else (k, v)
    form = _form(key, full)
    group = q.shape[1] // hk
    grid = _grid(block_m, max_query_len, q.shape[1], seq_lens.shape[0], form, group=group)

    def caches() -> tuple:
        v_cache_arg, k_cache_arg, kw_desc, kr_desc = v_cache, k_cache, None, None
        if v_tma:  # the V cache as [num_blocks * kv_heads * D, page_size], one box per 16-key run
            v_cache_arg = _tma(v_cache, [vc.num_blocks * hk * head, page], [page, 1], [head, 16], v_ring,
                               light)  # fmt: skip
        if k_tma:  # D/64 (or one, chunk-major) boxes a block inside a page, 16-key runs elsewhere
            kr_desc = _k_wide_descriptor(k_cache, kc.num_blocks * hk * g, page, 16, groups, light)
            if k_wide == 1:
                kw_desc = _k_wide_descriptor(k_cache, kc.num_blocks * hk * g, page, block_n, groups, light)
            # the K cache as [num_blocks * kv_heads * D/8, page_size * 8] (the ring's 64-wide rows)
            k_cache_arg = _tma(k_cache, [kc.num_blocks * hk * g, page * 8], [page * 8, 1], [8, 64],
                               _unswizzled(2), light)  # fmt: skip
        return k_cache_arg, v_cache_arg, kw_desc, kr_desc

    k_cache_arg, v_cache_arg, kw_desc, kr_desc = caches()
    if k_tma:
        k_desc, kn_desc = _new_k_chunks(k_rows, light), _new_k_blocks(k_rows, block_n, groups, light)
    else:
        k_desc, kn_desc = _rows(k_rows, block_n, light), None
    one = consts["ONE_CONSUMER"] or not full  # one 8-warp consumer partition: the plan's, or the quick form
    v_block = block_n // 2 if consts["V_STAGE"] else block_n  # (V_STAGE: half blocks, which it transposes)
    qk_scale = _option_args(consts, scale, opts)
    q_rows = block_m if one else block_m // 2  # (a packed form: Q's box a head's rows, in the half's layout)
    q_box, short = _form_consts(form, group, q_rows)
    args = (_rows(q, q_box, light, q_rows), k_desc, _rows(v_rows, v_block, light),
            k_cache_arg, v_cache_arg, o, block_table, cu_seqlens_q, seq_lens, qk_scale, group,
            o.stride(0), o.stride(1), block_table.stride(0), page, *strides, lse,
            lse.stride(0) if lse is not None else None, block_table.shape[1], kc.num_blocks, max_query_len,
            status)  # fmt: skip
    consts.update(K_VIEW=_k_view(block_n, head, k_cm) if k_tma else None, V_RING=v_ring, KW_desc=kw_desc,
                  KR_desc=kr_desc, KN_desc=kn_desc, ONE_CONSUMER=one,
                  **short, LLVM_O0=not full and _tiered())  # fmt: skip
    # an fp8 cache's scales (the caches gathered by pointer; q and the rings float16, as _nhd_call's)
    fp8 = consts["CACHE_FP8"]
    consts.update(KScale=opts.k_scale if fp8 else None, VScale=opts.v_scale if fp8 else None)
    return args, consts, grid


def _through_tiers(plan, key, q, k, v, o, k_cache, v_cache, kc, vc, block_table, cu_seqlens_q, seq_lens,
                   max_query_len, scale, lse, status, opts):  # fmt: skip
    """``plan``'s kernel launched through the compile tiers (module docstring), as a thunk."""
    nhd = plan.kernel in TMA_KERNELS

    def one(full: bool, warmup: bool) -> None:
        kernel, fast = (_gluon_fwd_kernel, _NHD) if nhd else (_gluon_split_kernel, _SPLIT)
        light = full and not warmup and fast is not None and fast.has(key) and not fast.verify
        args, params, grid = (_nhd_call if nhd else _split_call)(
            plan, key, q, k, v, o, k_cache, v_cache, kc, vc, block_table, cu_seqlens_q, seq_lens,
            max_query_len, scale, lse, status, opts, full, light,
        )  # fmt: skip
        _start(kernel, fast, key, full, warmup, grid, args, params, q.device)

    # (the tiers' key: one background compile per kernel, dtype, constexprs and short-query form,
    # whatever the problem)
    form = _form(key)
    tier_key = ("nhd" if nhd else "split", q.dtype, form, *plan.constexprs)
    return lambda: _run_tiers(tier_key, one)
