"""README.md's two commands: CI must run the test command exactly as the README gives it."""

from __future__ import annotations

import re
from pathlib import Path

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
