#!/usr/bin/env python3
"""Tensor ops issued by engine and model code for one all-hit PIC prefill, with 4 and with 12
cached segments, on the CPU test model (the counter of
tests/engine/test_pic_runner.py::test_engine_issues_no_tensor_op_per_cached_segment). Equal counts
mean no tensor op per cached segment per layer.

    PYTHONPATH=. python3 benchmarks/engine_op_count_cpu.py
"""

from __future__ import annotations

from tests.runner.pic_helpers import PicHarness, random_segment, tiny_model
from tests.engine.test_pic_runner import _EngineOpCounter


def main() -> None:
    spec, model = tiny_model(seed=0)
    for n in (4, 12):
        harness = PicHarness(spec, model)
        segments = [random_segment(40, 300 + i) for i in range(n)]
        query = random_segment(5, 9)
        harness.run(list(reversed(segments)), query)  # cache every segment, in another order
        plan = harness.plan(segments, query)
        counter = _EngineOpCounter()
        with plan:
            with counter.mode:
                harness.runner.prefill([plan])
        print(f"{n:2d} cached segments: {counter.count} engine+model tensor ops")


if __name__ == "__main__":
    main()
