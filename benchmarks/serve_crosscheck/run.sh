#!/usr/bin/env bash
# Cross-check of `hypic bench serve`'s client against AIPerf (NVIDIA's load tool, 0.13.0) on the CPU
# with the embedded tiny model: the same prompts (text form, <<PIC_SEP>>-joined) at the same instants
# (one Poisson schedule, written by `hypic bench serve --schedule-dir` as AIPerf's mooncake_trace
# JSONL and replayed by AIPerf with --fixed-schedule), each run against its own fresh
# `hypic serve tiny` process, runs interleaved (ours, AIPerf, ours, AIPerf) so that a drift in the
# machine's load hits both tools alike. compare.py then puts the TTFT distributions side by side,
# with the two runs of each tool as the noise floor.
#
#   bash benchmarks/serve_crosscheck/run.sh OUT_DIR [AIPERF_BIN] [ROUNDS]
#
# AIPerf is not a dependency of hypic: install it apart, e.g.
#   python3 -m venv /tmp/aiperf-venv && /tmp/aiperf-venv/bin/pip install aiperf==0.13.0
# skip_special_tokens=false on both sides: tiny emits special tokens (empty text otherwise), and
# AIPerf times the first token with text.
set -euo pipefail
OUT=${1:?usage: run.sh OUT_DIR [AIPERF_BIN] [ROUNDS]}
AIPERF=${2:-aiperf}
ROUNDS=${3:-3}  # runs of each tool
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUT"
PORT=18123
RATE=2
TRACE=(--prompt-tokens 256 --segment-tokens 32 --doc-tokens 32,96 --system-tokens 32 --query-tokens 8,16
       --output-tokens 16,32 --trace-seed 0)
SERVER_PID=

start_server() {  # a fresh server: empty store, nothing cached
  python3 -m hypic serve tiny --device cpu --host 127.0.0.1 --port $PORT > "$OUT/server_$1.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && return 0
    sleep 0.2
  done
  echo "server did not start" >&2; return 1
}

stop_server() {
  kill -INT "$SERVER_PID"; wait "$SERVER_PID" || true
}
trap 'kill "$SERVER_PID" 2>/dev/null || true' EXIT

ours() {
  start_server "$1"
  python3 -m hypic bench serve --base-url "http://127.0.0.1:$PORT" --modes "$1" --prompt-form text "${TRACE[@]}" \
    --request-rates $RATE --warmup-s 0 --measure-s 60 --no-corpus-warmup --calibration-requests 0 \
    --extra-body '{"skip_special_tokens": false}' --drain-timeout-s 120 \
    --schedule-dir "$OUT/schedule" --json "$OUT/$1.json" | tee "$OUT/$1.txt"
  stop_server
}

theirs() {
  start_server "$1"
  "$AIPERF" profile --model tiny --url "http://127.0.0.1:$PORT" --endpoint-type completions --streaming \
    --input-file "$OUT/schedule/schedule_256_$RATE.jsonl" --custom-dataset-type mooncake_trace --fixed-schedule \
    --extra-inputs ignore_eos:true --extra-inputs temperature:0 --extra-inputs skip_special_tokens:false \
    --tokenizer hypic/assets/tiny --use-server-token-count --output-artifact-dir "$OUT/$1" > "$OUT/$1.txt" 2>&1
  stop_server
}

OURS=()
THEIRS=()
for k in $(seq "$ROUNDS"); do
  ours "hypic_bench_$k"
  theirs "aiperf_$k"
  OURS+=("$OUT/hypic_bench_$k.json")
  THEIRS+=("$OUT/aiperf_$k/profile_export.jsonl")
done
python3 benchmarks/serve_crosscheck/compare.py --ours "${OURS[@]}" --aiperf "${THEIRS[@]}" --json "$OUT/crosscheck.json" \
  | tee "$OUT/crosscheck.txt"
