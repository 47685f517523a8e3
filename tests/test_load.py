"""eagleviz.decoding.load: what a loaded engine takes by default."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("asked", ["", "1"])
def test_the_device_cycle_is_taken_only_where_asked(monkeypatch, asked):
    """A loaded engine decides its drafted cycles on the host unless EAGLEVIZ_DEVICE_CYCLE=1 asks for the device's
    choice and walk (which an H200 run found wrong where a CPU is lossless: docs/performance.md entry 61)."""
    import eagleviz.decoding.load as load
    from tiny import tiny_target

    monkeypatch.setattr(load, "load_target", lambda *args, **kwargs: tiny_target("llama", vocab=16))
    monkeypatch.setenv(load.DEVICE_CYCLE_ENV, asked)
    engine = load.load_engine("random", "random")
    assert engine.device_cycle is (asked == "1")
