"""The persistent form of window-prefill's Gluon kernel (``PERSISTENT``): grid ``(programs, 1, 1)``, each
program taking the launch's next tile (every sequence's, the latest query tiles first) from a counter one
after another through one set of rings.

CPU: the plan's rule (narrow windows, and wider causal calls; not wider non-causal or
unbounded ones, named in the reason); the launch's grid
(one program a multiprocessor, at most the one-tile grid's tiles); the form compiles for sm90 offline with
its options at heads 64/128/256. sm90 GPU: against the float64 reference with every option and few
programs (many tiles a program: the rings' slots and phases, Q's hand-back and the V-row handshake carried
from tile to tile, tiles of several sequences in one program), ragged batches with one-token sequences,
unbounded and both-way windows, tile spaces mostly dead (live tiles numbered) or mostly live with about
as many programs as numbered tiles (no counter), rows past the grid and a status report; the rows bit for
bit the one-tile form's whatever the program count (the LSE within an ulp); the tile counter back at zero
after a launch and one a stream (two streams' launches at once); a negative control.
"""

from __future__ import annotations

import pytest
import torch
from conftest import ON_GPU, compile_gluon_for_sm90, needs_sm90, poison
from test_gluon_features import _sinks
from wp_util import (
    WP_COMPILE_HEAD,
    any_width_is_wide,
    count_gluon_launches,
    make_qkv,
    reference,
    refuse_gluon,
)

import window_prefill.launch as wl
import window_prefill.plan as wp_plan
from attn_reference import attention_varlen, compare
from prefill_runtime import LaunchPlan
from prefill_runtime.gluon_host import tile_counter
from prefill_runtime.status import MAX_LEN, ROWS
from window_prefill import explain, window_prefill

NARROW = wp_plan._PERSISTENT_MAX_WIDTH - 1  # the widest causal left window of the persistent form


# ------------------------------------------------------------------------- CPU: the plan's rule
@pytest.mark.skipif(ON_GPU, reason="the interpreter's planned launch (the GPU tests below run the kernel)")
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_causal_and_narrow_windows_run_persistent(head_dim, monkeypatch):
    """Windows of at most ``_PERSISTENT_MAX_WIDTH`` keys (causal, or both ways) take the persistent form
    (named in the reason), and so do wider causal calls; a non-causal call with one key more, no window or
    a side unbounded does not. The Triton plans carry no such constexpr."""
    offered = refuse_gluon(monkeypatch)
    any_width_is_wide(monkeypatch)
    q, k, v, cu = make_qkv([30, 9], 2, 1, head_dim, torch.float16)
    for kw, want in (
        (dict(window=(127, -1)), True),
        (dict(window=(NARROW, -1), sinks=torch.randn(2), softcap=20.0, return_lse=True), True),
        (dict(window=(NARROW + 1, -1)), True),
        ({}, True),
        (dict(causal=False, window=(500, NARROW - 500)), True),
        (dict(causal=False, window=(500, NARROW - 499)), False),
        (dict(causal=False, window=(100, -1)), False),  # the right side unbounded
        (dict(causal=False, window=(-1, 100)), False),
        (dict(causal=False), False),
    ):
        kw = {"causal": True, **kw}
        chosen = explain(q, k, v, cu, 30, **kw)
        assert chosen.kernel == "gluon", chosen.reason
        assert chosen.consts()["PERSISTENT"] is want, kw
        assert ("persistent" in chosen.reason) is want
        window_prefill(q, k, v, cu, 30, **kw)
        assert offered[-1].consts()["PERSISTENT"] is want
    any_width_is_wide(monkeypatch, 10**6)  # no window wide enough: the Triton kernel
    assert "PERSISTENT" not in explain(q, k, v, cu, 30, window=(127, -1)).consts()


def test_narrow_window_counts_keys():
    """``narrow_window`` counts a window's keys as ``wide_window`` does: ``left + 1`` causal (the right side
    moot), ``left + right + 1`` otherwise, unbounded when a side is."""
    m = wp_plan._PERSISTENT_MAX_WIDTH
    assert wp_plan.narrow_window(True, m - 1, -1) and not wp_plan.narrow_window(True, m, -1)
    assert wp_plan.narrow_window(True, 0, 10**9)  # (causal: the right side is moot)
    assert wp_plan.narrow_window(False, 10, m - 11) and not wp_plan.narrow_window(False, 10, m - 10)
    assert not any(wp_plan.narrow_window(c, left, right) for c in (True, False) for left, right in ((-1, 5),))
    assert not wp_plan.narrow_window(False, 5, -1)


def _plan(persistent: bool, block_m: int = 128) -> LaunchPlan:
    return LaunchPlan("gluon", "", block_m, LaunchPlan.items({"PERSISTENT": persistent}))


@pytest.mark.parametrize("kv_heads,group", [(8, 4), (2, 8), (1, 32), (6, 2), (12, 1), (5, 3)])
@pytest.mark.parametrize("n_tokens", [0, 1, 2400, 8192, 16384, 65536, 1 << 20])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_head_section(kv_heads, group, n_tokens, head_dim):
    """The persistent order's section: whole KV-head groups, a power-of-two count of KV heads that divides
    them, the most whose K/V fit ``L2_KV_BYTES`` (at least one): against a search over every count."""
    heads = kv_heads * group
    got = wl.head_section(n_tokens, heads, kv_heads, head_dim)
    per_kv = n_tokens * 4 * head_dim  # K and V of one KV head, 16 bits each
    fits = [n for n in range(1, kv_heads + 1)
            if kv_heads % n == 0 and n & (n - 1) == 0 and n * per_kv <= wl.L2_KV_BYTES]  # fmt: skip
    assert got == max(fits, default=1) * group
    assert heads % got == 0


@pytest.mark.parametrize("n_tokens,sections", [(1, False), (2400, False), (4096, False), (4097, True),
                                               (32768, True)])  # fmt: skip
def test_sections_variant(n_tokens, sections):
    """A persistent launch takes the head-sections variant (``SECTIONS``, its own compiled key) only where
    its K/V exceed ``L2_KV_BYTES`` (32/8 heads, d128: past 4096 tokens); else the variant key is the plain
    one, so launches whose K/V fit run the order without sections' arithmetic."""
    got = wl.head_section(n_tokens, 32, 8, 128) < 32
    assert got == sections
    key = ("plan", (1, 2), "cuda:0")
    assert (wl._sections_key(key, got) == key) == (not sections)


def test_persistent_grid(monkeypatch):
    """A persistent plan's grid is ``(min(multiprocessors, n_m * heads * batch), 1, 1)``: one program a
    multiprocessor over the one-tile grid's tiles; the one-tile form's ``(cdiv(max_len, 128), heads,
    batch)`` (at least one query tile)."""
    monkeypatch.setattr(wl, "multiprocessors", lambda index: 77)
    assert wl._gluon_grid(_plan(True), 300, 8, 3, 0) == (72, 1, 1)  # 3 * 8 * 3 tiles
    assert wl._gluon_grid(_plan(True), 3000, 8, 3, 0) == (77, 1, 1)
    assert wl._gluon_grid(_plan(True), 0, 2, 1, 0) == (2, 1, 1)
    assert wl._gluon_grid(_plan(False), 300, 8, 3, 0) == (3, 8, 3)
    assert wl._gluon_grid(_plan(False), 0, 8, 3, 0) == (1, 8, 3)


# ------------------------------------------------------------------------- CPU: offline sm90 compile
_COMPILE_SCRIPT = """
# head, lse, sinks mode, softcap form, causal, left, right
CASES = ((128, False, 0, 0, True, True, False), (128, True, 1, 2, True, False, False),
         (64, True, 2, 2, False, True, True), (256, False, 1, 0, True, True, False),
         (256, True, 0, 3, True, True, False), (64, False, 0, 0, True, False, False))
for i, (head_dim, lse, sinks, softcap, causal, left, right) in enumerate(CASES):
    compile_wp(head_dim, lse, sinks, softcap, IS_CAUSAL=causal, HAS_LEFT=left, HAS_RIGHT=right,
               PERSISTENT=True, SECTIONS=i % 2 == 0)  # (head sections in every other form)
"""


@pytest.mark.compile_check
def test_persistent_forms_compile_for_sm90():
    """The persistent form compiles for sm90 (no GPU needed) at heads 64 / 128 / 256 with the LSE, both
    sinks modes, soft-capping, both-way windows and head sections (``SECTIONS``), within one program's
    shared memory (227 KiB)."""
    if wl._gluon_fwd_kernel is None:
        pytest.skip("this Triton has no Gluon")
    shared, out = compile_gluon_for_sm90(WP_COMPILE_HEAD + _COMPILE_SCRIPT)
    assert len(shared) == 6 and max(shared) <= 227 * 1024, out


# ------------------------------------------------------------------------- GPU (sm90)
@pytest.fixture
def forms(monkeypatch):
    """``use(persistent, programs=None)``: the calls after it run the Gluon kernel (any window wide
    enough) in its persistent form with at most ``programs`` programs (None: one a multiprocessor), or in
    its one-tile form; returns the list of the Gluon launches' ``(PERSISTENT, grid)``."""
    any_width_is_wide(monkeypatch)
    count_gluon_launches(monkeypatch)
    real_plan, real_sms, real_grid = wl.plan, wl.multiprocessors, wl._gluon_grid
    state = {"persistent": True}
    grids: list[tuple[bool, tuple]] = []

    def grid(p, *args):
        g = real_grid(p, *args)
        grids.append((p.constexpr_map["PERSISTENT"], g))
        return g

    monkeypatch.setattr(wl, "_gluon_grid", grid)

    def forced(problem):
        chosen = real_plan(problem)
        if chosen.kernel != "gluon":
            return chosen
        return chosen.replace(constexprs={"PERSISTENT": state["persistent"]})

    monkeypatch.setattr(wl, "plan", forced)

    def use(persistent: bool, programs: int | None = None):
        state["persistent"] = persistent
        monkeypatch.setattr(wl, "multiprocessors", real_sms if programs is None else lambda index: programs)
        wl._planned.cache_clear()
        from window_prefill import api

        api.SEEN.clear()
        return grids

    yield use
    wl._planned.cache_clear()


GPU_CASES = [
    # lens, heads, kv_heads, head_dim, dtype, causal, window, sinks mode, softcap, lse
    ([3000, 1, 700], 8, 2, 128, torch.bfloat16, True, (127, -1), "denominator", 0.0, True),
    ([2500, 129, 1000], 4, 1, 128, torch.float16, True, (-1, -1), None, 0.0, False),
    ([1500, 2100], 4, 2, 128, torch.bfloat16, True, (511, -1), "denominator", 30.0, True),
    ([1300, 1, 64], 4, 4, 64, torch.bfloat16, False, (200, 60), "bias_key0", 0.0, True),
    ([900, 640, 5], 4, 2, 64, torch.float16, True, (63, -1), None, 20.0, False),
    ([1800, 77], 4, 2, 256, torch.bfloat16, True, (700, -1), "denominator", 50.0, True),
    ([600, 65, 64], 2, 1, 256, torch.float16, False, (-1, -1), "bias_key0", 0.0, False),
    ([127, 128, 129, 1, 255, 257], 3, 1, 128, torch.bfloat16, True, (0, -1), "bias_key0", 5.0, True),
    ([4096], 8, 2, 128, torch.bfloat16, True, (1023, -1), None, 0.0, False),
]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("programs", [1, 3, None])
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: f"{c[0][:2]}-h{c[3]}-{c[7]}-cap{c[8]:g}-w{c[6]}")
def test_gpu_persistent_matches_reference_and_one_tile(case, programs, forms):
    """The persistent form against the reference (output and LSE) with 1, 3 or one program a
    multiprocessor, and bit for bit the one-tile form's rows (the LSE within an ulp: see below)."""
    lens, heads, kv_heads, d, dtype, causal, window, mode, cap, want_lse = case
    q, k, v, cu = make_qkv(lens, heads, kv_heads, d, dtype)
    kw = dict(causal=causal, window=window, softcap=cap, return_lse=want_lse, **_sinks(heads, mode))
    outs = {}
    for persistent in (False, True):
        grids = forms(persistent, programs)
        before = len(grids)
        out = poison(torch.empty_like(q))
        res = window_prefill(q, k, v, cu, max(lens), out=out, **kw)
        assert len(grids) == before + 1 and grids[-1][0] is persistent, "the form did not run"
        if persistent and programs is not None:
            assert grids[-1][1] == (programs, 1, 1)
        outs[persistent] = res
    ref_kw = {n: x for n, x in kw.items() if n != "return_lse"}
    got = outs[True][0] if want_lse else outs[True]
    c = compare(got, reference(q, k, v, cu, **ref_kw))
    assert c, c
    same = dict(rtol=0, atol=0, equal_nan=True)  # bit for bit (a NaN where the other form has one)
    if want_lse:
        _, ref_lse = attention_varlen(q, k, v, cu, cu, return_lse=True, **ref_kw)
        finite = torch.isfinite(ref_lse)
        lse = outs[True][1]
        assert torch.equal(lse[~finite].double(), ref_lse[~finite])  # -inf where no key is seen, no NaN
        assert (lse.double()[finite] - ref_lse[finite]).abs().max().item() < 1e-3
        torch.testing.assert_close(outs[True][0], outs[False][0], **same)
        # the LSE within one float32 rounding of the one-tile form's: a key-0 sink bias (``bias_key0``) is
        # made per tile here and once per program there, and its logit may round apart by an ulp
        torch.testing.assert_close(lse, outs[False][1], rtol=2.4e-7, atol=0, equal_nan=True)
    else:
        torch.testing.assert_close(outs[True], outs[False], **same)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("programs", [1, 2, None])
def test_gpu_rows_past_the_grid_and_status(programs, forms):
    """A ``max_len`` below a sequence's length: the rows past the grid are 0 and the status reports
    ``MAX_LEN``; cu_seqlens past the tokens are clamped and reported (``ROWS``); outputs, LSE and status
    bit for bit the one-tile form's."""
    lens = [700, 300, 1]
    q, k, v, cu = make_qkv(lens, 4, 2, 128, torch.bfloat16)
    bad = cu.clone()
    bad[-1] += 50  # the last sequence runs past the tokens
    got = {}
    for persistent in (False, True):
        grids = forms(persistent, programs)
        for name, starts in (("short", cu), ("bad", bad)):
            status = torch.zeros(1, dtype=torch.int32, device=q.device)
            out = poison(torch.empty_like(q))
            o, lse = window_prefill(q, k, v, starts, 256, causal=True, window=(200, -1), out=out,
                                    return_lse=True, status=status)  # fmt: skip
            got[persistent, name] = (o, lse, int(status.item()))
            assert grids[-1][0] is persistent
    for name in ("short", "bad"):
        o, lse, st = got[True, name]
        o1, lse1, st1 = got[False, name]
        torch.testing.assert_close(o, o1, rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(lse, lse1, rtol=0, atol=0, equal_nan=True)
        assert st == st1, name
    o, lse, st = got[True, "short"]
    assert st & MAX_LEN and not st & ROWS
    assert torch.isfinite(o).all() and (o[256:700] == 0).all() and (o[956:1000] == 0).all()
    ref = reference(q, k, v, cu, causal=True, window=(200, -1))
    for rows in (slice(0, 256), slice(700, 956), slice(1000, 1001)):
        assert compare(o[rows], ref[rows]), rows
    assert got[True, "bad"][2] & ROWS


@pytest.mark.gpu
@needs_sm90
def test_gpu_tile_counter_reset_and_per_stream(forms):
    """The tile counter is back at zero after each launch (a launch after another computes every tile
    again, bit for bit), and each stream has its own: launches on two streams at once each compute every
    tile of their own call, bit for bit the same call alone."""
    forms(True, 4)  # few programs: many tiles a program
    q, k, v, cu = make_qkv([2000, 300], 8, 2, 128, torch.bfloat16)
    q2, k2, v2, cu2 = make_qkv([1700, 900], 8, 2, 128, torch.bfloat16)
    calls = ((q, k, v, cu, 2000), (q2, k2, v2, cu2, 1700))
    alone = [window_prefill(*c, causal=True) for c in calls]
    assert torch.equal(window_prefill(*calls[0], causal=True), alone[0])
    index = q.get_device()
    torch.cuda.synchronize()
    assert tile_counter(index).tolist() == [0, 0]
    streams = (torch.cuda.Stream(), torch.cuda.Stream())
    outs: list[list] = [[], []]
    for _ in range(3):
        for i, s in enumerate(streams):
            with torch.cuda.stream(s):
                outs[i].append(window_prefill(*calls[i], causal=True))
    torch.cuda.synchronize()
    for i in range(2):
        assert all(torch.equal(o, alone[i]) for o in outs[i]), i
    counters = [tile_counter(index, s.cuda_stream) for s in streams]
    assert counters[0] is not counters[1]
    assert all(c.tolist() == [0, 0] for c in counters)


# lens, heads, programs: the tiles the producers number (``sched[3]``) against the programs
FEW_TILES = [
    # 3 query tiles a sequence, 10 of the 18 tiles live: the whole space numbered, dead tiles skipped, the
    # counter handing out the numbers past the programs
    ([300, 1, 1], 2, 12),
    ([300, 1, 1], 2, 9),
    # 8 query tiles a sequence, 11 of the 32 tiles live: only the live tiles numbered; with at least 11
    # programs each runs its one tile and none touches the counter
    ([1000, 1, 1, 1], 1, 12),
    ([1000, 1, 1, 1], 1, 11),
    ([1000, 1, 1, 1], 1, 10),
]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("lens, heads, programs", FEW_TILES)
def test_gpu_dead_tiles_and_few_programs(lens, heads, programs, forms):
    """Ragged batches whose tile space is mostly dead or mostly live, with about as many programs as
    numbered tiles: bit for bit the one-tile form's rows, the reference's values, the counter at 0 after."""
    q, k, v, cu = make_qkv(lens, heads, 1, 128, torch.bfloat16)
    outs = {}
    for persistent in (False, True):
        grids = forms(persistent, programs)
        outs[persistent] = window_prefill(q, k, v, cu, max(lens), causal=True, window=(127, -1),
                                          out=poison(torch.empty_like(q)))  # fmt: skip
        assert grids[-1][0] is persistent
    assert grids[-1][1] == (programs, 1, 1)
    torch.testing.assert_close(outs[True], outs[False], rtol=0, atol=0, equal_nan=True)
    assert compare(outs[True], reference(q, k, v, cu, causal=True, window=(127, -1)))
    torch.cuda.synchronize()
    assert tile_counter(q.get_device()).tolist() == [0, 0]


@pytest.mark.gpu
@needs_sm90
def test_gpu_persistent_negative_control(forms):
    """The harness catches a wrong persistent kernel: the form run without its causal mask differs from
    the causal reference, and from the causal one-tile form."""
    q, k, v, cu = make_qkv([900, 300], 4, 2, 128, torch.bfloat16)
    grids = forms(True, 2)
    wrong = window_prefill(q, k, v, cu, 900, causal=False, window=(100, -1))
    right = window_prefill(q, k, v, cu, 900, causal=True, window=(100, -1))
    ref = reference(q, k, v, cu, causal=True, window=(100, -1))
    assert compare(right, ref) and not compare(wrong, ref)
    assert not torch.equal(wrong, right)
    assert grids == [(True, (2, 1, 1))] * 2
