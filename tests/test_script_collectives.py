"""Collectives the training script calls itself, beside DDP (instrument/collectives.py): each timed as a collective
named by op, matched across ranks in the DAG, never DDP's own twice; the training bit-identical."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from ranks import complete, report, run_job

from dagtop.model.frames import RawFrame
from instrument import wire
from instrument.events import SCRIPT

pytestmark = pytest.mark.slow

EXPECTED = Counter(f"{op}{SCRIPT}" for op in ("all_reduce", "all_gather_into_tensor", "broadcast", "barrier")) + \
    Counter([f"all_reduce{SCRIPT} #2"])
"""One iteration's: the calls after a step land in the iteration that the next loader wait opens."""


def _without_script(frames: list[RawFrame]) -> list[RawFrame]:
    out = []
    for raw in frames:
        frame = wire.decode(raw.payload)
        if isinstance(frame, wire.IterationBatch):
            kept = [e for e in frame.events if SCRIPT not in e.name]
            raw = RawFrame(raw.received_ns, wire.encode(dataclasses.replace(frame, events=kept)))
        out.append(raw)
    return out


def test_hand_written_collectives_are_timed_as_collectives_and_change_nothing(
        collector: Any, endpoint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain = run_job("script_collectives.py")
    assert plain.ok, plain.log
    timed = run_job("script_collectives.py", endpoint=endpoint)
    assert timed.ok, timed.log
    assert timed.losses == plain.losses and len(plain.losses[0]) == 24  # bit-identical, every rank
    frames = collector.until_bye(2)
    iterations = complete(frames)
    assert sorted(iterations) == list(range(12))
    for it, ranks in iterations.items():
        for rank, batch in ranks.items():
            script = Counter(e.name for e in batch.events if SCRIPT in e.name)
            assert script == (EXPECTED if it else Counter()), (it, rank, script)
            assert all(e.lane == "comm" and e.category == "allreduce" and e.end_ns >= e.start_ns
                       for e in batch.events if SCRIPT in e.name)
            sizes = {e.name: e.bytes for e in batch.events if SCRIPT in e.name}
            if it:
                assert sizes[f"all_reduce{SCRIPT} #2"] == 256 * 4 and sizes[f"barrier{SCRIPT}"] == 0
            # DDP's own collectives are still its buckets, once each.
            buckets = [e.name for e in batch.events if e.name.startswith("bucket ")]
            assert buckets and len(buckets) == len(set(buckets))
    summary = report(frames, tmp_path, capsys)
    named = {c["name"]: c for c in summary["collectives"]}
    assert {name for name in EXPECTED} <= set(named)
    assert all(named[name]["iterations"] == 11 for name in EXPECTED)
    # Their time was the job's "other" before: without them the untimed share is larger by what they took.
    blind = report(_without_script(frames), tmp_path, capsys)
    assert summary["critical_path"]["other"] < blind["critical_path"]["other"]
    assert summary["critical_path"]["allreduce"] > blind["critical_path"]["allreduce"]
