#!/usr/bin/env bash
# GPU1 alone: TTFT part 1, then the fast-path micro-benchmark.
R=$1
OUT=$R TTFT_MAX_SECONDS=330 timeout 440 bash benchmarks/ttft_h200.sh 1 > $R/ttft_part1_stdout.txt 2>&1
echo "ttft rc=$?" >> $R/ttft_part1_stdout.txt
timeout 60 python3 -m hypic.bench.fast_paths --json $R/fast_paths.json > $R/fast_paths_stdout.txt 2>&1
echo "fast_paths rc=$?" >> $R/fast_paths_stdout.txt
tail -c 4000 $R/ttft_part1_stdout.txt; grep -v "^ " $R/fast_paths_stdout.txt | tail -c 3000
