export PYTHONPATH="$(ls -d $PWD/packages/*/src | paste -sd:):$PWD/.peers" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
timeout 105 python3 -m pytest tests/paged_kv_offsets tests/attn_reference tests/window_prefill -n 16 -v -p no:cacheprovider -W ignore > $OUT/tests_a.log 2>&1; echo "tests_a rc=$?"
grep -E "FAILED|passed|failed" $OUT/tests_a.log | tail -8
timeout 70 python3 bench/window_prefill.py --out $OUT/w --shapes pr,llm > $OUT/bench_w.log 2>&1; grep -E "peer=(ours|flex|vllm) " $OUT/bench_w.log; cp $OUT/w/window_prefill.md $OUT/ 2>/dev/null
timeout 60 python3 -m pytest tests/prefix_prefill tests/hardening -n 16 -v -p no:cacheprovider -W ignore > $OUT/tests_b.log 2>&1; echo "tests_b rc=$?"
grep -E "FAILED" $OUT/tests_b.log | head -20; grep -cE "PASSED" $OUT/tests_b.log
