"""The main screen's keys, declared once: the app binds them, the footer shows them, the help lists them."""

from __future__ import annotations

from textual.binding import Binding

SCREEN_KEYS: tuple[Binding, ...] = (
    Binding("q", "quit", "Quit", tooltip="quit"),
    Binding("p,space", "toggle_pause", "Pause", key_display="p",
            tooltip="pause / resume the screen (collecting goes on)"),
    Binding("left", "step(-1)", "Prev it", tooltip="previous iteration (pauses the screen first)"),
    Binding("right", "step(1)", "Next it", tooltip="next iteration, while paused"),
    Binding("r", "pick_rank", "Rank", tooltip="focus a rank: its rows first and highlighted"),
    Binding("w", "what_if", "What-if", tooltip="what-if details: each change and what it means"),
    Binding("a", "advice", "Advice", tooltip="advice: the changes to make, ranked by predicted gain; fix vs buy"),
    Binding("s", "sort_ranks", "Sort",
            tooltip="sort the ranks table by the next column; ↑ ↓ PgUp PgDn Home End scroll it"),
    Binding("question_mark", "help", "Help", tooltip="this help"),
)
"""A binding's description is its label in the footer; its tooltip is its line in the help (and the footer's hover
text), which names every key of it as Textual writes keys (``p, space``, ``?``). A modal screen binds, and tells, its
own keys."""

RANK_SCROLL_KEYS: tuple[Binding, ...] = (
    Binding("up", "scroll_ranks(-1)", show=False),
    Binding("down", "scroll_ranks(1)", show=False),
    Binding("pageup", "scroll_ranks(-1, True)", show=False),
    Binding("pagedown", "scroll_ranks(1, True)", show=False),
    Binding("home", "scroll_ranks(-1000000000)", show=False),
    Binding("end", "scroll_ranks(1000000000)", show=False),
)
"""Scrolling the ranks table: told in the help under ``s``."""
