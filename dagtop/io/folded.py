"""A recording folded whole into the model's pipeline: what ``report``, ``advise``, ``export`` and the benchmarks read."""

from __future__ import annotations

from dagtop.io.recording import RecordingReader
from dagtop.model.pipeline import Pipeline


def load(path: str, bandwidth_gbps: float | None = None) -> tuple[Pipeline, bool]:
    """Fold a whole recording into a pipeline with an unbounded window; (pipeline, tail cut short)."""
    reader = RecordingReader(path)
    pipeline = Pipeline(window=None, bandwidth_gbps=bandwidth_gbps)
    batch = []
    for frame in reader:
        batch.append(frame)
        if len(batch) >= 1000:
            pipeline.feed(batch)
            batch = []
    pipeline.feed(batch)
    pipeline.finish()
    return pipeline, reader.truncated
