"""Every exit status a dagtop command or a demo rank ends with, in one enum, and its table for ``dagtop --help``."""

from __future__ import annotations

import inspect
import re
from enum import IntEnum

_ROW = re.compile(r"(\d+)\s+([A-Z_]+)\s+(.*)")
"""A row of :class:`Exit`'s table: number, name, meaning (a line that does not match continues the meaning)."""


class Exit(IntEnum):
    """How a dagtop command ends. Scripts and tests rely on the numbers: never renumber one. Names that share a
    number are aliases (``Exit.TIMEOUT is Exit.USAGE``), so that each ``return`` says which case it is.

    0    OK                  everything asked for was done
    1    SHORT               fewer complete iterations than asked for: the ranks finished, or the demo's
                             recording stopped, before them (record, demo --record)
    2    USAGE               a bad command line (argparse's own status), or options that do not go together
    2    CANNOT_BIND         the endpoint or the --metrics-port cannot be bound: in use, or not an address of this
                             machine (record said 1 before issue #30)
    2    BAD_INPUT           the file is missing or not a recording, or holds no iteration (in the range asked);
                             for import, a trace that is missing, cut short or has no ProfilerStep
    2    TIMEOUT             record received nothing (more) for --timeout seconds
    3    ORPHANED            a demo rank (not dagtop itself) whose dagtop died did not stop at an iteration
                             boundary in time
    4    DISK                the output cannot be written (disk full, file too large, I/O error, a folder that
                             takes no files): record stops, the frames written before staying readable; import
                             and export leave nothing of it
    5    NO_CURVE            --auth or keygen where libzmq was built without CURVE
    130  INTERRUPTED         record stopped by Ctrl-C (128 + SIGINT); what was recorded is kept
    141  BROKEN_PIPE         the reader of the output went away (128 + SIGPIPE), e.g. dagtop report | head
    """

    OK = 0
    SHORT = 1
    USAGE = 2
    CANNOT_BIND = 2
    BAD_INPUT = 2
    TIMEOUT = 2
    ORPHANED = 3
    DISK = 4
    NO_CURVE = 5
    INTERRUPTED = 130
    BROKEN_PIPE = 141


def table() -> list[tuple[int, str, str]]:
    """The rows of :class:`Exit`'s docstring, (number, name, meaning), the meaning's lines joined."""
    rows: list[tuple[int, str, str]] = []
    for line in inspect.cleandoc(Exit.__doc__ or "").split("\n\n", 1)[1].splitlines():
        row = _ROW.fullmatch(line)
        if row:
            rows.append((int(row[1]), row[2], row[3]))
        else:
            number, name, meaning = rows[-1]
            rows[-1] = (number, name, f"{meaning} {line.strip()}")
    return rows
