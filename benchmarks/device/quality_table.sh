#!/usr/bin/env bash
# Issue-5 quality table on the device: 500 held-out requests per task, every mode, hypic at
# w in {0,1,2,4,8,16,32}, the three cold policies. The tiny model is host-bound, so the table is
# split over many processes (one CPU thread each) spread over the visible GPUs; each writes its own
# --json after every finished cell, and `hypic bench quality --merge` joins them afterwards.
# usage: bash benchmarks/device/quality_table.sh OUT_DIR [SECONDS_PER_PROCESS]
set -u
R=$1; LIMIT=${2:-500}; N=${QUALITY_REQUESTS:-500}
mkdir -p $R/quality
NG=$(python3 -c 'import torch; print(max(1, torch.cuda.device_count()))')
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
i=0
launch() {  # name, then hypic bench quality arguments
  local name=$1; shift
  ( CUDA_VISIBLE_DEVICES=$(( i % NG )) timeout $LIMIT python3 -m hypic bench quality --model tiny --device ${QUALITY_DEVICE:-cuda} \
      --num-requests $N --batch-size 32 --no-progress --json $R/quality/$name.json "$@" \
      > $R/quality/$name.log 2>&1; echo "rc=$?" >> $R/quality/$name.log ) &
  i=$(( i + 1 ))
}
for task in ${QUALITY_TASKS:-single_hop two_hop summary}; do
  launch ${task}_nostore --tasks $task --modes full_recompute,prefix_cache
  for policy in inline standalone canonical; do
    launch ${task}_${policy}_a --tasks $task --cold-policies $policy --modes hypic --seams 8,32,2
    launch ${task}_${policy}_b --tasks $task --cold-policies $policy --modes addition,transition,transition_rope,hypic --seams 0,16,4,1
  done
done
wait
tail -qn 1 $R/quality/*.log | sort | uniq -c
python3 -m hypic bench quality --merge $R/quality/*.json --json $R/quality_h200.json --plot $R/quality_h200.png > $R/quality_h200.txt 2>&1
cat $R/quality_h200.txt
