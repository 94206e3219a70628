"""The calibrated budget kept in the data folder: a later start with the same model, device and dtype
uses it without timing the device; anything else measures again."""

import logging
from pathlib import Path

import orjson
import pytest

from embedfleet.services.gpu_worker import replicas
from embedfleet.services.gpu_worker.calibration_cache import FOLDER, CalibrationCache, identity
from embedfleet.services.gpu_worker.config import WorkerConfig
from embedfleet.services.gpu_worker.engine import Engine
from embedfleet.services.gpu_worker.engine.calibrate import Calibration, Point, budgets_for, calibrate
from embedfleet.services.gpu_worker.replicas import build_engines, calibrated_budget
from embedfleet.shared.model_dir.load import load_model_info
from embedfleet.shared.nats.config import NatsConfig
from embedfleet.shared.nats.subjects import Subjects


@pytest.fixture(scope="module")
def engine(model_info):
    return Engine(model_info, "cpu", max_batch_tokens=1024)


@pytest.fixture(scope="module")
def timing(engine) -> Calibration:
    """A real, short start-up calibration of the module's engine, on four small budgets (timed once: the
    tests here are about what is kept and when it is measured again, not the timing)."""
    return calibrate(engine, budgets=(64, 128, 256, 512), min_seconds=0.05)


@pytest.fixture
def measured(monkeypatch, timing) -> list[Engine]:
    """The engines the start-up calibration was asked to time (each is answered with ``timing``)."""
    timed: list[Engine] = []

    def short(engine: Engine, budgets: tuple[int, ...]):
        assert budgets == budgets_for(engine.device.type)
        timed.append(engine)
        return timing

    monkeypatch.setattr(replicas, "calibrate", short)
    return timed


def test_a_second_start_uses_the_kept_calibration(engine, measured, tmp_path, caplog):
    caplog.set_level(logging.INFO, "embedfleet.worker")
    first = calibrated_budget(engine, tmp_path)
    assert len(measured) == 1
    [kept] = (tmp_path / FOLDER).glob("*.json")
    assert kept.name.startswith("all-MiniLM-L6-v2-cpu-float32-")
    [line] = [r.message for r in caplog.records if "kept in" in r.message]
    assert line.startswith(f"calibrated token budget {first} on cpu: ") and line.endswith(f"kept in {kept}")
    caplog.clear()

    second = calibrated_budget(engine, tmp_path)
    assert second == first and len(measured) == 1  # not timed again
    [line] = [r.message for r in caplog.records if "cached" in r.message]
    assert line.startswith(f"token budget {first} from the calibration cached in {kept}, measured at ")
    assert "tokens/s by budget" in line
    record = orjson.loads(kept.read_bytes())
    assert record["identity"] == identity(engine)
    assert [p["budget"] for p in record["curve"]] == [64, 128, 256, 512]
    assert all(len(p["rates"]) == 5 for p in record["curve"])
    assert not [p for p in (tmp_path / FOLDER).iterdir() if p.suffix not in (".json", ".lock")]

    kept.unlink()  # how to measure again
    calibrated_budget(engine, tmp_path)
    assert len(measured) == 2


def test_another_dtype_or_model_is_measured_again(engine, model_info, measured, tmp_path):
    calibrated_budget(engine, tmp_path)
    calibrated_budget(Engine(model_info, "cpu", "bfloat16", max_batch_tokens=1024), tmp_path)
    assert len(measured) == 2
    # the same model with another config (a copy of its folder: the weights linked, config.json changed)
    other = tmp_path / "other" / model_info.path.name
    other.mkdir(parents=True)
    for path in model_info.path.iterdir():
        (other / path.name).symlink_to(path)
    (other / "config.json").unlink()
    config = orjson.loads((model_info.path / "config.json").read_bytes())
    (other / "config.json").write_bytes(orjson.dumps({**config, "layer_norm_eps": 1.1e-12}))
    changed = Engine(load_model_info(str(other), model_info.id), "cpu", max_batch_tokens=1024)
    calibrated_budget(changed, tmp_path)
    assert len(measured) == 3
    assert len(list((tmp_path / FOLDER).glob("*.json"))) == 3
    calibrated_budget(engine, tmp_path)
    assert len(measured) == 3


def test_a_folder_that_cannot_be_written_is_a_warning(engine, measured, tmp_path, caplog):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    budget = calibrated_budget(engine, blocked)
    assert budget >= engine.info.max_seq_length and len(measured) == 1
    # (and, where this machine was busy while timed, a warning that says so)
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING and "busy" not in r.message]
    assert warning.message.startswith(f"calibration not kept in {blocked / FOLDER} (")
    assert warning.message.endswith("the next start measures again")


def test_an_unreadable_cache_file_is_measured_again(engine, measured, tmp_path, caplog):
    calibrated_budget(engine, tmp_path)
    path = CalibrationCache(tmp_path / FOLDER).path(identity(engine))
    path.write_text("{not json")
    calibrated_budget(engine, tmp_path)
    assert len(measured) == 2
    assert any("not read" in r.message and r.levelno == logging.WARNING for r in caplog.records)
    assert orjson.loads(path.read_bytes())["identity"] == identity(engine)  # replaced by the new measurement


def test_a_given_budget_is_neither_measured_nor_cached(model_info, measured, tmp_path):
    cfg = WorkerConfig(
        nats=NatsConfig("nats://127.0.0.1:4222", Subjects("embedfleet")),
        model=model_info,
        device="cpu",
        max_batch_tokens=2048,
        data_dir=tmp_path,
    )
    [engine] = build_engines(cfg)
    assert engine.max_batch_tokens == 2048
    assert not measured and not Path(tmp_path / FOLDER).exists()


def test_auto_calibrates_into_the_data_folder(model_info, measured, tmp_path):
    cfg = WorkerConfig(
        nats=NatsConfig("nats://127.0.0.1:4222", Subjects("embedfleet")),
        model=model_info,
        device="cpu",
        data_dir=tmp_path,
    )
    assert cfg.max_batch_tokens is None  # --max-batch-tokens auto, the default
    [first] = build_engines(cfg)
    [second] = build_engines(cfg)
    assert len(measured) == 1 and first.max_batch_tokens == second.max_batch_tokens
    assert len(list((tmp_path / FOLDER).glob("*.json"))) == 1


def test_a_busy_device_is_warned_about(engine, monkeypatch, tmp_path, caplog):
    busy = Calibration((Point(64, (100.0, 60.0, 50.0)), Point(128, (200.0, 120.0, 100.0))), 128)
    monkeypatch.setattr(replicas, "calibrate", lambda engine, budgets: busy)
    calibrated_budget(engine, tmp_path)
    [kept] = (tmp_path / FOLDER).glob("*.json")
    [warning] = [r.message for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith("the device was busy while it was timed (a budget's median probe 40% below its fastest)")
    assert f"delete {kept} to time it again, or pin one with --max-batch-tokens" in warning
