#!/usr/bin/env bash
# Session 16, call 4 (nvidia-h200; carry .whl and .snap; the last ~300 s of device time): the
# final code's CUDA tests of the cold write path (the S-from-states kernel, the write op in the
# walk and fla modes) and of the long-span walk with its three-stage configs. Call 3's run of the
# same tests ran out of its 80 s while compiling.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
rm -rf /tmp/tree && mkdir -p /tmp/tree && tar xzf .snap/tree.tgz -C /tmp/tree && cd /tmp/tree
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r4; mkdir -p $R; T0=$(date +%s)
timeout 200 python3 -m pytest -p no:cacheprovider -v tests/ops/linear/test_state_summary.py \
  tests/ops/linear/test_chain_forward.py -k "cuda and (state_summary or long_span_kernel or chain_forward_and_summarize)" \
  > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt
tar czf $OUT/s16c4.tgz -C $R .
grep -E "PASSED|FAILED|ERROR|passed|failed|rc=" $R/pytest_cuda.txt | cut -c1-200
