import numpy as np

from embedfleet.services.scorer.scoring import cosine_rank


def test_ranks_by_cosine_best_first():
    q = np.array([1.0, 0.0], np.float32)
    c = np.array([[0.0, 1.0], [2.0, 0.1], [1.0, 1.0]], np.float32)
    idx, scores = cosine_rank(q, c)
    assert idx.tolist() == [1, 2, 0]
    expected = (c @ q) / np.linalg.norm(c, axis=1)
    np.testing.assert_allclose(scores, expected[[1, 2, 0]], rtol=1e-6)
    assert idx.dtype == np.int32 and scores.dtype == np.float32


def test_top_n_and_stable_ties():
    q = np.array([1.0, 0.0], np.float32)
    c = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0]], np.float32)
    idx, scores = cosine_rank(q, c, top_n=2)
    assert idx.tolist() == [0, 2] and len(scores) == 2


def test_cosines_stay_within_minus_one_and_one():
    """float32 rounding gives some unit rows a cosine of 1.0000001 with themselves (and -1.0000001 with
    their negation): clipped to 1 and -1."""
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((64, 384)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    over = 0
    for row in rows:
        unit = row / np.linalg.norm(row)
        over += float((row @ unit) / np.linalg.norm(row)) > 1.0  # the rounding the clip is for
        _, scores = cosine_rank(row, np.stack([row, -row]))
        assert scores.min() >= -1.0 and scores.max() <= 1.0
        np.testing.assert_allclose(scores, [1.0, -1.0], atol=1e-6)
    assert over > 0, "no row rounds above 1: the test checks nothing"
