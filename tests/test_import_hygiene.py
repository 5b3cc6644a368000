"""Layering: the model never imports the UI, and the wire schema never starts the shim, so each stays usable alone."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Collector
from ranks import run_job

from instrument import wire


def _modules_after(statement: str) -> set[str]:
    code = f"{statement}\nimport sys\nprint('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return set(out.split())


def test_model_layer_does_not_import_textual_or_rich() -> None:
    loaded = _modules_after("import dagtop.model.pipeline, dagtop.model.synthetic, dagtop.commands.report")
    assert not {"textual", "rich"} & loaded, sorted({"textual", "rich"} & loaded)


def test_the_shim_and_its_telemetry_stay_within_stdlib_pyzmq_and_msgpack() -> None:
    """A rank reads /proc itself rather than import psutil, and loads NVML only for a GPU rank, on its thread."""
    loaded = _modules_after(
        "import instrument, instrument.publisher, instrument.telemetry as t, time\n"
        "got = []\n"
        "th = t.TelemetryThread(got.append, rank=0, local_rank=0, host='h', cuda_index=None, first_after_s=0.0)\n"
        "time.sleep(0.2); th.close(); assert got, 'no sample'")
    banned = {m for m in loaded if m.split(".")[0] in {"dagtop", "networkx", "textual", "rich", "psutil", "pynvml",
                                                       "torch"}}
    assert not banned, sorted(banned)


_MONITOR_ONLY = {"dagtop", "numpy", "networkx", "textual", "rich", "psutil"}


def test_the_schema_loads_without_the_shims_machinery() -> None:
    """The monitor imports the wire schema; that must not start the shim (torch, zmq, the tracer, its fork hook)."""
    loaded = _modules_after("import instrument.wire, instrument.events")
    shim = {m for m in loaded if m.split(".")[0] in {"torch", "zmq"}
            or m in {"instrument.tracer", "instrument.publisher", "instrument.timing", "instrument.telemetry"}}
    assert not shim, sorted(shim)
    assert {m for m in loaded if m.startswith("instrument")} == {
        "instrument", "instrument.events", "instrument.schema", "instrument.wire", "instrument.wire_events",
        "instrument.wire_fields"}
    assert not {m for m in loaded if m.split(".")[0] in _MONITOR_ONLY}


_SHIM_BASE = "import torch, torch.distributed.algorithms.ddp_comm_hooks.default_hooks, zmq, msgpack"
_INTEGRATIONS = {"hf": "transformers.trainer", "lightning": "lightning.pytorch"}
"""instrument.X → the framework it imports: the user's choice, made by importing instrument.X and nothing else."""


def test_no_module_of_the_shim_imports_the_monitor_or_its_libraries() -> None:
    """Every module of instrument/ at once (instrument.cuda needs a CUDA build of torch, and imports nothing more),
    the framework integrations aside: without them, no framework is imported.

    torch itself loads numpy (and pynvml): only what the shim adds to torch, pyzmq and msgpack counts.
    """
    loaded = _modules_after(
        "import importlib, pkgutil, instrument\n"
        "for m in pkgutil.iter_modules(instrument.__path__):\n"
        f"    if m.name != 'cuda' and m.name not in {sorted(_INTEGRATIONS)}:\n"
        "        importlib.import_module('instrument.' + m.name)")
    assert "instrument.tracer" in loaded and "instrument.comm" in loaded  # the loop did import them
    own = loaded - _modules_after(_SHIM_BASE)
    banned = {m for m in own if m.split(".")[0] in _MONITOR_ONLY}
    assert not banned, sorted(banned)
    frameworks = {m.split(".")[0] for m in loaded} & {"transformers", "accelerate", "lightning", "pytorch_lightning"}
    assert not frameworks, sorted(frameworks)


@pytest.mark.parametrize("integration", sorted(_INTEGRATIONS))
def test_an_integration_adds_nothing_of_the_monitor_to_its_framework(integration: str) -> None:
    """What a framework loads (accelerate loads psutil) is the framework's; what instrument.X adds to it counts."""
    framework = _INTEGRATIONS[integration]
    if importlib.util.find_spec(framework.split(".")[0]) is None:
        pytest.skip(f"{framework} is not installed")
    own = _modules_after(f"import instrument.{integration}") - _modules_after(f"{_SHIM_BASE}, {framework}")
    banned = {m for m in own if m.split(".")[0] in _MONITOR_ONLY}
    assert not banned, sorted(banned)


def test_the_package_still_offers_attach_and_the_tracers() -> None:
    """`from instrument import Tracer` works as before; the names are served on first use (PEP 562)."""
    out = subprocess.run(
        [sys.executable, "-c",
         ("import sys, instrument\n"
         "assert 'instrument.tracer' not in sys.modules\n"
         "from instrument import DEFAULT_ENDPOINT, NullTracer, Tracer, attach\n"
         "import instrument.ranktracer as r, instrument.tracer as t, instrument.wire as w\n"
         "assert (Tracer, NullTracer, DEFAULT_ENDPOINT) == (t.Tracer, r.NullTracer, w.DEFAULT_ENDPOINT)\n"
         "assert w.DEFAULT_ENDPOINT == 'tcp://127.0.0.1:5555'\n"
         "assert {'attach', 'Tracer', 'NullTracer', 'DEFAULT_ENDPOINT'} <= set(dir(instrument))\n"
         "try:\n"
         "    instrument.Nothing\n"
         "except AttributeError as exc:\n"
         "    print(exc)\n")],
        check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "module 'instrument' has no attribute 'Nothing'"


_BLOCKER = """
import importlib.abc, sys
BLOCKED = {blocked!r}
class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked: not in the training environment)")
        return None
sys.meta_path.insert(0, _Absent())
"""
"""A sitecustomize that makes the monitor's libraries absent, as in a training image with only torch, pyzmq and
msgpack (and numpy, which torch may bring)."""


@pytest.mark.slow
def test_a_training_environment_without_the_monitors_libraries_runs_the_shim(tmp_path: Path, endpoint: str) -> None:
    """README's install note: the shim needs only pyzmq and msgpack beside torch. A real 2-rank job, its ranks
    unable to import textual, rich, psutil, prometheus_client, ijson or dagtop itself, trains timed (networkx
    and numpy stay: torch itself requires networkx, and may bring numpy)."""
    blocked = sorted((_MONITOR_ONLY - {"numpy", "networkx"}) | {"prometheus_client", "ijson"})  # torch needs networkx
    (tmp_path / "sitecustomize.py").write_text(_BLOCKER.format(blocked=blocked))
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])}
    probe = subprocess.run([sys.executable, "-c", "import textual"], env={**os.environ, **env}, capture_output=True,
                           text=True)
    assert probe.returncode != 0 and "blocked" in probe.stderr  # the blocker works in a child
    collector = Collector(endpoint)
    try:
        run = run_job("loops.py", "--mode", "plain", "--steps", "4", endpoint=endpoint, env=env)
        assert run.ok and "Traceback" not in run.log and "disabled itself" not in run.log, run.log[-3000:]
        frames = collector.until_bye(2)
    finally:
        collector.stop()
    batches = [f for f in (wire.decode(r.payload) for r in frames) if isinstance(f, wire.IterationBatch)]
    assert {b.rank for b in batches} == {0, 1} and len(batches) >= 6
