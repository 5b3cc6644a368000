"""The collector folds frames with the cyclic garbage collector held off and freezes what it made, out of the
collector's later walks (dagtop/ui/collector.py says what that saves). Garbage still goes, and a process that
manages the collector itself is left alone."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
from helpers.frames import ListSource

from dagtop.model.synthetic import SyntheticJob, synthetic_frames
from dagtop.ui import collector as collector_module
from dagtop.ui.collector import Collector


@pytest.fixture
def clean_gc() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.unfreeze()
    try:
        yield
    finally:
        gc.unfreeze()
        (gc.enable if enabled else gc.disable)()


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_folding_freezes_what_it_made_and_garbage_still_goes(clean_gc: None, monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    frames = synthetic_frames(SyntheticJob(ranks=4), iterations=12)
    collector = Collector(ListSource(frames, batch=50))
    assert gc.get_freeze_count() == 0
    collector.fold(frames[: len(frames) // 2])
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    assert frozen > 1000  # the analyses' tasks among them: out of every later scan
    cycle = _Cycle()  # made after the freeze, dead before the next fold: collected by it
    dead = weakref.ref(cycle)
    del cycle
    collector.fold(frames[len(frames) // 2:])
    assert dead() is None and gc.isenabled() and gc.get_freeze_count() > frozen
    # A cycle frozen alive and dead since goes at the next thaw.
    kept = _Cycle()
    collector.fold([])
    gone = weakref.ref(kept)
    del kept
    monkeypatch.setattr(collector_module, "THAW_EVERY_S", 0.0)
    collector.fold([])
    assert gone() is None and gc.isenabled()


def test_a_process_that_turned_the_collector_off_is_left_alone(clean_gc: None) -> None:
    frames = synthetic_frames(SyntheticJob(ranks=2), iterations=6)
    gc.disable()
    Collector(ListSource(frames, batch=50)).fold(frames)
    assert not gc.isenabled() and gc.get_freeze_count() == 0
