"""dagtop: the live cross-rank critical path of distributed training."""

__version__ = "0.1.0"
