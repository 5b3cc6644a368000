"""The bucket timer between DDP's reducer and its process group (instrument/comm.py), in one process."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from instrument.comm import BucketTimer
from instrument.polled import Polled
from instrument.probe import OwnTime, Probe, Switch


@pytest.fixture
def one_rank() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4))


def _train(ddp: DDP, timer: BucketTimer, steps: int) -> list[Any]:
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    maps = []
    for _ in range(steps):
        timer.new_pass()
        ddp(torch.randn(8, 64)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        maps.append(timer.iteration_done())
    return maps


def _timer(ddp: DDP, events: list[tuple[Any, ...]], host: bool = True) -> BucketTimer:
    """The timer on the host clock (the training thread notices each end), or as on a GPU (a callback on the future)."""
    return BucketTimer(ddp, Probe(events.append, time.perf_counter_ns, "comm", Switch(), pytest.fail,
                                  Polled(pytest.fail) if host else None))


@pytest.mark.parametrize("host", [True, False], ids=["noticed", "callback"])
def test_every_bucket_is_timed_named_and_given_back(one_rank: None, host: bool) -> None:
    ddp = DDP(_model(), bucket_cap_mb=0.2)  # several buckets
    events: list[tuple[Any, ...]] = []
    timer = _timer(ddp, events, host)
    maps = _train(ddp, timer, 4)
    buckets = ddp.reducer._get_zeros_like_grad_buckets()  # DDP's own view of its (rebuilt) buckets
    assert len(buckets) >= 2
    names = dict(ddp.module.named_parameters())
    truth = [(b.index(), b.buffer().numel() * 4, {n for n, p in names.items() if any(p is q for q in b.parameters())})
             for b in buckets]
    sent = next(m for m in maps if m is not None)  # once the sizes held for an iteration
    assert [(b.index, b.bytes, set(b.parameters)) for b in sent] == truth
    last = [e for e in events if e[4] >= 0][-len(buckets):]
    assert sorted(e[2] for e in last) == [f"bucket {i}" for i in range(len(buckets))]
    assert all(e[0] == "allreduce" and e[3] == "comm" and e[5] >= e[4] for e in last)
    assert timer.in_flight() is None  # every all-reduce is done once backward returned

    timer.remove()
    count = len(events)
    _train(ddp, timer, 1)
    assert len(events) == count  # the reducer has its own process group back


def test_training_is_unchanged_by_the_tap(one_rank: None) -> None:
    plain, timed = DDP(_model()), DDP(_model())
    _timer(timed, [])
    for ddp in (plain, timed):
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        torch.manual_seed(1)
        for _ in range(3):
            ddp(torch.randn(8, 64)).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    assert all(torch.equal(a, b) for a, b in zip(plain.parameters(), timed.parameters()))


def test_on_a_cpu_rank_the_tap_counts_its_own_time_and_not_the_real_all_reduces(one_rank: None) -> None:
    """The tap's Python around each bucket's all-reduce runs on the training thread: it adds its time to the shim's
    own (what the advice takes out of its predictions), less the real all-reduce's call, which is DDP's own cost
    (counted apart, as its launch). Each real call here takes 0.2 s: counted, the own time would be at least that."""
    ddp = DDP(_model(), bucket_cap_mb=0.2)
    own = OwnTime()
    timer = BucketTimer(ddp, Probe([].append, time.perf_counter_ns, "comm", Switch(), pytest.fail,
                                   Polled(pytest.fail), own))
    _train(ddp, timer, 2)  # past the buckets' rebuild
    assert timer._tap is not None
    real, calls = timer._tap.inner, []

    class Slow:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def allreduce(self, *args: Any) -> Any:
            calls.append(1)
            time.sleep(0.2)
            return real.allreduce(*args)

    timer._tap.inner = Slow()  # type: ignore[assignment]
    own.ns = own.launch_ns = 0
    began = time.perf_counter_ns()
    _train(ddp, timer, 1)
    took = time.perf_counter_ns() - began
    assert len(calls) >= 2 and took >= len(calls) * 200_000_000
    assert 0 < own.ns < 100_000_000
    assert len(calls) * 200_000_000 <= own.launch_ns <= took  # the real calls: DDP's launches of its buckets


def test_unused_parameters_map_is_not_a_bucket(one_rank: None) -> None:
    ddp = DDP(_model(), find_unused_parameters=True)
    events: list[tuple[Any, ...]] = []
    _train(ddp, _timer(ddp, events), 3)
    assert {e[2] for e in events} == {"bucket 0"}  # the used-parameter map (int) went through, untimed


def test_a_comm_hook_of_the_users_own_is_said_once(one_rank: None) -> None:
    ddp = DDP(_model())
    events: list[tuple[Any, ...]] = []
    timer = _timer(ddp, events)

    def noop(state, bucket):  # type: ignore[no-untyped-def] # DDP reads the annotations: none, or real types
        future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        future.set_result(bucket.buffer())
        return future

    ddp.register_comm_hook(None, noop)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _train(ddp, timer, 3)
    said = [w for w in caught if "comm hook of its own" in str(w.message)]
    assert len(said) == 1 and not events


def test_a_torch_without_the_work_constructor_times_host_buckets_and_refuses_gpu_ones(
        one_rank: None, collector: Any, endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU's timer hands the reducer a work made around its callback's future; the host clock's needs none."""
    import instrument
    from instrument import comm

    monkeypatch.setattr(comm, "_work_from_future", None)  # as on a torch whose c10d lacks it
    with pytest.raises(RuntimeError, match="_create_work_from_future"):
        _timer(DDP(_model()), [], host=False)
    ddp = DDP(_model())
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing said: the buckets are timed
        tracer = instrument.attach(ddp, optimizer, endpoint=endpoint)
    try:
        collector.joined()
        for _ in range(2):
            ddp(torch.randn(8, 64)).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        assert tracer.enabled  # the rest of the shim still runs
    finally:
        tracer.close()
    batches = _batches(collector)
    categories = {e.category for b in batches for e in b.events}
    assert len(batches) == 2 and {"compute", "allreduce"} <= categories


def test_a_bucket_is_handed_over_without_the_backwards_python_context_and_it_is_put_back(one_rank: None) -> None:
    """torch keeps the backward's contextvars.Context in its thread-local state; a gloo work copies that state and
    is freed on a gloo thread, which then needs the GIL: at interpreter exit, an abort (issue #30). The tap hands
    buckets over without it, and the backward gets it back."""
    ddp = DDP(_model(), bucket_cap_mb=0.2)
    events: list[tuple[Any, ...]] = []
    timer = _timer(ddp, events)
    seen: list[tuple[bool, bool]] = []
    inner = timer._real

    class Watching:  # the real process group, noting whether the context is there as each bucket is handed over
        def __getattr__(self, name: str) -> Any:
            return getattr(inner, name)

        def allreduce(self, *args: Any) -> Any:
            seen.append((torch._C._is_key_in_tls("context"), before[0]))
            return inner.allreduce(*args)

    before = [False]
    assert timer._tap is not None
    timer._tap.inner = Watching()  # type: ignore[assignment]

    def note(grad: torch.Tensor) -> None:  # a hook in backward, before the buckets: the context is there
        before[0] = torch._C._is_key_in_tls("context")

    ddp.module[-1].weight.register_hook(note)
    after: list[bool] = []
    ddp.module[0].weight.register_hook(lambda grad: after.append(torch._C._is_key_in_tls("context")))
    _train(ddp, timer, 2)
    assert seen and all(ours is False and theirs is True for ours, theirs in seen)
    assert after and all(after)  # put back for the rest of the backward
    assert not torch._C._is_key_in_tls("context")  # and torch took it away at the end, as it does
    timer.remove()


def test_on_the_host_clock_a_buckets_end_is_noticed_by_the_backward_not_after_it(
        one_rank: None, collector: Any, endpoint: str) -> None:
    """No Python on gloo's thread: the training thread notices an all-reduce's end at the next unit of the backward
    (instrument/polled.py), and the last ones before the backward returns. Bucket 0's all-reduce is over while its
    hand-over is held 50 ms; the backward then spends 50 ms more before its end: noticed at the end, bucket 0 would
    end less than 50 ms before the update. The script sleeps 50 ms between backward and step: noticed at the step,
    the last bucket would end less than that before it."""
    import instrument

    ddp = DDP(_model(), bucket_cap_mb=0.2)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    tracer = instrument.attach(ddp, optimizer, endpoint=endpoint)
    try:
        collector.joined()

        def held(work: Any, index: int) -> Any:  # bucket 0's hand-over held until its all-reduce is surely over
            if index == 0:
                time.sleep(0.05)
            return work

        _change_allreduce(tracer, held)
        ddp.module[0].weight.register_hook(lambda grad: time.sleep(0.05))  # the backward's last unit, after bucket 0
        for _ in range(4):
            ddp(torch.randn(8, 64)).square().mean().backward()
            time.sleep(0.05)
            optimizer.step()
            optimizer.zero_grad()
    finally:
        tracer.close()
    batches = _batches(collector)
    assert len(batches) == 4
    for batch in batches[1:]:  # DDP rebuilds its buckets after the first iteration
        buckets = {e.name: e for e in batch.events if e.category == "allreduce"}
        update = next(e for e in batch.events if e.phase == "update")
        assert len(buckets) >= 2 and all(e.start_ns <= e.end_ns <= update.start_ns for e in buckets.values())
        assert update.start_ns - buckets["bucket 0"].end_ns >= 90_000_000, batch.iteration
        assert update.start_ns - max(e.end_ns for e in buckets.values()) >= 40_000_000, batch.iteration


def test_on_the_host_clock_a_bucket_that_ends_before_the_one_handed_over_before_it_is_timed_to_its_own_end(
        one_rank: None, collector: Any, endpoint: str) -> None:
    """Gloo runs two all-reduces at once, and the later may end first. The backward over, the shim waits for the
    buckets in the order they were handed over; a later one that ends meanwhile is stamped by its own callback, not
    noticed when the wait returns. Here bucket 0's all-reduce is made to end 600 ms after its hand-over and the last
    bucket's 50 ms after its own, both after the backward: the last ends hundreds of ms before bucket 0."""
    import threading

    import instrument

    def later(work: Any, delay: float) -> Any:  # the same work, its end put off by ``delay`` seconds
        future: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()

        def finish() -> None:
            time.sleep(delay)
            work.wait()
            future.set_result(work.result())

        threading.Thread(target=finish, daemon=True).start()
        return torch._C._distributed_c10d._create_work_from_future(future)

    ddp = DDP(_model(), bucket_cap_mb=0.2)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    tracer = instrument.attach(ddp, optimizer, endpoint=endpoint)
    try:
        collector.joined()
        _change_allreduce(tracer, lambda work, index: later(work, 0.6 if index == 0 else 0.05))
        for _ in range(3):
            ddp(torch.randn(8, 64)).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    finally:
        tracer.close()
    batches = _batches(collector)
    assert len(batches) == 3
    for batch in batches[1:]:  # DDP rebuilds its buckets after the first iteration
        buckets = sorted((e for e in batch.events if e.category == "allreduce"), key=lambda e: e.start_ns)
        assert len(buckets) >= 2 and buckets[0].name == "bucket 0"
        first, latest = buckets[0], buckets[-1]
        assert first.end_ns - first.start_ns >= 550_000_000
        assert first.end_ns - latest.end_ns >= 300_000_000, batch.iteration


def _change_allreduce(tracer: Any, change: Callable[[Any, int], Any]) -> None:
    """The tap's process group replaced by one whose ``allreduce`` hands the reducer ``change(work, bucket
    index)``, ``work`` the real one's."""
    comm = tracer._comm
    assert comm is not None and comm._tap is not None
    inner = comm._tap.inner

    class Changed:
        def __getattr__(self, name: str) -> Any:
            return getattr(inner, name)

        def allreduce(self, *args: Any) -> Any:
            work = inner.allreduce(*args)
            return change(work, comm._next - 1)  # the tap counted the bucket as it handed it over

    comm._tap.inner = Changed()


def _batches(collector: Any) -> list[Any]:
    """The iteration frames the ranks sent, until their bye."""
    from instrument import wire

    return [f for f in map(wire.decode, (r.payload for r in collector.until_bye()))
            if isinstance(f, wire.IterationBatch)]
