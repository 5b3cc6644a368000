"""One rank's publisher alone (no training): hands ``--iterations`` iterations of ``--events`` tasks over at once,
faster than a slow link carries them, then closes, giving the publisher ``--close-s`` to pass them on. For the test
that a closing rank's last frames are not dropped while the link still carries them; with ``--after PATH``, it
hands them over once that file exists (the test has cut the link meanwhile)."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from instrument import wire
from instrument.publisher import Publisher


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("endpoint")
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--events", type=int, default=100)
    parser.add_argument("--close-s", type=float, default=30.0)
    parser.add_argument("--after", type=Path)
    args = parser.parse_args()

    def hello(seq: int) -> wire.Hello:
        return wire.Hello(seq, 0, 1, 0, "burst", os.getpid(), "cpu", "t", "M", 1, "block", time.time_ns(),
                          time.perf_counter_ns())

    publisher = Publisher(args.endpoint, 0, hello, on_error=lambda exc: print(f"burst: {exc!r}", flush=True))
    deadline = time.monotonic() + 120
    while args.after is not None and not args.after.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    now = time.perf_counter_ns()
    events = [("compute", "forward", f"model.layer{i}", "main", now + i, now + i + 5, 0) for i in range(args.events)]
    for iteration in range(args.iterations):
        publisher.put_iteration(iteration, events)
    began = time.monotonic()
    publisher.close(timeout_s=args.close_s)
    print(f"burst: closed in {time.monotonic() - began:.2f} s, {publisher.dropped} dropped", flush=True)


if __name__ == "__main__":
    main()
