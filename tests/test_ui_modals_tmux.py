"""The modals and the rank focus in a real terminal (tmux): open ``?``, ``w`` and ``r`` on ``dagtop replay`` at 120x36
and 80x24 and read what they draw off the screen."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from test_ui_helpers import fixture

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")

SIZES = [(120, 36), (80, 24)]
DEADLINE_S = 60.0
"""How long to wait for anything to show: generous, the machine is shared and may be slow."""


class Terminal:
    """One dagtop in a tmux session on a private server (other tmux users, and their options, stay out)."""

    def __init__(self, columns: int, rows: int) -> None:
        self.socket = f"dagtop-modals-{uuid.uuid4().hex[:8]}"
        self.session = "dagtop"
        # COLUMNS/LINES (set by pytest and some shells) would override the pane size.
        command = "env -u COLUMNS -u LINES " + shlex.join(
            [sys.executable, "-m", "dagtop", "replay", str(fixture("straggler1-io")), "--speed", "0"])
        self.tmux("new-session", "-d", "-s", self.session, "-x", str(columns), "-y", str(rows),
                  f"{command}; echo DAGTOP-EXIT=$?; sleep 60")

    def tmux(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args], capture_output=True, text=True,
                              check=check)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", self.session).stdout

    def keys(self, *keys: str) -> None:
        for key in keys:
            self.tmux("send-keys", "-t", self.session, key)

    def wait_for(self, ready: Callable[[str], bool], what: str) -> str:
        """Poll the screen until ``ready`` holds for it, up to :data:`DEADLINE_S`."""
        deadline = time.monotonic() + DEADLINE_S
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if ready(screen):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"{what} never showed; the screen was:\n{screen}")

    def wait_for_words(self, *phrases: str) -> str:
        """Wait until every phrase shows, whatever line breaks and borders wrapping put inside it."""
        return self.wait_for(lambda s: all(p in words(s) for p in phrases), repr(phrases))

    def quit(self) -> None:
        """q on the main screen ends dagtop cleanly."""
        self.keys("q")
        assert "DAGTOP-EXIT=0" in self.wait_for(lambda s: "DAGTOP-EXIT=" in s, "dagtop's exit")

    def close(self) -> None:
        self.tmux("kill-server", check=False)


def words(text: str) -> str:
    """Text with box borders, bars and the line breaks and indents of wrapping reduced to single spaces."""
    return " ".join(re.sub(r"[│╭╮╰╯─▁▂▃▄▅▆▇█]", " ", text).split())


@pytest.fixture(params=SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def terminal(request: pytest.FixtureRequest) -> Iterator[Terminal]:
    term = Terminal(*request.param)
    try:
        term.wait_for(lambda s: re.search(r"\bit(?:eration)? 29\b", s) is not None and "r0 main" in s,
                      "the recording's last iteration")
        yield term
    finally:
        term.close()


def test_question_mark_shows_keys_and_panels_and_w_shows_each_change_in_tmux(terminal: Terminal) -> None:
    terminal.keys("?")
    terminal.wait_for_words("dagtop: what holds each iteration of your job back", "Keys",
                            "r focus a rank: its rows first and highlighted", "Panels", "status source, ranks")
    terminal.keys("End")  # 80x24 scrolls to the rest; 120x36 shows it all already
    terminal.wait_for_words("Colours ■ io ■ pcie ■ compute ■ all-reduce ■ other", "Press escape or ? to close.")
    terminal.keys("Escape")
    terminal.wait_for(lambda s: "Keys" not in s and "r0 main" in s, "the main screen again")

    terminal.keys("w")
    terminal.wait_for_words("what if… iteration 29", "change ms/it throughput", "I/O hidden",
                            "straggler at median", "ms/it the iteration time the model predicts with the change")
    terminal.keys("End")
    terminal.wait_for_words("Every other task keeps its measured duration", "Press escape or w to close.")
    terminal.keys("Escape")
    terminal.wait_for(lambda s: "what if… iteration" not in s and "r0 main" in s, "the main screen again")
    terminal.quit()


def _order(screen: str) -> tuple[list[str], list[int]]:
    """The timeline's rank labels and the ranks table's rank numbers, top to bottom."""
    lanes = re.findall(r"^[│ ]*(r\d+) (?:main|comm)", screen, flags=re.MULTILINE)
    ranks = [int(r) for r in re.findall(r"^[│ ]*(?:◀ )?(\d+) +\d+(?:\.\d)? ", screen, flags=re.MULTILINE)]
    return lanes, ranks


def test_a_rank_picked_with_r_comes_first_in_tmux(terminal: Terminal) -> None:
    lanes, ranks = _order(terminal.screen())
    assert lanes[0] == "r0" and ranks == [0, 1], terminal.screen()
    terminal.keys("r")
    terminal.wait_for_words("Focus a rank", "all ranks (no focus)", "rank 1")
    terminal.keys("Down", "Down", "Enter")  # options: all ranks, rank 0, rank 1

    def rank_1_first(screen: str) -> bool:
        lanes, ranks = _order(screen)
        return "Focus a rank" not in screen and lanes[:2] == ["r1", "r1"] and "r0" in lanes and ranks == [1, 0]

    terminal.wait_for(rank_1_first, "rank 1's rows first")
    terminal.quit()


def test_every_line_keeps_its_end_in_tmux(terminal: Terminal) -> None:
    """Issue #30: the status line keeps its counts (words shorten first) and, at 120x36 even while paused, its
    last word; the verdict keeps the iteration's own part; the what-if panel says how many rows it hides; the
    rank picker's rows stay one line, ``◀ straggler`` included."""
    columns = int(terminal.tmux("display-message", "-p", "#{window_width}").stdout)
    screen = terminal.wait_for(lambda s: "×1.00" in s, "the what-if rows")
    status, verdict = screen.splitlines()[:2]
    assert re.search(r"(dropped|drop) 0 · (rejected|rej) 0", status) and not status.rstrip().endswith("…"), screen
    assert re.search(r"│ it 29: io \d+ %", verdict), screen
    assert screen.rstrip().splitlines()[-1].rstrip().endswith("? Help"), screen  # every key in the footer
    row = re.compile(r"\d+\.\d +≥?×\d\.\d\d")  # a what-if row: ms/it, then throughput (the ranks table has no ×)
    shown = len(row.findall(screen))
    more = re.search(r"\+(\d+) more · w", screen)
    terminal.keys("w")
    details = terminal.wait_for_words("what if… iteration 29", "change ms/it")
    terminal.keys("Escape")
    terminal.wait_for(lambda s: "what if… iteration" not in s, "the main screen again")
    rows = len(row.findall(details))  # the w screen's table, every row: "now" and each change
    assert rows >= 7 and shown + (int(more.group(1)) if more else 0) == rows, (screen, details)
    if columns < 120:
        assert more, screen
    terminal.keys("p")
    paused = terminal.wait_for(lambda s: "PAUSED" in s, "the pause")
    status = paused.splitlines()[0].rstrip()
    if columns >= 120:
        assert status.endswith("demo-straggler1-io.dagtop"), paused
    assert re.search(r"(dropped|drop) 0 · (rejected|rej) 0", status), paused
    terminal.keys("r")
    picker = terminal.wait_for_words("Focus a rank", "all ranks (no focus)", "rank 1")
    rows = [line for line in picker.splitlines() if re.search(r"▊ rank [01] ", line)]
    assert len(rows) == 2 and "◀ straggler" in next(r for r in rows if "rank 1 " in r), picker
    assert not any(re.fullmatch(r"[│▊▎ ]*◀ straggler[│▊▎ ]*", line.split("│", 1)[-1].strip()) for line in
                   picker.splitlines()), picker
    terminal.keys("Escape")
    terminal.wait_for(lambda s: "Focus a rank" not in s, "the main screen again")
    terminal.keys("p")
    terminal.quit()
