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
