"""The warp-specialised Gluon kernels of prefix-prefill (prefix_prefill.gluon_kernel: NHD and vLLM's
split layout) and their dispatch.

CPU: which calls the launcher hands to them (never under the interpreter, the split layout only with
``_GLUON_SPLIT`` and gather-friendly strides, never fp8 caches, windows, ALiBi, sinks, soft-capping,
skip_decode, pages that are not multiples of 16 or non-contiguous NHD pages), the split kernel's
transposed new-token V, and that both compile for sm90 with the installed Triton (a subprocess: no
GPU needed) within one program's shared memory. sm90 GPU: against the float64 reference into
NaN-poisoned outputs for every page-size class (16 .. 2048, powers of two or not), heads 64/128/256,
both 16-bit dtypes, ragged batches with empty contexts and one-token queries, k given or read from
the cache, GQA, the LSE; every cache slot no query may see is NaN and block-table entries past a
sequence's need point outside the cache; a count proves the kernel ran; negative controls; no
recompiles; CUDA-graph replay.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from conftest import (
    DEVICE,
    compile_gluon_for_sm90,
    compiled_variants,
    count_gluon_launches,
    needs_sm90,
    poison,
    refuse_gluon,
)
from pp_cases import make_case, random_seqs, reference, run_py

import prefill_runtime as runtime
import prefill_runtime.host as host
import prefix_prefill.interface as itf
from attn_reference import compare
from paged_kv_offsets import describe_kv_cache
from prefix_prefill import prefix_prefill


@pytest.fixture
def gluon_launches(monkeypatch):
    """Launches the Gluon kernel took (``conftest.count_gluon_launches``)."""
    return count_gluon_launches(monkeypatch, itf)


# ------------------------------------------------------------------------- CPU
def _launch(case, **over):
    kc, vc = describe_kv_cache(case.k_cache, case.v_cache, case.layout)
    o = torch.empty_like(case.q)
    kw = dict(
        causal=True, left=-1, right=-1, scale=0.1, alibi_slopes=None, sinks=None, skip_decode=False,
        softcap=0.0, lse=None, arch="sm90",
    )  # fmt: skip
    kw.update(over)
    return itf._gluon_launch(
        case.q, case.k, case.v, o, case.k_cache, case.v_cache, kc, vc, case.block_table, case.cu_seqlens_q,
        case.seq_lens, case.max_query_len, **kw,
    )  # fmt: skip


@pytest.mark.parametrize(
    "what",
    ["interpreter", "split", "hnd", "fp32", "page_8", "window", "alibi", "sinks", "softcap", "skip_decode",
     "non_causal", "head_96"],
)  # fmt: skip
def test_gluon_not_taken(what, monkeypatch):
    """Calls the Gluon kernel does not take: ``_gluon_launch`` returns False before any launch (the split
    layout: with ``_GLUON_SPLIT`` off)."""
    monkeypatch.setattr(itf, "_GLUON_SPLIT", False)
    layout = {"split": "split", "hnd": "hnd"}.get(what, "nhd")
    dtype = torch.float32 if what == "fp32" else torch.float16
    page = 8 if what == "page_8" else 16
    head = 96 if what == "head_96" else 128
    case = make_case([(20, 5)], num_heads=2, num_kv_heads=1, head_size=head, page=page, dtype=dtype,
                     device="cpu", layout=layout)  # fmt: skip
    over = {
        "interpreter": {"arch": "interpreter"},
        "window": {"left": 8},
        "alibi": {"alibi_slopes": torch.ones(2)},
        "sinks": {"sinks": torch.zeros(2)},
        "softcap": {"softcap": 20.0},
        "skip_decode": {"skip_decode": True},
        "non_causal": {"causal": False},
    }.get(what, {})
    assert _launch(case, **over) is False


def test_gluon_not_taken_for_interleaved_pages():
    """A cache whose pages are not contiguous (vLLM's [num_blocks, 2, page, heads, dim] halves) cannot
    be one 2-D TMA view: the Triton kernel runs."""
    if itf._gluon_fwd_kernel is None:
        pytest.skip("this Triton has no Gluon")
    case = make_case([(40, 5)], num_heads=2, num_kv_heads=1, head_size=64, page=16, dtype=torch.float16,
                     device="cpu", layout="nhd")  # fmt: skip
    both = torch.stack([case.k_cache, case.v_cache], dim=1)  # [blocks, 2, page, heads, dim]
    case.k_cache, case.v_cache = both[:, 0], both[:, 1]
    assert _launch(case) is False


def _split_case(head=128, dtype=torch.bfloat16, page=16):
    return make_case([(40, 5)], num_heads=2, num_kv_heads=1, head_size=head, page=page, dtype=dtype,
                     device="cpu", layout="split")  # fmt: skip


def test_split_gather_strides():
    """Which split caches the Gluon split kernel's 16-byte gathers take: vLLM's 16-bit layout (x = 8),
    not a K cache with another ``x``, a V cache whose keys are not contiguous, a base or a stride that
    is not 16-byte aligned."""
    case = _split_case()
    kc, vc = describe_kv_cache(case.k_cache, case.v_cache, "split")
    assert itf._split_gather_strides(case.k_cache, case.v_cache, kc, vc) == (
        kc.stride_block,
        kc.stride_head,
        kc.stride_dim,
        vc.stride_block,
        vc.stride_head,
        vc.stride_dim,
    )
    nb, h, d, page = case.v_cache.shape
    k4 = torch.empty(nb, h, d // 4, page, 4, dtype=case.k_cache.dtype)  # x = 4
    v_slot2 = torch.empty(nb, h, d, page, 2, dtype=case.v_cache.dtype)[..., 0]  # keys 2 apart
    v_off = torch.empty(case.v_cache.numel() + 1, dtype=case.v_cache.dtype)[1:].view(case.v_cache.shape)
    big = torch.empty(nb, h, d, page + 4, dtype=case.v_cache.dtype)[..., :page]  # page stride 20: not 8
    for kcache, vcache in ((k4, case.v_cache), (case.k_cache, v_slot2), (case.k_cache, v_off),
                           (case.k_cache, big)):  # fmt: skip
        kc, vc = describe_kv_cache(kcache, vcache, "split")
        assert itf._split_gather_strides(kcache, vcache, kc, vc) is None


@pytest.mark.parametrize("lens", [[5, 0, 130, 1], [64, 64], [0], [37]])
def test_transposed_new_v(lens):
    """The split kernel's transposed new-token V: sequence ``s``'s token ``t`` at column ``col0[s] + t``
    of row ``kv_head * D + d``, every ``col0`` a multiple of 64 elements (128 bytes), rows of a
    multiple of 8 elements (16 bytes)."""
    hk, d = 2, 16
    v = torch.randn(sum(lens), hk, d)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    v_t, col0 = itf._transposed_new_v(v, cu)
    assert col0.dtype == torch.int32 and (col0 % 64 == 0).all() and v_t.shape[1] % 8 == 0
    assert v_t.shape[0] == hk * d
    for s, n in enumerate(lens):
        c = int(col0[s])
        got = v_t.view(hk, d, -1)[:, :, c : c + n]
        assert torch.equal(got, v[cu[s] : cu[s] + n].permute(1, 2, 0))


@pytest.mark.parametrize("lens", [[5, 0, 130, 1], [64, 64], [37]])
def test_split_new_k(lens):
    """The split kernel's copy of the new tokens' K (``_GLUON_SPLIT_K_TMA``): vLLM's split K layout with
    one page per KV head, ``[kv_heads, D/8, columns, 8]``, sequence ``s``'s token ``t`` at column
    ``col0[s] + t`` (the transposed V's columns)."""
    hk, d = 2, 32
    k = torch.randn(sum(lens), hk, d)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    k_t, col0 = itf._split_new_k(k, cu)
    _, v_col0 = itf._transposed_new_v(k, cu)
    assert torch.equal(col0, v_col0) and k_t.shape[0] == hk * d // 8 and k_t.shape[1] % 64 == 0
    for s, n in enumerate(lens):
        c = int(col0[s])
        got = k_t.view(hk, d // 8, -1, 8)[:, :, c : c + n]  # [hk, D/8, n, 8]
        assert torch.equal(got.permute(2, 0, 1, 3).reshape(n, hk, d), k[cu[s] : cu[s] + n])


class _RecordingKernel:
    """Stands in for a Gluon kernel on the CPU: ``kernel[grid](*args, **kwargs)`` records the call,
    ``kernel.warmup(*args, grid=grid, **kwargs)`` (a compile, no launch) in ``warmups``."""

    def __init__(self):
        self.calls = []
        self.warmups = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((grid, args, kwargs))

    def warmup(self, *args, grid, **kwargs):
        self.warmups.append((grid, args, kwargs))


def _record_split(monkeypatch, tiered=False, **switches) -> _RecordingKernel:
    """The split kernel replaced by a recorder, with ``interface._GLUON_SPLIT_<NAME>`` (or
    ``_GLUON_<NAME>`` for ``ONE_CONSUMER``) set from ``switches``, compile tiers (``_GLUON_TIERED``) off
    unless ``tiered``, with fresh state; skips when this Triton has no Gluon."""
    if itf._gluon_split_kernel is None:
        pytest.skip("this Triton has no Gluon")
    rec = _RecordingKernel()
    monkeypatch.setattr(itf, "_gluon_split_kernel", rec)
    monkeypatch.setattr(itf, "_GLUON_TIERED", tiered)
    monkeypatch.setattr(itf, "_TIERS", runtime.CompileTiers())
    for name, value in switches.items():
        attr = f"_GLUON_{name}" if name == "ONE_CONSUMER" else f"_GLUON_SPLIT_{name}"
        monkeypatch.setattr(itf, attr, value)
    return rec


_SPLIT_SWITCHES = [(False, False, False), (True, False, False), (False, True, False), (False, False, True)]


@pytest.mark.parametrize("v_tma,one,k_tma", _SPLIT_SWITCHES)
@pytest.mark.parametrize("head,from_cache", [(128, False), (256, False), (64, True)])
def test_split_launch_host_side(head, from_cache, v_tma, one, k_tma, monkeypatch):
    """The split kernel's host glue on the CPU (the kernel replaced by a recorder): it is taken, with the
    grid, the per-head constexprs (producer warps and registers, gather steps, ring slots, one 8-warp
    consumer with ``_GLUON_ONE_CONSUMER``), the V cache as a pointer or (``_GLUON_SPLIT_V_TMA``) a
    ``[D, 16]`` descriptor, and the transposed
    new-token V's descriptor and per-sequence columns when k is given."""
    rec = _record_split(monkeypatch, V_TMA=v_tma, ONE_CONSUMER=one, K_TMA=k_tma)
    case = make_case([(40, 5), (0, 19), (70, 130)], num_heads=4, num_kv_heads=2, head_size=head,
                     page=16, dtype=torch.bfloat16, device="cpu", layout="split",
                     kv_from_cache=from_cache)  # fmt: skip
    assert _launch(case) is True
    ((grid, args, kw),) = rec.calls
    bn = 64 if head == 256 else 128
    assert grid == (-(-case.max_query_len // 128), 4, 3)
    assert kw["BLOCK_N"] == bn and kw["KV_FROM_CACHE"] is from_cache and kw["V_TMA"] is v_tma
    assert kw["PRODUCER_WARPS"] == 2 and kw["PRODUCER_REGS"] == 32 and kw["NUM_STAGES"] == 2
    assert kw["ONE_CONSUMER"] is one and kw["num_warps"] == (8 if one else 4)
    assert kw["K_SUB"] == (16 if head == 256 else 64) and kw["V_TPR"] == bn // 8
    v_desc, v_cache_arg, v_col0 = args[2], args[4], args[8]
    assert list(v_desc.block_shape) == [head, 16 if v_tma else bn]
    if v_tma:
        assert list(v_cache_arg.block_shape) == [head, 16]
    else:
        assert v_cache_arg is case.v_cache
    if not from_cache:
        assert v_col0.tolist() == [0, 64, 128] and v_desc.base.shape[0] == 2 * head
    q_desc, k_desc, k_cache_arg = args[0], args[1], args[3]
    assert list(q_desc.block_shape) == [128 if one else 64, head]
    assert kw["K_TMA"] is k_tma and (kw["K_VIEW"] is None) is not k_tma
    if k_tma:  # K in [8, 64] boxes: the cache as [blocks * kv_heads * D/8, page * 8], k's copy alike
        box = [8, 64]
        assert list(k_cache_arg.block_shape) == box and list(k_desc.block_shape) == box
        assert k_cache_arg.shape == [case.k_cache.shape[0] * 2 * head // 8, 16 * 8]
        if not from_cache:
            assert k_desc.base.shape[0] == 2 * head // 8
    else:
        assert k_cache_arg is case.k_cache


@pytest.mark.parametrize("head", [128, 256])
def test_split_launch_tiers(head, monkeypatch):
    """``_GLUON_TIERED`` (the default): a key's first call launches the quick form (one 8-warp consumer
    partition with free waits, Q in one 128-row box) and compiles the full form in the background
    (``warmup``: two consumers, 4 warps, Q in 64-row boxes, on the caller's CUDA device); after
    ``finish_compiles`` the calls launch the full form; other lengths keep the key; inside a graph
    capture a full form never launched stays on the quick form; ``_GLUON_TIERED`` off: the full form
    at once, no background compile."""
    rec = _record_split(monkeypatch, tiered=True)
    monkeypatch.setattr(torch.cuda, "device", lambda dev: contextlib.nullcontext())
    capturing = []
    monkeypatch.setattr(host, "_capturing", lambda: bool(capturing))

    def case(seqs):
        return make_case(seqs, num_heads=4, num_kv_heads=2, head_size=head, page=16, dtype=torch.bfloat16,
                         device="cpu", layout="split")  # fmt: skip

    def quick(kw, args):
        return (
            kw["ONE_CONSUMER"] is True
            and kw["num_warps"] == 8
            and kw["FREE_WAITS"] is True
            and (list(args[0].block_shape) == [128, head])
        )

    assert _launch(case([(40, 5), (70, 130)])) is True
    assert itf.finish_compiles(timeout=30) is True
    ((_, args, kw),) = rec.calls
    assert quick(kw, args)
    ((grid, wargs, wkw),) = rec.warmups
    assert wkw["ONE_CONSUMER"] is False and wkw["num_warps"] == 4 and list(wargs[0].block_shape) == [64, head]
    assert wkw["FREE_WAITS"] is itf._GLUON_FREE_WAITS and grid == rec.calls[0][0]
    capturing.append(1)  # compiled but never launched: the quick form inside a capture
    assert _launch(case([(7, 300)])) is True and quick(rec.calls[-1][2], rec.calls[-1][1])
    capturing.clear()
    assert _launch(case([(3, 9), (500, 20), (0, 64)])) is True
    assert rec.calls[-1][2]["ONE_CONSUMER"] is False and list(rec.calls[-1][1][0].block_shape) == [64, head]
    capturing.append(1)  # loaded now: the full form inside a capture too
    assert _launch(case([(7, 300)])) is True and rec.calls[-1][2]["ONE_CONSUMER"] is False
    assert len(rec.warmups) == 1
    assert _launch(case([(40, 5)]), lse=torch.empty(4, 5)) is True  # another key: quick form again
    assert quick(rec.calls[-1][2], rec.calls[-1][1]) and rec.calls[-1][2]["RETURN_LSE"] is True
    itf.finish_compiles(timeout=30)
    monkeypatch.setattr(itf, "_GLUON_TIERED", False)
    monkeypatch.setattr(itf, "_TIERS", runtime.CompileTiers())
    n_warm = len(rec.warmups)
    assert _launch(case([(40, 5), (70, 130)])) is True and rec.calls[-1][2]["ONE_CONSUMER"] is False
    assert len(rec.warmups) == n_warm


@pytest.mark.parametrize("on", [False, True])
@pytest.mark.parametrize("head", [64, 128, 256])
def test_split_v_stages3(head, on, monkeypatch):
    """``_GLUON_SPLIT_V_STAGES3`` (candidate): three V slots (``V_STAGES=3``) beside two K slots, with K by
    TMA kept; off (the default): ``V_STAGES=0``, the V ring as long as the K ring."""
    rec = _record_split(monkeypatch, V_STAGES3=on)
    case = make_case([(40, 5), (70, 130)], num_heads=4, num_kv_heads=2, head_size=head, page=16,
                     dtype=torch.bfloat16, device="cpu", layout="split")  # fmt: skip
    assert _launch(case) is True
    ((_, _, kw),) = rec.calls
    assert kw["NUM_STAGES"] == 2 and kw["V_STAGES"] == (3 if on else 0)
    assert kw["K_TMA"] is (head in (128, 256))


@pytest.mark.parametrize("on", [False, True])
@pytest.mark.parametrize("head", [64, 128, 256])
def test_split_k_stages3(head, on, monkeypatch):
    """``_GLUON_SPLIT_K_STAGES3`` (candidate): with K by TMA (heads 128 / 256) three K slots beside two V
    slots (``NUM_STAGES=3, V_STAGES=2``); K gathered (head 64) or off: two of each (``V_STAGES=0``)."""
    rec = _record_split(monkeypatch, K_STAGES3=on)
    case = make_case([(40, 5), (70, 130)], num_heads=4, num_kv_heads=2, head_size=head, page=16,
                     dtype=torch.bfloat16, device="cpu", layout="split")  # fmt: skip
    assert _launch(case) is True
    ((_, _, kw),) = rec.calls
    three = on and head != 64
    assert kw["NUM_STAGES"] == (3 if three else 2) and kw["V_STAGES"] == (2 if three else 0)
    assert kw["K_TMA"] is (head in (128, 256))


@pytest.mark.parametrize("page,applies", [(16, True), (32, True), (64, True), (48, False), (128, False)])
def test_split_v_ids_first(page, applies, monkeypatch):
    """``_GLUON_SPLIT_V_IDS_FIRST`` (candidate): V gathered page by page (``V_TPR = page / 8``) with each
    block's block-table entries read first (``V_IDS_FIRST``), only for gathered V (head 128) and pages
    that divide the block (a run is then one page); off, or other pages: the default gathers."""
    rec = _record_split(monkeypatch, V_IDS_FIRST=True)
    case = make_case([(300, 5), (70, 130)], num_heads=4, num_kv_heads=2, head_size=128, page=page,
                     dtype=torch.bfloat16, device="cpu", layout="split")  # fmt: skip
    assert _launch(case) is True
    kw = rec.calls[-1][2]
    assert kw["V_IDS_FIRST"] is applies and kw["V_TPR"] == (page // 8 if applies else 16)
    assert kw["V_SUB"] == (max(16, 64 // (page // 8)) if applies else 16)
    monkeypatch.setattr(itf, "_GLUON_SPLIT_V_IDS_FIRST", False)
    assert _launch(case) is True
    assert rec.calls[-1][2]["V_IDS_FIRST"] is False and rec.calls[-1][2]["V_TPR"] == 16


@pytest.mark.parametrize("tpr", [0, 2, 4, 8, 16, 3])
@pytest.mark.parametrize("head", [128, 256])
def test_split_v_tpr(head, tpr, monkeypatch):
    """``_GLUON_SPLIT_V_TPR`` (candidate): threads along a feature row's keys in the V gathers, at most
    the block's ``BLOCK_N / 8`` (0: that, the default); the warps' feature rows per step follow
    (``V_SUB``); anything but 0 / 2 / 4 / 8 / 16 is a ValueError. Head 256 (V by TMA by default) with
    V gathered."""
    rec = _record_split(monkeypatch, V_TPR=tpr, V_TMA=False)
    case = make_case([(300, 5), (70, 130)], num_heads=4, num_kv_heads=2, head_size=head, page=16,
                     dtype=torch.bfloat16, device="cpu", layout="split")  # fmt: skip
    if tpr == 3:
        with pytest.raises(ValueError, match="_GLUON_SPLIT_V_TPR"):
            _launch(case)
        return
    assert _launch(case) is True
    kw = rec.calls[-1][2]
    full = 128 // 8 if head == 128 else 64 // 8
    want = min(tpr, full) if tpr else full
    assert kw["V_TMA"] is False and kw["V_TPR"] == want and kw["V_SUB"] == max(16, 64 // want)


@pytest.mark.parametrize("head", [64, 128, 256])
def test_split_k_one_warp(head, monkeypatch):
    """``_GLUON_SPLIT_K_ONE_WARP`` (candidate): with K by TMA (heads 128 / 256) ``K_ONE_WARP``; with K
    gathered (head 64) off (the gathers' layouts assume ``PRODUCER_WARPS``)."""
    rec = _record_split(monkeypatch, K_ONE_WARP=True)
    case = make_case([(300, 5), (70, 130)], num_heads=4, num_kv_heads=2, head_size=head, page=16,
                     dtype=torch.bfloat16, device="cpu", layout="split")  # fmt: skip
    assert _launch(case) is True
    kw = rec.calls[-1][2]
    assert kw["K_ONE_WARP"] is (head != 64) and kw["K_TMA"] is (head != 64)


@pytest.mark.parametrize("head", [64, 128, 256])
def test_split_v_one_warp(head, monkeypatch):
    """``_GLUON_SPLIT_V_ONE_WARP`` (on): only where V goes by TMA (head 256 by default)."""
    rec = _record_split(monkeypatch, V_ONE_WARP=True)
    case = make_case([(300, 5), (70, 130)], num_heads=4, num_kv_heads=2, head_size=head, page=16,
                     dtype=torch.bfloat16, device="cpu", layout="split")  # fmt: skip
    assert _launch(case) is True
    kw = rec.calls[-1][2]
    assert kw["V_ONE_WARP"] is (head == 256) and kw["V_TMA"] is (head == 256)


@pytest.mark.parametrize("runs_only", [False, True])
@pytest.mark.parametrize("page", [16, 544])
@pytest.mark.parametrize("head", [64, 128, 256])
def test_split_k_run_gather(head, page, runs_only, monkeypatch):
    """``_GLUON_SPLIT_K_RUN_GATHER`` (candidate): with K by wide boxes (heads 128 / 256) the kernel gets
    the K cache's pointer (not a descriptor) and ``K_RUN_GATHER``; ``_GLUON_SPLIT_K_RUNS_ONLY``
    (diagnostic): runs (``K_WIDE=2``) at every page; head 64 (K gathered): neither applies."""
    rec = _record_split(monkeypatch, K_RUN_GATHER=True, K_RUNS_ONLY=runs_only, K_CHUNK_MAJOR=False)
    case = make_case([(300, 5), (70, 130)], num_heads=4, num_kv_heads=2, head_size=head, page=page,
                     dtype=torch.bfloat16, device="cpu", layout="split")  # fmt: skip
    assert _launch(case) is True
    args, kw = rec.calls[-1][1], rec.calls[-1][2]
    wide = head in (128, 256)
    assert kw["K_RUN_GATHER"] is wide and kw["K_TMA"] is wide
    assert kw["K_WIDE"] == (0 if not wide else 2 if page == 16 or runs_only else 1)
    assert isinstance(args[3], torch.Tensor)  # the K cache itself (gathers), not a descriptor
    monkeypatch.setattr(itf, "_GLUON_SPLIT_K_RUN_GATHER", False)
    assert _launch(case) is True
    assert rec.calls[-1][2]["K_RUN_GATHER"] is False
    assert isinstance(rec.calls[-1][1][3], torch.Tensor) is not wide


@pytest.mark.parametrize("setting", [None, True, False])
@pytest.mark.parametrize("page", [16, 544])
@pytest.mark.parametrize("head", [64, 128, 256])
def test_split_k_chunk_major(head, page, setting, monkeypatch):
    """``_GLUON_SPLIT_K_CHUNK_MAJOR``: None (the default) on for the head sizes of
    ``_GLUON_SPLIT_K_CHUNK_MAJOR_HEADS`` (256) on a verified Triton (3.6), True at every head with K
    by wide boxes (128 / 256) on any Triton, False nowhere; on: ``K_CM``, the one-view consumer layout
    (stride between 8-key chunks: every feature group) and boxes spanning all ``D/8`` groups; head 64
    (K gathered): off; off: the part views and 8-group boxes."""
    rec = _record_split(monkeypatch, K_CHUNK_MAJOR=setting)
    monkeypatch.setattr(itf, "_cm_triton_verified", lambda: True)
    case = make_case([(300, 5), (70, 130)], num_heads=4, num_kv_heads=2, head_size=head, page=page,
                     dtype=torch.bfloat16, device="cpu", layout="split")  # fmt: skip
    assert _launch(case) is True
    kw = rec.calls[-1][2]
    assert itf._GLUON_SPLIT_K_CHUNK_MAJOR_HEADS == {256}
    wide = head in (128, 256) and (setting is True or (setting is None and head == 256))
    assert kw["K_CM"] is wide
    # the per-head rule only on a Triton where the fix was verified (3.6); True forces it anywhere
    monkeypatch.setattr(itf, "_cm_triton_verified", lambda: False)
    assert _launch(case) is True
    assert rec.calls[-1][2]["K_CM"] is (head in (128, 256) and setting is True)
    monkeypatch.setattr(itf, "_cm_triton_verified", lambda: True)
    if not wide and head != 64:
        bn = 64 if head == 256 else 128
        assert kw["K_VIEW"] == itf._k_chunk_view(bn) and kw["KR_desc"].block_shape == [2, 8, 64]
    if wide:
        bn = 64 if head == 256 else 128
        assert kw["K_VIEW"] == itf._k_full_view(bn, head) and kw["KR_desc"].block_shape == [2, head // 8, 64]
        assert (kw["KW_desc"] is None) is (page == 16)
        if page != 16:
            assert kw["KW_desc"].block_shape == [bn // 8, head // 8, 64]


@pytest.mark.parametrize("head", [64, 128, 256])
def test_split_k_tma_by_head(head, monkeypatch):
    """``_GLUON_SPLIT_K_TMA = None`` (the default): K by TMA boxes for the head sizes of
    ``_GLUON_SPLIT_K_TMA_HEADS`` (256, where the H200 measured it faster on every page), and with
    ``_GLUON_SPLIT_K_WIDE`` (pages % 16 == 0) for those of ``_GLUON_SPLIT_K_WIDE_HEADS`` too, gathers for
    the rest; a split cache that is not contiguous keeps the gathers at every head size."""
    # (the LEAN candidate only goes with K by TMA)
    rec = _record_split(monkeypatch, K_TMA=None, K_WIDE=False, K_TMA_LEAN=True)
    case = make_case([(40, 5), (70, 130)], num_heads=4, num_kv_heads=2, head_size=head, page=16,
                     dtype=torch.bfloat16, device="cpu", layout="split")  # fmt: skip
    assert _launch(case) is True
    assert rec.calls[-1][2]["K_TMA"] is (head in itf._GLUON_SPLIT_K_TMA_HEADS)
    assert rec.calls[-1][2]["K_LEAN"] is rec.calls[-1][2]["K_TMA"]
    assert itf._GLUON_SPLIT_K_TMA_HEADS == {256}
    # with 16-key runs and wide boxes (_GLUON_SPLIT_K_WIDE, pages % 16 == 0) head 128 takes it too
    monkeypatch.setattr(itf, "_GLUON_SPLIT_K_WIDE", True)
    assert _launch(case) is True
    kw = rec.calls[-1][2]
    assert kw["K_TMA"] is (head in (128, 256)) and kw["K_WIDE"] == (2 if head > 64 else 0)
    nb, hk, g, page, x = case.k_cache.shape  # a block stride with a gap: not one [rows, page * 8] view
    case.k_cache = torch.empty(nb, hk + 1, g, page, x, dtype=case.k_cache.dtype)[:, :hk].copy_(case.k_cache)
    assert _launch(case) is True
    assert rec.calls[-1][2]["K_TMA"] is False and rec.calls[-1][2]["K_LEAN"] is False


@pytest.mark.parametrize("head", [64, 128, 256])
def test_split_v_tma_by_head(head, monkeypatch):
    """``_GLUON_SPLIT_V_TMA = None`` (the default): V by ``[D, 16]`` TMA boxes for the head sizes of
    ``_GLUON_SPLIT_V_TMA_HEADS`` (256, where the H200 measured it faster on every page with K by TMA)
    when K goes by TMA, gathers otherwise; a V cache that is not contiguous keeps the gathers."""
    rec = _record_split(monkeypatch, V_TMA=None)
    case = make_case([(40, 5), (70, 130)], num_heads=4, num_kv_heads=2, head_size=head, page=16,
                     dtype=torch.bfloat16, device="cpu", layout="split")  # fmt: skip
    assert _launch(case) is True
    kw, args = rec.calls[-1][2], rec.calls[-1][1]
    assert itf._GLUON_SPLIT_V_TMA_HEADS == {256}
    assert kw["V_TMA"] is (head == 256) and kw["K_TMA"] is (head in (128, 256))
    if head == 256:
        assert list(args[4].block_shape) == [head, 16] and list(args[2].block_shape) == [head, 16]
    else:
        assert args[4] is case.v_cache
    monkeypatch.setattr(itf, "_GLUON_SPLIT_K_TMA", False)  # without K by TMA: V gathered too
    assert _launch(case) is True
    assert rec.calls[-1][2]["V_TMA"] is False
    monkeypatch.setattr(itf, "_GLUON_SPLIT_K_TMA", None)
    nb, hk, d, page = case.v_cache.shape  # a block stride with a gap: not one [rows, page] view
    case.v_cache = torch.empty(nb, hk + 1, d, page, dtype=case.v_cache.dtype)[:, :hk].copy_(case.v_cache)
    assert _launch(case) is True
    assert rec.calls[-1][2]["V_TMA"] is False and rec.calls[-1][1][4] is case.v_cache


@pytest.mark.parametrize("head", [128, 256])
def test_split_k_wide_routing(head, monkeypatch):
    """``_GLUON_SPLIT_K_WIDE`` (candidate, with K by TMA): the K cache seen as ``[page/8, blocks *
    kv_heads * D/8, 64]`` with strides ``[64, page * 8, 1]``, block ``[2, 8, 64]`` (16-key runs, kernel
    ``K_WIDE=2``) and for pages of at least a key block also ``[BLOCK_N/8, 8, 64]`` (one box per 64
    features of a block inside a page, ``K_WIDE=1``); the switch off launches without them (the
    part-major ring: ``_GLUON_SPLIT_K_CHUNK_MAJOR`` off, see ``test_split_k_chunk_major``)."""
    rec = _record_split(monkeypatch, K_TMA=True, K_CHUNK_MAJOR=False)
    bn = 64 if head == 256 else 128
    for page, on, mode in ((16, True, 2), (bn, True, 1), (1040, True, 1), (1040, False, 0)):
        monkeypatch.setattr(itf, "_GLUON_SPLIT_K_WIDE", on)
        case = make_case([(40, 5), (70, 130)], num_heads=4, num_kv_heads=2, head_size=head, page=page,
                         dtype=torch.bfloat16, device="cpu", layout="split")  # fmt: skip
        assert _launch(case) is True
        kw = rec.calls[-1][2]
        assert kw["K_TMA"] is True and kw["K_WIDE"] == mode
        assert (kw["KW_desc"] is None) is (mode != 1) and (kw["KR_desc"] is None) is (mode == 0)
        rows = case.k_cache.shape[0] * 2 * head // 8
        for d, keys in ((kw["KW_desc"], bn), (kw["KR_desc"], 16)):
            if d is not None:  # [page/8, rows, 64], strides [64, page * 8, 1], block [keys/8, 8, 64]
                assert list(d.shape) == [page // 8, rows, 64] and list(d.strides) == [64, page * 8, 1]
                assert list(d.block_shape) == [keys // 8, 8, 64]
                assert d.base.data_ptr() == case.k_cache.data_ptr()


def test_split_not_taken_without_switch(monkeypatch):
    """``_GLUON_SPLIT`` off: the split layout goes to the Triton kernel (no launch is tried)."""
    monkeypatch.setattr(itf, "_GLUON_SPLIT", False)
    assert _launch(_split_case()) is False


# Triton 3.6 builds a C launcher per kernel signature; prefill_runtime's prebuild guesses its source
# (every descriptor argument lowered to a TMA descriptor): the guess must equal Triton's own.
_LAUNCHER_CHECK = """
try:
    from triton.backends.nvidia.driver import make_launcher
except ImportError:  # Triton >= 3.7 launches every kernel through one generic launcher
    make_launcher = None


def check_launcher_guess(fn, src, kernel):
    if make_launcher is None:
        return
    names = fn.arg_names
    consts_i = {(names.index(n),) if isinstance(n, str) else n: v for n, v in src.constants.items()}
    meta = kernel.metadata.tensordesc_meta
    guess = [{} for t in src.signature.values() if str(t).startswith("tensordesc")]
    assert meta and len(meta) == len(guess), meta
    sig_i = dict(src.signature)
    assert make_launcher(consts_i, sig_i, meta) == make_launcher(consts_i, sig_i, guess)
    print("launcher source matches")
"""

_COMPILE_SCRIPT = (
    _LAUNCHER_CHECK
    + """
import prefix_prefill.interface as itf

# head, box, new tokens from the cache, vector ids, one copy for a block inside a page, ring slots
CASES = ((128, 16, False, False, True, 2), (256, 64, True, False, True, 2), (128, 16, False, True, True, 2),
         (256, 16, False, False, False, 2), (128, 16, True, False, False, 2))
for head, box, from_cache, vector_ids, in_page, stages in CASES:
    bn = 64 if head == 256 else 128
    lq = gl.NVMMASharedLayout.get_default_for([64, head], gl.bfloat16)
    lk = gl.NVMMASharedLayout.get_default_for([bn, head], gl.bfloat16)
    lb = gl.NVMMASharedLayout.get_default_for([box, head], gl.bfloat16)
    sig = {
        "Q_desc": f"tensordesc<bf16[64, {head}],{lq!r}>",
        "K_desc": f"tensordesc<bf16[{bn}, {head}],{lk!r}>",
        "V_desc": f"tensordesc<bf16[{bn}, {head}],{lk!r}>",
        "KC_desc": f"tensordesc<bf16[{box}, {head}],{lb!r}>",
        "VC_desc": f"tensordesc<bf16[{box}, {head}],{lb!r}>",
        "KCB_desc": f"tensordesc<bf16[{bn}, {head}],{lk!r}>",
        "VCB_desc": f"tensordesc<bf16[{bn}, {head}],{lk!r}>", "O": "*bf16", "BlockTable": "*i32",
        "CuSeqlensQ": "*i32", "SeqLens": "*i32", "qk_scale": "fp32", "group_size": "i32", "stride_ot": "i32",
        "stride_oh": "i32", "stride_bt": "i32", "page_size": "i32", "oob_row": "i32", "Lse": "constexpr",
        "stride_lse_h": "constexpr",
    }
    consts = dict(Lse=None, stride_lse_h=None, HEAD_DIM=head, BLOCK_M=128, BLOCK_N=bn, BOX=box,
                  KV_FROM_CACHE=from_cache, RETURN_LSE=False, NUM_STAGES=stages, VECTOR_IDS=vector_ids,
                  IN_PAGE_COPY=in_page, ONE_CONSUMER=False)
    src, kernel = compile_sm90(itf._gluon_fwd_kernel, sig, consts)
    n_wgmma = kernel.asm["ptx"].count("wgmma.mma_async")
    check_launcher_guess(itf._gluon_fwd_kernel, src, kernel)
    if in_page and stages == 2 and not vector_ids:  # and as one 8-warp consumer partition (Q in one box)
        lq1 = gl.NVMMASharedLayout.get_default_for([128, head], gl.bfloat16)
        sig1 = dict(sig, Q_desc=f"tensordesc<bf16[128, {head}],{lq1!r}>")
        _, kernel = compile_sm90(itf._gluon_fwd_kernel, sig1, dict(consts, ONE_CONSUMER=True), num_warps=8)
        assert kernel.asm["ptx"].count("wgmma.mma_async") * 2 <= n_wgmma, "the consumer is not compiled once"
"""
)


_SPLIT_COMPILE_SCRIPT = (
    _LAUNCHER_CHECK
    + """
import re

import prefix_prefill.interface as itf


def no_base_offsets(kernel):
    # the chunk-major ring's no-swizzle wgmma descriptors without a matrix-base offset (bits 49-51)
    for c in re.findall(r"(?:add|or)\\.[bsu]64\\s+%rd\\d+, %rd\\d+, (\\d+);", kernel.asm["ptx"]):
        assert int(c) >> 62 or not (int(c) >> 49) & 7, "a no-swizzle descriptor keeps its base offset"


lc = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)  # K chunks (K_TMA)
CASES = ((128, False, True, False, False), (256, False, False, False, False), (64, True, False, False, False),
         (128, True, False, False, False), (128, False, False, True, False), (256, True, False, True, False),
         (128, False, False, False, True), (256, True, False, False, True), (64, False, True, False, True))
for head, from_cache, lse, v_tma, k_tma in CASES:
    bn = 64 if head == 256 else 128
    lq = gl.NVMMASharedLayout.get_default_for([64, head], gl.bfloat16)
    lk = gl.NVMMASharedLayout.get_default_for([bn, head], gl.bfloat16)
    v_cols = 16 if v_tma else bn
    lv = gl.NVMMASharedLayout.get_default_for([head, v_cols], gl.bfloat16)
    k_chunk = f"tensordesc<bf16[8, 64],{lc!r}>"
    sig = {
        "Q_desc": f"tensordesc<bf16[64, {head}],{lq!r}>",
        "K_desc": k_chunk if k_tma else f"tensordesc<bf16[{bn}, {head}],{lk!r}>",
        "V_desc": f"tensordesc<bf16[{head}, {v_cols}],{lv!r}>", "K_cache": k_chunk if k_tma else "*bf16",
        "V_cache": f"tensordesc<bf16[{head}, 16],{lv!r}>" if v_tma else "*bf16",
        "O": "*bf16", "BlockTable": "*i32", "CuSeqlensQ": "*i32", "VCol0": "*i32", "SeqLens": "*i32",
        "qk_scale": "fp32", "group_size": "i32", "stride_ot": "i32", "stride_oh": "i32", "stride_bt": "i32",
        "page_size": "i32", "kc_block": "i32", "kc_head": "i32", "kc_group": "i32", "vc_block": "i64",
        "vc_head": "i32", "vc_dim": "i32", "Lse": "*fp32" if lse else "constexpr",
        "stride_lse_h": "i32" if lse else "constexpr",
    }
    consts = dict(HEAD_DIM=head, BLOCK_M=128, BLOCK_N=bn, KV_FROM_CACHE=from_cache, RETURN_LSE=lse,
                  NUM_STAGES=2, K_SUB=16 if head == 256 else 64, V_SUB=16, PRODUCER_REGS=32, V_TPR=bn // 8,
                  PRODUCER_WARPS=2, V_TMA=v_tma, ONE_CONSUMER=False, K_TMA=k_tma,
                  K_VIEW=itf._k_chunk_view(bn) if k_tma else None, K_LEAN=False)
    if not lse:
        consts.update(Lse=None, stride_lse_h=None)
    aligned = tuple(n for n, on in (("K_cache", not k_tma), ("V_cache", not v_tma)) if on)
    src, kernel = compile_sm90(itf._gluon_split_kernel, sig, consts, aligned=aligned)
    check_launcher_guess(itf._gluon_split_kernel, src, kernel)
    ptx = kernel.asm["ptx"]
    # 16-byte gathers only, and every producer thread arrives when its own copies land
    assert "cp.async.cg.shared.global" in ptx and "cp.async.ca.shared.global" not in ptx
    assert ptx.count("cp.async.mbarrier.arrive.noinc") == 2 - v_tma - k_tma
    if v_tma:  # candidate: a one-warp V producer
        compile_sm90(itf._gluon_split_kernel, sig, dict(consts, V_ONE_WARP=True), aligned=aligned)
    if k_tma:  # K in 8-key chunk boxes, read by wgmma without re-staging (no-swizzle descriptors)
        assert ptx.count("cp.async.bulk.tensor.2d") >= bn // 8 * head // 64
        compile_sm90(itf._gluon_split_kernel, sig, dict(consts, K_LEAN=True), aligned=aligned)  # candidate
        # candidate: a block inside one page as D/64 boxes [BLOCK_N/8, 8, 64] of a 3-D cache view
        lw = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=3)
        sigr = dict(sig, KR_desc=f"tensordesc<bf16[2, 8, 64],{lw!r}>")
        _, kw = compile_sm90(itf._gluon_split_kernel, sigr, dict(consts, K_WIDE=2), aligned=aligned)
        assert "cp.async.bulk.tensor.3d" in kw.asm["ptx"]
        sigw = dict(sigr, KW_desc=f"tensordesc<bf16[{bn // 8}, 8, 64],{lw!r}>")
        compile_sm90(itf._gluon_split_kernel, sigw, dict(consts, K_WIDE=1), aligned=aligned)
        # candidate: K blocks not inside one page gathered into the chunk ring (K_cache a pointer)
        sigg = dict(sigw, K_cache="*bf16")
        for mode in (1, 2):
            _, kg = compile_sm90(itf._gluon_split_kernel, sigg, dict(consts, K_WIDE=mode, K_RUN_GATHER=True),
                                 aligned=(*aligned, "K_cache"))  # fmt: skip
            ptx = kg.asm["ptx"]  # gathers; one-page blocks (K_WIDE=1) still by 3-D boxes
            assert "cp.async.cg.shared.global" in ptx and ("cp.async.bulk.tensor.3d" in ptx) is (mode == 1)
        # candidate: a one-warp K producer (runs: no partition barrier between boxes)
        compile_sm90(itf._gluon_split_kernel, sigr, dict(consts, K_WIDE=2, K_ONE_WARP=True), aligned=aligned)
        # candidate: a chunk-major K ring read as one [BLOCK_N, D] view, boxes spanning every feature
        g = head // 8
        sigc = dict(sig, KR_desc=f"tensordesc<bf16[2, {g}, 64],{lw!r}>",
                    KW_desc=f"tensordesc<bf16[{bn // 8}, {g}, 64],{lw!r}>")  # fmt: skip
        for mode in (1, 2):
            cc = dict(consts, K_WIDE=mode, K_CM=True, K_ONE_WARP=True, K_VIEW=itf._k_full_view(bn, head))
            _, kc = compile_sm90(itf._gluon_split_kernel, sigc, cc, aligned=aligned)
            no_base_offsets(kc)
        if head == 256:  # the first call's quick form (one 8-warp consumer, LLVM at O0, free waits) too
            lq1 = gl.NVMMASharedLayout.get_default_for([128, head], gl.bfloat16)
            sigq = dict(sigc, Q_desc=f"tensordesc<bf16[128, {head}],{lq1!r}>")
            cq = dict(consts, K_WIDE=2, K_CM=True, K_ONE_WARP=True, K_VIEW=itf._k_full_view(bn, head),
                      ONE_CONSUMER=True)  # fmt: skip
            no_base_offsets(compile_sm90(itf._gluon_split_kernel, sigq, cq, aligned=aligned, num_warps=8,
                                         llvm_o0=True, free_waits=True)[1])  # fmt: skip
        if head == 128:  # candidate: V gathered in 64- / 32-key runs (4 / 8 features a warp copy)
            for tpr in (8, 4):
                compile_sm90(itf._gluon_split_kernel, sigw, dict(consts, K_WIDE=1, V_TPR=tpr),
                             aligned=aligned)  # fmt: skip
        if head == 128:  # candidate: V page by page, each block's block-table entries first (page 16)
            compile_sm90(itf._gluon_split_kernel, sigw, dict(consts, K_WIDE=1, V_TPR=2, V_SUB=32,
                                                             V_IDS_FIRST=True), aligned=aligned)  # fmt: skip
        # candidate: three V slots (224 KiB with Q at heads 128 and 256)
        compile_sm90(itf._gluon_split_kernel, sigw, dict(consts, K_WIDE=1, V_STAGES=3), aligned=aligned)
        # candidate: three K slots, two V slots (224 KiB with Q at head 256), runs by the one-warp producer
        k3 = dict(consts, K_WIDE=2, K_ONE_WARP=True, NUM_STAGES=3, V_STAGES=2)
        compile_sm90(itf._gluon_split_kernel, sigr, k3, aligned=aligned)
        _, kf = compile_sm90(itf._gluon_split_kernel, sigr, dict(consts, K_WIDE=2, K_IDS_FIRST=True),
                             aligned=aligned)  # candidate: a block's runs read their block ids first
        assert "cp.async.bulk.tensor.3d" in kf.asm["ptx"]
    if head == 128 and not from_cache and not k_tma:  # and as one 8-warp consumer partition (Q in one box)
        lq1 = gl.NVMMASharedLayout.get_default_for([128, head], gl.bfloat16)
        sig1 = dict(sig, Q_desc=f"tensordesc<bf16[128, {head}],{lq1!r}>")
        compile_sm90(itf._gluon_split_kernel, sig1, dict(consts, ONE_CONSUMER=True), aligned=aligned,
                     num_warps=8)  # fmt: skip
"""
)


_FREE_WAITS_SCRIPT = """
import ast, re
import prefill_runtime.host as host
import prefix_prefill.interface as itf

path, _ = host.free_wait_lines()
with open(path) as f:
    tree = ast.parse(f.read())
spans = {n.name: (n.lineno, n.end_lineno) for n in tree.body if isinstance(n, ast.FunctionDef)}
BARRIER = re.compile(r"^\\s*(?:bar|barrier)\\.sync", re.M)
STORE = re.compile(r"^\\s*(?:st\\.shared|stmatrix|atom\\.shared|red\\.shared)")


def check_free(plain, free):
    # fewer barriers, none left before a free wait, and the soundness condition of free_wait: the
    # runtime's device code writes shared memory only in zero_v_rows (no layout conversion through
    # shared memory in the consumer)
    n_plain, n_free = len(BARRIER.findall(plain)), len(BARRIER.findall(free))
    # (Triton 3.6 puts a barrier before each; 3.8 before none of them)
    assert n_free <= n_plain and host.drop_wait_barriers(free)[1] == 0, (n_plain, n_free)
    files = {int(m.group(1)) for m in host._PTX_FILE.finditer(free) if host._same_file(m.group(2), path)}
    loc, lo, hi = None, *spans["zero_v_rows"]
    for line in free.splitlines():
        m = host._PTX_LOC.match(line)
        if m:
            loc = (int(m.group(1)), int(m.group(2)))
        elif STORE.match(line) and loc is not None and loc[0] in files:
            assert lo <= loc[1] <= hi, (line, loc)
    print("barriers", n_plain, "->", n_free)


for head in (128, 256):
    bn = 64 if head == 256 else 128
    for one in (False, True):
        rows = 128 if one else 64
        lq = gl.NVMMASharedLayout.get_default_for([rows, head], gl.bfloat16)
        lk = gl.NVMMASharedLayout.get_default_for([bn, head], gl.bfloat16)
        warps = 8 if one else 4
        if head == 128:  # the NHD kernel
            lb = gl.NVMMASharedLayout.get_default_for([16, head], gl.bfloat16)
            sig = {
                "Q_desc": f"tensordesc<bf16[{rows}, {head}],{lq!r}>",
                "K_desc": f"tensordesc<bf16[{bn}, {head}],{lk!r}>",
                "V_desc": f"tensordesc<bf16[{bn}, {head}],{lk!r}>",
                "KC_desc": f"tensordesc<bf16[16, {head}],{lb!r}>",
                "VC_desc": f"tensordesc<bf16[16, {head}],{lb!r}>",
                "KCB_desc": f"tensordesc<bf16[{bn}, {head}],{lk!r}>",
                "VCB_desc": f"tensordesc<bf16[{bn}, {head}],{lk!r}>", "O": "*bf16", "BlockTable": "*i32",
                "CuSeqlensQ": "*i32", "SeqLens": "*i32", "qk_scale": "fp32", "group_size": "i32",
                "stride_ot": "i32", "stride_oh": "i32", "stride_bt": "i32", "page_size": "i32",
                "oob_row": "i32",
                "Lse": "constexpr", "stride_lse_h": "constexpr",
            }
            consts = dict(Lse=None, stride_lse_h=None, HEAD_DIM=head, BLOCK_M=128, BLOCK_N=bn, BOX=16,
                          KV_FROM_CACHE=False, RETURN_LSE=False, NUM_STAGES=2, ONE_CONSUMER=one)
            fn, aligned = itf._gluon_fwd_kernel, ()
        else:  # the split kernel as shipped at head 256: K and V by TMA
            lc = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
            lv = gl.NVMMASharedLayout.get_default_for([head, 16], gl.bfloat16)
            k_chunk = f"tensordesc<bf16[8, 64],{lc!r}>"
            sig = {
                "Q_desc": f"tensordesc<bf16[{rows}, {head}],{lq!r}>", "K_desc": k_chunk,
                "V_desc": f"tensordesc<bf16[{head}, 16],{lv!r}>", "K_cache": k_chunk,
                "V_cache": f"tensordesc<bf16[{head}, 16],{lv!r}>", "O": "*bf16", "BlockTable": "*i32",
                "CuSeqlensQ": "*i32", "VCol0": "*i32", "SeqLens": "*i32", "qk_scale": "fp32",
                "group_size": "i32", "stride_ot": "i32", "stride_oh": "i32", "stride_bt": "i32",
                "page_size": "i32", "kc_block": "i32", "kc_head": "i32", "kc_group": "i32", "vc_block": "i64",
                "vc_head": "i32", "vc_dim": "i32", "Lse": "*fp32", "stride_lse_h": "i32",
            }
            consts = dict(HEAD_DIM=head, BLOCK_M=128, BLOCK_N=bn, KV_FROM_CACHE=False, RETURN_LSE=True,
                          NUM_STAGES=2, K_SUB=16, V_SUB=16, PRODUCER_REGS=32, V_TPR=bn // 8, PRODUCER_WARPS=2,
                          V_TMA=True, ONE_CONSUMER=one, K_TMA=True, K_VIEW=itf._k_chunk_view(bn),
                          K_LEAN=False)
            fn, aligned = itf._gluon_split_kernel, ()
        _, plain = compile_sm90(fn, sig, consts, aligned=aligned, num_warps=warps)
        _, free = compile_sm90(fn, sig, consts, aligned=aligned, num_warps=warps, free_waits=True)
        check_free(plain.asm["ptx"], free.asm["ptx"])
"""


def test_gluon_free_waits_compile_for_sm90():
    """``FREE_WAITS`` (candidate): both Gluon prefix kernels, with two consumer warpgroups or one 8-warp
    consumer partition, compile for sm90 with fewer barriers, none left before a wait of
    ``prefill_runtime.gluon.free_wait``, and with no shared-memory store in the runtime's device code
    outside ``zero_v_rows`` (the condition under which those barriers are not needed)."""
    if itf._gluon_split_kernel is None:
        pytest.skip("this Triton has no Gluon")
    shared, out = compile_gluon_for_sm90(_FREE_WAITS_SCRIPT)
    assert len(shared) == 8 and out.count("barriers ") == 4 and max(shared) <= 227 * 1024, out


def test_gluon_split_kernel_compiles_for_sm90():
    """The split-layout kernel compiles for sm90 (no GPU needed) with 16-byte ``cp.async`` gathers only
    (16-byte alignment of every gather proven to the compiler), within one program's shared memory."""
    if itf._gluon_split_kernel is None:
        pytest.skip("this Triton has no Gluon")
    shared, out = compile_gluon_for_sm90(_SPLIT_COMPILE_SCRIPT)
    assert len(shared) == 50 and max(shared) <= 227 * 1024, out


def test_gluon_kernel_compiles_for_sm90():
    """The kernel compiles for sm90 with the installed Triton (no GPU needed) in one program's shared
    memory (227 KiB), as one 8-warp consumer partition too (with half the wgmma instructions: the
    consumer compiled once); on Triton 3.6 the launcher-source guess of prefill_runtime's prebuild
    matches."""
    if itf._gluon_fwd_kernel is None:
        pytest.skip("this Triton has no Gluon")
    shared, out = compile_gluon_for_sm90(_COMPILE_SCRIPT)
    assert len(shared) == 7 and max(shared) <= 227 * 1024, out


# ------------------------------------------------------------------------- GPU (sm90)
def _nan_unused_slots(case) -> None:
    """NaN into every cache slot no query may read: past each sequence's cached tokens in its pages,
    and every block no sequence owns (NHD or vLLM's split layout)."""
    page = case.page
    split = case.layout == "split"
    cached = [c + (n if case.k is None else 0) for c, n in zip(case.ctx_lens, case.q_lens, strict=True)]
    used = set()
    table = case.block_table.cpu()
    for b, n in enumerate(cached):
        for pg in range(math.ceil(n / page)):
            blk = int(table[b, pg])
            used.add(blk)
            lo = n - pg * page
            if lo < page and split:
                case.k_cache[blk, :, :, lo:] = float("nan")
                case.v_cache[blk, :, :, lo:] = float("nan")
            elif lo < page:
                case.k_cache[blk, lo:] = float("nan")
                case.v_cache[blk, lo:] = float("nan")
    for blk in range(case.k_cache.shape[0]):
        if blk not in used:
            case.k_cache[blk] = float("nan")
            case.v_cache[blk] = float("nan")


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("page", [16, 32, 128, 544, 1040, 1056, 2048])
@pytest.mark.parametrize("head,dtype", [(128, torch.bfloat16), (256, torch.float16), (64, torch.bfloat16)])
@pytest.mark.parametrize("from_cache", [False, True])
@pytest.mark.parametrize("layout", ["nhd", "split"])
def test_gpu_gluon_pages(layout, page, head, dtype, from_cache, gluon_launches):
    """Both Gluon kernels (NHD: TMA page runs; vLLM's split layout: cp.async gathers, the new tokens' V
    transposed on the host): every page class, heads 64 / 128 / 256, both 16-bit dtypes, k given or
    read from the cache, ragged batches with empty contexts and one-token queries, GQA, the LSE, NaN
    in every slot no query may read."""
    seqs = [*random_seqs(4, 2500, 600), (0, 300), (1700, 1), (129, 128), (37, 93)]
    case = make_case(seqs, num_heads=8, num_kv_heads=2, head_size=head, page=page, dtype=dtype, device=DEVICE,
                     layout=layout, kv_from_cache=from_cache)  # fmt: skip
    ref, ref_lse = reference(case, return_lse=True)
    _nan_unused_slots(case)
    out = poison(torch.empty_like(case.q))
    lse = poison(torch.empty(case.q.shape[1], case.q.shape[0], dtype=torch.float32, device=DEVICE))
    prefix_prefill(case.q, case.k, case.v, case.k_cache, case.v_cache, case.block_table, case.cu_seqlens_q,
                   case.seq_lens, case.max_query_len, kv_layout=layout, out=out, return_lse=True, lse=lse,
                   validate=True)  # fmt: skip
    assert len(gluon_launches) == 1, "the Gluon kernel did not run"
    c = compare(out, ref)
    assert c, c
    assert torch.isfinite(lse).all()
    assert (lse.double() - ref_lse).abs().max().item() < 1e-3


# The candidate switches the GPU A/B test runs: (layout, switch) -> head sizes. ``A+B``: both switches;
# ``NAME=N``: an int setting.
_GPU_CANDIDATES = {
    ("nhd", "_GLUON_VECTOR_IDS"): (128,),
    ("nhd", "_GLUON_UNIFORM_BOX"): (128, 256),
    ("split", "_GLUON_SPLIT_STAGES3"): (128,),
    ("split", "_GLUON_SPLIT_ONE_WARP"): (256,),
    ("split", "_GLUON_SPLIT_PAGE_ROWS"): (128, 256),
    ("split", "_GLUON_SPLIT_V_TMA"): (128, 256),
    ("split", "_GLUON_SPLIT_K_TMA"): (64, 128, 256),
    ("split", "_GLUON_SPLIT_K_TMA_LEAN"): (128, 256),
    ("split", "_GLUON_SPLIT_K_WIDE"): (128, 256),
    ("split", "_GLUON_SPLIT_K_IDS_FIRST"): (128, 256),
    ("split", "_GLUON_SPLIT_V_STAGES3"): (128, 256),
    ("nhd", "_GLUON_ONE_CONSUMER"): (128, 256),
    ("split", "_GLUON_ONE_CONSUMER"): (128,),
    ("nhd", "_GLUON_FREE_WAITS"): (128, 256),
    ("split", "_GLUON_FREE_WAITS"): (128, 256),
    ("nhd", "_GLUON_ONE_CONSUMER+_GLUON_FREE_WAITS"): (128, 256),
    ("split", "_GLUON_ONE_CONSUMER+_GLUON_FREE_WAITS"): (128, 256),
    ("split", "_GLUON_SPLIT_V_IDS_FIRST"): (128,),
    ("split", "_GLUON_SPLIT_V_TPR=8"): (128,),
    ("split", "_GLUON_SPLIT_V_TPR=4"): (128,),
    ("split", "_GLUON_SPLIT_K_RUN_GATHER"): (128, 256),
    ("split", "_GLUON_SPLIT_K_RUNS_ONLY"): (128,),
    ("split", "_GLUON_SPLIT_K_RUNS_ONLY+_GLUON_SPLIT_K_RUN_GATHER"): (128, 256),
    ("split", "_GLUON_SPLIT_K_ONE_WARP"): (128, 256),
    ("split", "_GLUON_SPLIT_V_ONE_WARP"): (256,),
    ("split", "_GLUON_SPLIT_K_STAGES3"): (128, 256),
    ("split", "_GLUON_SPLIT_K_CHUNK_MAJOR"): (128, 256),
    ("split", "_GLUON_SPLIT_K_CHUNK_MAJOR=0"): (256,),
}


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("page", [16, 1040, 32, 512])
@pytest.mark.parametrize("from_cache", [False, True])
@pytest.mark.parametrize(
    "layout,switch,head", [(lay, sw, h) for (lay, sw), heads in _GPU_CANDIDATES.items() for h in heads]
)
def test_gpu_gluon_candidates(layout, switch, head, page, from_cache, gluon_launches, monkeypatch):
    """The candidate switches: same answers, same NaN-filled unread slots. NHD: ``_GLUON_VECTOR_IDS``
    (a block's page-run ids read as one vector), ``_GLUON_UNIFORM_BOX`` (16-token copies for every
    block and page); split layout: ``_GLUON_SPLIT_STAGES3`` (three ring slots),
    ``_GLUON_SPLIT_ONE_WARP`` (one producer warp), ``_GLUON_SPLIT_PAGE_ROWS`` (V gathered page by page),
    ``_GLUON_SPLIT_V_TMA`` (V by 16-key TMA boxes), ``_GLUON_SPLIT_K_TMA`` (K by 8-key TMA boxes; with
    ``_GLUON_SPLIT_K_TMA_LEAN`` a one-warp K producer reading block ids as a vector, with
    ``_GLUON_SPLIT_K_WIDE`` a block inside one page as one box per 64 features, other blocks by 16-key
    runs, with ``_GLUON_SPLIT_K_IDS_FIRST`` those runs' block ids read before their boxes),
    ``_GLUON_SPLIT_V_STAGES3`` (three V slots, two K slots);
    ``_GLUON_SPLIT_V_IDS_FIRST`` (V page by page, each block's block-table entries read first),
    ``_GLUON_SPLIT_V_TPR=N`` (V gathered in ``8 N``-key runs), ``_GLUON_SPLIT_K_RUN_GATHER`` (K blocks
    not inside one page gathered into the TMA chunk ring), ``_GLUON_SPLIT_K_RUNS_ONLY`` (diagnostic:
    every context block as 16-key runs), ``_GLUON_SPLIT_K_ONE_WARP`` (a one-warp K producer),
    ``_GLUON_SPLIT_V_ONE_WARP`` (a one-warp V producer with V by TMA), ``_GLUON_SPLIT_K_STAGES3`` (three K
    slots, two V slots), ``_GLUON_SPLIT_K_CHUNK_MAJOR`` (a chunk-major K ring read as one view, a box per
    run or one-page block; ``=0``: the part-major ring where the default takes the chunk-major one);
    both: ``_GLUON_ONE_CONSUMER`` (one 8-warp consumer partition), ``_GLUON_FREE_WAITS`` (no partition
    barrier before the consumers' waits), ``A+B``: both switches."""
    for name in switch.split("+"):
        name, _, value = name.partition("=")  # NAME=N: an int setting
        monkeypatch.setattr(itf, name, int(value) if value else True)
    if switch in ("_GLUON_SPLIT_K_TMA_LEAN", "_GLUON_SPLIT_K_WIDE", "_GLUON_SPLIT_K_IDS_FIRST"):
        monkeypatch.setattr(itf, "_GLUON_SPLIT_K_TMA", True)
        monkeypatch.setattr(itf, "_GLUON_SPLIT_K_WIDE", switch != "_GLUON_SPLIT_K_TMA_LEAN")
    seqs = [*random_seqs(3, 2500, 500), (0, 200), (1300, 1)]
    case = make_case(seqs, num_heads=8, num_kv_heads=2, head_size=head, page=page, dtype=torch.bfloat16,
                     device=DEVICE, layout=layout, kv_from_cache=from_cache)  # fmt: skip
    ref = reference(case)
    _nan_unused_slots(case)
    c = compare(run_py(case), ref)
    assert c, c
    assert len(gluon_launches) == 1


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("layout", ["nhd", "split"])
def test_gpu_gluon_negative_control(layout, gluon_launches):
    """The harness catches a wrong kernel: another softmax scale differs from the reference."""
    case = make_case([(700, 300), (0, 200)], num_heads=4, num_kv_heads=1, head_size=128, page=16,
                     dtype=torch.bfloat16, device=DEVICE, layout=layout)  # fmt: skip
    wrong = run_py(case, softmax_scale=0.2)
    assert len(gluon_launches) == 1
    assert not compare(wrong, reference(case))


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("head", [128, 256])
@pytest.mark.parametrize("layout", ["nhd", "split"])
def test_gpu_gluon_no_recompile_and_graph(layout, head, gluon_launches):
    """Other lengths and batch sizes never recompile it; a CUDA graph replays it right (in the split
    layout with the host's transposed copy of the new tokens' V inside the graph; at head 256 with K
    and V by TMA, the split layout's default there)."""
    jit = itf._gluon_fwd_kernel if layout == "nhd" else itf._gluon_split_kernel
    case = make_case([(300, 100), (50, 7)], num_heads=8, num_kv_heads=2, head_size=head, page=544,
                     dtype=torch.bfloat16, device=DEVICE, layout=layout)  # fmt: skip
    run_py(case, validate=False)
    itf.finish_compiles()  # (with compile tiers on, the full form compiles in the background)
    before = compiled_variants(jit)
    for seqs in ([(0, 5)], [(3000, 900), (1, 1), (64, 700)], [(2000, 300)] * 9):
        case = make_case(seqs, num_heads=8, num_kv_heads=2, head_size=head, page=544, dtype=torch.bfloat16,
                         device=DEVICE, layout=layout)  # fmt: skip
        c = compare(run_py(case, validate=False), reference(case))
        assert c, c
    assert compiled_variants(jit) == before
    out = torch.empty_like(case.q)
    itf_call = dict(kv_layout=layout, out=out)
    args = (case.q, case.k, case.v, case.k_cache, case.v_cache, case.block_table, case.cu_seqlens_q,
            case.seq_lens, case.max_query_len)  # fmt: skip
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        prefix_prefill(*args, **itf_call)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert compare(out, reference(case))
    assert len(gluon_launches) == 5  # run_py, three batches, the capture (a replay launches no Python)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("page", [16, 544])
@pytest.mark.parametrize("head", [128, 256])
@pytest.mark.parametrize("layout", ["nhd", "split"])
def test_gpu_gluon_compile_tiers(layout, head, page, gluon_launches, monkeypatch):
    """``_GLUON_TIERED`` (the shipped default): the first call runs the quick form (LLVM at O0 with
    ``_GLUON_QUICK_LLVM_O0``) and the full form compiles in the background; after ``finish_compiles``
    the full form runs; both answer right and bit for bit the same; other lengths compile nothing
    more."""
    monkeypatch.setattr(itf, "_GLUON_TIERED", True)
    monkeypatch.setattr(itf, "_TIERS", runtime.CompileTiers())
    jit = itf._gluon_fwd_kernel if layout == "nhd" else itf._gluon_split_kernel
    case = make_case([(700, 300), (0, 129), (2000, 64)], num_heads=8, num_kv_heads=2, head_size=head,
                     page=page, dtype=torch.bfloat16, device=DEVICE, layout=layout)  # fmt: skip
    ref = reference(case)
    first = run_py(case)
    assert itf.finish_compiles(timeout=120) is True
    full = run_py(case)
    assert compare(first, ref) and compare(full, ref)
    assert torch.equal(first, full)
    states = list(itf._TIERS._state.values())
    assert states == [runtime.CompileTiers._LOADED]
    n = compiled_variants(jit)
    other = make_case([(64, 700), (5, 1)], num_heads=8, num_kv_heads=2, head_size=head, page=page,
                      dtype=torch.bfloat16, device=DEVICE, layout=layout)  # fmt: skip
    c = compare(run_py(other), reference(other))
    assert c, c
    assert compiled_variants(jit) == n and len(gluon_launches) == 3


def test_gluon_routing(monkeypatch):
    """The launcher's glue on the CPU: ``_gluon_launch`` is offered a call only with ``_GLUON`` on, no
    ``config`` given and a block table with unit column stride; returning False leaves the Triton kernel
    to write the right answer."""
    seen = refuse_gluon(monkeypatch, itf)
    case = make_case([(40, 9), (0, 5)], num_heads=2, num_kv_heads=1, head_size=32, page=16,
                     dtype=torch.float16, device=DEVICE, layout="nhd")  # fmt: skip
    c = compare(run_py(case), reference(case))
    assert c, c
    assert len(seen) == 1 and seen[0]["left"] < 0 and seen[0]["causal"] is True and seen[0]["lse"] is None
    from pp_cases import run_cfg  # a config given: no offer

    cfg = itf.get_config(itf.detect_arch(case.q.device), 32, case.q.dtype, case.page)
    run_cfg(case, cfg)
    assert len(seen) == 1
    wide = torch.zeros(
        case.block_table.shape[0], case.block_table.shape[1] * 2, dtype=torch.int32, device=DEVICE
    )
    wide[:, ::2] = case.block_table
    case.block_table = wide[:, ::2]  # column stride 2
    c = compare(run_py(case), reference(case))
    assert c, c
    assert len(seen) == 1
    monkeypatch.setattr(itf, "_GLUON", False)
    run_py(case)
    assert len(seen) == 1
