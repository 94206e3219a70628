"""Which tables each API key may use: --key-tables-file read and checked when the gateway's configuration
is made, and each request's key held to its own tables (operator keys to every one, no keys: one tenant)."""

from __future__ import annotations

import pytest

from embedfleet.services.cli.main import build_parser
from embedfleet.services.gateway.config import GatewayConfig
from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.http.limits import bind_key
from embedfleet.services.gateway.jobs.sinks import SinkTargets
from embedfleet.services.gateway.key_tables import read_key_tables
from embedfleet.services.gateway.tenants import TableAccess
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.errors import ErrorCode

LANCE = "lancedb:///srv/lance"


def _config(tmp_path, text: str, *more: str) -> GatewayConfig:
    (tmp_path / "tables").write_text(text)
    args = ["gateway", "--nats", "nats://127.0.0.1:4222", "--key-tables-file", str(tmp_path / "tables"), *more]
    return GatewayConfig.from_namespace(build_parser().parse_args(args))


def test_the_file_gives_each_key_its_names_and_prefixes(tmp_path):
    text = "# tenants\n\nkey-a a_*, shared\nkey-b\tb_docs\n"
    cfg = _config(tmp_path, text, "--api-keys", "key-a,key-b,key-c", "--operator-keys", "key-op")
    assert dict(cfg.key_tables) == {"key-a": ("a_*", "shared"), "key-b": ("b_docs",)}
    access = TableAccess(True, cfg.operator_keys, dict(cfg.key_tables))
    assert access.allows("key-a", "a_docs") and access.allows("key-a", "a_") and access.allows("key-a", "shared")
    assert not access.allows("key-a", "b_docs") and not access.allows("key-a", "shared_more")
    assert not access.allows("key-a", "xa_docs")
    assert access.allows("key-b", "b_docs") and not access.allows("key-b", "b_docs2")
    assert not access.allows("key-c", "a_docs") and access.of("key-c") == ()  # no line: no table
    assert access.allows("key-op", "anything") and access.of("key-op") is None
    assert not access.allows(None, "a_docs")  # an open path's request has no key: no table


@pytest.mark.parametrize(
    ("text", "more", "message"),
    [
        ("stranger t\n", ("--api-keys", "key-a"), "line 1: the key is none of the gateway's API keys"),
        ("key-a t\nkey-a u\n", ("--api-keys", "key-a"), "line 2: the key has a line already"),
        ("key-a\n", ("--api-keys", "key-a"), "line 1: name the key's tables after it"),
        ("key-a a;drop\n", ("--api-keys", "key-a"), "line 1: 'a;drop' is not a table name"),
        ("key-a *a\n", ("--api-keys", "key-a"), "line 1: '*a' is not a table name"),
        ("key-a a\n", (), "--key-tables-file names the tables of each API key: give the keys"),
    ],
)
def test_a_file_that_is_not_right_is_refused_naming_its_line(tmp_path, text, more, message):
    with pytest.raises(ConfigError) as refused:
        _config(tmp_path, text, *more)
    assert message in str(refused.value)


def test_a_file_that_cannot_be_read_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"--key-tables-file .*missing: No such file"):
        read_key_tables(tmp_path / "missing", ["k"])


def test_without_keys_one_tenant_uses_every_table():
    access = TableAccess()
    assert access.allows(None, "anything") and access.of(None) is None
    bind_key(None)
    access.check("anything", "sink")  # nothing raised


def test_a_refusal_is_403_naming_only_the_caller_s_own_tables():
    access = TableAccess(True, ("key-op",), {"key-a": ("a_*",), "key-b": ("b_docs",)})
    bind_key("key-b")
    with pytest.raises(ApiError) as refused:
        access.check("a_docs", "table")
    assert (refused.value.code, refused.value.status, refused.value.param) == (ErrorCode.FORBIDDEN, 403, "table")
    assert refused.value.message == "this API key may not use table 'a_docs'; its tables: b_docs"
    bind_key("key-c")
    with pytest.raises(ApiError, match="it may use none"):
        access.check("b_docs", "sink")


def test_a_job_s_table_is_checked_by_name_before_the_key_s_access():
    """Of an allowed store: the table's name first (400, before anything is connected to), then the key's
    right to it (403); the URL a key may use comes back with the gateway's credentials."""
    pg = "postgresql://loader:pw@db.internal:5432/docs"
    targets = SinkTargets((pg, LANCE), TableAccess(True, (), {"key-a": ("a_*",)}))
    bind_key("key-a")
    assert targets.granted("postgresql://db.internal:5432/docs?table=a_docs") == f"{pg}?table=a_docs"
    assert targets.granted(f"{LANCE}?table=a_x") == f"{LANCE}?table=a_x"
    for url, status in (
        ("postgresql://db.internal:5432/docs?table=b_docs", 403),
        (f"{LANCE}?table=b_docs", 403),
        ("postgresql://db.internal:5432/docs", 403),  # the sink's default table, "embeddings"
        ("postgresql://db.internal:5432/docs?table=pg_authid", 400),
        ("postgresql://db.internal:5432/docs?table=a_x;drop", 400),
    ):
        with pytest.raises(ApiError) as refused:
            targets.granted(url)
        assert (refused.value.status, refused.value.param) == (status, "sink"), url
