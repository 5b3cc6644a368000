"""One rule of a complete iteration for the live screen, ``report`` and ``record``: the model's admission and
:func:`~dagtop.model.completion.missing`."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.frames import ListSource, hello

from dagtop.commands.record import record
from dagtop.io.recording import RecordingWriter
from dagtop.model.admission import Admission
from dagtop.model.completion import missing
from dagtop.model.frames import RawFrame
from dagtop.model.pipeline import Pipeline
from dagtop.model.synthetic import SyntheticJob, synthetic_frames
from instrument import wire


def _decoded(frames: list[RawFrame]) -> list[tuple[RawFrame, wire.Frame]]:
    return [(f, wire.decode(f.payload)) for f in frames]


def _hello(rank: int, world: int, seq: int = 0) -> RawFrame:
    return RawFrame(0, wire.encode(hello(rank, world, seq)))


def _iteration(rank: int, it: int, seq: int) -> RawFrame:
    return RawFrame(it, wire.encode_iteration(seq, rank, it, [("io", "load", "next", "main", 10, 20, 0)], 0))


def _job(ranks: int = 3, iterations: int = 8) -> list[RawFrame]:
    return synthetic_frames(SyntheticJob(ranks=ranks), iterations=iterations)


def _rank_leaves(frames: list[RawFrame], rank: int, after: int) -> list[RawFrame]:
    """``rank`` sends iterations up to ``after`` and then says bye; the other ranks carry on."""
    out = []
    for f, x in _decoded(frames):
        if isinstance(x, wire.IterationBatch) and x.rank == rank and x.iteration > after:
            continue
        out.append(f)
        if isinstance(x, wire.IterationBatch) and (x.rank, x.iteration) == (rank, after):
            out.append(RawFrame(f.received_ns, wire.encode(wire.Bye(x.seq + 1, rank, after + 1, 0))))
    return out


def _late_joiner(frames: list[RawFrame], rank: int, joins: int) -> list[RawFrame]:
    """``rank`` sends nothing for the iterations before ``joins``."""
    return [f for f, x in _decoded(frames)
            if not (isinstance(x, wire.IterationBatch) and x.rank == rank and x.iteration < joins)]


def _stranger(frames: list[RawFrame]) -> list[RawFrame]:
    """A rank beyond the world size sends its frames too, and every frame arrives twice."""
    extra = [_iteration(7, it, it) for it in range(3)]
    return [f for pair in zip(frames, frames) for f in pair] + extra


@pytest.mark.parametrize("frames", [
    pytest.param(_job(), id="clean"),
    pytest.param(_rank_leaves(_job(), rank=2, after=3), id="a rank leaves with a bye"),
    pytest.param(_late_joiner(_job(), rank=1, joins=2), id="a late joiner"),
    pytest.param(_stranger(_job()), id="a rank beyond the world, duplicates"),
])
def test_record_counts_the_iterations_report_analyses_complete(tmp_path: Path, frames: list[RawFrame]) -> None:
    p = Pipeline(window=None)
    p.feed(frames)
    p.finish()
    with RecordingWriter(tmp_path / "r.dagtop") as writer:
        progress = record(ListSource(frames, batch=5), writer)
    complete = [a.iteration for a in p.analyses() if a.complete]
    assert progress.complete == len(complete) > 0
    assert progress.ranks_expected == p.snapshot().ranks_expected
    assert progress.ranks_seen == {r.rank for r in p.snapshot().ranks}
    assert progress.rejected == p.snapshot().rejected


def test_after_a_bye_the_rank_is_no_longer_awaited() -> None:
    frames = _rank_leaves(_job(ranks=3, iterations=8), rank=2, after=3)
    p = Pipeline(window=None)
    p.feed(frames)
    p.finish()
    assert [a.iteration for a in p.analyses() if a.complete] == list(range(8))
    assert [a.ranks for a in p.analyses()][3:5] == [(0, 1, 2), (0, 1)]


def test_missing_is_every_rank_below_the_world_that_had_not_said_bye() -> None:
    admission = Admission()
    for f in [_hello(0, 3), _hello(2, 3), RawFrame(0, wire.encode(wire.Bye(1, 2, 5, 0)))]:
        admission.admit(f)
    assert missing(admission, 4, {0}) == {1, 2}
    assert missing(admission, 5, {0}) == {1}  # rank 2 ran iterations 0..4
    assert missing(admission, 5, [0, 1]) == set()
    assert missing(Admission(), 0, ()) == set()  # no world size yet: nothing to wait for


def test_admission_lets_held_frames_through_after_the_hello_that_sizes_the_world() -> None:
    admission = Admission()
    assert admission.admit(_iteration(1, 0, 1)) == [] and len(admission.held) == 1
    through = admission.admit(_hello(0, 2))
    assert [type(x).__name__ for _, x in through] == ["Hello", "IterationBatch"] and admission.held == []
    assert admission.admit(_iteration(1, 0, 1)) == [] and admission.duplicates == 1
    assert admission.admit(_iteration(2, 0, 1)) == [] and admission.rejected == 1
    assert "not below the world size 2" in (admission.last_rejection or "")
