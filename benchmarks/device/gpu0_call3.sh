#!/usr/bin/env bash
# GPU0: issue-2 accuracy of the four families not measured yet, in parallel processes (no timing),
# plus the CUDA tests that need no fla compile and the Triton-interpreter test alone.
R=$1
for f in delta gla simple_gla mamba2; do
  ( timeout 470 python3 benchmarks/linear_ops_h200.py --quick --sections accuracy --families $f --tag $f --out $R > $R/accuracy_$f.txt 2>&1; echo "rc=$?" >> $R/accuracy_$f.txt ) &
done
timeout 200 python3 -m pytest -q -p no:cacheprovider --timeout 120 --tb=short -rfs tests/ops/test_moe_grouped.py \
   tests/ops/test_attention_flash.py tests/ops/test_attention_flex.py tests/pic/test_store.py > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$?" >> $R/pytest_cuda.txt
timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=long tests/ops/linear/test_fla_paths.py -k interpreter > $R/pytest_interpreter.txt 2>&1
echo "pytest rc=$?" >> $R/pytest_interpreter.txt
wait
tail -c 2500 $R/pytest_cuda.txt; tail -c 2500 $R/pytest_interpreter.txt; for f in delta gla simple_gla mamba2; do tail -n 4 $R/accuracy_$f.txt; done
