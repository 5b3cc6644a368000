"""dagtop's model layer: events → per-iteration DAG → critical path → what-if (networkx; no UI)."""
