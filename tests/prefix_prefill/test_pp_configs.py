"""The static config table, the shared-memory model, opt-in autotuning, and launch invariants."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import DEVICE
from pp_cases import make_case

from prefix_prefill import autotune, launch
from prefix_prefill import plan as plan_mod
from prefix_prefill.configs import (
    ARCHS,
    CONFIGS,
    DTYPE_CLASSES,
    HEAD_BUCKETS,
    PAGE_CLASSES,
    SHARED_MEMORY_BUDGET,
    KernelConfig,
    get_config,
    head_bucket,
    page_class,
    shared_memory_bytes,
)
from prefix_prefill.kernel import _fwd_kernel


def test_table_is_complete():
    for arch in ARCHS:
        for hb in HEAD_BUCKETS:
            for dc in DTYPE_CLASSES:
                for pc in PAGE_CLASSES:
                    assert (arch, hb, dc, pc) in CONFIGS


def test_page_size_never_changes_block_m_or_block_n():
    for arch in ARCHS:
        for hb in HEAD_BUCKETS:
            for dc in DTYPE_CLASSES:
                tiles = {
                    (CONFIGS[(arch, hb, dc, pc)].BLOCK_M, CONFIGS[(arch, hb, dc, pc)].BLOCK_N)
                    for pc in PAGE_CLASSES
                }
                assert len(tiles) == 1, (arch, hb, dc, tiles)


@pytest.mark.parametrize(("odd", "even"), [(544, 512), (1040, 1024), (1056, 1024), (17, 32)])
def test_odd_pages_run_the_power_of_two_config(odd, even):
    for arch in ARCHS:
        for d in (64, 128, 256):
            assert get_config(arch, d, torch.float16, odd) == get_config(arch, d, torch.float16, even)


def test_tiles_are_valid_dot_shapes():
    for cfg in CONFIGS.values():
        for v in (cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_N_CTX):
            assert v >= 16 and v & (v - 1) == 0, cfg
        assert cfg.num_warps in (1, 2, 4, 8, 16) and cfg.num_stages >= 1


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_amd_configs_fit_lds(arch):
    budget = {"gfx942": 64 * 1024, "gfx950": 160 * 1024}[arch]
    assert SHARED_MEMORY_BUDGET[arch] == budget
    for (a, hb, dc, _), cfg in CONFIGS.items():
        if a != arch:
            continue
        nbytes = shared_memory_bytes(cfg, hb, 4 if dc == "fp32" else 2)
        assert nbytes <= budget, (a, hb, dc, cfg, nbytes)


def test_nvidia_configs_fit_shared_memory():
    # sm90 and sm100 entries are checked against the compiled kernels' shared memory instead
    # (tests/compile_check): this static model over-counts (e.g. 262144 B modelled vs 164864 B
    # compiled for 128/64/128/8/3 at head size 128, which ran on the H200).
    for (a, hb, dc, _), cfg in CONFIGS.items():
        if a in ("sm80", "default"):
            nbytes = shared_memory_bytes(cfg, hb, 4 if dc == "fp32" else 2)
            assert nbytes <= SHARED_MEMORY_BUDGET[a], (a, hb, dc, cfg, nbytes)


def test_shared_memory_model():
    cfg = KernelConfig(128, 64, 64, 8, 3)
    # Q 128x128 + 3 stages of K and V 64x128 + P 128x64, 2 bytes each
    assert shared_memory_bytes(cfg, 128, 2) == 2 * (128 * 128 + 3 * 2 * 64 * 128 + 128 * 64)
    assert shared_memory_bytes(cfg, 80, 2) == shared_memory_bytes(cfg, 128, 2)  # padded to 128


def test_buckets_and_classes():
    assert [head_bucket(d) for d in (1, 64, 65, 80, 128, 192, 256)] == [64, 64, 128, 128, 128, 256, 256]
    with pytest.raises(ValueError, match="head size"):
        head_bucket(257)
    assert [page_class(p) for p in (1, 2, 16, 17, 544)] == ["1", "small", "small", "large", "large"]


def test_narrow_heads_and_fp8_caches_change_only_their_fields():
    """Heads below the 16-wide feature tile (sm80, 16-bit) run one stage, fp8 caches at head 256 on
    sm90 with 16-bit q 128/64/64 tiles (fp32 q keeps its own); every other field, and every other
    class, keeps the table's entry."""
    for dtype in (torch.float16, torch.bfloat16):
        base = get_config("sm80", 32, dtype, 16)
        assert get_config("sm80", 8, dtype, 16) == KernelConfig(**{**base.as_dict(), "num_stages": 1})
        assert get_config("sm80", 16, dtype, 16) == base  # 16 fills the tile
        for arch in ("sm90", "sm100", "gfx942", "gfx950", "default"):
            assert get_config(arch, 8, dtype, 16) == get_config(arch, 32, dtype, 16)
    assert get_config("sm80", 8, torch.float32, 16) == get_config("sm80", 32, torch.float32, 16)
    for head in (192, 256):
        for dtype in (torch.float16, torch.bfloat16):
            plain = get_config("sm90", head, dtype, 16)
            fp8 = get_config("sm90", head, dtype, 16, cache_fp8=True)
            assert fp8 == KernelConfig(128, 64, 64, plain.num_warps, plain.num_stages)
        assert get_config("sm90", head, torch.float32, 16, cache_fp8=True) == get_config(
            "sm90", head, torch.float32, 16
        )
    for arch, head in (("sm90", 128), ("sm90", 64), ("sm80", 256), ("sm100", 256), ("gfx950", 256)):
        assert get_config(arch, head, torch.float16, 16, cache_fp8=True) == get_config(
            arch, head, torch.float16, 16
        )


def test_unknown_arch_falls_back_to_default():
    assert get_config("sm75", 128, torch.float16, 16) == CONFIGS[("default", 128, "16bit", "small")]


# ------------------------------------------------------------------------------- autotune
def test_autotune_is_opt_in(monkeypatch):
    monkeypatch.delenv("PREFIX_PREFILL_AUTOTUNE", raising=False)
    assert not autotune.autotune_enabled()
    monkeypatch.setenv("PREFIX_PREFILL_AUTOTUNE", "1")
    assert autotune.autotune_enabled()


def test_autotune_times_stores_and_reuses(monkeypatch, tmp_path):
    monkeypatch.setenv("PREFIX_PREFILL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(autotune, "_MEMO", {})
    times = {64: 2.0, 128: 1.0}
    ran = []

    def fake_bench(fn, **_):
        fn()
        return times[ran[-1].BLOCK_M]

    monkeypatch.setattr(autotune.triton.testing, "do_bench", fake_bench)
    default = KernelConfig(64, 64, 64, 4, 2)
    cands = [KernelConfig(128, 64, 64, 8, 3), KernelConfig(64, 32, 32, 4, 2)]
    key = ("sm90", 128, "16bit", "large")
    best = autotune.tuned_config(torch.device("cpu"), key, ran.append, default, cands)
    assert best == cands[0]
    data = json.loads((tmp_path / "autotune.json").read_text())
    (entry_key,) = data
    assert entry_key.startswith("cpu|triton ") and entry_key.endswith("sm90,128,16bit,large")
    assert data[entry_key] == best.as_dict()
    # a fresh process (empty memo) reads the file instead of timing again
    monkeypatch.setattr(autotune, "_MEMO", {})
    n = len(ran)
    assert autotune.tuned_config(torch.device("cpu"), key, ran.append, default, cands) == best
    assert len(ran) == n


def test_autotune_candidates_fit_budget():
    for arch in ("sm90", "gfx942"):
        for c in autotune.candidates(arch, 256, 2):
            assert shared_memory_bytes(c, 256, 2) <= SHARED_MEMORY_BUDGET[arch]


# ------------------------------------------------------------------ launch invariants (no kernel)
class _Recorder:
    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append((grid, args, kwargs))

        return launch


def test_compiled_variants_do_not_depend_on_lengths_or_batch(monkeypatch):
    """Every constexpr is identical across batches of different sizes and lengths (but the packed GQA
    rows, ``PACK_GQA``, which follow their rule: rows the same bit for bit), and every integer argument
    that changes with them is excluded from Triton's specialisation."""
    rec = _Recorder()
    monkeypatch.setattr(launch, "_fwd_kernel", rec)
    monkeypatch.setenv("PREFIX_PREFILL_GLUON", "0")  # the Triton kernel's arguments (sm90 too)
    from prefix_prefill import prefix_prefill

    for seqs in ([(10, 5)], [(300, 70), (0, 1)], [(17, 33)] * 9, [(1000, 16), (1, 1), (64, 64)]):
        c = make_case(
            seqs, num_heads=4, num_kv_heads=1, head_size=64, page=16, dtype=torch.float16, device=DEVICE
        )
        prefix_prefill(
            c.q, c.k, c.v, c.k_cache, c.v_cache, c.block_table, c.cu_seqlens_q, c.seq_lens, c.max_query_len
        )
    kwargs = [{k: v for k, v in call[2].items() if k != "PACK_GQA"} for call in rec.calls]
    assert all(kw == kwargs[0] for kw in kwargs), "a constexpr depends on the lengths or the batch"
    names = _fwd_kernel.arg_names if hasattr(_fwd_kernel, "arg_names") else []
    mql = list(names).index("max_query_len")
    for _, args, kw in rec.calls:
        rule = plan_mod.pack_gqa(kw["BLOCK_M"], kw["QUERIES_PER_KV"], args[mql])
        assert kw.get("PACK_GQA", False) == rule, "PACK_GQA does not follow plan.pack_gqa"
    dns = getattr(_fwd_kernel, "do_not_specialize", None) or getattr(_fwd_kernel, "kwargs", {}).get(
        "do_not_specialize", []
    )
    dns_names = {names[i] if isinstance(i, int) else i for i in dns}
    first = rec.calls[0][1]
    for _, args, _ in rec.calls[1:]:
        for i, (a, b) in enumerate(zip(first, args, strict=True)):
            if isinstance(a, int) and a != b:
                assert names[i] in dns_names, f"{names[i]} changes with the lengths but is specialised"


# ------------------------------------------------------------------------------ layout hints
def _hints(k_cache, v_cache, layout, bn_ctx=64):
    from paged_kv_offsets import describe_kv_cache

    kc, vc = describe_kv_cache(k_cache, v_cache, layout)
    d = kc.head_size
    q = torch.empty(
        1, kc.num_kv_heads, d, dtype=k_cache.dtype if k_cache.dtype.itemsize > 1 else torch.float16
    )
    bt = torch.zeros(1, 1, dtype=torch.int32)
    p = plan_mod.make_problem(
        q,
        None,
        None,
        q,
        k_cache,
        v_cache,
        kc,
        vc,
        bt,
        arch="interpreter",
        gluon=False,
        causal=True,
        left=-1,
        right=-1,
        scale=1.0,
        alibi=False,
        sinks=False,
        softcap_form=0,
        skip_decode=False,
        lse=False,
    )
    return plan_mod._layout_hints(p, bn_ctx)


def test_layout_hints_split_layout():
    def split(page, nb=4, h=2, d=128):
        return torch.empty(nb, h, d // 8, page, 8, dtype=torch.float16), torch.empty(
            nb, h, d, page, dtype=torch.float16
        )

    # vLLM layout: K runs of x=8 halves (16 B); V runs of gcd(page, 64) tokens along the page, capped at
    # one 16-byte vector (8 halves), so pages 16, 544 and 1056 promise the same
    assert _hints(*split(16), "split") == (True, False, True, 8)
    assert _hints(*split(544), "split") == (True, False, True, 8)
    assert _hints(*split(1056), "split", bn_ctx=32) == (True, False, True, 8)
    assert _hints(*split(8), "split") == (True, False, True, 8)
    fp32 = (torch.empty(4, 2, 32, 16, 4), torch.empty(4, 2, 128, 16))  # 4 floats = 16 B
    assert _hints(*fp32, "split") == (True, False, True, 4)
    # page 17: V dim stride 17 halves is not 16-byte aligned and runs are single tokens
    assert _hints(*split(17), "split") == (True, False, False, 1)
    # page 4: runs of 4 halves (8 B) are too short to promise 16-byte alignment
    assert _hints(*split(4), "split") == (True, False, False, 4)


def test_layout_hints_nhd_and_misaligned_views():
    k = torch.empty(4, 16, 2, 128, dtype=torch.float16)
    v = torch.empty(4, 16, 2, 128, dtype=torch.float16)
    assert _hints(k, v, "nhd") == (True, True, False, 1)
    # a view whose data pointer is off by one element promises nothing
    kk = torch.empty(4 * 16 * 2 * 128 + 1, dtype=torch.float16)[1:].view(4, 16, 2, 128)
    assert _hints(kk, kk, "nhd") == (False, False, False, 1)
    # head size 36 (72 B per token) breaks the 16-byte stride rule
    k36 = torch.empty(4, 16, 2, 36, dtype=torch.float16)
    assert _hints(k36, k36, "hnd")[:2] == (False, False)


def test_narrow_heads_take_a_16_wide_feature_tile():
    """Heads narrower than one dot's K of 16 are padded to a 16-wide feature tile on every architecture
    (a narrower tile does not compile: ``tl.dot`` needs K >= 16)."""
    from pp_cases import problem_of

    for head in (1, 8, 12, 16):
        case = make_case([(5, 3)], num_heads=2, num_kv_heads=1, head_size=head, page=16, dtype=torch.float16,
                         device="cpu")  # fmt: skip
        for arch in ("sm90", "sm100", "sm80", "gfx942", "interpreter"):
            c = plan_mod.triton_plan(problem_of(case, arch=arch)).consts()
            assert (c["HEAD_DIM"], c["BLOCK_D"]) == (head, 16), (head, arch)


def test_granule_edges_only_where_the_mma_reads_shared_memory():
    """Head 256 over vLLM's split cache loads masked V tiles by granule on sm90 (wgmma), sm100 and AMD,
    not on sm80 and unknown GPUs (mma.sync: the granules only add registers there)."""
    from pp_cases import problem_of

    case = make_case([(40, 9)], num_heads=2, num_kv_heads=1, head_size=256, page=16, dtype=torch.float16,
                     device="cpu", layout="split")  # fmt: skip
    granule = {a: plan_mod.triton_plan(problem_of(case, arch=a)).consts()["GRANULE"] for a in ARCHS}
    assert granule == {"sm90": 8, "sm100": 8, "gfx942": 8, "gfx950": 8, "interpreter": 8, "sm80": 0,
                       "default": 0}  # fmt: skip
