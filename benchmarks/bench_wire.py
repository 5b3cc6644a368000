"""Wire version 2 against version 1: events decoded per second on one core, and what encoding costs a rank.

    python benchmarks/bench_wire.py [--events 30 400 4000] [--frames 64]

For each frame size, ``--frames`` ranks' ``iter`` frames of a synthetic WFBP job (dagtop/model/synthetic.py), the
same events encoded both ways: version 1 (a list per event) and version 2 (a column per field). "decode" is
``wire.decode`` of all of them, validation included, best of 7 (noise only ever adds); "encode" is what the
rank's publisher thread pays per frame, ``wire.encode_iteration`` from the shim's 7-tuples (version 1: the same
map packed with the events as rows, as the shim did).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import msgpack

from dagtop.model.synthetic import SyntheticJob, synthetic_frames
from instrument import wire


def _best_s(fn: Callable[[], Any], repeat: int = 7) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _v1(batch: wire.IterationBatch) -> bytes:
    return msgpack.packb({"v": 1, "k": "iter", "seq": batch.seq, "rank": batch.rank, "it": batch.iteration,
                          "ev": [tuple(e) for e in batch.events], "dropped": batch.dropped}, use_bin_type=True)


def row(events: int, ranks: int) -> None:
    blocks = max(1, (events - 3 - 4) // 2)
    job = SyntheticJob(ranks=ranks, blocks=blocks, buckets=4)
    batches = [b for f in synthetic_frames(job, iterations=1, hello=False)
               if isinstance(b := wire.decode(f.payload), wire.IterationBatch)]
    total = sum(len(b.events) for b in batches)
    v1 = [_v1(b) for b in batches]
    v2 = [wire.encode_iteration(b.seq, b.rank, b.iteration, b.events, b.dropped) for b in batches]
    assert [wire.decode(p) for p in v1] == [wire.decode(p) for p in v2]
    d1 = _best_s(lambda: [wire.decode(p) for p in v1])
    d2 = _best_s(lambda: [wire.decode(p) for p in v2])
    rows = [[tuple(e) for e in b.events] for b in batches]
    e1 = _best_s(lambda: [msgpack.packb({"v": 1, "k": "iter", "seq": 0, "rank": 0, "it": 0, "ev": r, "dropped": 0},
                                        use_bin_type=True) for r in rows])
    e2 = _best_s(lambda: [wire.encode_iteration(0, 0, 0, r, 0) for r in rows])
    per = total / len(batches)
    print(f"{per:>7.0f} {len(batches):>6} {total / d1 / 1e6:>9.2f} {total / d2 / 1e6:>9.2f} {d1 / d2:>7.1f}x"
          f" {e1 / len(rows) * 1e6:>9.0f} {e2 / len(rows) * 1e6:>9.0f} {sum(map(len, v1)) / sum(map(len, v2)):>8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, nargs="+", default=[30, 400, 4000], help="events per frame (about)")
    parser.add_argument("--frames", type=int, default=64, help="frames (ranks) decoded per measurement")
    args = parser.parse_args()
    print(f"{'events':>7} {'frames':>6} {'v1 Mev/s':>9} {'v2 Mev/s':>9} {'v2/v1':>8} {'v1 enc µs':>9} "
          f"{'v2 enc µs':>9} {'v1/v2 B':>8}")
    for events in args.events:
        row(events, args.frames)
    print("Mev/s: million events decoded (and validated) per second on one core; enc µs: encoding one frame on the\n"
          "rank's publisher thread; v1/v2 B: bytes of version 1 over version 2.")


if __name__ == "__main__":
    main()
