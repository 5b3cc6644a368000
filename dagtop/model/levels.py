"""The iteration DAG's nodes by level (longest hop count from a source), and its edges in per-level batches: what
lets the replay sweep the DAG a level at a time on whole columns (dagtop/model/dag.py, replay.py)."""

from __future__ import annotations

import numpy as np

from dagtop.model.table import F64, I64, run_starts


def levels(n: int, src: I64, dst: I64) -> I64:
    """Longest hop count from a source for every node (raises on a cycle, which well-formed input never makes)."""
    level = np.zeros(n, dtype=np.int64)
    if not len(src):
        return level
    order = np.argsort(dst, kind="stable")
    s, d = src[order], dst[order]
    starts = np.flatnonzero(run_starts(d))
    targets = d[starts]
    for _ in range(n + 1):
        new = np.maximum.reduceat(level[s] + 1, starts)
        if np.array_equal(new, level[targets]):
            return level
        level[targets] = new
    raise ValueError("the iteration's dependencies form a cycle")


def level_plan(level: I64, src: I64, dst: I64, lat: F64) -> list[tuple[I64, I64, I64, F64]]:
    """Group the (level, dst)-sorted edges into per-level batches for the vectorized replay."""
    plan: list[tuple[I64, I64, I64, F64]] = []
    if not len(dst):
        return plan
    lv = level[dst]
    bounds = np.append(np.flatnonzero(run_starts(lv)), len(lv))
    for i in range(len(bounds) - 1):
        e0, e1 = bounds[i], bounds[i + 1]
        d = dst[e0:e1]
        first = np.flatnonzero(run_starts(d))
        plan.append((d[first], src[e0:e1], first, lat[e0:e1]))
    return plan
