"""dagtop and the tools around it: PyTorch-profiler traces in (``dagtop import``), Chrome/Perfetto traces out
(``dagtop export``), Prometheus metrics served while collecting (``--metrics-port``)."""
