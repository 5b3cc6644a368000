"""Fuzz the monitor's intake: the wire decoder and the whole model pipeline under generated frames.

Frames are valid msgpack with the wrong things in it (wrong types, huge lengths and integers, deep nesting, NaN
and infinities, negative times, duplicate sequence numbers, ranks out of range, iteration numbers that jump),
valid frames of a few ranks among them, and random bytes. Iterations come in both wire versions: version 1's
event lists, and version 2's typed columns with their bins cut short, grown, flipped, swapped or pointing at
names that are not there; heartbeats too. Every frame goes through ``wire.decode`` and
``Pipeline.feed`` (which must never raise); the script counts crashes and prints the monitor's RSS as it goes.

    python benchmarks/fuzz_intake.py                 # 10^6 frames
    python benchmarks/fuzz_intake.py --frames 10000 --seed 3
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import psutil

from dagtop.model.frames import RawFrame
from dagtop.model.pipeline import Pipeline
from instrument import wire
from instrument.events import PHASES

ODD_VALUES: tuple[Any, ...] = (
    None, True, False, -1, 0, 2**63 - 1, -(2**63), 2**64 - 1, 1.5, math.nan, math.inf, -math.inf, "", "x" * 300,
    "é" * 70_000, b"\x00", [], {}, [[[[[]]]]], {"a": 1}, ["io"] * 7, list(range(1000)), {str(i): i for i in range(100)},
)
"""Values that fit no field, or fit one just barely."""


def _valid(rng: random.Random, seq: int) -> dict[str, Any]:
    """A frame that decodes, of a few ranks, with iteration numbers and seqs that misbehave sometimes."""
    rank, world = rng.randrange(4), rng.choice((1, 2, 4, 4, 4, 8))
    kind = rng.choices(("iter", "hello", "buckets", "bye", "telemetry", "heartbeat"), (70, 10, 5, 3, 5, 5))[0]
    head: dict[str, Any] = {"v": 1, "k": kind, "seq": seq, "rank": rank}
    if kind == "hello":
        return {**head, "world": max(world, rank + 1), "local_rank": rank, "host": "h", "pid": rng.randrange(3),
                "device": "cpu", "torch": "t", "model": "M", "params": 1, "granularity": "block",
                "wall_ns": 10**18, "mono_ns": 10**9}
    if kind == "buckets":
        return {**head, "buckets": [[i, rng.randrange(10**6), [f"p{i}"]] for i in range(rng.randrange(4))]}
    if kind == "bye":
        return {**head, "iterations": rng.randrange(100), "dropped": 0}
    if kind == "heartbeat":
        return {**head, "v": 2, "it": rng.randrange(20), "task": rng.choice(("all-reduce bucket 1", "loader next", "")),
                "open_ms": rng.randrange(10**5)}
    if kind == "telemetry":
        return {**head, "host": "h", "local_rank": rank, "mono_ns": 1, "note": "",
                "hw": {"cpu": rng.random() * 100, "cpus": 2, "mem_used": 1, "mem_total": 2}, "gpu": None}
    it = rng.choice((rng.randrange(20), rng.randrange(20), rng.randrange(2**40)))
    t = rng.randrange(10**12)
    events = [[rng.choice(("io", "compute", "allreduce")), rng.choice(("load", "forward", "backward", "comm")),
               f"layers.{i}", "main", t + 10 * i, t + 10 * i + rng.randrange(20), rng.randrange(1000)]
              for i in range(rng.randrange(1, 12))]
    if rng.random() < 0.5:  # version 2: the same events as the shim sends them, typed columns
        sendable = [[e[0], e[1] if e[1] in PHASES else "allreduce", *e[2:]] for e in events]  # the shim's vocabulary
        frame: dict[str, Any] = msgpack.unpackb(wire.encode_iteration(seq, rank, it, sendable, 0), raw=False)
        return frame
    return {**head, "it": it, "ev": events, "dropped": 0}


def _spoil(rng: random.Random, frame: dict[str, Any]) -> Any:
    """The frame with one thing wrong, somewhere in it."""
    roll = rng.random()
    if isinstance(frame.get("ev"), dict) and roll < 0.5:  # a version 2 column
        return _spoil_columns(rng, frame)
    if roll < 0.35:
        frame[rng.choice(list(frame))] = rng.choice(ODD_VALUES)
    elif roll < 0.55 and isinstance(frame.get("ev"), list) and frame["ev"]:
        event = list(rng.choice(frame["ev"]))
        event[rng.randrange(7)] = rng.choice(ODD_VALUES + (-5,))
        frame["ev"][rng.randrange(len(frame["ev"]))] = event
    elif roll < 0.65:
        nested: Any = 1
        for _ in range(rng.randrange(10, 400)):
            nested = [nested]
        frame["ev"] = nested
    elif roll < 0.75:
        frame[rng.choice(("v", "k", "junk", 7))] = rng.choice(ODD_VALUES)  # type: ignore[index]
    elif roll < 0.85:
        return rng.choice(ODD_VALUES)
    else:
        frame["rank"] = rng.choice((10**6, 2**20, -1, 99))
    return frame


def _spoil_columns(rng: random.Random, frame: dict[str, Any]) -> dict[str, Any]:
    """A version 2 frame with one of its event columns wrong: a bin cut, grown, flipped or swapped for another
    type, a name list too short or not names, a column missing or one too many."""
    columns = frame["ev"]
    key = rng.choice(list(columns))
    value = columns[key]
    roll = rng.random()
    if isinstance(value, bytes) and roll < 0.5:
        mutate = rng.randrange(4)
        if mutate == 0:
            value = value[: rng.randrange(len(value) + 1)]
        elif mutate == 1:
            value = value + rng.randbytes(rng.randrange(1, 9))
        elif mutate == 2 and value:
            i = rng.randrange(len(value))
            value = value[:i] + bytes([value[i] ^ (1 << rng.randrange(8))]) + value[i + 1:]
        else:
            value = b"\xff" * len(value)  # every code out of range, every time far in the future
    elif roll < 0.7:
        value = rng.choice(ODD_VALUES)
    elif roll < 0.85:
        del columns[key]
        return frame
    else:
        columns[rng.choice(("junk", key + "x"))] = rng.randbytes(8)
        return frame
    columns[key] = value
    return frame


def _header_lies(rng: random.Random) -> bytes:
    """msgpack whose length headers claim far more than follows (or than any limit allows)."""
    return rng.choice((b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff",
                       b"\x81\xa1v\xdd\x7f\xff\xff\xff" + bytes(20), b"\x81\xa1k\xdb\x00\x10\x00\x00abc"))


def frames(n: int, seed: int) -> Iterator[bytes]:
    """``n`` generated payloads."""
    rng = random.Random(seed)
    seq = 0
    for _ in range(n):
        seq += rng.choice((1, 1, 1, 0, -3, 10**6))  # mostly in order; duplicates, reordering, jumps
        seq = max(seq, 0)
        roll = rng.random()
        if roll < 0.15:
            yield rng.randbytes(rng.randrange(64))
        elif roll < 0.20:
            yield _header_lies(rng)
        elif roll < 0.45:
            yield msgpack.packb(_valid(rng, seq), use_bin_type=True)
        else:
            try:
                yield msgpack.packb(_spoil(rng, _valid(rng, seq)), use_bin_type=True)
            except (ValueError, OverflowError):  # msgpack will not pack it: then neither can a sender
                yield rng.randbytes(8)


def rss_mb() -> float:
    return float(psutil.Process().memory_info().rss) / 2**20


def fuzz(n: int, seed: int = 0, batch: int = 500, report_every: int = 100_000) -> dict[str, Any]:
    """Run ``n`` frames through the decoder and a pipeline; crashes, rejections and RSS along the way."""
    pipeline = Pipeline(window=120)
    crashes: list[str] = []
    decoded = 0
    rss = [rss_mb()]
    started = time.perf_counter()
    pending: list[RawFrame] = []
    for i, payload in enumerate(frames(n, seed), 1):
        try:
            wire.decode(payload)
            decoded += 1
        except wire.WireError:
            pass
        except Exception as exc:  # noqa: BLE001 - what the fuzzer is looking for
            crashes.append(f"decode: {type(exc).__name__}: {exc}"[:200])
        pending.append(RawFrame(i * 1_000_000, payload))
        if len(pending) >= batch:
            try:
                pipeline.feed(pending)
                if i % (batch * 10) == 0:
                    pipeline.snapshot()
            except Exception as exc:  # noqa: BLE001
                crashes.append(f"pipeline: {type(exc).__name__}: {exc}"[:200])
            pending = []
        if i % report_every == 0:
            rss.append(rss_mb())
            print(f"{i:>9} frames  {time.perf_counter() - started:7.1f} s  RSS {rss[-1]:7.1f} MB  "
                  f"rejected {pipeline.rejected}  crashes {len(crashes)}", flush=True)
    pipeline.feed(pending)
    pipeline.finish()
    pipeline.snapshot()
    rss.append(rss_mb())
    return {"frames": n, "decoded": decoded, "rejected": pipeline.rejected, "crashes": crashes,
            "analysed": len(pipeline.analyses()), "rss_mb": rss, "seconds": time.perf_counter() - started}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    result = fuzz(args.frames, args.seed, report_every=max(1, args.frames // 10))
    rss = result["rss_mb"]
    print(f"frames {result['frames']}  decoded {result['decoded']}  rejected by the pipeline {result['rejected']}  "
          f"analysed {result['analysed']}  crashes {len(result['crashes'])}  {result['seconds']:.0f} s")
    print(f"RSS: start {rss[0]:.1f} MB, after 10 % {rss[1]:.1f} MB, end {rss[-1]:.1f} MB")
    for crash in result["crashes"][:10]:
        print("crash:", crash)
    return 1 if result["crashes"] else 0


if __name__ == "__main__":
    sys.exit(main())
