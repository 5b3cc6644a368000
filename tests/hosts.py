"""Two hosts on one machine, for the tests and the benchmarks that need a real network between ranks.

Each host is a network namespace (``ip netns``) with one end of a veth pair, on a /24 of its own; a command run on
it may also get its own hostname (a UTS namespace) and a CLOCK_MONOTONIC some seconds away from the machine's (a
time namespace, ``unshare --time --monotonic``). Used by tests/test_hosts.py (clocks apart),
benchmarks/validate_network.py and benchmarks/validate_advice.py (a link shaped by ``tc``). Needs root.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Host:
    netns: str
    """Its network namespace; empty for the machine's own (:func:`host_beside`)."""
    link: str
    """Its end of the veth pair (``GLOO_SOCKET_IFNAME``, ``tc``'s device)."""
    address: str
    hostname: str

    def command(self, argv: list[str], clock_offset_s: int | None = None) -> list[str]:
        """``argv`` run in this host's network namespace (as it is on the machine's own, ``netns`` empty); with
        ``clock_offset_s``, also under its own hostname with its monotonic clock that many seconds ahead of the
        machine's."""
        if not self.netns:
            return argv
        netns = ["ip", "netns", "exec", self.netns]
        if clock_offset_s is None:
            return [*netns, *argv]
        inner = f'hostname {self.hostname} && exec "$@"'
        return [*netns, "unshare", "--uts", "--time", "--fork", "--monotonic", str(clock_offset_s),
                "sh", "-c", inner, "sh", *argv]


def why_not_here(*tools: str, time_namespaces: bool = False) -> str | None:
    """Why two hosts cannot be made on this machine (with ``tools`` on the path besides ``ip``), or None."""
    if os.geteuid() != 0:
        return "needs root for network namespaces"
    for tool in ("ip", *tools, *(["unshare"] if time_namespaces else [])):
        if shutil.which(tool) is None:
            return f"no `{tool}` on this machine"
    if time_namespaces:
        probe = subprocess.run(["unshare", "--time", "--fork", "--monotonic", "1", "true"], capture_output=True)
        if probe.returncode != 0:
            return f"time namespaces not permitted: {probe.stderr.decode(errors='replace').strip()}"
    name = f"dtprobe{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True)
    if made.returncode != 0:
        return f"network namespaces not permitted: {made.stderr.decode(errors='replace').strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextmanager
def two_hosts(third_octet: int = 7) -> Iterator[tuple[Host, Host]]:
    """Hosts ``host-a`` at 10.N.``third_octet``.1 and ``host-b`` at .2, N picked at random; both torn down on
    exit (deleting a namespace deletes its end of the veth pair, and so the pair)."""
    tag = uuid.uuid4().hex[:6]
    net = 10 + int(tag[:2], 16) % 200
    a = Host(f"dtA{tag}", f"va{tag}", f"10.{net}.{third_octet}.1", "host-a")
    b = Host(f"dtB{tag}", f"vb{tag}", f"10.{net}.{third_octet}.2", "host-b")
    made: list[str] = []
    try:
        for host in (a, b):
            _ip("netns", "add", host.netns)
            made.append(host.netns)
        _ip("link", "add", a.link, "type", "veth", "peer", "name", b.link)
        for host in (a, b):
            _ip("link", "set", host.link, "netns", host.netns)
            _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", host.link)
            _ip("-n", host.netns, "link", "set", host.link, "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")
        yield a, b
    finally:
        for name in made:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


@contextmanager
def host_beside(third_octet: int = 11) -> Iterator[tuple[Host, Host]]:
    """The machine itself (``netns`` empty) at 10.N.``third_octet``.1 and a host in a namespace at .2, joined by a
    veth pair: a process of the machine's (a monitor) reaches both. Torn down on exit."""
    tag = uuid.uuid4().hex[:6]
    net = 10 + int(tag[:2], 16) % 200
    here = Host("", f"vh{tag}", f"10.{net}.{third_octet}.1", "")
    there = Host(f"dtT{tag}", f"vt{tag}", f"10.{net}.{third_octet}.2", "host-b")
    _ip("netns", "add", there.netns)
    try:
        _ip("link", "add", here.link, "type", "veth", "peer", "name", there.link)
        _ip("link", "set", there.link, "netns", there.netns)
        _ip("addr", "add", f"{here.address}/24", "dev", here.link)
        _ip("link", "set", here.link, "up")
        _ip("-n", there.netns, "addr", "add", f"{there.address}/24", "dev", there.link)
        _ip("-n", there.netns, "link", "set", there.link, "up")
        _ip("-n", there.netns, "link", "set", "lo", "up")
        yield here, there
    finally:
        subprocess.run(["ip", "netns", "del", there.netns], capture_output=True)  # and with it the pair


def shape(hosts: tuple[Host, Host], mbit: float) -> None:
    """Both directions of the link at ``mbit`` Mbit/s (a token bucket on each end's egress)."""
    for host in hosts:
        subprocess.run(host.command(["tc", "qdisc", "replace", "dev", host.link, "root", "tbf", "rate",
                                     f"{mbit:g}mbit", "burst", "512kb", "latency", "200ms"]),
                       check=True, capture_output=True)
