"""dagtop's Textual user interface: reads the model's immutable snapshots, nothing else."""
