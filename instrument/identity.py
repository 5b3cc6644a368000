"""A rank's job identity, as its hello says it: torchrun's run id and restart count, and where the ranks meet."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, NamedTuple

from instrument.wire_fields import MAX_JOB_CHARS, MAX_RANKS


class JobIdentity(NamedTuple):
    """Which job a rank belongs to, and which incarnation of it, as the hello says (``job``, ``master``,
    ``restart``)."""

    run_id: str
    master: str
    restart: int


def job_identity(environ: Mapping[str, str] = os.environ) -> JobIdentity:
    """The job's identity: torchrun's run id and restart count, and where the ranks meet (``MASTER_ADDR`` and
    ``MASTER_PORT``, or the default process group's TCP store when the job was initialised without them)."""
    limit = MAX_JOB_CHARS
    try:
        restart = min(max(int(environ.get("TORCHELASTIC_RESTART_COUNT", "0")), 0), MAX_RANKS)
    except ValueError:
        restart = 0
    address, port = environ.get("MASTER_ADDR", ""), environ.get("MASTER_PORT", "")
    master = f"{address}:{port}" if address and port else _store_address()
    return JobIdentity(environ.get("TORCHELASTIC_RUN_ID", "")[:limit], master[:limit], restart)


def _store_address() -> str:
    """``host:port`` of the default process group's TCP store; empty where there is none."""
    try:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d

        if not (dist.is_available() and dist.is_initialized()):
            return ""
        store: Any = distributed_c10d._get_default_store()
        while (inner := getattr(store, "underlying_store", None)) is not None:  # a PrefixStore around it
            store = inner
        host, port = getattr(store, "host", ""), getattr(store, "port", 0)  # a TCPStore's
        return f"{host}:{port}" if host and port else ""
    except Exception:  # noqa: BLE001 - a private corner of torch.distributed: without it, no address
        return ""
