#!/usr/bin/env bash
# GPU1 of call 1: issue-2 accuracy + CUDA tests (one after the other), concurrently with the prefill profile.
R=$1
( timeout 280 python3 benchmarks/linear_ops_h200.py --quick --sections accuracy --out $R > $R/accuracy_stdout.txt 2>&1
  echo "accuracy rc=$?" >> $R/accuracy_stdout.txt
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/ops/linear/test_fla_paths.py tests/ops/test_moe_grouped.py \
     tests/ops/test_attention_flash.py tests/ops/test_attention_flex.py tests/pic/test_store.py -rs > $R/pytest_cuda.txt 2>&1
  echo "pytest rc=$?" >> $R/pytest_cuda.txt
  timeout 90 python3 -m hypic.bench.fast_paths --json $R/fast_paths.json > $R/fast_paths_stdout.txt 2>&1
  echo "fast_paths rc=$?" >> $R/fast_paths_stdout.txt ) &
timeout 530 python3 benchmarks/prefill_profile_h200.py --out $R --max-seconds 470 > $R/profile_stdout.txt 2>&1
echo "profile rc=$?" >> $R/profile_stdout.txt
wait
tail -c 1500 $R/accuracy_stdout.txt; tail -c 2500 $R/pytest_cuda.txt; tail -c 2000 $R/fast_paths_stdout.txt; tail -c 3000 $R/profile_stdout.txt
