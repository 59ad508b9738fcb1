"""Shared by the engine tests."""

from __future__ import annotations


def drain(engine, request_ids):
    """Step ``engine`` until nothing is left; the final outputs of ``request_ids``, in order."""
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    return [done[i] for i in request_ids]
