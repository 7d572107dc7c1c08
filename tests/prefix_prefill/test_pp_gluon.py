"""The warp-specialised Gluon kernels of prefix-prefill (prefix_prefill.gluon_kernel: NHD and HND caches;
prefix_prefill.gluon_split_kernel: vLLM's split layout): their plans, their host side and their answers.

CPU: which problems :func:`prefix_prefill.plan.plan` hands to them (never under the interpreter, never AMD's
fnuz fp8 caches (NVIDIA's fp8 caches: test_pp_gluon_fp8.py), narrow windows, non-causal calls, pages that are
no multiple of 8 on vLLM's split layout (16 for an fp8 one; 8 under an fp8 NHD/HND cache), NHD/HND caches TMA
cannot read as one view of rows, split caches the gathers cannot read; HND caches and interleaved K/V pages:
yes; windows, ALiBi, sinks, soft-capping and skip_decode: test_pp_gluon_features.py) and with which settings
(K and V by TMA or by gathers, wide K boxes or 16-key runs, the chunk-major K ring, per head size and page),
the kernels' host glue (the split kernel's descriptors, the new tokens' copies, compile tiers; the NHD/HND
kernel's cache descriptors against the rows its producer reads) with the kernel replaced by a recorder, and
that both kernels compile for sm90 with the installed Triton (a subprocess: no GPU needed) within one
program's shared memory. sm90 GPU: against the float64 reference into NaN-poisoned outputs for every page-size
class (1 .. 2048, powers of two or not), heads 64/128/256, both 16-bit dtypes, ragged batches with empty
contexts and one-token queries, k given or read from the cache, GQA, the LSE, the other form of each choice
the plan makes (for caches whose strides take it); every cache slot no query may see is NaN and block-table
entries past a sequence's need point outside the cache; a count proves the kernel ran; negative controls; no
recompiles; CUDA-graph replay; compile tiers.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from conftest import DEVICE, compile_gluon_for_sm90, compiled_variants, needs_sm90, poison
from pp_cases import INTERLEAVED, make_case, make_layout_case, problem_of, random_seqs, reference, run_py
from pp_gluon_compile import PP_COMPILE_HEAD

import prefill_runtime as runtime
from attn_reference import compare
from paged_kv_offsets import describe_kv_cache
from prefill_runtime.compiled_launch import CompiledLaunches
from prefill_runtime.plan import packed_tokens
from prefix_prefill import gluon_launch, launch, plan, prefix_prefill

HAS_GLUON = gluon_launch._gluon_fwd_kernel is not None and gluon_launch._gluon_split_kernel is not None


@pytest.fixture
def gluon_launches(monkeypatch):
    """Launches a Gluon kernel took in this test (``gluon_launch.launch`` returned True)."""
    taken: list[int] = []
    orig = gluon_launch.launch

    def counted(*args, **kwargs):
        ok = orig(*args, **kwargs)
        if ok:
            taken.append(1)
        return ok

    monkeypatch.setattr(gluon_launch, "launch", counted)
    monkeypatch.delenv("PREFIX_PREFILL_GLUON", raising=False)
    return taken


def _sm90(case, **opts) -> plan.Problem:
    """``case``'s problem as an sm90 launch would see it, Gluon allowed."""
    return problem_of(case, arch="sm90", gluon=True, **opts)


# ------------------------------------------------------------------------- CPU: plans
@pytest.mark.parametrize(
    "what",
    ["interpreter", "fp32", "narrow_window", "narrow_two_sided", "head_96", "no_gluon", "bt_stride",
     "fp8_fnuz", "scale"],
)  # fmt: skip
@pytest.mark.parametrize("layout", ["nhd", "hnd"])
def test_gluon_not_taken(what, layout):
    """Problems no Gluon kernel takes (NHD or HND caches): the plan names the Triton kernel and says
    why."""
    dtype = torch.float32 if what == "fp32" else torch.float16
    page = 16
    head = 96 if what == "head_96" else 128
    extra = (
        {"cache_dtype": torch.float8_e4m3fnuz, "k_scale": 0.5, "v_scale": 0.5} if what == "fp8_fnuz" else {}
    )
    case = make_case([(20, 5)], num_heads=2, num_kv_heads=1, head_size=head, page=page, dtype=dtype,
                     device="cpu", layout=layout, **extra)  # fmt: skip
    if what == "bt_stride":
        case.block_table = torch.stack([case.block_table, case.block_table], -1)[..., 0]
    over = {
        "interpreter": {"arch": "interpreter"},
        "narrow_window": {"left": plan.GLUON_MIN_WINDOW - 2},
        "narrow_two_sided": {"causal": False, "left": 40, "right": plan.GLUON_MIN_WINDOW - 42},
        "scale": {"scale": -0.5},
        "no_gluon": {"gluon": False},
    }.get(what, {})
    p = problem_of(case, **{"arch": "sm90", "gluon": True, **over})
    chosen = plan.plan(p)
    assert chosen.kernel == "triton" and "(" in chosen.reason, chosen
    good = make_case([(20, 5)], num_heads=2, num_kv_heads=1, head_size=128, page=16, dtype=torch.float16,
                     device="cpu", layout=layout)  # fmt: skip
    good = problem_of(good, arch="sm90", gluon=True)
    assert plan.plan(good).kernel == f"gluon-{layout}"  # the control: the same call without the difference


@pytest.mark.parametrize("layout", ["nhd", "hnd", *INTERLEAVED])
def test_tma_cache_layouts_planned(layout):
    """NHD and HND caches TMA reads as one view of rows (:func:`paged_kv_offsets.tma_rows`) run the
    NHD/HND Gluon kernel, ``"gluon-nhd"`` / ``"gluon-hnd"`` by the layout, whatever their block stride:
    contiguous pages, FlashInfer's interleaved K/V pages (``kv[:, 0]``, ``kv[:, 1]``), vLLM's ``[2,
    num_blocks, ...]`` halves; the plan's reason names the layout."""
    case = make_layout_case([(40, 5)], num_heads=4, num_kv_heads=2, head_size=64, page=16,
                            dtype=torch.float16, device="cpu", layout=layout)  # fmt: skip
    chosen = plan.plan(_sm90(case))
    assert chosen.kernel == f"gluon-{case.layout}" and f"{case.layout.upper()} cache" in chosen.reason
    assert chosen.kernel in plan.TMA_KERNELS
    both = torch.stack([case.k_cache, case.v_cache])  # vLLM's [2, num_blocks, ...]
    case.k_cache, case.v_cache = both[0], both[1]
    assert plan.plan(_sm90(case)).kernel == f"gluon-{case.layout}"


@pytest.mark.parametrize("page", [1, 3, 4, 8, 12, 24, 40])
@pytest.mark.parametrize("head", [64, 128, 256])
@pytest.mark.parametrize("layout", ["nhd", "hnd", "split"])
def test_small_page_classes(layout, head, page):
    """Pages that are not multiples of 16 on NHD/HND caches take the NHD/HND kernel: multiples of 8 as
    boxes of 8 rows (``BOX`` 8, one swizzle atom of the rings' layout), the others at head 256 with the
    context's key rows gathered (``GATHER``; ``BOX`` the key block, the persistent form off: a narrow
    window runs one tile a program) and at heads 64 and 128 on the Triton kernel (measured faster there);
    an fp8 cache keeps the Triton kernel below multiples of 8. vLLM's split cache
    takes pages of 8 tokens or 8 times an odd number with K and V gathered (its boxes are 16-key runs)
    and keeps the Triton kernel below multiples of 8 (16 for an fp8 one: its V gathers copy 8 or 16 keys
    of a feature); each reason names the multiple."""
    case = make_case([(40, 5)], num_heads=4, num_kv_heads=2, head_size=head, page=page, dtype=torch.float16,
                     device="cpu", layout=layout)  # fmt: skip
    chosen = plan.plan(_sm90(case))
    narrow = plan.plan(_sm90(case, left=127))
    block_n = plan.GLUON_BLOCK_N[head]
    if layout == "split":
        if page % 8:
            why = f"split caches at head {head}: multiples of 8"
            assert chosen.kernel == "triton" and why in chosen.reason, chosen
        else:
            consts = chosen.consts()
            assert chosen.kernel == "gluon-split" and not (consts["K_TMA"] or consts["V_TMA"]), chosen
        fp8 = make_case([(40, 5)], num_heads=4, num_kv_heads=2, head_size=head, page=page,
                        dtype=torch.float16, device="cpu", layout=layout, cache_dtype=torch.float8_e4m3fn,
                        k_scale=0.5, v_scale=0.5)  # fmt: skip
        chosen = plan.plan(_sm90(fp8))
        why = f"fp8 split caches at head {head}: multiples of 16"
        assert chosen.kernel == "triton" and why in chosen.reason, chosen
        assert [plan.gluon_page_multiple(layout, head, f) for f in (False, True)] == [8, 16]
        return
    gather = page % 8 != 0
    assert [plan.gluon_page_multiple(layout, head, f) for f in (False, True)] == [1 if head == 256 else 8, 8]
    if gather and head != 256:
        assert chosen.kernel == "triton" and f"at head {head}: multiples of 8" in chosen.reason, chosen
        return
    assert chosen.kernel == f"gluon-{layout}", chosen
    consts = chosen.consts()
    assert consts["GATHER"] is gather and consts["BOX"] == (block_n if gather else 8), chosen
    assert ("gathered" in chosen.reason) is gather
    assert narrow.consts()["PERSISTENT"] is not gather, narrow
    fp8 = make_case([(40, 5)], num_heads=4, num_kv_heads=2, head_size=head, page=page, dtype=torch.float16,
                    device="cpu", layout=layout, cache_dtype=torch.float8_e4m3fn, k_scale=0.5,
                    v_scale=0.5)  # fmt: skip
    chosen = plan.plan(_sm90(fp8))
    if gather:
        assert chosen.kernel == "triton" and "fp8 " in chosen.reason and "multiples of 8" in chosen.reason
    else:
        assert chosen.kernel == f"gluon-{layout}" and not chosen.consts()["GATHER"], chosen


@pytest.mark.parametrize("layout", ["nhd", "hnd", *INTERLEAVED])
@pytest.mark.parametrize("from_cache,page", [(False, 1), (True, 12), (False, 5)])
def test_gather_host_side(layout, from_cache, page, monkeypatch):
    """The gathering form's host glue on the CPU (the kernel replaced by a recorder): ``K_cache`` /
    ``V_cache`` are the caches themselves and ``c_block``, ``c_slot``, ``c_head`` their element strides, so
    ``b * c_block + s * c_slot + h * c_head`` is the offset of slot ``s`` of block ``b`` and KV head ``h``
    in both (interleaved K/V pages too); a mutant with the slot and head strides swapped misses."""
    if not HAS_GLUON:
        pytest.skip("this Triton has no Gluon")
    rec = _RecordingKernel()
    monkeypatch.setattr(gluon_launch, "_gluon_fwd_kernel", rec)
    monkeypatch.setenv("PREFIX_PREFILL_GLUON_TIERED", "0")
    case = make_layout_case([(40, 5), (0, 19), (70, 130)], num_heads=4, num_kv_heads=2, head_size=256,
                            page=page, dtype=torch.bfloat16, device="cpu", layout=layout,
                            kv_from_cache=from_cache)  # fmt: skip
    assert plan.plan(_sm90(case)).consts()["GATHER"]
    assert _launch(case) is True
    ((_, _, kw),) = rec.calls
    assert kw["GATHER"] is True and kw["PERSISTENT"] is False
    hnd = case.layout == "hnd"
    strides = (kw["c_block"], kw["c_slot"], kw["c_head"])
    for cache, name in ((case.k_cache, "K_cache"), (case.v_cache, "V_cache")):
        assert kw[name] is cache
        base = cache[0, 0, 0, 0].data_ptr()
        for b, s, h in ((0, 0, 1), (3, page - 1, 0), (cache.shape[0] - 1, page // 2, 1)):
            at = cache[b, h, s, 0] if hnd else cache[b, s, h, 0]
            want = (at.data_ptr() - base) // cache.element_size()
            assert b * strides[0] + s * strides[1] + h * strides[2] == want
            if page > 1:
                assert b * strides[0] + s * strides[2] + h * strides[1] != want or s == h


@pytest.mark.parametrize("layout", ["nhd", "hnd"])
def test_tma_cache_layouts_fall_back(layout):
    """Caches TMA cannot read as one view of rows of one geometry keep the Triton kernel, and the reason
    says so: K contiguous with V's pages interleaved (two block strides; the kernel takes one), a cache
    whose base is not 16-byte aligned, caches whose heads lie 136 bytes apart."""
    case = make_case([(40, 5)], num_heads=4, num_kv_heads=2, head_size=64, page=16, dtype=torch.float16,
                     device="cpu", layout=layout)  # fmt: skip
    k, v = case.k_cache, case.v_cache
    fallback = []
    case.v_cache = torch.stack([v, v], dim=1)[:, 1]  # V interleaved, K not
    fallback.append(plan.plan(_sm90(case)))
    flat = torch.empty(v.numel() + 1, dtype=v.dtype)
    case.v_cache = flat[1:].view(v.shape).copy_(v)  # 2-byte aligned base
    fallback.append(plan.plan(_sm90(case)))
    # heads 136 bytes apart (NHD: heads not adjacent; HND: 136-byte rows)
    case.v_cache = torch.empty(*v.shape[:-1], v.shape[-1] + 4, dtype=v.dtype)[..., :64]
    case.k_cache = torch.empty(*k.shape[:-1], k.shape[-1] + 4, dtype=k.dtype)[..., :64]
    fallback.append(plan.plan(_sm90(case)))
    for chosen in fallback:
        assert chosen.kernel == "triton", chosen
        assert f"{layout.upper()} cache or q/k/v rows TMA cannot read" in chosen.reason


def _split_case(head=128, dtype=torch.bfloat16, page=16, seqs=((40, 5),), **kw):
    return make_case(list(seqs), num_heads=4, num_kv_heads=2, head_size=head, page=page, dtype=dtype,
                     device="cpu", layout="split", **kw)  # fmt: skip


def test_split_gather_ok():
    """Which split caches the split kernel's 16-byte gathers take: vLLM's 16-bit layout (x = 8), not a
    K cache with another ``x``, a V cache whose keys are not contiguous, a base or a stride that is not
    16-byte aligned (those run the Triton kernel)."""
    case = _split_case()
    assert plan.split_gather_ok(_sm90(case)) and plan.plan(_sm90(case)).kernel == "gluon-split"
    nb, h, d, page = case.v_cache.shape
    k4 = torch.empty(nb, h, d // 4, page, 4, dtype=case.k_cache.dtype)  # x = 4
    v_slot2 = torch.empty(nb, h, d, page, 2, dtype=case.v_cache.dtype)[..., 0]  # keys 2 apart
    v_off = torch.empty(case.v_cache.numel() + 1, dtype=case.v_cache.dtype)[1:].view(case.v_cache.shape)
    big = torch.empty(nb, h, d, page + 4, dtype=case.v_cache.dtype)[..., :page]  # page stride 20: not 8
    for kcache, vcache in ((k4, case.v_cache), (case.k_cache, v_slot2), (case.k_cache, v_off),
                           (case.k_cache, big)):  # fmt: skip
        case.k_cache, case.v_cache = kcache, vcache
        p = _sm90(case)
        assert not plan.split_gather_ok(p) and plan.plan(p).kernel == "triton"


def test_pack_heads_rule():
    """Packed heads on a Gluon kernel over a 16-bit cache (NHD/HND read by TMA, or vLLM's split one with
    two consumer partitions), a group of 2 to 8 query heads a KV head, every query within
    ``packed_tokens(64, group)`` rows (32, 16, 16, 8, 8, 8, 8 at groups 2-8; a group of 9 fits no 8-row
    atom a head), with sinks and fp8 caches too; never with ALiBi, the gathering form, one consumer partition,
    the Triton kernel or one query head a KV head."""
    assert [packed_tokens(64, g) for g in range(1, 10)] == [64, 32, 16, 16, 8, 8, 8, 8, 0]
    assert packed_tokens(64, 0) == 0
    for layout, page in (("nhd", 16), ("hnd", 16), ("nhd", 24), ("hnd", 544), ("split", 16), ("split", 8)):
        for heads, kv in ((8, 4), (6, 2), (16, 2), (8, 1), (9, 1)):
            case = make_case([(40, 9)], num_heads=heads, num_kv_heads=kv, head_size=128, page=page,
                             dtype=torch.bfloat16, device="cpu", layout=layout)  # fmt: skip
            chosen = plan.plan(_sm90(case))
            assert chosen.kernel in (*plan.TMA_KERNELS, "gluon-split"), (layout, page)
            group, rows = heads // kv, packed_tokens(64, heads // kv)
            for n in (1, rows, rows + 1, 64):
                want = group if 2 <= group <= 8 and 1 <= n <= rows else 0
                assert plan.pack_heads(chosen, group, n) == want, (layout, page, group, n)
            sinks = chosen.replace(constexprs={"HAS_SINKS": True})
            assert plan.pack_heads(sinks, group, 1) == (group if 2 <= group <= 8 else 0)
            fp8 = chosen.replace(constexprs={"CACHE_FP8": True})
            assert plan.pack_heads(fp8, group, 1) == (group if 2 <= group <= 8 else 0)
            for name in ("HAS_ALIBI", "GATHER", "ONE_CONSUMER"):
                assert plan.pack_heads(chosen.replace(constexprs={name: True}), group, 1) == 0, name
            assert plan.pack_heads(chosen.replace(kernel="triton"), group, 1) == 0
    for layout, page in (("nhd", 1), ("split", 544)):  # (the gathering form; one consumer partition)
        case = make_case([(40, 9)], num_heads=8, num_kv_heads=2, head_size=128, page=page,
                         dtype=torch.bfloat16, device="cpu", layout=layout)  # fmt: skip
        assert plan.pack_heads(plan.plan(_sm90(case)), 4, 1) == 0, layout


def test_pair_heads_rule():
    """Paired heads where each KV head has an even number of query heads (8 / 2, 4 / 2: yes; 6 / 2, 2 / 2:
    the idle form) and the idle grid takes more than one wave of the multiprocessors (132 on an H200:
    133 programs pair, 132 do not)."""
    for group, even in ((4, True), (2, True), (3, False), (1, False)):
        assert plan.pair_heads(group, 133, 132) is even and plan.pair_heads(group, 10_000, 132) is even
        assert plan.pair_heads(group, 132, 132) is False and plan.pair_heads(group, 8, 132) is False


@pytest.mark.parametrize("layout", ["nhd", "split"])
def test_short_form_weighs_the_batch(layout, monkeypatch):
    """The launcher's short-query form (the variant key's second entry): the idle form's rule
    (``max_query_len <= 64``, two consumer partitions); the packed form where every query fits
    ``packed_tokens`` rows a head (32 at 2 heads a KV head, 16 at 3), at any batch; then the
    batch's sequences times the query heads (the idle grid) against the device's multiprocessors (here
    132, as an H200): 34 sequences x 4 heads pair, 33 idle, an odd group idles at any batch, a 65-row
    query takes neither (the key alone)."""
    monkeypatch.setattr(gluon_launch, "_multiprocessors", lambda index: 132)
    monkeypatch.setattr(gluon_launch, "_KEY_HEADS", {})
    for key, (heads, kv) in enumerate(((4, 2), (6, 2))):
        case = make_case([(40, 9)], num_heads=heads, num_kv_heads=kv, head_size=128, page=16,
                         dtype=torch.bfloat16, device="cpu", layout=layout)  # fmt: skip
        chosen = plan.plan(_sm90(case))
        if ("ONE_CONSUMER", True) in chosen.constexprs:
            continue

        def form(max_query_len: int, batch: int, chosen=chosen, key=key, case=case):
            vkey = gluon_launch._variant(chosen, key, max_query_len, case.q, case.k_cache, batch)
            return gluon_launch._form(vkey)

        paired = "pair" if heads // kv % 2 == 0 else "idle"
        rows = packed_tokens(64, heads // kv)
        assert rows == {2: 32, 3: 16}[heads // kv]
        assert form(64, batch=132 // heads + 1) == paired and form(rows + 1, batch=1000) == paired
        assert form(64, batch=132 // heads) == "idle" and form(rows + 1, batch=3) == "idle"
        assert form(rows, batch=1000) == "pack" and form(1, batch=1) == "pack"
        assert form(65, batch=1000) is None and gluon_launch._variant(chosen, key, 65, None, None, 9) == key
        assert gluon_launch._KEY_HEADS[key] == (heads, heads // kv, 132, rows)


@pytest.mark.parametrize("layout", ["nhd", "split"])
def test_idle_second_warpgroup_rule(layout):
    """The one rule that reads a call's length: a Gluon plan's full form with two consumer partitions
    runs with an idle second warpgroup exactly when ``max_query_len <= 64`` (half a 128-row tile); the
    quick form, a plan with one consumer partition and the Triton kernel never do."""
    for head, page in ((64, 16), (128, 16), (128, 544), (256, 16)):
        case = make_case([(40, 9)], num_heads=4, num_kv_heads=2, head_size=head, page=page,
                         dtype=torch.bfloat16, device="cpu", layout=layout)  # fmt: skip
        chosen = plan.plan(_sm90(case))
        two = not chosen.consts().get("ONE_CONSUMER", False)
        assert two is not (layout == "split" and head == 128 and page >= 128)
        for n in (0, 1, 4, 63, 64):
            assert plan.idle_second_warpgroup(chosen, n) is two
            assert plan.idle_second_warpgroup(chosen, n, full=False) is False
        for n in (65, 128, 129, 4096):
            assert plan.idle_second_warpgroup(chosen, n) is False
        triton = plan.plan(problem_of(case, arch="sm90", gluon=False))
        assert triton.kernel == "triton" and plan.idle_second_warpgroup(triton, 4) is False


@pytest.mark.parametrize("page", [16, 64, 544, 2048])
@pytest.mark.parametrize("head", [64, 128, 256])
def test_split_plan_by_head(head, page):
    """The split kernel's settings per head size and page: K by TMA at heads 128 / 256 (wide boxes for a
    block inside one page when pages hold a block, ``K_WIDE=1``; 16-key runs only at shorter pages,
    ``K_WIDE=2``), gathers at 64; V by TMA at 256 only; the chunk-major K ring at 256; with the new
    tokens given, one consumer partition at 128 on pages holding a key block and the new tokens' V
    transposed by the V producer at 64 / 128 otherwise (neither with them in the cache); a cache with a
    gap in its block stride keeps the gathers (K and V)."""
    case = _split_case(head=head, page=page)
    c = plan.plan(_sm90(case)).consts()
    bn = plan.GLUON_BLOCK_N[head]
    assert c["BLOCK_N"] == bn and c["BLOCK_M"] == 128 and c["NUM_STAGES"] == 2
    assert c["K_TMA"] is (head in (128, 256)) and c["V_TMA"] is (head == 256) and c["K_CM"] is (head == 256)
    assert c["K_WIDE"] == (0 if head == 64 else 1 if page >= bn else 2)
    one = head in plan.SPLIT_ONE_CONSUMER_HEADS and page >= bn
    assert c["ONE_CONSUMER"] is one and c["V_STAGE"] is (head <= 128 and not one)
    cached = plan.plan(_sm90(_split_case(head=head, page=page, kv_from_cache=True))).consts()
    assert cached["ONE_CONSUMER"] is False and cached["V_STAGE"] is False
    nb, hk, g, pg, x = case.k_cache.shape  # a block stride with a gap: not one [rows, page * 8] view
    case.k_cache = torch.empty(nb, hk + 1, g, pg, x, dtype=case.k_cache.dtype)[:, :hk].copy_(case.k_cache)
    c = plan.plan(_sm90(case)).consts()
    assert c["K_TMA"] is False and c["V_TMA"] is False and c["K_WIDE"] == 0 and c["K_CM"] is False


def test_plans_are_cached_and_bounded():
    """One plan per problem (a cache hit for the same caches and options, whatever the lengths and the
    batch), and the cache is bounded."""
    a = _split_case(seqs=[(4000, 700), (0, 3), (9, 9)])
    b = _split_case(seqs=[(40, 5)])
    b.k_cache, b.v_cache = a.k_cache, a.v_cache  # an engine's layer: one cache, other lengths each step
    plan.plan.cache_clear()
    assert plan.plan(_sm90(a)) is plan.plan(_sm90(b))
    assert plan.plan.cache_info().hits == 1 and plan.plan.cache_info().maxsize is not None


# ------------------------------------------------------------------------- CPU: host glue
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


def _record_split(monkeypatch, tiered=False) -> _RecordingKernel:
    """The split kernel replaced by a recorder, compile tiers off unless ``tiered`` (fresh state); skips
    when this Triton has no Gluon."""
    if not HAS_GLUON:
        pytest.skip("this Triton has no Gluon")
    rec = _RecordingKernel()
    monkeypatch.setattr(gluon_launch, "_gluon_split_kernel", rec)
    monkeypatch.setenv("PREFIX_PREFILL_GLUON_TIERED", "1" if tiered else "0")
    monkeypatch.setattr(gluon_launch, "_TIERS", runtime.CompileTiers())
    return rec


def _binds_split_kernel(args: tuple, kw: dict) -> bool:
    """A call recorded in the split kernel's place binds to the kernel's own parameters: no more
    positional arguments than it has, each keyword (the launch option ``num_warps`` aside) one of its
    parameters and not one given positionally, every parameter without a default given."""
    from prefix_prefill.gluon_split_kernel import _gluon_split_kernel as kernel

    names = [p.name for p in kernel.params]
    keywords = set(kw) - {"num_warps"}
    given = set(names[: len(args)]) | keywords
    required = {p.name for p in kernel.params if not p.has_default}
    ok = len(args) <= len(names) and keywords <= set(names) and not keywords & set(names[: len(args)])
    assert ok and required <= given, (len(args), sorted(keywords - set(names)), sorted(required - given))
    return True


def _launch(case, lse=None, consts=None) -> bool:
    """``gluon_launch.launch`` of ``case``'s sm90 plan (``consts`` merged into it), scale 0.1."""
    kc, vc = describe_kv_cache(case.k_cache, case.v_cache, case.layout)
    problem = _sm90(case, lse=lse is not None)
    chosen = plan.plan(problem)
    if consts:
        chosen = chosen.replace(constexprs=consts)
    o = torch.empty_like(case.q)
    return gluon_launch.launch(chosen, problem, case.q, case.k, case.v, o, case.k_cache, case.v_cache, kc, vc,
                               case.block_table, case.cu_seqlens_q, case.seq_lens, case.max_query_len, 0.1,
                               lse)  # fmt: skip


@pytest.mark.parametrize("head,from_cache,page", [(128, False, 16), (256, False, 16), (64, True, 16),
                                                  (64, False, 16), (128, False, 544),
                                                  (256, True, 544)])  # fmt: skip
def test_split_launch_host_side(head, from_cache, page, monkeypatch):
    """The split kernel's host glue on the CPU (the kernel replaced by a recorder): the grid, the plan's
    constexprs, the V cache as a pointer or (V by TMA) a ``[D, 16]`` descriptor and the V ring's layout,
    the K cache as a pointer or (K by TMA) ``[8, 64]`` chunk boxes with the wide / run views and the
    consumers' K view, and the new tokens read where they are: V as ``[BLOCK_N, D]`` rows of ``v``, K as
    rows of ``k`` (gathers) or ``[8, 8, 8]`` chunk boxes of ``k`` seen as ``[kv_heads * D/8, tokens, 8]``
    (K by TMA); no copy is made; the call binds to the kernel's parameters."""
    rec = _record_split(monkeypatch)
    case = make_case([(40, 5), (0, 19), (70, 130)], num_heads=4, num_kv_heads=2, head_size=head, page=page,
                     dtype=torch.bfloat16, device="cpu", layout="split",
                     kv_from_cache=from_cache)  # fmt: skip
    c = plan.plan(_sm90(case)).consts()
    assert _launch(case) is True
    ((grid, args, kw),) = rec.calls
    bn = plan.GLUON_BLOCK_N[head]
    assert grid == (-(-case.max_query_len // 128), 4, 3)
    assert {k: kw[k] for k in c} == c and kw["KV_FROM_CACHE"] is from_cache
    one = c["ONE_CONSUMER"]  # one 8-warp consumer partition, Q in one box
    assert kw["ONE_CONSUMER"] is one and kw["num_warps"] == (8 if one else 4)
    assert _binds_split_kernel(args, kw)
    v_tma, k_tma = c["V_TMA"], c["K_TMA"]
    v_desc, v_cache_arg = args[2], args[4]
    new_rows = case.q if from_cache else case.v  # (k = None: descriptors of q that give the types only)
    assert c["V_STAGE"] is (not from_cache and head <= 128 and not one)  # V by half blocks, transposed
    assert list(v_desc.block_shape) == [bn // 2 if c["V_STAGE"] else bn, head] and v_desc.base is new_rows
    from triton.experimental.gluon import language as gl

    assert kw["V_RING"] == gl.NVMMASharedLayout.get_default_for([head, 16 if v_tma else bn], gl.bfloat16)
    if v_tma:
        assert list(v_cache_arg.block_shape) == [head, 16]
    else:
        assert v_cache_arg is case.v_cache
    q_desc, k_desc, k_cache_arg = args[0], args[1], args[3]
    assert list(q_desc.block_shape) == [128 if one else 64, head]
    assert (kw["K_VIEW"] is None) is not k_tma
    k_rows = case.q if from_cache else case.k
    assert k_desc.base is k_rows
    if k_tma:  # K in [8, 64] boxes: the cache as [blocks * kv_heads * D/8, page * 8]; k as [8, 8, 8] chunks
        assert list(k_cache_arg.block_shape) == [8, 64] and list(k_desc.block_shape) == [8, 8, 8]
        assert k_cache_arg.shape == [case.k_cache.shape[0] * 2 * head // 8, page * 8]
        assert list(k_desc.shape) == [k_rows.shape[1] * head // 8, k_rows.shape[0], 8]
        assert list(k_desc.strides) == [8, k_rows.stride(0), 1]
        g = head // 8 if c["K_CM"] else 8
        assert kw["K_VIEW"] == gluon_launch._k_view(bn, head, c["K_CM"])
        rows = case.k_cache.shape[0] * 2 * head // 8
        for d, keys in ((kw["KW_desc"], bn), (kw["KR_desc"], 16)):
            if d is not None:  # [page/8, rows, 64], strides [64, page * 8, 1], block [keys/8, groups, 64]
                assert list(d.shape) == [page // 8, rows, 64] and list(d.strides) == [64, page * 8, 1]
                assert list(d.block_shape) == [keys // 8, g, 64]
                assert d.base.data_ptr() == case.k_cache.data_ptr()
        assert (kw["KW_desc"] is None) is (c["K_WIDE"] == 2) and kw["KR_desc"] is not None
    else:
        assert k_cache_arg is case.k_cache and kw["KW_desc"] is None and kw["KR_desc"] is None
        assert list(k_desc.block_shape) == [bn, head]


def _producer_reads_every_slot(case, args: tuple, kw: dict, block_rows=None) -> bool:
    """Whether the NHD/HND kernel's cache descriptors of a recorded launch (``args``/``kw`` as recorded in
    the kernel's place, descriptors over ``case``'s caches) address every cached slot where the producer
    reads it: for each sequence, cached position ``pos`` and KV head ``h``, the row
    ``paged_kv_offsets.gluon.page_row`` forms (``block_table[pos // page] * block_rows + h * head_rows +
    pos % page``) at column ``h * head_cols``, read through the descriptor's shape and strides over its
    tensor's storage, holds the cache's features of that slot, for the block-run and the box descriptors
    of K and V; ``oob_row`` lies past every view. ``block_rows``: a replacement for the launched value
    (a mutant)."""
    from prefix_prefill.gluon_kernel import _gluon_fwd_kernel as kernel

    a = dict(zip(kernel.arg_names, args, strict=False)) | kw
    rows_per_block = a["block_rows"] if block_rows is None else block_rows
    page, d = case.page, case.q.shape[2]
    table = case.block_table
    cached = [c + (n if case.k is None else 0) for c, n in zip(case.ctx_lens, case.q_lens, strict=True)]
    pairs = (("KC_desc", case.k_cache), ("KCB_desc", case.k_cache), ("VC_desc", case.v_cache),
             ("VCB_desc", case.v_cache))  # fmt: skip
    for name, cache in pairs:
        desc = a[name]
        assert desc.base.data_ptr() == cache.data_ptr() and list(desc.block_shape)[1] == d
        assert a["oob_row"] >= desc.shape[0]
        view = cache.as_strided(tuple(desc.shape), tuple(desc.strides), cache.storage_offset())
        for b, n in enumerate(cached):
            if n == 0:
                continue
            pos = torch.arange(n)
            blocks = table[b, pos // page].long()
            for h in range(cache.shape[2] if case.layout == "nhd" else cache.shape[1]):
                rows = blocks * rows_per_block + h * a["head_rows"] + pos % page
                if int(rows.max()) >= desc.shape[0]:
                    return False
                col = h * a["head_cols"]
                got = view[rows, col : col + d]
                want = cache[blocks, pos % page, h] if case.layout == "nhd" else cache[blocks, h, pos % page]
                if not torch.equal(got, want):
                    return False
    return True


@pytest.mark.parametrize("layout", ["nhd", "hnd", *INTERLEAVED])
@pytest.mark.parametrize(
    "from_cache,page,head",
    [(False, 16, 128), (True, 32, 64), (False, 544, 64), (False, 8, 128), (True, 24, 256)],
)
def test_tma_cache_views_host_side(layout, from_cache, page, head, monkeypatch):
    """The NHD/HND kernel's host glue on the CPU (the kernel replaced by a recorder): its cache
    descriptors (``[rows, row_elems]``, strides ``[row_stride, 1]``: the caches' views of rows, block
    ``[BOX, D]`` and ``[BLOCK_N, D]``) and its ``block_rows``/``head_rows``/``head_cols`` address every
    cached slot at the row and column the producer computes, ``oob_row`` past the views; the launch
    binds to the kernel's parameters; NHD and HND take the same constexprs. A mutant whose ``block_rows``
    is the page size (contiguous NHD's) misreads every other layout."""
    if not HAS_GLUON:
        pytest.skip("this Triton has no Gluon")
    rec = _RecordingKernel()
    monkeypatch.setattr(gluon_launch, "_gluon_fwd_kernel", rec)
    monkeypatch.setenv("PREFIX_PREFILL_GLUON_TIERED", "0")
    case = make_layout_case([(40, 5), (0, 19), (70, 130), (3 * page + 1, 1)], num_heads=4, num_kv_heads=2,
                            head_size=head, page=page, dtype=torch.bfloat16, device="cpu", layout=layout,
                            kv_from_cache=from_cache)  # fmt: skip
    chosen = plan.plan(_sm90(case))
    assert chosen.kernel == f"gluon-{case.layout}"
    assert _launch(case) is True
    ((_, args, kw),) = rec.calls
    from prefix_prefill.gluon_kernel import _gluon_fwd_kernel as kernel

    names = kernel.arg_names
    assert len(args) <= len(names) and set(kw) - {"num_warps"} <= set(names[len(args) :])
    assert _producer_reads_every_slot(case, args, kw)
    a = dict(zip(names, args, strict=False))
    if a["block_rows"] != page:  # HND, interleaved pages: a mutant with contiguous NHD's block rows
        assert not _producer_reads_every_slot(case, args, kw, block_rows=page)
    assert (a["head_rows"] == 0) is (case.layout == "nhd") and (a["head_cols"] == 0) is (case.layout == "hnd")
    nhd = make_case([(40, 5)], num_heads=4, num_kv_heads=2, head_size=head, page=page, dtype=torch.bfloat16,
                    device="cpu", layout="nhd", kv_from_cache=from_cache)  # fmt: skip
    assert plan.plan(_sm90(nhd)).constexprs == chosen.constexprs  # one compiled kernel for both layouts


@pytest.mark.parametrize("head,page", [(128, 16), (128, 128), (256, 16)])
def test_split_launch_tiers(head, page, monkeypatch):
    """Compile tiers (the default): a key's first call launches the quick form (one 8-warp consumer
    partition with LLVM at O0, Q in one 128-row box) and compiles the full form in the background
    (``warmup``: two consumers, 4 warps, Q in 64-row boxes, on the caller's CUDA device; at head 128 on
    pages holding a key block the plan's one consumer partition, 8 warps, Q in one box, LLVM at full
    optimisation), both with arguments that bind to the kernel's parameters; after ``finish_compiles``
    the calls launch the full form; other lengths keep the key, but queries of <= 64 rows run the full
    form with an idle second warpgroup, a tier of its own (two consumer partitions only); inside a graph
    capture a full form never launched stays on the quick form; tiers off
    (``PREFIX_PREFILL_GLUON_TIERED=0``): the full form at once, no background compile."""
    import prefill_runtime.tiers as tiers

    rec = _record_split(monkeypatch, tiered=True)
    monkeypatch.setattr(torch.cuda, "device", lambda dev: contextlib.nullcontext())
    capturing = []
    monkeypatch.setattr(tiers, "_capturing", lambda: bool(capturing))

    def case(seqs):
        return make_case(seqs, num_heads=4, num_kv_heads=2, head_size=head, page=page, dtype=torch.bfloat16,
                         device="cpu", layout="split")  # fmt: skip

    def quick(kw, args):
        return (
            kw["ONE_CONSUMER"] is True
            and kw["num_warps"] == 8
            and kw["LLVM_O0"] is True
            and (list(args[0].block_shape) == [128, head])
        )

    one = plan.plan(_sm90(case([(40, 5)]))).consts()["ONE_CONSUMER"]  # the full form's consumer

    def full(kw, args):
        rows = 128 if one else 64
        q_box = list(args[0].block_shape)
        return kw["ONE_CONSUMER"] is one and kw["LLVM_O0"] is False and q_box == [rows, head]

    assert _launch(case([(40, 5), (70, 130)])) is True
    assert gluon_launch.finish_compiles(timeout=30) is True
    ((_, args, kw),) = rec.calls
    assert quick(kw, args)
    ((grid, wargs, wkw),) = rec.warmups
    assert full(wkw, wargs) and wkw["num_warps"] == (8 if one else 4)
    assert _binds_split_kernel(args, kw) and _binds_split_kernel(wargs, wkw) and grid == rec.calls[0][0]
    capturing.append(1)  # compiled but never launched: the quick form inside a capture
    assert _launch(case([(7, 300)])) is True and quick(rec.calls[-1][2], rec.calls[-1][1])
    capturing.clear()
    assert _launch(case([(3, 9), (500, 20), (0, 65)])) is True
    assert full(rec.calls[-1][2], rec.calls[-1][1]) and rec.calls[-1][2]["IDLE_WG1"] is False
    capturing.append(1)  # loaded now: the full form inside a capture too
    assert _launch(case([(7, 300)])) is True and full(rec.calls[-1][2], rec.calls[-1][1])
    assert len(rec.warmups) == 1
    capturing.clear()
    # queries of <= 64 rows: the idle-warpgroup form (two consumer partitions only), a tier of its own
    short = case([(3, 4), (50, 8), (9, 64)])
    assert _launch(short) is True
    if one:  # the plan's one consumer partition has no idle form: the full form, compiled already
        assert full(rec.calls[-1][2], rec.calls[-1][1]) and rec.calls[-1][2]["IDLE_WG1"] is False
    else:
        assert quick(rec.calls[-1][2], rec.calls[-1][1]) and rec.calls[-1][2]["IDLE_WG1"] is False
        assert gluon_launch.finish_compiles(timeout=30) is True
        # (two query heads a KV head: the second warpgroup takes the next head, over head pairs)
        (grid, _, kw) = rec.warmups[-1]
        assert len(rec.warmups) == 2 and kw["PAIR_HEADS"] is True and kw["IDLE_WG1"] is False and grid[1] == 2
        assert _launch(short) is True and rec.calls[-1][2]["PAIR_HEADS"] is True
        assert full(rec.calls[-1][2], rec.calls[-1][1]) and rec.calls[-1][0][1] == 2
    assert _launch(case([(40, 5)]), lse=torch.empty(4, 5)) is True  # another key: quick form again
    assert quick(rec.calls[-1][2], rec.calls[-1][1]) and rec.calls[-1][2]["RETURN_LSE"] is True
    gluon_launch.finish_compiles(timeout=30)
    monkeypatch.setenv("PREFIX_PREFILL_GLUON_TIERED", "0")
    monkeypatch.setattr(gluon_launch, "_TIERS", runtime.CompileTiers())
    n_warm = len(rec.warmups)
    assert _launch(case([(40, 5), (70, 130)])) is True and full(rec.calls[-1][2], rec.calls[-1][1])
    assert len(rec.warmups) == n_warm


def test_gluon_failure_falls_back_to_triton(monkeypatch):
    """A Gluon kernel that fails to build or launch (another Triton's Gluon): one warning, the Triton
    kernel answers, and no Gluon kernel is planned again in the process."""
    if not HAS_GLUON:
        pytest.skip("this Triton has no Gluon")
    monkeypatch.setattr(gluon_launch, "_FAILED", False)

    class Broken:
        def __getitem__(self, grid):
            def fail(*args, **kwargs):
                raise RuntimeError("no such Gluon")

            return fail

    monkeypatch.setattr(gluon_launch, "_gluon_fwd_kernel", Broken())
    monkeypatch.setenv("PREFIX_PREFILL_GLUON_TIERED", "0")
    case = make_case([(40, 9)], num_heads=2, num_kv_heads=1, head_size=128, page=16, dtype=torch.float16,
                     device="cpu", layout="nhd")  # fmt: skip
    with pytest.warns(RuntimeWarning, match="Gluon kernel failed"):
        assert _launch(case) is False
    assert gluon_launch.available() is False and launch.gluon_allowed() is False


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
    + PP_COMPILE_HEAD
    + """
# head, box, new tokens from the cache
CASES = ((128, 16, False), (256, 64, True), (128, 128, False), (64, 16, True), (128, 8, False))
for head, box, from_cache in CASES:
    src, kernel = compile_nhd(head, box, from_cache, False)
    n_wgmma = kernel.asm["ptx"].count("wgmma.mma_async")
    check_launcher_guess(itf._gluon_fwd_kernel, src, kernel)
    # the quick form: one 8-warp consumer partition (Q in one box), LLVM at O0
    _, kernel = compile_nhd(head, box, from_cache, False, one=True, llvm_o0=True)
    assert kernel.asm["ptx"].count("wgmma.mma_async") * 2 <= n_wgmma, "the consumer is not compiled once"
    # queries of <= 64 rows: the second consumer warpgroup issues no wgmma
    _, kernel = compile_nhd(head, box, from_cache, True, IDLE_WG1=True)
    assert kernel.asm["ptx"].count("wgmma.mma_async") * 2 == n_wgmma, "the idle warpgroup computes"
    n_copies = kernel.asm["ptx"].count("cp.async.bulk.tensor")  # (two of them Q's halves)
    # ... with an even number of query heads a KV head: both warpgroups compute, on two heads
    _, kernel = compile_nhd(head, box, from_cache, False, PAIR_HEADS=True)
    assert kernel.asm["ptx"].count("wgmma.mma_async") == n_wgmma
    # ... a KV head's 4 (or 8) query heads packed into the first warpgroup's rows, 16 (8) a head, Q in
    # boxes of that many rows, one copy a head: the second warpgroup idle
    for group, rows in ((4, 16), (8, 8)) if box == 16 else ():
        _, kernel = compile_nhd(head, box, from_cache, True, q_rows=rows, IDLE_WG1=True, PACK=group)
        ptx = kernel.asm["ptx"]
        assert ptx.count("wgmma.mma_async") * 2 == n_wgmma, "the packed form computes in one warpgroup"
        # (a box of 64 features a bulk copy: 128-byte swizzle rows)
        assert ptx.count("cp.async.bulk.tensor") == n_copies + (group - 2) * head // 64, "a Q copy a head"

# pages that are no multiple of 8: the context's key rows gathered by cp.async (16-byte copies only, each
# gathering thread arriving when its own copies land), full and quick, and the short-query forms
for head, from_cache in ((256, False), (256, True)):  # (GATHER_HEADS)
    bn = itf_plan.GLUON_BLOCK_N[head]
    src, kernel = compile_nhd(head, bn, from_cache, True, GATHER=True)
    check_launcher_guess(itf._gluon_fwd_kernel, src, kernel)
    ptx = kernel.asm["ptx"]
    assert "cp.async.cg.shared.global" in ptx and "cp.async.ca.shared.global" not in ptx
    assert ptx.count("cp.async.mbarrier.arrive.noinc") == 2
    n_wgmma = ptx.count("wgmma.mma_async")
    _, kernel = compile_nhd(head, bn, from_cache, False, one=True, llvm_o0=True, GATHER=True)
    assert kernel.asm["ptx"].count("wgmma.mma_async") * 2 <= n_wgmma
    _, kernel = compile_nhd(head, bn, from_cache, False, IDLE_WG1=True, GATHER=True)
    assert kernel.asm["ptx"].count("wgmma.mma_async") * 2 == n_wgmma

# an HND cache's launch as the launcher builds it (descriptors over the cache's view of rows, the view's
# integers) on CPU tensors: its arguments' signature is the NHD form's, and it compiles
import torch

from paged_kv_offsets import describe_kv_cache

HEAD, PAGE = 128, 16
kv_heads, blocks, tokens = 2, 6, 40
q = torch.zeros(tokens, 4, HEAD, dtype=torch.bfloat16)
k, v = torch.zeros(tokens, kv_heads, HEAD, dtype=torch.bfloat16), torch.zeros(tokens, kv_heads, HEAD,
                                                                               dtype=torch.bfloat16)
kv = torch.zeros(blocks, 2, kv_heads, PAGE, HEAD, dtype=torch.bfloat16)  # interleaved HND pages
k_cache, v_cache = kv[:, 0], kv[:, 1]
kc, vc = describe_kv_cache(k_cache, v_cache, "hnd")
table, cu, lens = (torch.zeros(1, 4, dtype=torch.int32), torch.tensor([0, tokens], dtype=torch.int32),
                   torch.tensor([tokens + 9], dtype=torch.int32))
problem = itf_plan.make_problem(q, k, v, q, k_cache, v_cache, kc, vc, table, arch="sm90", gluon=True,
                                causal=True, left=-1, right=-1, scale=0.1, alibi=False, sinks=False,
                                softcap_form=0, skip_decode=False, lse=False)
chosen = itf_plan.plan(problem)
assert chosen.kernel == "gluon-hnd", chosen
args, params, grid = itf._nhd_call(chosen, 0, q, k, v, q, k_cache, v_cache, kc, vc, table, cu, lens, tokens,
                                   0.1, None, None, itf.PLAIN, True, False)
names = itf._gluon_fwd_kernel.arg_names
bound = dict(zip(names, args)) | params
assert bound["block_rows"] == 2 * kv_heads * PAGE and bound["head_rows"] == PAGE and bound["head_cols"] == 0
TYPES = {torch.bfloat16: "bf16", torch.int32: "i32"}


def arg_type(value):
    if value is None:
        return "constexpr"
    if hasattr(value, "block_shape"):
        return f"tensordesc<bf16[{', '.join(map(str, value.block_shape))}],{value.layout!r}>"
    if isinstance(value, torch.Tensor):
        return "*" + TYPES[value.dtype]
    return "fp32" if isinstance(value, float) else "i32"


sig = {n: arg_type(a) for n, a in zip(names, args)}
sig |= {n: "constexpr" for n in ("Sinks", "Slopes", "tanh_scale", "window_left")}
consts = {n: params[n] for n in params if n not in ("Sinks", "Slopes", "tanh_scale", "window_left")}
consts |= {n: None for n, t in sig.items() if t == "constexpr"}
src_nhd, _ = compile_nhd(HEAD, params["BOX"], False, False)
assert sig == {n: t for n, t in src_nhd.signature.items() if n in sig}, "the HND launch is another kernel"
_, kernel = compile_sm90(itf._gluon_fwd_kernel, sig, consts, num_warps=4)
print("hnd launch compiled:", kernel.metadata.num_regs if hasattr(kernel.metadata, "num_regs") else "")
"""
)


_SPLIT_COMPILE_SCRIPT = (
    _LAUNCHER_CHECK
    + PP_COMPILE_HEAD
    + """
import re


def no_base_offsets(kernel):
    # the chunk-major ring's no-swizzle wgmma descriptors without a matrix-base offset (bits 49-51)
    for c in re.findall(r"(?:add|or)\\.[bsu]64\\s+%rd\\d+, %rd\\d+, (\\d+);", kernel.asm["ptx"]):
        assert int(c) >> 62 or not (int(c) >> 49) & 7, "a no-swizzle descriptor keeps its base offset"


# head, from cache, lse, V by TMA, K by TMA, K_WIDE: every form a plan takes (and the gathers at 128 / 256,
# which a split cache whose strides TMA cannot take runs)
CASES = ((64, False, True, False, False, 0), (64, True, False, False, False, 0),
         (128, False, True, False, True, 1), (128, True, False, False, True, 2),
         (256, False, False, True, True, 1), (256, True, True, True, True, 2),
         (128, False, False, False, False, 0), (256, False, False, False, False, 0),
         (128, False, False, False, True, 2))
for head, from_cache, lse, v_tma, k_tma, k_wide in CASES:
    cm = k_tma and head in itf_plan.SPLIT_K_CM_HEADS
    src, kernel = compile_split(head, from_cache, lse, v_tma, k_tma, k_wide)
    check_launcher_guess(itf._gluon_split_kernel, src, kernel)
    ptx = kernel.asm["ptx"]
    # 16-byte gathers only, and every gathering producer thread arrives when its own copies land
    if not (v_tma and k_tma):
        assert "cp.async.cg.shared.global" in ptx and "cp.async.ca.shared.global" not in ptx
    assert ptx.count("cp.async.mbarrier.arrive.noinc") == 2 - v_tma - k_tma
    if k_tma:  # K by 3-D boxes (4-D: new tokens' full blocks) read by wgmma without re-staging
        assert "cp.async.bulk.tensor.3d" in ptx
        assert "cp.async.bulk.tensor.4d" in ptx or from_cache
    if cm:
        no_base_offsets(kernel)
    # the quick form: one 8-warp consumer partition (Q in one box), LLVM at O0
    _, quick = compile_split(head, from_cache, lse, v_tma, k_tma, k_wide, one=True, llvm_o0=True)
    if cm:
        no_base_offsets(quick)
    # queries of <= 64 rows, where the plan has two consumer partitions: the second issues no wgmma
    if not (not from_cache and head in itf_plan.SPLIT_ONE_CONSUMER_HEADS and k_wide == 1):
        _, idle = compile_split(head, from_cache, lse, v_tma, k_tma, k_wide, IDLE_WG1=True)
        n = ptx.count("wgmma.mma_async")
        assert idle.asm["ptx"].count("wgmma.mma_async") * 2 == n, "the idle warpgroup computes"
        _, pair = compile_split(head, from_cache, lse, v_tma, k_tma, k_wide, PAIR_HEADS=True)
        assert pair.asm["ptx"].count("wgmma.mma_async") == n
        if cm:
            no_base_offsets(idle)
            no_base_offsets(pair)
        if head != 256:  # a KV head's 4 query heads packed into the first warpgroup's rows (16 a head)
            _, pack = compile_split(head, from_cache, lse, v_tma, k_tma, k_wide, q_rows=16, IDLE_WG1=True,
                                    PACK=4)  # fmt: skip
            assert pack.asm["ptx"].count("wgmma.mma_async") * 2 == n, "the packed form computes in both"
            if cm:
                no_base_offsets(pack)
"""
)


def test_gluon_split_kernel_compiles_for_sm90():
    """The split-layout kernel compiles for sm90 (no GPU needed) in every form a plan takes, full and
    quick, and with an idle second warpgroup, paired heads or (below head 256) packed heads where the plan
    has two consumer partitions, with 16-byte ``cp.async`` gathers only (16-byte alignment of every gather
    proven to the compiler), within one program's shared memory."""
    if not HAS_GLUON:
        pytest.skip("this Triton has no Gluon")
    shared, out = compile_gluon_for_sm90(_SPLIT_COMPILE_SCRIPT)
    assert len(shared) == 39 and max(shared) <= 227 * 1024, out


def test_gluon_kernel_compiles_for_sm90():
    """The NHD kernel compiles for sm90 with the installed Triton (no GPU needed) in one program's
    shared memory (227 KiB), full, as its quick form (one 8-warp consumer partition: half the wgmma
    instructions, the consumer compiled once), with an idle second warpgroup (half the wgmma
    instructions: the second consumer issues none), with paired heads (all of them) and with packed
    heads (4 and 8 a KV head at boxes of 16: the idle form's wgmma, one Q copy a head); the gathering
    form (``GATHER``: pages no multiple of 8, head 256) full, quick and idle, with 16-byte ``cp.async``
    gathers only and one arrival a gathering thread; an HND cache with interleaved pages as the launcher
    passes it (``"gluon-hnd"``: its arguments' types are the NHD form's, the view's geometry runtime
    integers) compiles too; on Triton 3.6 the launcher-source guess of prefill_runtime's prebuild matches."""
    if not HAS_GLUON:
        pytest.skip("this Triton has no Gluon")
    shared, out = compile_gluon_for_sm90(_COMPILE_SCRIPT)
    assert len(shared) == 32 and max(shared) <= 227 * 1024, out


# ------------------------------------------------------------------------- GPU (sm90)
def _nan_unused_slots(case) -> None:
    """NaN into every cache slot no query may read: past each sequence's cached tokens in its pages,
    and every block no sequence owns (NHD, HND or vLLM's split layout; interleaved pages through their
    K and V views)."""
    page = case.page
    split, hnd = case.layout == "split", case.layout == "hnd"
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
            elif lo < page and hnd:
                case.k_cache[blk, :, lo:] = float("nan")
                case.v_cache[blk, :, lo:] = float("nan")
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
    """Both Gluon kernels (NHD: TMA page runs; vLLM's split layout: TMA boxes or cp.async gathers, the
    new tokens' copies made on the host): every page class, heads 64 / 128 / 256, both 16-bit dtypes,
    k given or read from the cache, ragged batches with empty contexts and one-token queries, GQA, the
    LSE, NaN in every slot no query may read."""
    _check_pages(layout, page, head, dtype, from_cache, gluon_launches)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("page", [16, 544, 1056])
@pytest.mark.parametrize("head,dtype", [(128, torch.bfloat16), (256, torch.float16), (64, torch.bfloat16)])
@pytest.mark.parametrize("from_cache", [False, True])
@pytest.mark.parametrize("layout", ["hnd", *INTERLEAVED])
def test_gpu_gluon_tma_layouts(layout, page, head, dtype, from_cache, gluon_launches):
    """The NHD/HND kernel over HND caches (``"gluon-hnd"``) and over FlashInfer's interleaved K/V pages
    (NHD and HND: blocks twice a page apart, the other half NaN where no query may read), as
    :func:`test_gpu_gluon_pages` checks NHD: page classes 16 / 544 / 1056, heads 64 / 128 / 256, k
    given or read from the cache, ragged batches with empty contexts and one-token queries, the LSE."""
    _check_pages(layout, page, head, dtype, from_cache, gluon_launches)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize(
    "page,head,dtype",
    [(p, h, dt) for p in (8, 24, 40) for h, dt in ((128, torch.bfloat16), (256, torch.float16),
                                                  (64, torch.bfloat16))]
    + [(p, 256, dt) for p in (1, 3, 12) for dt in (torch.float16, torch.bfloat16)],
)  # fmt: skip
@pytest.mark.parametrize("from_cache", [False, True])
@pytest.mark.parametrize("layout", ["nhd", "hnd", *INTERLEAVED])
def test_gpu_gluon_small_pages(layout, page, head, dtype, from_cache, gluon_launches):
    """The NHD/HND kernel over pages that are not multiples of 16: boxes of 8 rows (8, 24, 40: 16 boxes a
    key block at heads 64 / 128, 8 at 256) and, at head 256, the gathering form (``GATHER``: pages 1, 3,
    12), as :func:`test_gpu_gluon_pages` checks the other page classes."""
    _check_pages(layout, page, head, dtype, from_cache, gluon_launches)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("page", [8, 24])
@pytest.mark.parametrize("head,dtype", [(128, torch.bfloat16), (256, torch.float16), (64, torch.bfloat16)])
@pytest.mark.parametrize("from_cache", [False, True])
def test_gpu_split_pages_of_eight(page, head, dtype, from_cache, gluon_launches):
    """The split kernel over vLLM's split cache with pages of 8 tokens or 8 times an odd number (K and V
    gathered), as :func:`test_gpu_gluon_pages` checks the other page classes."""
    _check_pages("split", page, head, dtype, from_cache, gluon_launches)


def _check_pages(layout, page, head, dtype, from_cache, gluon_launches) -> None:
    """One Gluon call on a layout id (``pp_cases.make_layout_case``) against the float64 reference (output
    and LSE), NaN in every slot no query may read, the plan the layout's Gluon kernel."""
    seqs = [*random_seqs(4, 2500, 600), (0, 300), (1700, 1), (129, 128), (37, 93)]
    case = make_layout_case(seqs, num_heads=8, num_kv_heads=2, head_size=head, page=page, dtype=dtype,
                            device=DEVICE, layout=layout, kv_from_cache=from_cache)  # fmt: skip
    ref, ref_lse = reference(case, return_lse=True)
    _nan_unused_slots(case)
    assert plan.plan(problem_of(case)).kernel == f"gluon-{case.layout}"
    out = poison(torch.empty_like(case.q))
    lse = poison(torch.empty(case.q.shape[1], case.q.shape[0], dtype=torch.float32, device=DEVICE))
    prefix_prefill(case.q, case.k, case.v, case.k_cache, case.v_cache, case.block_table, case.cu_seqlens_q,
                   case.seq_lens, case.max_query_len, kv_layout=case.layout, out=out, return_lse=True,
                   lse=lse, validate=True)  # fmt: skip
    assert len(gluon_launches) == 1, "the Gluon kernel did not run"
    c = compare(out, ref)
    assert c, c
    assert torch.isfinite(lse).all()
    assert (lse.double() - ref_lse).abs().max().item() < 1e-3


# The other form of each choice the split plan makes (what caches of other strides run): head sizes.
_GPU_FORMS = {
    "gathers": ((128, 256), {"K_TMA": False, "V_TMA": False, "K_WIDE": 0, "K_CM": False}),
    "v_gathers": ((256,), {"V_TMA": False}),
    "part_major_k": ((256,), {"K_CM": False}),
}


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("page", [16, 1040, 32, 512])
@pytest.mark.parametrize("from_cache", [False, True])
@pytest.mark.parametrize("form,head", [(f, h) for f, (heads, _) in _GPU_FORMS.items() for h in heads])
def test_gpu_gluon_split_forms(form, head, page, from_cache, gluon_launches):
    """The split kernel's other forms, forced through a plan override: K and V gathered at heads where
    the plan takes TMA (a cache whose strides TMA cannot read runs them), V gathered with K by TMA, the
    part-major K ring at head 256: same answers, NaN in every slot no query may read."""
    seqs = [*random_seqs(3, 2500, 500), (0, 200), (1300, 1)]
    case = make_case(seqs, num_heads=8, num_kv_heads=2, head_size=head, page=page, dtype=torch.bfloat16,
                     device=DEVICE, layout="split", kv_from_cache=from_cache)  # fmt: skip
    ref = reference(case)
    _nan_unused_slots(case)
    chosen = plan.plan(problem_of(case)).replace(constexprs=_GPU_FORMS[form][1])
    assert chosen.kernel == "gluon-split"
    kc, vc = describe_kv_cache(case.k_cache, case.v_cache, "split")
    out = poison(torch.empty_like(case.q))
    launch.forward(case.q, case.k, case.v, out, case.k_cache, case.v_cache, kc, vc, case.block_table,
                   case.cu_seqlens_q, case.seq_lens, case.max_query_len, plan_override=chosen)  # fmt: skip
    c = compare(out, ref)
    assert c, c
    assert len(gluon_launches) == 1


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("layout", ["nhd", "hnd", "split"])
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
@pytest.mark.parametrize("layout", ["nhd", "hnd", "split"])
def test_gpu_gluon_no_recompile_and_graph(layout, head, gluon_launches):
    """Other lengths and batch sizes never recompile it once its two full forms are loaded (two computing
    warpgroups; the second idle, for queries of <= 64 rows); a CUDA graph replays it right (in the split
    layout with the host's copies of the new tokens inside the graph; at head 256 with K and V by TMA,
    the split layout's default there)."""
    jit = gluon_launch._gluon_split_kernel if layout == "split" else gluon_launch._gluon_fwd_kernel
    for seqs in ([(300, 100), (50, 7)], [(300, 40), (50, 7)]):
        case = make_case(seqs, num_heads=8, num_kv_heads=2, head_size=head, page=544, dtype=torch.bfloat16,
                         device=DEVICE, layout=layout)  # fmt: skip
        run_py(case, validate=False)
        gluon_launch.finish_compiles()  # (with compile tiers on, the full form compiles in the background)
        run_py(case, validate=False)  # the full form loaded (a capture does not load a module)
    before = compiled_variants(jit)
    for seqs in ([(0, 5)], [(3000, 900), (1, 1), (64, 700)], [(2000, 300)] * 9):
        case = make_case(seqs, num_heads=8, num_kv_heads=2, head_size=head, page=544, dtype=torch.bfloat16,
                         device=DEVICE, layout=layout)  # fmt: skip
        c = compare(run_py(case, validate=False), reference(case))
        assert c, c
    assert compiled_variants(jit) == before
    out = torch.empty_like(case.q)
    args = (case.q, case.k, case.v, case.k_cache, case.v_cache, case.block_table, case.cu_seqlens_q,
            case.seq_lens, case.max_query_len)  # fmt: skip
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        prefix_prefill(*args, kv_layout=layout, out=out)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert compare(out, reference(case))
    # four run_py, three batches, the capture (a replay launches no Python); with one consumer partition
    # (no idle form) the short batch's second run_py repeats the first's variant through its frame
    one = plan.plan(_sm90(case)).consts().get("ONE_CONSUMER", False)
    assert len(gluon_launches) == (7 if one else 8)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("page", [16, 544])
@pytest.mark.parametrize("head", [128, 256])
@pytest.mark.parametrize("layout", ["nhd", "split"])
def test_gpu_gluon_compile_tiers(layout, head, page, gluon_launches, monkeypatch):
    """Compile tiers (the shipped default): the first call runs the quick form (LLVM at O0) and the full
    form compiles in the background; after ``finish_compiles`` the full form runs; both answer right and
    bit for bit the same; other lengths compile nothing more."""
    monkeypatch.setattr(gluon_launch, "_TIERS", runtime.CompileTiers())
    jit = gluon_launch._gluon_split_kernel if layout == "split" else gluon_launch._gluon_fwd_kernel
    # (an earlier test in this process may have loaded this key's full form: start with none loaded)
    monkeypatch.setattr(gluon_launch, "_SPLIT" if layout == "split" else "_NHD", CompiledLaunches(jit))
    case = make_case([(700, 300), (0, 129), (2000, 64)], num_heads=8, num_kv_heads=2, head_size=head,
                     page=page, dtype=torch.bfloat16, device=DEVICE, layout=layout)  # fmt: skip
    ref = reference(case)
    first = run_py(case)
    assert gluon_launch.finish_compiles(timeout=120) is True
    full = run_py(case)
    assert compare(first, ref) and compare(full, ref)
    assert torch.equal(first, full)
    states = list(gluon_launch._TIERS._state.values())
    assert states == [runtime.CompileTiers._LOADED]
    n = compiled_variants(jit)
    other = make_case([(64, 700), (5, 1)], num_heads=8, num_kv_heads=2, head_size=head, page=page,
                      dtype=torch.bfloat16, device=DEVICE, layout=layout)  # fmt: skip
    c = compare(run_py(other), reference(other))
    assert c, c
    assert compiled_variants(jit) == n and len(gluon_launches) == 3


@pytest.mark.gpu
@needs_sm90
def test_gpu_nhd_and_hnd_share_one_kernel(gluon_launches, monkeypatch):
    """NHD, HND and interleaved caches of one head size and page class run one compiled variant of the
    NHD/HND kernel (the views' geometry is runtime integers): after the NHD call's full form is loaded,
    the other layouts compile nothing, and answer right."""
    monkeypatch.setenv("PREFIX_PREFILL_GLUON_TIERED", "0")
    jit = gluon_launch._gluon_fwd_kernel
    seqs = [(700, 300), (0, 129), (2000, 100)]
    n = None
    for layout in ("nhd", "hnd", *INTERLEAVED):
        case = make_layout_case(seqs, num_heads=8, num_kv_heads=2, head_size=128, page=544,
                                dtype=torch.bfloat16, device=DEVICE, layout=layout)  # fmt: skip
        c = compare(run_py(case), reference(case))
        assert c, (layout, c)
        n = compiled_variants(jit) if n is None else n
        assert compiled_variants(jit) == n, layout
    assert len(gluon_launches) == 4


def test_gluon_routing(monkeypatch):
    """The launcher's glue: a Gluon plan is offered to ``gluon_launch.launch`` (refused here, so the
    Triton kernel writes the right answer); with a config given, ``PREFIX_PREFILL_GLUON=0`` or a block
    table with a non-unit column stride no Gluon kernel is planned."""
    offered = []

    def refuse(chosen, *args):
        offered.append(chosen.kernel)
        return False

    monkeypatch.setattr(gluon_launch, "launch", refuse)
    monkeypatch.setattr(launch, "detect_arch", lambda device: "sm90")  # plan as an H200 would
    from prefix_prefill import checks

    monkeypatch.setattr(checks, "interpreted", lambda: True)  # (CPU tensors stand in for a GPU's)
    monkeypatch.setattr(launch, "gluon_allowed", lambda: True)
    monkeypatch.setattr(launch, "_fwd_kernel", _RecordingKernel())  # the Triton launch, recorded
    case = make_case([(40, 9), (0, 5)], num_heads=2, num_kv_heads=1, head_size=64, page=16,
                     dtype=torch.float16, device="cpu", layout="nhd")  # fmt: skip
    run_py(case, validate=False)
    assert offered == ["gluon-nhd"] and len(launch._fwd_kernel.calls) == 1
    from pp_cases import run_cfg  # a config given: no offer

    cfg = plan.get_config("sm90", 64, case.q.dtype, case.page)
    run_cfg(case, cfg)
    wide = torch.zeros(case.block_table.shape[0], case.block_table.shape[1] * 2, dtype=torch.int32)
    wide[:, ::2] = case.block_table
    case.block_table = wide[:, ::2]  # column stride 2
    run_py(case, validate=False)
    assert offered == ["gluon-nhd"] and len(launch._fwd_kernel.calls) == 3
