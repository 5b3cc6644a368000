"""Synthetic jobs: wire frames of a simulated WFBP data-parallel job, for tests and benchmarks.

The simulation follows the seed paper's schedule: each rank loads, copies, runs forward
block by block, then backward in reverse; a bucket becomes ready when the backward of its
last block ends; bucket all-reduces start when every rank is ready (so a slow rank delays everyone) and share
one channel, two at a time on the CPU as gloo runs them, one at a time on a GPU; the update waits for all of them.
"""

from __future__ import annotations

import dataclasses
import random
import socket
from collections.abc import Sequence
from dataclasses import dataclass

from dagtop.model.bucket_map import ddp_buckets, together_on
from dagtop.model.frames import RawFrame
from instrument import wire
from instrument.events import BACKWARD, COLLECTIVE, COPY, FORWARD, LOAD, UPDATE, RawEvent
from instrument.wire_fields import Bucket, Loader

_MS = 1_000_000


@dataclass(frozen=True)
class SyntheticJob:
    """Durations (ms) of a simulated job; ``slow_*`` multiply one category on slow ranks."""

    ranks: int = 2
    blocks: int = 6
    buckets: int = 3
    io_ms: float = 4.0
    h2d_ms: float = 0.5
    forward_ms: float = 3.0
    backward_ms: float = 6.0
    update_ms: float = 1.5
    bucket_bytes: int = 4_000_000
    allreduce_ms_per_mb: float = 0.8
    allreduce_alpha_ms: float = 0.2
    gap_ms: float = 0.05
    """Untimed host work between consecutive tasks on the training thread."""
    jitter: float = 0.02
    slow_ranks: Sequence[int] = ()
    slow_category: str = "io"
    slow_factor: float = 4.0
    block_bytes: Sequence[int] = ()
    """Gradient bytes of each block (one parameter each, ``blockN.weight``). Given, they replace ``buckets`` and
    ``bucket_bytes``: the buckets are DDP's for ``bucket_limits`` over the blocks in backward order, and every rank
    sends its bucket map after iteration 1."""
    bucket_limits: Sequence[int] = (1 << 20, 25 << 20)
    loader: Loader | None = None
    """The DataLoader the hellos describe."""
    device: str = "cpu"
    """The ranks' device, as their hellos say: on the CPU (gloo) two all-reduces run at once, sharing the channel;
    on a GPU one at a time (:func:`dagtop.model.bucket_map.together_on`)."""


def _channel(starts: Sequence[int], works: Sequence[int], together: int) -> list[int]:
    """When each all-reduce ends, begun at ``starts`` (in order) with ``works`` ns of work alone: ``together`` at a
    time sharing the channel equally (:func:`dagtop.model.bucket_map.shares`), the others waiting in order."""
    left = [float(w) for w in works]
    ends: list[int] = [0] * len(starts)
    done: set[int] = set()
    t = float(starts[0]) if starts else 0.0
    while len(done) < len(starts):
        running = [k for k in range(len(starts)) if k not in done and starts[k] <= t][:together]
        arrivals = [float(s) for k, s in enumerate(starts) if k not in done and s > t]
        if not running:
            t = min(arrivals)
            continue
        step = min(left[k] for k in running) * len(running)
        if arrivals and len(running) < together:
            step = min(step, min(arrivals) - t)
        t += step
        for k in running:
            left[k] -= step / len(running)
            if left[k] <= 1e-6:
                done.add(k)
                ends[k] = round(t)
    return ends


def _slow(job: SyntheticJob, rank: int, category: str) -> float:
    return job.slow_factor if rank in job.slow_ranks and category == job.slow_category else 1.0


def synthetic_frames(
    job: SyntheticJob = SyntheticJob(),
    iterations: int = 10,
    seed: int = 0,
    start_ns: int = 1_000_000_000,
    first_iteration: int = 0,
    hello: bool = True,
) -> list[RawFrame]:
    """Simulate ``iterations`` of ``job`` and return the frames all ranks would send, in arrival order."""
    rng = random.Random(seed)
    host = socket.gethostname()

    def d(ms: float) -> int:
        return max(1, int(ms * _MS * (1.0 + rng.uniform(-job.jitter, job.jitter))))

    frames: list[tuple[int, bytes]] = []
    seq = [0] * job.ranks
    if hello:
        for r in range(job.ranks):
            h = wire.Hello(seq[r], r, job.ranks, r, host, 10_000 + r, job.device, "synthetic", "SyntheticNet",
                           11_000_000, "block", 1_700_000_000 * 10**9, start_ns, loader=job.loader)
            frames.append((start_ns, wire.encode(h)))
            seq[r] += 1

    gap = int(job.gap_ms * _MS)
    clock = [start_ns] * job.ranks
    blocks = [f"block{b}" for b in range(job.blocks)]
    # Buckets fill from the last block backwards, as DDP orders them.
    per_bucket = max(1, job.blocks // job.buckets)
    bucket_of_block = {b: min((job.blocks - 1 - b) // per_bucket, job.buckets - 1) for b in range(job.blocks)}
    sizes = [job.bucket_bytes] * job.buckets
    if job.block_bytes:
        backward = list(reversed(range(job.blocks)))
        counts = ddp_buckets([job.block_bytes[b] for b in backward], job.bucket_limits)
        owner = [k for k, n in enumerate(counts) for _ in range(n)]
        bucket_of_block = {b: owner[i] for i, b in enumerate(backward)}
        sizes = [sum(job.block_bytes[b] for b in range(job.blocks) if bucket_of_block[b] == k) for k in range(len(counts))]
        names = [tuple(f"{blocks[b]}.weight" for b in backward if bucket_of_block[b] == k) for k in range(len(counts))]
        bucket_map = wire.Buckets(0, 0, tuple(Bucket(k, sizes[k], names[k]) for k in range(len(counts))),
                                  parameter_bytes=tuple(tuple(job.block_bytes[b] for b in backward
                                                              if bucket_of_block[b] == k) for k in range(len(counts))))

    for it in range(first_iteration, first_iteration + iterations):
        events: list[list[RawEvent]] = [[] for _ in range(job.ranks)]
        ready: list[list[int]] = [[0] * len(sizes) for _ in range(job.ranks)]
        backward_end = [0] * job.ranks
        for r in range(job.ranks):
            t = clock[r] + gap
            for kind, name, ms in ((LOAD, "next", job.io_ms), (COPY, "to_device", job.h2d_ms)):
                dur = d(ms * _slow(job, r, kind.category))
                events[r].append(kind.event(name, "main", t, t + dur))
                t += dur + gap
            for b in blocks:
                dur = d(job.forward_ms / job.blocks * _slow(job, r, "compute"))
                events[r].append(FORWARD.event(b, "main", t, t + dur))
                t += dur + gap
            for b_index in reversed(range(job.blocks)):
                dur = d(job.backward_ms / job.blocks * _slow(job, r, "compute"))
                events[r].append(BACKWARD.event(blocks[b_index], "main", t, t + dur))
                t += dur
                bucket = bucket_of_block[b_index]
                ready[r][bucket] = max(ready[r][bucket], t)
                t += gap
            backward_end[r] = t
        slow = max(_slow(job, r, "allreduce") for r in range(job.ranks))
        bucket_end = _channel([max(ready[r][k] for r in range(job.ranks)) for k in range(len(sizes))],
                              [d((job.allreduce_alpha_ms + job.allreduce_ms_per_mb * m / 1e6) * slow) for m in sizes],
                              together_on([job.device]))
        channel = max(bucket_end, default=0)
        for k, end in enumerate(bucket_end):
            for r in range(job.ranks):
                events[r].append(COLLECTIVE.event(f"bucket {k}", "comm", ready[r][k], end, sizes[k]))
        for r in range(job.ranks):
            t = max(backward_end[r], channel) + gap
            dur = d(job.update_ms * _slow(job, r, "compute"))
            events[r].append(UPDATE.event("optimizer.step", "main", t, t + dur))
            clock[r] = t + dur
            frames.append((t + dur + 200_000, wire.encode_iteration(seq[r], r, it, events[r], 0)))
            seq[r] += 1
            if job.block_bytes and it == 1:
                frames.append((t + dur + 300_000, wire.encode(dataclasses.replace(bucket_map, seq=seq[r], rank=r))))
                seq[r] += 1

    frames.sort(key=lambda f: f[0])
    return [RawFrame(received, payload) for received, payload in frames]
