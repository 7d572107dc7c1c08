"""Determinism and batch invariance.

CPU: the config lookups of both packages take no length or batch argument, and the launches the four
public functions make for different batch compositions differ only in the grid and in integer
arguments the kernel declares ``do_not_specialize`` (so the set of compiled variants cannot depend on
lengths or batch size), but for the prefix Triton kernel's packed-GQA form, which its rule takes for
short queries (rows the same bit for bit). A sequence gives bitwise the same rows alone or inside any
batch (interpreter).

GPU (bf16): 100 repeated calls give bitwise identical outputs, and one sequence gives bitwise the same
rows alone or inside batches of different compositions (other sequences before/after it, different
max lengths), for both kernels.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from conftest import DEVICE, ON_GPU
from hd_util import cu_of, dense_case, paged_case

import prefix_prefill.configs as pp_configs
import prefix_prefill.launch as pp_iface
import prefix_prefill.plan as pp_plan
import window_prefill.configs as wp_configs
import window_prefill.launch as wp_iface
from prefix_prefill import context_attention_fwd as pp_caf
from prefix_prefill import prefix_prefill
from window_prefill import context_attention_fwd as wp_caf
from window_prefill import explain as wp_explain
from window_prefill import window_prefill

LENGTH_WORDS = ("len", "batch", "seq", "token", "max", "num_q", "total")


# ------------------------------------------------------------------------------- config lookups
@pytest.mark.parametrize(
    ("fn", "allowed"),
    [
        (wp_configs.get_config, {"head_dim", "dtype", "causal", "arch"}),
        (pp_configs.get_config, {"arch", "head_size", "dtype", "page_size", "cache_fp8"}),
        (pp_configs.config_key, {"arch", "head_size", "dtype", "page_size"}),  # also the autotune cache key
    ],
    ids=["window_prefill.get_config", "prefix_prefill.get_config", "prefix_prefill.config_key"],
)
def test_config_lookup_takes_no_length_or_batch(fn, allowed):
    params = set(inspect.signature(fn).parameters)
    assert params == allowed, params
    assert not [p for p in params if any(w in p for w in LENGTH_WORDS)]


def test_config_lookup_is_a_pure_table():
    for arch in wp_configs.ARCHS:
        for d in (16, 64, 80, 128, 192, 256):
            for dt in (torch.float16, torch.bfloat16, torch.float32):
                for causal in (False, True):
                    assert wp_configs.get_config(d, dt, causal, arch) == wp_configs.get_config(
                        d, dt, causal, arch
                    )
    for arch in pp_configs.ARCHS:
        for d in (16, 64, 80, 128, 192, 256):
            for dt in (torch.float16, torch.bfloat16, torch.float32):
                cfgs = {pp_configs.get_config(arch, d, dt, p) for p in (1, 3, 16, 17, 544, 1056)}
                # page size may change BLOCK_N_CTX / num_stages only, never the query/key tiles
                assert len({(c.BLOCK_M, c.BLOCK_N) for c in cfgs}) == 1


# ------------------------------------------------------------------------ launches vs batch shape
class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[tuple, tuple, dict]] = []

    def __getitem__(self, grid: tuple):
        def launch(*args: object, **kwargs: object) -> None:
            self.calls.append((tuple(grid), args, kwargs))

        return launch


def _not_specialized(kernel: object) -> set[str]:
    """Names the kernel declares ``do_not_specialize`` (JITFunction or the interpreter's wrapper)."""
    kw = getattr(kernel, "kwargs", None)
    listed = (
        kw.get("do_not_specialize") if isinstance(kw, dict) else getattr(kernel, "do_not_specialize", None)
    )
    names = list(kernel.arg_names)
    out = {names[n] if isinstance(n, int) else str(n) for n in (listed or [])}
    out |= {p.name for p in getattr(kernel, "params", []) if getattr(p, "do_not_specialize", False)}
    return out


def _specialization(kernel: object, args: tuple, kwargs: dict) -> tuple:
    """What selects a compiled variant: every kwarg (constexprs, warps, stages), the dtype of every
    tensor argument, and the value of every specialised non-tensor argument."""
    skip = _not_specialized(kernel)
    names = list(kernel.arg_names)
    sig = []
    for name, a in zip(names, args, strict=False):
        if isinstance(a, torch.Tensor):
            sig.append((name, a.dtype))
        elif name not in skip:
            sig.append((name, a))
    return (tuple(sig), tuple(sorted(kwargs.items())))


WINDOW_BATCHES = [[5], [5, 40], [40, 5, 1, 17], [1] * 9, [33]]


def _launch_window(form: str, lens: list[int]) -> None:
    total = sum(lens)
    q = torch.randn(total, 4, 32, device=DEVICE).half()
    k = torch.randn(total, 2, 32, device=DEVICE).half()
    v = torch.randn(total, 2, 32, device=DEVICE).half()
    cu = cu_of(lens)
    if form == "window_prefill":
        window_prefill(q, k, v, cu, max(lens), window=(7, -1))
    elif form == "window_prefill-lse":  # the LSE's head stride is the token count: not specialised
        window_prefill(q, k, v, cu, max(lens), window=(7, -1), return_lse=True)
    else:
        lens_t = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
        wp_caf(q, k, v, torch.empty_like(q), cu[:-1], lens_t, max(lens), True, None, 7)


# (max_query_len x 2 query heads a KV head: both sides of the packed-GQA rule at 16-row interpreter
# tiles and at 128-row GPU tiles)
PREFIX_BATCHES = [[(0, 5)], [(100, 3), (0, 70)], [(7, 1)] * 6, [(300, 17), (2, 2), (0, 1)]]


def _launch_prefix(form: str, seqs: list[tuple[int, int]]) -> None:
    c = paged_case(
        seqs,
        heads=4,
        kv_heads=2,
        head=32,
        page=16,
        dtype=torch.float16,
        layout="split" if not form.startswith("prefix_prefill") else "nhd",
    )
    if form.startswith("prefix_prefill"):
        prefix_prefill(
            c.q,
            c.k,
            c.v,
            c.k_cache,
            c.v_cache,
            c.block_table,
            c.cu_q,
            c.seq_lens,
            c.max_query_len,
            window=(31, -1),
            return_lse=form == "prefix_prefill-lse",
        )
    else:
        one = torch.ones(1, device=DEVICE)
        pp_caf(
            c.q,
            c.k,
            c.v,
            torch.empty_like(c.q),
            "auto",
            c.k_cache,
            c.v_cache,
            c.block_table,
            c.cu_q,
            c.seq_lens,
            None,
            c.max_query_len,
            one,
            one,
            sliding_window=32,
        )


@pytest.mark.parametrize(
    "form",
    [
        "window_prefill",
        "window_prefill-lse",
        "window-context_attention_fwd",
        "prefix_prefill",
        "prefix_prefill-lse",
        "prefix-context_attention_fwd",
    ],
)
def test_compiled_variant_does_not_depend_on_lengths_or_batch(form, monkeypatch):
    rec = Recorder()
    if form.startswith("window"):
        real = wp_iface._fwd_kernel
        monkeypatch.setattr(wp_iface, "_fwd_kernel", rec)
        for lens in WINDOW_BATCHES:
            _launch_window(form, lens)
    else:
        real = pp_iface._fwd_kernel
        monkeypatch.setattr(pp_iface, "_fwd_kernel", rec)
        for seqs in PREFIX_BATCHES:
            _launch_prefix(form, seqs)
    assert len(rec.calls) >= 4
    # the one form a call's lengths choose: the prefix Triton kernel's packed GQA rows, by its rule
    # (prefix_prefill.plan.pack_gqa), whose rows are the same bit for bit (test_pp_pack_gqa.py)
    specs = {_specialization(real, args, {k: v for k, v in kw.items() if k != "PACK_GQA"})
             for _, args, kw in rec.calls}  # fmt: skip
    assert len(specs) == 1, "the compiled variant changed with the batch composition"
    if form.startswith("prefix"):
        mql = list(real.arg_names).index("max_query_len")
        packed = [kw.get("PACK_GQA", False) for _, _, kw in rec.calls]
        assert packed == [pp_plan.pack_gqa(kw["BLOCK_M"], kw["QUERIES_PER_KV"], args[mql])
                          for _, args, kw in rec.calls]  # fmt: skip
        assert set(packed) == {True, False}, "the batches were meant to take both forms"
    grids = {grid for grid, _, _ in rec.calls}
    assert len(grids) > 1, "the batches were meant to need different grids"


@pytest.mark.parametrize("kernel", ["window", "prefix"])
def test_return_lse_off_launches_the_variant_of_before(kernel, monkeypatch):
    """Without return_lse the kernel gets no LSE argument (``Lse``/``stride_lse_h`` None: constexprs, not
    in the compiled signature) and ``RETURN_LSE=False``; with it, only those three (and the output
    buffer each call allocates) differ."""
    rec = Recorder()
    iface = wp_iface if kernel == "window" else pp_iface
    names = list(iface._fwd_kernel.arg_names)
    monkeypatch.setattr(iface, "_fwd_kernel", rec)
    for form in ("_prefill", "_prefill-lse"):
        torch.manual_seed(0)  # the same problem twice
        if kernel == "window":
            _launch_window("window" + form, [9, 14])
        else:
            _launch_prefix("prefix" + form, [(20, 9), (0, 5)])
    (_, a0, kw0), (_, a1, kw1) = rec.calls
    i, j = names.index("Lse"), names.index("stride_lse_h")
    assert a0[i] is None and a0[j] is None and kw0["RETURN_LSE"] is False
    total = a1[0].shape[0]  # q: [total tokens, heads, head size]
    assert isinstance(a1[i], torch.Tensor) and a1[i].shape == (4, total) and a1[i].dtype == torch.float32
    assert a1[j] == total  # the LSE's head stride (contiguous [heads, total])
    assert kw1["RETURN_LSE"] is True
    assert {k: v for k, v in kw0.items() if k != "RETURN_LSE"} == {
        k: v for k, v in kw1.items() if k != "RETURN_LSE"
    }
    for n, x, y in zip(names, a0, a1, strict=False):  # positional arguments; constexprs are keywords
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and x.shape == y.shape and x.stride() == y.stride(), n
        elif n not in ("Lse", "stride_lse_h"):
            assert x == y, n


# ------------------------------------------------------------------------------ batch invariance
def _window_batch_invariance(
    dtype: torch.dtype, target: int, others: list[int], heads: int, kv: int, d: int, window: tuple[int, int]
) -> None:
    """Sequence S alone, then with other sequences before/after it: S's rows are bitwise identical."""
    gen = torch.Generator().manual_seed(1)

    def rand(n: int, h: int) -> torch.Tensor:
        return torch.randn(n, h, d, generator=gen).to(device=DEVICE, dtype=dtype)

    s = (rand(target, heads), rand(target, kv), rand(target, kv))
    pool = {n: (rand(n, heads), rand(n, kv), rand(n, kv)) for n in others}
    layouts = [[], [others[0]], [None, others[-1]], [*others[:2], None, *others[2:]]]
    rows, kernels = [], set()
    for layout in layouts:
        order = layout if None in layout else [*layout, None]
        parts = [s if n is None else pool[n] for n in order]
        lens = [target if n is None else n for n in order]
        q, k, v = (torch.cat([p[i] for p in parts]) for i in range(3))
        at = sum(lens[: order.index(None)])
        kernels.add(wp_explain(q, k, v, cu_of(lens), max(lens), window=window).kernel)
        out = window_prefill(q, k, v, cu_of(lens), max(lens), window=window)
        rows.append(out[at : at + target])
        lens_t = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
        o = torch.empty_like(q)
        wp_caf(
            q, k, v, o, cu_of(lens)[:-1], lens_t, max(lens), True, None, window[0] if window[0] > 0 else None
        )
        rows.append(o[at : at + target])
    assert len(kernels) == 1, f"the batch around the sequence changed its kernel: {kernels}"
    for r in rows[1:]:
        assert torch.equal(r, rows[0]), "a sequence's rows changed with the batch around it"


def _prefix_batch_invariance(
    dtype: torch.dtype,
    target: tuple[int, int],
    others: list[tuple[int, int]],
    heads: int,
    kv: int,
    d: int,
    page: int,
    window: tuple[int, int],
    layout: str = "nhd",
) -> None:
    """Sequence S alone and inside batches: the cache and S's pages are shared, rows bitwise identical
    (``layout``: the caches as NHD or vLLM's split layout)."""
    gen = torch.Generator().manual_seed(2)
    seqs = [target, *others]
    pages = [-(-(c + n) // page) for c, n in seqs]
    nb = sum(pages) + 1
    perm = torch.randperm(nb, generator=gen)
    k_cache = torch.randn(nb, page, kv, d, generator=gen).to(device=DEVICE, dtype=dtype)
    v_cache = torch.randn(nb, page, kv, d, generator=gen).to(device=DEVICE, dtype=dtype)
    if layout == "split":  # K [blocks, kv, d / 8, page, 8], V [blocks, kv, d, page]
        k_cache = k_cache.view(nb, page, kv, d // 8, 8).permute(0, 2, 3, 1, 4).contiguous()
        v_cache = v_cache.permute(0, 2, 3, 1).contiguous()
    ids, at = [], 0
    for p in pages:
        ids.append(perm[at : at + p].tolist())
        at += p
    qkv = [
        tuple(torch.randn(n, h, d, generator=gen).to(device=DEVICE, dtype=dtype) for h in (heads, kv, kv))
        for _, n in seqs
    ]
    compositions = [[0], [1, 0], [0, len(seqs) - 1], [*range(1, len(seqs)), 0], [2, 0, 1]]
    rows = []
    for comp in compositions:
        width = max(len(ids[i]) for i in comp)
        table = torch.zeros(len(comp), width, dtype=torch.int32)
        for r, i in enumerate(comp):
            table[r, : len(ids[i])] = torch.tensor(ids[i], dtype=torch.int32)
        q, k, v = (torch.cat([qkv[i][j] for i in comp]) for j in range(3))
        q_lens = [seqs[i][1] for i in comp]
        seq_lens = torch.tensor([sum(seqs[i]) for i in comp], dtype=torch.int32, device=DEVICE)
        out = prefix_prefill(
            q,
            k,
            v,
            k_cache,
            v_cache,
            table.to(DEVICE),
            cu_of(q_lens),
            seq_lens,
            max(q_lens),
            window=window,
            kv_layout=layout,
        )
        at = sum(q_lens[: comp.index(0)])
        rows.append(out[at : at + target[1]])
    for r in rows[1:]:
        assert torch.equal(r, rows[0]), "a sequence's rows changed with the batch around it"


@pytest.mark.skipif(ON_GPU, reason="the GPU runs the bf16 version below")
def test_batch_invariance_interpreter():
    _window_batch_invariance(torch.float16, 37, [5, 70, 1, 20], 2, 1, 32, (9, -1))
    _prefix_batch_invariance(torch.float16, (29, 21), [(0, 40), (3, 1), (64, 7)], 2, 1, 32, 16, (-1, -1))


@pytest.mark.gpu
@pytest.mark.parametrize("window", [(-1, -1), (255, -1)])
def test_gpu_window_batch_invariance_bf16(window):
    _window_batch_invariance(torch.bfloat16, 1000, [4000, 17, 1, 2500], 16, 4, 128, window)


@pytest.mark.gpu
@pytest.mark.parametrize("window", [(-1, -1), (511, -1)])
@pytest.mark.parametrize("page", [16, 544])
def test_gpu_prefix_batch_invariance_bf16(window, page):
    _prefix_batch_invariance(
        torch.bfloat16, (3000, 700), [(0, 2048), (5000, 1), (100, 3000)], 16, 4, 128, page, window
    )


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [(16, 4), (12, 4)], ids=["paired", "idle"])
@pytest.mark.parametrize("layout", ["nhd", "split"])
def test_gpu_prefix_batch_invariance_short_query_bf16(layout, heads, monkeypatch):
    """A speculative-decoding sized query (4 rows on a 3000-token context) alone runs, on Hopper, the
    short-query Gluon form that packs its KV head's query heads into the first warpgroup's rows (4 rows
    within ``packed_tokens(64, 4) = 16``; its second warpgroup idles); among eleven other short queries,
    with 16 / 4 heads, the form whose second warpgroup takes the next head (192 idle programs: more than
    one wave), with 12 / 4 the idle one; beside longer queries, the form with two warpgroups on one head's
    rows: its rows are the same bit for bit in every form (the full forms, compile tiers off)."""
    monkeypatch.setenv("PREFIX_PREFILL_GLUON_TIERED", "0")
    for others in ([(0, 2048), (5000, 1), (100, 60)], [(200, 4)] * 10 + [(100, 60)]):
        _prefix_batch_invariance(torch.bfloat16, (3000, 4), others, *heads, 128, 16, (-1, -1), layout)


@pytest.mark.gpu
def test_gpu_window_deterministic_100_calls():
    c = dense_case([1000, 37, 2500, 1], 16, 4, 128, torch.bfloat16)
    first = window_prefill(c.q, c.k, c.v, c.cu, c.max_len, window=(255, -1))
    out = torch.empty_like(first)
    for _ in range(100):
        window_prefill(c.q, c.k, c.v, c.cu, c.max_len, window=(255, -1), out=out)
        assert torch.equal(out, first)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["split", "nhd"])
def test_gpu_prefix_deterministic_100_calls(layout):
    c = paged_case(
        [(3000, 700), (0, 2048), (5000, 1), (100, 3000)],
        heads=16,
        kv_heads=4,
        head=128,
        page=16,
        dtype=torch.bfloat16,
        layout=layout,
    )
    args = (c.q, c.k, c.v, c.k_cache, c.v_cache, c.block_table, c.cu_q, c.seq_lens, c.max_query_len)
    first = prefix_prefill(*args, kv_layout=layout)
    out = torch.empty_like(first)
    for _ in range(100):
        prefix_prefill(*args, kv_layout=layout, out=out)
        assert torch.equal(out, first)
