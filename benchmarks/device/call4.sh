#!/usr/bin/env bash
# Last device minutes: GPU accuracy of GDN and KDA (two processes, one GPU, no timing).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-}; export PYTHONUNBUFFERED=1
for f in gated_delta kda; do
  ( timeout ${ACC_TIMEOUT:-165} python3 benchmarks/linear_ops_h200.py --quick --sections accuracy --families $f --tag $f --out $OUT > $OUT/accuracy_$f.txt 2>&1; echo "rc=$?" >> $OUT/accuracy_$f.txt ) &
done
wait
tail -n 5 $OUT/accuracy_*.txt
