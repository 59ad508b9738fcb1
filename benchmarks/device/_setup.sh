#!/usr/bin/env bash
# Sourced by device scripts from session 23 on (`source benchmarks/device/_setup.sh TAG`), in
# place of the preamble each script of sessions 3-22 repeats: installs the carried wheels
# (.whl), unpacks the carried snapshot (.snap/tree.tgz) into /tmp/tree and changes there, sets
# the environment, and defines R (results folder), T0 (start), pack (tar R into $OUT/TAG.tgz)
# and left (seconds left of a budget: `left 480`). HYPIC_SKIP_INTERPRETER=1: the tests'
# interpreter checks skip (CI runs them on the CPU), so pytest time goes to CUDA tests.
TAG=${1:?usage: source benchmarks/device/_setup.sh TAG}
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
rm -rf /tmp/tree && mkdir -p /tmp/tree && tar xzf .snap/tree.tgz -C /tmp/tree && cd /tmp/tree || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export HYPIC_SKIP_INTERPRETER=1
R=/tmp/r_$TAG; mkdir -p "$R"; T0=$(date +%s)
pack() { tar czf "$OUT/$TAG.tgz" -C "$R" .; }
left() { echo $(( $1 - ($(date +%s) - T0) )); }
