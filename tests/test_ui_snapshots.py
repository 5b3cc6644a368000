"""SVG snapshots of the screen from recorded fixtures (replay at full speed, as ``dagtop replay`` draws it: no
telemetry of this machine; nothing depends on the clock or the machine). Regenerate with ``pytest
tests/test_ui_snapshots.py --snapshot-update`` and look at them."""

from __future__ import annotations

from typing import Any

from test_ui_helpers import fixture, wait_loaded
from textual.pilot import Pilot

from dagtop.io.sources import RecordingSource
from dagtop.ui.app import DagtopApp, make_app


def replay(name: str) -> DagtopApp:
    return make_app(RecordingSource(fixture(name), speed=0), source_label=f"replay demo-{name}.dagtop")


def loaded(app: DagtopApp) -> Any:
    async def run_before(pilot: Pilot[int]) -> None:
        await wait_loaded(pilot, app)

    return run_before


def test_straggler_120x36(snap_compare: Any) -> None:
    app = replay("straggler1-io")
    assert snap_compare(app, terminal_size=(120, 36), run_before=loaded(app))


def test_straggler_80x24(snap_compare: Any) -> None:
    app = replay("straggler1-io")
    assert snap_compare(app, terminal_size=(80, 24), run_before=loaded(app))


def test_allreduce_paused_two_back_rank_0_focused_120x36(snap_compare: Any) -> None:
    app = replay("allreduce")
    assert snap_compare(app, terminal_size=(120, 36), run_before=loaded(app),
                        press=["left", "left", "r", "down", "enter"])


def test_straggler_paused_rank_picker_80x24(snap_compare: Any) -> None:
    """24 rows: the status line keeps its counts, the what-if panel says how many rows it hides, and the picker's
    rows stay one line each, ``◀ straggler`` included (issue #30)."""
    app = replay("straggler1-io")
    assert snap_compare(app, terminal_size=(80, 24), run_before=loaded(app), press=["p", "r"])
