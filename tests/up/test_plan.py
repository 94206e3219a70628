"""`embedfleet up`'s plan: which models it serves (--model [ID=]DIR, --models-file, the environment),
the default model, and the processes each model gets."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import socket
from pathlib import Path

import pytest

from embedfleet.services.cli.main import build_parser
from embedfleet.services.up.plan import children, default_model, roles, served_models, split_entry, with_metrics
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.model_dir.folder import DEFAULT_MODEL_ID, default_model_path
from embedfleet.shared.model_dir.load import load_model_info


@pytest.fixture
def two_folders(tmp_path) -> tuple[Path, Path]:
    """Two copies of the shipped model, as folders of other names."""
    a, b = tmp_path / "alpha", tmp_path / "beta"
    shutil.copytree(default_model_path(), a)
    shutil.copytree(default_model_path(), b)
    return a, b


def _plan(*argv: str):
    ns = build_parser().parse_args(["up", *argv])
    return ns, served_models(ns)


@pytest.fixture(autouse=True)
def _no_model_env(monkeypatch):
    for name in ("EMBEDFLEET_MODEL", "EMBEDFLEET_MODEL_NAME", "EMBEDFLEET_MODELS_FILE", "EMBEDFLEET_DEFAULT_MODEL"):
        monkeypatch.delenv(name, raising=False)


def test_no_model_serves_the_shipped_one():
    ns, infos = _plan()
    assert [i.id for i in infos] == [DEFAULT_MODEL_ID]
    assert default_model(ns, infos) is infos[0]
    _, infos = _plan("--model-name", "mini")
    assert [i.id for i in infos] == ["mini"]


def test_several_models_in_order_with_ids(two_folders):
    a, b = two_folders
    ns, infos = _plan("--model", str(a), "--model", f"org/bee={b}", "--default-model", "bee")
    assert [(i.id, i.path) for i in infos] == [("alpha", a.resolve()), ("org/bee", b.resolve())]
    assert default_model(ns, infos).id == "org/bee"  # named by its last path part
    ns, infos = _plan("--model", str(a), "--model-name", "only")
    assert [i.id for i in infos] == ["only"]


def test_a_folder_whose_name_holds_an_equals_sign(tmp_path):
    odd = tmp_path / "x=y"
    shutil.copytree(default_model_path(), odd)
    assert split_entry(str(odd)) == (None, str(odd))
    assert split_entry(f"id={odd}") == ("id", str(odd))
    assert split_entry(" id = /some/dir ") == ("id", "/some/dir")


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--model", "{a}", "--model", "{b}", "--model-name", "x"], "with several, give each its id as --model ID=DIR"),
        (["--model", "x={a}", "--model-name", "y"], "give the id once"),
        (["--model", "{a}", "--model", "alpha={b}"], "two models would be served as 'alpha'"),
        (["--model", "a/b={a}", "--model", "a_b={b}"], "two models would be served as 'a/b'"),  # one subject token
        (["--model", "{a}", "--model", "={b}"], "give ID=DIR, or DIR alone"),
        (["--model", "{a}", "--model", "{a}/missing"], "is not a folder"),
        (["--model", "{a}", "--default-model", "gamma"], "--default-model 'gamma' is none of the models served: alpha"),
    ],
)
def test_bad_model_lists_are_refused(two_folders, argv, fragment):
    a, b = two_folders
    argv = [x.format(a=a, b=b) for x in argv]
    with pytest.raises(ConfigError) as err:
        ns, infos = _plan(*argv)
        default_model(ns, infos)
    assert fragment in str(err.value)


def test_models_file_and_environment(two_folders, tmp_path, monkeypatch):
    a, b = two_folders
    listing = tmp_path / "models.txt"
    listing.write_text(f"# served models\n\nalpha   # relative to the file\nb2={b}\n")
    _, infos = _plan("--model", f"first={a}", "--models-file", str(listing))
    assert [(i.id, i.path) for i in infos] == [("first", a.resolve()), ("alpha", a.resolve()), ("b2", b.resolve())]
    monkeypatch.setenv("EMBEDFLEET_MODEL", f"{a},bee={b}")
    _, infos = _plan()
    assert [i.id for i in infos] == ["alpha", "bee"]
    _, infos = _plan("--model", str(b))  # a flag wins over the environment
    assert [i.id for i in infos] == ["beta"]
    (tmp_path / "empty.txt").write_text("# nothing\n")
    with pytest.raises(ConfigError, match="names no model"):
        _plan("--models-file", str(tmp_path / "empty.txt"))
    with pytest.raises(ConfigError, match="No such file"):
        _plan("--models-file", str(tmp_path / "absent.txt"))


def test_each_model_gets_the_processes_it_needs(tmp_path):
    embedder = load_model_info(None)
    reranker = dataclasses.replace(embedder, id="ce", task="score", dim=1)
    classifier = dataclasses.replace(embedder, id="nli", task="score", dim=3)
    sparse = dataclasses.replace(embedder, id="splade", outputs=("sparse",))
    assert roles(embedder) == ("tokenizer", "worker", "scorer")  # cosine reranking
    assert roles(reranker) == ("tokenizer", "worker", "scorer")
    assert roles(classifier) == ("tokenizer", "worker")  # the scorer needs one label
    assert roles(sparse) == ("tokenizer", "worker")
    plan = children([embedder, classifier], ["--nats", "nats://x:1"], ["--port", "1"], tmp_path)
    assert [c.name for c in plan] == [
        f"tokenizer[{embedder.id}]",
        f"worker[{embedder.id}]",
        f"scorer[{embedder.id}]",
        "tokenizer[nli]",
        "worker[nli]",
        "gateway",
    ]
    assert len({c.ready for c in plan}) == len(plan) and all(c.ready.parent == tmp_path for c in plan)
    worker = plan[4]
    assert worker.args[worker.args.index("--model-name") + 1] == "nli"
    assert worker.args[worker.args.index("--model") + 1] == str(embedder.path)
    assert plan[-1].args[-2:] == ("--port", "1")


def test_every_process_gets_a_metrics_url(tmp_path):
    """`up` gives each process but the gateway a metrics port of its own (a worker of n replicas: n in
    a row); the gateway's metrics are on its HTTP port. The banner lists every URL, one a line."""
    from embedfleet.services.up.launch import FreePorts, _banner

    embedder = load_model_info(None)
    plan = children([embedder], ["--nats", "nats://x:1"], ["--port", "8080"], tmp_path)
    asked = []

    def ports(count: int) -> int:
        asked.append(count)
        return 9000 + 10 * len(asked)

    planned = with_metrics(plan, "127.0.0.1", "http://127.0.0.1:8080", 2, ports)
    by_role = {c.role: c for c in planned}
    assert asked == [1, 2, 1]  # tokenizer, worker (two replica processes on a CPU), scorer
    assert by_role["tokenizer"].args[-4:] == ("--metrics-port", "9010", "--metrics-host", "127.0.0.1")
    assert by_role["worker"].metrics == "http://127.0.0.1:9020/metrics"
    assert by_role["scorer"].metrics == "http://127.0.0.1:9030/metrics"
    assert by_role["gateway"].metrics == "http://127.0.0.1:8080/metrics"
    assert "--metrics-port" not in by_role["gateway"].args
    banner = _banner([embedder], embedder, "http://127.0.0.1:8080", "nats://x:1", planned, 2)
    lines = [line.split() for line in banner.splitlines() if line.strip().endswith("/metrics") or "replica" in line]
    assert [line[:2] for line in lines] == [[c.name, c.metrics] for c in planned]
    assert "ports 9020-9021" in banner

    with contextlib.closing(FreePorts("127.0.0.1")) as free:
        first, block = free(1), free(3)
        assert first not in range(block, block + 3)
        for port in range(block, block + 3):  # held until closed: nobody else gets them meanwhile
            with socket.socket() as s, pytest.raises(OSError):
                s.bind(("127.0.0.1", port))
    with socket.socket() as s:
        s.bind(("127.0.0.1", block))  # free again


def test_the_gateway_s_api_keys_travel_in_the_environment(monkeypatch):
    from embedfleet.services.up.launch import _gateway_args
    from embedfleet.services.up.plan import secret_environment

    monkeypatch.delenv("EMBEDFLEET_API_KEYS", raising=False)
    ns = build_parser().parse_args(["up", "--api-keys", "k-one,k-two"])
    env = secret_environment(ns)
    assert env == {"EMBEDFLEET_API_KEYS": "k-one,k-two"}
    assert "--api-keys" not in _gateway_args(ns, env) and not any("k-one" in a for a in _gateway_args(ns, env))
    assert secret_environment(build_parser().parse_args(["up"])) == {}


def test_the_gateway_s_operator_keys_travel_in_the_environment_too(monkeypatch):
    from embedfleet.services.up.launch import _gateway_args
    from embedfleet.services.up.plan import secret_environment

    for name in ("EMBEDFLEET_API_KEYS", "EMBEDFLEET_OPERATOR_KEYS"):
        monkeypatch.delenv(name, raising=False)
    ns = build_parser().parse_args(["up", "--api-keys", "k-one", "--operator-keys", "op-one"])
    env = secret_environment(ns)
    assert env == {"EMBEDFLEET_API_KEYS": "k-one", "EMBEDFLEET_OPERATOR_KEYS": "op-one"}
    args = _gateway_args(ns, env)
    assert "--operator-keys" not in args and not any("op-one" in a for a in args)


def test_the_search_store_url_travels_in_the_environment_and_is_checked_before_start(monkeypatch):
    from embedfleet.services.gateway.config import GatewayConfig
    from embedfleet.services.up.launch import _gateway_args
    from embedfleet.services.up.plan import secret_environment

    for name in (
        "EMBEDFLEET_API_KEYS",
        "EMBEDFLEET_OPERATOR_KEYS",
        "EMBEDFLEET_SEARCH_SINK",
        "EMBEDFLEET_SEARCH_MODEL",
    ):
        monkeypatch.delenv(name, raising=False)
    url = "postgresql://reader:pw-9@db:5432/docs?table=chunks"
    ns = build_parser().parse_args(["up", "--search-sink", url, "--search-model", "all-MiniLM-L6-v2"])
    env = secret_environment(ns)
    assert env == {"EMBEDFLEET_SEARCH_SINK": url}
    args = _gateway_args(ns, env)
    assert not any("pw-9" in a for a in args) and args[args.index("--search-model") + 1] == "all-MiniLM-L6-v2"
    monkeypatch.setenv("EMBEDFLEET_SEARCH_SINK", url)  # the child's environment, as `up` gives it
    child = GatewayConfig.from_namespace(
        build_parser().parse_args(["gateway", "--nats", "nats://127.0.0.1:4222", *args])
    )
    assert (child.search_sink, child.search_model) == (url, "all-MiniLM-L6-v2")
    with pytest.raises(ConfigError, match="--search-sink: unknown sink 'mysql://'"):
        GatewayConfig.from_namespace(
            build_parser().parse_args(["gateway", "--nats", "nats://127.0.0.1:4222", "--search-sink", "mysql://h/db"])
        )
    monkeypatch.delenv("EMBEDFLEET_SEARCH_SINK")
    with pytest.raises(ConfigError, match="give --search-sink"):
        GatewayConfig.from_namespace(
            build_parser().parse_args(["gateway", "--nats", "nats://127.0.0.1:4222", "--search-model", "m"])
        )


def test_the_local_pgvector_becomes_the_gateways_store_unless_one_is_given(monkeypatch):
    """`up --with-pgvector`: the gateway searches the table documents of the local PostgreSQL with the
    default model (the first dense embedder where the default is none), unless --search-sink is given;
    a --search-model given stays; the URL travels in the environment as a given one does."""
    from embedfleet.services.up.launch import _gateway_args
    from embedfleet.services.up.plan import secret_environment, with_search_store

    for name in ("EMBEDFLEET_SEARCH_SINK", "EMBEDFLEET_SEARCH_MODEL", "EMBEDFLEET_JOB_SINKS"):
        monkeypatch.delenv(name, raising=False)
    url = "postgresql://postgres@/postgres?host=/data/.embedfleet/pgvector"
    embedder = load_model_info(None)
    other = dataclasses.replace(embedder, id="e5")
    reranker = dataclasses.replace(embedder, id="ce", task="score", dim=1)
    sparse = dataclasses.replace(embedder, id="splade", outputs=("sparse",))
    ns = build_parser().parse_args(["up", "--with-pgvector"])
    got = with_search_store(ns, url, "documents", [embedder, other], other)
    assert (got.search_sink, got.search_model) == (f"{url}&table=documents", "e5")
    assert ns.search_sink is None  # a copy: the parsed options stay as given
    assert secret_environment(got) == {"EMBEDFLEET_SEARCH_SINK": f"{url}&table=documents", "EMBEDFLEET_JOB_SINKS": url}
    args = _gateway_args(got, secret_environment(got))
    assert args[args.index("--search-model") + 1] == "e5" and "--search-sink" not in args
    got = with_search_store(ns, url, "documents", [reranker, sparse, embedder], reranker)
    assert got.search_model == embedder.id  # the default ranks only: the first dense embedder
    alone = with_search_store(ns, url, "documents", [reranker, sparse], reranker)  # nothing to search with
    assert alone.search_sink is None and alone.job_sinks == url  # jobs may still write into the store
    pinned = build_parser().parse_args(["up", "--with-pgvector", "--search-model", "e5"])
    assert with_search_store(pinned, url, "documents", [embedder, other], embedder).search_model == "e5"
    given = build_parser().parse_args(["up", "--with-pgvector", "--search-sink", "qdrant://h:6333?collection=c"])
    assert with_search_store(given, url, "documents", [embedder], embedder).search_sink == given.search_sink
    mine = build_parser().parse_args(["up", "--with-pgvector", "--job-sinks", "lancedb:///srv/l"])
    assert with_search_store(mine, url, "documents", [embedder], embedder).job_sinks == "lancedb:///srv/l"


def test_the_local_pgvector_refuses_a_folder_it_cannot_use_and_names_what_to_install(tmp_path):
    import subprocess
    import sys

    from embedfleet.services.up.pgvector import LocalPgvector

    (tmp_path / "file" / "pgvector").parent.mkdir()
    (tmp_path / "file" / "pgvector").write_text("")
    (tmp_path / "full" / "pgvector").mkdir(parents=True)
    (tmp_path / "full" / "pgvector" / "notes.txt").write_text("mine")
    for data_dir, problem in (
        ("file", "is not a folder"),
        ("full", "holds files but no PostgreSQL data (no PG_VERSION)"),
        ("my data", "has a space in its path, which pgserver's PostgreSQL cannot take"),
    ):
        with pytest.raises(ConfigError) as exc:
            LocalPgvector(tmp_path / data_dir).start()
        assert str(exc.value) == (
            f"--with-pgvector: {tmp_path / data_dir / 'pgvector'} {problem}: PostgreSQL keeps its "
            "data there; move it away, or start up with another --data-dir"
        )
    assert (tmp_path / "full" / "pgvector" / "notes.txt").read_text() == "mine"  # nothing touched
    # pgserver not installed (None in sys.modules: its import fails as for a missing package)
    code = (
        "import sys; sys.modules['pgserver'] = None\n"
        "from embedfleet.services.cli.main import main; main(['up', '--with-pgvector', '--data-dir', sys.argv[1]])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "none")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(
        "embedfleet: error: --with-pgvector needs the packages pgserver, psycopg and pgvector "
        "(the extra local-pgvector), missing here ("
    )
    assert f"`{sys.executable} -m pip install -e '.[local-pgvector]'`" in done.stderr
    assert not (tmp_path / "none").exists()  # refused before anything started
