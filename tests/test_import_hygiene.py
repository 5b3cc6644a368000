"""Layering: the model never imports the UI, so it stays usable as a library and testable alone."""

from __future__ import annotations

import subprocess
import sys


def _modules_after(statement: str) -> set[str]:
    code = f"{statement}\nimport sys\nprint('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return set(out.split())


def test_model_layer_does_not_import_textual_or_rich() -> None:
    loaded = _modules_after("import dagtop.model.pipeline, dagtop.model.synthetic, dagtop.report")
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
