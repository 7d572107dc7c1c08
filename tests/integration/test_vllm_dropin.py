"""Both ``context_attention_fwd`` functions are exact drop-ins for vLLM 0.33's.

* Their signatures are vLLM's: every parameter of vLLM's function, in order, with its name, kind and
  default; ours only add keyword-only parameters after them (vLLM's own files).
* vLLM 0.33's own ``chunked_prefill_paged_decode`` (its decode kernel for the rows of one query, the
  prefix-prefill ``context_attention_fwd`` for the others, called by keyword with every vLLM option)
  runs with ours swapped in by the plugin and matches the float64 reference, on every row.
* ``is_block_table_ptr=True`` (a table of block addresses) reads the blocks the ids name;
  ``interleaved_v_pack_factor > 0`` raises ``NotImplementedError`` naming it (no vLLM files needed).

vLLM's files come from the vllm 0.33.0 wheel, assembled with the stand-ins of ``tests/vllm_standin``
(``python tests/vllm_standin/prepare.py``, or ``VLLM_WHEEL``); the tests that need them skip with the
reason where they cannot be had. On the CPU vLLM's decode kernel and ours run under the interpreter at
tiny sizes; the GPU cases cover the page classes, fp8 caches, windows, ALiBi, sinks and ``k=None``.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import DEVICE, poison
from it_cases import paged_case
from paged_cases import make_case
from vllm_standin import assemble, imported, source

import prefix_prefill
import prefix_prefill.launch as pp_iface
import window_prefill
from attn_reference import compare, dequantize, gather_paged, paged_prefix_attention
from prefix_prefill import vllm_plugin as pp_plugin

PP_MODULE = "vllm.v1.attention.ops.prefix_prefill"
WP_MODULE = "vllm.v1.attention.ops.triton_prefill_attention"
CHUNKED = "vllm.v1.attention.ops.chunked_prefill_paged_decode"
# vLLM's kernels compute inf - inf on masked lanes under the interpreter.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in subtract:RuntimeWarning")


@pytest.fixture(scope="session")
def vllm_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the stand-ins and vLLM 0.33's own attention files (skips where there is none)."""
    src, why = source()
    if src is None:
        pytest.skip(why)
    return assemble(src, tmp_path_factory.mktemp("vllm") / "tree")


@pytest.fixture
def vllm(vllm_tree: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """vLLM's files importable and freshly imported, the plugin's state reset; all undone afterwards."""
    monkeypatch.setattr(pp_plugin, "_state", {})
    monkeypatch.setenv("VLLM_CONFIGURE_LOGGING", "0")
    with imported(vllm_tree) as root:
        yield root


# ----------------------------------------------------------------------------- signatures
@pytest.mark.parametrize(
    ("module", "ours"),
    [(PP_MODULE, prefix_prefill.context_attention_fwd), (WP_MODULE, window_prefill.context_attention_fwd)],
    ids=["prefix", "window"],
)
def test_signatures_are_vllms(vllm, module, ours):
    theirs = list(
        inspect.signature(importlib.import_module(module).context_attention_fwd).parameters.values()
    )
    mine = list(inspect.signature(ours).parameters.values())
    assert len(theirs) > 10, theirs  # vLLM's file, not a stand-in
    as_vllm = [(p.name, p.kind, p.default) for p in mine[: len(theirs)]]
    assert as_vllm == [(p.name, p.kind, p.default) for p in theirs], module
    extra = mine[len(theirs) :]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in extra), extra


# ----------------------------------------------------------------------------- vLLM's options
def test_interleaved_v_cache_raises_naming_it():
    p = paged_case(torch.float16, DEVICE)
    o = poison(torch.empty_like(p.q))
    with pytest.raises(NotImplementedError, match="interleaved_v_pack_factor=8") as info:
        prefix_prefill.context_attention_fwd(*p.vllm_args(o), interleaved_v_pack_factor=8)
    assert pp_plugin.ENV_VAR in str(info.value)  # how to get vLLM's own kernel back under the plugin
    assert torch.isnan(o).all()  # nothing ran


def _addresses(block_table: torch.Tensor, k_cache: torch.Tensor) -> torch.Tensor:
    """vLLM's ``is_block_table_ptr`` table: each entry the address of its block in ``k_cache``."""
    return k_cache.data_ptr() + block_table.to(torch.int64) * (k_cache.stride(0) * k_cache.element_size())


def test_block_table_of_addresses():
    c = make_case([(9, 5), (0, 7), (18, 3)], num_heads=2, num_kv_heads=1, head_size=32, page=4,
                  dtype=torch.float16, device=DEVICE, table_pad=0)  # fmt: skip
    table = _addresses(c.block_table, c.k_cache)
    table[1, -1] = 0  # 0 pads a row (vLLM keeps entries <= 0 as they are)
    one = torch.ones(1, device=DEVICE)
    o = poison(torch.empty_like(c.q))
    prefix_prefill.context_attention_fwd(
        c.q, c.k, c.v, o, "auto", c.k_cache, c.v_cache, table, c.cu_seqlens_q, c.seq_lens, None,
        c.max_query_len, one, one, is_block_table_ptr=True, validate=True,
    )  # fmt: skip
    ref = paged_prefix_attention(
        c.q, c.k, c.v, c.k_cache, c.v_cache, c.block_table, c.cu_seqlens_q, c.seq_lens, layout="split"
    )
    res = compare(o, ref)
    assert res, res
    with pytest.raises(TypeError, match="b_loc must be int64"):
        prefix_prefill.context_attention_fwd(
            c.q, c.k, c.v, o, "auto", c.k_cache, c.v_cache, c.block_table, c.cu_seqlens_q, c.seq_lens, None,
            c.max_query_len, one, one, is_block_table_ptr=True,
        )  # fmt: skip


# ----------------------------------------------------------------------- vLLM's chunked_prefill_paged_decode
class _Forbidden:
    """Stands for vLLM's own prefill kernels: launching one fails the test."""

    def __getitem__(self, grid: object) -> object:
        raise AssertionError("vLLM's own prefix-prefill kernel ran: ours was not swapped in")


class _Counting:
    """Wraps our Triton kernel: counts ``kernel[grid](...)`` launches (the Gluon kernels' runs are counted
    by :func:`_count_gluon`)."""

    def __init__(self, real: object) -> None:
        self.real, self.launches = real, 0

    def __getitem__(self, grid: tuple) -> object:
        self.launches += 1
        return self.real[grid]


def _count_gluon(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """A list that gets one entry for each call ``prefix_prefill.gluon_launch.launch`` ran its kernel."""
    import prefix_prefill.gluon_launch as gluon_launch

    ran: list[bool] = []
    real = gluon_launch.launch

    def counted(*args, **kwargs):
        ok = real(*args, **kwargs)
        if ok:
            ran.append(True)
        return ok

    monkeypatch.setattr(gluon_launch, "launch", counted)
    return ran


def _decode_tile(page: int) -> int:
    """The key tile of vLLM's decode kernel: it reads the block table of a whole last tile, unmasked."""
    return min(page, 128) if page & (page - 1) == 0 else 32


def _chunked_case(seqs, *, heads, kv_heads, head_size, page, dtype, cache, kv_none, seed=0):
    """A vLLM batch whose new tokens are already in the cache, as vLLM writes them before attention:
    the case, its ``key``/``value`` (None with ``kv_none``, else the new tokens' cache entries
    dequantised to ``dtype``), the block table (as wide as vLLM's decode kernel reads, 0-padded) and the
    cache's fp8 type (None for a ``dtype`` cache)."""
    gen = torch.Generator().manual_seed(seed)
    fp8 = {"auto": None, "fp8": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}[cache]
    c = make_case(seqs, num_heads=heads, num_kv_heads=kv_heads, head_size=head_size, page=page, dtype=dtype,
                  device=DEVICE, kv_from_cache=True, cache_dtype=fp8, table_pad=0, k_scale=0.5, v_scale=0.25,
                  gen=gen)  # fmt: skip
    if fp8 is not None:  # as vLLM's: uint8 (its decode kernel asserts uint8 or the platform's e4m3)
        c.k_cache, c.v_cache = c.k_cache.view(torch.uint8), c.v_cache.view(torch.uint8)
    tile = _decode_tile(page)
    width = max(((-(-(ctx + n) // tile) * tile) - 1) // page + 1 for ctx, n in seqs)
    table = torch.zeros(len(seqs), max(width, c.block_table.shape[1]), dtype=torch.int32, device=DEVICE)
    table[:, : c.block_table.shape[1]] = c.block_table
    key = value = None
    if not kv_none:
        lens = [a + b for a, b in seqs]
        ks, vs = (
            dequantize(gather_paged(cache_t, table, lens, layout="split", role=role), scale, fp8_dtype=fp8)
            for cache_t, role, scale in ((c.k_cache, "k", c.k_scale), (c.v_cache, "v", c.v_scale))
        )
        at, rows = 0, []
        for ctx, n in seqs:
            rows.append(torch.arange(at + ctx, at + ctx + n))
            at += ctx + n
        rows = torch.cat(rows)
        key, value = ks[rows].to(device=DEVICE, dtype=dtype), vs[rows].to(device=DEVICE, dtype=dtype)
    return c, key, value, table, fp8


def _run_chunked(monkeypatch, seqs=((20, 1), (0, 5), (13, 7), (33, 1)), *, heads=2, kv_heads=1,
                 head_size=32, page=16, dtype=torch.float16, cache="auto", window=None, alibi=False,
                 sinks=False, kv_none=False, causal=True, out_fp8=False):  # fmt: skip
    """vLLM's ``chunked_prefill_paged_decode`` (imported: the ``vllm`` fixture) with ours swapped in by the
    plugin, on a fresh batch of ``seqs`` (``(context, query)`` lengths; query 1 = a decode row), against
    the float64 reference."""
    monkeypatch.setenv(pp_plugin.ENV_VAR, "1")
    chunked = importlib.import_module(CHUNKED)
    theirs = importlib.import_module(PP_MODULE)
    pp_plugin.register()
    assert chunked.context_attention_fwd is prefix_prefill.context_attention_fwd
    monkeypatch.setattr(theirs, "_fwd_kernel", _Forbidden())
    monkeypatch.setattr(theirs, "_fwd_kernel_alibi", _Forbidden())
    ours = _Counting(pp_iface._fwd_kernel)
    monkeypatch.setattr(pp_iface, "_fwd_kernel", ours)
    gluon_runs = _count_gluon(monkeypatch)

    c, key, value, table, fp8 = _chunked_case(
        list(seqs), heads=heads, kv_heads=kv_heads, head_size=head_size, page=page, dtype=dtype, cache=cache,
        kv_none=kv_none,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    slopes = (torch.rand(heads, generator=gen) * 0.3).to(DEVICE) if alibi else None
    sink = torch.randn(heads, generator=gen).to(DEVICE) if sinks else None
    scale = lambda v: torch.tensor([v], dtype=torch.float32, device=DEVICE)  # noqa: E731
    out_scale = scale(0.25) if out_fp8 else None
    out = torch.empty(c.q.shape, dtype=torch.float8_e4m3fn if out_fp8 else dtype, device=DEVICE)
    poison(out)
    chunked.chunked_prefill_paged_decode(
        query=c.q, key=key, value=value, output=out, kv_cache_dtype=cache, key_cache=c.k_cache,
        value_cache=c.v_cache, block_table=table, query_start_loc=c.cu_seqlens_q, seq_lens=c.seq_lens,
        max_seq_len=max(a + b for a, b in seqs), max_query_len=c.max_query_len, k_scale=scale(c.k_scale),
        v_scale=scale(c.v_scale), alibi_slopes=slopes, sliding_window=window, sm_scale=None,
        output_scale=out_scale, sinks=sink, causal=causal,
    )  # fmt: skip
    assert ours.launches + len(gluon_runs) == 1  # the prefill rows: our kernel (Triton or Gluon), once
    ref = paged_prefix_attention(
        c.q, None, None, c.k_cache, c.v_cache, table, c.cu_seqlens_q, c.seq_lens, layout="split",
        causal=causal, window=(window - 1, -1) if window else (-1, -1), alibi_slopes=slopes, sinks=sink,
        k_scale=c.k_scale, v_scale=c.v_scale, fp8_dtype=fp8,
    )  # fmt: skip
    got = out
    if out_scale is not None:  # o = out / out_scale in fp8: compared at the reference's scale
        got = out.to(torch.float64) * float(out_scale)
    res = compare(got, ref, out.dtype)
    assert res, res
    return out


@pytest.mark.parametrize(
    ("dtype", "page", "opts"),
    [(torch.float16, 16, {}), (torch.float32, 6, {"window": 9, "kv_none": True})],
    ids=["fp16-page16", "fp32-page6-window-k_none"],
)
def test_vllm_chunked_prefill_paged_decode_runs_ours(vllm, monkeypatch, dtype, page, opts):
    _run_chunked(monkeypatch, dtype=dtype, page=page, **opts)


GPU_SEQS = ((0, 37), (700, 1), (1500, 300), (2100, 1), (90, 129), (5, 1))
GPU_CASES = {
    "page16": dict(page=16),
    "page16-bf16": dict(page=16, dtype=torch.bfloat16),
    "page24-window": dict(page=24, window=200),
    "page256-alibi": dict(page=256, alibi=True),
    "page544-sinks": dict(page=544, sinks=True),
    "page544-fp8": dict(page=544, cache="fp8"),
    "page1056-fp8-e5m2-bf16": dict(page=1056, cache="fp8_e5m2", dtype=torch.bfloat16),
    "page1056-k_none-window-sinks": dict(page=1056, kv_none=True, window=700, sinks=True),
    "page2048-k_none-alibi": dict(page=2048, kv_none=True, alibi=True),
    "page32-noncausal": dict(page=32, causal=False),
    "page544-fp8-out": dict(page=544, cache="fp8", out_fp8=True),
    "page16-head80": dict(page=16, head_size=80),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(GPU_CASES))
def test_gpu_vllm_chunked_prefill_paged_decode_runs_ours(vllm, monkeypatch, name):
    opts = {"heads": 8, "kv_heads": 2, "head_size": 128, "dtype": torch.float16, **GPU_CASES[name]}
    _run_chunked(monkeypatch, GPU_SEQS, **opts)
