"""The stack's tokenizer on kitoken's path: it says so in discovery, and its texts' vectors are those of
the token IDs HF tokenizers gives them (sent as token-ID inputs to the same stack)."""

from __future__ import annotations

import asyncio
import json
import sys

import httpx
import nats
import numpy as np
import pytest

from embedfleet.services.tokenizer.encoder import TextEncoder
from embedfleet.services.tokenizer.fast_check import KITOKEN, TOKENIZERS, choose, corpus
from embedfleet.shared.nats.subjects import SERVICE_NAMES
from tests.conftest import cosines
from tests.support.corpus import mixed_texts

if sys.platform != "linux":  # the test extra installs kitoken on Linux only: there, its absence fails these tests
    pytest.importorskip("kitoken", reason="the extra 'fast-tokenizer' is not installed")
pytestmark = pytest.mark.integration


def _tokenizer_metadata(nats_url: str) -> list[dict]:
    async def ping() -> list[dict]:
        nc = await nats.connect(nats_url)
        replies: list[dict] = []

        async def on_reply(msg) -> None:
            if msg.data:
                replies.append(json.loads(msg.data)["metadata"])

        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox, cb=on_reply)
        await nc.publish(f"$SRV.PING.{SERVICE_NAMES['tokenizer']}", b"", reply=inbox)
        await asyncio.sleep(0.5)
        await sub.unsubscribe()
        await nc.close()
        return [r for r in replies if r.get("prefix") == "embedfleet"]

    return asyncio.run(ping())


def _embed(base_url: str, inputs: list, direction: str) -> np.ndarray:
    """TEI's /embed (it takes the truncation's direction, and token IDs as inputs)."""
    r = httpx.post(
        f"{base_url}/embed", json={"inputs": inputs, "truncate": True, "truncation_direction": direction}, timeout=120
    )
    assert r.status_code == 200, r.text
    return np.array(r.json(), np.float32)


def test_the_tokenizer_serves_with_kitoken(stack):
    assert [m["tokenizer"] for m in _tokenizer_metadata(stack.nats_url)] == [KITOKEN]
    assert "tokenizing texts with kitoken" in stack.services["tokenizer"].log()


@pytest.mark.parametrize("direction", ["right", "left"])
def test_text_vectors_are_those_of_tokenizers_ids(stack, model_info, direction):
    """One token replaced in a text of mixed_texts(40) moves its vector by 1.5e-4 of cosine at least:
    the bound below tells one differing token from the batches' rounding."""
    texts = [t for t in [*mixed_texts(40), *corpus()[-80:]] if t.strip()][:96]
    reference = TextEncoder(model_info)
    assert choose(reference, model_info.path, "off") == TOKENIZERS
    ids = reference.encode(texts, True, direction)
    from_texts = _embed(stack.base_url, texts, direction)
    from_ids = _embed(stack.base_url, ids, direction)
    c = cosines(from_texts, from_ids)
    assert c.min() >= 0.999999, f"worst cosine {c.min():.7f} at {texts[int(c.argmin())][:60]!r}"
