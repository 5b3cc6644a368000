"""Shared builders for the UI tests: a hand-made iteration whose critical path is known, a fake sampler, a loader.

Named test_ui_* so it belongs with the UI tests; it holds no tests itself.
"""

from __future__ import annotations

import re
from pathlib import Path

from textual.pilot import Pilot

from dagtop.io.telemetry import HostSample, TelemetrySample
from dagtop.model.change import Change
from dagtop.model.snapshot import Collective, IterationAnalysis, RankRow, Segment, Snapshot, Straggler, WhatIf
from dagtop.model.tasks import Task
from dagtop.ui.app import DagtopApp

MS = 1_000_000
FIXTURES = Path(__file__).resolve().parent.parent / "dagtop" / "fixtures"


def fixture(name: str) -> Path:
    """A recorded 2-rank CPU DDP demo: none, io, compute, allreduce or straggler1-io."""
    return FIXTURES / f"demo-{name}.dagtop"


def fake_telemetry() -> TelemetrySample:
    """The same sample every time, so screenshots do not depend on the machine."""
    return TelemetrySample(HostSample("node0", 42.0, 16, 12 * 2**30, 64 * 2**30, 1.5e6, 2e5, 3e6, 4e6), (),
                           "no NVIDIA GPU (NVML library not found)")


def task(rank: int, lane: str, category: str, phase: str, name: str, start_ms: float, end_ms: float) -> Task:
    return Task(rank, category, phase, name, lane, int(start_ms * MS), int(end_ms * MS))


def seg(rank: int | None, category: str, name: str, start_ms: float, end_ms: float) -> Segment:
    return Segment(rank, category, category, name, int(start_ms * MS), int(end_ms * MS))


def two_rank_iteration(iteration: int = 7) -> IterationAnalysis:
    """Rank 1 reads slowly (io 0–20 ms), so the one all-reduce waits for it: by hand the critical path is
    r1 io 0–20, r1 compute 20–40, the collective 40–60, r0's update 60–75 (75 ms: io 20, compute 35, all-reduce 20).
    Rank 0 is ready at 30 ms and waits 30–40 ms."""
    tasks = (
        task(0, "main", "io", "load", "next", 0, 10),
        task(0, "main", "compute", "backward", "net", 10, 30),
        task(0, "comm", "allreduce", "allreduce", "bucket 0", 30, 60),
        task(0, "main", "compute", "update", "step", 60, 75),
        task(1, "main", "io", "load", "next", 0, 20),
        task(1, "main", "compute", "backward", "net", 20, 40),
        task(1, "comm", "allreduce", "allreduce", "bucket 0", 40, 60),
        task(1, "main", "compute", "update", "step", 60, 70),
    )
    collective = Collective("bucket 0", 4_000_000, {0: 30 * MS, 1: 40 * MS}, 40 * MS, 60 * MS, gating_rank=1)
    path = (seg(1, "io", "next", 0, 20), seg(1, "compute", "net", 20, 40), seg(None, "allreduce", "bucket 0", 40, 60),
            seg(0, "compute", "step", 60, 75))
    shares = {"io": 20 / 75, "compute": 35 / 75, "allreduce": 20 / 75, "pcie": 0.0, "other": 0.0}
    rows = (RankRow(0, 75.0, 10.0, 0.0, 35.0, 30.0, 0.0, 2.5, False),
            RankRow(1, 70.0, 20.0, 0.0, 30.0, 20.0, 0.0, -2.5, True))
    what_if = (WhatIf(Change.IO_HIDDEN, 55.0, 75 / 55), WhatIf(Change.ALLREDUCE_DOUBLE, 95.0, 75 / 95))
    return IterationAnalysis(
        iteration=iteration, complete=True, ranks=(0, 1), origin_ns=0, measured_ms=75.0, predicted_ms=75.0,
        tasks=tasks, collectives=(collective,), critical_path=path, shares=shares, bottleneck="compute",
        straggler=Straggler(1, "io", 10.0), exposed_comm_ms=20.0, overlap_ratio=0.33, per_rank=rows,
        what_if=what_if)


def snapshot_of(*iterations: IterationAnalysis) -> Snapshot:
    return Snapshot(iterations=iterations, ranks=(), ranks_expected=2, iterations_per_s=13.3, dropped=0, rejected=0,
                    last_rejection=None, incomplete=0, received_ns=0)


async def wait_loaded(pilot: Pilot[int], app: DagtopApp, timeout_s: float = 60.0) -> None:
    """Wait until a replay has been read to its end and the screen shows it."""
    for _ in range(int(timeout_s / 0.05)):
        if app.shown.finished:
            break
        await pilot.pause(0.05)
    assert app.shown.finished, "the recording was not read to its end in time"
    await pilot.pause()


async def named_straggler(app: DagtopApp, pilot: Pilot[int]) -> dict[str, set[int]]:
    """The straggler as every part of the screen names it: the headline, the ranks table's ◀ and the rank picker's
    ``◀ straggler`` (each the set of ranks it names, empty for none). Leaves the picker closed."""
    from dagtop.ui.screens.rank_picker import RankPicker, rank_option
    from dagtop.ui.widgets.rank_table import RankTable
    from dagtop.ui.widgets.verdict import Verdict

    headline = str(app.query_one(Verdict).render().renderables[0])  # type: ignore[attr-defined]
    found = re.search(r"straggler rank (\d+)", headline)
    table = app.query_one(RankTable)
    marked = {r.rank for r in table.ordered(table.view) if r.straggler}  # the rows drawn with ◀
    await pilot.press("r")
    await pilot.pause()
    assert isinstance(app.screen, RankPicker)
    picked = {r.rank for r in app.screen.rows if "◀ straggler" in rank_option(r).plain}
    await pilot.press("escape")
    await pilot.pause()
    return {"headline": {int(found.group(1))} if found else set(), "table": marked, "picker": picked}
