#!/usr/bin/env bash
# Session 3, call 2 (nvidia-h200-x2, .whl carried): the issue-5 quality table only (no timing runs
# beside it: its 21 host-bound processes would distort them). Returns one tarball.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-}; export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
nvidia-smi -L > $R/gpus.txt 2>&1; nproc >> $R/gpus.txt
bash benchmarks/device/quality_table.sh $R ${QUALITY_LIMIT:-530}
cp $R/quality_h200.png $OUT/ 2>/dev/null
tar czf $OUT/results.tgz -C $OUT r && rm -rf $R
