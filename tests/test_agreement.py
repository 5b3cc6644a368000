"""One straggler, named alike by the headline, the ranks table's ◀, the rank picker, ``report`` and
``report --json``, on every bundled fixture (dagtop.model.straggler is their one rule)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from test_ui_helpers import fake_telemetry, named_straggler, wait_loaded

from dagtop.commands.cli import main
from dagtop.io.sources import RecordingSource
from dagtop.ui.app import make_app

FIXTURES = sorted((Path(__file__).parent.parent / "dagtop" / "fixtures").glob("*.dagtop"))


def screen_names(path: Path) -> dict[str, set[int]]:
    """What the screen names once a replay of ``path`` is read to its end."""
    app = make_app(RecordingSource(path, speed=0), sampler=fake_telemetry, source_label=f"replay {path.name}")
    said: dict[str, set[int]] = {}

    async def body() -> None:
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_loaded(pilot, app)
            await pilot.pause(1.1)  # the panels redraw at most once a second
            said.update(await named_straggler(app, pilot))

    asyncio.run(body())
    return said


def report_names(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[set[int], str]:
    capsys.readouterr()
    assert main(["report", str(path), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert main(["report", str(path)]) == 0
    return ({s["straggler"]["rank"]} if s["straggler"] else set()), capsys.readouterr().out


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_screen_picker_and_report_name_the_same_straggler(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    screen = screen_names(path)
    named, text = report_names(path, capsys)
    assert screen["headline"] == screen["table"] == screen["picker"] == named, (screen, named)
    line = next(x for x in text.splitlines() if x.startswith("straggler"))
    assert (f"rank {next(iter(named))}:" in line) if named else line.startswith("straggler        none")
    if "straggler1" in path.stem:  # the one fixture made with a slow rank: named, not only agreed on
        assert named == {1}
