import pytest

from embedfleet.services.gpu_worker.engine import Engine
from embedfleet.services.gpu_worker.engine.calibrate import calibrate, pick_knee, synthetic_batch


@pytest.fixture(scope="module")
def engine(model_info):
    return Engine(model_info, "cpu", max_batch_tokens=512)


def test_calibration_measures_each_budget_and_picks_a_knee(engine):
    result = calibrate(engine, budgets=(64, 128, 256, 512, 1024), min_seconds=0.05)
    budgets = [b for b, _ in result.points]
    assert budgets == sorted(budgets) and budgets[0] == 64
    assert max(budgets) <= 512  # never above the engine's configured maximum
    assert all(rate > 0 for _, rate in result.points)
    best = max(rate for _, rate in result.points)
    knee_rate = dict(result.points)[result.knee]
    assert knee_rate >= 0.95 * best
    # no smaller budget was already within 5% of the best
    assert all(rate < 0.95 * best for b, rate in result.points if b < result.knee)
    assert "knee at" in result.describe()


def test_knee_rule_on_known_curves():
    rising = [(64, 100.0), (128, 180.0), (256, 240.0), (512, 250.0), (1024, 251.0)]
    assert pick_knee(rising) == 256  # 240 is within 5% of 251
    assert pick_knee(rising, tolerance=0.99) == 512
    noisy = [(64, 100.0), (128, 200.0), (256, 190.0), (512, 205.0)]
    assert pick_knee(noisy) == 128


def test_synthetic_batch_shape(engine):
    ids, cu = synthetic_batch(engine, 300, 128)
    assert len(ids) == 300 and cu.tolist() == [0, 128, 256, 300]
    assert ids.min() >= 1000 and ids.max() < engine.spec.vocab_size
