"""The live screen's status line counts the connections ``--auth`` refused, as the source counts them."""

from __future__ import annotations

import asyncio
import time

from test_ui_helpers import fake_telemetry

from dagtop.io.sources import FrameSource
from dagtop.model.frames import RawFrame
from dagtop.ui.app import make_app
from dagtop.ui.widgets.status_bar import StatusBar


class RefusingSource(FrameSource):
    """A live source that sends nothing and has refused some handshakes."""

    live = True
    endpoint = "tcp://127.0.0.1:0"

    def poll(self, timeout_s: float, max_frames: int = 10_000) -> list[RawFrame]:
        time.sleep(min(timeout_s, 0.01))
        return []

    @property
    def finished(self) -> bool:
        return False


def test_the_status_line_shows_refused_handshakes_once_there_are_any() -> None:
    source = RefusingSource()
    app = make_app(source, sampler=fake_telemetry, source_label="live tcp://127.0.0.1:0")
    lines: list[str] = []

    async def main() -> None:
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.pause(0.2)
            lines.append(str(app.query_one(StatusBar).render()))
            source.refused = 3
            for _ in range(600):
                line = str(app.query_one(StatusBar).render())
                if "refused" in line:
                    break
                await pilot.pause(0.05)
            lines.append(line)
            await pilot.press("q")

    asyncio.run(main())
    assert "refused" not in lines[0]
    assert "rejected 0 · refused 3" in lines[1], lines[1]
