"""The default call path of all four public functions makes no host sync (CUDA-graph capturable), and
``validate=True`` / ``PREFILL_VALIDATE=1`` switch the device-value checks on.

On CPU the Triton interpreter itself reads tensors on the host, so the check covers the Python
launcher only: the kernel object ``_fwd_kernel`` in each interface module is replaced by a recorder,
every host-sync entry point of ``torch.Tensor`` (``item``, ``tolist``, ``cpu``, ``numpy``, ``to("cpu")``,
``__bool__``, ``__int__``, ``__float__``, ``__index__``) and ``torch.cuda.synchronize`` raise while the
public function runs, and afterwards the recorded launch is replayed on the real kernel and compared
with the reference (so the recorder saw the real launch, not a shortcut). On the GPU the same calls
are captured into a CUDA graph and replayed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
import torch
from conftest import DEVICE, ON_GPU, poison
from hd_util import dense_case, dense_ref, paged_case, paged_ref

import prefix_prefill.launch as pp_iface
import window_prefill.launch as wp_iface
from attn_reference import compare
from prefix_prefill import context_attention_fwd as pp_caf
from prefix_prefill import prefix_prefill
from window_prefill import context_attention_fwd as wp_caf
from window_prefill import window_prefill


class HostSync(AssertionError):
    pass


class Recorder:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](*args, **kwargs)`` records the launch."""

    def __init__(self, real: object) -> None:
        self.real = real
        self.calls: list[tuple[tuple, tuple, dict]] = []

    def __getitem__(self, grid: tuple) -> Callable[..., None]:
        def launch(*args: object, **kwargs: object) -> None:
            self.calls.append((tuple(grid), args, kwargs))

        return launch

    def replay(self) -> None:
        for grid, args, kwargs in self.calls:
            self.real[grid](*args, **kwargs)


def _boom(name: str) -> Callable[..., object]:
    def f(*args: object, **kwargs: object) -> object:
        raise HostSync(f"host sync on the default call path: torch.Tensor.{name}")

    return f


def _is_cpu(x: object) -> bool:
    return (isinstance(x, str) and x.startswith("cpu")) or (isinstance(x, torch.device) and x.type == "cpu")


@contextlib.contextmanager
def no_host_sync(mp: pytest.MonkeyPatch) -> Iterator[None]:
    """Every way a launcher could read a device value on the host raises inside this block."""
    real_to = torch.Tensor.to

    def guarded_to(self: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        if any(_is_cpu(a) for a in args) or _is_cpu(kwargs.get("device")):
            raise HostSync("host sync on the default call path: torch.Tensor.to('cpu')")
        return real_to(self, *args, **kwargs)

    with mp.context() as m:
        for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__"):
            m.setattr(torch.Tensor, name, _boom(name))
        m.setattr(torch.Tensor, "to", guarded_to)
        m.setattr(torch.cuda, "synchronize", _boom("cuda.synchronize"))
        yield


def _record(mp: pytest.MonkeyPatch) -> tuple[Recorder, Recorder]:
    wp_rec, pp_rec = Recorder(wp_iface._fwd_kernel), Recorder(pp_iface._fwd_kernel)
    mp.setattr(wp_iface, "_fwd_kernel", wp_rec)
    mp.setattr(pp_iface, "_fwd_kernel", pp_rec)
    return wp_rec, pp_rec


# ---------------------------------------------------------------------------- the calls under test
@dataclass
class Problem:
    c: object  # hd_util.Dense or hd_util.Paged
    opts: dict = field(default_factory=dict)
    # device tensors the vLLM-form helpers build from host values, made once so that a later call
    # (inside a CUDA-graph capture) copies nothing from the host
    dev: dict = field(default_factory=dict)

    def device_tensor(self, key: str, make) -> torch.Tensor:
        if key not in self.dev:
            self.dev[key] = make()
        return self.dev[key]


def _dense(**opts) -> Problem:
    return Problem(dense_case([9, 1, 23], 4, 2, 32, torch.float16), opts)


def _paged(layout: str, opts: dict | None = None, **kw) -> Problem:
    c = paged_case([(21, 7), (0, 3), (40, 18)], heads=4, kv_heads=2, head=32, page=16, dtype=torch.float16,
                   layout=layout, **kw)  # fmt: skip
    return Problem(c, opts or {})


def _wp(p: Problem, **kw) -> torch.Tensor:
    c = p.c
    return window_prefill(c.q, c.k, c.v, c.cu, c.max_len, **p.opts, **kw)


def _wp_ref(p: Problem) -> torch.Tensor:
    o = dict(p.opts)
    o.pop("out", None)
    return dense_ref(p.c, **o)


def _wcaf(p: Problem, **kw) -> torch.Tensor:
    c, o = p.c, p.opts
    out = poison(torch.empty_like(c.q))
    lens = p.device_tensor(
        "lens", lambda: torch.tensor(c.lens, dtype=o.get("lens_dtype", torch.int32), device=DEVICE)
    )
    starts = c.cu[:-1]
    left = o.get("window", (-1, -1))[0]
    wp_caf(c.q, c.k, c.v, out, starts, lens, c.max_len, True, None, left if left > 0 else None, None,
           o.get("sinks"), **kw)  # fmt: skip
    return out


def _wcaf_ref(p: Problem) -> torch.Tensor:
    return dense_ref(p.c, window=p.opts.get("window", (-1, -1)), sinks=p.opts.get("sinks"))


def _pp(p: Problem, **kw) -> torch.Tensor:
    c = p.c
    if c.fp8:
        kw.update(k_scale=c.k_scale, v_scale=c.v_scale)
    return prefix_prefill(c.q, c.k, c.v, c.k_cache, c.v_cache, c.block_table, c.cu_q, c.seq_lens,
                          c.max_query_len, kv_layout=c.layout, **p.opts, **kw)  # fmt: skip


def _pp_ref(p: Problem) -> torch.Tensor:
    return paged_ref(p.c, **p.opts)


def _pcaf(p: Problem, **kw) -> torch.Tensor:
    c, o = p.c, p.opts
    out = poison(torch.empty_like(c.q))
    ks = p.device_tensor("k_scale", lambda: torch.tensor([c.k_scale], device=DEVICE))
    vs = p.device_tensor("v_scale", lambda: torch.tensor([c.v_scale], device=DEVICE))
    kc, vc = (c.k_cache.view(torch.uint8), c.v_cache.view(torch.uint8)) if c.fp8 else (c.k_cache, c.v_cache)
    left = o.get("window", (-1, -1))[0]
    pp_caf(c.q, c.k, c.v, out, "fp8" if c.fp8 else "auto", kc, vc, c.block_table, c.cu_q, c.seq_lens, None,
           c.max_query_len, ks, vs, sliding_window=left + 1 if left >= 0 else None, sinks=o.get("sinks"),
           **kw)  # fmt: skip
    return out


def _pcaf_ref(p: Problem) -> torch.Tensor:
    return paged_ref(p.c, window=p.opts.get("window", (-1, -1)), sinks=p.opts.get("sinks"))


def _rand(n: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(n, device=DEVICE) * scale


# name -> (problem factory, call, reference)
CALLS: dict[str, tuple[Callable[[], Problem], Callable[..., torch.Tensor], Callable[[Problem], torch.Tensor]]]
CALLS = {
    "window_prefill": (_dense, _wp, _wp_ref),
    "window_prefill-options": (
        lambda: _dense(
            causal=False, window=(5, 2), sinks=_rand(4), sinks_mode="bias_key0", softmax_scale=0.2
        ),
        _wp,
        _wp_ref,
    ),
    "window-context_attention_fwd": (_dense, _wcaf, _wcaf_ref),
    "window-context_attention_fwd-options": (
        lambda: _dense(window=(4, -1), sinks=_rand(4), lens_dtype=torch.int64),
        _wcaf,
        _wcaf_ref,
    ),
    "prefix_prefill": (lambda: _paged("nhd"), _pp, _pp_ref),
    "prefix_prefill-options": (
        lambda: _paged(
            "hnd",
            {"window": (12, -1), "alibi_slopes": _rand(4).abs() * 0.3, "sinks": _rand(4)},
            fp8=True,
            kv_from_cache=True,
        ),
        _pp,
        _pp_ref,
    ),
    "prefix-context_attention_fwd": (lambda: _paged("split"), _pcaf, _pcaf_ref),
    "prefix-context_attention_fwd-options": (
        lambda: _paged("split", {"window": (8, -1), "sinks": _rand(4)}, fp8=True),
        _pcaf,
        _pcaf_ref,
    ),
}


@pytest.mark.skipif(ON_GPU, reason="CPU launcher check; the GPU runs test_gpu_cuda_graph_capture")
@pytest.mark.parametrize(
    "name", [*CALLS, "window_prefill-options+return_lse", "prefix_prefill-options+return_lse"]
)
def test_default_path_never_syncs(name, monkeypatch):
    """``+return_lse``: the same call with ``return_lse=True`` (the LSE buffer allocated by the call)."""
    base, _, with_lse = name.partition("+")
    make, call, reference = CALLS[base]
    p = make()
    monkeypatch.delenv("PREFILL_VALIDATE", raising=False)
    wp_rec, pp_rec = _record(monkeypatch)
    with no_host_sync(monkeypatch):
        out = call(p, return_lse=True) if with_lse else call(p)
    rec, other = (wp_rec, pp_rec) if name.startswith("window") else (pp_rec, wp_rec)
    assert len(rec.calls) == 1 and not other.calls
    monkeypatch.undo()
    rec.replay()  # the recorded launch, on the real kernel
    if with_lse:
        out = out[0]  # the LSE values: tests/window_prefill/test_lse.py, tests/prefix_prefill/test_pp_lse.py
    res = compare(out, reference(p))
    assert res, res


@pytest.mark.skipif(ON_GPU, reason="CPU launcher check")
def test_sync_guard_catches_a_sync(monkeypatch):
    """Negative control of the guard: each way of reading a device value is caught."""
    cu = _dense().c.cu
    probes = [
        lambda: cu[-1].item(),
        lambda: int(cu[-1]),
        lambda: bool(cu[-1] > 0),
        lambda: float(cu[-1]),
        lambda: cu.to("cpu"),
        lambda: cu.to(device=torch.device("cpu")),
        lambda: cu.tolist(),
        lambda: cu.cpu(),
        lambda: cu.numpy(),
        lambda: range(cu[-1]),
        lambda: torch.cuda.synchronize(),
    ]
    with no_host_sync(monkeypatch):
        for probe in probes:
            with pytest.raises(HostSync):
                probe()
        assert cu.to(torch.int64).dtype == torch.int64  # dtype casts stay allowed


@pytest.mark.skipif(ON_GPU, reason="CPU launcher check")
@pytest.mark.parametrize("how", ["env", "flag"])
@pytest.mark.parametrize("name", [n for n in CALLS if not n.endswith("options")])
def test_validation_is_opt_in(name, how, monkeypatch):
    """``validate=True`` or ``PREFILL_VALIDATE=1`` runs the device-value checks (they read on the host, so
    the guard fires); ``PREFILL_VALIDATE=0`` alone does not."""
    make, call, _ = CALLS[name]
    p = make()
    _record(monkeypatch)
    monkeypatch.setenv("PREFILL_VALIDATE", "0")
    with no_host_sync(monkeypatch):
        call(p)
    kw = {"validate": True} if how == "flag" else {}
    if how == "env":
        monkeypatch.setenv("PREFILL_VALIDATE", "1")
    with no_host_sync(monkeypatch), pytest.raises(HostSync):
        call(p, **kw)


def _bad_device_value(name: str, p: Problem) -> None:
    """A mistake only the opt-in checks can see: max length too small / a table entry outside the cache."""
    c = p.c
    if name == "window_prefill":
        window_prefill(c.q, c.k, c.v, c.cu, c.max_len - 1)
    elif name == "window-context_attention_fwd":
        lens = torch.tensor(c.lens, device=DEVICE)
        wp_caf(c.q, c.k, c.v, torch.empty_like(c.q), c.cu[:-1], lens, c.max_len - 1)
    elif name == "prefix_prefill":
        prefix_prefill(c.q, c.k, c.v, c.k_cache, c.v_cache, c.block_table.clamp(max=-1), c.cu_q, c.seq_lens,
                       c.max_query_len, kv_layout=c.layout)  # fmt: skip
    else:
        pp_caf(c.q, c.k, c.v, torch.empty_like(c.q), "auto", c.k_cache, c.v_cache, c.block_table + 10_000,
               c.cu_q, c.seq_lens, None, c.max_query_len, 1.0, 1.0)  # fmt: skip


@pytest.mark.parametrize("name", [n for n in CALLS if not n.endswith("options")])
def test_prefill_validate_env_rejects_bad_device_values(name, monkeypatch):
    """PREFILL_VALIDATE=1 rejects a device-value error before launching; unset, the call reaches the
    launch (the kernel is stubbed here, so nothing reads the bad values)."""
    make, _, _ = CALLS[name]
    p = make()
    wp_rec, pp_rec = _record(monkeypatch)
    monkeypatch.delenv("PREFILL_VALIDATE", raising=False)
    _bad_device_value(name, p)
    assert len(wp_rec.calls) + len(pp_rec.calls) == 1
    monkeypatch.setenv("PREFILL_VALIDATE", "1")
    with pytest.raises(ValueError) as info:
        _bad_device_value(name, p)
    msg = str(info.value)
    assert any(n in msg for n in ("max_seqlen", "max_input_len", "block_table", "b_loc")), msg
    assert len(wp_rec.calls) + len(pp_rec.calls) == 1, "launched despite failing validation"


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CALLS))
def test_gpu_cuda_graph_capture(name):
    """Each call (default path) is captured into a CUDA graph and replayed on fresh inputs."""
    make, call, reference = CALLS[name]
    p = make()
    call(p)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call(p)
    # new values in the same buffers, then replay
    p.c.q.copy_(torch.randn(p.c.q.shape, device=DEVICE).to(p.c.q.dtype))
    poison(out)
    graph.replay()
    torch.cuda.synchronize()
    res = compare(out, reference(p))
    assert res, res
