"""The decoder and the pipeline under generated frames: never a crash, memory flat (benchmarks/fuzz_intake.py runs
the same generator over 10^6 frames)."""

from __future__ import annotations

import sys
import tracemalloc
from pathlib import Path

import msgpack
from hypothesis import given
from hypothesis import strategies as st

from dagtop.model.frames import RawFrame
from dagtop.model.pipeline import Pipeline
from instrument import wire

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
from fuzz_intake import frames, fuzz

_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=True),
                  st.text(max_size=20), st.sampled_from(["iter", "hello", "io", "main", "v", "k", "ev", "seq"]))
_VALUE = st.recursive(_LEAF, lambda inner: st.lists(inner, max_size=8) | st.dictionaries(st.text(max_size=4), inner,
                                                                                         max_size=8), max_leaves=40)


def test_ten_thousand_generated_frames_never_crash_and_memory_stays_flat() -> None:
    fuzz(2000, seed=1)  # warm up: caches, the window of analyses, interned strings
    tracemalloc.start()
    try:
        result = fuzz(10_000, seed=2)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result["crashes"] == []
    assert result["rejected"] > 1000 and result["decoded"] > 1000  # the generator reaches both sides
    assert peak < 200 * 2**20


def test_the_generator_makes_what_it_says() -> None:
    reasons = set()
    for payload in frames(3000, seed=5):
        try:
            wire.decode(payload)
        except wire.WireError as exc:
            reasons.add(str(exc).split(":")[0].split(" ")[0])
    assert {"not", "field", "event"} <= reasons


@given(st.dictionaries(st.sampled_from(["v", "k", "seq", "rank", "it", "ev", "dropped", "world", "buckets"]),
                       _VALUE, max_size=9))
def test_any_map_is_decoded_or_refused_with_a_reason(frame: dict[str, object]) -> None:
    frame.setdefault("v", 1)
    payload = msgpack.packb(frame, use_bin_type=True)
    try:
        wire.decode(payload)
    except wire.WireError as exc:
        assert str(exc)
    p = Pipeline(window=4)
    p.feed([RawFrame(0, payload)])
    p.snapshot()


@given(st.binary(max_size=200))
def test_any_bytes_are_decoded_or_refused(payload: bytes) -> None:
    try:
        wire.decode(payload)
    except wire.WireError:
        pass
