"""How frames get in and out of the monitor: ZeroMQ and recording sources, recordings on disk, the relay, CURVE
keys, the monitor's own telemetry and crash-safe output files. Below the UI and commands, above the model."""
