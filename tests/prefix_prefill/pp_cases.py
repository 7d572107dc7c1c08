"""Random paged prefix-prefill problems and the float64 reference for them (shared by the tests)."""

from __future__ import annotations

import torch
from conftest import poison
from paged_cases import FP8_E4M3, FP8_E5M2, Case, interleave_pages, make_case

from attn_reference import paged_prefix_attention
from paged_kv_offsets import describe_kv_cache
from prefill_runtime import softcap_form
from prefix_prefill import context_attention_fwd, launch, plan, prefix_prefill
from prefix_prefill.configs import KernelConfig


def reference(case: Case, **kw) -> torch.Tensor:
    """float64 answer from attn_reference for ``case`` (``kw``: causal, window, alibi_slopes, ...)."""
    return paged_prefix_attention(
        case.q,
        case.k,
        case.v,
        case.k_cache,
        case.v_cache,
        case.block_table,
        case.cu_seqlens_q,
        case.seq_lens,
        layout=case.layout,
        k_scale=case.k_scale,
        v_scale=case.v_scale,
        fp8_dtype=case.fp8_dtype,
        **kw,
    )


#: the cache layouts of the Gluon tests by id: make_case's, and NHD / HND caches whose K and V pages
#: interleave in one FlashInfer-style tensor (:func:`paged_cases.interleave_pages`)
INTERLEAVED = ("nhd-interleaved", "hnd-interleaved")


def make_layout_case(seqs: list[tuple[int, int]], *, layout: str, **kw) -> Case:
    """:func:`paged_cases.make_case` for a layout id: ``"split"``, ``"nhd"``, ``"hnd"``, or one of
    :data:`INTERLEAVED` (the case's ``layout`` is then ``"nhd"`` / ``"hnd"``)."""
    base, _, form = layout.partition("-")
    if form not in ("", "interleaved"):
        raise ValueError(f"unknown layout id {layout!r}")
    case = make_case(seqs, layout=base, **kw)
    return interleave_pages(case) if form else case


def random_seqs(
    n: int, max_ctx: int, max_q: int, gen: torch.Generator | None = None
) -> list[tuple[int, int]]:
    """``n`` random ``(ctx_len, query_len)`` pairs, query length >= 1."""
    out = []
    for _ in range(n):
        c = int(torch.randint(0, max_ctx + 1, (1,), generator=gen))
        m = int(torch.randint(1, max_q + 1, (1,), generator=gen))
        out.append((c, m))
    return out


def alibi_slopes(num_heads: int, device: str) -> torch.Tensor:
    base = 2.0 ** (-8.0 / num_heads)
    return torch.tensor([base ** (h + 1) for h in range(num_heads)], dtype=torch.float32, device=device)


def run_py(case: Case, **kw) -> torch.Tensor:
    """prefix_prefill into a NaN-poisoned buffer (validate=True unless given)."""
    out = poison(torch.empty(case.q.shape, dtype=case.q.dtype, device=case.q.device))
    kw.setdefault("validate", True)
    if case.fp8_dtype is not None:
        kw.setdefault("k_scale", case.k_scale)
        kw.setdefault("v_scale", case.v_scale)
    res = prefix_prefill(
        case.q,
        case.k,
        case.v,
        case.k_cache,
        case.v_cache,
        case.block_table,
        case.cu_seqlens_q,
        case.seq_lens,
        case.max_query_len,
        kv_layout=case.layout,
        out=out,
        **kw,
    )
    assert res is out
    return out


def kv_cache_dtype_of(case: Case) -> str:
    if case.fp8_dtype is None:
        return "auto"
    return "fp8_e5m2" if case.fp8_dtype == FP8_E5M2 else "fp8"


def run_vllm(case: Case, o: torch.Tensor | None = None, **kw) -> torch.Tensor:
    """context_attention_fwd (vLLM signature, split layout) into a NaN-poisoned ``o``."""
    assert case.layout == "split"
    if o is None:
        o = poison(torch.empty(case.q.shape, dtype=case.q.dtype, device=case.q.device))
    kw.setdefault("validate", True)
    dev = case.q.device
    context_attention_fwd(
        case.q,
        case.k,
        case.v,
        o,
        kw.pop("kv_cache_dtype", kv_cache_dtype_of(case)),
        case.k_cache,
        case.v_cache,
        case.block_table,
        case.cu_seqlens_q,
        case.seq_lens,
        None,
        case.max_query_len,
        torch.tensor([case.k_scale], dtype=torch.float32, device=dev),
        torch.tensor([case.v_scale], dtype=torch.float32, device=dev),
        **kw,
    )
    return o


def run_cfg(case: Case, config: KernelConfig | None, consts: dict | None = None, **kw) -> torch.Tensor:
    """The Triton kernel with an explicit config (tile shapes the table would not pick; None: the
    table's) and, with ``consts``, constexprs other than the plan's (the other form of a choice the
    plan makes, e.g. ``WIDE_OFFSETS``)."""
    out = poison(torch.empty(case.q.shape, dtype=case.q.dtype, device=case.q.device))
    k_cache, v_cache = case.k_cache, case.v_cache
    if k_cache.dtype == torch.uint8:
        k_cache, v_cache = k_cache.view(FP8_E4M3), v_cache.view(FP8_E4M3)
    kc, vc = describe_kv_cache(k_cache, v_cache, case.layout)
    dev = case.q.device
    scales = {}
    if case.fp8_dtype is not None:
        scales = {
            "k_scale": torch.tensor([case.k_scale], device=dev),
            "v_scale": torch.tensor([case.v_scale], device=dev),
        }
    launch.forward(
        case.q,
        case.k,
        case.v,
        out,
        k_cache,
        v_cache,
        kc,
        vc,
        case.block_table,
        case.cu_seqlens_q,
        case.seq_lens,
        case.max_query_len,
        config=config if consts is None else None,
        plan_override=None if consts is None else _triton_plan(case, config, consts, kw),
        **scales,
        **kw,
    )
    return out


def _triton_plan(case: Case, config, consts: dict, kw: dict):
    """The Triton kernel's plan for ``case`` and the launch options ``kw``, with ``consts`` merged in."""
    window = kw.get("window", (-1, -1))
    p = problem_of(case, gluon=False, causal=kw.get("causal", True), left=window[0], right=window[1],
                   scale=kw.get("softmax_scale") or 1.0, alibi=kw.get("alibi_slopes") is not None,
                   sinks=kw.get("sinks") is not None,
                   softcap_form=softcap_form(kw.get("softcap", 0.0), case.q),
                   skip_decode=kw.get("skip_decode", False),
                   lse=kw.get("lse") is not None)  # fmt: skip
    return plan.triton_plan(p, config).replace(constexprs=consts)


def problem_of(case: Case, out: torch.Tensor | None = None, **opts) -> plan.Problem:
    """The :class:`prefix_prefill.plan.Problem` of ``case`` as ``prefix_prefill()`` would make it, on the
    architecture ``opts.pop("arch", None)`` (None: the case's device); ``opts``: causal, left, right,
    scale, alibi, sinks, softcap_form, skip_decode, lse, gluon."""
    k_cache, v_cache = case.k_cache, case.v_cache
    if k_cache.dtype == torch.uint8:
        k_cache, v_cache = k_cache.view(FP8_E4M3), v_cache.view(FP8_E4M3)
    kc, vc = describe_kv_cache(k_cache, v_cache, case.layout)
    arch = opts.pop("arch", None)
    if arch is None:
        from prefix_prefill.configs import detect_arch

        arch = detect_arch(case.q.device)
    kw = dict(causal=True, left=-1, right=-1, scale=1.0, alibi=False, sinks=False, softcap_form=0,
              skip_decode=False, lse=False, gluon=True)  # fmt: skip
    kw.update(opts)
    o = out if out is not None else torch.empty_like(case.q)
    return plan.make_problem(case.q, case.k, case.v, o, k_cache, v_cache, kc, vc, case.block_table, arch=arch,
                             **kw)  # fmt: skip
