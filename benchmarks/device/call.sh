#!/usr/bin/env bash
# Device-call driver of session 2 (run from the repository root on an nvidia-h200-x2 machine, with
# .whl carried): GPU 0 trains the tiny model (resuming from
# training/runs/ckpt, else from training/runs/prev_in) and runs $GPU0_SCRIPT beside it; GPU 1 runs
# the timed GPU1_SCRIPT alone. Results are packed into at most 8 files (the device limit).
# usage: bash benchmarks/device/call.sh TRAIN_ARGS_MODE GPU1_SCRIPT
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-}; export PYTHONUNBUFFERED=1
mkdir -p .triton/cache
export TRITON_CACHE_DIR=$PWD/.triton/cache
R=$OUT/r; mkdir -p $R
nvidia-smi -L > $R/gpus.txt 2>&1
NG=$(python3 -c 'import torch; print(torch.cuda.device_count())')
G1=$(( NG > 1 ? 1 : 0 ))
echo "gpus=$NG bench_gpu=$G1" | tee -a $R/gpus.txt
TRAIN_MODE=$1; GPU1_SCRIPT=$2
T0=$(date +%s)
if [[ "$TRAIN_MODE" != "none" ]]; then
  if [[ -d training/runs/prev_in ]]; then mkdir -p training/runs/prev && cp training/runs/prev_in/*.safetensors training/runs/prev/ && tar xf training/runs/prev_in/small.tar -C training/runs/prev; fi
  if [[ "$TRAIN_MODE" == "fresh" ]]; then RES=(); 
  elif [[ -f training/runs/ckpt/trainer_state.json ]]; then RES=(--resume training/runs/ckpt);
  else RES=(--resume training/runs/prev); fi
  echo "train resume: ${RES[*]:-fresh}" > $R/train_stdout.txt
  ( CUDA_VISIBLE_DEVICES=0 timeout ${TRAIN_TIMEOUT:-555} python3 training/train_tiny.py "${RES[@]}" --out training/runs/ckpt \
      --max-minutes ${TRAIN_MINUTES:-8.0} --total-steps 15000 --workers 10 ${TRAIN_EXTRA:-} >> $R/train_stdout.txt 2>&1
    echo "train rc=$? after $(( $(date +%s) - T0 )) s" >> $R/train_stdout.txt ) &
fi
if [[ -n "${GPU0_SCRIPT:-}" ]]; then
  ( CUDA_VISIBLE_DEVICES=0 bash "$GPU0_SCRIPT" "$R" > $R/gpu0_stdout.txt 2>&1; echo "gpu0 done after $(( $(date +%s) - T0 )) s" >> $R/gpu0_stdout.txt ) &
fi
CUDA_VISIBLE_DEVICES=$G1 bash "$GPU1_SCRIPT" "$R" > $R/gpu1_stdout.txt 2>&1
echo "gpu1 done after $(( $(date +%s) - T0 )) s" >> $R/gpu1_stdout.txt
wait
# Pack: 3 big checkpoint files alone, everything small in one tar, the Triton cache in another.
if [[ -f training/runs/ckpt/model.safetensors ]]; then
  mkdir -p $OUT/ckpt
  cp training/runs/ckpt/model.safetensors training/runs/ckpt/optimizer_exp_avg*.safetensors $OUT/ckpt/ 2>/dev/null
  tar cf $OUT/ckpt/small.tar -C training/runs/ckpt --exclude='*.safetensors' .
fi
[[ "${KEEP_TRITON:-1}" == "1" ]] && tar czf /tmp/triton_cache.tgz -C .triton cache 2>/dev/null && split -b 15m /tmp/triton_cache.tgz $OUT/triton_cache.tgz.part_
tail -c 3000 $R/train_stdout.txt 2>/dev/null
tail -c 2500 $R/gpu0_stdout.txt 2>/dev/null; tail -c 5000 $R/gpu1_stdout.txt
tar czf $OUT/results.tgz -C $OUT r && rm -rf $R
ls -la $OUT $OUT/ckpt 2>/dev/null
