"""One base for every what-if of a report: the steady iterations' median, the stalled one out.

A recording of a job that idles between its steps (untimed host work after the update, like a logging sleep) and
stalls once for 10 s: each iteration is measured from the previous one's end, whatever batch of frames it came in;
the stall is a stall, out of the shares and the medians; and every what-if is read against the same base, however
few of the iterations replayed it.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Sequence
from pathlib import Path

import pytest

from dagtop.commands.cli import main
from dagtop.io.recording import RecordingWriter
from dagtop.model.change import Change
from dagtop.model.frames import RawFrame
from dagtop.model.pipeline import Pipeline
from dagtop.model.summary import summarize
from dagtop.model.synthetic import SyntheticJob, synthetic_frames
from instrument import wire

JOB = SyntheticJob(ranks=2, io_ms=1.0, forward_ms=1.5, backward_ms=3.0, update_ms=0.5, bucket_bytes=1_000_000,
                   allreduce_ms_per_mb=0.5, jitter=0.1)
IDLE_MS = 20.0
"""Untimed host work after each update: in the step, on no task."""
STALL_AT, STALL_S = 30, 10.0


def reshaped(frames: Sequence[RawFrame], idle_ms: float = IDLE_MS, idle_from: int = 0, stall_at: int | None = STALL_AT,
             stall_s: float = STALL_S) -> list[RawFrame]:
    """The frames of a job that idles ``idle_ms`` after each update from iteration ``idle_from`` on, and whose rank
    1 sleeps ``stall_s`` in its loader at iteration ``stall_at`` while rank 0 waits in the all-reduces."""
    out = []
    for raw in frames:
        f = wire.decode(raw.payload)
        if not isinstance(f, wire.IterationBatch):
            out.append(raw)
            continue
        it = f.iteration
        before = int(max(it - idle_from, 0) * idle_ms * 1e6)  # the idling of the iterations before this one
        stall = int(stall_s * 1e9) if stall_at is not None and it >= stall_at else 0
        events = []
        for e in f.events:
            start, end = e.start_ns + before, e.end_ns + before
            if it == stall_at and f.rank == 1 and e.category == "io":
                end += stall
            elif it == stall_at and f.rank == 0 and e.category == "allreduce":
                end += stall  # issued on time, ended when rank 1 came
            elif it != stall_at or f.rank == 1 or e.phase == "update":
                start, end = start + stall, end + stall
            events.append(e._replace(start_ns=start, end_ns=end))
        out.append(RawFrame(raw.received_ns + before + stall, wire.encode_iteration(f.seq, f.rank, it, events, 0)))
    return sorted(out, key=lambda r: r.received_ns)


def recorded(tmp_path: Path, frames: Sequence[RawFrame]) -> Path:
    path = tmp_path / "stalled.dagtop"
    with RecordingWriter(path) as w:
        for f in frames:
            w.append(f)
    return path


def test_every_what_if_of_a_report_has_the_steady_median_for_base(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    plain = synthetic_frames(JOB, iterations=60, seed=1)
    path = recorded(tmp_path, reshaped(plain))
    assert main(["report", str(path), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert [x["iteration"] for x in s["stalls"]] == [STALL_AT] and s["stalled_iterations"] == 1
    # The step as the job ran it: its tasks, the gaps between them and its idling (the synthetic job without the
    # idling, analysed alone, plus the idling).
    alone = Pipeline(window=None)
    alone.feed(plain)
    alone.finish()
    truth = statistics.median(a.measured_ms for a in alone.analyses() if not a.in_warm_up) + IDLE_MS
    median = s["iteration_ms"]["median"]
    assert median == pytest.approx(truth, rel=0.05), "each iteration measured from the previous one's end"
    assert s["predicted_iteration_ms"] == pytest.approx(median, rel=0.05)
    predicted = [x for x in s["what_if"] if x["iteration_ms"] is not None]
    assert {x["change"] for x in predicted} >= {"2N workers", "network bandwidth", "all-reduce ×0.5"}
    for x in predicted:
        assert x["base_ms"] == pytest.approx(s["predicted_iteration_ms"]), x
        assert x["iteration_ms"] * x["speedup"] == pytest.approx(x["base_ms"]), x
        # No change to the job comes near the stall's 10 s, nor halves a step that is mostly idling.
        assert 0.5 * median < x["iteration_ms"] < 1.5 * median, x
        lo, hi = x.get("iteration_ms_bounds", (x["iteration_ms"], x["iteration_ms"]))
        assert lo <= x["iteration_ms"] <= hi, x
    # The collectives' shares of the path are of the steady iterations too: they add up to all-reduce's share.
    assert sum(c["critical_path"] for c in s["collectives"]) == pytest.approx(s["critical_path"]["allreduce"], rel=0.01)


def test_a_change_replayed_by_few_iterations_is_read_against_the_same_base() -> None:
    """A job that idles from iteration 20 on, and a change only the idling iterations replayed: its figure is the
    gain it replayed there, applied to the base of every other change (not the median of those iterations)."""
    p = Pipeline(window=None)
    p.feed(reshaped(synthetic_frames(JOB, iterations=40, seed=2), idle_ms=30.0, idle_from=20, stall_at=None))
    p.finish()
    analyses = [a if a.iteration >= 20 else
                dataclasses.replace(a, what_if=tuple(w for w in a.what_if if w.change is not Change.DOUBLE_WORKERS))
                for a in p.analyses() if not a.in_warm_up]
    s = summarize(analyses)
    w = {x["change"]: x for x in s["what_if"]}
    assert {x["base_ms"] for x in w.values() if x["iteration_ms"] is not None} == {s["predicted_iteration_ms"]}
    twice = w["2N workers"]
    late = [a for a in analyses if a.iteration >= 20]
    replayed = [x.iteration_ms for a in late for x in a.what_if if x.change is Change.DOUBLE_WORKERS]
    gain = statistics.median(a.predicted_ms for a in late) / statistics.median(replayed)
    assert twice["speedup"] == pytest.approx(gain)
    assert twice["iteration_ms"] == pytest.approx(s["predicted_iteration_ms"] / gain)
    assert twice["iterations"] == len(late)
