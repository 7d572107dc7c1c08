"""The bench scripts run end to end on the CPU (Triton interpreter, tiny shapes), so their code paths
keep working without a GPU; an A/B's two plans (bench/plan_override.py) give bitwise-equal outputs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from conftest import ON_GPU, bench_module

ROOT = Path(__file__).resolve().parents[2]

# CPU checks of the scripts' code paths; on a GPU node bench/gpu_session.sh runs the scripts for real
# (and there the scripts pick the GPU path whatever TRITON_INTERPRET says).
pytestmark = pytest.mark.skipif(ON_GPU, reason="interpreter smoke runs; a GPU session runs the scripts")


def _bench(script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """Run ``bench/<script>`` with ``args`` (under the interpreter unless ``env`` says otherwise) and
    assert that it exits 0."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        env={**os.environ, "TRITON_INTERPRET": "1", **env},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    return proc


def test_ab_prefix_smoke():
    """bench/ab_prefix.py, the prefix A/B tool: one constexpr of the plans off and on (the block-id
    prefetch, which changes no arithmetic: bitwise-equal outputs), the page-size spread of each setting
    and the setting it chooses."""
    proc = _bench("ab_prefix.py", "--smoke", "--switch", "PREFETCH_IDS")
    equal = [line for line in proc.stdout.splitlines() if "bitwise equal" in line]
    assert len(equal) == 2 and all("bitwise equal off/on: True" in line for line in equal), proc.stdout
    assert "SPREAD tiny nhd PREFETCH_IDS=True" in proc.stdout, proc.stdout
    assert "CHOICE PREFETCH_IDS=" in proc.stdout, proc.stdout


def test_plan_override_changes_one_constexpr():
    """bench/plan_override.py, the ``--set NAME=V`` A/B of bench/prefix_prefill.py and
    bench/window_prefill.py: inside the block each package's calls run their plan with the constexpr
    changed (a switch that changes no arithmetic: bitwise-equal outputs); after it, the plan as shipped;
    the ``kernel`` filter's matches."""
    import torch

    import prefix_prefill
    import window_prefill
    import window_prefill.launch as wl

    po = bench_module("plan_override")
    g = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(torch.float16)

    cu = torch.tensor([0, 40], dtype=torch.int32)
    wargs, wkw = (randn(40, 2, 32), randn(40, 1, 32), randn(40, 1, 32), cu, 40), {"window": (10, -1)}
    plain = window_prefill.window_prefill(*wargs, **wkw)
    planned = []
    with po.overridden("window_prefill", {"WIDE_OFFSETS": True}):
        inner = wl.plan
        with mock.patch.object(wl, "plan", side_effect=lambda p: planned.append(inner(p)) or planned[-1]):
            changed = window_prefill.window_prefill(*wargs, **wkw)
    assert [p.consts()["WIDE_OFFSETS"] for p in planned] == [True], planned
    assert torch.equal(plain, changed)

    k_cache, v_cache = randn(6, 16, 1, 32), randn(6, 16, 1, 32)
    block_table = torch.tensor([[3, 1, 4]], dtype=torch.int32)
    pargs = (randn(8, 2, 32), randn(8, 1, 32), randn(8, 1, 32), k_cache, v_cache, block_table,
             torch.tensor([0, 8], dtype=torch.int32), torch.tensor([40], dtype=torch.int32))  # fmt: skip
    shipped = prefix_prefill.explain(*pargs, max_query_len=8).consts()["PREFETCH_IDS"]
    plain = prefix_prefill.prefix_prefill(*pargs, max_query_len=8)
    with po.overridden("prefix_prefill", {"PREFETCH_IDS": not shipped}, kernel="triton"):
        assert prefix_prefill.explain(*pargs, max_query_len=8).consts()["PREFETCH_IDS"] is not shipped
        changed = prefix_prefill.prefix_prefill(*pargs, max_query_len=8)
    assert prefix_prefill.explain(*pargs, max_query_len=8).consts()["PREFETCH_IDS"] is shipped
    assert torch.equal(plain, changed)
    # the kernel filter: a plan's own kernel, a family by its prefix, the NHD/HND kernel's two plans
    for kernel, planned, hit in (("gluon-nhd", "gluon-nhd", True), ("gluon-nhd", "gluon-hnd", False),
                                 ("gluon", "gluon-hnd", True), ("gluon-tma", "gluon-hnd", True),
                                 ("gluon-tma", "gluon-nhd", True), ("gluon-tma", "gluon-split", False),
                                 ("triton", "gluon-nhd", False)):  # fmt: skip
        assert po._matches(kernel, planned) is hit, (kernel, planned)


def test_first_call_smoke(tmp_path):
    """bench/first_call.py: a child process per kernel (cold runs: the interpreter compiles nothing to
    keep warm; prefix_kvcache's child takes every line of prefix's), rows written; the children start
    prefill_runtime's priming early (``--prime-early``, recorded per row) before their timed call."""
    _bench("first_call.py", "--smoke", "--prime-early", "0.05", "--out", str(tmp_path))
    text = (tmp_path / "first_call.csv").read_text()
    assert "prime_early_s" in text.splitlines()[0], text
    for kernel in ("window", "prefix_kvcache"):
        assert f"\n{kernel},fp16,64,cold," in text and ",0.05," in text, text
    assert "True" not in text, "a second call with other lengths recompiled"


def test_sanitize_edge_smoke():
    """bench/sanitize_edge.py (the memcheck edge suite) under the interpreter, on cases of its quick
    subset that take every window sinks mode, every prefix option set (fp8 caches, ALiBi, k=None, both
    API forms) and all three cache layouts."""
    proc = _bench("sanitize_edge.py", "--cases", "0,1,2,6,7,8,9,10,11,20")
    assert proc.stdout.strip().splitlines()[-1] == "13 cases OK", proc.stdout[-2000:]


def test_malformed_calls_smoke():
    """bench/malformed_calls.py (malformed metadata under memcheck) runs one window problem's cases under
    the interpreter: every row written, status flagged, validate=True raising."""
    proc = _bench("malformed_calls.py", "--problems", "wp-triton")
    assert proc.stdout.strip().splitlines()[-1] == "7 cases OK", proc.stdout[-2000:]


def test_prefix_bench_from_logs(tmp_path):
    """bench/prefix_prefill.py --from-logs rebuilds the csv/md from printed measurement lines (a later
    line for the same shape, page and peer wins; other lines are ignored); no GPU needed."""
    log1, log2 = tmp_path / "a.log", tmp_path / "b.log"
    log1.write_text(
        "# NVIDIA H200, shapes ['llama']\n"
        "shape=llama  page=544  peer=ours  ms=9.5  tflops=347.1  floor_ms=4.144  pct_of_floor=43.6  "
        "note=split layout (vLLM's)\n"
        "shape=llama  page=-  peer=flex  ms=7.85  tflops=420.1  floor_ms=4.144  pct_of_floor=52.8  note=x\n"
    )
    log2.write_text(
        "shape=llama  page=544  peer=ours  ms=9.25  tflops=356.5  floor_ms=4.144  pct_of_floor=44.8  "
        "note=max|a-b|=0\nnot a row\n"
    )
    out = tmp_path / "out"
    _bench("prefix_prefill.py", "--out", str(out), "--from-logs", str(log1), str(log2),
           BENCH_GPU="TEST GPU", BENCH_COMMIT="abc1234")  # fmt: skip
    csv_text = (out / "prefix_prefill.csv").read_text().splitlines()
    assert csv_text[0] == "shape,page,peer,ms,tflops,floor_ms,pct_of_floor,note"
    assert len(csv_text) == 3, csv_text
    assert csv_text[1].startswith("llama,544,ours,9.25,"), csv_text
    md = (out / "prefix_prefill.md").read_text()
    assert md.startswith("<!-- TEST GPU,") and "commit abc1234" in md
    assert "max\\|a-b\\|=0" in md


# one scenario of each kind the script builds: chunks on contexts (and none), skip_decode, non-causal
# varlen (with torch SDPA beside) and causal varlen (the others differ in sizes only)
SMOKE_SCENARIOS = [
    "prefix_4chunks_0-8k", "decode_mix_skip_decode", "vision_16x1024_d64", "varlen_8prompts_100-500",
]  # fmt: skip


def test_engine_step_smoke(tmp_path):
    """bench/engine_step.py --smoke (L=2, tiny sizes, fp16, no graphs): every implementation and table
    runs on a scenario of each kind; our outputs match the float64 reference, and vLLM's where .peers is
    present."""
    import csv

    _bench("engine_step.py", "--smoke", "--scenarios", ",".join(SMOKE_SCENARIOS), "--host-calls", "1",
           "--out", str(tmp_path))  # fmt: skip
    vllm = (ROOT / ".peers" / "vllm").is_dir()

    def read(stem):
        assert (tmp_path / f"{stem}.md").exists()
        with (tmp_path / f"{stem}.csv").open() as f:
            return list(csv.DictReader(f))

    steps = read("engine_step")
    assert sorted({r["scenario"] for r in steps}) == sorted(SMOKE_SCENARIOS), steps
    impls = {(r["scenario"], r["impl"]) for r in steps}
    assert {("decode_mix_skip_decode", "ours_caf"), ("vision_16x1024_d64", "sdpa")} <= impls, impls
    assert {("prefix_4chunks_0-8k", i) for i in ("ours_caf", "ours_pp_split", "ours_pp_nhd")} <= impls, impls
    assert {("varlen_8prompts_100-500", i) for i in ("ours_caf", "ours_wp")} <= impls, impls
    assert ("decode_mix_skip_decode", "ours_pp_split") not in impls  # prefix_prefill() has no skip_decode
    assert (("prefix_4chunks_0-8k", "vllm") in impls) == vllm, impls
    for r in steps:
        assert not r["note"].startswith(("failed", "skipped")), r
        assert float(r["wall_ms"]) > 0 and float(r["diff_vs_ref"]) < 1e-2, r
        if r["impl"] != "vllm" and vllm:
            assert float(r["diff_vs_vllm"]) < 1e-2, r
    host = read("engine_host")
    assert {r["impl"] for r in host} >= {
        "ours_pp_caf",
        "ours_pp_split",
        "ours_pp_nhd",
        "ours_wp_caf",
        "ours_wp",
        # the model options' rows (engine_step.FEATURES)
        *(f"ours_pp_nhd_{f}" for f in ("alibi", "sinks", "cap50", "fp8_out", "fp8_cache")),
        *(f"ours_wp_{f}" for f in ("alibi", "sinks", "cap50", "fp8_out")),
    }
    assert all(float(r["host_us"]) > 0 and "failed" not in r["note"] for r in host), host
    launches = read("engine_launches")
    assert len(launches) == (21 if vllm else 18), launches
    assert not any(r["note"] for r in launches), launches


def test_engine_step_classify_events():
    """bench/engine_step.py's kernel counting on made-up torch.profiler events (no GPU needed)."""
    from types import SimpleNamespace

    mod = bench_module("engine_step")

    def ev(name, dev, act):
        return SimpleNamespace(name=name, device_type=f"DeviceType.{dev}", activity_type=act)

    res = mod.classify_events([
        ev("_fwd_kernel", "CUDA", "kernel"), ev("Memcpy DtoD (Device -> Device)", "CUDA", "gpu_memcpy"),
        ev("Memset (Device)", "CUDA", None), ev("prefix_prefill::fwd", "CUDA", "gpu_user_annotation"),
        ev("cudaMalloc", "CPU", "cuda_runtime"), ev("cuLaunchKernelEx", "CPU", "cuda_driver"),
        ev("aten::empty", "CPU", "cpu_op"), ev("triton_poi_fused_0", "CUDA", None),
    ])  # fmt: skip
    assert res == {
        "kernels": 2, "memops": 2, "mallocs": 1, "launch_api_calls": 1,
        "kernel_names": "_fwd_kernel;triton_poi_fused_0",
    }  # fmt: skip


def test_feature_cost_smoke(tmp_path):
    """bench/feature_cost.py --smoke: rows for every package, layout and chosen feature (``skip_decode``
    on the split cache only), the plain row first with ratio 1, split rows compared with their NHD
    twins; and its pair count against a brute-force count of visible (query, key) pairs."""
    import csv
    import importlib.util

    feats = "fp8_e4m3,skip_decode,window127+sinks,sinks_bias_key0,out_fp8_e4m3,alibi"
    _bench("feature_cost.py", "--smoke", "--out", str(tmp_path), "--features", feats)
    with (tmp_path / "feature_cost.csv").open() as f:
        rows = list(csv.DictReader(f))
    got = {(r["package"], r["layout"], r["feature"]) for r in rows}
    want = {("prefix", lay, f) for lay in ("nhd", "split")
            for f in ("plain", "fp8_e4m3", "window127+sinks", "out_fp8_e4m3", "alibi")}  # fmt: skip
    want |= {("prefix", "split", "skip_decode")}
    want |= {("window", "-", f)
             for f in ("plain", "sinks_bias_key0", "window127+sinks", "out_fp8_e4m3", "alibi")}  # fmt: skip
    assert got == want, got
    for r in rows:
        assert float(r["ms"]) > 0 and r["kernel"] and "NON-FINITE" not in r["reason"], r
        assert (r["feature"] == "plain") == (float(r["ms_ratio"]) == 1.0), r
        twin = r["layout"] == "split" and r["feature"] != "skip_decode"
        assert bool(r["vs_nhd"]) == twin, r
    spec = importlib.util.spec_from_file_location("_bench_feature_cost", ROOT / "bench" / "feature_cost.py")
    saved = list(sys.path)
    try:
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # (its dataclasses look their module up)
        spec.loader.exec_module(mod)
    finally:
        sys.path[:] = saved  # (the script takes bench/ off the path and puts the packages on it)
        sys.modules.pop(spec.name, None)
    for ctx, new, left in ((0, 50, -1), (0, 50, 7), (30, 20, 7), (5, 40, 12), (40, 9, 100), (3, 1, 0)):
        brute = sum(1 for p in range(ctx, ctx + new) for j in range(p + 1) if left < 0 or p - j <= left)
        assert mod.visible_pairs(ctx, new, left) == brute, (ctx, new, left)


def test_anchors_smoke(tmp_path):
    """bench/anchors.py, ours beside FlashAttention-3 and FlashInfer: on the CPU ours alone, one row per
    implementation and problem (soft-capped and fp8-cache rows too), the peers named as a note."""
    proc = _bench("anchors.py", "--smoke", "--out", str(tmp_path))
    md = (tmp_path / "anchors.md").read_text()
    rows = [("causal8k", "ours"), ("window32k", "ours"), ("noncausal8k", "ours"), ("llama", "ours"),
            ("llama", "ours_kv"), ("prompts8", "ours"), ("specdec", "ours"), ("causal8k_cap50", "ours"),
            ("llama_fp8", "ours"), ("llama_fp8", "ours_kv")]  # fmt: skip
    for row, impl in rows:
        assert f"| {row} | {impl} |" in md, md
    assert "peers: no CUDA device" in md and "wrote" in proc.stdout


def test_feature_ncu_smoke():
    """bench/feature_ncu.py (the calls ``gpu_session.sh ncufeatures`` profiles): on the CPU each named
    feature's call of feature_cost's problems runs and names its kernel, both packages; an unknown feature
    is an argument error."""
    proc = _bench("feature_ncu.py", "--smoke", "--features", "plain,fp8_e4m3")
    assert "plain: " in proc.stdout and "fp8_e4m3: " in proc.stdout, proc.stdout
    proc = _bench("feature_ncu.py", "--smoke", "--package", "window", "--features", "softcap50")
    assert "softcap50: " in proc.stdout, proc.stdout
    script = str(ROOT / "bench" / "feature_ncu.py")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, script, "--smoke", "--features", "nope"]
    bad = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown prefix features ['nope']" in bad.stderr, bad.stderr


def test_anchors_across_processes(tmp_path):
    """bench/anchors.py --processes: the merge takes each peer's ratio within its own process and reports
    their median, not the ratio of the processes' median times; a process without a csv is skipped; on
    the CPU two smoke processes run and merge."""
    anchors = bench_module("anchors")
    runs = {  # process: (ours ms, fa3 ms); x_fa3 = fa3 / ours in that process
        "proc1": (1.0, 0.90),
        "proc2": (1.2, 1.14),
        "proc3": (0.9, 0.90),
    }
    for name, (ours, fa3) in runs.items():
        rows = [
            {"row": "causal8k", "impl": "ours", "ms": ours, "tflops": 600.0 / ours, "x_fa3": fa3 / ours},
            {"row": "causal8k", "impl": "fa3", "ms": fa3, "tflops": 600.0 / fa3, "x_fa3": ""},
        ]
        anchors.write_rows(tmp_path / name, "anchors", rows)
    outs = [tmp_path / n for n in (*runs, "proc4")]  # proc4 never wrote a csv
    merged = {(r["row"], r["impl"]): r for r in anchors.across_processes(outs)}
    ours, fa3 = merged[("causal8k", "ours")], merged[("causal8k", "fa3")]
    assert ours["ms"] == 1.0 and fa3["ms"] == 0.90 and ours["ms_processes"] == "1/1.2/0.9"
    ratios = sorted(f / o for o, f in runs.values())
    assert abs(ours["x_fa3"] - ratios[1]) < 1e-12  # the median ratio: 0.95
    assert abs(ours["x_fa3"] - fa3["ms"] / ours["ms"]) > 0.04  # not the ratio of medians (0.90)
    assert ours["x_fa3_processes"] == "0.9/0.95/1" and "x_fa3" not in fa3
    assert anchors.across_processes([tmp_path / "proc4"]) == []
    e2e = tmp_path / "e2e"
    proc = _bench("anchors.py", "--smoke", "--processes", "2", "--rows", "causal8k", "--out", str(e2e))
    md = (e2e / "anchors_processes.md").read_text()
    assert "| causal8k | ours |" in md and (e2e / "proc2" / "anchors.csv").exists(), md
    assert "(0 of 2 processes failed)" in proc.stdout, proc.stdout


def test_anchors_rows_count_visible_pairs():
    """bench/anchors.py's useful work per row: causal rows count the keys at or before each query (within
    the window), non-causal ones every key; a non-causal prefix row is refused, not timed as causal."""
    anchors = bench_module("anchors")
    row = anchors.Row
    assert anchors.visible_pairs(row("a", "varlen", 2, 5, 1, 1, 64)) == 2 * 15
    assert anchors.visible_pairs(row("b", "varlen", 2, 5, 1, 1, 64, causal=False)) == 2 * 25
    assert anchors.visible_pairs(row("c", "varlen", 1, 5, 1, 1, 64, left=1)) == 1 + 2 * 4
    assert anchors.visible_pairs(row("d", "prefix", 1, 2, 1, 1, 64, ctx=3)) == 4 + 5
    with pytest.raises(ValueError, match="prefix rows are causal"):
        anchors.prefix_calls(row("e", "prefix", 1, 2, 1, 1, 64, ctx=3, causal=False), "cpu", None)
    trees_ab = bench_module("trees_ab")
    names = [r.name for r in anchors.ROWS] + [r[0] for r in trees_ab.EXTRA_ROWS]
    assert len(names) == len(set(names)) and "noncausal8k" in names


def test_engine_ab_smoke(tmp_path):
    """bench/engine_ab.py --smoke: two trees (this checkout's packages, named twice: once empty, once
    by path), one round each, interleaved; its summary has both trees' times for each implementation
    of the scenario."""
    _bench("engine_ab.py", "--smoke", "--tree", "base=", "--tree", f"same={ROOT / 'packages'}",
           "--rounds", "1", "--scenarios", "varlen_8prompts_100-500", "--out", str(tmp_path))  # fmt: skip
    md = (tmp_path / "engine_ab.md").read_text()
    for impl in ("ours_caf", "ours_wp"):
        row = next(
            line for line in md.splitlines() if line.startswith(f"| varlen_8prompts_100-500 | {impl} |")
        )
        assert row.count("%") == 1, row  # the second tree's cell against the first
    assert (tmp_path / "base_1" / "engine_step.csv").exists() and (tmp_path / "same_1" / "log.txt").exists()


def test_trees_ab_smoke(tmp_path):
    """bench/trees_ab.py --smoke: two trees (this checkout's packages twice), a hang check, one round each;
    its table has both trees' times and equal bits for each implementation of the rows."""
    _bench("trees_ab.py", "--smoke", "--tree", "base=", "--tree", f"same={ROOT / 'packages'}", "--rounds",
           "1", "--passes", "1", "--rows", "causal8k,noncausal8k,specdec", "--hang-check", "prompts8",
           "--out", str(tmp_path))  # fmt: skip
    md = (tmp_path / "trees_ab.md").read_text()
    rows = (("causal8k", "ours"), ("noncausal8k", "ours"), ("specdec", "ours"), ("specdec", "ours_kv"))
    for row, impl in rows:
        line = next(x for x in md.splitlines() if x.startswith(f"| {row} | {impl} |"))
        assert line.endswith("| equal |") and line.count("(") == 1, line
    assert (tmp_path / "hang_same.jsonl").exists()


def test_trees_ab_summary_flags_differing_bits(tmp_path):
    """bench/trees_ab.py's table on made-up runs: medians over every pass of every round, the ratio to the
    first tree, DIFFER where one run's output hash differs, NaN where one output held a NaN."""
    import json

    mod = bench_module("trees_ab")

    def put(tree, r, recs):
        (tmp_path / f"{tree}_{r}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))

    def rec(row, ms, digest, nan=False):
        return {"row": row, "impl": "ours", "ms": ms, "tflops": 1.0, "hash": digest, "nan": nan}

    put("a", 1, [rec("x", [1.0, 2.0], 5), rec("y", [4.0], 7)])
    put("b", 1, [rec("x", [1.5, 1.5], 5), rec("y", [2.0], 8, nan=True)])
    text = mod.summary(tmp_path, ["a", "b"], 1)
    assert "| x | ours | 1.5000 | 1.5000 (1.000) | equal |" in text, text
    assert "| y | ours | 4.0000 | 2.0000 (0.500) | NaN DIFFER |" in text, text


def _write_ab_runs(out, name: str, values: dict[str, list[float]], rows) -> None:
    """Made-up runs of bench/engine_ab.py: ``out/<tree>_<round>/<name>`` holding ``rows(tree, value)``, one
    round per value."""
    for tree, per_round in values.items():
        for r, value in enumerate(per_round, 1):
            d = out / f"{tree}_{r}"
            d.mkdir()
            (d / name).write_text("\n".join(rows(tree, value)) + "\n")


def test_engine_ab_summary(tmp_path):
    """bench/engine_ab.py's summary on made-up runs: medians over rounds, % against the first tree, sums;
    a row one tree lacks and a column no run took are left out; bad --tree values are refused."""
    mod = bench_module("engine_ab")

    def rows(tree: str, wall: float) -> list[str]:
        extra = ["only_a,ours,1.0,"] if tree == "a" else []
        return ["scenario,impl,wall_ms,graph_ms", f"s1,ours,{wall},", f"s2,ours,{2 * wall},", *extra]

    _write_ab_runs(tmp_path, "engine_step.csv", {"a": [10.0, 12.0, 11.0], "b": [9.0, 13.0, 9.9]}, rows)
    text = mod.summary(mod.read_runs(tmp_path, ["a", "b"], 3), ["a", "b"])
    assert "| s1 | ours | 11.000 | 9.900 (-10.00%) |" in text, text
    assert "| s2 | ours | 22.000 | 19.800 (-10.00%) |" in text, text
    assert "| sum | | 33.000 | 29.700 (-10.00%) |" in text, text
    assert "only_a" not in text, text
    assert "GPU time" not in text, text
    for bad in ("noequals", "=dir", "a b=", f"x={tmp_path / 'missing'}"):
        with pytest.raises(Exception, match="--tree"):
            mod.parse_tree(bad)


def test_engine_ab_host_summary(tmp_path):
    """bench/engine_ab.py --host's summary on made-up host tables: per entry point the medians over
    rounds of the ratio to SDPA, the host time and the GPU time, % against the first tree, no sums."""
    mod = bench_module("engine_ab")

    def rows(tree: str, ratio: float) -> list[str]:
        return ["impl,calls,host_us,host_median_us,wall_us,graph_us,vs_sdpa",
                f"ours_pp_caf,3000,{20 * ratio},1,1,8.0,{ratio}", "sdpa,3000,20.0,1,1,7.0,"]  # fmt: skip

    _write_ab_runs(tmp_path, "engine_host.csv", {"a": [1.20, 1.30, 1.25], "b": [1.32, 1.26, 1.40]}, rows)
    text = mod.summary(mod.read_runs(tmp_path, ["a", "b"], 3, host=True), ["a", "b"], host=True)
    assert "| tiny | ours_pp_caf | 1.250 | 1.320 (+5.60%) |" in text, text
    assert "| tiny | ours_pp_caf | 25.000 | 26.400 (+5.60%) |" in text, text
    assert "| tiny | ours_pp_caf | 8.000 | 8.000 (+0.00%) |" in text, text
    assert "| tiny | sdpa | 20.000 | 20.000 (+0.00%) |" in text and "| sum |" not in text, text
    assert text.index("over torch SDPA") < text.index("best round") < text.index("GPU time"), text


def test_anchors_ragged_problem_and_gathered_kv():
    """bench/anchors.py's inputs for the peers on a ragged prefix batch (an empty context, a one-page
    sequence, a page boundary): the paged problem (``common.prefix_problem``) run by ours with ``k=None``
    equals float64 attention over the contiguous K/V that FA3 is given (``gathered_kv``, causal aligned
    to the bottom right); the same K/V with one key moved to the next sequence does not (the check can
    fail)."""
    import torch

    import attn_reference as ref
    from prefix_prefill import prefix_prefill

    mod = bench_module("anchors")
    common = bench_module("common")
    seqs = [(0, 6), (21, 3), (16, 5)]
    gen = torch.Generator().manual_seed(3)
    p = common.prefix_problem(torch, seqs=seqs, heads=4, kv_heads=2, head_dim=32, page=8, layout="nhd",
                              device="cpu", dtype=torch.float32, gen=gen)  # fmt: skip
    out = prefix_prefill(p["q"], None, None, p["k_cache"], p["v_cache"], p["block_table"], p["cu"],
                         p["seq_lens"], 6)  # fmt: skip
    k_all, v_all, cu_k = mod.gathered_kv(p)
    assert cu_k.tolist() == [0, 6, 30, 51]
    want = ref.attention_varlen(p["q"], k_all, v_all, p["cu"], cu_k, causal=True)
    res = ref.compare(out, want)
    assert res, res
    off_by_one = torch.tensor([0, 6, 29, 51], dtype=torch.int32)  # one key moved to the next sequence
    bad = ref.attention_varlen(p["q"], k_all, v_all, p["cu"], off_by_one, causal=True)
    assert not ref.compare(out, bad)


def test_window_ncu_impl_rows():
    """bench/window_ncu.py profiles a peer on either kind of row, our calls on their own kind only."""
    refusal = bench_module("window_ncu").impl_refusal
    assert refusal("fa3", "prefix") is None and refusal("flashinfer", "varlen") is None
    assert refusal("prefix", "prefix") is None and refusal("ours", "varlen") is None
    assert "prefix rows only" in refusal("ours_kv", "varlen")
    assert "prefix row" in refusal("ours", "prefix")


def test_window_ncu_profiles_final_kernels(monkeypatch):
    """bench/window_ncu.py profiles after prefix-prefill's finish_compiles() (the full Gluon forms, not the
    quick compile tier the first calls run), with calls after it: a profile before it is the quick
    form's."""
    import prefix_prefill

    events = []
    monkeypatch.setattr(prefix_prefill, "finish_compiles", lambda *a, **k: events.append("finish"))
    bench_module("window_ncu").warm(lambda: events.append("call"), lambda: events.append("sync"))
    assert "finish" in events and events[-1] == "sync", events
    assert events.index("finish") > events.index("call"), events
    assert "call" in events[events.index("finish") :], events


def test_window_ncu_summary(tmp_path):
    """bench/window_ncu.py --summary on made-up csv exports: each report's metrics in one row (a missing
    one as "-"), and its instructions ordered by stall samples with their leading reasons."""
    mod = bench_module("window_ncu")
    head = '"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"\n'
    (tmp_path / "a_x.details.csv").write_text(
        head + '"0","k","SOL","Duration","ms","2.01"\n"0","k","Mem","L2 Hit Rate","%","97.9"\n'
    )
    (tmp_path / "a_x.sass.csv").write_text(
        '"Kernel Name","k",\n'
        '"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_barrier",'
        '"stall_long_sb","stall_barrier (Not Issued)"\n'
        '"0x10","  NOP","5","4","5","0","5"\n"0x20","  @!P1 BRA 0x10","90","800","1","89","1"\n'
    )
    text = mod.summary(tmp_path)
    assert "| a_x | 2.01 | 97.9 | - | - | - | - | - | - |" in text, text
    lines = [x for x in text.splitlines() if x.startswith("- ")]
    assert lines[0].startswith("- 90 samples, 800 executions: `@!P1 BRA 0x10` (long_sb 89, barrier 1)"), lines
    assert lines[1].startswith("- 5 samples"), lines
    assert "| 800 | 1 | 90 | 94.7% | long_sb 99%, barrier 1% |" in text, text
    assert "| 4 | 1 | 5 | 5.3% | barrier 100% |" in text, text


def test_window_ncu_by_count(tmp_path):
    """bench/window_ncu.py's samples grouped by execution count: instructions run as often fall in one
    group (a partition's loop), groups ordered by samples, each with its instructions, its share of all
    samples and its leading reasons' shares."""
    path = tmp_path / "k.sass.csv"
    path.write_text(
        '"Kernel Name","k",\n'
        '"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_short_sb",'
        '"stall_long_sb","stall_wait"\n'
        '"0x10","  LDS R1","30","64","20","0","10"\n"0x20","  STS R1","10","64","0","0","10"\n'
        '"0x30","  @!P1 BRA 0x10","60","8","0","60","0"\n"0x40","  EXIT","0","1","0","0","0"\n'
    )
    groups = bench_module("window_ncu").by_count(path, top=2)
    assert groups == [(8, 1, 60, 0.6, "long_sb 100%"), (64, 2, 40, 0.4, "short_sb 50%, wait 50%")], groups


_SASS = """
        /*0100*/                   MOV R1, R2 ;
        /*0110*/                   WARPGROUP.ARRIVE ;
        /*0120*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT, gsb0 ;
        /*0130*/                   HGMMA.64x128x16.F32.BF16 R88, R152, gdesc[UR8].tnspB, R88, gsb0 ;
        /*0140*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*0150*/                   MUFU.EX2 R3, R3 ;
        /*0160*/                   MUFU.EX2 R4, R4 ;
        /*0170*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0180*/                   MUFU.EX2 R5, R5 ;
        /*0190*/                   FMUL R88, R88, R6 ;
        /*01a0*/               @P2 BRA 0x110 ;
        /*01b0*/               @P3 BRA 0x100 ;
        /*01c0*/                   EXIT ;
        /*01d0*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R0 ;
        /*01e0*/                   BRA 0x120 ;
"""


def test_sass_loops_finds_the_block_loop():
    """bench/sass_loops.py on a hand-written SASS: the innermost conditional backward branch with wgmma is
    the one block loop (the tile loop around it and a wait's plain retry branch are not), with its op
    counts and the exp2 between the wait for S and the wait for all."""
    sl = bench_module("sass_loops")
    (loop,) = sl.block_loops(_SASS)
    assert loop["range"] == "0x110-0x1a0" and loop["instructions"] == 10, loop
    assert loop["HGMMA"] == 2 and loop["MUFU.EX2"] == 3 and loop["FMUL"] == 1, loop
    assert loop["ex2_beside_pv"] == 2, loop


def test_sass_loops_compiles_ours():
    """bench/sass_loops.py compiles our window causal head-128 form offline (sm90): two consumer copies of
    the block loop, each two wgmma groups of 8 and a thread's 64 exp2 (plus the two of the row's rescale)."""
    sl = bench_module("sass_loops")
    import window_prefill.launch as wl

    if wl._gluon_fwd_kernel is None:
        pytest.skip("this Triton has no Gluon")
    loops = sl.block_loops(sl.ours_sass("window-causal-d128"))
    assert len(loops) == 2 and all(r["HGMMA"] == 16 and r["MUFU.EX2"] >= 64 for r in loops), loops
