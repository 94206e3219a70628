"""A worker started again with the same data folder serves with the budget it calibrated the first time."""

from __future__ import annotations

import contextlib

import pytest

from embedfleet.services.up.launch import FreePorts
from tests.support.procs import Service, scraped, wait_until
from tests.support.role_images import role_env

pytestmark = pytest.mark.integration


def test_a_worker_started_again_uses_its_kept_calibration(nats_url, model_info, tmp_path):
    with contextlib.closing(FreePorts("127.0.0.1")) as free:
        port = free(1)
    # two rows a batch at most: the calibration times 64, 128 and 256 tokens only (a second, not ten)
    args = ["--nats", nats_url, "--subject-prefix", "calibration", "--max-batch-seqs", "2"]
    args += ["--data-dir", str(tmp_path / "data"), "--metrics-port", str(port)]
    env = {"OMP_NUM_THREADS": "1", "EMBEDFLEET_MAX_BATCH_TOKENS": "auto", **role_env("worker")}

    def budget_served(worker: Service) -> float:
        wait_until(
            lambda: scraped(port, "embedfleet_worker_max_batch_tokens", model=model_info.id) > 0,
            120,
            "budget",
            [worker],
        )
        value = scraped(port, "embedfleet_worker_max_batch_tokens", model=model_info.id)
        assert worker.stop() == 0
        return value

    first = Service("worker", args, tmp_path, env)
    measured = budget_served(first)
    assert "calibrated token budget" in first.log() and "cached" not in first.log()
    [kept] = (tmp_path / "data" / "calibration").glob("*.json")

    second = Service("worker", args, tmp_path, env)
    assert budget_served(second) == measured
    log = second.log()
    assert f"token budget {measured:.0f} from the calibration cached in {kept}, measured at " in log
    assert "calibrated token budget" not in log
