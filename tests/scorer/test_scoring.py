import numpy as np

from services.scorer.scoring import cosine_rank


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
