"""The shim's settings from the environment: every ``DAGTOP_*`` variable a training rank reads, read here only.

One rule for a switch (:func:`switch`): unset or empty is the default; ``0``, ``false``, ``no``, ``off`` (any case)
are off; anything else is on. Stdlib only, and nothing is read at import: :func:`read` takes the environment as it
is when it is called (``attach()`` calls it), so that a test or a launcher may set a variable before attaching.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from instrument.wire import DEFAULT_ENDPOINT

DISABLE: Final = "DAGTOP_DISABLE"
"""On: ``attach()`` returns a :class:`~instrument.ranktracer.NullTracer` and integrations touch nothing."""
ENDPOINT: Final = "DAGTOP_ENDPOINT"
"""Where the monitor listens, when ``attach()`` is given no endpoint."""
HEARTBEAT: Final = "DAGTOP_HEARTBEAT"
"""Off: no heartbeat frames (where the rank is, every second); on by default."""
TELEMETRY: Final = "DAGTOP_TELEMETRY"
"""Off: no host and GPU telemetry frames (every 2 s); on by default."""
AUTH: Final = "DAGTOP_AUTH"
"""A directory made by ``dagtop keygen``: the rank reads ``rank.key_secret`` and ``monitor.key`` there (CURVE)."""

_OFF: Final = frozenset({"0", "false", "no", "off"})


def switch(environ: Mapping[str, str], name: str, default: bool) -> bool:
    """The switch ``name`` in ``environ`` by the one rule above.

    >>> switch({"DAGTOP_DISABLE": "1"}, DISABLE, False), switch({"DAGTOP_DISABLE": "Off"}, DISABLE, True)
    (True, False)
    >>> switch({}, HEARTBEAT, True), switch({"DAGTOP_HEARTBEAT": ""}, HEARTBEAT, True)
    (True, True)
    """
    value = environ.get(name, "").strip()
    if not value:
        return default
    return value.lower() not in _OFF


@dataclass(frozen=True, slots=True)
class Settings:
    """What the environment asks of the shim (see each variable's name above)."""

    disabled: bool = False
    endpoint: str = DEFAULT_ENDPOINT
    heartbeat: bool = True
    telemetry: bool = True
    auth: str = ""
    """The key directory, empty without CURVE."""


def read(environ: Mapping[str, str] = os.environ) -> Settings:
    """The settings the environment holds now."""
    return Settings(
        disabled=switch(environ, DISABLE, False),
        endpoint=environ.get(ENDPOINT, "").strip() or DEFAULT_ENDPOINT,
        heartbeat=switch(environ, HEARTBEAT, True),
        telemetry=switch(environ, TELEMETRY, True),
        auth=environ.get(AUTH, ""),
    )
