import pytest

from embedfleet.services.gpu_worker.config import WorkerConfig
from embedfleet.services.gpu_worker.load_reports import ReportCadence
from embedfleet.services.tokenizer.routing import Router
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.config.registry import default
from embedfleet.shared.protocol import LoadReport

BUSY, IDLE = 0.05, 0.25


def _ticks(cadence: ReportCadence, loads: list[int]) -> list[float | None]:
    """What the worker's loop announces at each tick (one every BUSY seconds) for these loads."""
    return [cadence.due(load, i * BUSY) for i, load in enumerate(loads)]


def test_a_busy_worker_reports_every_tick_and_an_idle_one_every_idle_interval():
    cadence = ReportCadence(BUSY, IDLE)
    got = _ticks(cadence, [0] * 11)
    assert [i for i, g in enumerate(got) if g is not None] == [0, 5, 10]  # 0.25 s apart
    assert {g for g in got if g is not None} == {IDLE}
    cadence = ReportCadence(BUSY, IDLE)
    assert _ticks(cadence, [300] * 4) == [BUSY] * 4


def test_a_change_is_reported_at_the_next_tick_with_the_cadence_that_follows():
    cadence = ReportCadence(BUSY, IDLE)
    got = _ticks(cadence, [0, 0, 512, 256, 0, 0, 0, 0, 0, 0, 0])
    # idle, then work arrives (reported at once), is done (reported at once), idle again from there
    assert got == [IDLE, None, BUSY, BUSY, IDLE, None, None, None, None, IDLE, None]


def test_an_idle_worker_sleeps_until_its_next_report_and_a_busy_one_one_tick():
    cadence = ReportCadence(BUSY, IDLE)
    assert cadence.wait(0, 0.0) == BUSY  # nothing sent yet
    assert cadence.due(0, 1.0) == IDLE
    assert cadence.wait(0, 1.0) == pytest.approx(IDLE) and cadence.wait(0, 1.2) == pytest.approx(IDLE - 0.2)
    assert cadence.wait(0, 1.3) == 0.0  # overdue: at once
    assert cadence.wait(512, 1.1) == BUSY


def test_the_tokenizers_keep_an_idle_worker_as_long_as_it_announces_and_drop_it_after():
    router, cadence = Router(), ReportCadence(BUSY, IDLE)
    for i in range(12):  # 0.6 s of an idle worker's ticks
        interval = cadence.due(0, i * BUSY)
        if interval is not None:
            router.update(LoadReport("w", "m", "s.w", 0, interval), i * BUSY)
        assert router.live(i * BUSY) == ["w"]
    # its last report at 0.5 s; silent (dead) from there: dropped once three idle intervals pass
    assert router.live(0.5 + 3 * IDLE - 0.01) == ["w"] and router.live(0.5 + 3 * IDLE + 0.01) == []


def test_an_idle_interval_below_the_busy_one_is_refused(model_info):
    with pytest.raises(ConfigError, match=r"--load-idle-interval 0.01 is below --load-interval 0.05"):
        WorkerConfig(
            nats=None,
            model=model_info,
            device="cpu",
            dtype=None,
            max_batch_tokens=None,
            max_batch_seqs=64,
            replicas=1,
            threads=None,
            graphs=None,
            attention="auto",
            load_interval=0.05,
            load_idle_interval=0.01,
        )


def test_an_idle_worker_at_the_defaults_reports_every_other_second():
    """The defaults an idle fleet runs with: a report every other second (not four a second), a busy
    worker's every 50 ms."""
    cadence = ReportCadence(default("load_interval"), default("load_idle_interval"))
    ticks = [cadence.due(0, i * cadence.busy) for i in range(int(10 / cadence.busy))]  # 10 s idle
    assert sum(t is not None for t in ticks) == 5
    assert cadence.due(512, 10.0) == 0.05
