"""API keys (services/gateway/auth.py): a bearer key identified among the configured ones, and a missing one
answered 401 in each API's shape."""

import orjson

from embedfleet.services.gateway.auth import ApiKeys
from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.shared.errors import ErrorCode


def test_api_keys():
    keys = ApiKeys(("k1", "secret-2"), ("/health",))
    assert keys.enabled and keys.open_paths == {"/health"}
    assert keys.identify("Bearer secret-2") == "secret-2" and keys.identify("bearer k1") == "k1"
    assert keys.identify("Bearer nope") is None
    assert keys.identify(None) is None and keys.identify("Basic k1") is None
    assert not ApiKeys((), ()).enabled and ApiKeys((), ()).identify("Bearer k1") is None


def test_unauthorized_shapes():
    e = ApiError(ErrorCode.UNAUTHORIZED, "no key")
    assert e.status == 401
    assert orjson.loads(e.response("/embed").body)["error_type"] == "Unauthorized"
    assert orjson.loads(e.response("/v1/embeddings").body)["error"]["type"] == "authentication_error"
