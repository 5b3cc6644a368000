"""The drawing functions, on a hand-made iteration whose critical path is known: no App needed."""

from __future__ import annotations

import dataclasses

import pytest
from rich.console import Console
from rich.style import Style
from test_ui_helpers import snapshot_of, two_rank_iteration

from dagtop.io.telemetry import GpuSample, TelemetrySample
from dagtop.model.change import Change
from dagtop.model.liveness_view import LivenessView
from dagtop.model.pipeline import Pipeline
from dagtop.model.snapshot import RankRow, SteadyStraggler, SteadyVerdict, Straggler, WhatIf
from dagtop.model.synthetic import SyntheticJob, synthetic_frames
from dagtop.ui.palette import CATEGORY_COLOURS, colour, legend
from dagtop.ui.renderables.history import history_lines
from dagtop.ui.renderables.rank_table import rank_table, visible_rows
from dagtop.ui.renderables.status import status_text
from dagtop.ui.renderables.telemetry import telemetry_text
from dagtop.ui.renderables.timeline import LABEL_WIDTH, TimelineChart, timeline_rows
from dagtop.ui.renderables.verdict import critical_path_bar, headline
from dagtop.ui.renderables.what_if import what_if_table
from instrument.events import CATEGORIES


def plain(renderable: object, width: int = 100) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_palette_covers_every_model_category_with_distinct_colours() -> None:
    assert set(CATEGORIES) <= set(CATEGORY_COLOURS)
    assert len(set(CATEGORY_COLOURS.values())) == len(CATEGORY_COLOURS)
    assert "all-reduce" in legend().plain and "io" in legend().plain


def test_headline_says_the_window_first_then_the_iteration_on_screen() -> None:
    a = dataclasses.replace(two_rank_iteration(), iteration=55, bottleneck="allreduce",
                            shares={"allreduce": 0.46, "compute": 0.54}, exposed_comm_ms=38.2,
                            straggler=Straggler(3, "io", 21.3, 19.6))
    steady = SteadyVerdict(20, "compute", 0.52, SteadyStraggler(3, "io", 19, 20.4, (17.2, 24.9), 21.0, 20, 1e-5))
    # As wide as it comes: the excess's 95 % interval; the iteration's own late rank is not a second straggler.
    assert headline(steady, a).plain == (
        "compute on the critical path 52 % (last 20) · straggler rank 3 (io +20 ms [17, 25]) │ it 55: all-reduce "
        "46 % · exposed 38 ms")
    # Narrower: words shorten before the figures go, and the iteration's own share stays (issue #30).
    assert headline(steady, a, 118).plain == (
        "compute 52 % of path (last 20) · straggler rank 3 (io +20 ms [17, 25]) │ it 55: all-reduce 46 % · "
        "exposed 38 ms")
    assert headline(steady, a, 78).plain == ("compute 52 % (last 20) · straggler rank 3 (io +20 ms) │ it 55: "
                                             "all-reduce 46 %")
    for width in range(60, 150):
        assert headline(steady, a, width).cell_len <= width
    quiet = dataclasses.replace(steady, straggler=None)
    assert "(last 20) · no straggler │ it 55" in headline(quiet, a).plain
    tie = dataclasses.replace(quiet, tied_with="allreduce", tied_share=0.45)
    assert headline(tie, a, 118).plain.startswith("compute ≈ all-reduce (52 % / 45 %, last 20) · no straggler │ it 55")
    assert headline(tie, a, 78).plain.startswith("compute ≈ all-reduce (52 % / 45 %) · no straggler │")
    # No verdict before the window has enough iterations past warm-up: what it waits for, and the iteration.
    gathering = SteadyVerdict(3, "", 0.0, None)
    assert headline(gathering, a, 118).plain == ("gathering: 3 of 10 iterations past warm-up │ it 55: all-reduce 46 % "
                                                 "· exposed 38 ms")
    assert headline(None, a, 78).plain.startswith("gathering: 0 of 10 iterations │ it 55")
    assert "straggler" not in headline(None, a, 118).plain
    assert headline(steady, dataclasses.replace(a, complete=False)).plain.startswith("incomplete")
    assert "stalled (left out of the verdict)" in headline(steady, dataclasses.replace(a, stalled=True)).plain


def test_critical_path_bar_is_proportional_and_coloured_by_category() -> None:
    bar = critical_path_bar(two_rank_iteration(), 15)  # io 20, compute 20, all-reduce 20, compute 15 of 75 ms
    assert len(bar.plain) == 15
    colours = [bar.get_style_at_offset(Console(), i).color.name for i in range(15)]  # type: ignore[union-attr]
    assert colours == [colour("io")] * 4 + [colour("compute")] * 4 + [colour("allreduce")] * 4 + [colour("compute")] * 3


def _row(rows: list, label: str) -> str:  # type: ignore[type-arg]
    return next(r.cells.plain for r in rows if r.label == label)


def test_timeline_marks_the_critical_path_waits_and_collectives_where_they_happen() -> None:
    rows = timeline_rows(two_rank_iteration(), LABEL_WIDTH + 75, 20)  # one cell per ms
    labels = [r.label for r in rows]
    assert labels == ["", "r0 main", "r0 comm", "r1 main", "r1 comm", "⇄ all", "critical"]
    r1_main = _row(rows, "r1 main")
    assert r1_main[:40] == "█" * 40  # io and compute of the straggler are on the path
    assert r1_main[60:70] == "▒" * 10  # its update is not
    r0_main = _row(rows, "r0 main")
    assert r0_main[:30] == "▒" * 30 and r0_main[60:75] == "█" * 15
    r0_comm = _row(rows, "r0 comm")
    assert r0_comm[30:40] == "·" * 10  # waiting for rank 1
    assert r0_comm[40:60] == "█" * 20  # the collective, on the path, on every rank
    assert _row(rows, "⇄ all")[40:60] == "━" * 20
    critical = _row(rows, "critical")
    assert critical.startswith("r1") and critical[40:43] == "all" and critical[60:62] == "r0"
    style = rows[3].cells.get_style_at_offset(Console(), 0)
    assert isinstance(style, Style) and style.color is not None and style.color.name == colour("io")


def test_timeline_fits_64_ranks_in_a_few_rows_keeping_focus_and_straggler() -> None:
    frames = synthetic_frames(SyntheticJob(ranks=64, slow_ranks=(37,), slow_factor=6.0), iterations=3)
    pipeline = Pipeline()
    pipeline.feed(frames)
    a = pipeline.snapshot().latest
    assert a is not None and a.straggler is not None and a.straggler.rank == 37
    rows = timeline_rows(a, 120, 12, focus_rank=50)
    assert len(rows) == 12
    labels = [r.label for r in rows]
    assert "r37" in labels and "r50" in labels  # one row per rank: lanes overlaid
    assert any("more ranks" in r.cells.plain for r in rows)
    text = plain(TimelineChart(a, 12, focus_rank=50), width=120)
    assert len(text.splitlines()) == 12 and max(len(line) for line in text.splitlines()) <= 120


def test_history_stacks_each_bar_by_its_critical_path_in_proportion() -> None:
    base = two_rank_iteration()
    half = dataclasses.replace(base, iteration=8, measured_ms=37.5)
    lines = history_lines([base, half], width=7 + 10, height=9, selected=8)  # 8 rows of plot, 1 axis
    columns = [line.plain[7:] for line in lines[:-1]]
    full_bar = [row[-6] for row in columns]  # the first iteration's bar (3 cells wide, right-aligned)
    half_bar = [row[-1] for row in columns]
    assert full_bar == ["█"] * 8 and half_bar == [" "] * 4 + ["█"] * 4
    # Bottom up: io (20/75 of 8 rows ≈ 2.1), compute, all-reduce.
    bottom = lines[-2]
    assert bottom.get_style_at_offset(Console(), len(bottom.plain) - 6).color.name == colour("io")  # type: ignore[union-attr]
    marked = history_lines([base, half], width=7 + 10, height=9, selected=7)[-1].plain
    assert "▲7" in marked  # the iteration the other panels show, when it is not the newest


def test_rank_table_marks_the_straggler_and_puts_the_slowest_first_when_short_of_rows() -> None:
    text = plain(rank_table(two_rank_iteration(), height=10, width=80))
    straggler_line = next(line for line in text.splitlines() if line.strip().startswith("◀ 1 "))
    assert "-2.5" in straggler_line
    assert not any("◀" in line for line in text.splitlines() if line.strip().startswith("0 "))
    rows = [RankRow(r, 100.0 + r, 0, 0, 0, 0, 0, float(r), r == 3) for r in range(10)]
    shown, slowest_first = visible_rows(rows, 4, focus_rank=0)
    assert slowest_first and [r.rank for r in shown] == [0, 3, 9, 8]


def test_what_if_lists_best_change_first() -> None:
    text = plain(what_if_table(two_rank_iteration(), 80))
    lines = [line for line in text.splitlines() if "×" in line]
    assert lines[0].lstrip().startswith("now") and "I/O hidden" in lines[1] and "×1.36" in lines[1]


def test_telemetry_says_cleanly_there_is_no_gpu_or_shows_each_gpu() -> None:
    assert "no NVIDIA GPU" in telemetry_text(TelemetrySample(None, (), "no NVIDIA GPU (NVML library not found)")).plain
    gpu = GpuSample(0, "H100", 87.0, 30 * 2**30, 80 * 2**30, 1.2e9, 3.4e9, 250.0, 1980, 2619)
    text = telemetry_text(TelemetrySample(None, (gpu,), None)).plain
    assert "GPU0 87% 30/80G 250W 1980MHz H100" in text and "pcie tx 1.2 GB/s rx 3.4 GB/s" in text
    assert all(len(line) <= 36 for line in text.splitlines())  # the panel's width at 120 x 36


def test_status_line_counts_ranks_iterations_and_losses() -> None:
    snap = dataclasses.replace(snapshot_of(two_rank_iteration(6), two_rank_iteration(7)), dropped=3, rejected=1)
    text = status_text(snap, source="live tcp://x:1", live=True, lag_s=0.25, paused=True, shown_iteration=6).plain
    assert "iteration 6 of 7" in text and "lag 0.25 s" in text and "dropped 3" in text and "rejected 1" in text
    assert "PAUSED" in text
    replay = status_text(snap, source="replay f", live=False, lag_s=None, paused=False, shown_iteration=7).plain
    assert "lag" not in replay and "iteration 7" in replay


def test_a_stalled_job_reads_as_stalled_not_at_its_last_rate() -> None:
    running = snapshot_of(two_rank_iteration(6), two_rank_iteration(7))
    assert running.iterations_per_s > 0
    stalled = dataclasses.replace(running, liveness=LivenessView(stalled_s=14.2, silent=((1, 14.2, "backward x"),)))
    said = status_text(stalled, source="live tcp://x:1", live=True, lag_s=0.1, paused=False, shown_iteration=7).plain
    assert "0 it/s · stalled 14 s" in said and f"{running.iterations_per_s:.1f} it/s" not in said


def test_two_n_workers_reads_as_throughput_and_scaling_efficiency_not_a_slowdown() -> None:
    """Weak scaling: 270 ms/it now, 350 ms/it on twice the ranks is ×1.54 the samples per second at 77 %."""
    a = dataclasses.replace(two_rank_iteration(), predicted_ms=270.0,
                            what_if=(WhatIf(Change.DOUBLE_WORKERS, 350.0, 270 / 350),
                                     WhatIf(Change.ALLREDUCE_DOUBLE, 300.0, 270 / 300)))
    row = next(line for line in plain(what_if_table(a, 80)).splitlines() if "2N workers" in line)
    assert "350.0" in row and "×1.54 (77 %)" in row
    assert a.what_if[0].throughput == pytest.approx(2 * 270 / 350)
    lines = [line for line in plain(what_if_table(a, 80)).splitlines() if "×" in line]
    assert "2N workers" in lines[1]  # ranked by throughput, above the change that keeps the ranks
