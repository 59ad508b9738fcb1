"""Smoke run of the fast-path micro-benchmark on tiny CPU shapes (the CUDA run is the real one)."""

import json

import pytest

from hypic.bench.fast_paths import main

pytestmark = [
    pytest.mark.usefixtures("single_thread_torch"),
    pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile"),
]


def test_tiny_run_writes_every_case_and_impl(tmp_path):
    out = tmp_path / "bench.json"
    rows = main(["--tiny", "--reps", "1", "--json", str(out)])
    assert json.loads(out.read_text())["rows"] == rows
    got = {(r["case"].split()[0], r["impl"]) for r in rows}
    assert got == {("moe", "reference"), ("moe", "grouped"), ("attention", "reference"), ("attention", "flex")}
    assert len(rows) == 8
    for r in rows:
        assert r["ms"] > 0 and r["tflops"] > 0 and r["sync_free"] is None
