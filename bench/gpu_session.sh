#!/usr/bin/env bash
# One device call that checks and times everything: the GPU test suite, then both benchmarks.
# Usage (repository root, on the GPU machine):
#   bash bench/gpu_session.sh [tests|bench|ab|abbench|first|safety|ncu|readme|engine|accept|quick|hostspread|consan|features|anchors|engineab|treesab|shortforms|ncuwindow|ncufeatures|persistent|all] [extra bench args]
# (tests: the whole suite on the GPU (TEST_PATHS, XDIST workers) into tests.log and junit.xml; with
#  PYTEST_DONE=FILE (node ids a cut run reported, one a line) only the rest (bench/pytest_resume.py);
#  bench: bench/window_prefill.py and bench/prefix_prefill.py (BENCHES) with the extra args, into
#  results.tgz; a plan constant against the peers: `bench --set PREFETCH_IDS=0`;
#  ab: bench/ab_prefix.py, one prefix-prefill constexpr off/on timed against itself over shapes, pages and
#  layouts (extra args go to it, e.g. --switch NAME), into $OUT/ab.log;
#  abbench: the A/B of each of AB_SWITCHES (AB_SETS="--set NAME=V ..." fixes other constexprs during
#  each) with parallel precompiles, then both benchmarks with the settings the A/Bs chose;
#  first: bench/first_call.py, cold/warm first-call times per kernel, dtype and head size;
#  features: bench/feature_cost.py, each model feature's cost against the plain call (FEATURE_ARGS,
#  default --quick; the full table: FEATURE_ARGS="--heads 128", then "--heads 256");
#  anchors: bench/anchors.py, ours beside FlashAttention-3 and FlashInfer (issue 47's rows; `--processes 3`:
#  three fresh processes and their ratios merged, anchors_processes.md; the peer
#  wheels installed from WHEELS, default .wheels/, a git-ignored copy of ../shared/peers/wheels/ named in
#  the call's carry; without them the peers' rows are notes);
#  safety: the edge suite under compute-sanitizer memcheck in SAN_SHARDS parallel shards beside
#  pytest on TEST_PATHS, then first-call times if FIRST=1;
#  ncu: Nsight Compute (--set full, clocks as they are) of the prefix kernel (NCU_KERNEL regex, default
#  _fwd_kernel; _gluon_split_kernel / _gluon_fwd_kernel for the Gluon ones) run by bench/ab_prefix.py
#  --compile-only for each NCU_SPECS entry shape:layout:page (default llama:split:512 llama:nhd:512);
#  writes ncu.tgz (reports, details text, per-SASS-instruction csv);
#  engine: bench/engine_step.py --quick (engine steps, ours vs vLLM 0.33);
#  engineab: bench/engine_ab.py, the engine steps of whole package trees interleaved (ENGINE_TREES, e.g.
#  "main=.peers/t_main/packages new=", the first the base; ENGINE_ROUNDS, default 3; ENGINE_SCENARIOS,
#  default all; ENGINE_HOST=1: the host table per call instead, engine_host_ab.md), into results.tgz;
#  treesab: bench/trees_ab.py, our kernels' time and output bits for whole package trees in interleaved
#  processes (TREES, e.g. "main=.peers/t_main/packages new=", the first the base, carried; ROUNDS, default
#  2; AB_ROWS, default all; HANG_ROWS run alone under 60 s first, default prompts8,specdec), then the GPU
#  tests TREES_TESTS (if set) on this checkout, into results.tgz;
#  shortforms: bench/short_forms.py, the Gluon short-query forms (paired heads, idle second warpgroup)
#  against each other over batches, contexts, layouts and head sizes, beside plan.pair_heads's choice;
#  accept, consan, quick: see their blocks below;
#  hostspread: bench/host_probe.py --peers in SPREAD_RUNS fresh processes (unpinned), then one pinned to
#  each CPU of SPREAD_CPUS, then the engine's host table in two processes, into results.tgz;
#  ncuwindow: Nsight Compute (--set full, ncu's clocks) of the window Gluon kernel, one call each of
#  NCU_SHAPES (bench/window_ncu.py) for each tree of NCU_TREES ("name=DIR ...", empty DIR: this checkout;
#  the names fa3 / flashinfer: that peer's kernel on the same call, from the wheels in WHEELS, kernel regex
#  NCU_PEER_KERNEL, default device_kernel; prefix / ours_kv: prefix-prefill on a prefix row, e.g. llama),
#  each L2 factor of NCU_L2 (a persistent kernel's plan.schedule told the L2 is that fraction of its
#  size) and each soft-cap of NCU_SOFTCAP (0: off), then bench/window_ncu.py --summary, into ncu.tgz;
#  ncufeatures: Nsight Compute (--set full, ncu's clocks) of one warm call of each feature of NCU_FEATURES
#  (default "plain fp8_e4m3"; bench/feature_ncu.py on NCU_PACKAGE prefix|window, NCU_LAYOUT, default
#  prefix nhd, NCU_HEAD, default 128; kernels matching NCU_KERNEL, default gluon), one process and report
#  each, then bench/window_ncu.py --summary (with the samples by execution count), into ncu.tgz;
#  persistent: the persistent form of the prefix NHD/HND Gluon kernel (narrow windows): PERSIST_STEPS
#  (default smoke,tests,time) of: smoke (one GPU case under SMOKE_TIMEOUT; a failure skips the rest), tests (PERSIST_TESTS, default its test file, under TEST_TIMEOUT), time
#  (bench/feature_cost.py over PERSIST_FEATURE_ARGS with the plan's rule and with the one-tile form,
#  --set PERSISTENT_MAX_WINDOW=0, interleaved PERSIST_PASSES times; PERSIST_MODES lists the runs of a pass,
#  default "persistent onetile"; a mode ab-NAME runs the packages under bench/_ab/NAME/ (copies of
#  prefix_prefill and prefill_runtime, ignored by git: pass carry=["bench/_ab"]) ahead of the tree's), memcheck (compute-sanitizer over the
#  test file's rows-past-the-grid cases), into results.tgz;
#  readme: every Python example of the READMEs (bench/readme_examples.py) and the demo, into $OUT/readme.log)
# Pass BENCH_COMMIT=<sha> in the command: the device copy of .git may be older than the tree it runs.
# PACKAGES_DIR=DIR runs a part over another tree's packages (DIR holds its packages/*/src; default this
# checkout's), e.g. this checkout's bench scripts over an older commit's kernels.
# Writes under $OUT (or ./gpu-out): tests.log, junit.xml, bench.log, results.tgz (csv/md/png).
set -uo pipefail
what=${1:-all}; shift || true
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
export PYTHONPATH="$(ls -d "${PACKAGES_DIR:-$PWD/packages}"/*/src | paste -sd:):$PWD/.peers"
# (the bench scripts put BENCH_PACKAGES's packages first, bench/common.py: the same tree for them)
[[ -n ${PACKAGES_DIR:-} ]] && export BENCH_PACKAGES="$PACKAGES_DIR"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
{
  date -u; echo "commit ${BENCH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} 2>&1 | tee "$OUT/env.txt"
rc=0
if [[ $what == tests || $what == all ]]; then
  # work stealing (pytest-xdist >= 3.2) lets idle workers take queued tests: a run with plain load
  # distribution ended with a few workers still holding 30 s random-batch tests when its limit came
  dist=$(python3 -c "import xdist; v = tuple(int(x) for x in xdist.__version__.split('.')[:2]); print('worksteal' if v >= (3, 2) else 'load')" 2>/dev/null || echo load)
  resume=(); [[ -n ${PYTEST_DONE:-} ]] && resume=(-p pytest_resume)
  PYTHONPATH=$PYTHONPATH${PYTEST_DONE:+:$PWD/bench} \
  timeout ${TEST_TIMEOUT:-540} python3 -m pytest ${TEST_PATHS:-tests} -m "not compile_check" "${resume[@]}" -n ${XDIST:-16} --dist ${DIST:-$dist} --durations=15 -v -rfE -p no:cacheprovider --maxfail=${MAXFAIL:-200} \
    --junitxml "$OUT/junit.xml" ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/tests.log" | grep -E "FAILED|ERROR|passed|failed" | tail -40
  rc=${PIPESTATUS[0]}
fi
if [[ $what == ab ]]; then
  timeout ${BENCH_TIMEOUT:-400} python3 bench/ab_prefix.py --out "$OUT" "$@" 2>&1 | tee "$OUT/ab.log" | grep -E "SPREAD|bitwise"
fi
if [[ $what == abbench ]]; then
  t0=$SECONDS
  res=$OUT/res; mkdir -p "$res"
  for sw in ${AB_SWITCHES:-PREFETCH_IDS}; do
    timeout ${AB_TIMEOUT:-300} python3 bench/ab_prefix.py --out "$res" --jobs ${AB_JOBS:-14} --switch $sw \
      --choice "$res/choice.txt" ${AB_SETS:-} 2>&1 | tee -a "$OUT/ab.log" | grep -E "SPREAD|bitwise|CHOICE|precompiled"
  done
  sets=$(sed 's/^/--set /' "$res/choice.txt" 2>/dev/null | tr '\n' ' ')
  timeout ${BENCH_TIMEOUT:-280} python3 bench/prefix_prefill.py --out "$res" $sets 2>&1 | tee -a "$OUT/bench.log"
  # optional: ncu of our kernel (switch on) for NCU_SHAPE/NCU_LAYOUT at each of NCU_PAGES (clocks left as they are)
  for pg in ${NCU_PAGES:-}; do
    timeout 120 ncu --clock-control none -k regex:${NCU_KERNEL:-_fwd_kernel} -s 1 -c 1 --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section WarpStateStats \
      --section SchedulerStats --section LaunchStats python3 bench/ab_prefix.py --compile-only \
      --shapes ${NCU_SHAPE:-qwen} --layouts ${NCU_LAYOUT:-nhd} --pages $pg >>"$OUT/ncu.txt" 2>&1
  done
  left=$(( ${CALL_BUDGET_S:-540} - (SECONDS - t0) ))
  if [[ ${WINDOW:-1} == 1 ]] && (( left > 60 )); then
    timeout $left python3 bench/window_prefill.py --out "$res" 2>&1 | tee -a "$OUT/bench.log"
  fi
  tar czf "$OUT/results.tgz" -C "$res" . && rm -rf "$res"
fi
if [[ $what == safety ]]; then
  t0=$SECONDS
  n=${SAN_SHARDS:-6}
  for ((i = 0; i < n; i++)); do
    timeout ${SAN_TIMEOUT:-400} compute-sanitizer --tool memcheck python3 bench/sanitize_edge.py --shard $i/$n \
      --budget-s ${SAN_BUDGET_S:-330} >"$OUT/san_$i.tmp" 2>&1 &
  done
  timeout ${TEST_TIMEOUT:-380} python3 -m pytest ${TEST_PATHS:-tests} -n ${XDIST:-10} --durations=15 -v -rfE \
    -p no:cacheprovider --maxfail=${MAXFAIL:-200} --junitxml "$OUT/junit.xml" ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/tests.log" \
    | grep -E "FAILED|ERROR|passed|failed" | tail -40
  rc=${PIPESTATUS[0]}
  wait
  for ((i = 0; i < n; i++)); do echo "=== shard $i/$n"; cat "$OUT/san_$i.tmp"; done >"$OUT/sanitizer.log"
  rm -f "$OUT"/san_*.tmp
  grep -E "ERROR SUMMARY|cases OK|FAILED|stopped" "$OUT/sanitizer.log"
  left=$(( ${CALL_BUDGET_S:-560} - (SECONDS - t0) ))
  if [[ ${FIRST:-0} == 1 ]] && (( left > 60 )); then
    timeout $left python3 bench/first_call.py --out "$OUT" ${FIRST_ARGS:-} 2>&1 | tee "$OUT/first_call.log"
  fi
fi
if [[ $what == ncu ]]; then
  nd=$OUT/ncu; mkdir -p "$nd"
  specs=${NCU_SPECS:-llama:split:512 llama:nhd:512}
  for sp in $specs; do  # precompile (default cache) in parallel
    IFS=: read -r sh lay pg <<<"$sp"
    timeout 240 python3 bench/ab_prefix.py --compile-only --shapes $sh --layouts $lay --pages $pg >/dev/null 2>&1 &
  done
  wait
  for sp in $specs; do
    IFS=: read -r sh lay pg <<<"$sp"
    tag=${sh}_${lay}_$pg
    timeout ${NCU_TIMEOUT:-150} ncu --clock-control none --set full --import-source no -k regex:${NCU_KERNEL:-_fwd_kernel} -s 1 -c 1 \
      -f -o "$nd/$tag" python3 bench/ab_prefix.py --compile-only --shapes $sh --layouts $lay --pages $pg \
      >"$nd/$tag.run.txt" 2>&1
    ncu -i "$nd/$tag.ncu-rep" --page details --print-details all >"$nd/$tag.details.txt" 2>&1
    ncu -i "$nd/$tag.ncu-rep" --page source --print-source sass --csv >"$nd/$tag.sass.csv" 2>&1
    grep -E "Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|L2 Hit Rate|Registers Per|Achieved Occupancy" \
      "$nd/$tag.details.txt" | sed "s/^/$tag /" | head -12
  done
  tar czf "$OUT/ncu.tgz" -C "$nd" . && rm -rf "$nd"
fi
if [[ $what == first ]]; then
  timeout ${BENCH_TIMEOUT:-400} python3 bench/first_call.py --out "$OUT" "$@" 2>&1 | tee "$OUT/first_call.log"
fi
if [[ $what == engine ]]; then
  # engine: bench/engine_step.py --quick (L-layer engine steps, ours vs vLLM 0.33; host us per call; launches
  # per call) into results.tgz; needs .peers for the vLLM rows
  res=$OUT/res; mkdir -p "$res"
  timeout ${BENCH_TIMEOUT:-540} python3 bench/engine_step.py --quick --out "$res" "$@" 2>&1 | tee -a "$OUT/bench.log"
  tar czf "$OUT/results.tgz" -C "$res" . && rm -rf "$res"
fi
if [[ $what == readme ]]; then
  { timeout ${README_TIMEOUT:-300} python3 bench/readme_examples.py && timeout ${README_TIMEOUT:-300} python3 bench/demo.py; } \
    2>&1 | tee "$OUT/readme.log" | grep -E "ok$|FAILED|passed|failed|\|"
  rc=${PIPESTATUS[0]}
fi
if [[ $what == bench || $what == all ]]; then
  res=$OUT/res; mkdir -p "$res"
  for s in ${BENCHES:-window_prefill prefix_prefill}; do
    timeout ${BENCH_TIMEOUT:-280} python3 bench/$s.py --out "$res" "$@" 2>&1 | tee -a "$OUT/bench.log"
  done
  tar czf "$OUT/results.tgz" -C "$res" . && rm -rf "$res"
fi
if [[ $what == accept ]]; then
  # accept: the GPU suite with compute-sanitizer racecheck and synccheck over every Gluon form beside it
  # (bench/sanitize_gluon.py), then on a quiet GPU the host cost per call of every entry point
  # (bench/host_probe.py, and a profile of PROFILE, default pp_caf), first calls (window and prefix, bf16
  # head 128: their Gluon kernels; the split form's at FIRST_SPLIT head sizes) and the engine step vs vLLM
  # (bench/engine_step.py --quick); into results.tgz beside tests.log. ACCEPT_PARTS (default
  # "tests host first engine") picks the parts, so that one accept can span two calls of <= 600 s
  res=$OUT/res; mkdir -p "$res"
  parts=${ACCEPT_PARTS:-tests host first engine}
  if [[ $parts == *tests* ]]; then
    for tool in racecheck synccheck; do
      timeout ${SAN_TIMEOUT:-300} compute-sanitizer --tool $tool python3 bench/sanitize_gluon.py >"$res/$tool.log" 2>&1 &
    done
    dist=$(python3 -c "import xdist; v = tuple(int(x) for x in xdist.__version__.split('.')[:2]); print('worksteal' if v >= (3, 2) else 'load')" 2>/dev/null || echo load)
    timeout ${TEST_TIMEOUT:-330} python3 -m pytest ${TEST_PATHS:-tests} -n ${XDIST:-14} --dist $dist --durations=15 -v -rfE \
      -p no:cacheprovider --maxfail=${MAXFAIL:-200} ${PYTEST_ARGS:-} 2>&1 | tee "$res/tests.log" | grep -E "FAILED|ERROR|passed|failed" | tail -40
    rc=${PIPESTATUS[0]}
    wait
    # (a checker's summary counts only what ran: its log must also say "N cases OK")
    grep -HE "SUMMARY|cases OK|FAILED|planned|Error|Traceback" "$res/racecheck.log" "$res/synccheck.log"
    gzip -f "$res/tests.log"
  fi
  if [[ $parts == *host* ]]; then
    timeout 90 python3 bench/host_probe.py --peers 2>&1 | tee "$res/host_probe.txt"
    timeout 60 python3 bench/host_probe.py --calls 500 --rounds 1 --profile ${PROFILE:-pp_caf} >>"$res/host_probe.txt" 2>&1
    if [[ -n ${HOST_AB:-} ]]; then  # another tree's host cost beside (HOST_AB=DIR of its packages/)
      BENCH_PACKAGES=$HOST_AB timeout 90 python3 bench/host_probe.py 2>&1 | sed 's/^/[HOST_AB] /' | tee -a "$res/host_probe.txt"
    fi
  fi
  if [[ $parts == *first* ]]; then
    timeout ${FIRST_TIMEOUT:-100} python3 bench/first_call.py --kernels window,prefix --dtypes bf16 --heads 128 --out "$res" \
      2>&1 | tee "$res/first_call.log" | tail -12
    if [[ -n ${FIRST_SPLIT:-} ]]; then  # the split-cache form's first calls too (FIRST_SPLIT=head sizes, e.g. 64,128)
      mkdir -p "$res/split"
      timeout ${FIRST_TIMEOUT:-100} python3 bench/first_call.py --kernels prefix --dtypes bf16 --heads $FIRST_SPLIT \
        --layout split --out "$res/split" 2>&1 | tee "$res/split/first_call.log" | tail -8
    fi
  fi
  if [[ $parts == *engine* ]]; then
    timeout ${ENGINE_TIMEOUT:-200} python3 bench/engine_step.py --quick --budget-s ${ENGINE_BUDGET_S:-150} --out "$res" 2>&1 \
      | tee "$res/engine_step.log" | tail -40
  fi
  tar czf "$OUT/results.tgz" -C "$res" . && rm -rf "$res"
fi
if [[ $what == consan ]]; then
  # consan: every Gluon form under Triton's concurrency sanitizer (bench/sanitize_gluon.py --consan-all)
  # for each of CONSAN_VARIANTS (default: the plans as shipped; modeled: the per-thread cp.async arrivals
  # in the form Triton 3.6's ConSan models, see sanitize_gluon.py) and CONSAN_CASES (numbers of
  # `sanitize_gluon.py --list`; default all) in CONSAN_JOBS child processes, beside
  # compute-sanitizer synccheck over the same cases as shipped (SYNCCHECK=0: not); logs, consan.md and
  # synccheck.log in consan.tgz
  res=$OUT/consan; mkdir -p "$res"
  if [[ ${SYNCCHECK:-1} == 1 ]]; then
    timeout ${SAN_TIMEOUT:-420} compute-sanitizer --tool synccheck python3 bench/sanitize_gluon.py >"$res/synccheck.log" 2>&1 &
  fi
  timeout ${CONSAN_TIMEOUT:-480} python3 bench/sanitize_gluon.py --consan-all --variants ${CONSAN_VARIANTS:-default} \
    --jobs ${CONSAN_JOBS:-12} --cases "${CONSAN_CASES:-}" --timeout ${CONSAN_CHILD_S:-400} --out "$res" 2>&1 | tee "$OUT/consan.log" | tail -45
  rc=${PIPESTATUS[0]}
  wait
  [[ -f $res/synccheck.log ]] && grep -HE "SUMMARY|cases OK|FAILED|Traceback" "$res/synccheck.log"
  tar czf "$OUT/consan.tgz" -C "$res" . && rm -rf "$res"
fi
if [[ $what == features ]]; then
  res=$OUT/res; mkdir -p "$res"
  timeout ${BENCH_TIMEOUT:-560} python3 bench/feature_cost.py --out "$res" ${FEATURE_ARGS:---quick} "$@" 2>&1 \
    | tee "$res/feature_cost.log" | grep -E "feature=|wrote|Error"
  rc=${PIPESTATUS[0]}
  tar czf "$OUT/results.tgz" -C "$res" . && rm -rf "$res"
fi
if [[ $what == persistent ]]; then
  res=$OUT/res; mkdir -p "$res"
  steps=${PERSIST_STEPS:-smoke,tests,time}
  if [[ $steps == *smoke* ]]; then  # one case alone first: a hang stops the part here
    timeout ${SMOKE_TIMEOUT:-120} python3 -m pytest tests/prefix_prefill/test_pp_gluon_persistent.py -x -q \
      -p no:cacheprovider -k "against_reference and window_sinks and p1" >"$res/smoke.log" 2>&1
    rc=$?; tail -3 "$res/smoke.log"
    (( rc != 0 )) && steps=none && echo "smoke failed (rc $rc): the rest of the part skipped"
  fi
  if [[ $steps == *tests* ]]; then
    timeout ${TEST_TIMEOUT:-280} python3 -m pytest ${PERSIST_TESTS:-tests/prefix_prefill/test_pp_gluon_persistent.py} \
      -m "not compile_check" -n ${XDIST:-16} -v -rfE -p no:cacheprovider --junitxml "$res/junit.xml" 2>&1 \
      | tee "$res/tests.log" | grep -E "FAILED|ERROR|passed|failed" | tail -30
    rc=${PIPESTATUS[0]}
  fi
  if [[ $steps == *time* ]]; then
    fargs=${PERSIST_FEATURE_ARGS:---packages prefix --heads 128 --layouts nhd --pages 16 --rounds 3 --features window127,window127+sinks,window511,window1023}
    for ((pass = 1; pass <= ${PERSIST_PASSES:-1}; pass++)); do
      for mode in ${PERSIST_MODES:-persistent onetile}; do
        sets=(); [[ $mode == onetile ]] && sets=(--set PERSISTENT_MAX_WINDOW=0)
        pp=$PYTHONPATH; [[ $mode == ab-* ]] && pp=$PWD/bench/_ab/${mode#ab-}:$PYTHONPATH
        PYTHONPATH=$pp timeout ${TIME_TIMEOUT:-200} python3 bench/feature_cost.py --out "$res/$mode-$pass" $fargs \
          "${sets[@]}" 2>&1 | tee "$res/$mode-$pass.log" | grep -E "feature=|Error"
      done
    done
  fi
  if [[ $steps == *memcheck* ]]; then
    timeout ${SAN_TIMEOUT:-200} compute-sanitizer --tool memcheck python3 -m pytest \
      tests/prefix_prefill/test_pp_gluon_persistent.py -k rows_past -p no:cacheprovider -q >"$res/memcheck.log" 2>&1
    grep -E "ERROR SUMMARY|passed|failed" "$res/memcheck.log"
  fi
  tar czf "$OUT/results.tgz" -C "$res" . && rm -rf "$res"
fi
if [[ $what == anchors ]]; then
  res=$OUT/res; mkdir -p "$res"
  if ls "${WHEELS:-.wheels}"/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/peers-site "${WHEELS:-.wheels}"/*.whl
    export PYTHONPATH="$PYTHONPATH:/tmp/peers-site" FLASHINFER_WORKSPACE_BASE="$PWD/.flashinfer"
  fi
  timeout ${BENCH_TIMEOUT:-560} python3 bench/anchors.py --out "$res" "$@" 2>&1 | tee "$res/anchors.log" \
    | grep -vE "Warning|warn\("
  rc=${PIPESTATUS[0]}
  tar czf "$OUT/results.tgz" -C "$res" . && rm -rf "$res"
fi
if [[ $what == engineab ]]; then
  res=$OUT/res; mkdir -p "$res"
  trees=(); for t in ${ENGINE_TREES:?ENGINE_TREES="name=DIR ..." names the trees}; do trees+=(--tree "$t"); done
  host=(); [[ ${ENGINE_HOST:-0} == 1 ]] && host=(--host)
  timeout ${BENCH_TIMEOUT:-560} python3 bench/engine_ab.py "${trees[@]}" "${host[@]}" --rounds ${ENGINE_ROUNDS:-3} \
    --scenarios "${ENGINE_SCENARIOS:-}" --out "$res" "$@" 2>&1 | tee "$res/engine_ab.log" | tail -40
  rc=${PIPESTATUS[0]}
  tar czf "$OUT/results.tgz" -C "$res" . && rm -rf "$res"
fi
if [[ $what == treesab ]]; then
  res=$OUT/res; mkdir -p "$res"
  trees=(); for t in ${TREES:?TREES="name=DIR ..." names the trees}; do trees+=(--tree "$t"); done
  timeout ${BENCH_TIMEOUT:-400} python3 bench/trees_ab.py "${trees[@]}" --rounds ${ROUNDS:-2} --rows "${AB_ROWS:-}" \
    --hang-check "${HANG_ROWS:-prompts8,specdec}" --out "$res" "$@" 2>&1 | tee "$res/trees_ab.log" | grep -v "^\[" | tail -45
  rc=${PIPESTATUS[0]}
  if [[ $rc == 0 && -n ${TREES_TESTS:-} ]]; then
    timeout ${TEST_TIMEOUT:-240} python3 -m pytest $TREES_TESTS -n ${XDIST:-16} -q -rfE -p no:cacheprovider \
      --junitxml "$res/junit.xml" 2>&1 | tail -60 >"$res/tests.log"
    rc=${PIPESTATUS[0]}; grep -E "FAILED|ERROR|passed|failed" "$res/tests.log" | tail -20
  fi
  tar czf "$OUT/results.tgz" -C "$res" . && rm -rf "$res"
fi
if [[ $what == ncuwindow ]]; then
  res=$OUT/ncu; mkdir -p "$res"
  for spec in ${NCU_TREES:-main=.peers/t_main/packages new=}; do
    name=${spec%%=*}; dir=${spec#*=}
    impl=ours; kre=gluon
    case $name in  # a name that is an implementation profiles anchors' call of it (window_ncu.py --impl)
      prefix|ours_kv) impl=$name ;;
      fa3|flashinfer)  # a peer from the wheels; FA3's kernel is a CUTLASS device_kernel
        impl=$name; kre=${NCU_PEER_KERNEL:-device_kernel}
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/peers-site "${WHEELS:-.wheels}"/*.whl ;;
    esac
    for shape in ${NCU_SHAPES:-noncausal8k causal8k}; do
      for l2 in ${NCU_L2:-1}; do
        for cap in ${NCU_SOFTCAP:-0}; do
          tag=${name}_${shape}_l2-${l2}_cap-${cap}
          PYTHONPATH=$PYTHONPATH:/tmp/peers-site BENCH_PACKAGES=${dir:+$PWD/$dir} timeout 150 ncu \
            --profile-from-start off --set full --import-source no -k regex:$kre -f -o "$res/$tag" \
            python3 bench/window_ncu.py $shape --l2 $l2 --softcap $cap --impl $impl >"$res/$tag.log" 2>&1
          echo "$tag rc $?"
          ncu -i "$res/$tag.ncu-rep" --page details --csv >"$res/$tag.details.csv" 2>&1
          ncu -i "$res/$tag.ncu-rep" --page source --csv --print-source sass >"$res/$tag.sass.csv" 2>&1
          rm -f "$res/$tag.ncu-rep"
        done
      done
    done
  done
  python3 bench/window_ncu.py --summary "$res" | tee "$res/summary.md"
  tar czf "$OUT/ncu.tgz" -C "$OUT" ncu && rm -rf "$res"
fi
if [[ $what == ncufeatures ]]; then
  res=$OUT/ncu; mkdir -p "$res"
  pkg=${NCU_PACKAGE:-prefix}; lay=${NCU_LAYOUT:-nhd}; head=${NCU_HEAD:-128}
  for feat in ${NCU_FEATURES:-plain fp8_e4m3}; do
    tag=${pkg}_${lay}_d${head}_${feat}
    timeout 200 ncu --profile-from-start off --set full --import-source no -k regex:${NCU_KERNEL:-gluon} -f \
      -o "$res/$tag" python3 bench/feature_ncu.py --package $pkg --layout $lay --head $head --features $feat \
      >"$res/$tag.log" 2>&1
    echo "$tag rc $?"
    ncu -i "$res/$tag.ncu-rep" --page details --csv >"$res/$tag.details.csv" 2>&1
    ncu -i "$res/$tag.ncu-rep" --page source --csv --print-source sass >"$res/$tag.sass.csv" 2>&1
    rm -f "$res/$tag.ncu-rep"
  done
  python3 bench/window_ncu.py --summary "$res" | tee "$res/summary.md"
  tar czf "$OUT/ncu.tgz" -C "$OUT" ncu && rm -rf "$res"
fi
if [[ $what == shortforms ]]; then
  res=$OUT/res; mkdir -p "$res"
  timeout ${BENCH_TIMEOUT:-400} python3 bench/short_forms.py --out "$res" 2>&1 | tee "$res/short_forms.log" | tail -3
  rc=${PIPESTATUS[0]}
  tar czf "$OUT/results.tgz" -C "$res" . && rm -rf "$res"
fi
if [[ $what == hostspread ]]; then
  res=$OUT/res; mkdir -p "$res"
  { lscpu | grep -E "Model name|^CPU\(s\)|NUMA|Thread"; nvidia-smi topo -m; cat /proc/loadavg; } >"$res/host_env.txt" 2>&1
  python3 bench/host_probe.py --rounds 1 --calls 100 >/dev/null 2>&1  # the Triton cache, once
  for i in $(seq ${SPREAD_RUNS:-6}); do
    timeout 60 python3 bench/host_probe.py --peers --rounds 3 2>&1 | sed "s/^/[run $i] /" | tee -a "$res/host_spread.txt" | grep -E "pp_caf |vllm_pp|where"
  done
  for c in ${SPREAD_CPUS:-0 3 7 11 15}; do
    timeout 60 taskset -c $c python3 bench/host_probe.py --peers --rounds 3 2>&1 | sed "s/^/[cpu $c] /" | tee -a "$res/host_spread.txt" | grep -E "pp_caf |vllm_pp|where"
  done
  for i in 1 2; do
    mkdir -p "$res/eng$i"
    timeout 90 python3 bench/engine_step.py --quick --tables host --out "$res/eng$i" 2>&1 | tail -12
  done
  tar czf "$OUT/results.tgz" -C "$res" . && rm -rf "$res"
fi
if [[ $what == quick ]]; then
  # quick: the GPU tests of the launch paths (QUICK_TESTS), the host cost per call, the engine's host and
  # launch tables, then both benchmarks with --quick (pages 16/544/1056; peers beside); into results.tgz
  res=$OUT/res; mkdir -p "$res"
  timeout ${TEST_TIMEOUT:-170} python3 -m pytest ${QUICK_TESTS:-tests/hardening tests/window_prefill tests/integration} \
    -n ${XDIST:-16} -v -rfE -p no:cacheprovider 2>&1 | tee "$res/tests.log" | grep -E "FAILED|ERROR|passed|failed" | tail -30
  rc=${PIPESTATUS[0]}
  timeout 60 python3 bench/host_probe.py 2>&1 | tee "$res/host_probe.txt"
  timeout 70 python3 bench/engine_step.py --quick --tables host,launches --out "$res" 2>&1 | tee "$res/engine_step.log" | tail -12
  timeout ${PREFIX_TIMEOUT:-150} python3 bench/prefix_prefill.py --quick --out "$res" 2>&1 | tee "$res/prefix_prefill.log" | grep -E "peer=(ours|ours_nhd|vllm) " | tail -30
  timeout ${WINDOW_TIMEOUT:-120} python3 bench/window_prefill.py --quick --out "$res" 2>&1 | tee "$res/window_prefill.log" | grep -E "peer=(ours|vllm|flex) " | tail -30
  gzip -f "$res/tests.log"
  tar czf "$OUT/results.tgz" -C "$res" . && rm -rf "$res"
fi
exit $rc
