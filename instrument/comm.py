"""All-reduce timing of every DDP gradient bucket, between DDP's reducer and its process group.

Why not a comm hook: a DDP comm hook replaces the reducer's built-in all-reduce. The built-in one divides each
gradient by the world size while copying it into its bucket (``at::mul_out``, one pass); with any hook the
reducer only copies, and the hook must divide the bucket in a second pass on the training thread. On a
communication-heavy job (2-rank gloo, 10 M-parameter MLP, 40 MB of gradients) PyTorch's own Python
``allreduce_hook`` alone costs +4.9 % of the step; and a hook that divides (x / P) rounds differently from the
built-in one (x · (1/P)) when P is not a power of two, so training would not be bit-identical.

So the reducer keeps its own hook, and dagtop sits where that hook hands each bucket to the process group: the
reducer's process group is swapped for :class:`_Tap`, a ``ProcessGroup`` subclass that forwards everything to
the real one (its backends are registered on the tap) and, for the bucket all-reduces, notes when the bucket was
handed over (ready) and when its all-reduce was over (done). The reduction, its numerics and its thread are DDP's
own. How done is noted depends on the clock:

- on the host clock (gloo on CPU tensors), the reducer is handed the real work, and the training thread notices
  its end (instrument/polled.py): no Python runs on gloo's threads, which would wait there for the GIL with the
  next bucket's all-reduce behind them;
- on a GPU, a CUDA event is recorded in a callback on the work's future, and the reducer is handed a work whose
  future completes after that callback (see :meth:`_Tap.allreduce`).

Relies on the private ``Reducer._update_process_group`` (torch 2.2 to 2.13; DDP's own ``_update_process_group``
uses it); where it fails, attach warns and the buckets go untimed.

The reducer hands buckets over in index order (it waits for bucket k before k+1, "buckets are reduced in
sequence"), so the n-th bucket all-reduce of a backward is bucket n; the count restarts at every synced forward
and at every iteration boundary. The used-parameter map (``find_unused_parameters``) is an integer all-reduce:
forwarded, not timed.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from instrument.events import COLLECTIVE
from instrument.passes import gradient_passes
from instrument.polled import Polled
from instrument.probe import Moment, OwnTime, Probe
from instrument.teardown import Held, Pending, restash_context, unstash_context
from instrument.wire_fields import Bucket

_work_from_future: Callable[[Any], Any] | None = getattr(torch._C._distributed_c10d, "_create_work_from_future", None)
"""torch's C++ ``Work`` around a future (private, not in the stubs); on a GPU, a torch without it leaves the buckets
untimed (:class:`BucketTimer` refuses to start, attach warns) rather than failing the shim's import."""

_graph_task_id = torch._C._current_graph_task_id

Handover = Callable[[Any], Any]
"""Takes a bucket's real work and returns the work the reducer is to wait on."""

_inside = threading.local()
"""``inside.tap`` is True on a thread running the tap's all-reduce: the reducer holds its lock there."""


class _Tap(dist.ProcessGroup):
    """The process group DDP's reducer sees: the real one's backends, and :meth:`allreduce` noted on the way."""

    def __init__(self, inner: dist.ProcessGroup, issued: Callable[[Sequence[torch.Tensor]], Handover | None],
                 own: OwnTime | None = None) -> None:
        super().__init__(inner.rank(), inner.size())  # type: ignore[call-arg] # the stubs know one overload
        self.inner = inner
        self._issued = issued
        """Called as a bucket is handed over; returns what turns the real work into the reducer's, or None (untimed)."""
        self._own = own
        """Where the tap adds its own time on a CPU rank's training thread (its Python around the real call)."""
        for device in inner._device_types:
            backend = inner._get_backend(device)
            self._register_backend(device, _backend_type(backend), backend)
        default = _backend_type(inner._get_backend(inner._device_types[0])) if inner._device_types else None
        if default is not None:
            self._set_default_backend(default)

    def allreduce(self, tensors: Any, opts: Any = None) -> Any:  # type: ignore[override] # the C++ one
        """The real all-reduce, its work handed to the reducer as the bucket timer says (:meth:`BucketTimer._issued`).

        On a GPU, a work whose future completes after dagtop's callback on the real one: the reducer waits for each
        bucket's future before the optimizer may run, so it then waits until the done event is recorded, as it waits
        for a comm hook's future. The work around that future is torch's own C++ one (``_create_work_from_future``,
        "the preferred way of constructing Work objects when writing a custom ProcessGroup in python"): the reducer
        then reads its future without calling into Python.
        """
        began = time.perf_counter_ns()
        _inside.tap = True
        context = unstash_context()  # not copied into the work: freed on a gloo thread (instrument/teardown.py)
        real = 0
        try:
            handover = self._issued(tensors)
            called = time.perf_counter_ns()
            work = self.inner.allreduce(tensors) if opts is None else self.inner.allreduce(tensors, opts)
            real = time.perf_counter_ns() - called
            return work if handover is None else handover(work)
        finally:
            restash_context(context)
            _inside.tap = False
            if self._own is not None:  # the real all-reduce's call is DDP's own cost, not the shim's
                self._own.ns += time.perf_counter_ns() - began - real
                self._own.launch_ns += real

    def broadcast(self, tensors: Any, opts: Any = None) -> Any:  # type: ignore[override]
        # The reducer broadcasts rank 0's bucket layout when it rebuilds its buckets.
        return self.inner.broadcast(tensors) if opts is None else self.inner.broadcast(tensors, opts)

    def getBackendName(self) -> str:  # the C++ name the trampoline calls
        return str(self.inner.name())

    def name(self) -> str:
        return str(self.inner.name())


def _keep_out_of_dynamo() -> None:
    """Have Dynamo leave the tap's methods alone, once Dynamo is loaded.

    The reducer calls them from C++, also while Dynamo compiles a frame (``torch.compile(DDP(m))`` rebuilds
    the buckets in its traced forward): Dynamo would try to compile them, and fail on the process group. Not
    done before Dynamo is loaded: importing it costs a job that never compiles a second or more. Called where
    it is cheap and before any compiled forward can rebuild buckets: at attach and at each iteration's end.
    """
    global _out_of_dynamo
    if _out_of_dynamo or "torch._dynamo" not in sys.modules:
        return
    _Tap.allreduce = torch.compiler.disable(_Tap.allreduce)  # type: ignore[method-assign]
    _Tap.broadcast = torch.compiler.disable(_Tap.broadcast)  # type: ignore[method-assign]
    _out_of_dynamo = True


_out_of_dynamo = False


def _backend_type(backend: Any) -> Any:
    types = dist.ProcessGroup.BackendType
    return {"gloo": types.GLOO, "nccl": types.NCCL, "mpi": types.MPI, "ucc": types.UCC,
            "xccl": types.XCCL}.get(str(backend.name()).lower(), types.CUSTOM)


class BucketTimer:
    """Times each DDP bucket from ready (handed to the process group) to done (its work's future complete).

    On gloo with CPU tensors the future completes when the all-reduce is over on this rank, so the CPU clock
    is right; the span includes waiting for the slowest rank, which is intended (the monitor starts the
    collective at the latest ready across ranks). There the probe's ``polled`` notices the end on the training
    thread (instrument/polled.py). On CUDA, ``stamp`` records events instead: ready on the
    stream current where the reducer hands the bucket over (the gradients' stream), done in the future's
    callback, which torch runs on a stream made to wait for the collective (an NCCL future completes at
    enqueue, so the host clock would say nothing).

    Why events rather than ``TORCH_NCCL_ENABLE_TIMING`` and ``work._get_duration()``: that needs the variable
    set before the process group starts (it times every collective of the job) and gives the kernel's
    duration only, not when the bucket was ready nor where the collective sits on the GPU clock. Measured on an
    H100 with the comm-hook timer this replaced, whose stamps were taken at the same two points
    (benchmarks/gpu_truth.py --part 2): done differs from the end of the collective's GPU work by a median of
    136 µs for NCCL at world size 1 and 148 µs for gloo on CUDA tensors. Not yet re-measured for the tap.
    """

    def __init__(
        self,
        ddp: torch.nn.parallel.DistributedDataParallel,
        probe: Probe,
    ) -> None:
        self._ddp = ddp
        self._probe = probe
        """Its lane is the collectives' (``comm``); its clock the stream's on a GPU (NCCL's futures complete at
        enqueue)."""
        self._stamp, self._switch, self._fail = probe.stamp, probe.switch, probe.fail
        self._next = 0
        """Index of the next bucket the reducer hands over in this backward."""
        self._sizes: dict[int, tuple[int, torch.dtype]] = {}
        """Bucket index -> (bytes, dtype), as this iteration saw them: what tells that DDP rebuilt them."""
        self._sent: dict[int, tuple[int, torch.dtype]] = {}
        """The sizes of the bucket map :meth:`iteration_done` last returned."""
        self._candidate: dict[int, tuple[int, torch.dtype]] | None = None
        """New sizes seen in one iteration, returned as the map if the next iteration sees them again."""
        self.parameter_bytes: tuple[tuple[int, ...], ...] = ()
        """Per bucket of the map :meth:`iteration_done` last returned, its parameters' bytes in the order of their
        names (empty where the names are)."""
        self.copy_ns = 0
        """What DDP's copies of the gradients into the buckets of that map and back take a synced step on this
        rank, ns (:func:`gradient_passes`); 0 where it makes none worth timing."""
        self.add_ns = 0
        """What adding a micro-batch's gradients to those accumulated takes on this rank, ns (the same)."""
        self._known: dict[int, tuple[int, torch.dtype, str, tuple[int, torch.dtype]]] = {}
        """Bucket index -> (elements, dtype, task name, (bytes, dtype)) as last handed over: worked out once."""
        self._hook_said = False
        """Whether the user's own comm hook (whose collectives bypass the tap) was warned about."""
        self._open: dict[int, int] = {}
        """Bucket index -> ``perf_counter_ns`` when it was handed over, while its all-reduce is in flight."""
        self._polled = probe.polled
        """Where the training thread notices a host-clock all-reduce's end; None on a GPU (a callback records it)."""
        if self._polled is None and _work_from_future is None:
            raise RuntimeError("torch has no _create_work_from_future")
        self._real = ddp.process_group
        self.pending = Pending()
        """The bucket callbacks torch still holds: ``close()`` waits for them (instrument/teardown.py)."""
        _keep_out_of_dynamo()
        self._tap: _Tap | None = _Tap(self._real, self._issued, probe.own)
        ddp.reducer._update_process_group(self._tap)

    def remove(self, timeout_s: float = 0.0) -> bool:
        """Give the reducer its own process group back (not from inside a collective: the reducer's lock), then
        wait up to ``timeout_s`` for torch to free the callbacks of the buckets handed over before (their
        collectives may still be in flight). True when none is left: nothing of dagtop's can then run on a
        collective's thread, at interpreter exit or when the process group is destroyed."""
        if self._tap is not None and not getattr(_inside, "tap", False):
            self._ddp.reducer._update_process_group(self._real)
            self._tap = None
        return self.pending.wait(timeout_s)

    def new_pass(self) -> None:
        """A forward that will all-reduce in its backward: the reducer starts again at bucket 0."""
        self._next = 0
        polled = self._polled
        if polled is not None and (polled.open or polled.queued) and _graph_task_id() == -1:
            # Outside any backward, nothing is in flight but what a backward that failed midway left: it ended there.
            polled.forget()
            self._open.clear()

    def _issued(self, tensors: Sequence[torch.Tensor]) -> Handover | None:
        """The reducer hands a bucket over: note it; what turns the real work into the reducer's, or None if untimed.

        Runs on the training thread for every bucket (on a GPU, its callback on the collective's thread): kept to a
        few attribute reads (the bucket's name and size are worked out once per index and byte count).
        """
        if not self._switch.on or len(tensors) != 1:
            return None
        try:
            tensor = tensors[0]
            dtype = tensor.dtype
            if not dtype.is_floating_point and not dtype.is_complex:
                return None  # the used-parameter map of find_unused_parameters, not a bucket
            ready = self._stamp()
            index = self._next
            self._next = index + 1
            numel = tensor.numel()
            known = self._known.get(index)
            if known is None or known[0] != numel or known[1] is not dtype:
                known = self._known[index] = (numel, dtype, f"bucket {index}", (numel * tensor.element_size(), dtype))
            self._sizes[index] = known[3]
            self._open[index] = time.perf_counter_ns()
        except Exception as exc:  # noqa: BLE001 - never reach the training loop
            self._fail(exc)
            return None
        name, size = known[2], known[3][0]
        open_, polled = self._open, self._polled
        if polled is not None:
            return self._host_handover(polled, index, name, ready, size)
        ended = self._probe.ended

        def done(future: torch.futures.Future[list[torch.Tensor]],
                 held: Held = Held(self.pending)) -> list[torch.Tensor]:  # noqa: B008 - one per callback, on purpose
            open_.pop(index, None)
            ended(COLLECTIVE, name, ready, size)
            return future.value()  # a failed collective raises here, as it would without dagtop

        make_work = _work_from_future
        return None if make_work is None else lambda work: make_work(work.get_future().then(done))

    def _host_handover(self, polled: Polled, index: int, name: str, ready: Moment, size: int) -> Handover:
        """On the host clock: the reducer gets the real work; the training thread notices its end (instrument/polled.py).
        A bucket handed over is a moment to look at those before it."""
        if isinstance(ready, int):  # as the host clock's moments are
            polled.poll(ready)
        open_, sink, lane = self._open, self._probe.sink, self._probe.lane
        category, phase = COLLECTIVE

        def finish(end: int) -> None:
            open_.pop(index, None)
            sink((category, phase, name, lane, ready, end, size))

        def handover(work: Any) -> Any:
            polled.watch(work.get_future(), finish)
            return work

        return handover

    def in_flight(self) -> tuple[str, int] | None:
        """The oldest all-reduce handed over and not done: its task name and ``perf_counter_ns`` then; or None.

        Read from another thread (the publisher's heartbeat): a look at a copy, good to the moment.
        """
        try:
            index, issued = min(self._open.copy().items(), key=lambda item: item[1])  # copy(): atomic
        except ValueError:
            return None
        return f"bucket {index}", issued

    def iteration_done(self) -> list[Bucket] | None:
        """Call once an iteration's buckets have all been handed over: the bucket map if it is new, else None.

        DDP rebuilds its buckets after iteration 0 (after iteration 1 with ``static_graph=True``), and may again
        later. Each iteration the tap notes every bucket's size; when they differ from the map last returned and
        then hold for one more iteration, the map is returned: sizes from the tap, parameter names from the order
        DDP filled its buckets in (:func:`_bucket_names`).
        """
        self._next = 0
        _keep_out_of_dynamo()
        sizes, self._sizes = self._sizes, {}
        if not sizes and not self._hook_said and getattr(self._ddp, "_comm_hooks", None):
            self._hook_said = True
            warnings.warn("dagtop: this DDP model has a comm hook of its own: its collectives do not go through "
                          "DDP's built-in all-reduce and are not timed (their time counts as untimed)",
                          RuntimeWarning, stacklevel=2)
        if not sizes or sizes == self._sent:
            return None
        if self._candidate != sizes:
            self._candidate = sizes
            return None
        self._sent, self._candidate = sizes, None
        names = _bucket_names(self._ddp, [sizes[i] for i in sorted(sizes)])
        self.parameter_bytes = tuple(tuple(b for _, b in bucket) for bucket in names) if all(names) else ()
        self.copy_ns, self.add_ns = gradient_passes(self._ddp, sum(size for size, _ in sizes.values()))
        return [Bucket(i, sizes[i][0], tuple(n for n, _ in names[k])) for k, i in enumerate(sorted(sizes))]


def _bucket_names(ddp: Any, buckets: list[tuple[int, torch.dtype]]) -> list[tuple[tuple[str, int], ...]]:
    """The parameters of each bucket with their bytes, in DDP's order: the order gradients became ready in the last
    iteration (which the reducer rebuilt its buckets to), cut at each bucket's bytes; else DDP's initial order
    (reverse registration). Best effort: empty where neither order adds up to the sizes."""
    params = [(n.replace("_orig_mod.", ""), p) for n, p in ddp.module.named_parameters()
              if p.requires_grad and n not in getattr(ddp, "parameters_to_ignore", ())]
    orders: list[list[int]] = []
    with contextlib.suppress(Exception):  # private; the fallback below is fine
        logged = str(ddp._get_ddp_logging_data().get("prev_iteration_grad_ready_order_indices", ""))
        orders.append([int(i) for i in logged.split(",") if i.strip()])
    orders.append(list(range(len(params) - 1, -1, -1)))
    for order in orders:
        cut = _cut(order, params, buckets)
        if cut is not None:
            return cut
    return [() for _ in buckets]


def _cut(order: list[int], params: list[tuple[str, torch.nn.Parameter]],
         buckets: list[tuple[int, torch.dtype]]) -> list[tuple[tuple[str, int], ...]] | None:
    if sorted(order) != list(range(len(params))):
        return None
    names: list[tuple[tuple[str, int], ...]] = []
    at = 0
    for size, dtype in buckets:
        taken: list[tuple[str, int]] = []
        total = 0
        while total < size and at < len(order):
            name, param = params[order[at]]
            at += 1
            if param.dtype != dtype:
                return None
            nbytes = param.numel() * param.element_size()
            taken.append((name, nbytes))
            total += nbytes
        if total != size:
            return None
        names.append(tuple(taken))
    return names if at == len(order) else None
