"""One job per monitor, a run per incarnation, per-sender state, late frames and losses by reason: on frames made
by hand, each fed to the model as the live screen, ``report`` and ``record`` all feed it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers.frames import ListSource, hello

from dagtop.commands.record import record
from dagtop.io.recording import RecordingWriter
from dagtop.model import verdict
from dagtop.model.admission import Admission
from dagtop.model.frames import RawFrame
from dagtop.model.liveness import Liveness
from dagtop.model.pipeline import Pipeline
from instrument import wire

S = 1_000_000_000
MS = 1_000_000


@dataclass
class Rank:
    """One process publishing as a rank, numbering its frames as the shim does."""

    rank: int
    world: int = 2
    sender: int = 0
    job: str = "run-a"
    master: str = "10.0.0.1:29500"
    restart: int = 0
    started_ns: int = 1_700_000_000 * S
    pid: int = 0
    seq: int = 0
    iteration: int = 0
    dropped: int = 0
    dropped_queue: int = 0
    clock_ns: int = 0
    """Its own monotonic clock (heartbeats and iteration ends)."""
    sent: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sender = self.sender or 1000 + self.rank + 10 * self.restart
        self.pid = self.pid or 5000 + self.rank + 10 * self.restart

    def _next(self) -> int:
        self.seq += 1
        return self.seq - 1

    def hello(self, world: int | None = None) -> bytes:
        return wire.encode(hello(self.rank, world or self.world, self._next(), host="node1", pid=self.pid,
                                 wall_ns=self.started_ns, mono_ns=self.clock_ns, job=self.job, master=self.master,
                                 restart=self.restart, started_ns=self.started_ns, sender=self.sender))

    def step(self, ms: float = 50) -> bytes:
        """Its next iteration, ``ms`` long on its clock."""
        start = self.clock_ns
        self.clock_ns += int(ms * MS)
        payload = wire.encode_iteration(self._next(), self.rank, self.iteration,
                                        [("compute", "forward", "f", "main", start, self.clock_ns, 0)],
                                        self.dropped, self.dropped_queue, self.sender)
        self.iteration += 1
        return payload

    def heartbeat(self) -> bytes:
        return wire.encode(wire.Heartbeat(self._next(), self.rank, self.iteration, "forward f", 1, self.clock_ns,
                                          self.sender))

    def bye(self) -> bytes:
        return wire.encode(wire.Bye(self._next(), self.rank, self.iteration, self.dropped, self.dropped_queue,
                                    self.sender))

    def lose(self) -> None:
        """An iteration whose frame takes a sequence number and never arrives."""
        self.step()


def _raw(payloads: list[bytes], at_ns: int = 0) -> list[RawFrame]:
    return [RawFrame(at_ns + i, p) for i, p in enumerate(payloads)]


def _job(ranks: list[Rank], iterations: int, t0_ns: int = 0, every_ns: int = 50 * MS) -> list[RawFrame]:
    """Every rank's iterations, one round per ``every_ns`` of monitor time, with a heartbeat every 20."""
    frames = []
    for i in range(iterations):
        for r in ranks:
            frames.append(RawFrame(t0_ns + i * every_ns, r.step()))
            if i % 20 == 0:
                frames.append(RawFrame(t0_ns + i * every_ns, r.heartbeat()))
    return frames


def _complete(p: Pipeline) -> list[int]:
    return [a.iteration for a in p.analyses() if a.complete]


def _fed(frames: list[RawFrame]) -> Pipeline:
    p = Pipeline(window=None)
    p.feed(frames)
    p.finish()
    return p


# ---------------------------------------------------------------------------------------------------- one job


def test_a_second_job_on_the_endpoint_is_refused_counted_and_said() -> None:
    ours, theirs = [Rank(0), Rank(1)], [Rank(0, job="run-b", sender=77), Rank(1, job="run-b", sender=78)]
    frames = _raw([r.hello() for r in ours])
    frames += _job(ours, 10, t0_ns=S)
    frames += _raw([r.hello(world=16_384) for r in theirs] + [r.step() for r in theirs for _ in range(5)], 2 * S)
    frames += _job(ours, 10, t0_ns=3 * S)
    p = _fed(frames)
    snap = p.snapshot()
    assert _complete(p) == list(range(20)) and snap.ranks_expected == 2
    assert snap.rejected == 12 and p.rejections == {"a frame of another job than the one followed": 12}
    assert "a second job is publishing here: 12 frames refused (run id run-b, master 10.0.0.1:29500)" in snap.job_line


def test_frames_that_came_before_their_hello_wait_for_it_and_go_with_it() -> None:
    ours, theirs = [Rank(0), Rank(1)], Rank(1, job="run-b", sender=77)
    frames = _raw([ours[0].hello(), ours[0].step(), ours[1].step(), theirs.step(), theirs.step()])
    a = Admission()
    for raw in frames:
        a.admit(raw)
    assert len(a.held) == 3  # rank 1's frames came before its process said hello; so did the stranger's
    assert [type(f).__name__ for _, f in a.admit(RawFrame(1, ours[1].hello()))] == ["IterationBatch", "Hello"]
    assert len(a.held) == 2 and a.admit(RawFrame(2, theirs.hello())) == []
    assert a.held == [] and a.rejected == 3  # its hello refused, the frames it held go with it


def test_the_next_job_is_followed_once_the_first_said_bye_or_fell_silent() -> None:
    first, second = [Rank(0), Rank(1)], [Rank(0, job="run-b", sender=77), Rank(1, job="run-b", sender=78)]
    frames = _raw([r.hello() for r in first]) + _job(first, 5, t0_ns=S) + _raw([r.bye() for r in first], 2 * S)
    frames += _raw([r.hello() for r in second], 3 * S) + _job(second, 5, t0_ns=4 * S)
    third = [Rank(0, job="run-c", sender=91), Rank(1, job="run-c", sender=92)]  # after 20 s without a frame
    frames += _raw([r.hello() for r in third], 30 * S) + _job(third, 5, t0_ns=31 * S)
    p = _fed(frames)
    assert _complete(p) == list(range(15)) and p.rejected == 0
    runs = p.snapshot().runs
    assert [(r.run_id, r.first_iteration, r.new_job) for r in runs] == [("run-a", 0, False), ("run-b", 5, True),
                                                                        ("run-c", 10, True)]
    assert runs[1].line().startswith("another job (run id run-b, master 10.0.0.1:29500) at ")


def test_frames_without_a_sender_are_refused_for_a_rank_whose_process_marks_its_own() -> None:
    ours = [Rank(0), Rank(1)]
    stray = Rank(1, sender=0)  # an older shim's rank 1, or anything that sends bare frames
    stray.sender = 0
    frames = _raw([r.hello() for r in ours]) + _job(ours, 5, t0_ns=S)
    frames += _raw([stray.step() for _ in range(5)], 2 * S) + _job(ours, 5, t0_ns=3 * S)
    p = _fed(frames)
    assert _complete(p) == list(range(10)) and p.rejected == 5


# ------------------------------------------------------------------------------------- what one sender may claim


def test_nothing_a_stray_sender_claims_stalls_or_rewrites_the_job() -> None:
    """The four ways of #30's item 9, each from a process of the followed job's identity but not of the job."""
    ours = [Rank(0), Rank(1)]
    frames = _raw([r.hello() for r in ours]) + _job(ours, 10, t0_ns=S)
    huge = Rank(0, sender=501, started_ns=ours[0].started_ns - S)  # a leftover of an earlier run of rank 0
    frames += _raw([huge.hello(world=16_384)], 2 * S)
    ahead = Rank(0, sender=502, started_ns=ours[0].started_ns - S, seq=10**9)  # rank 0 far ahead in sequence
    frames += _raw([ahead.hello()] + [ahead.step() for _ in range(5)], 2 * S)
    frames += _job(ours, 10, t0_ns=3 * S)
    p = _fed(frames)
    assert _complete(p) == list(range(20)) and p.snapshot().ranks_expected == 2
    assert p.rejected == 1 + 6
    # A sender of the job itself whose iterations its sequence numbers cannot account for: refused, frame by frame.
    ours = [Rank(0), Rank(1)]
    frames = _raw([r.hello() for r in ours]) + _job(ours, 10, t0_ns=S)
    ours[1].iteration = 10**12
    frames += _raw([ours[1].step()], 2 * S)
    ours[1].iteration = 10
    frames += _job(ours, 10, t0_ns=3 * S)
    p = _fed(frames)
    assert _complete(p) == list(range(20)) and p.rejected == 1
    assert max(a.iteration for a in p.analyses()) == 19


# ---------------------------------------------------------------------------------------------------- runs


def _restarted(with_count: bool) -> tuple[list[RawFrame], list[Rank]]:
    old = [Rank(0), Rank(1)]
    frames = _raw([r.hello() for r in old]) + _job(old, 30, t0_ns=S)
    frames += _raw([old[0].step()], 3 * S)  # rank 0 ran iteration 30; rank 1 was killed in it
    new = [Rank(r, restart=1 if with_count else 0, sender=300 + r, pid=6000 + r,
                started_ns=old[0].started_ns + 60 * S) for r in (0, 1)]
    frames += _raw([r.hello() for r in new], 10 * S) + _job(new, 20, t0_ns=11 * S)
    return frames, new


@pytest.mark.parametrize("with_count", [True, False], ids=["torchrun's restart count", "new processes"])
def test_a_restart_is_a_new_run_whose_iterations_are_numbered_on(tmp_path: Path, with_count: bool) -> None:
    frames, _ = _restarted(with_count)
    p = _fed(frames)
    snap = p.snapshot()
    assert _complete(p) == list(range(30)) + list(range(31, 51))
    assert [a.iteration for a in p.analyses() if not a.complete] == [30]
    assert [(r.number, r.restart, r.first_iteration, r.after) for r in snap.runs] == \
        [(0, 0, 0, None), (1, 1 if with_count else 0, 31, 30)]
    assert snap.runs[1].pids == (6000, 6001) and p.rejected == 0
    assert snap.runs[0].line().startswith("first run at ")
    said = snap.runs[1].line()
    assert said.startswith("restart 1 at " if with_count else "run 2 (new processes) at ")
    assert said.endswith(", after iteration 30")
    assert said in snap.job_line  # the screen says it
    with RecordingWriter(tmp_path / "r.dagtop") as writer:
        progress = record(ListSource(frames, batch=50), writer)
    assert progress.complete == 50 and progress.runs == 2  # every iteration of both runs, each once
    # A late frame of the old run past its end, or the old process heard again: refused, not renumbered.
    late = Rank(1, restart=0, iteration=31, seq=200)
    late.sender, late.pid = 1001, 5001
    p.feed(_raw([late.step()], 40 * S))
    assert p.rejected == 1 and "came after its run had ended" in (p.last_rejection or "")


def test_the_job_launched_again_counting_restarts_anew_is_a_new_run() -> None:
    frames, new = _restarted(with_count=True)  # two runs, the second torchrun's restart 1
    again = [Rank(r, restart=0, sender=700 + r, pid=7000 + r, started_ns=new[0].started_ns + 600 * S) for r in (0, 1)]
    frames += _raw([r.hello() for r in again], 40 * S) + _job(again, 10, t0_ns=41 * S)
    p = _fed(frames)
    runs = p.snapshot().runs
    assert [(r.restart, r.first_iteration) for r in runs] == [(0, 0), (1, 31), (0, 51)] and p.rejected == 0
    assert _complete(p)[-10:] == list(range(51, 61))


def test_a_process_older_than_its_ranks_is_refused() -> None:
    ours = [Rank(0), Rank(1)]
    leftover = Rank(1, sender=66, pid=4001, started_ns=ours[1].started_ns - 3600 * S)
    frames = _raw([r.hello() for r in ours]) + _job(ours, 5, t0_ns=S)
    frames += _raw([leftover.hello()] + [leftover.step() for _ in range(3)], 2 * S) + _job(ours, 5, t0_ns=3 * S)
    p = _fed(frames)
    assert _complete(p) == list(range(10)) and len(p.snapshot().runs) == 1 and p.rejected == 4


# ------------------------------------------------------------------------------------- late frames, losses


def test_late_frames_complete_their_iterations_and_only_missing_ones_count() -> None:
    """Rank 1's frames come 15 s late (a lossy link: TCP retransmits); one of them never comes."""
    ranks = [Rank(0), Rank(1)]
    frames = _raw([r.hello() for r in ranks])
    for i in range(300):
        t = S + i * 50 * MS
        frames.append(RawFrame(t, ranks[0].step()))
        if i == 150:
            ranks[1].lose()
            continue
        frames.append(RawFrame(t + 15 * S, ranks[1].step()))
    frames.sort(key=lambda f: f.received_ns)
    p = Pipeline(window=120)  # the live screen's window: what is given up on leaves it before its frame comes
    for i in range(0, len(frames), 20):
        p.feed(frames[i:i + 20])
    p.finish()
    snap = p.snapshot()
    assert snap.incomplete == 1 and snap.rejected == 0
    assert snap.losses.transit == 1 and snap.losses.iterations == 1 and snap.dropped == 1
    assert [a.complete for a in p.analyses()] == [True] * 120


def test_a_backlog_of_late_frames_folds_the_verdict_again_for_their_iterations_and_the_newest_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 is cut off for 15 s and its 300 queued frames come at once (a blocked port, then TCP): each completes
    its iteration, and costs two verdicts (its own and the newest's), not one for every iteration after it."""
    advanced = 0
    advance = verdict.advance

    def counted(*args: object, **kwargs: object) -> object:
        nonlocal advanced
        advanced += 1
        return advance(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(verdict, "advance", counted)
    ranks = [Rank(0), Rank(1)]
    frames, backlog = _raw([r.hello() for r in ranks]), []
    for i in range(600):
        t = S + i * 50 * MS
        frames.append(RawFrame(t, ranks[0].step()))
        if 100 <= i < 400:
            backlog.append(ranks[1].step())
        else:
            frames += _raw(backlog, t) + [RawFrame(t, ranks[1].step())]
            backlog = []
    p = Pipeline(window=None)
    for i in range(0, len(frames), 20):
        p.feed(frames[i:i + 20])
    p.finish()
    analyses = p.analyses()
    assert [a.complete for a in analyses] == [True] * 600 and p.snapshot().incomplete == 0
    assert advanced <= 600 + 2 * 300, advanced  # re-folding all that follows each: 20,884


def test_losses_are_counted_by_reason_from_sequence_numbers_and_the_ranks_counters() -> None:
    r = Rank(0, world=1)
    r.seq, r.iteration = 5, 3  # the hello and three iterations went before the monitor heard it
    frames = [r.hello(), r.step()]
    r.lose()  # lost on the way
    r.seq, r.iteration, r.dropped = r.seq + 2, r.iteration + 2, 2  # two the socket refused (numbered)
    r.iteration, r.dropped, r.dropped_queue = r.iteration + 3, 5, 3  # three the queue dropped (no number)
    frames += [r.step(), r.bye()]
    p = _fed(_raw(frames))
    lost = p.snapshot().losses
    assert (lost.queue, lost.socket, lost.transit, lost.before_connect) == (3, 2, 1, 3)
    assert lost.iterations == 1 + 2 + 3 and p.snapshot().dropped == 6


# ------------------------------------------------------------------------------------- the ranks' clocks


def test_an_outage_of_the_monitor_is_not_a_stall_but_silence_of_every_rank_is_said() -> None:
    ranks = [Rank(0), Rank(1)]
    live = Liveness(alive=lambda pid: True)
    admission = Admission()
    t = 0

    def feed(payloads: list[bytes], at_ns: int) -> None:
        for raw in _raw(payloads, at_ns):
            for _, frame in admission.admit(raw):
                live.take(frame, raw.received_ns)

    feed([r.hello() for r in ranks], 0)
    for i in range(100):  # 5 s of a steady job, heartbeats every 20 iterations
        t = i * 50 * MS
        feed([x for r in ranks for x in ([r.step(), r.heartbeat()] if i % 20 == 0 else [r.step()])], t)
    # The monitor hears nothing for 30 s while the job runs on (its frames queue at the ranks).
    queued = [x for i in range(600) for r in ranks for x in ([r.step(), r.heartbeat()] if i % 20 == 0 else [r.step()])]
    during = live.assess(t + 20 * S)
    assert during.stalled_s == 0 and not during.silent
    assert during.line().startswith("nothing heard from any rank for 2")
    feed(queued, t + 31 * S)  # all at once when it comes back
    after = live.assess(t + 31 * S)
    assert after.stalled_s == 0 and after.line() == "" and live.stalls == []


def test_a_rank_stuck_on_its_own_clock_is_a_stall_even_when_its_heartbeats_come_late() -> None:
    ranks = [Rank(0), Rank(1)]
    live = Liveness(alive=lambda pid: True)
    admission = Admission()
    for raw in _raw([r.hello() for r in ranks]) + _job(ranks, 40):
        for _, frame in admission.admit(raw):
            live.take(frame, raw.received_ns)
    for k in range(1, 11):  # rank 1 stopped; rank 0 waits in its all-reduce, heartbeats say so, a second apart
        ranks[0].clock_ns += S
        for _, frame in admission.admit(RawFrame(2 * S + k * S, ranks[0].heartbeat())):
            live.take(frame, 2 * S + k * S)
    view = live.assess(12 * S)
    assert view.stalled_s >= 9 and [rank for rank, _, _ in view.silent] == [1]
