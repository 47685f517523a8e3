"""eagleviz/models/host.py: reads of device values give what `.tolist()` gives, in one copy on a GPU; phase timings
are wall-clock on a CPU and CUDA events read once per cycle on a GPU (checked here through a stand-in event,
the bookkeeping being what a CPU can honestly test)."""

import pytest
import torch

from eagleviz.models.host import PhaseClock, batched_to_host, to_device, to_host


def test_batched_reads_equal_tolist_for_ids_and_floats():
    ids = torch.tensor([[3, 2**40 + 7, 0], [49151, 1, 2]])  # int64 ids, one far beyond float32's exact range
    logp = torch.log_softmax(torch.randn(2, 3), dim=-1)
    flags = torch.tensor([True, False])
    assert batched_to_host(ids, logp, flags) == [ids.tolist(), logp.tolist(), [1, 0]]
    assert to_host(ids, logp) == [ids.tolist(), logp.tolist()]


def test_to_device_keeps_values_and_dtype():
    assert torch.equal(to_device([4, 5, 6], torch.device("cpu")), torch.tensor([4, 5, 6]))
    mask = torch.eye(3, dtype=torch.bool)
    assert to_device(mask, torch.device("cpu")) is mask  # already there: no copy


def test_cpu_phase_clock_times_each_lap():
    clock = PhaseClock(torch.device("cpu"))
    for _ in range(4):
        clock.lap()
    times = clock.read(("draft", "verify", "accept", "rewind"))
    assert list(times) == ["draft", "verify", "accept", "rewind"] and all(t >= 0 for t in times.values())
    with pytest.raises(ValueError, match="3 names for 4 phases"):
        clock.read(("a", "b", "c"))


class FakeEvent:
    """Stands in for torch.cuda.Event: a time stamp at record(), and a log of synchronisations."""

    clock = 0.0
    synced: list = []

    def record(self):
        FakeEvent.clock += 2.5
        self.at = FakeEvent.clock

    def elapsed_time(self, later) -> float:
        return later.at - self.at

    def synchronize(self):
        FakeEvent.synced.append(self)


def test_cuda_phase_clock_records_events_and_waits_once():
    FakeEvent.synced.clear()
    clock = PhaseClock(torch.device("cuda"), event=FakeEvent)
    for _ in range(4):
        clock.lap()
    assert FakeEvent.synced == []  # no wait between phases
    assert clock.read(("draft", "verify", "accept", "rewind")) == dict.fromkeys(
        ("draft", "verify", "accept", "rewind"), 2.5)
    assert len(FakeEvent.synced) == 1 and FakeEvent.synced[0] is clock._marks[-1]
