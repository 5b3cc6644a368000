"""Write the output of README.md's sample commands into README.md, or check that it is there as the code prints it.

A sample in README.md is a marker line naming a ``dagtop`` command, then a code block::

    <!-- sample: dagtop report dagtop/fixtures/demo-allreduce.dagtop -->
    ```
    $ dagtop report dagtop/fixtures/demo-allreduce.dagtop
    ...its output...
    ```

The command runs in this process, on the fixtures the repository holds, so the block is what a user would see.

    python scripts/readme_samples.py            # rewrite the blocks
    python scripts/readme_samples.py --check    # exit 1 and say which block is stale (tests/test_readme.py)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SAMPLE = re.compile(r"^<!-- sample: (?P<command>dagtop [^\n]*?) -->\n```\n(?P<block>.*?)^```$",
                    flags=re.MULTILINE | re.DOTALL)
"""A marker naming the command, and the code block after it."""


def output_of(command: str) -> str:
    """The block for ``command``: the command as typed, then what it prints (stdout), run from the repository root."""
    from dagtop.commands.cli import main

    out = io.StringIO()
    here = os.getcwd()
    os.chdir(ROOT)  # the command names the fixtures relative to the root, as the README reader types it
    try:
        with contextlib.redirect_stdout(out):
            code = main(shlex.split(command)[1:])
    finally:
        os.chdir(here)
    if code != 0:
        raise RuntimeError(f"{command!r} exited with {code}")
    return f"$ {command}\n{out.getvalue()}"


def render(text: str) -> str:
    """``text`` (a README) with every sample block holding its command's output."""
    return SAMPLE.sub(lambda m: f"<!-- sample: {m['command']} -->\n```\n{output_of(m['command'])}```", text)


def stale(text: str) -> list[str]:
    """The commands whose block in ``text`` is not what they print now."""
    return [m["command"] for m in SAMPLE.finditer(text) if m["block"] != output_of(m["command"])]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block is stale")
    args = parser.parse_args()
    text = README.read_text()
    if not SAMPLE.search(text):
        print("readme_samples: README.md has no sample block", file=sys.stderr)
        return 1
    if args.check:
        old = stale(text)
        for command in old:
            print(f"readme_samples: README.md's output of `{command}` is stale: run python scripts/readme_samples.py",
                  file=sys.stderr)
        return 1 if old else 0
    README.write_text(render(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
