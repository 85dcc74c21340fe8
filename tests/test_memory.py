"""The server gives a finished rollout's memory back: the reference cycles a rollout leaves are collected after it
(not at some later full collection), and the startup heap is frozen so that collection is cheap. What it buys is
measured by `swe-gym-env bench long` / `bench soak` (RSS after the rollouts ÷ idle), not here."""

from __future__ import annotations

import gc
import weakref

from swe_gym_env.server.rollout.service import freeze_startup_heap, release_memory


class _Buffer:
    """Stands in for what a rollout leaves in a cycle: an exception's frame holding its buffers, say."""

    def __init__(self) -> None:
        self.me = self
        self.ids = list(range(10_000))


def test_release_memory_frees_what_only_a_full_collection_would():
    gc.collect()
    gc.disable()  # as if no automatic collection happened to run between the rollout's end and the release
    try:
        held = _Buffer()
        for _ in range(3):  # let it reach the oldest generation, where only full collections look
            gc.collect(1)
        gone = weakref.ref(held)
        del held
        gc.collect(1)
        assert gone() is not None, "a young collection frees it already: this test shows nothing"
        release_memory()
        assert gone() is None
    finally:
        gc.enable()


def test_frozen_startup_heap_is_not_walked_by_the_release():
    gc.collect()
    startup = [[i] for i in range(50_000)]  # stands in for the startup heap (modules, classes, schemas)
    try:
        gc.collect()
        walked = {id(o) for o in gc.get_objects(generation=2)}  # what a full collection walks
        assert id(startup[-1]) in walked
        freeze_startup_heap()
        walked = {id(o) for o in gc.get_objects(generation=2)}
        assert not any(id(o) in walked for o in startup), "frozen objects are still walked"
        assert gc.get_freeze_count() >= len(startup)
        release_memory()  # a full collection that leaves the frozen heap alone
        assert all(len(o) == 1 for o in startup)
    finally:
        gc.unfreeze()
        del startup
