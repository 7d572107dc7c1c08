"""The launch of a checked prefix-prefill call: its :class:`~prefix_prefill.plan.Problem`, the cached
plan, and the kernel the plan names (the Triton kernel here, the Gluon kernels in
:mod:`prefix_prefill.gluon_launch`).

:func:`forward` is what both public functions and the custom op (:mod:`prefix_prefill.ops`) call on
arguments the public functions checked; it never synchronises with the host and launches one kernel.
It can hand back a :class:`Prepared`: everything about the call that a later call with the same
signature (the same tensors' strides, dtypes, devices and alignment, the same options; any lengths)
repeats, so that :func:`run_prepared` launches it without building the problem or looking the plan
up again. Tests and sweeps pass ``plan_override=`` (an overridden :class:`prefill_runtime.LaunchPlan`)
or ``config=`` (other Triton tiles).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from paged_kv_offsets import CacheView, describe_kv_cache
from prefill_runtime import LaunchPlan, hook_compiles, prime_triton, ptxas_launch_options, softcap_form
from prefill_runtime.compiled_launch import CompiledLaunches
from prefix_prefill import autotune, gluon_launch
from prefix_prefill.checks import FP8_DTYPES
from prefix_prefill.configs import MAX_GRID_YZ, config_key, detect_arch, get_config
from prefix_prefill.kernel import LOG2E, _fwd_kernel
from prefix_prefill.plan import Problem, make_problem, pack_gqa, plan, triton_plan

# Triton's one-time process setup and this package's compile hooks ran (install_hooks)
_PRIMED = False
# the Triton kernel's compiled variants, launched directly once compiled
_TRITON = CompiledLaunches(_fwd_kernel)


def install_hooks() -> None:
    """Triton's one-time process setup side by side (:func:`prefill_runtime.prime_triton`) and the compile
    hooks of this package's kernels (:func:`prefill_runtime.hook_compiles`: the launcher built beside a
    cold compile; for the Gluon kernels LLVM at O0 for the quick form and the chunk-major K ring's
    descriptor fix), before the first GPU launch."""
    global _PRIMED
    _PRIMED = True
    prime_triton()
    hook_compiles(_fwd_kernel)
    gluon_launch.install_hooks()


def gluon_allowed() -> bool:
    """Whether the Gluon kernels may be planned in this process (see :mod:`prefix_prefill.gluon_launch`;
    the plan checks the architecture); ``PREFIX_PREFILL_GLUON=0`` keeps the Triton kernel."""
    return os.environ.get("PREFIX_PREFILL_GLUON", "1") != "0" and gluon_launch.available()


@dataclass
class Prepared:
    """A call signature's launch, decided once (see the module docstring): the problem, the plan, and for
    the Triton kernel the constexprs, launch options, the integer arguments the signature fixes and the
    key of its compiled variant (for a Gluon kernel the key's id,
    :func:`prefix_prefill.gluon_launch.launch_key`). ``scale``: the logit scale, ``softcap``: the cap
    (0: none), ``left``/``right``: the windows (-1: none)."""

    problem: Problem
    plan: LaunchPlan
    kc: CacheView
    vc: CacheView
    scale: float
    softcap: float
    consts: dict | None = None
    opts: dict | None = None
    ints: tuple = ()
    key: tuple | int | None = None
    left: int = -1
    right: int = -1
    fixed: gluon_launch.Options = gluon_launch.PLAIN
    packed: tuple | None = None

    def packed_form(self) -> tuple[dict, tuple | None]:
        """The Triton launch's constexprs and compiled-variant key with ``PACK_GQA`` (made once)."""
        if self.packed is None:
            key = None if self.key is None else (*self.key, "pack_gqa")
            self.packed = ({**self.consts, "PACK_GQA": True}, key)
        return self.packed

    def __post_init__(self) -> None:
        self.fixed = gluon_launch.Options(self.softcap, self.left, right=self.right)
        # the plan reads the fp8 cache's scales (a Gluon plan with CACHE_FP8)
        self.fp8 = bool(self.plan.constexpr_map.get("CACHE_FP8", False))

    def options(self, sinks, alibi, out_scale=None, k_scale=None, v_scale=None) -> gluon_launch.Options:
        """A Gluon launch's options for this signature's call with these sinks, ALiBi slopes, fp8 output
        scale and, where the plan converts an fp8 cache, its scales (without any, one object made once
        per signature: a warm call builds nothing)."""
        if not self.fp8:
            if sinks is None and alibi is None and out_scale is None:
                return self.fixed
            return gluon_launch.Options(self.softcap, self.left, sinks, alibi, self.right, out_scale)
        return gluon_launch.Options(
            self.softcap, self.left, sinks, alibi, self.right, out_scale, k_scale, v_scale
        )


def forward(
    q: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    o: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kc: CacheView,
    vc: CacheView,
    block_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    max_query_len: int,
    *,
    causal: bool = True,
    window: tuple[int, int] = (-1, -1),
    softmax_scale: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    out_scale: torch.Tensor | None = None,
    skip_decode: bool = False,
    softcap: float = 0.0,
    lse: torch.Tensor | None = None,
    status: torch.Tensor | None = None,
    plan_override: LaunchPlan | None = None,
    config=None,
    prepared: list | None = None,
) -> None:
    """Launch the planned kernel on already-checked arguments (see :func:`prefix_prefill.prefix_prefill`
    for the tensors). ``kc``/``vc`` describe the caches (``paged_kv_offsets.describe_kv_cache``); scales
    are 1-element device tensors (fp8 caches: the defaults of 1 made by the caller; ``out_scale``: an fp8
    ``o``'s, which gets ``clamp(out / out_scale)``, required with one); ``softcap`` > 0:
    logits ``softcap * tanh(softmax_scale * q.k / softcap)``; ``lse``: a float32 ``[H, total_q]`` buffer
    (unit token stride) for each row's softmax log-sum-exp (rows skipped by ``skip_decode`` get
    ``-inf``), or None; ``status``: an int32 ``[1]`` tensor the kernel ORs the bits of
    :mod:`prefill_runtime.status` into when it meets malformed metadata, or None. ``plan_override``: run
    this plan instead of :func:`prefix_prefill.plan.plan`'s; ``config``: the Triton kernel with these
    tiles; ``prepared``: a list that receives the call's :class:`Prepared` when later calls of its
    signature can repeat it. A call without sequences or query rows launches nothing; ``max_query_len``
    0 still launches one query tile a sequence (rows a too small ``max_query_len`` leaves out are
    written as 0 and reported)."""
    if o.dtype in FP8_DTYPES and out_scale is None:
        raise ValueError(f"an fp8 output ({o.dtype}) needs its scale: pass out_scale (fp8_out_scale)")
    total_q, _, head_size = q.shape
    if seq_lens.shape[0] == 0 or total_q == 0:
        return
    if q.dtype == torch.bfloat16 and detect_arch(q.device) == "interpreter":
        _bf16_in_fp32(locals())  # the interpreter's tl.dot cannot multiply bf16: compute in fp32
        return
    # The kernels read these 1-D tensors as ``ptr + index``: strided views must be made contiguous
    # (a no-op, without a copy, for the usual contiguous tensors; a call signature keeps its strides).
    cu_seqlens_q, seq_lens = cu_seqlens_q.contiguous(), seq_lens.contiguous()
    sinks = sinks.contiguous() if sinks is not None else None
    alibi_slopes = alibi_slopes.contiguous() if alibi_slopes is not None else None
    left, right = int(window[0]), int(window[1])
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(head_size)
    if not _PRIMED and q.is_cuda:
        install_hooks()
    problem = _problem(
        q,
        k,
        v,
        o,
        k_cache,
        v_cache,
        kc,
        vc,
        block_table,
        causal,
        left,
        right,
        scale,
        alibi_slopes,
        sinks,
        skip_decode,
        softcap,
        lse,
        gluon=config is None,
    )
    if plan_override is not None:
        chosen = plan_override
    elif config is not None:
        chosen = triton_plan(problem, config, "tiles given")
    else:
        chosen = plan(problem)
    prep = Prepared(problem, chosen, kc, vc, scale, softcap, left=left, right=right)
    repeatable = plan_override is None and config is None
    if chosen.kernel != "triton":
        opts = prep.options(sinks, alibi_slopes, out_scale, k_scale, v_scale)
        prep.key = gluon_launch.launch_key(
            chosen, problem, block_table, cu_seqlens_q, seq_lens, lse, status, opts
        )
        if gluon_launch.launch(
            chosen,
            problem,
            q,
            k,
            v,
            o,
            k_cache,
            v_cache,
            kc,
            vc,
            block_table,
            cu_seqlens_q,
            seq_lens,
            max_query_len,
            scale,
            lse,
            prep.key,
            status,
            opts,
        ):
            if repeatable and prepared is not None:
                prepared.append(prep)
            return
        chosen = prep.plan = triton_plan(problem, reason="the Gluon kernel failed to build or launch")
        prep.key = None
    if repeatable and autotune.autotune_enabled() and problem.arch != "interpreter":
        args = (q, k, v, o, k_cache, v_cache, kc, vc, block_table, cu_seqlens_q, seq_lens, max_query_len)
        opts = dict(
            causal=causal,
            window=window,
            softmax_scale=softmax_scale,
            alibi_slopes=alibi_slopes,
            sinks=sinks,
            k_scale=k_scale,
            v_scale=v_scale,
            out_scale=out_scale,
            skip_decode=skip_decode,
            softcap=softcap,
            lse=lse,
            status=status,
        )
        chosen = prep.plan = _tuned(problem, args, opts)
        repeatable = False
    _triton_prepare(
        prep,
        left,
        right,
        block_table,
        cu_seqlens_q,
        seq_lens,
        sinks,
        alibi_slopes,
        k_scale,
        v_scale,
        out_scale,
        lse,
        status,
        q,
    )
    _launch_triton(
        prep,
        q,
        k,
        v,
        o,
        k_cache,
        v_cache,
        block_table,
        cu_seqlens_q,
        seq_lens,
        max_query_len,
        alibi_slopes,
        sinks,
        k_scale,
        v_scale,
        out_scale,
        lse,
        status,
    )
    if repeatable and prepared is not None and prep.key is not None:
        prepared.append(prep)


def run_prepared(
    prep: Prepared,
    q,
    k,
    v,
    o,
    k_cache,
    v_cache,
    block_table,
    cu_seqlens_q,
    seq_lens,
    max_query_len,
    alibi,
    sinks,
    k_scale,
    v_scale,
    out_scale,
    lse,
    status=None,
) -> None:
    """Launch ``prep`` (a call of the same signature as the one that made it) on these tensors."""
    if seq_lens.shape[0] == 0 or q.shape[0] == 0:
        return
    if prep.plan.kernel == "triton":
        _launch_triton(
            prep,
            q,
            k,
            v,
            o,
            k_cache,
            v_cache,
            block_table,
            cu_seqlens_q,
            seq_lens,
            max_query_len,
            alibi,
            sinks,
            k_scale,
            v_scale,
            out_scale,
            lse,
            status,
        )
        return
    if not gluon_launch.launch(
        prep.plan,
        prep.problem,
        q,
        k,
        v,
        o,
        k_cache,
        v_cache,
        prep.kc,
        prep.vc,
        block_table,
        cu_seqlens_q,
        seq_lens,
        max_query_len,
        prep.scale,
        lse,
        prep.key,
        status,
        prep.options(sinks, alibi, out_scale, k_scale, v_scale),
    ):
        raise RuntimeError("prefix_prefill: the Gluon kernel failed after it had run (see the warning)")


def _problem(
    q,
    k,
    v,
    o,
    k_cache,
    v_cache,
    kc,
    vc,
    block_table,
    causal,
    left,
    right,
    scale,
    alibi,
    sinks,
    skip_decode,
    softcap,
    lse,
    gluon: bool = True,
) -> Problem:
    arch = detect_arch(q.device)
    return make_problem(
        q,
        k,
        v,
        o,
        k_cache,
        v_cache,
        kc,
        vc,
        block_table,
        arch=arch,
        gluon=gluon and arch == "sm90" and gluon_allowed(),  # (asked only where a Gluon kernel may run)
        causal=causal,
        left=left,
        right=right,
        scale=scale,
        alibi=alibi is not None,
        sinks=sinks is not None,
        softcap_form=softcap_form(softcap, q),
        skip_decode=skip_decode,
        lse=lse is not None,
    )


def plan_of(
    q,
    k,
    v,
    o,
    k_cache,
    v_cache,
    kc,
    vc,
    block_table,
    cu_seqlens_q,
    seq_lens,
    max_query_len,
    causal,
    left,
    right,
    scale,
    alibi,
    sinks,
    ks,
    vs,
    os_,
    skip_decode,
    softcap,
    lse,
) -> LaunchPlan:
    """The plan :func:`forward` runs for these (checked) arguments, without launching."""
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[2])
    problem = _problem(
        q,
        k,
        v,
        o,
        k_cache,
        v_cache,
        kc,
        vc,
        block_table,
        causal,
        left,
        right,
        scale,
        alibi,
        sinks,
        skip_decode,
        softcap,
        lse,
    )
    return plan(problem)


def _bf16_in_fp32(call: dict) -> None:
    """:func:`forward` of a bf16 call under the Triton interpreter, computed in fp32 (the interpreter's
    ``tl.dot`` multiplies bf16 bit patterns as integers) and written back in bf16."""
    up = {
        n: (
            call[n].float()
            if isinstance(call[n], torch.Tensor) and call[n].dtype == torch.bfloat16
            else call[n]
        )
        for n in ("q", "k", "v", "o", "k_cache", "v_cache")
    }
    kc, vc = describe_kv_cache(up["k_cache"], up["v_cache"], call["kc"].layout)
    forward(
        up["q"],
        up["k"],
        up["v"],
        up["o"],
        up["k_cache"],
        up["v_cache"],
        kc,
        vc,
        call["block_table"],
        call["cu_seqlens_q"],
        call["seq_lens"],
        call["max_query_len"],
        causal=call["causal"],
        window=call["window"],
        softmax_scale=call["softmax_scale"],
        alibi_slopes=call["alibi_slopes"],
        sinks=call["sinks"],
        k_scale=call["k_scale"],
        v_scale=call["v_scale"],
        out_scale=call["out_scale"],
        skip_decode=call["skip_decode"],
        softcap=call["softcap"],
        lse=call["lse"],
        status=call["status"],
        plan_override=call["plan_override"],
        config=call["config"],
    )
    if up["o"] is not call["o"]:
        call["o"].copy_(up["o"])


def _tuned(problem: Problem, args: tuple, opts: dict) -> LaunchPlan:
    """``PREFIX_PREFILL_AUTOTUNE=1``: the fastest of a few tile candidates for this table key (timed on
    this call's inputs once, then stored; :mod:`prefix_prefill.autotune`)."""
    q, kc = args[0], args[6]
    head = q.shape[2]
    key = config_key(problem.arch, head, q.dtype, kc.page_size)

    def run(cfg) -> None:
        forward(*args, **opts, config=cfg)

    default = get_config(problem.arch, head, q.dtype, kc.page_size)
    cands = autotune.candidates(problem.arch, head, q.element_size())
    return triton_plan(problem, autotune.tuned_config(q.device, key, run, default, cands), "autotuned")


def _triton_prepare(
    prep: Prepared,
    left,
    right,
    block_table,
    cu,
    sl,
    sinks,
    alibi,
    k_scale,
    v_scale,
    out_scale,
    lse,
    status,
    q,
) -> None:
    """The Triton launch's constexprs, options, fixed integer arguments and compiled-variant key."""
    problem, kc, vc = prep.problem, prep.kc, prep.vc
    prep.consts = prep.plan.consts()
    opts = prep.plan.opts()
    level = opts.pop("register_usage_level", 0)
    opts.update(ptxas_launch_options(level, q.device))
    prep.opts = opts
    ks, vs = (k_scale, v_scale) if prep.consts["CACHE_FP8"] else (None, None)
    os_ = out_scale if prep.consts["OUT_FP8"] else None
    ksd, vsd = problem.k_strides or (0, 0, 0), problem.v_strides or (0, 0, 0)
    prep.ints = (
        (
            prep.scale * LOG2E,
            prep.softcap * LOG2E if prep.softcap > 0 else 1.0,
            left,
            right,
        ),
        (
            problem.q_strides[0],
            problem.q_strides[1],
            ksd[0],
            ksd[1],
            vsd[0],
            vsd[1],
            problem.o_strides[0],
            problem.o_strides[1],
        ),
        (block_table.stride(1), *kc.kernel_args(), *vc.kernel_args()[:4]),
    )
    if problem.arch == "interpreter":
        return
    # the compiled variant is a function of the problem (q/k/v/o and cache strides, dtypes, alignment), the
    # plan, and the dtype and alignment of the other tensors (every other integer is do_not_specialize);
    # it is loaded on one device (its index: another GPU of the process has its own)
    others = (block_table, cu, sl, sinks, alibi, ks, vs, os_, lse, status)
    prep.key = (
        problem,
        prep.plan,
        tuple(None if t is None else (t.dtype, t.data_ptr() % 16 == 0) for t in others),
        q.get_device(),
    )


def _launch_triton(
    prep: Prepared,
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
    k_scale,
    v_scale,
    out_scale,
    lse,
    status,
) -> None:
    """:func:`prefix_prefill.kernel._fwd_kernel` as ``prep`` says (at least one query tile a sequence), with
    a KV head's query heads packed into one tile's rows where :func:`prefix_prefill.plan.pack_gqa` says."""
    consts, key = prep.consts, prep.key
    group = consts["QUERIES_PER_KV"]
    if pack_gqa(prep.plan.block_m, group, max_query_len):
        consts, key = prep.packed_form()
        grid = (q.shape[1] // group, 1, sl.shape[0])
    else:
        grid = (q.shape[1], max(-(-max_query_len // prep.plan.block_m), 1), sl.shape[0])
    if grid[1] > MAX_GRID_YZ:
        raise ValueError(f"max query length {max_query_len} needs more than {MAX_GRID_YZ} query tiles")
    dummy = q  # never dereferenced: stands in for absent optional tensors
    if k is None:
        k = v = dummy
    if not consts["CACHE_FP8"]:
        k_scale = v_scale = dummy
    if not consts["OUT_FP8"]:
        out_scale = dummy
    scales, strides, cache_strides = prep.ints
    args = (
        q,
        k,
        v,
        o,
        k_cache,
        v_cache,
        block_table,
        cu,
        sl,
        dummy if sinks is None else sinks,
        dummy if alibi is None else alibi,
        k_scale,
        v_scale,
        out_scale,
        *scales,
        block_table.shape[1],
        prep.kc.page_size,
        *strides,
        block_table.stride(0),
        *cache_strides,
        lse,  # None without return_lse: a constexpr, so the kernel keeps its signature
        None if lse is None else lse.stride(0),
        prep.kc.num_blocks,
        q.shape[0],
        max_query_len,
        status,  # None without status=: a constexpr, as lse
    )
    if _fwd_kernel is not _TRITON.jit_fn or key is None:  # (tests' recorders; the interpreter)
        _fwd_kernel[grid](*args, **consts, **prep.opts)
        return
    _TRITON.launch(key, grid, args, consts, prep.opts, q.device)
