"""Where FSDP's collectives gate a rank's compute in the iteration's DAG (dagtop/model/dag.py): the rank's compute
lane is cut where it resumes after a collective it waited for, the idle wait left out of the lane."""

from __future__ import annotations

import itertools

import numpy as np
import numpy.typing as npt

from dagtop.model.table import I64, EventTable
from instrument.events import SCRIPT, CollectiveKind, collective_kind

GATHER_KINDS = {CollectiveKind.ALL_GATHER: True, CollectiveKind.REDUCE_SCATTER: False, CollectiveKind.ALL_REDUCE: False}
"""FSDP's collectives (instrument/fsdp.py), by their kind (:func:`instrument.events.collective_kind`): True, the rank's compute always waits
for it (an all-gather brings the unit's parameters); False, only where the rank's compute lane was idle while it
ran (a reduce-scatter, or HSDP's all-reduce, that held the training thread). Other collectives (DDP's buckets)
gate only the update. The script's own collectives (``all_reduce (script)``, instrument/collectives.py) gate like a
reduce-scatter: the training thread that called them waits for them, unless it went on (``async_op=True``)."""


def gather_cuts(t: EventTable, with_lanes: npt.NDArray[np.bool_], c_rank: I64, marker_lane: I64, ready: I64,
                 c_end: I64, c_hi: I64) -> tuple[I64, I64, I64, I64]:
    """Where a rank resumes computing after an FSDP collective it waited for: (the collective's index among the
    collectives' events, lane, left, right) per such collective and rank.

    An FSDP unit cannot run before its parameters are gathered, so the first run of the rank's compute lane
    (its marker lane) that starts at or after an all-gather's end waits for it. A reduce-scatter does the same
    where the lane did nothing else while it ran, not even wait for a gather: issued synchronously on the
    training thread (CPU, gloo), it held the rank; on a GPU the next layer's backward overlaps it, and then it
    gates nothing. The cut leaves out the time the lane sat idle waiting, from the end of the last task that
    started before the collective ended (never before it was issued) to the collective's end: that wait is the
    collective's, not untimed host time (which no change shortens). A task still running at the end is not made
    to wait: the cut is where it ends.
    """
    names = list(itertools.compress(t.comm_names, with_lanes.tolist()))
    kind = [False if SCRIPT in name else None if (c := collective_kind(name)) is None else GATHER_KINDS.get(c)
            for name in names]
    g_idx = np.array([i for i, k in enumerate(kind) if k is not None], dtype=np.int64)
    if not len(g_idx):
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, empty
    always = np.array([kind[i] for i in g_idx.tolist()], dtype=bool)
    rank = c_rank[g_idx]
    lane, issued = marker_lane[rank], ready[g_idx]
    end = np.minimum(c_end[g_idx], c_hi[g_idx])
    # The last task of the lane that starts before the collective's end, and the one after it.
    j = np.searchsorted(t.key, lane * t.span + np.clip(end - t.t0, 0, t.span - 1), side="left") - 1
    started = j >= t.lane_lo[lane]
    last_end = np.where(started, t.end[j.clip(0)], issued)
    left = np.maximum(issued, last_end)
    right = np.maximum(end, left)
    keep = always | ((last_end <= issued) & ~_within(lane, issued, end, lane[always], left[always], right[always], t))
    return g_idx[keep], lane[keep], left[keep], right[keep]


def _within(lane: I64, lo: I64, hi: I64, w_lane: I64, w_lo: I64, w_hi: I64, t: EventTable) -> npt.NDArray[np.bool_]:
    """Whether each span ``lo:hi`` of ``lane`` overlaps one of the waits ``w_lo:w_hi`` of ``w_lane``."""
    if not len(w_lane):
        return np.zeros(len(lane), dtype=bool)
    base, w_base = lane * t.span - t.t0, w_lane * t.span - t.t0
    order = np.argsort(w_lo + w_base, kind="stable")
    starts, reach = (w_lo + w_base)[order], np.maximum.accumulate((w_hi + w_base)[order])
    k = np.searchsorted(starts, hi + base, side="left") - 1  # the waits that began before the span ended
    overlaps: npt.NDArray[np.bool_] = (k >= 0) & (reach[k.clip(0)] > lo + base)
    return overlaps


def disjoint(order: I64, cut_lane: I64, cut_left: I64, cut_right: I64, t: EventTable) -> I64:
    """The cuts' order again, after moving every cut that falls inside a wait (another collective issued while
    the lane waited for a gather) to where the wait began. Changes ``cut_left`` and ``cut_right`` in place.

    Consecutive cuts must not overlap for the runs between them to be well formed. A point inside a wait becomes
    a point at its start: the collective issued there did not wait for the gather. A wait inside a wait starts
    where the first began and keeps its end: the lane resumes after each, in order of their ends.
    """
    base = cut_lane[order] * t.span - t.t0  # lanes encoded into the times: one running maximum serves them all
    lo, hi = cut_left[order] + base, cut_right[order] + base
    reach = np.maximum.accumulate(np.maximum(lo, hi))
    inside = np.zeros(len(lo), dtype=bool)
    inside[1:] = lo[1:] < reach[:-1]
    if not inside.any():
        return order
    head = np.maximum.accumulate(np.where(inside, 0, np.arange(len(lo))))
    start = lo[head] - base
    moved = order[inside]
    point = cut_left[moved] == cut_right[moved]
    cut_left[moved] = start[inside]
    cut_right[moved] = np.where(point, start[inside], np.maximum(cut_right[moved], start[inside]))
    resorted: I64 = np.lexsort((cut_right, cut_left, cut_lane))
    return resorted
