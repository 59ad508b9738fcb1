"""AsyncLLMEngine on the embedded tiny model (fp32, CPU): streams, continuous batching, abort,
errors confined to their request, the bounded queue and shutdown."""

import asyncio
import threading

import pytest
import torch

from hypic.engine.async_engine import AsyncLLMEngine, EngineClosedError, EngineStepError, QueueFullError
from hypic.engine.engine import LLMEngine
from hypic.engine.sampling_params import SamplingParams

PROMPTS = [
    "the mentor of kolton is",
    "<sep> this passage is about kolton . kolton works as a",
    "a",
    "<sep> this passage is about kolton . kolton lives in santon . the mentor of kolton is zala . kolton owns a",
]
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
ENGINE = dict(dtype="float32", device="cpu", seed=0, max_model_len=128, max_num_batched_tokens=8)


# one OpenMP thread: the engine loop, the event loop and the client share a 2-core CI box
pytestmark = pytest.mark.usefixtures("single_thread_torch")


@pytest.fixture(scope="module")
def expected():
    """Each prompt's greedy tokens from the synchronous engine (one OpenMP thread, as the tests)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    engine = LLMEngine("tiny", **ENGINE)
    out = {}
    for prompt in PROMPTS:
        engine.add_request(prompt, GREEDY)
        while engine.has_unfinished_requests():
            for o in engine.step():
                if o.finished:
                    out[prompt] = o.outputs[0].token_ids
    torch.set_num_threads(previous)
    return out


@pytest.fixture
def engine():
    engine = AsyncLLMEngine(LLMEngine("tiny", **ENGINE), max_waiting_requests=8)
    yield engine
    engine.shutdown(timeout_s=5)


async def collect(engine, prompt, params=GREEDY, request_id=None):
    outputs = [o async for o in engine.generate(prompt, params, request_id)]
    assert outputs[-1].finished and not any(o.finished for o in outputs[:-1])
    return outputs


def test_concurrent_streams_equal_each_alone(engine, expected):
    async def main():
        return await asyncio.gather(*(collect(engine, p) for p in PROMPTS * 2))

    results = asyncio.run(main())
    for prompt, outputs in zip(PROMPTS * 2, results):
        assert outputs[-1].outputs[0].token_ids == expected[prompt]
        # one output per token, cumulative
        assert [len(o.outputs[0].token_ids) for o in outputs] == list(range(1, 7))
    assert engine.num_unfinished_requests == 0 and not engine.engine.has_unfinished_requests()


def test_requests_from_several_threads_and_loops(engine, expected):
    results = {}

    def worker(i):
        prompt = PROMPTS[i % len(PROMPTS)]
        results[i] = (prompt, asyncio.run(collect(engine, prompt))[-1].outputs[0].token_ids)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 6 and all(ids == expected[p] for p, ids in results.values())


def test_leaving_the_stream_early_aborts_the_request(engine, expected):
    async def main():
        long = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
        async for output in engine.generate(PROMPTS[0], long, "early"):
            if len(output.outputs[0].token_ids) == 2:
                break
        # a cancelled consumer aborts too
        task = asyncio.create_task(collect(engine, PROMPTS[1], long, "cancelled"))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await collect(engine, PROMPTS[2])

    after = asyncio.run(main())
    assert after[-1].outputs[0].token_ids == expected[PROMPTS[2]]
    assert engine.num_unfinished_requests == 0 and not engine.engine.has_unfinished_requests()
    assert engine.num_aborted_requests == 2


def test_bad_input_fails_only_its_request(engine, expected):
    async def main():
        good = asyncio.create_task(collect(engine, PROMPTS[3]))
        for bad in ("", [1, 10**6], 3.5):
            with pytest.raises(ValueError):
                await engine.add_request(bad, GREEDY)
        with pytest.raises(ValueError, match="does not fit"):
            await engine.add_request(PROMPTS[0], SamplingParams(max_tokens=1000))
        return await good

    assert asyncio.run(main())[-1].outputs[0].token_ids == expected[PROMPTS[3]]
    assert engine.num_waiting_requests == 0


def test_a_failing_step_fails_the_held_requests_and_the_loop_goes_on(engine, expected):
    step = engine.engine.step
    calls = []

    def failing_once():
        if not calls:
            calls.append(1)
            raise RuntimeError("device lost")
        return step()

    engine.engine.step = failing_once

    async def main():
        with pytest.raises(EngineStepError, match="device lost"):
            await collect(engine, PROMPTS[0])
        return await collect(engine, PROMPTS[1])

    assert asyncio.run(main())[-1].outputs[0].token_ids == expected[PROMPTS[1]]
    assert not engine.engine.has_unfinished_requests()


def test_bounded_queue_and_shutdown_drains(expected, hold_steps):
    engine = LLMEngine("tiny", **ENGINE)
    release = hold_steps(engine)
    async_engine = AsyncLLMEngine(engine, max_waiting_requests=2)

    async def main():
        tasks = [asyncio.create_task(collect(async_engine, p)) for p in PROMPTS[:2]]
        await asyncio.sleep(0.05)
        with pytest.raises(QueueFullError):
            await async_engine.add_request(PROMPTS[2], GREEDY)
        # shutdown (from another thread) waits for the running requests, then refuses new ones
        stopper = threading.Thread(target=async_engine.shutdown, kwargs={"timeout_s": 30})
        stopper.start()
        await asyncio.sleep(0.05)
        with pytest.raises(EngineClosedError):
            await async_engine.add_request(PROMPTS[2], GREEDY)
        release.set()
        done = await asyncio.gather(*tasks)
        await asyncio.to_thread(stopper.join, 30)
        return done

    done = asyncio.run(main())
    assert [d[-1].outputs[0].token_ids for d in done] == [expected[p] for p in PROMPTS[:2]]
    assert not async_engine.is_running


def test_shutdown_timeout_aborts_what_is_left():
    async_engine = AsyncLLMEngine(LLMEngine("tiny", **ENGINE))

    async def main():
        long = SamplingParams(temperature=0, max_tokens=120, ignore_eos=True)
        stream = await async_engine.add_request(PROMPTS[0], long)
        await asyncio.to_thread(async_engine.shutdown, 0.0)
        with pytest.raises(EngineClosedError):
            async for _ in stream:
                pass

    asyncio.run(main())
    assert not async_engine.engine.has_unfinished_requests()
