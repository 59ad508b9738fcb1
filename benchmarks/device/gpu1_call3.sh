#!/usr/bin/env bash
# GPU1 alone: the prefill profile (plain 32k per impl pair, PIC 32k cold / all-hit), then 128k in every mode.
R=$1
PROFILE_IMPL_PAIRS=grouped+flash,grouped+flex timeout 290 python3 benchmarks/prefill_profile_h200.py --out $R --max-seconds 250 > $R/profile_stdout.txt 2>&1
echo "profile rc=$? at $SECONDS s" >> $R/profile_stdout.txt
OUT=$R TTFT_MAX_SECONDS=90 timeout $(( 520 - SECONDS )) bash benchmarks/ttft_h200.sh 2 > $R/ttft_part2_stdout.txt 2>&1
echo "ttft rc=$? at $SECONDS s" >> $R/ttft_part2_stdout.txt
grep -v "^ " $R/profile_stdout.txt | tail -c 3000; tail -c 3000 $R/ttft_part2_stdout.txt
