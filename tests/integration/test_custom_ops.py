"""PyTorch integration: each kernel launch is a ``torch.library`` custom op.

* ``torch.ops.window_prefill.fwd`` / ``torch.ops.prefix_prefill.fwd`` exist after import, with a
  schema that declares ``out`` mutated, and pass ``torch.library.opcheck``;
* every public function reaches its kernel through the op (a dispatch-mode spy sees it) and
  matches the float64 reference (outputs poisoned first);
* ``torch.compile(fullgraph=True)`` with the ``eager`` and ``aot_eager`` backends traces each public
  function without a graph break, the op appears in the graph, and compiled == eager bit for bit,
  also when the output buffer is a graph input mutated in place (vLLM's ``o``);
* on a GPU (marked ``gpu``): opcheck on CUDA, the default Inductor backend, and CUDA-graph
  capture/replay of each public function (bf16) against eager on fresh inputs.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from conftest import DEVICE, ON_GPU, poison
from it_cases import Dense, H, Paged, dense_case, paged_case
from torch.utils._python_dispatch import TorchDispatchMode

import prefix_prefill
import window_prefill
from attn_reference import attention_varlen, compare, compare_lse, negative_control, paged_prefix_attention
from paged_kv_offsets import LAYOUTS
from prefix_prefill import context_attention_fwd as pp_caf
from window_prefill import context_attention_fwd as wp_caf
from window_prefill import ops as wp_ops

OPCHECK_UTILS = ("test_schema", "test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")


# ----------------------------------------------------------------------------- the four public calls
def _wp(p: Dense, o: torch.Tensor) -> torch.Tensor:
    return window_prefill.window_prefill(
        p.q, p.k, p.v, p.cu, p.max_len, window=p.window, sinks=p.sinks, out=o
    )


def _wcaf(p: Dense, o: torch.Tensor) -> torch.Tensor:
    wp_caf(p.q, p.k, p.v, o, p.starts, p.lens, p.max_len, sliding_window_q=p.window[0], sinks=p.sinks)
    return o


def _pp(p: Paged, o: torch.Tensor) -> torch.Tensor:
    window = (p.sliding_window - 1, -1) if p.sliding_window else (-1, -1)
    return prefix_prefill.prefix_prefill(
        p.q, p.k, p.v, p.k_cache, p.v_cache, p.block_table, p.cu_q, p.seq_lens, p.max_q, window=window, out=o
    )


def _pcaf(p: Paged, o: torch.Tensor) -> torch.Tensor:
    pp_caf(*p.vllm_args(o), sliding_window=p.sliding_window)
    return o


CALLS: dict[str, tuple[Callable[..., object], Callable[..., torch.Tensor], str]] = {
    "window_prefill": (lambda dt, dev: dense_case(dt, dev), _wp, "window_prefill::fwd"),
    "window-context_attention_fwd": (lambda dt, dev: dense_case(dt, dev), _wcaf, "window_prefill::fwd"),
    "prefix_prefill": (lambda dt, dev: paged_case(dt, dev, sliding_window=7), _pp, "prefix_prefill::fwd"),
    "prefix-context_attention_fwd": (lambda dt, dev: paged_case(dt, dev), _pcaf, "prefix_prefill::fwd"),
}


# ----------------------------------------------------------------------------- raw op arguments
def _window_op_args(device: str, dtype: torch.dtype, lens_form: bool) -> tuple:
    p = dense_case(dtype, device, lens=(5, 11), window=(3, -1), with_sinks=lens_form)
    out = poison(torch.empty_like(p.q))
    starts, lens = (p.starts, p.lens) if lens_form else (p.cu, None)
    return (p.q, p.k, p.v, out, starts, lens, p.max_len, True, 3, -1, 0.2, p.sinks, False, *wp_ops.NO_CONFIG)


def _prefix_op_args(device: str, dtype: torch.dtype, kv_from_cache: bool) -> tuple:
    p = paged_case(dtype, device, ctx_lens=(6, 0), q_lens=(3, 9))
    out = poison(torch.empty_like(p.q))
    k, v = (None, None) if kv_from_cache else (p.k, p.v)
    alibi = torch.rand(p.q.shape[1], device=device) if kv_from_cache else None
    sinks = None if kv_from_cache else torch.randn(p.q.shape[1], device=device)
    return (
        p.q, k, v, out, p.k_cache, p.v_cache, LAYOUTS.index("split"), p.block_table, p.cu_q, p.seq_lens,
        p.max_q, True, 4 if kv_from_cache else -1, -1, None if kv_from_cache else 0.3, alibi, sinks,
        None, None, None, False,
    )  # fmt: skip


def _with_lse(args: tuple) -> tuple:
    """The op's arguments (``softcap`` not given) plus ``softcap=0.0`` and a NaN-poisoned float32 ``lse``
    ``[num_heads, total]``: what ``return_lse=True`` passes."""
    q = args[0]
    return (*args, 0.0, poison(torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device)))


def _fp8_out(args: tuple) -> tuple:
    """The window op's arguments with ``out`` made float8_e4m3fn (NaN-poisoned), no status or slopes, and
    the output's quantisation scale: what ``window_prefill(out=<fp8>, fp8_out_scale=...)`` passes."""
    out = poison(torch.empty(args[3].shape, dtype=torch.float8_e4m3fn, device=args[3].device))
    return (*args[:3], out, *args[4:], None, None, torch.full((1,), 0.25, device=out.device))


OP_CASES = {
    "window-cu_seqlens": (lambda dev, dt: _window_op_args(dev, dt, False), "window_prefill"),
    "window-starts_lens_sinks": (lambda dev, dt: _window_op_args(dev, dt, True), "window_prefill"),
    "prefix-new_kv_sinks": (lambda dev, dt: _prefix_op_args(dev, dt, False), "prefix_prefill"),
    "prefix-kv_from_cache_alibi_window": (lambda dev, dt: _prefix_op_args(dev, dt, True), "prefix_prefill"),
    # the optional mutable lse (return_lse=True): softcap 0.0 made explicit, then lse
    "window-starts_lens_sinks-lse": (
        lambda dev, dt: _with_lse(_window_op_args(dev, dt, True)),
        "window_prefill",
    ),
    # ALiBi slopes, the window op's last argument (after lse and status)
    "window-cu_seqlens-alibi": (
        lambda dev, dt: (*_with_lse(_window_op_args(dev, dt, False)), None, torch.rand(H, device=dev)),
        "window_prefill",
    ),
    # an fp8 output and its scale, the window op's last argument (after the slopes)
    "window-cu_seqlens-fp8_out": (
        lambda dev, dt: _fp8_out(_with_lse(_window_op_args(dev, dt, False))),
        "window_prefill",
    ),
    "prefix-new_kv_sinks-lse": (
        lambda dev, dt: _with_lse(_prefix_op_args(dev, dt, False)),
        "prefix_prefill",
    ),
}


class OpSpy(TorchDispatchMode):
    """Records the name of every operator that reaches the dispatcher's Python key."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func.name()))
        return func(*args, **(kwargs or {}))


# ----------------------------------------------------------------------------- CPU tests
def test_op_namespaces_exist_after_import():
    for pkg in ("window_prefill", "prefix_prefill"):
        packet = getattr(torch.ops, pkg).fwd
        schema = packet.default._schema
        assert schema.name == f"{pkg}::fwd"
        assert [r for r in schema.returns] == []
        out = next(a for a in schema.arguments if a.name == "out")
        assert out.alias_info is not None and out.alias_info.is_write, schema
        mutated = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
        # lse: the optional softmax LSE (return_lse=True); status: the optional malformed-metadata report
        assert mutated == ["out", "lse", "status"], schema
        window_only = ("alibi_slopes", "out_scale")
        optional = {a.name: a for a in schema.arguments if a.name in ("lse", "status", *window_only)}
        for name in ("lse", "status") if pkg == "prefix_prefill" else ("lse", "status", *window_only):
            arg = optional[name]
            assert str(arg.type) == "Optional[Tensor]" and arg.default_value is None, arg


# every case without grad; with a q that requires grad, the case of each op that passes every argument
# (the autograd registration is the op's, whatever the arguments)
OPCHECK_PARAMS = [(c, False) for c in OP_CASES] + [(c, True) for c in OP_CASES if c.endswith("-lse")]


@pytest.mark.parametrize(("case", "requires_grad"), OPCHECK_PARAMS)
def test_opcheck(case, requires_grad):
    make, pkg = OP_CASES[case]
    args = list(make(DEVICE, torch.float16))
    if requires_grad:  # the op has no backward: autograd must still be registered consistently
        args[0] = args[0].detach().requires_grad_()
    utils = OPCHECK_UTILS
    if "fp8_out" in case:  # test_schema compares tensors by arithmetic torch has no fp8 kernels for; the
        utils = tuple(u for u in utils if u != "test_schema")  # schema is the other window cases' (checked)
    result = torch.library.opcheck(getattr(torch.ops, pkg).fwd.default, tuple(args), test_utils=utils)
    assert all(v == "SUCCESS" for v in result.values()), result


@pytest.mark.parametrize("case", list(OP_CASES))
def test_op_bumps_out_version_and_runs_in_inference_mode(case):
    make, pkg = OP_CASES[case]
    op = getattr(torch.ops, pkg).fwd.default
    args = make(DEVICE, torch.float16)
    out = args[3]
    lse = args[-1] if case.endswith("-lse") else None
    before = out._version
    lse_before = lse._version if lse is not None else 0
    op(*args)
    assert out._version > before, "autograd must see the in-place write to out"
    assert not torch.isnan(out).any()
    if lse is not None:
        assert lse._version > lse_before, "autograd must see the in-place write to lse"
        assert torch.isfinite(lse).all()
    with torch.inference_mode():  # how serving engines call it: inference tensors have no version counter
        args = make(DEVICE, torch.float16)
        op(*args)
        assert not torch.isnan(args[3]).any()


@torch.library.custom_op("prefill_integration_test::undeclared_write", mutates_args=())
def _undeclared_write(q: torch.Tensor, out: torch.Tensor) -> None:
    """A broken op for the negative control: writes ``out`` without declaring it mutated."""
    out.copy_(q)


@_undeclared_write.register_fake
def _(q: torch.Tensor, out: torch.Tensor) -> None:
    return None


def test_opcheck_negative_control():
    """opcheck (as called above) rejects an op whose schema hides its write to ``out``."""
    q = torch.randn(4, 2, 8)
    with pytest.raises(Exception, match=r"(?i)mutat"):
        torch.library.opcheck(
            torch.ops.prefill_integration_test.undeclared_write.default, (q, torch.empty_like(q)),
            test_utils=OPCHECK_UTILS,
        )  # fmt: skip


@pytest.mark.parametrize("name", list(CALLS))
def test_public_function_runs_through_the_op(name):
    make, call, op_name = CALLS[name]
    p = make(torch.float16, DEVICE)
    o = poison(torch.empty_like(p.q))
    with OpSpy() as spy:
        out = call(p, o)
    assert out is o
    assert spy.names.count(op_name) == 1, spy.names
    res = compare(out, p.reference())
    assert res, res


def _compiled_matches_eager(name: str, backend: str) -> tuple[torch.Tensor, object]:
    make, call, op_name = CALLS[name]
    p = make(torch.float16, DEVICE)
    graphs: list[torch.fx.GraphModule] = []

    def recording(gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., object]:
        graphs.append(gm)
        return torch._dynamo.lookup_backend(backend)(gm, example_inputs)

    torch._dynamo.reset()
    compiled = torch.compile(call, fullgraph=True, backend=recording)  # a graph break raises
    o_c = poison(torch.empty_like(p.q))
    out_c = compiled(p, o_c)
    o_e = poison(torch.empty_like(p.q))
    out_e = call(p, o_e)
    assert len(graphs) == 1
    targets = [str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    assert any(op_name.replace("::", ".") in t for t in targets), targets
    assert torch.equal(out_c, out_e)
    assert torch.equal(o_c, o_e), "the compiled call must write the caller's buffer in place"
    return out_c, p


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("name", list(CALLS))
def test_compile_fullgraph_matches_eager(name, backend):
    out, p = _compiled_matches_eager(name, backend)
    res = compare(out, p.reference())
    assert res, res


@pytest.mark.parametrize("name", list(CALLS))
def test_compile_new_shapes_recompile_without_graph_break(name):
    """A second batch (other lengths, batch size, token count) makes Dynamo recompile with dynamic
    sizes (SymInts reach the checks and the op's int arguments); still one graph, still correct."""
    _, call, _ = CALLS[name]
    torch._dynamo.reset()
    compiled = torch.compile(call, fullgraph=True, backend="aot_eager")
    for lens in [(7, 21), (5, 9, 30)]:
        if name.startswith("window"):
            p = dense_case(torch.float16, DEVICE, lens=lens)
        else:
            p = paged_case(torch.float16, DEVICE, ctx_lens=tuple(3 * n for n in lens), q_lens=lens)
        out = compiled(p, poison(torch.empty_like(p.q)))
        res = compare(out, p.reference())
        assert res, (lens, res)


def _wp_lse(p: Dense, o: torch.Tensor, lse: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    return window_prefill.window_prefill(
        p.q, p.k, p.v, p.cu, p.max_len, window=p.window, sinks=p.sinks, out=o, return_lse=True, lse=lse
    )


def _pp_lse(p: Paged, o: torch.Tensor, lse: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    return prefix_prefill.prefix_prefill(
        p.q, p.k, p.v, p.k_cache, p.v_cache, p.block_table, p.cu_q, p.seq_lens, p.max_q, window=(6, -1),
        out=o, return_lse=True, lse=lse,
    )  # fmt: skip


def _lse_reference(p: Dense | Paged) -> torch.Tensor:
    if isinstance(p, Dense):
        return attention_varlen(
            p.q, p.k, p.v, p.cu, p.cu, causal=True, window=p.window, sinks=p.sinks, return_lse=True
        )[1]
    return paged_prefix_attention(
        p.q, p.k, p.v, p.k_cache, p.v_cache, p.block_table, p.cu_q, p.seq_lens, layout="split",
        window=(6, -1), return_lse=True,
    )[1]  # fmt: skip


LSE_CALLS: dict[str, tuple[Callable[..., object], Callable[..., tuple], str]] = {
    "window_prefill": (lambda dt, dev: dense_case(dt, dev), _wp_lse, "window_prefill::fwd"),
    "prefix_prefill": (lambda dt, dev: paged_case(dt, dev), _pp_lse, "prefix_prefill::fwd"),
}


def _lse_buffer(p: Dense | Paged) -> torch.Tensor:
    return poison(torch.empty(p.q.shape[1], p.q.shape[0], dtype=torch.float32, device=p.q.device))


@pytest.mark.parametrize("given", [False, True], ids=["allocated", "caller_buffer"])
@pytest.mark.parametrize("name", list(LSE_CALLS))
def test_compile_return_lse_matches_eager(name, given):
    """``return_lse=True`` under ``torch.compile(fullgraph=True)`` (aot_eager: functionalisation of the
    op's second mutable argument): one graph, the op in it, out and lse equal to eager bit for bit, a
    caller's lse buffer written in place, and the LSE matches the reference."""
    make, call, op_name = LSE_CALLS[name]
    p = make(torch.float16, DEVICE)
    graphs: list[torch.fx.GraphModule] = []

    def recording(gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., object]:
        graphs.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    torch._dynamo.reset()
    compiled = torch.compile(call, fullgraph=True, backend=recording)
    o_c, lse_c = poison(torch.empty_like(p.q)), _lse_buffer(p) if given else None
    out_c, l_c = compiled(p, o_c, lse_c)
    o_e, lse_e = poison(torch.empty_like(p.q)), _lse_buffer(p) if given else None
    out_e, l_e = call(p, o_e, lse_e)
    assert len(graphs) == 1
    targets = [str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    assert any(op_name.replace("::", ".") in t for t in targets), targets
    assert torch.equal(out_c, out_e) and torch.equal(o_c, o_e)
    assert torch.equal(l_c, l_e)
    if given:
        assert torch.equal(lse_c, l_e), "the compiled call must write the caller's lse in place"
    res = compare_lse(l_c, _lse_reference(p))
    assert res, res


def test_compile_harness_negative_control():
    """The comparison used above rejects a plausible wrong answer (window shifted by one key)."""
    out, p = _compiled_matches_eager("window_prefill", "eager")
    wrong = negative_control(
        p.q, p.k, p.v, p.cu, p.cu, "window_shift", causal=True, window=p.window, sinks=p.sinks
    )
    assert compare(wrong.to(out.dtype), p.reference()).ok is False
    assert compare(out, wrong).ok is False


def test_dynamo_explain_reports_no_graph_break():
    p = dense_case(torch.float16, DEVICE)
    o = torch.empty_like(p.q)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(_wcaf)(p, o)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


# ----------------------------------------------------------------------------- GPU tests
@pytest.mark.gpu
@pytest.mark.parametrize("case", list(OP_CASES))
def test_gpu_opcheck(case):
    make, pkg = OP_CASES[case]
    args = make("cuda", torch.bfloat16)
    result = torch.library.opcheck(getattr(torch.ops, pkg).fwd.default, args, test_utils=OPCHECK_UTILS)
    assert all(v == "SUCCESS" for v in result.values()), result


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CALLS))
def test_gpu_compile_inductor(name):
    make, call, _ = CALLS[name]
    p = make(torch.bfloat16, "cuda")
    torch._dynamo.reset()
    compiled = torch.compile(call, fullgraph=True)  # default backend: Inductor
    o_c = poison(torch.empty_like(p.q))
    out_c = compiled(p, o_c)
    o_e = poison(torch.empty_like(p.q))
    out_e = call(p, o_e)
    torch.cuda.synchronize()
    assert torch.equal(out_c, out_e)
    assert torch.equal(o_c, o_e)
    res = compare(out_c, p.reference())
    assert res, res


def _refill(p: object) -> None:
    """New random values in every float input tensor, in place (the graph's static buffers)."""
    for name in ("q", "k", "v", "k_cache", "v_cache", "sinks"):
        t = getattr(p, name, None)
        if isinstance(t, torch.Tensor):
            t.copy_(torch.randn(t.shape, device=t.device).to(t.dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CALLS))
def test_gpu_cuda_graph_replay_matches_eager(name):
    make, call, _ = CALLS[name]
    p = make(torch.bfloat16, "cuda")
    o = poison(torch.empty_like(p.q))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compile the kernel outside the capture
        call(p, o)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_g = call(p, o)
    for _ in range(2):  # replay on new values: the graph must not have baked in the capture's inputs
        _refill(p)
        poison(o)
        graph.replay()
        torch.cuda.synchronize()
        out_e = call(p, poison(torch.empty_like(p.q)))
        torch.cuda.synchronize()
        assert torch.equal(out_g, out_e)
        res = compare(out_g, p.reference())
        assert res, res


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(LSE_CALLS))
def test_gpu_return_lse_inductor_and_cuda_graph(name):
    """bf16: ``return_lse=True`` under Inductor equals eager; captured in a CUDA graph with the caller's
    out/lse buffers, a replay on new inputs matches eager."""
    make, call, _ = LSE_CALLS[name]
    p = make(torch.bfloat16, "cuda")
    torch._dynamo.reset()
    out_c, l_c = torch.compile(call, fullgraph=True)(p, poison(torch.empty_like(p.q)), None)
    out_e, l_e = call(p, poison(torch.empty_like(p.q)), None)
    torch.cuda.synchronize()
    assert torch.equal(out_c, out_e) and torch.equal(l_c, l_e)
    o, lse = poison(torch.empty_like(p.q)), _lse_buffer(p)
    call(p, o, lse)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(p, o, lse)
    _refill(p)
    poison(o), poison(lse)
    graph.replay()
    torch.cuda.synchronize()
    out_e, l_e = call(p, poison(torch.empty_like(p.q)), None)
    torch.cuda.synchronize()
    assert torch.equal(o, out_e) and torch.equal(lse, l_e)
    res = compare_lse(lse, _lse_reference(p))
    assert res, res


@pytest.mark.skipif(ON_GPU, reason="CPU-only sanity check of the test helpers")
def test_refill_changes_inputs():
    p = dense_case()
    before = p.q.clone()
    _refill(p)
    assert not torch.equal(before, p.q)


@pytest.mark.parametrize("pkg", ["window_prefill", "prefix_prefill"])
def test_launch_switches_to_the_inputs_cuda_device(pkg, monkeypatch):
    """Triton launches on the current CUDA device; the op makes it the inputs' device when they
    differ (multi-GPU processes) and does nothing otherwise."""
    import contextlib
    import importlib

    ops = importlib.import_module(f"{pkg}.ops")
    assert isinstance(ops.on_device(torch.device("cpu")), contextlib.nullcontext)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert isinstance(ops.on_device(torch.device("cuda", 0)), contextlib.nullcontext)
    guard = ops.on_device(torch.device("cuda", 1))
    assert isinstance(guard, torch.cuda.device) and guard.idx == 1
