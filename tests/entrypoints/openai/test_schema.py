"""Property-based run of the server's OpenAPI document (schemathesis) against a real server: every
operation with generated valid and invalid bodies. No input may produce a 5xx, a status or
content type the document does not declare, a body that violates the declared schema, or the
acceptance of a body the schema forbids. Not checked: that every schema-valid body is accepted
(a prompt longer than the model's limit, token ids outside its vocabulary or a chat without a
template are valid JSON the engine must refuse with a 400)."""

import pytest

schemathesis = pytest.importorskip("schemathesis")
pytest.importorskip("uvicorn")

from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis import checks  # noqa: E402

# one OpenMP thread: the engine loop, the event loop and the client share a 2-core CI box
pytestmark = pytest.mark.usefixtures("single_thread_torch")

CASES = {"count": 0}


@pytest.fixture(scope="module")
def api(live_server):
    url, _ = live_server
    return schemathesis.openapi.from_url(f"{url}/openapi.json")


schema = schemathesis.pytest.from_fixture("api")


@schema.parametrize()
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_operation_answers_as_documented(case, live_server):
    url, engine = live_server
    case.call_and_validate(base_url=url, timeout=60, excluded_checks=[checks.positive_data_acceptance])
    CASES["count"] += 1


def test_the_run_was_large_and_left_the_engine_clean(live_server):
    url, engine = live_server
    print(f"schemathesis cases: {CASES['count']}")
    assert CASES["count"] >= 200, CASES  # "a few hundred cases"
    assert engine.num_unfinished_requests == 0
    assert engine.segment_cache_stats().held_entries == 0
