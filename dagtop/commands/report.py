"""``dagtop report``: a recording summarised as text or JSON (schema in docs/report.md)."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from dagtop.commands.advise import advice_json, write_advice
from dagtop.exits import Exit
from dagtop.io.folded import load
from dagtop.io.recording import RecordingError, read_notes
from dagtop.model.advice_text import advice_of, terms_of
from dagtop.model.liveness_view import Holder, OpenTask, Stall, ranks_text, state_of, where
from dagtop.model.pipeline import Pipeline
from dagtop.model.snapshot import IterationAnalysis
from dagtop.model.straggler import LONGEST, SPAN_S
from dagtop.model.summary import collectives, summarize
from instrument.events import TaskState

COLLECTIVES_SHOWN = 5
"""The text report names this many collectives, those holding the most of the critical path."""


def _gbps(x: float | None) -> str:
    return "∞" if x is None else f"{x:.3g}"


def select(analyses: Sequence[IterationAnalysis], iterations: tuple[int | None, int | None] | None) -> list[IterationAnalysis]:
    """Analyses in ``[A, B)``; without a range, everything past warm-up (all, if that leaves none)."""
    if iterations is None:
        chosen = [a for a in analyses if not a.in_warm_up]
        return chosen or list(analyses)
    lo, hi = iterations
    return [a for a in analyses if (lo is None or a.iteration >= lo) and (hi is None or a.iteration < hi)]


def intake_of(path: str) -> dict[str, Any] | None:
    """What ``dagtop record`` refused while recording (its intake note), as docs/report.md describes ``intake``;
    None for a recording without one (nothing refused, or an older recorder)."""
    note = read_notes(path).get("intake")
    if note is None:
        return None
    reasons = note.get("reasons")
    return {"frames": _whole(note.get("frames")), "rejected": _whole(note.get("rejected")),
            "reasons": {str(r): _whole(n) for r, n in reasons.items()} if isinstance(reasons, dict) else {},
            "first_rejection": str(note.get("first", "")), "refused": _whole(note.get("refused"))}


def _whole(value: object) -> int:
    return value if type(value) is int and value >= 0 else 0


def open_recording(command: str, path: str, bandwidth_gbps: float | None) -> tuple[Pipeline, bool] | int:
    """A recording folded into a pipeline for ``dagtop COMMAND``, (pipeline, tail cut short); or the exit status
    after saying on stderr why it cannot be (no file, not a recording, no iteration). Warns of a cut-short tail and
    of rejected frames."""
    err = sys.stderr
    if not Path(path).is_file():
        what = "is a directory, not a recording" if Path(path).is_dir() else "no such file"
        print(f"dagtop {command}: {path}: {what}", file=err)
        return Exit.BAD_INPUT
    try:
        pipeline, truncated = load(path, bandwidth_gbps)
    except (RecordingError, OSError) as exc:
        print(f"dagtop {command}: {exc}", file=err)
        return Exit.BAD_INPUT
    snap = pipeline.snapshot()
    if truncated:
        print(f"dagtop {command}: warning: {path} ends in a cut-short record (the recorder was stopped mid-write); "
              "reporting the complete frames before it", file=err)
    if snap.rejected:
        print(f"dagtop {command}: warning: {snap.rejected} frames rejected (last: {snap.last_rejection})", file=err)
    if not pipeline.analyses():
        print(f"dagtop {command}: {path} holds no iteration of any rank", file=err)
        return Exit.BAD_INPUT
    return pipeline, truncated


def run_report(args: argparse.Namespace) -> int:
    """The ``report`` command: 0 on success, 2 when the file cannot be read as a recording."""
    path = str(args.file)
    err = sys.stderr
    opened = open_recording("report", path, getattr(args, "bandwidth", None))
    if isinstance(opened, int):
        return opened
    pipeline, truncated = opened
    snap = pipeline.snapshot()
    analyses = pipeline.analyses()
    chosen = select(analyses, args.iterations)
    if not chosen:
        print(f"dagtop report: no analysed iteration in the range asked for "
              f"(the recording has {analyses[0].iteration}..{analyses[-1].iteration})", file=err)
        return Exit.BAD_INPUT
    summary = summarize(chosen)
    summary["collectives"] = collectives(chosen)
    summary["dropped"] = snap.dropped
    summary["rejected"] = snap.rejected
    summary["truncated"] = truncated
    summary["notes"] = list(snap.notes)
    summary["intake"] = intake_of(path)
    summary["stalls"] = [stall_json(x) for x in pipeline.liveness.stalls]
    summary["restarts"] = [{"rank": x.rank, "old_pid": x.old_pid, "new_pid": x.new_pid, "iteration": x.iteration}
                           for x in pipeline.liveness.restarts]
    summary["runs"] = [{"run": r.number, "restart": r.restart, "run_id": r.run_id, "master": r.master,
                        "world": r.world, "first_iteration": r.first_iteration, "last_iteration": r.last_iteration,
                        "after_iteration": r.after, "started": _iso(r.started_ns), "new_job": r.new_job,
                        "pids": list(r.pids), "said": r.line()}
                       for r in snap.runs]
    lost = snap.losses
    summary["lost"] = {"rank_queue": lost.queue, "rank_socket": lost.socket, "in_transit": lost.transit,
                       "iterations_missing": lost.iterations, "before_connect": lost.before_connect}
    advice, priced = advice_of(snap, chosen, terms_of(args))
    summary["advice"] = advice_json(advice, priced)
    if getattr(args, "json", False):
        json.dump(summary, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        write_text(summary, sys.stdout)
        sys.stdout.write("\nadvice (dagtop advise prints it in full)\n")
        write_advice(advice, priced, sys.stdout, details=False)
    return Exit.OK


def stall_json(x: Stall) -> dict[str, Any]:
    """One stall as docs/report.md describes ``stalls``."""
    return {"iteration": x.iteration, "confirmed": x.confirmed, "duration_s": x.stalled_s, "resumed": x.resumed,
            "holders": [{"rank": h.rank, "task": str(h.task), "state": _state_name(h.task), "open_s": round(h.open_s, 1),
                         "silent_s": round(h.silent_s, 1)} for h in x.holders],
            "waiting": [{"task": str(t), "state": _state_name(t), "ranks": list(r)} for t, r in x.waiting]}


def _state_name(task: str) -> str:
    """A task's :class:`TaskState` in a report: ``open``, ``collective``, ``between``, ``unknown``."""
    return state_of(task).name.lower()


def _task(said: dict[str, Any]) -> OpenTask:
    """A holder's or waiting group's task read back from a report (``unknown`` from a report without states)."""
    return OpenTask(said["task"], TaskState[said.get("state", "unknown").upper()])


def write_text(s: dict[str, Any], out: TextIO) -> None:
    """The human-readable report."""
    w = out.write
    it = s["iteration_ms"]
    w(f"{s['ranks']} ranks, {s['iterations']} iterations analysed ({s['first_iteration']}..{s['last_iteration']})"
      f"{', ' + str(s['incomplete_iterations']) + ' incomplete left out' if s['incomplete_iterations'] else ''}"
      f"{', ' + str(s['stalled_iterations']) + ' stalled left out' if s.get('stalled_iterations') else ''}\n")
    w(f"iteration time   median {it['median']:.1f} ms, p90 {it['p90']:.1f} ms "
      f"(model {s['predicted_iteration_ms']:.1f} ms, error {s['model_error'] * 100:.1f} %)\n")
    tie = s.get("tied_with")
    w(f"bottleneck       {s['bottleneck']}"
      + (f" ≈ {tie} ({s['critical_path'][s['bottleneck']] * 100:.0f} % / {s['critical_path'][tie] * 100:.0f} %: "
         "within the iterations' spread)" if tie else "") + "\n")
    st = s["straggler"]
    if st:
        lo, hi = st["excess_range_ms"]
        w(f"straggler        rank {st['rank']}: {st['category']} {st['excess_ms']:+.1f} ms per iteration [{lo:.1f}, "
          f"{hi:.1f} at 95 %] over the other ranks' median (busy {st['busy_excess_ms']:+.1f} ms); above them in "
          f"{st['above']} of {st['iterations']} iterations (p = {st['p_value']:.1g})\n")
    elif s["iterations"] < LONGEST and s["lasted_s"] < SPAN_S:
        w(f"straggler        none named: the iterations analysed last {s['lasted_s']:.1f} s, and a rank is named from "
          f"{SPAN_S:.0f} s of them at least (or {LONGEST} iterations)\n")
    else:
        w("straggler        none (no rank's excess passes the sign test and the minimum effect)\n")
    w("critical path    " + "  ".join(f"{c} {share * 100:.0f} %" for c, share in
                                      sorted(s["critical_path"].items(), key=lambda kv: -kv[1]) if share > 0) + "\n")
    if s["communication_seen"] or s["ranks"] < 2:
        w(f"communication    {s['exposed_comm_ms']:.1f} ms exposed per iteration, "
          f"{s['overlap_ratio'] * 100:.0f} % hidden under compute\n")
    else:
        w("communication    none seen: no collective was timed on any rank\n"
          "                 (dagtop times DDP's all-reduce, fully_shard's all-gathers and reduce-scatters, and the\n"
          "                 script's own collectives beside them; not FSDP1, nor collectives of a job without either)\n")
    on_path = [c for c in s.get("collectives", ()) if c["critical_path"] > 0]
    width = max((len(c["name"]) for c in on_path[:COLLECTIVES_SHOWN]), default=0)
    for i, c in enumerate(on_path[:COLLECTIVES_SHOWN]):
        w(f"{'on the path' if i == 0 else '':<17}{c['name']:<{width}} {c['critical_path'] * 100:3.0f} % of the path, "
          f"median {c['median_ms']:.1f} ms, {_size(c['bytes'])}\n")
    if len(on_path) > COLLECTIVES_SHOWN:
        w(f"{'':<17}… {len(on_path) - COLLECTIVES_SHOWN} more collectives on the path (--json lists them all)\n")
    if s.get("decomposition"):
        w("per iteration    " + "  ".join(f"{k} {v:.1f}" for k, v in s["decomposition"].items())
          + " ms (Shi et al.: time each stage holds the critical path; t_c exposed; medians)\n")
    for f in s.get("interference", ()):
        applied = ("applied to the changes to communication" if f["factor"] >= 0 else
                   "not applied: faster compute under a collective is not what sharing the cores explains")
        w(f"interference     {f['lane']}: compute ×{1 + f['factor']:.2f} ± {f['stderr']:.2f} while a collective "
          f"is in flight ({f['samples']} samples of {f['blocks']} blocks); {applied}\n")
    network = s.get("network")
    if network and network["bus_gbps"] is not None:
        lo, hi = network["bus_gbps_range"]
        spread = f" ({lo:.3g}–{_gbps(hi)} at ±1 s.e.)" if network["beta_stderr"] > 0 else ""
        alpha = network["alpha_us"]
        latency = f"{alpha:.0f} µs" if alpha is not None else "unknown (taken as 0)"
        w(f"network          bus bandwidth {network['bus_gbps']:.3g} GB/s{spread}, latency {latency} "
          f"(α-β fit on {network['collectives']} collectives, {network['sizes']} transfer "
          f"size{'s' if network['sizes'] != 1 else ''})\n")
    if s["what_if"]:
        w("what if          (model replay, median over iterations; throughput in samples/s against now)\n")
        for x in s["what_if"]:
            if x.get("unpredictable"):
                w(f"  {x['change']:<22} {'—':>8}        not predictable: {x['unpredictable']}\n")
                continue
            throughput = f"throughput ×{x['throughput']:.2f}" if x["throughput"] is not None else "-"
            if x["throughput"] is not None and x["workers"] > 1:
                throughput += f" ({x['throughput'] / x['workers'] * 100:.0f} % scaling efficiency)"
            if "iteration_ms_bounds" in x:
                lo_ms, hi_ms = x["iteration_ms_bounds"]
                throughput += f", {lo_ms:.1f}–{hi_ms:.1f} ms/it within the fit's ±1 s.e."
            change = x["change"] if "bandwidth_gbps" not in x else f"network {x['bandwidth_gbps']:.3g} GB/s"
            if "rank" in x:
                throughput += f" (rank {x['rank']}, over the {x['iterations']} iterations that replayed it)"
            w(f"  {change:<22} {x['iteration_ms']:8.1f} ms/it  {throughput}\n")
            if x.get("lower_bound"):
                w(f"  {'':<22} {'':>8}        at least: {x['lower_bound']}\n")
    for x in s.get("stalls", ()):
        held = [Holder(h["rank"], _task(h), h["open_s"], h["silent_s"]) for h in x["holders"]]
        said = [f"rank {h.rank} held the job ({h.describe()})" for h in held] or ["no holder known"]
        said += [f"{ranks_text(w['ranks'])} {where(_task(w))}" for w in x["waiting"]]
        w(f"stall            iteration {x['iteration']}{'' if x['confirmed'] else ' (or near it)'}: no iteration for "
          f"{x['duration_s']:.1f} s{'' if x['resumed'] else ', never resumed'} · " + " · ".join(said) + "\n")
    for x in s.get("runs", ())[1:]:
        w(f"run {x['run'] + 1:<13}{x['said']}: its iterations are numbered from {x['first_iteration']} here\n")
    for x in s.get("restarts", ()):
        w(f"restart          rank {x['rank']}: pid {x['old_pid']} → {x['new_pid']}"
          + (f", its first iteration {x['iteration']}" if x["iteration"] is not None else "") + "\n")
    for note in s.get("notes", ()):
        w(f"note: {note}\n")
    intake = s.get("intake")
    if intake and (intake["rejected"] or intake["refused"]):
        reasons = ", ".join(f"{r} ×{n}" for r, n in sorted(intake["reasons"].items(), key=lambda kv: -kv[1])[:3])
        w(f"note: the recorder refused {intake['rejected']} frames" + (f" ({reasons})" if reasons else "")
          + (f" and {intake['refused']} connections without the rank key" if intake["refused"] else "") + "\n")
    lost = s.get("lost")
    if lost and (lost["rank_queue"] or lost["rank_socket"] or lost["in_transit"]):
        causes = (
            (lost["rank_queue"], "dropped at the ranks (their queue was full)"),
            (lost["rank_socket"], "refused by the ranks' sockets (the monitor or the link not keeping up)"),
            (lost["in_transit"], "lost on the way"),
        )
        w(f"note: frames that never arrived: {', '.join(f'{n} {what}' for n, what in causes if n)} "
          f"({lost['iterations_missing']} iteration frames among them)\n")
    if lost and lost["before_connect"]:
        w(f"note: {lost['before_connect']} iteration frames were sent before the monitor first heard their rank\n")


def _iso(wall_ns: int) -> str | None:
    """A wall-clock time as ISO 8601 in local time with its offset; None for 0 (not said)."""
    if not wall_ns:
        return None
    return datetime.datetime.fromtimestamp(wall_ns / 1e9).astimezone().isoformat(timespec="seconds")


def _size(nbytes: int) -> str:
    if nbytes < 1000:
        return f"{nbytes} B"
    return f"{nbytes / 1e6:.1f} MB" if nbytes >= 1e6 else f"{nbytes / 1e3:.1f} kB"
