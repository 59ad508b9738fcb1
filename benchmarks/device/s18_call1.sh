#!/usr/bin/env bash
# Session 18, call 1 (nvidia-h200; carry .whl and .snap): core graphs kept across forwards of one
# layout signature (HYPIC_KEPT_LAYOUTS). All-hit 32k and 8k with the kept graphs against
# per-forward graphs in one process (interleaved A/B), a timeline with the kept graphs, and the
# host profile of a request whose graphs are not kept (what every request of a new shape pays);
# whether a failed capture leaves the graph pool usable; the runner's CUDA tests; where a cold hypic request's time over full_recompute goes, by kernel.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
rm -rf /tmp/tree && mkdir -p /tmp/tree && tar xzf .snap/tree.tgz -C /tmp/tree && cd /tmp/tree
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r1; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s18c1.tgz -C $R .; }
(cd benchmarks && timeout 290 python3 allhit_ab_h200.py --tag s18c1 --out $R --prompts 32768,8192 --repeats 5 \
  --no-profile --timeline --ab-env HYPIC_KEPT_LAYOUTS --ab-values 4,0 --fresh-graphs-profile > $R/ab_stdout.txt 2>&1
 echo "ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_stdout.txt); pack
timeout 60 python3 benchmarks/graph_capture_probe_h200.py --out $R > $R/probe_stdout.txt 2>&1
echo "probe rc=$?" >> $R/probe_stdout.txt; pack
timeout 100 python3 -m pytest -p no:cacheprovider -v tests/engine/test_pic_runner_cuda.py > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt; pack
LEFT=$(( 585 - ($(date +%s) - T0) ))
[ $LEFT -gt 90 ] && { (cd benchmarks && timeout $LEFT python3 cold_diff_h200.py --out $R --repeats 2 > $R/cold_diff_stdout.txt 2>&1
  echo "cold_diff rc=$? after $(( $(date +%s) - T0 )) s" >> $R/cold_diff_stdout.txt); pack; }
grep -E "HYPIC_KEPT_LAYOUTS|ttft p50|rc=" $R/ab_stdout.txt | cut -c1-250
cat $R/probe_stdout.txt | cut -c1-200
grep -E "PASSED|FAILED|ERROR|passed|failed|rc=" $R/pytest_cuda.txt | cut -c1-160
head -c 5000 $R/cold_diff_stdout.txt 2>/dev/null | grep -v USDT
echo "call done after $(( $(date +%s) - T0 )) s"
