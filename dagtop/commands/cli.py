"""The ``dagtop`` command: parses arguments and hands over to the module that does the work."""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from dagtop import __version__
from dagtop.exits import Exit, table
from instrument.wire import DEFAULT_ENDPOINT

_N = TypeVar("_N", int, float)

BOTTLENECKS = ("none", "io", "compute", "allreduce", "pcie")
NICE_ENV = "DAGTOP_NICE"
"""Niceness the monitor takes when ``--nice`` is not given."""
DEFAULT_NICE = 10
"""The monitor runs beside training: it lowers its own CPU priority by this much unless told otherwise."""
NICED_COMMANDS = (None, "record", "replay")
"""Commands that lower their priority: not ``demo``, whose ranks (its children) would inherit it."""
_DOTTED_QUAD = re.compile(r"\d+\.\d+\.\d+\.\d+")
"""A host written as an IPv4 address, valid or not."""


def _iteration_range(text: str) -> tuple[int | None, int | None]:
    start, sep, stop = text.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError("expected A:B, A: or :B")
    try:
        lo, hi = (int(start) if start else None, int(stop) if stop else None)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an iteration range: {text!r}") from None
    if lo is not None and hi is not None and lo >= hi:
        if lo == hi:
            raise argparse.ArgumentTypeError(f"{text} is empty: A:B is iterations A to B-1 ({lo}:{lo + 1} for "
                                             f"iteration {lo} alone)")
        raise argparse.ArgumentTypeError(f"{text} is reversed: A:B is iterations A to B-1, A below B "
                                         f"(did you mean {hi}:{lo}?)")
    return lo, hi


def _endpoint(text: str) -> str:
    """A ZeroMQ endpoint to bind: tcp://HOST:PORT (port 1-65535), ipc://PATH or inproc://NAME."""
    scheme, sep, rest = text.partition("://")
    if not sep or scheme not in ("tcp", "ipc", "inproc") or not rest:
        raise argparse.ArgumentTypeError(f"not an endpoint: {text!r} (expected tcp://HOST:PORT, e.g. {DEFAULT_ENDPOINT})")
    if scheme == "tcp":
        host, colon, port = rest.rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise argparse.ArgumentTypeError(f"not an endpoint: {text!r} (expected tcp://HOST:PORT, PORT from 1 to 65535)")
        if _DOTTED_QUAD.fullmatch(host):  # ZeroMQ would take it for an interface's name: "No such device"
            try:
                ipaddress.IPv4Address(host)
            except ValueError:
                raise argparse.ArgumentTypeError(f"not an endpoint: {text!r} ({host} is not an IPv4 address: "
                                                 f"each of its four numbers is 0 to 255)") from None
    return text


def _number(text: str, kind: Callable[[str], _N], what: str) -> _N:
    """``text`` as ``kind`` (int or float), else the one line naming ``what`` it is not."""
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None


def _ranged(name: str, kind: Callable[[str], _N], what: str, ok: Callable[[_N], bool], message: str,
            ) -> Callable[[str], _N]:
    """An argparse ``type=`` checker: the text read as ``kind`` (else "not ``what``"), refused unless ``ok``.

    Args:
        name: the checker's ``__name__`` (argparse's ``%(type)s``), the name it is bound to.
        message: formatted with ``value`` (the number) and ``text`` (as typed) when ``ok`` says no.
    """

    def check(text: str) -> _N:
        value = _number(text, kind, what)
        if not ok(value):
            raise argparse.ArgumentTypeError(message.format(value=value, text=text))
        return value

    check.__name__ = check.__qualname__ = name
    return check


_count = _ranged("_count", int, "a whole number", lambda n: n >= 1, "must be at least 1, not {value}")
"""A whole number of at least 1 (ranks, iterations)."""
_niceness = _ranged("_niceness", int, "a whole number", lambda n: 0 <= n <= 19, "must be from 0 to 19, not {value}")
"""How much to lower the monitor's priority: 0 (not at all) to 19 (the least CPU when others want it)."""
_speed = _ranged("_speed", float, "a number", lambda x: x >= 0,  # NaN fails every comparison: refused
                 "must be 0 (as fast as possible) or more, not {text}")
"""Replay speed: 0 (as fast as possible) or more."""
_refresh = _ranged("_refresh", float, "a number of seconds", lambda s: 0.05 <= s <= 60,
                   "must be from 0.05 to 60 seconds, not {text}")
"""Seconds between redraws of the screen, like htop's ``-d``: 0.05 (20 a second) to 60."""
_bandwidth = _ranged("_bandwidth", float, "a bandwidth in GB/s", lambda gbps: 0 < gbps < float("inf"),
                     "must be above 0 GB/s, not {text}")
"""A bus bandwidth in GB/s (bytes: 100 Gb/s Ethernet is 12.5), above 0."""
_price = _ranged("_price", float, "a price", lambda usd: 0 <= usd < float("inf"),
                 "{text!r} is not a price: a number of dollars, 0 or more")
"""Dollars per GPU-hour: 0 or more, finite."""


def _metrics_address(text: str) -> tuple[str, int]:
    """``PORT`` (every interface) or ``HOST:PORT`` for the Prometheus endpoint."""
    from dagtop.interop.metrics import parse_address

    try:
        return parse_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _output_file(text: str) -> str:
    """A recording to write: checked before anything binds or starts, so a typo costs nothing."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; name a file in it, e.g. {path / 'run.dagtop'}")
    parent = path.parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text}: {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text}: {parent} is not writable")
    return text


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's, except that the epilog's table keeps a line per exit status, each meaning wrapped under itself."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" not in text:  # the description: one paragraph, filled as argparse does
            return super()._fill_text(text, width, indent)
        return "\n".join(textwrap.fill(line, width, initial_indent=indent, subsequent_indent=indent + " " * 5)
                         for line in text.splitlines())


def _exit_statuses() -> str:
    return "exit status:\n" + "\n".join(f"{number:<4} {meaning}" for number, _, meaning in table())


def _cost_options(p: argparse.ArgumentParser, **kw: Any) -> None:
    """The options the advice prices its changes with (fix against buy)."""
    p.add_argument("--gpu-hour-price", type=_price, metavar="USD", **kw,
                   help="dollars per GPU-hour: the advice prices an epoch now, with each change and with more GPUs")
    p.add_argument("--epoch-samples", type=_count, metavar="N", **kw,
                   help="samples per epoch (default: the DataLoader's length, where the ranks time it)")
    p.add_argument("--batch-size", type=_count, metavar="B", **kw,
                   help="samples per rank per step, for --epoch-samples (default: the DataLoader's batch_size)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dagtop",
        description="Live cross-rank critical path of distributed training. "
        "With no command: collect from every rank and show the live screen.",
        epilog=_exit_statuses(),
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"dagtop {__version__}")
    parser.add_argument("--bind", type=_endpoint, default=DEFAULT_ENDPOINT,
                        help="endpoint the ranks publish to (default %(default)s)")
    parser.add_argument("--ranks", type=_count, default=None, help="ranks to expect (default: from the ranks' hello)")
    parser.add_argument("--auth", default=None, metavar="DIR",
                        help="take only ranks holding the rank key of `dagtop keygen DIR` (CURVE; ranks: DAGTOP_AUTH=DIR)")
    parser.add_argument("--metrics-port", type=_metrics_address, default=None, metavar="[HOST:]PORT",
                        help="serve Prometheus metrics there (docs/metrics.md)")
    parser.add_argument("--nice", type=_niceness, default=None, metavar="N",
                        help=f"lower the monitor's CPU priority by N, 0 to 19 (default ${NICE_ENV}, else "
                             f"{DEFAULT_NICE}; 0: leave it), so it yields to training on a shared host")
    parser.add_argument("--refresh", type=_refresh, default=1.0, metavar="S",
                        help="seconds between redraws (default %(default)s; e.g. 0.25 for 4 a second, at more CPU)")
    bandwidth_help = ("the bus bandwidth, GB/s, of the `network bandwidth` what-if (bytes: 100 Gb/s Ethernet is "
                      "12.5; default twice the one fitted on the job's collectives)")
    parser.add_argument("--bandwidth", type=_bandwidth, default=None, metavar="GBPS", help=bandwidth_help)
    _cost_options(parser, default=None)
    sub = parser.add_subparsers(dest="command")

    rec = sub.add_parser("record", help="collect headless into a recording")
    # The options `dagtop` itself takes are taken after `record` too. Their defaults are the top-level parser's
    # (SUPPRESS): a subparser's own default would overwrite `dagtop --auth DIR record`'s DIR with None.
    shared: dict[str, Any] = {"default": argparse.SUPPRESS}
    rec.add_argument("--bind", type=_endpoint, **shared, help=f"endpoint to bind (default {DEFAULT_ENDPOINT})")
    rec.add_argument("-o", "--output", type=_output_file, required=True, help="recording to write")
    rec.add_argument("--iterations", type=_count, default=None,
                     help="stop once N iterations are complete on every rank")
    rec.add_argument("--timeout", type=float, default=None, help="give up after S seconds with nothing received")
    rec.add_argument("--ranks", type=_count, **shared, help="ranks to expect (default: from the ranks' hello)")
    rec.add_argument("--auth", **shared, metavar="DIR",
                     help="take only ranks holding the rank key of `dagtop keygen DIR` (CURVE; ranks: DAGTOP_AUTH=DIR)")
    rec.add_argument("--metrics-port", type=_metrics_address, **shared, metavar="[HOST:]PORT",
                     help="serve Prometheus metrics there while recording (docs/metrics.md)")
    rec.add_argument("--nice", type=_niceness, **shared, metavar="N",
                     help=f"lower the recorder's CPU priority by N, 0 to 19 (default ${NICE_ENV}, else {DEFAULT_NICE})")
    _cost_options(rec, **shared)

    rep = sub.add_parser("report", help="summarise a recording: bottleneck, straggler, critical path, what-if")
    rep.add_argument("file", help="a recording made by `dagtop record` or `dagtop demo --record`")
    rep.add_argument("--json", action="store_true", help="print JSON (schema in docs/report.md)")
    rep.add_argument("--iterations", type=_iteration_range, default=None, metavar="A:B", help="analyse iterations A..B-1")
    rep.add_argument("--bandwidth", type=_bandwidth, **shared, metavar="GBPS", help=bandwidth_help)
    _cost_options(rep, **shared)

    adv = sub.add_parser("advise", help="what to change in a recorded job, ranked, and what it is worth against "
                                        "buying GPUs")
    adv.add_argument("file", help="a recording made by `dagtop record` or `dagtop demo --record`")
    adv.add_argument("--json", action="store_true", help="print JSON (the `advice` object of docs/report.md)")
    adv.add_argument("--iterations", type=_iteration_range, default=None, metavar="A:B",
                     help="advise on iterations A..B-1 (default: all past warm-up)")
    adv.add_argument("--bandwidth", type=_bandwidth, **shared, metavar="GBPS", help=bandwidth_help)
    _cost_options(adv, **shared)

    kg = sub.add_parser("keygen", help="write the CURVE key pairs of the monitor and the ranks, for --auth")
    kg.add_argument("directory", metavar="DIR", help="where to write them (made if missing; never overwritten)")

    rpl = sub.add_parser("replay", help="the live screen, from a recording")
    rpl.add_argument("file")
    rpl.add_argument("--speed", type=_speed, default=1.0, help="playback speed (0: as fast as possible)")
    rpl.add_argument("--bandwidth", type=_bandwidth, **shared, metavar="GBPS", help=bandwidth_help)
    _cost_options(rpl, **shared)

    imp = sub.add_parser("import", help="PyTorch-profiler traces (one per rank) into a recording")
    imp.add_argument("traces", nargs="+", metavar="TRACE", help="a Kineto trace per rank: .json or .json.gz")
    imp.add_argument("-o", "--output", type=_output_file, required=True, help="recording to write")

    exp = sub.add_parser("export", help="a recording as a Chrome trace-event JSON (Perfetto, chrome://tracing)")
    exp.add_argument("file", help="a recording (`dagtop record`, `dagtop import`)")
    exp.add_argument("-o", "--output", type=_output_file, required=True, help="trace to write, e.g. run.trace.json")

    rly = sub.add_parser("relay", help="one per node: forward the node's ranks to the monitor (one connection)")
    rly.add_argument("--bind", type=_endpoint, default="tcp://0.0.0.0:5556",
                     help="endpoint the node's ranks publish to (DAGTOP_ENDPOINT; default %(default)s)")
    rly.add_argument("--to", type=_endpoint, required=True, help="the monitor's endpoint (its --bind)")
    rly.add_argument("--auth", default=None, metavar="DIR",
                     help="keys of `dagtop keygen DIR`: take only ranks holding the rank key, and present it "
                          "to the monitor")
    rly.add_argument("--every", type=float, default=60.0, metavar="S",
                     help="print what was forwarded and dropped every S seconds (0: at exit only)")

    demo = sub.add_parser("demo", help="run a real CPU DDP job (gloo) and watch it")
    demo.add_argument("--ranks", type=_count, default=2, help="ranks to spawn (default %(default)s)")
    demo.add_argument("--bottleneck", choices=BOTTLENECKS, default="none", help="make one category slow, for real")
    demo.add_argument("--straggler", type=int, default=None, metavar="RANK", help="make this rank slow in that category")
    demo.add_argument("--iterations", type=_count, default=None, help="iterations to run (default: until quit)")
    demo.add_argument("--record", type=_output_file, default=None, metavar="FILE",
                      help="headless: record to FILE instead of the screen")
    demo.add_argument("--bind", type=_endpoint, default=None, help="endpoint (default: a free port on 127.0.0.1)")
    demo.add_argument("--device", default="cpu", help="cpu or cuda (pcie bottleneck needs cuda)")
    demo.add_argument("--granularity", choices=("block", "layer"), default="block")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        code = _run(build_parser().parse_args(argv))
        sys.stdout.flush()  # here, where a closed pipe can still be caught
        return code
    except BrokenPipeError:  # `dagtop report run.dagtop | head`: the reader stopped early, no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nor a second error at exit
        return Exit.BROKEN_PIPE


def lower_priority(requested: int | None) -> str | None:
    """Lower this process's CPU priority by ``requested``, else by ``$DAGTOP_NICE``, else by :data:`DEFAULT_NICE`.

    Returns:
        None, or the one line to tell the user when ``$DAGTOP_NICE`` is not a niceness.
    """
    value = requested
    if value is None:
        text = os.environ.get(NICE_ENV, "").strip()
        try:
            value = _niceness(text) if text else DEFAULT_NICE
        except argparse.ArgumentTypeError as exc:
            return f"{NICE_ENV}={text}: {exc}"
    if value:
        try:
            os.nice(value)
        except OSError:  # a priority cannot be lowered here: the monitor runs as it is
            pass
    return None


def _run(args: argparse.Namespace) -> int:
    if args.command in NICED_COMMANDS:
        problem = lower_priority(getattr(args, "nice", None))
        if problem:
            print(f"dagtop: {problem}", file=sys.stderr)
            return Exit.USAGE
    # One lazy import per command, so that each loads only what it needs (`dagtop report` no Textual); written
    # out, not a table of module names, so that mypy and import-linter see every one.
    match args.command:
        case "keygen":
            from dagtop.io.auth import run_keygen as run
        case "record":
            from dagtop.commands.record import run_record as run
        case "report":
            from dagtop.commands.report import run_report as run
        case "advise":
            from dagtop.commands.advise import run_advise as run
        case "demo":
            from dagtop.demo.launch import run_demo as run
        case "import":
            from dagtop.interop.importer import run_import as run
        case "export":
            from dagtop.interop.chrome import run_export as run
        case "relay":
            from dagtop.io.relay import run_relay as run
        case "replay":
            from dagtop.ui.run import run_replay as run
        case _:
            from dagtop.ui.run import run_live as run
    return run(args)

