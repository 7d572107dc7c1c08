"""The launch of a checked prefix-prefill call: its :class:`~prefix_prefill.plan.Problem`, the cached
plan, and the kernel the plan names (the Triton kernel here, the Gluon kernels in
:mod:`prefix_prefill.gluon_launch`).

:func:`forward` is what both public functions and the custom op (:mod:`prefix_prefill.ops`) call on
arguments the public functions checked; it allocates nothing but the 1-element default fp8 scales,
never synchronises with the host and launches one kernel. Tests and sweeps pass ``plan=`` (an
overridden :class:`prefill_runtime.LaunchPlan`) or ``config=`` (other Triton tiles).
"""

from __future__ import annotations

import math
import os

import torch

from paged_kv_offsets import CacheView, describe_kv_cache
from prefill_runtime import LaunchPlan, hook_compiles, prime_triton, ptxas_launch_options, softcap_form
from prefix_prefill import autotune, gluon_launch
from prefix_prefill.configs import config_key, detect_arch
from prefix_prefill.kernel import LOG2E, _fwd_kernel
from prefix_prefill.plan import Problem, make_problem, plan, triton_plan

_FP8_DTYPES = tuple(
    getattr(torch, n)
    for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    if hasattr(torch, n)
)
_MAX_GRID_YZ = 65535
# Triton's one-time process setup and this package's compile hooks ran (install_hooks)
_PRIMED = False


def install_hooks() -> None:
    """Triton's one-time process setup side by side (:func:`prefill_runtime.prime_triton`) and the compile
    hooks of this package's kernels (:func:`prefill_runtime.hook_compiles`: the launcher built beside a
    cold compile; for the Gluon kernels LLVM at O0 for the quick form, the consumers' free waits and the
    chunk-major K ring's descriptor fix), before the first GPU launch."""
    global _PRIMED
    _PRIMED = True
    prime_triton()
    hook_compiles(_fwd_kernel)
    gluon_launch.install_hooks()


def gluon_allowed() -> bool:
    """Whether the Gluon kernels may be planned in this process (see :mod:`prefix_prefill.gluon_launch`;
    the plan checks the architecture); ``PREFIX_PREFILL_GLUON=0`` keeps the Triton kernel."""
    return os.environ.get("PREFIX_PREFILL_GLUON", "1") != "0" and gluon_launch.available()


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
    plan_override: LaunchPlan | None = None,
    config=None,
) -> None:
    """Launch the planned kernel on already-checked arguments (see :func:`prefix_prefill.prefix_prefill`
    for the tensors). ``kc``/``vc`` describe the caches (``paged_kv_offsets.describe_kv_cache``); scales
    are 1-element device tensors or None; ``softcap`` > 0: logits ``softcap * tanh(softmax_scale * q.k /
    softcap)``; ``lse``: a float32 ``[H, total_q]`` buffer (unit token stride) for each row's softmax
    log-sum-exp (rows skipped by ``skip_decode`` get ``-inf``), or None. ``plan_override``: run this
    plan instead of :func:`prefix_prefill.plan.plan`'s; ``config``: the Triton kernel with these tiles."""
    total_q, num_heads, head_size = q.shape
    batch = seq_lens.shape[0]
    if batch == 0 or total_q == 0 or max_query_len == 0:
        return
    if q.dtype == torch.bfloat16 and detect_arch(q.device) == "interpreter":
        _bf16_in_fp32(locals())  # the interpreter's tl.dot cannot multiply bf16: compute in fp32
        return
    # The kernels read these 1-D tensors as ``ptr + index``: strided views must be made contiguous
    # (a no-op, without a copy, for the usual contiguous tensors).
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
    arch = problem.arch
    if plan_override is not None:
        chosen = plan_override
    elif config is not None:
        chosen = triton_plan(problem, config, "tiles given")
    else:
        chosen = plan(problem)
    if chosen.kernel != "triton":
        ran = gluon_launch.launch(
            chosen,
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
        )
        if ran:
            return
        chosen = triton_plan(problem, reason="the Gluon kernel failed to build or launch")
    if config is None and plan_override is None and autotune.autotune_enabled() and arch != "interpreter":
        chosen = _tuned(
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
            causal,
            window,
            softmax_scale,
            alibi_slopes,
            sinks,
            k_scale,
            v_scale,
            out_scale,
            skip_decode,
            softcap,
            lse,
        )
    _launch_triton(
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
        left,
        right,
        scale,
        alibi_slopes,
        sinks,
        k_scale,
        v_scale,
        out_scale,
        softcap,
        lse,
    )


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
        arch=detect_arch(q.device),
        gluon=gluon and gluon_allowed(),
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
        plan_override=call["plan_override"],
        config=call["config"],
    )
    if up["o"] is not call["o"]:
        call["o"].copy_(up["o"])


def _tuned(
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
    cu,
    sl,
    max_query_len,
    causal,
    window,
    softmax_scale,
    alibi,
    sinks,
    k_scale,
    v_scale,
    out_scale,
    skip_decode,
    softcap,
    lse,
):
    """``PREFIX_PREFILL_AUTOTUNE=1``: the fastest of a few tile candidates for this table key (timed on
    this call's inputs once, then stored; :mod:`prefix_prefill.autotune`)."""
    from prefix_prefill.configs import get_config

    head = q.shape[2]
    key = config_key(problem.arch, head, q.dtype, kc.page_size)

    def run(cfg) -> None:
        forward(
            q,
            k,
            v,
            o,
            k_cache,
            v_cache,
            kc,
            vc,
            block_table,
            cu,
            sl,
            max_query_len,
            causal=causal,
            window=window,
            softmax_scale=softmax_scale,
            alibi_slopes=alibi,
            sinks=sinks,
            k_scale=k_scale,
            v_scale=v_scale,
            out_scale=out_scale,
            skip_decode=skip_decode,
            softcap=softcap,
            lse=lse,
            config=cfg,
        )

    default = get_config(problem.arch, head, q.dtype, kc.page_size)
    cands = autotune.candidates(problem.arch, head, q.element_size())
    cfg = autotune.tuned_config(q.device, key, run, default, cands)
    return triton_plan(problem, cfg, "autotuned")


def _launch_triton(
    chosen: LaunchPlan,
    problem: Problem,
    q,
    k,
    v,
    o,
    k_cache,
    v_cache,
    kc,
    vc,
    block_table,
    cu,
    sl,
    max_query_len,
    left,
    right,
    scale,
    alibi,
    sinks,
    k_scale,
    v_scale,
    out_scale,
    softcap,
    lse,
) -> None:
    """:func:`prefix_prefill.kernel._fwd_kernel` as ``chosen`` says."""
    consts = chosen.consts()
    opts = chosen.opts()
    kv_from_cache = k is None
    cache_fp8 = consts["CACHE_FP8"]
    out_fp8 = consts["OUT_FP8"]
    if cache_fp8 and (k_scale is None or v_scale is None):
        one = torch.ones(1, dtype=torch.float32, device=q.device)
        k_scale = one if k_scale is None else k_scale
        v_scale = one if v_scale is None else v_scale
    if out_fp8 and out_scale is None:
        out_scale = torch.ones(1, dtype=torch.float32, device=q.device)
    batch = sl.shape[0]
    grid = (q.shape[1], -(-max_query_len // chosen.block_m), batch)  # plain ints: triton.cdiv costs ~2 us
    if grid[1] > _MAX_GRID_YZ:
        raise ValueError(f"max query length {max_query_len} needs more than {_MAX_GRID_YZ} query tiles")
    dummy = q  # never dereferenced: stands in for absent optional tensors
    kcs = kc.kernel_args()  # (block, slot, head, dim, x)
    vcs = vc.kernel_args()
    level = opts.pop("register_usage_level", 0)
    _fwd_kernel[grid](
        q,
        dummy if kv_from_cache else k,
        dummy if kv_from_cache else v,
        o,
        k_cache,
        v_cache,
        block_table,
        cu,
        sl,
        sinks if sinks is not None else dummy,
        alibi if alibi is not None else dummy,
        k_scale if cache_fp8 else dummy,
        v_scale if cache_fp8 else dummy,
        out_scale if out_fp8 else dummy,
        scale * LOG2E,
        softcap * LOG2E if softcap > 0 else 1.0,
        left,
        right,
        block_table.shape[1],
        kc.page_size,
        q.stride(0),
        q.stride(1),
        0 if kv_from_cache else k.stride(0),
        0 if kv_from_cache else k.stride(1),
        0 if kv_from_cache else v.stride(0),
        0 if kv_from_cache else v.stride(1),
        o.stride(0),
        o.stride(1),
        block_table.stride(0),
        block_table.stride(1),
        kcs[0],
        kcs[1],
        kcs[2],
        kcs[3],
        kcs[4],
        vcs[0],
        vcs[1],
        vcs[2],
        vcs[3],
        lse,  # None without return_lse: a constexpr, so the kernel keeps its signature
        lse.stride(0) if lse is not None else None,
        **consts,
        **opts,
        **ptxas_launch_options(level, q.device),
    )
