"""Several ranks and no collective timed (no DDP around the model): dagtop says it saw no communication, rather
than "0 ms exposed, 100 % hidden", and attach warns when it starts."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import pytest
import torch
from test_ui_helpers import two_rank_iteration

import instrument
from dagtop.commands.cli import main
from dagtop.io.recording import RecordingWriter
from dagtop.model.frames import RawFrame
from dagtop.model.synthetic import SyntheticJob, synthetic_frames
from dagtop.ui.renderables.verdict import headline
from instrument import wire


def _without_collectives(frames: list[RawFrame]) -> list[RawFrame]:
    out = []
    for raw in frames:
        frame = wire.decode(raw.payload)
        if isinstance(frame, wire.IterationBatch):
            events = [e for e in frame.events if e.lane != "comm"]
            raw = RawFrame(raw.received_ns, wire.encode(dataclasses.replace(frame, events=events)))
        out.append(raw)
    return out


def _report(tmp_path: Path, frames: list[RawFrame], capsys: pytest.CaptureFixture[str]) -> tuple[dict, str]:  # type: ignore[type-arg]
    path = tmp_path / "run.dagtop"
    with RecordingWriter(path) as writer:
        for raw in frames:
            writer.append(raw)
    assert main(["report", str(path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert main(["report", str(path)]) == 0
    return summary, capsys.readouterr().out


def test_report_says_no_communication_was_seen(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    frames = synthetic_frames(SyntheticJob(ranks=2), iterations=6)
    seen, text = _report(tmp_path, frames, capsys)
    assert seen["communication_seen"] is True and "ms exposed per iteration" in text

    blind, text = _report(tmp_path, _without_collectives(frames), capsys)
    assert blind["ranks"] == 2 and blind["communication_seen"] is False
    assert "communication    none seen: no collective was timed" in text and "hidden under compute" not in text
    # No change to communication is offered on nothing: it would read ×1.00, a claim the data cannot make.
    assert {w["change"] for w in seen["what_if"]} >= {"all-reduce ×0.5", "perfect overlap", "2N workers"}
    assert {w["change"] for w in blind["what_if"]} == {"I/O hidden"} and "all-reduce ×" not in text


def test_headline_says_no_communication_was_seen() -> None:
    a = two_rank_iteration()
    assert a.collectives and "exposed" in headline(None, a).plain
    blind = dataclasses.replace(a, collectives=())
    assert "no comm seen" in headline(None, blind).plain and "exposed" not in headline(None, blind).plain
    alone = dataclasses.replace(blind, ranks=(0,))  # one rank: nothing to communicate, nothing missed
    assert "exposed" in headline(None, alone).plain


def _attach(world: str, monkeypatch: pytest.MonkeyPatch) -> list[warnings.WarningMessage]:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", world)
    monkeypatch.setenv("DAGTOP_TELEMETRY", "0")
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tracer = instrument.attach(model, optimizer, endpoint="tcp://127.0.0.1:1")
    tracer.close()
    return [w for w in caught if "dagtop" in str(w.message)]


def test_attach_warns_when_several_ranks_have_no_ddp(monkeypatch: pytest.MonkeyPatch) -> None:
    [warning] = _attach("2", monkeypatch)
    assert warning.category is RuntimeWarning and "no collective is timed" in str(warning.message)
    assert warning.filename == __file__  # pointed at the attach call, not inside the shim
    assert _attach("1", monkeypatch) == []
