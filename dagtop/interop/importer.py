"""``dagtop import``: one PyTorch-profiler trace per rank into a recording, as the wire frames a live rank sends.

The frames are the shim's (``hello``, one ``iter`` per rank and iteration, ``bye``), so ``report``, ``replay`` and
``export`` read an imported recording through the very same model as a live one. Collectives are named so that
every rank's copy of one collective has the same name in its iteration, which is how the model matches them: by
process group and sequence number where the trace has ``record_param_comms``, else by their order in the iteration
(``allreduce #0``, ``allreduce #1``, …).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from dagtop.exits import Exit
from dagtop.interop.iterations import RankIterations, lift
from dagtop.interop.kineto import TraceError, read_trace
from dagtop.io.output import OutputError, whole_file
from dagtop.io.recording import RecordingWriter
from dagtop.model.frames import RawFrame
from instrument import wire
from instrument.events import Event

DEFAULT_GROUP = "0"
"""The default process group's name in ``record_param_comms``: its collectives carry no ``[pg …]`` suffix."""


@dataclass
class Imported:
    """The frames of an import and what it found, for the summary line."""

    frames: list[RawFrame]
    ranks: int
    world: int
    iterations: int
    collectives: int
    notes: list[str]


def _ranks(lifted: Sequence[RankIterations]) -> tuple[dict[int, RankIterations], int, list[str]]:
    """Rank → its iterations, and the world size: from ``distributedInfo``, else the traces' order on the line."""
    notes = []
    by_rank: dict[int, RankIterations] = {}
    for position, r in enumerate(lifted):
        rank = r.trace.rank
        if rank is None:
            rank = position
            notes.append(f"{r.trace.path} has no distributedInfo: taken as rank {rank} (its place on the command line)")
        if rank in by_rank:
            raise TraceError(f"{r.trace.path} and {by_rank[rank].trace.path} are both rank {rank}: "
                             "give one trace per rank")
        by_rank[rank] = r
    world = max([max(by_rank) + 1] + [r.trace.world for r in lifted if r.trace.world])
    if len(by_rank) < world:
        missing = sorted(set(range(world)) - set(by_rank))
        notes.append(f"no trace of rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} "
                     f"of {world}: iterations are incomplete without {'them' if len(missing) > 1 else 'it'}")
    return by_rank, world, notes


def _name_collectives(by_rank: dict[int, RankIterations]) -> dict[int, dict[int, list[Event]]]:
    """Rank → iteration → its collectives as events, named alike on every rank."""
    iteration_of: dict[tuple[str, int], int] = {}
    kind_of: dict[tuple[str, int], str] = {}
    for r in by_rank.values():
        for c in r.collectives:
            if c.key is not None:
                iteration_of[c.key] = min(iteration_of.get(c.key, c.iteration), c.iteration)
                kind_of[c.key] = c.kind
    per_iteration: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for key, it in iteration_of.items():
        per_iteration[it].append(key)
    name_of: dict[tuple[str, int], str] = {}
    for keys in per_iteration.values():
        for i, key in enumerate(sorted(keys)):
            group = "" if key[0] in (DEFAULT_GROUP, "") else f" [pg {key[0]}]"
            name_of[key] = f"{kind_of[key]} #{i}{group}"
    out: dict[int, dict[int, list[Event]]] = {}
    for rank, r in by_rank.items():
        mine: dict[int, list[Event]] = defaultdict(list)
        for c in r.collectives:
            name = name_of[c.key] if c.key is not None else f"{c.kind} #{c.order}"
            mine[c.iteration].append(Event("allreduce", "allreduce", name[:256], "comm", c.start, c.end, c.bytes))
        out[rank] = mine
    return out


def import_traces(paths: Sequence[str]) -> Imported:
    """Read and convert the traces (one per rank) into the frames of a recording.

    Raises:
        TraceError: a trace cannot be read, holds no ``ProfilerStep#N``, or two traces are the same rank.
    """
    lifted = []
    for path in paths:
        r = lift(read_trace(path))
        if not r.events:
            raise TraceError(f"{path}: no ProfilerStep#N in the trace; dagtop cuts iterations where prof.step() "
                             "is called (torch.profiler.profile(schedule=...), then prof.step() every iteration)")
        lifted.append(r)
    by_rank, world, notes = _ranks(lifted)
    comms = _name_collectives(by_rank)
    base = min(r.trace.base_ns for r in by_rank.values())
    timed: list[tuple[int, int, bytes]] = []
    frames_per_rank: dict[int, list[tuple[int, bytes]]] = {}
    for rank, r in sorted(by_rank.items()):
        shift = r.trace.base_ns - base  # one clock for every trace: each one's ts is from its own base
        iterations = {it: sorted((e._replace(start_ns=e.start_ns + shift, end_ns=e.end_ns + shift)
                                  for e in [*evs, *comms[rank].get(it, ())]), key=lambda e: e.start_ns)
                      for it, evs in sorted(r.events.items())}
        first = min((evs[0].start_ns for evs in iterations.values() if evs), default=0)
        units = f"{len(r.units)} {'modules' if r.by_module else 'operator groups'}: {', '.join(r.units)}"
        numbered = [it for it, evs in iterations.items() if evs]
        # Sequence numbers as a shim would have spent them: one per iteration, the hello just before the first.
        hello = wire.Hello(seq=numbered[0] if numbered else 0, rank=rank, world=world, local_rank=rank, host=r.trace.host, pid=r.trace.pid,
                           device="cuda" if r.gpu else "cpu", torch="", model=f"imported: {r.trace.path.name}"[:256],
                           params=0, granularity="module" if r.by_module else "operator", wall_ns=base + first,
                           mono_ns=first, units=units[:255] + "…" if len(units) > 256 else units)
        frames = [(first, wire.encode(hello))]
        for it in numbered:
            evs = iterations[it]
            frames.append((max(e.end_ns for e in evs), wire.encode_iteration(it + 1, rank, it, evs, 0)))
        last = max(t for t, _ in frames)
        after = numbered[-1] + 1 if numbered else 0
        frames.append((last, wire.encode(wire.Bye(seq=after + 1, rank=rank, iterations=after, dropped=0))))
        frames_per_rank[rank] = frames
        timed.extend((t, i, payload) for i, (t, payload) in enumerate(frames))
    # Frames in the order they would have arrived: each when its iteration ended (a rank's own order kept).
    timed.sort(key=lambda x: (x[0], x[1]))
    raw = [RawFrame(max(t, 0), payload) for t, _, payload in timed]
    all_iterations = {it for r in by_rank.values() for it in r.events}
    collectives = len({(it, e.name) for per in comms.values() for it, evs in per.items() for e in evs})
    return Imported(raw, len(by_rank), world, len(all_iterations), collectives, notes)


def run_import(args: argparse.Namespace) -> int:
    """The ``dagtop import`` command: 0 on success, 2 (:attr:`Exit.BAD_INPUT`) when a trace cannot be used, 4
    (:attr:`Exit.DISK`) when the recording cannot be written (nothing of it is left)."""
    try:
        result = import_traces(args.traces)
    except TraceError as exc:
        print(f"dagtop import: {exc}", file=sys.stderr)
        return Exit.BAD_INPUT
    try:
        with whole_file(args.output) as out, RecordingWriter(out) as writer:
            for frame in result.frames:
                writer.append(frame)
    except OutputError as exc:
        print(f"dagtop import: {exc}", file=sys.stderr)
        return Exit.DISK
    for note in result.notes:
        print(f"dagtop import: note: {note}", file=sys.stderr)
    print(f"dagtop import: {result.ranks} of {result.world} ranks, {result.iterations} iterations, "
          f"{result.collectives} collectives → {args.output}", file=sys.stderr)
    return Exit.OK
