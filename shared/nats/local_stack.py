"""Where the local stack `embedfleet up` runs, recorded in its data folder for the other commands.

`up` picks a free port for its embedded nats-server and makes a new token at every start. Once the
server answers it writes ``<data dir>/stack.json`` (atomically: a reader sees the whole record or
none) with the server's URL, the token file, its own pid and its default model, and removes it when
it stops. The one-shot commands (``reindex``, ``jobs``, ``init``), ``FleetClient`` and the service
commands (``gateway``, ``tokenizer``, ``worker``, ``scorer``) read it when they are given no NATS URL
and no credentials, so the commands the README and docs/ show find the stack without copying a port or a
token after a restart.

Where they look, in order, the first folder that records a running `up` winning: ``--data-dir``,
``$EMBEDFLEET_DATA_DIR``, ``./.embedfleet`` (each once). With none found they try
``nats://127.0.0.1:4222`` and, where nothing answers there, say every place they looked.

The default model (a command given no model) is one for the HTTP routes and the commands: the one
`up` gives its gateway (``--default-model``, else its first ``--model``), as recorded; with no record
(a NATS URL given), the fleet's only model, and none when it serves several (name one).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.config.registry import default, option
from embedfleet.shared.config.sections.nats import PASSWORD_ENV, TOKEN_ENV
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.model_dir.info import same_model
from embedfleet.shared.nats.config import NATS_SECURITY_ENV

RECORD = "stack.json"
FALLBACK_URL = "nats://127.0.0.1:4222"  # no URL given and no stack recorded


@dataclass(frozen=True, slots=True)
class LocalStack:
    """A running `up`: its NATS URL (no credentials), the file holding the token NATS asks for, its
    pid, and the model requests naming none use (None: a record of an `up` that did not say)."""

    url: str
    token_file: str | None
    pid: int
    default_model: str | None = None

    def write(self, data_dir: Path) -> Path:
        """Write the record into ``data_dir`` atomically (a temporary file renamed over it); its path."""
        data_dir.mkdir(parents=True, exist_ok=True)
        path = data_dir / RECORD
        fd, tmp = tempfile.mkstemp(dir=data_dir, prefix=".stack-", suffix=".json")
        record = {"url": self.url, "token_file": self.token_file, "pid": self.pid, "default_model": self.default_model}
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(record, f)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path


def record_stack(data_dir: str | Path, url: str, token_file: Path | None, default_model: str | None = None) -> Path:
    """Record this process's stack (NATS at ``url``, its token in ``token_file``, ``default_model`` the
    id its gateway uses for requests naming none) in ``data_dir``."""
    token = str(Path(token_file).resolve()) if token_file else None
    return LocalStack(url, token, os.getpid(), default_model).write(Path(data_dir))


def forget_stack(data_dir: str | Path) -> None:
    """Remove the record of this process's stack (one another `up` wrote since stays)."""
    found = read_stack(Path(data_dir))
    if found is not None and found.pid == os.getpid():
        (Path(data_dir) / RECORD).unlink(missing_ok=True)


def read_stack(data_dir: Path) -> LocalStack | None:
    """The stack recorded in ``data_dir``; None when there is none, or its `up` no longer runs (killed
    before it could remove the record)."""
    try:
        raw = json.loads((data_dir / RECORD).read_text())
        model = raw.get("default_model")
        stack = LocalStack(str(raw["url"]), raw.get("token_file"), int(raw["pid"]), str(model) if model else None)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return stack if _alive(stack.pid) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it runs
        return True
    return True


def stack_folders(ns: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> list[Path]:
    """The folders a stack record is looked for in, in order, each once: the --data-dir flag's alone when
    it is given (a folder named is the one meant: another stack found elsewhere would be the wrong one),
    else $EMBEDFLEET_DATA_DIR, then the default ./.embedfleet."""
    given = getattr(ns, "data_dir", None)
    variables = [environ.get(name) for name in option("data_dir").env]
    if given and given not in variables and given != default("data_dir"):  # the flag's own value
        return [Path(given).absolute()]
    folders: list[Path] = []
    for folder in [given, *variables, default("data_dir")]:
        if folder and (path := Path(folder).absolute()) not in folders:
            folders.append(path)
    return folders


def nats_given(ns: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether a NATS URL or any NATS credential is given. The flags' defaults come from their
    environment variables already; the secrets themselves only travel in the environment."""
    return (
        getattr(ns, "nats", None) is not None
        or any(getattr(ns, dest, None) for dest in NATS_SECURITY_ENV)
        or any(environ.get(name) for name in (PASSWORD_ENV, TOKEN_ENV))
    )


@dataclass(frozen=True, slots=True)
class NatsSource:
    """Where a command's NATS URL came from: given, a recorded stack, or the default (nothing given,
    nothing recorded in ``looked``)."""

    said: str  # for errors: "given by --nats or the environment", "recorded in ... by `embedfleet up` ..."
    stack: LocalStack | None = None  # the stack recorded, when the URL is its
    looked: tuple[Path, ...] = ()  # the records looked for, none running (the default URL is tried)

    @property
    def fallback(self) -> bool:
        """No URL, no credential and no stack: the default URL, which nothing may answer."""
        return bool(self.looked)

    def unreachable(self, problem: str) -> ConfigError:
        """The error for a NATS at this URL that did not answer (``problem``: what was tried, and why not)."""
        if self.fallback:
            return ConfigError(
                f"no NATS server at {FALLBACK_URL} (the default; no running `embedfleet up` recorded in "
                f"{_either(self.looked)}): start `embedfleet up`, or give --nats URL"
            )
        return ConfigError(f"{problem}; that URL is {self.said}")


def _either(folders: Sequence[Path]) -> str:
    records = [str(folder / RECORD) for folder in folders]
    return records[0] if len(records) == 1 else f"{', '.join(records[:-1])} or {records[-1]}"


def use_local_stack(ns: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> NatsSource:
    """Give ``ns`` the URL and token file of the first stack recorded in ``stack_folders`` when no NATS
    URL or credential is given (else the default URL); says where the URL came from."""
    if nats_given(ns, environ):
        ns.nats = ns.nats or FALLBACK_URL  # credentials without a URL: the default server
        return NatsSource("given by --nats or the environment" if ns.nats != FALLBACK_URL else "the default")
    folders = stack_folders(ns, environ)
    for folder in folders:
        if (stack := read_stack(folder)) is not None:
            break
    else:
        ns.nats = FALLBACK_URL
        return NatsSource(
            f"the default, as no running `embedfleet up` is recorded in {_either(folders)}", None, tuple(folders)
        )
    record = folder / RECORD
    if stack.token_file and not Path(stack.token_file).is_file():
        raise ConfigError(
            f"{record} names the token file {stack.token_file}, which is not there: start "
            "`embedfleet up` again, or give --nats and its credentials"
        )
    ns.nats, ns.nats_token_file = stack.url, stack.token_file
    return NatsSource(f"recorded in {record} by `embedfleet up` (pid {stack.pid})", stack)


class NoDefaultModel(ValueError):
    """No model for a request that names none; ``code``: the error code it is answered with."""

    def __init__(self, message: str, code: ErrorCode) -> None:
        super().__init__(message)
        self.code = code


def default_model(served: Sequence[str], recorded: str | None) -> str:
    """The served id a request naming no model uses: the stack's recorded default, else the only model
    ``served``; NoDefaultModel when there is none, or several and no record says which."""
    if recorded is not None:
        found = next((m for m in served if same_model(recorded, m)), None)
        if found is None:
            raise NoDefaultModel(
                f"the stack's default model {recorded!r} is not served right now; served: {', '.join(served) or 'none'}",
                ErrorCode.NO_RESPONDERS,
            )
        return found
    if len(served) == 1:
        return served[0]
    if not served:
        raise NoDefaultModel("no tokenizer and worker are serving any model right now", ErrorCode.NO_RESPONDERS)
    raise NoDefaultModel(
        f"several models are served ({', '.join(served)}) and no `embedfleet up` recorded which is the default: name one",
        ErrorCode.INVALID_REQUEST,
    )
