"""The worker bounds a reply's envelope from its id and stage names instead of encoding an empty reply."""

from __future__ import annotations

import pytest

from embedfleet.services.gpu_worker.service import _envelope_bound
from embedfleet.shared.protocol import MAX_ID, MAX_STAGES, EmbedResult, encode

_LARGEST = 2**63 - 1


@pytest.mark.parametrize(
    ("request_id", "timings"),
    [
        ("", {}),
        ("q-1", {"tokenize": 0.00012, "queue": 0.5, "inference": 0.002}),
        ("x" * MAX_ID, {f"stage-{i}": 1e300 for i in range(MAX_STAGES)}),
        (
            "\U0001f600" * MAX_ID,
            {"\u00e9" * 60 + str(i): -1e-300 for i in range(MAX_STAGES)},
        ),  # 4- and 2-byte characters
    ],
)
@pytest.mark.parametrize("dtype", ["float32", "ubinary"])
def test_the_bound_holds_the_envelope_of_any_reply(request_id: str, timings: dict[str, float], dtype: str):
    exact = len(encode(EmbedResult(request_id, _LARGEST, _LARGEST, _LARGEST, dtype, b"", _LARGEST, timings)))
    assert exact <= _envelope_bound(request_id, timings) <= 4 * exact + 512
