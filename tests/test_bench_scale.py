"""benchmarks/bench_scale.py's own parts: the frames it replays, and how it reads the screen."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench_scale import encode_job, shown_iteration

from dagtop.model.pipeline import Pipeline
from dagtop.model.synthetic import SyntheticJob
from dagtop.recording import RawFrame
from instrument import wire


def test_each_rank_sends_its_hello_then_its_iterations_in_order() -> None:
    job = SyntheticJob(ranks=12, blocks=4)
    by_rank = encode_job(job, iterations=3)
    assert len(by_rank) == 12
    for r, frames in enumerate(by_rank):
        decoded = [wire.decode(f) for f in frames]
        assert [d.rank for d in decoded] == [r] * 4
        assert isinstance(decoded[0], wire.Hello) and decoded[0].host == f"node{r // 8}"
        assert [d.seq for d in decoded] == [0, 1, 2, 3]
        assert [d.iteration if isinstance(d, wire.IterationBatch) else None for d in decoded[1:]] == [0, 1, 2]


def test_the_replayed_frames_make_a_whole_job() -> None:
    job = SyntheticJob(ranks=12, blocks=4)
    pipeline = Pipeline(expected_ranks=12)
    by_rank = encode_job(job, iterations=3)
    for i in range(4):  # as the publishers send: every rank's hello, then iteration by iteration
        pipeline.feed([RawFrame(1, frames[i]) for frames in by_rank])
    pipeline.finish()
    snapshot = pipeline.snapshot()
    assert [a.iteration for a in snapshot.iterations] == [0, 1, 2]
    assert all(a.complete and len(a.ranks) == 12 for a in snapshot.iterations)
    assert snapshot.dropped == 0 and snapshot.rejected == 0


def test_the_shown_iteration_is_read_from_the_status_line() -> None:
    screen = " dagtop │ ranks 64/64 │ iteration 17 │ 1.0 it/s │ lag 0.87 s\n╭─ timeline · iteration 17 ·"
    assert shown_iteration(screen) == 17
    assert shown_iteration(" dagtop │ ranks 0/64 │ no iteration yet") is None
    assert shown_iteration("") is None
