#!/usr/bin/env bash
# Session 3, call 3 (nvidia-h200-x2; .whl and training/runs/prev_in carried):
#   phase 1: GPU 0 trains the tiny model (adds the order_lookup task) for TRAIN_MINUTES;
#            GPU 1 times TTFT part 3 (host-bound all-hit / RAG points at 32k and 8k) meanwhile;
#   phase 2: the new weights replace hypic/assets/tiny's, and the issue-5 quality table runs on
#            both GPUs (benchmarks/device/quality_table.sh).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-}; export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
mkdir -p training/runs/prev && cp training/runs/prev_in/*.safetensors training/runs/prev/ && tar xf training/runs/prev_in/small.tar -C training/runs/prev
( CUDA_VISIBLE_DEVICES=0 timeout 400 python3 training/train_tiny.py --resume training/runs/prev --out training/runs/ckpt \
    --max-minutes ${TRAIN_MINUTES:-4.5} --total-steps 15000 --workers 8 --eval-every 250 > $R/train_stdout.txt 2>&1
  echo "train rc=$? after $(( $(date +%s) - T0 )) s" >> $R/train_stdout.txt ) &
TRAIN=$!
( CUDA_VISIBLE_DEVICES=1 OUT=$R TTFT_MAX_SECONDS=${TTFT_SECONDS:-170} timeout ${TTFT_TIMEOUT:-250} bash benchmarks/ttft_h200.sh 3 > $R/ttft_part3_stdout.txt 2>&1
  echo "ttft rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_part3_stdout.txt ) &
wait
tail -c 1500 $R/train_stdout.txt; tail -c 2500 $R/ttft_part3_stdout.txt
if [[ -f training/runs/ckpt/model.safetensors ]]; then
  cp training/runs/ckpt/model.safetensors hypic/assets/tiny/model.safetensors
  bash benchmarks/device/quality_table.sh $R ${QUALITY_LIMIT:-220}
  mkdir -p $OUT/ckpt
  cp training/runs/ckpt/*.safetensors $OUT/ckpt/
  tar cf $OUT/ckpt/small.tar -C training/runs/ckpt --exclude='*.safetensors' .
fi
echo "call done after $(( $(date +%s) - T0 )) s"
tar czf $OUT/results.tgz -C $OUT r && rm -rf $R
