"""Freezing start-up's objects out of the cyclic collector: only where a service process turned it on."""

from __future__ import annotations

import gc
import weakref

import pytest

from services.runtime import heap


@pytest.fixture
def freezing():
    """Freezing enabled for one test, and everything it froze handed back to the collector after it."""
    heap.enable_freezing()
    yield
    gc.unfreeze()
    heap._enabled = False


def test_nothing_is_frozen_where_no_service_process_asked():
    assert not heap._enabled
    before = gc.get_freeze_count()
    assert heap.freeze_long_lived() == 0
    assert gc.get_freeze_count() == before


def test_objects_alive_at_the_freeze_are_out_of_the_collector_and_garbage_before_it_is_collected(freezing):
    class Node:
        def __init__(self) -> None:
            self.me = self  # a cycle: only the cyclic collector frees it

    kept, dropped = Node(), Node()
    dropped_ref = weakref.ref(dropped)
    del dropped
    frozen = heap.freeze_long_lived()
    assert dropped_ref() is None  # start-up's garbage is collected first, not frozen
    assert frozen == gc.get_freeze_count() > 0
    assert id(kept) not in {id(obj) for obj in gc.get_objects()}  # what later collections walk: not the frozen
    later = Node()
    assert id(later) in {id(obj) for obj in gc.get_objects()}  # new objects are collected as before
