"""The launch: a call's :class:`~window_prefill.plan.Problem` from its tensors' metadata
(:func:`describe`), its cached plan, and the one kernel launch the plan names (:func:`run`): the Triton
kernel (:mod:`window_prefill.kernel`) or the Gluon one (:mod:`window_prefill.gluon_kernel`).

Arguments arrive checked (:mod:`window_prefill.api`). Per call the host reads tensor metadata only
(shapes, strides, dtype, device, 16-byte alignment of the base pointers), never device memory, and
launches one kernel: no copies, no allocations, no helper kernels (dummy pointer arguments reuse
tensors of the call), so a call is CUDA-graph capturable. TMA descriptors hold pointers: they are
built for each call, never cached; plans hold none and are cached by problem.

Process state: Triton's one-time setup and this package's compile hooks run before the first launch
on a GPU (:func:`_prime_triton`); calls plan the Gluon kernel while :func:`gluon_offered` holds (it
imported, the environment variable ``WINDOW_PREFILL_GLUON`` is not ``0``, no launch of it failed: a
Triton whose Gluon cannot build it is warned about once, then its calls run the Triton kernel; and
``prefill_runtime.gluon_supported()``: this Triton is on the Gluon kernels' allowlist, or
``PREFILL_GLUON=1`` forces them).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os

import torch

from prefill_runtime import (
    LaunchPlan,
    gluon_descriptor,
    gluon_supported,
    gluon_try_launch,
    hook_compiles,
    prime_triton,
    softcap_form,
)
from prefill_runtime.compiled_launch import CompiledLaunches, Descriptor
from prefill_runtime.fp8 import FP8_DTYPES
from prefill_runtime.gluon_host import multiprocessors, persistent_grid, tile_counter
from window_prefill.configs import detect_arch
from window_prefill.kernel import _fwd_kernel
from window_prefill.plan import Problem, narrow_window, plan, wide_window

try:  # triton >= 3.4; without it the Triton kernel loads K/V by pointer
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover
    TensorDescriptor = None

try:  # Gluon (triton >= 3.5) with its Hopper module; without it the Triton kernel runs everywhere
    from window_prefill.gluon_kernel import _gluon_fwd_kernel
except Exception:  # pragma: no cover - any import failure means "no Gluon"
    _gluon_fwd_kernel = None

# Windows at least this wide cover any sequence a launch can hold: treated as unbounded (and never
# passed to the kernel, whose position arithmetic is int32).
_UNBOUNDED_WINDOW = 1 << 30
_LOG2E = math.log2(math.e)  # the kernels' scores are in log2 units
_ELEMENT_SIZE = {torch.float16: 2, torch.bfloat16: 2, torch.float32: 4}  # bytes, without a tensor call
_FP8_MAX = {t: float(torch.finfo(t).max) for t in FP8_DTYPES}  # an fp8 output's clamp, by its dtype

# Each kernel's compiled variants by call key (:func:`_key`), launched without Triton's per-call binder
_TRITON = CompiledLaunches(_fwd_kernel)
_GLUON = CompiledLaunches(_gluon_fwd_kernel) if _gluon_fwd_kernel is not None else None

_primed = False  # _prime_triton ran in this process
_gluon_ok = _gluon_fwd_kernel is not None and os.environ.get("WINDOW_PREFILL_GLUON", "1") != "0"


def gluon_offered() -> bool:
    """May a call plan the Gluon kernel? ``_gluon_ok`` (above) and ``prefill_runtime.gluon_supported()``
    (the Triton allowlist and ``PREFILL_GLUON``, read per call; outside the allowlist it logs one line
    per process and the Triton kernel runs), as prefix-prefill asks before it offers its Gluon kernels."""
    return _gluon_ok and gluon_supported()[0]


def interpreted() -> bool:
    """Whether this process's kernels run under the Triton interpreter (``TRITON_INTERPRET=1`` was set
    before the kernels were defined): then they take CPU tensors. Asks the kernel module's own object,
    which tests that record launches leave in place."""
    from window_prefill import kernel

    return type(kernel._fwd_kernel).__name__ == "InterpretedFunction"


def _prime_triton() -> None:
    """Before this package's first launch on a GPU: Triton's one-time process setup, side by side
    (:func:`prefill_runtime.prime_triton`), and the compile hooks that build each kernel's launcher
    while the kernel compiles (:func:`prefill_runtime.hook_compiles`; the Gluon kernel lowers every
    descriptor argument to a TMA descriptor)."""
    global _primed
    _primed = True
    prime_triton()
    hook_compiles(_fwd_kernel)
    if _gluon_fwd_kernel is not None:
        hook_compiles(_gluon_fwd_kernel, tma_descriptors=True)


def _fits_int32(shape: torch.Size, st: tuple[int, ...]) -> bool:
    """Every element of a 3-D tensor of ``shape`` and strides ``st`` lies less than 2**31 elements
    from its first one (an empty tensor: trivially)."""
    n0, n1, n2 = shape
    if n0 == 0 or n1 == 0 or n2 == 0:
        return True
    return min(st) >= 0 and (n0 - 1) * st[0] + (n1 - 1) * st[1] + (n2 - 1) * st[2] < 2**31


def _tma_rows(t: torch.Tensor, st: tuple[int, ...], heads: int, head_dim: int, elem: int) -> bool:
    """``t`` ``[tokens, heads, head_dim]`` (strides ``st``) can be a TMA descriptor over ``[tokens,
    heads * head_dim]``: unit feature stride, heads ``head_dim`` apart, 16-byte base and rows."""
    return (
        st[2] == 1
        and st[1] == head_dim
        and st[0] >= heads * head_dim
        and (st[0] * elem) % 16 == 0
        and t.data_ptr() % 16 == 0
    )


def describe(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: torch.Tensor | None, *,
    causal: bool, window_left: int, window_right: int, softmax_scale: float, sinks: torch.Tensor | None,
    bias_key0: bool, softcap: float, return_lse: bool, config: object = None,
    alibi_slopes: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
) -> Problem:  # fmt: skip
    """The :class:`~window_prefill.plan.Problem` of a checked call (windows inclusive, ``-1`` unbounded,
    widths of ``_UNBOUNDED_WINDOW`` or more already mapped to ``-1``; ``out_dtype``: the output's, None
    for q's): tensor metadata and host values only."""
    return Problem(*_fields(q, k, v, lens, causal, window_left, window_right, softmax_scale, sinks,
                            bias_key0, softcap, return_lse, config, alibi_slopes, out_dtype))  # fmt: skip


def _fields(q, k, v, lens, causal, window_left, window_right, softmax_scale, sinks, bias_key0,
            softcap, return_lse, config, alibi_slopes, out_dtype) -> tuple:  # fmt: skip
    """A problem's fields, in :class:`~window_prefill.plan.Problem`'s order: the plan cache's key (a
    tuple is cheaper to build and hash than the dataclass, which is made on a cache miss only)."""
    total, heads, head_dim = q.shape
    kv_shape = k.shape
    kv_heads = kv_shape[1]
    dtype = q.dtype
    elem = _ELEMENT_SIZE[dtype]
    kst, vst = k.stride(), v.stride()
    small = total < 2**31
    return (
        dtype,
        heads,
        kv_heads,
        head_dim,
        detect_arch(q.device),
        causal,
        window_left >= 0,  # has_left
        window_right >= 0,  # has_right
        wide_window(causal, window_left, window_right, head_dim),
        narrow_window(causal, window_left, window_right),
        sinks is not None,
        sinks is not None and bias_key0,
        alibi_slopes is not None,  # alibi
        softcap_form(softcap, q) if softcap > 0 else 0,
        softmax_scale > 0,  # scale_positive
        lens is None,  # cumulative_starts
        return_lse,
        not (_fits_int32(kv_shape, kst) and _fits_int32(kv_shape, vst)),  # wide_offsets
        small and _tma_rows(q, q.stride(), heads, head_dim, elem),  # q_tma
        TensorDescriptor is not None
        and small
        and _tma_rows(k, kst, kv_heads, head_dim, elem)
        and _tma_rows(v, vst, kv_heads, head_dim, elem),  # kv_tma
        gluon_offered(),  # gluon
        config,
        _FP8_MAX.get(out_dtype, 0.0),  # fp8_out_limit
    )


def forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, starts: torch.Tensor,
    lens: torch.Tensor | None, max_len: int, *, causal: bool, window_left: int, window_right: int,
    softmax_scale: float, sinks: torch.Tensor | None, bias_key0: bool, config: object = None,
    softcap: float = 0.0, lse: torch.Tensor | None = None, status: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None, out_scale: torch.Tensor | None = None,
) -> None:  # fmt: skip
    """The custom op's body (:mod:`window_prefill.ops`): describe the call, look up its plan, launch it.
    A call without sequences or tokens launches nothing; ``max_len`` 0 still launches one query tile a
    sequence (the kernel writes the rows a too small ``max_len`` leaves out as 0). ``status``: an int32
    ``[1]`` tensor the kernel ORs the bits of :mod:`prefill_runtime.status` into on malformed metadata,
    or None. ``out_scale``: with an fp8 ``out``, its quantisation scale (a float ``[1]`` tensor), else
    None."""
    batch = starts.shape[0] - 1 if lens is None else lens.shape[0]
    if batch <= 0 or q.shape[0] == 0:
        return
    if q.dtype == torch.bfloat16 and interpreted():
        # the interpreter's tl.dot multiplies bf16 bit patterns as integers: compute in fp32, write bf16
        wide = torch.empty(out.shape, dtype=torch.float32)
        forward(q.float(), k.float(), v.float(), wide, starts, lens, max_len, causal=causal,
                window_left=window_left, window_right=window_right, softmax_scale=softmax_scale, sinks=sinks,
                bias_key0=bias_key0, config=config, softcap=softcap, lse=lse, status=status,
                alibi_slopes=alibi_slopes)  # fmt: skip
        if out_scale is not None:  # the kernel's fp8 epilogue, on the float32 rows
            top = _FP8_MAX[out.dtype]
            wide = (wide * (1.0 / out_scale.float())).clamp_(-top, top)
        out.copy_(wide)
        return
    window_left = -1 if window_left >= _UNBOUNDED_WINDOW else window_left
    window_right = -1 if window_right >= _UNBOUNDED_WINDOW else window_right
    p, kw = _planned(_fields(q, k, v, lens, causal, window_left, window_right, softmax_scale, sinks,
                             bias_key0, softcap, lse is not None, config, alibi_slopes,
                             out.dtype))  # fmt: skip
    _run(p, kw, q, k, v, out, starts, lens, max_len, batch, window_left, window_right, softmax_scale, sinks,
         softcap, lse, status, alibi_slopes, out_scale)  # fmt: skip


@dataclasses.dataclass
class Prepared:
    """A call signature's launch, decided by its first call (:func:`prepare`; the signature table is
    :data:`window_prefill.api.SEEN`): the plan and its keyword arguments, the windows, scale and cap as
    :func:`forward` takes them, the key of the plan's compiled variant and, once the variant is
    launched directly, the frame its later calls fill (with the launcher it came from)."""

    plan: LaunchPlan
    kw: dict
    window_left: int
    window_right: int
    softmax_scale: float
    softcap: float
    key: tuple
    frame: tuple | None = None
    frame_sections: tuple | None = None  # (a persistent Gluon plan's variant with head sections)


def prepare(q, k, v, out, starts, lens, max_len, *, causal, window_left, window_right, softmax_scale, sinks,
            bias_key0, config, softcap, lse, status=None, alibi_slopes=None,
            out_scale=None) -> Prepared | None:  # fmt: skip
    """What the later calls of a call's signature repeat (the call, :func:`forward`'s arguments, ran);
    None where they cannot skip :func:`forward` (bf16 under the interpreter, a Gluon plan whose kernel
    failed)."""
    if q.dtype == torch.bfloat16 and interpreted():
        return None
    window_left = -1 if window_left >= _UNBOUNDED_WINDOW else window_left
    window_right = -1 if window_right >= _UNBOUNDED_WINDOW else window_right
    p, kw = _planned(_fields(q, k, v, lens, causal, window_left, window_right, softmax_scale, sinks,
                             bias_key0, softcap, lse is not None, config, alibi_slopes,
                             out.dtype))  # fmt: skip
    if p.kernel == "gluon" and not _gluon_ok:
        return None
    key = _key(p, q, k, v, out, sinks, starts, lens, lse, status, alibi_slopes, out_scale)
    return Prepared(p, kw, window_left, window_right, softmax_scale, softcap, key)


def still_planned(prep: Prepared) -> bool:
    """Whether ``prep``'s plan is still the one :func:`forward` would choose: not a Gluon plan once the
    Gluon kernel failed in this process (its calls then plan the Triton kernel afresh)."""
    return prep.plan.kernel != "gluon" or _gluon_ok


def repeat(
    prep: Prepared, q, k, v, o, starts, lens, max_len: int, batch: int, sinks, lse, status=None,
    alibi_slopes=None, out_scale=None,
) -> bool:  # fmt: skip
    """A call of ``prep``'s signature (checked for what the signature leaves open): through the frame of
    its compiled variant where one is kept (the grid, the stream and the per-call arguments written into
    it: the kernel's only host work; True), else as :func:`forward` runs it (False)."""
    if batch <= 0 or q.shape[0] == 0:
        return False
    if not _primed and q.is_cuda:
        _prime_triton()
    p = prep.plan
    gluon = p.kernel == "gluon"
    fast = _GLUON if gluon else _TRITON
    real = fast is not None and (_gluon_fwd_kernel if gluon else _fwd_kernel) is fast.jit_fn  # (recorders)
    heads = q.shape[1]
    persistent = gluon and prep.kw.get("PERSISTENT", False)
    section = _launch_section(persistent, q, k)
    sections = section < heads  # (the launch's K/V past the L2 budget: the variant with head sections)
    cached = prep.frame_sections if sections else prep.frame
    if real and not fast.verify and (cached is None or cached[0] is not fast):
        key = _sections_key(prep.key, sections)
        frame = fast.frame(
            _frame_key(key, prep.window_left, prep.window_right, prep.softmax_scale, prep.softcap)
        )
        cached = (fast, frame) if frame is not None else None
        if sections:
            prep.frame_sections = cached
        else:
            prep.frame = cached
    index = q.get_device()
    if not real or cached is None or fast.verify or not fast.direct_now() or (
        index != torch._C._cuda_getDevice()  # (a frame exists only after a CUDA launch: CUDA is initialised)
    ):  # fmt: skip
        _run(p, prep.kw, q, k, v, o, starts, lens, max_len, batch, prep.window_left, prep.window_right,
             prep.softmax_scale, sinks, prep.softcap, lse, status, alibi_slopes, out_scale)  # fmt: skip
        return False
    lens_ = lens if lens is not None else starts
    tail = (starts.data_ptr(), lens_.data_ptr(), None if lse is None else lse.data_ptr(),
            None if lse is None else lse.stride(0), None if status is None else status.data_ptr(),
            max_len)  # fmt: skip
    qp, kp, vp = q.data_ptr(), k.data_ptr(), v.data_ptr()
    stream = torch._C._cuda_getCurrentRawStream(index)
    alibi = None if alibi_slopes is None else alibi_slopes.data_ptr()
    if gluon:
        counter = tile_counter(index, stream) if persistent else None
        bases = (qp, kp, vp)
        scale = None if out_scale is None else out_scale.data_ptr()
        s = None if sinks is None else sinks.data_ptr()
        plain = (o.data_ptr(), *tail, s, batch, alibi, scale, section, counter)
    else:
        s = sinks if sinks is not None else q
        scale = None if out_scale is None else out_scale.data_ptr()
        bases, plain = (kp, vp), (qp, kp, vp, o.data_ptr(), s.data_ptr(), *tail, alibi, scale, q.shape[0])
    grid = _gluon_grid(p, max_len, heads, batch, index) if gluon else _one_tile_grid(p, max_len, heads, batch)
    cached[1](*grid, stream, q.shape[0], bases, plain)
    return True


@functools.lru_cache(maxsize=256)
def _planned(fields: tuple) -> tuple[LaunchPlan, dict]:
    """``plan(Problem(*fields))`` and its constexprs and launch options as one keyword dict (read
    only), cached per problem."""
    p = plan(Problem(*fields))
    return p, _kwargs(p)


def _kwargs(p: LaunchPlan) -> dict:
    return {**p.consts(), **p.opts()}


def run(
    p: LaunchPlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    starts: torch.Tensor, lens: torch.Tensor | None, max_len: int, batch: int, *, window_left: int,
    window_right: int, softmax_scale: float, sinks: torch.Tensor | None, softcap: float,
    lse: torch.Tensor | None, status: torch.Tensor | None = None, alibi_slopes: torch.Tensor | None = None,
    out_scale: torch.Tensor | None = None,
) -> None:  # fmt: skip
    """Launch the kernel ``p`` names on the grid ``(cdiv(max_len, p.block_m), num_heads, batch)``
    (windows as :func:`describe` takes them). A Gluon plan whose launch fails runs its Triton
    fallback (and the Gluon kernel is not offered again in this process). Benchmarks and tests run
    a changed plan through it (:meth:`~prefill_runtime.LaunchPlan.replace`)."""
    _run(p, _kwargs(p), q, k, v, out, starts, lens, max_len, batch, window_left, window_right, softmax_scale,
         sinks, softcap, lse, status, alibi_slopes, out_scale)  # fmt: skip


def _run(
    p, kw, q, k, v, out, starts, lens, max_len, batch, window_left, window_right, softmax_scale, sinks,
    softcap, lse, status=None, alibi_slopes=None, out_scale=None,
) -> None:  # fmt: skip
    if not _primed and q.is_cuda:
        _prime_triton()
    if p.kernel == "gluon":
        if _launch_gluon(p, kw, q, k, v, out, starts, lens, max_len, batch, window_left, window_right,
                         softmax_scale, sinks, softcap, lse, status, alibi_slopes, out_scale):  # fmt: skip
            return
        p = p.get("fallback")
        kw = _kwargs(p)
    _launch_triton(p, kw, q, k, v, out, starts, lens, max_len, batch, window_left, window_right,
                   softmax_scale, sinks, softcap, lse, status, alibi_slopes, out_scale)  # fmt: skip


def _launch_triton(
    p, kw, q, k, v, o, starts, lens, max_len, batch, window_left, window_right, softmax_scale, sinks, softcap,
    lse, status, alibi_slopes, out_scale,
) -> None:  # fmt: skip
    k_desc = v_desc = None
    direct = _fwd_kernel is _TRITON.jit_fn  # (else a test's recorder stands in for the kernel)
    key = _key(p, q, k, v, o, sinks, starts, lens, lse, status, alibi_slopes, out_scale) if direct else None
    warm = direct and not _TRITON.verify and _TRITON.has(key)
    if kw["TMA_KV"]:  # interior K/V blocks: descriptors over [tokens, kv_heads * head_dim]
        d, bn = kw["HEAD_DIM"], kw["BLOCK_N"]
        if warm:  # compiled: the descriptors' per-call part only
            k_desc = Descriptor(k, [k.shape[0], k.shape[1] * d], [k.stride(0), 1])
            v_desc = Descriptor(v, [v.shape[0], v.shape[1] * d], [v.stride(0), 1])
        else:
            k_desc = TensorDescriptor(k, [k.shape[0], k.shape[1] * d], [k.stride(0), 1], [bn, d])
            v_desc = TensorDescriptor(v, [v.shape[0], v.shape[1] * d], [v.stride(0), 1], [bn, d])
    qs, ks, vs, os_ = q.stride(), k.stride(), v.stride(), o.stride()
    capped = softcap > 0
    grid = _one_tile_grid(p, max_len, q.shape[1], batch)
    args = (
        q, k, v, o,
        sinks if sinks is not None else q,  # unread without HAS_SINKS
        starts,
        lens if lens is not None else starts,  # unread with LENS_FROM_STARTS
        (softcap if capped else softmax_scale) * _LOG2E, max(window_left, 0), max(window_right, 0),
        q.shape[1] // k.shape[1], qs[0], qs[1], ks[0], ks[1], vs[0], vs[1], os_[0], os_[1], k_desc, v_desc,
        softmax_scale / softcap if capped else 1.0,
        lse,  # None without return_lse: a constexpr, so the kernel compiles without it
        lse.stride(0) if lse is not None else None,
        q.shape[0],
        max_len,
        status,  # None without status=: a constexpr, as lse
        alibi_slopes,  # None without ALiBi: a constexpr, as lse
        out_scale,  # None but with an fp8 o: a constexpr, as lse
    )  # fmt: skip
    if not direct:
        _fwd_kernel[grid](*args, **kw)
        return
    _TRITON.launch(key, grid, args, kw, {}, q.device)
    frame_key = _frame_key(key, window_left, window_right, softmax_scale, softcap) if warm else None
    if warm and _TRITON.frame(frame_key) is None:  # the key's later calls: through a frame (repeat())
        _TRITON.make_frame(key, frame_key, args, kw, {"K_desc": 0, "V_desc": 0} if kw["TMA_KV"] else {},
                           _TRITON_PER_CALL)  # fmt: skip


def _frame_key(
    key: tuple, window_left: int, window_right: int, softmax_scale: float, softcap: float
) -> tuple:
    """A frame's key: the variant's and the values a frame holds that the variant's key leaves open (the
    windows, the logit scale and the cap, which neither kernel specialises on)."""
    return (key, window_left, window_right, softmax_scale, softcap)


# the Triton kernel's per-call plain arguments in a frame, in the order repeat() passes them
_TRITON_PER_CALL = (
    "Q",
    "K",
    "V",
    "O",
    "Sinks",
    "Starts",
    "Lens",
    "Lse",
    "stride_lse_h",
    "Status",
    "max_len",
    "Alibi",
    "OutScale",
    "n_tokens",
)
# the Gluon kernel's: its per-call descriptors are Q_desc, K_desc, V_desc (rows of q, k, v)
_GLUON_PER_CALL = (
    "O", "Starts", "Lens", "Lse", "stride_lse_h", "Status", "max_len", "Sinks", "n_seqs", "Slopes",
    "OutScale", "head_section", "TileCounter",
)  # fmt: skip


def _key(p, q, k, v, o, sinks, starts, lens, lse, status=None, alibi_slopes=None, out_scale=None) -> tuple:
    """What Triton specialises a launch of plan ``p`` on beyond the plan: the exact strides of q/k/v/o
    and the group size (a superset of "1 or a multiple of 16"), the dtypes and 16-byte alignment of
    every tensor argument (the windows and the LSE stride are ``do_not_specialize``; descriptors
    specialise on the dtype and block shape, both fixed by ``p`` and q's dtype), and the device (a
    variant is loaded on one)."""
    tensors = (q, k, v, o, sinks, starts, lens, lse, status, alibi_slopes, out_scale)
    return (
        p, q.stride(), k.stride(), v.stride(), o.stride(), q.shape[1] // k.shape[1],
        tuple(None if t is None else (t.dtype, t.data_ptr() % 16 == 0) for t in tensors), q.get_device(),
    )  # fmt: skip


def _one_tile_grid(p: LaunchPlan, max_len: int, heads: int, batch: int) -> tuple[int, int, int]:
    """One program a query tile: ``(cdiv(max_len, block_m), heads, batch)``, at least one query tile (plain
    ints: ``triton.cdiv`` costs ~2 us)."""
    return max(-(-max_len // p.block_m), 1), heads, batch


#: The persistent Gluon form's L2 budget for K/V: its tile order takes the query heads in sections whose
#: KV heads' keys and values (over all the launch's tokens, 16 bits each) fit this many bytes, so a
#: section's tiles find them in the L2 while Q and O stream through it.
L2_KV_BYTES = 16 << 20


@functools.lru_cache(maxsize=256)
def head_section(n_tokens: int, heads: int, kv_heads: int, head_dim: int) -> int:
    """The query heads a section of the persistent order takes (:data:`L2_KV_BYTES`): the KV heads of the
    largest power-of-two count that divides ``kv_heads`` and whose K/V fit the budget (at least one), times
    the group size. The order never changes a tile's arithmetic: any section gives the same bits. Cached: a
    warm call pays a dictionary lookup (~0.1 us), not the arithmetic."""
    fit = L2_KV_BYTES // max(n_tokens * 4 * head_dim, 1)  # KV heads whose K/V fit the budget
    n_kv = min(kv_heads & -kv_heads, 1 << (fit.bit_length() - 1)) if fit else 1
    return n_kv * (heads // kv_heads)


def _launch_section(persistent: bool, q: torch.Tensor, k: torch.Tensor) -> int:
    """A Gluon launch's ``head_section`` argument: :func:`head_section` of its q/k for a persistent plan,
    else every query head (one section: the kernel then reads no section)."""
    heads = q.shape[1]
    return head_section(q.shape[0], heads, k.shape[1], q.shape[2]) if persistent else heads


def _sections_key(key: tuple, sections: bool) -> tuple:
    """The Gluon variant's key: :func:`_key`'s, marked where the launch takes head sections (``SECTIONS``:
    a persistent launch whose K/V exceed :data:`L2_KV_BYTES`, a variant of its own, so a launch whose K/V
    fit runs the order without sections' arithmetic)."""
    return (*key, "sections") if sections else key


def _gluon_grid(p: LaunchPlan, max_len: int, heads: int, batch: int, index: int) -> tuple[int, int, int]:
    """The Gluon launch's grid: ``(cdiv(max_len, block_m), heads, batch)`` (at least one query tile), or for
    a persistent plan ``(programs, 1, 1)``: one program a multiprocessor of device ``index``, never more
    than the tiles of the one-tile grid."""
    grid = _one_tile_grid(p, max_len, heads, batch)
    if p.constexpr_map.get("PERSISTENT", False):
        return persistent_grid(grid[0] * heads * batch, multiprocessors(index))
    return grid


def _launch_gluon(
    p, kw, q, k, v, o, starts, lens, max_len, batch, window_left, window_right, softmax_scale, sinks, softcap,
    lse, status, alibi_slopes, out_scale,
) -> bool:  # fmt: skip
    """Launch the Gluon kernel; False when this Triton's Gluon could not (``_gluon_ok`` then clears)."""
    global _gluon_ok
    d, bn = kw["HEAD_DIM"], kw["BLOCK_N"]
    direct = _GLUON is not None and _gluon_fwd_kernel is _GLUON.jit_fn  # (else a test's recorder)
    persistent = kw.get("PERSISTENT", False)
    section = _launch_section(persistent, q, k)
    sections = section < q.shape[1]
    key = None
    if direct:
        key = _sections_key(
            _key(p, q, k, v, o, sinks, starts, lens, lse, status, alibi_slopes, out_scale), sections
        )
    if direct and not _GLUON.verify and _GLUON.has(key):  # compiled: the descriptors' per-call part only
        descs = [Descriptor(t, [t.shape[0], t.shape[1] * d], [t.stride(0), 1]) for t in (q, k, v)]
    else:
        descs = [
            gluon_descriptor(t, [t.shape[0], t.shape[1] * d], t.stride(0), rows, d)
            for t, rows in ((q, p.block_m // 2), (k, bn), (v, bn))
        ]
    grid = _gluon_grid(p, max_len, q.shape[1], batch, q.get_device())
    capped = softcap > 0  # (the kernel's Sinks and tanh_scale: None, a constexpr, where off)
    logit = (softcap if capped else softmax_scale) * _LOG2E  # the multiplier of the (capped) score
    args = (
        *descs, o, starts, lens if lens is not None else starts, logit, max(window_left, 0),
        max(window_right, 0), q.shape[1] // k.shape[1], o.stride(0), o.stride(1), lse,
        lse.stride(0) if lse is not None else None, max_len, status, sinks,
        softmax_scale / softcap if capped else None, batch, alibi_slopes, out_scale, section,
    )  # fmt: skip
    kw = {**kw, "SECTIONS": sections, "TileCounter": tile_counter(q.get_device()) if persistent else None}
    if not direct:
        launch = lambda: _gluon_fwd_kernel[grid](*args, **kw)  # noqa: E731
    elif not _GLUON.verify and _GLUON.has(key):  # then its later calls through a frame (repeat())

        def launch() -> None:
            _GLUON.launch(key, grid, args, kw, {}, q.device)
            frame_key = _frame_key(key, window_left, window_right, softmax_scale, softcap)
            if _GLUON.frame(frame_key) is None:
                _GLUON.make_frame(
                    key, frame_key, args, kw, {"Q_desc": 0, "K_desc": 0, "V_desc": 0}, _GLUON_PER_CALL
                )
    else:
        launch = lambda: _GLUON.launch(key, grid, args, kw, {}, q.device)  # noqa: E731
    if gluon_try_launch(launch, "window_prefill"):
        return True
    _gluon_ok = False
    return False
