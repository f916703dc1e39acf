"""workers/heap.py: the worker's start-up heap leaves the collector's work, the collector stays on."""

from __future__ import annotations

import gc
import weakref

import pytest

from perdure.workers import heap


@pytest.fixture
def restored_collector():
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_settle_freezes_the_heap_it_finds_and_collects_the_young_less_often(restored_collector):
    gc.unfreeze()
    heap.settle()
    assert gc.get_freeze_count() > 10_000  # this test process's modules, at least
    assert gc.get_threshold()[0] == heap.FIRST_GENERATION_THRESHOLD
    assert gc.isenabled()


def test_garbage_from_before_settle_is_freed_not_frozen(restored_collector):
    gc.unfreeze()
    cycle = _Cycle()
    gone = weakref.ref(cycle)
    del cycle
    heap.settle()
    assert gone() is None


def test_a_cycle_made_after_settle_is_still_collected(restored_collector):
    heap.settle()
    cycle = _Cycle()
    gone = weakref.ref(cycle)
    del cycle
    assert gone() is not None  # a cycle: reference counting alone does not free it
    gc.collect()
    assert gone() is None
