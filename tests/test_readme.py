"""README.md's two commands: CI must run the test command exactly as the README gives it; its sample output and the
screenshots are what the code prints and draws now."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(.*?)\n```", text, flags=re.DOTALL)


def test_ci_runs_the_readme_test_command() -> None:
    test_commands = [c for c in _readme_commands() if "pytest" in c]
    assert len(test_commands) == 1, test_commands
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_commands[0] in ci_lines


def test_readme_demo_command_installs_cpu_torch_before_the_project() -> None:
    demo = [c for c in _readme_commands() if "dagtop demo" in c]
    assert demo, "README lost its demo command"
    command = demo[0]
    assert command.index("torch==2.13.0") < command.index("pip install -e")


def _script(name: str) -> ModuleType:
    """A module of scripts/, imported as the command runs it."""
    spec = importlib.util.spec_from_file_location(f"scripts_{name}", ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_sample_output_is_what_the_code_prints() -> None:
    """README.md's `dagtop report` sample is written by scripts/readme_samples.py; a change to the report that
    leaves it stale fails here (run the script)."""
    samples = _script("readme_samples")
    text = (ROOT / "README.md").read_text()
    assert len(list(samples.SAMPLE.finditer(text))) >= 1, "README.md lost its sample block"
    assert samples.stale(text) == []
    assert samples.stale(text.replace("exposed per iteration", "exposed each iteration"))  # the check can fail


def test_screenshots_are_what_the_code_draws() -> None:
    """screenshots/*.svg are drawn again from the fixtures and compared as text; each PNG carries the hash of the
    SVG it was rendered from. Stale: run python scripts/export_screenshots.py --png."""
    shots = _script("export_screenshots")
    assert shots.stale(ROOT / "screenshots") == []
    for name in shots.SHOTS:  # a replay never shows the monitor's own machine (README, the telemetry panel)
        assert "this host (monitor)" not in (ROOT / "screenshots" / f"{name}.svg").read_text().replace("&#160;", " ")
