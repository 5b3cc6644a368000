"""The what-if changes the model answers, each with its category, its worker count and what it assumes."""

from __future__ import annotations

from dagtop.model.label import Label


class Change(Label):
    """One what-if change. The value is the label the screen, the report and its JSON use."""

    IDENTITY = "now (model)"
    ALLREDUCE_HALF = "all-reduce ×0.5"
    ALLREDUCE_DOUBLE = "all-reduce ×2"
    PERFECT_OVERLAP = "perfect overlap"
    IO_HIDDEN = "I/O hidden"
    STRAGGLER_AT_MEDIAN = "straggler at median"
    DOUBLE_WORKERS = "2N workers"
    NETWORK = "network bandwidth"

    @property
    def category(self) -> str:
        """The task category the change acts on (its colour on screen)."""
        return _CATEGORY[self]

    @property
    def workers(self) -> int:
        """How many times the job's ranks the change runs on: throughput scales by this over the iteration time."""
        return 2 if self is Change.DOUBLE_WORKERS else 1

    @property
    def doubt(self) -> str:
        """Why the prediction is of lower confidence (not validated within 10 % of a real re-run by
        benchmarks/validate_whatif.py); empty where it was."""
        return _DOUBT.get(self, "")

    @property
    def assumption(self) -> str:
        """What the change means and what the model assumes to predict it."""
        return _ASSUMPTION[self]


_CATEGORY = {
    Change.IDENTITY: "other",
    Change.ALLREDUCE_HALF: "allreduce",
    Change.ALLREDUCE_DOUBLE: "allreduce",
    Change.PERFECT_OVERLAP: "allreduce",
    Change.IO_HIDDEN: "io",
    Change.STRAGGLER_AT_MEDIAN: "other",
    Change.DOUBLE_WORKERS: "allreduce",
    Change.NETWORK: "allreduce",
}

_ASSUMPTION = {
    Change.IDENTITY: "the DAG replayed as measured: the model's own figure for this iteration",
    Change.ALLREDUCE_HALF: "every collective takes half as long (faster network, compression); compute unchanged",
    Change.ALLREDUCE_DOUBLE: "every collective takes twice as long (a slower or busier network)",
    Change.PERFECT_OVERLAP: "communication entirely hidden under computation: the most overlap can buy",
    Change.IO_HIDDEN: "data loading off the critical path (prefetching, more workers), never faster than "
                      "one batch per iteration on the slowest loader",
    Change.STRAGGLER_AT_MEDIAN: "the straggler's time in its category brought down to the other ranks' median",
    Change.DOUBLE_WORKERS: "twice the ranks, the same batch per rank (weak scaling): compute unchanged, each "
                           "collective longer by the fitted α-β ring model; throughput counts both halves",
    Change.NETWORK: "the network's bus bandwidth set to the one named (--bandwidth; default twice the fitted): "
                    "each collective's per-byte time 2(P−1)/P·M·β of the α-β fit redone at it, its latency and the "
                    "rest of its time unchanged",
}

_DOUBT = {
    Change.DOUBLE_WORKERS: "not validated: the α-β fit is extrapolated to twice the ranks, and the test machine "
                           "(2 cores) cannot run twice the ranks without measuring core sharing instead",
    Change.ALLREDUCE_DOUBLE: "not validated by a re-run (no job was made to send twice the bytes)",
    Change.PERFECT_OVERLAP: "off by 11–35 % on a job whose one 128 MB gloo all-reduce holds the path (the demo's "
                            "--bottleneck allreduce; ×2.08 predicted, ×2.98 re-run on 2026-11-28), where the re-runs "
                            "themselves spread from ×2.05 to ×4.5 on 2 shared cores; within 3–6 % on a small "
                            "transformer",
    Change.STRAGGLER_AT_MEDIAN: "off by 12 % in one of two validations, on the demo's compute straggler (×2.63 "
                                "predicted, ×2.99 re-run without dagtop, ×2.74 with it): on 2 shared cores dagtop's "
                                "own cost weighs more in the faster job; within 1 % on a small transformer; a "
                                "loader straggler on CPU cores other ranks share: ×1.60–1.72 predicted where "
                                "×1.10–1.22 was re-run (its wait left them the CPU)",
}
