#!/usr/bin/env bash
# GPU0 beside training: issue-2 accuracy (no timing), then the CUDA-only tests.
R=$1
timeout 330 python3 benchmarks/linear_ops_h200.py --quick --sections accuracy --out $R > $R/accuracy_stdout.txt 2>&1
echo "accuracy rc=$?" >> $R/accuracy_stdout.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider --timeout 90 --tb=short -rfs tests/ops/test_moe_grouped.py \
   tests/ops/test_attention_flash.py tests/ops/test_attention_flex.py tests/pic/test_store.py tests/ops/linear/test_fla_paths.py > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$?" >> $R/pytest_cuda.txt
tail -c 1500 $R/accuracy_stdout.txt; tail -c 3000 $R/pytest_cuda.txt
