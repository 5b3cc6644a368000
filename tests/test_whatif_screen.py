"""The what-if details say what the interference fit found and which predictions are of lower confidence."""

from __future__ import annotations

import random
import re

from rich.console import Console

from dagtop.model.analysis import analyse
from dagtop.model.change import Change
from dagtop.model.dag import assemble
from dagtop.model.interference import InterferenceFit
from dagtop.model.snapshot import AlphaBeta, IterationAnalysis
from dagtop.ui.renderables.what_if import what_if_table
from dagtop.ui.screens.what_if import WhatIfDetails
from tests.test_whatif_interference import iteration


def rendered(renderable: object, width: int = 120) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def analysed(fitted: bool) -> IterationAnalysis:
    rng = random.Random(5)
    fit = InterferenceFit()
    for _ in range(20 if fitted else 0):
        events = iteration(rng, 0.4)
        fit.add(assemble(events, {}, {r: 0 for r in events}))
    events = iteration(rng, 0.4)
    return analyse(50, events, {}, {r: 0 for r in events}, interference=fit)


def test_details_show_the_fit_the_decomposition_and_the_doubts() -> None:
    text = rendered(WhatIfDetails(analysed(fitted=True)))
    found = re.search(r"interference: main: compute ×([0-9.]+) ± ([0-9.]+)", text)
    assert found is not None
    assert abs(float(found[1]) - 1.4) < 0.05 and float(found[2]) < 0.05
    assert "t_f " in text and "t_b " in text and "t_c " in text and "t_u " in text
    assert "Lower confidence" in text
    assert f"{Change.ALLREDUCE_DOUBLE} {Change.ALLREDUCE_DOUBLE.doubt[:30]}" in " ".join(text.split())


def test_details_give_the_network_fit_and_the_scaling_within_its_uncertainty() -> None:
    rng = random.Random(5)
    events = iteration(rng, 0.4)
    assert len(events) > 1
    a = analyse(50, events, {}, {r: 0 for r in events}, comm=AlphaBeta(0.0, 1e-9, 5e-11, 40, 3))
    text = " ".join(rendered(WhatIfDetails(a)).split())
    assert "network: bus bandwidth 1 GB/s (0.952–1.05 at ±1 s.e.), latency α 0 µs; fitted on 40 collectives, 3 " \
           "transfer sizes" in text
    scaling = re.search(r"2N workers throughput ×([0-9.]+), ×([0-9.]+) to ×([0-9.]+) with β ± 1 s.e.", text)
    assert scaling is not None and float(scaling[2]) <= float(scaling[1]) <= float(scaling[3])
    assert re.search(r"network 2 GB/s throughput ×[0-9.]+, ×[0-9.]+ to ×[0-9.]+", text)
    table = rendered(what_if_table(a, 100))
    assert "network 2 GB/s " in table and "network 2 GB/s ?" not in table  # validated (validate_network.py)


def test_details_without_a_fit_say_so() -> None:
    text = rendered(WhatIfDetails(analysed(fitted=False)))
    assert "interference: not fitted yet" in " ".join(text.split())


def test_table_marks_only_the_doubtful_changes() -> None:
    a = analysed(fitted=True)
    lines = rendered(what_if_table(a, 100)).splitlines()
    for w in a.what_if:
        line = next(line for line in lines if w.label in line)
        assert (f"{w.label} ?" in line) == bool(w.change.doubt)
    assert any(not w.change.doubt for w in a.what_if)  # some changes were validated and carry no mark


def test_a_narrow_table_shortens_names_but_keeps_the_marks_and_the_figures() -> None:
    """At 80 columns the panel is about 40 wide: ``straggler at median ?`` lost its ``?`` to an ellipsis, and the
    throughput's header and figures were cut (``×1.`` for ``×1.98``)."""
    a = analysed(fitted=True)
    for width in range(30, 61):
        lines = rendered(what_if_table(a, width), width).splitlines()
        assert all(len(line) <= width for line in lines)
        for w in a.what_if:
            row = next(line for line in lines if f"{w.iteration_ms:.1f}" in line and line.startswith(w.label[:6]))
            assert row.rstrip().endswith(f"×{w.throughput:.2f}") or f"×{w.throughput:.2f} " in row
            assert (" ?" in row) == bool(w.change.doubt), (width, row)
