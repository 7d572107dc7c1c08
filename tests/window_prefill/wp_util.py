"""Shared helpers of the window_prefill tests: random ragged batches, poisoned runs, the reference,
plans run as given, and spies on the launches."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import DEVICE, poison

import window_prefill.launch as wp_launch
import window_prefill.plan as wp_plan
from attn_reference import attention_varlen
from prefill_runtime import LaunchPlan
from window_prefill import window_prefill
from window_prefill.configs import Config


def cu_of(lens: list[int], dtype: torch.dtype = torch.int32, device: str = DEVICE) -> torch.Tensor:
    """cu_seqlens [batch + 1] of ``lens``."""
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=dtype, device=device)


def make_qkv(
    lens: list[int], heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: str = DEVICE
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fresh random q [T, H, D], k/v [T, Hkv, D] and cu_seqlens for a ragged batch."""
    total = sum(lens)
    q = torch.randn(total, heads, head_dim, dtype=dtype, device=device)
    k = torch.randn(total, kv_heads, head_dim, dtype=dtype, device=device)
    v = torch.randn(total, kv_heads, head_dim, dtype=dtype, device=device)
    return q, k, v, cu_of(lens, device=device)


def run(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu: torch.Tensor,
    max_len: int,
    *,
    config: Config | None = None,
    **kwargs,
) -> torch.Tensor:
    """window_prefill into a NaN-poisoned output buffer."""
    out = poison(torch.empty(q.shape, dtype=q.dtype, device=q.device))
    res = window_prefill(q, k, v, cu, max_len, out=out, config=config, **kwargs)
    assert res is out
    return out


def reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu: torch.Tensor,
    *,
    causal: bool = True,
    window: tuple[int, int] = (-1, -1),
    softmax_scale: float | None = None,
    sinks: torch.Tensor | None = None,
    sinks_mode: str = "denominator",
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    """float64 reference (self-attention: cu_seqlens_q = cu_seqlens_k)."""
    return attention_varlen(
        q,
        k,
        v,
        cu,
        cu,
        causal=causal,
        window=window,
        softmax_scale=softmax_scale,
        sinks=sinks,
        sinks_mode=sinks_mode,
        softcap=softcap,
        alibi_slopes=alibi_slopes,
    )


def tile_key_range(m0: int, m1: int, seq_len: int, causal: bool, window: tuple[int, int]) -> tuple[int, int]:
    """[lo, hi): keys some row in [m0, m1) of one sequence may see (brute force, not the kernel's formula)."""
    left, right = window
    visible = set()
    for i in range(m0, m1):
        for j in range(seq_len):
            if causal and j > i:
                continue
            if left >= 0 and i - j > left:
                continue
            if right >= 0 and j - i > right:
                continue
            visible.add(j)
    lo, hi = min(visible), max(visible) + 1
    assert len(visible) == hi - lo, "the visible keys of a tile form one interval"
    return lo, hi


def check_graph_replay(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: int,
                       **kwargs) -> None:  # fmt: skip
    """window_prefill captured in a CUDA graph (compiled outside the capture) replays into a
    NaN-poisoned output and matches the float64 reference; ``kwargs`` go to both (e.g. ``window``)."""
    from attn_reference import compare

    out = torch.empty_like(q)
    window_prefill(q, k, v, cu, max_len, out=out, **kwargs)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        window_prefill(q, k, v, cu, max_len, out=out, **kwargs)
    poison(out)
    graph.replay()
    torch.cuda.synchronize()
    c = compare(out, reference(q, k, v, cu, **kwargs))
    assert c, c


def run_plan(p: LaunchPlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: int,
             *, window: tuple[int, int] = (-1, -1), softmax_scale: float | None = None,
             sinks: torch.Tensor | None = None, softcap: float = 0.0, lse: torch.Tensor | None = None,
             ) -> torch.Tensor:  # fmt: skip
    """Launch plan ``p`` (e.g. ``explain(...)`` changed with ``LaunchPlan.replace``) on the ``cu_seqlens``
    form into a NaN-poisoned output, as benchmarks run a changed plan."""
    out = poison(torch.empty(q.shape, dtype=q.dtype, device=q.device))
    scale = 1.0 / math.sqrt(q.shape[2]) if softmax_scale is None else softmax_scale
    wp_launch.run(p, q, k, v, out, cu, None, max_len, cu.shape[0] - 1, window_left=window[0],
                  window_right=window[1], softmax_scale=scale, sinks=sinks, softcap=softcap,
                  lse=lse)  # fmt: skip
    return out


class KernelSpy:
    """Stands in for a ``@triton.jit`` kernel: records each ``kernel[grid](*args, **kwargs)`` launch
    (grid, arguments by name, keyword arguments), then runs the real kernel."""

    def __init__(self, real: object) -> None:
        self.real = real
        self.launches: list[tuple[tuple, dict, dict]] = []

    def __getitem__(self, grid: tuple):
        def launch(*args: object, **kwargs: object) -> object:
            self.launches.append((tuple(grid), dict(zip(self.real.arg_names, args, strict=False)), kwargs))
            return self.real[grid](*args, **kwargs)

        return launch


def spy_triton(monkeypatch: pytest.MonkeyPatch) -> KernelSpy:
    """Record every launch of the Triton kernel (``window_prefill.launch._fwd_kernel``)."""
    spy = KernelSpy(wp_launch._fwd_kernel)
    monkeypatch.setattr(wp_launch, "_fwd_kernel", spy)
    return spy


def count_gluon_launches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The returned list grows by one for each call the Gluon kernel ran (``launch._launch_gluon``
    returned True, or a warm call of a Gluon plan launched through its frame: ``launch.repeat``)."""
    taken: list[int] = []
    orig, orig_repeat = wp_launch._launch_gluon, wp_launch.repeat

    def counted(*args, **kwargs):
        ok = orig(*args, **kwargs)
        if ok:
            taken.append(1)
        return ok

    def counted_repeat(prep, *args, **kwargs):
        framed = orig_repeat(prep, *args, **kwargs)
        if framed and prep.plan.kernel == "gluon":
            taken.append(1)
        return framed

    monkeypatch.setattr(wp_launch, "_launch_gluon", counted)
    monkeypatch.setattr(wp_launch, "repeat", counted_repeat)
    return taken


def refuse_gluon(monkeypatch: pytest.MonkeyPatch) -> list[LaunchPlan]:
    """Plans the CPU tests may route to the Gluon kernel: the launcher believes it runs on sm90 with
    Gluon, and ``launch._launch_gluon`` refuses every plan it is offered (listed in the returned list),
    so the plan's Triton fallback answers under the interpreter."""
    offered: list[LaunchPlan] = []

    def offer(p, *args, **kwargs):
        offered.append(p)
        return False

    monkeypatch.setattr(wp_launch, "detect_arch", lambda device: "sm90")
    monkeypatch.setattr(wp_launch, "_gluon_ok", True)
    monkeypatch.setenv("PREFILL_GLUON", "1")  # (offered outside the Triton allowlist too)
    monkeypatch.setattr(wp_launch, "_launch_gluon", offer)
    return offered


def any_width_is_wide(monkeypatch: pytest.MonkeyPatch, width: int = 1) -> None:
    """The Gluon width rule (``plan._GLUON_MIN_WIDTH``) holds for every window of at least ``width`` keys
    at every head size: short test sequences and narrow windows may take the Gluon kernel."""
    monkeypatch.setattr(wp_plan, "_GLUON_MIN_WIDTH", dict.fromkeys(wp_plan._GLUON_MIN_WIDTH, width))


# Head of the scripts that compile the Gluon kernel offline (after conftest's GLUON_COMPILE_PREAMBLE):
# compile_wp(head_dim, lse, sinks, softcap, **consts) compiles one form (bf16, 128-row tiles, the
# consumers' key blocks, the plan's ring slots; an e4m3 O with OUT_MAX) and returns the compiled kernel.
WP_COMPILE_HEAD = """
import window_prefill.launch as wl
import window_prefill.plan as wp_plan


def compile_wp(head_dim, lse, sinks=0, softcap=0, **consts):
    bn = 64 if head_dim == 256 else 128
    lay_q = gl.NVMMASharedLayout.get_default_for([64, head_dim], gl.bfloat16)
    lay_k = gl.NVMMASharedLayout.get_default_for([bn, head_dim], gl.bfloat16)
    sig = {
        "Q_desc": f"tensordesc<bf16[64, {head_dim}],{lay_q!r}>",
        "K_desc": f"tensordesc<bf16[{bn}, {head_dim}],{lay_k!r}>",
        "V_desc": f"tensordesc<bf16[{bn}, {head_dim}],{lay_k!r}>",
        "O": "*fp8e4nv" if consts.get("OUT_MAX") else "*bf16", "Starts": "*i32", "Lens": "*i32",
        "qk_scale": "fp32", "window_left": "i32",
        "window_right": "i32", "group_size": "i32", "stride_ot": "i32", "stride_oh": "i32",
        "Lse": "*fp32" if lse else "constexpr", "stride_lse_h": "i32" if lse else "constexpr",
        "Sinks": "*fp32" if sinks else "constexpr", "tanh_scale": "fp32" if softcap else "constexpr",
        "max_len": "i32", "Status": "*i32" if lse else "constexpr",  # (with and without status=)
        "n_seqs": "i32", "head_section": "i32",
        "TileCounter": "*i32" if consts.get("PERSISTENT") else "constexpr",
        "Slopes": "*fp32" if consts.get("HAS_ALIBI") else "constexpr",
        "OutScale": "*fp32" if consts.get("OUT_MAX") else "constexpr",
    }
    consts = dict(HEAD_DIM=head_dim, BLOCK_M=128, BLOCK_N=bn, LENS_FROM_STARTS=True, RETURN_LSE=lse,
                  NUM_STAGES=wp_plan._GLUON_STAGES, SOFTCAP=softcap, SINKS=sinks, **consts)
    consts.update({n: None for n, t in sig.items() if t == "constexpr"})
    return compile_sm90(wl._gluon_fwd_kernel, sig, consts)[1]
"""
