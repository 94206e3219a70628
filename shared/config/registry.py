"""The registry of options: lookups over the declarations (every option of every ``embedfleet`` command,
declared once in shared/config/sections/, one ``Option`` each: shared/config/option.py) and what is made of them.

From that one list are made: each command's argparse parser (``add_options``), the config dataclasses'
fields that hold options (``setting``: the declared default, filled from the parsed options by
``from_options``), the arguments ``embedfleet up`` and the CPU replica launcher give their child
processes (``arguments``), the option table of docs/options.md (``markdown_table``) and the set of environment
variables each command reads, which the Kubernetes manifests are checked against (``env_names``).
"""

from __future__ import annotations

import argparse
import copy
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import field, fields
from typing import Any, TypeVar

from embedfleet.shared.config.commands import COMMANDS, CONNECTED
from embedfleet.shared.config.option import ConfigError, Option
from embedfleet.shared.config.sections import OPTIONS

__all__ = [
    "COMMANDS",
    "ConfigError",
    "OPTIONS",
    "add_options",
    "arguments",
    "declared",
    "default",
    "env_names",
    "from_options",
    "markdown_table",
    "setting",
    "settings_of",
]

T = TypeVar("T")


def declared(command: str, groups: Iterable[str] | None = None) -> list[Option]:
    """The options ``command`` takes (those of ``groups`` only, when given), in declaration order."""
    wanted = None if groups is None else set(groups)
    return [o for o in OPTIONS if command in o.commands and (wanted is None or o.group in wanted)]


def option(dest: str, command: str | None = None) -> Option:
    """The one declaration of ``dest`` (for ``command``, where commands declare it differently)."""
    found = [o for o in OPTIONS if o.dest == dest and (command is None or command in o.commands)]
    if not found:
        raise LookupError(f"no option {dest!r}" + (f" for {command!r}" if command else "") + " is declared")
    if len({(o.default, o.env) for o in found}) != 1:
        raise LookupError(
            f"{dest!r} is declared {len(found)} ways (commands "
            + ", ".join(sorted({c for o in found for c in o.commands}))
            + "): name the command"
        )
    return found[0]


def default(dest: str, command: str | None = None) -> Any:
    """The declared default of ``dest``, parsed as a flag's text is (what a config's field defaults to)."""
    return option(dest, command).value({})


_OPTION = "option"  # a config field's metadata key: the option (dest, command) it holds
_CONVERT = "convert"  # and what makes the field's value of the option's


def setting(dest: str, command: str | None = None, convert: Callable[[Any], Any] | None = None) -> Any:
    """A config dataclass field that holds option ``dest``: its default is the declared one (``convert``ed:
    how the field's value is made of the option's), and ``from_options`` fills it from a namespace."""
    value = default(dest, command)
    made = convert(value) if convert else value
    meta = {_OPTION: (dest, command), _CONVERT: convert}
    if isinstance(made, (list, dict, set)):  # a mutable default: a fresh copy for each config
        return field(default_factory=lambda: copy.copy(made), metadata=meta)
    return field(default=made, metadata=meta)


def settings_of(cls: type) -> dict[str, tuple[str, Callable[[Any], Any] | None]]:
    """A config class's ``setting`` fields: field name -> (the option's dest, its ``convert``)."""
    return {f.name: (f.metadata[_OPTION][0], f.metadata[_CONVERT]) for f in fields(cls) if _OPTION in f.metadata}


def from_options(cls: type[T], ns: argparse.Namespace, **given: Any) -> T:
    """A ``cls`` config: every ``setting`` field from ``ns`` (the parsed options), the rest ``given``."""
    values = dict(given)
    for name, (dest, convert) in settings_of(cls).items():
        if name not in values:
            value = getattr(ns, dest)
            values[name] = convert(value) if convert else value
    return cls(**values)


def add_options(
    parser: argparse.ArgumentParser, command: str, environ: Mapping[str, str] | None = None, suppress: bool = False
) -> None:
    """Add every option of ``command``, their defaults from ``environ`` (the process's environment);
    ``suppress``: options taken again after an action leave what was given before it (see ``jobs``)."""
    environ = os.environ if environ is None else environ
    for o in declared(command):
        o.add_to(parser, environ, suppress)


def arguments(
    ns: argparse.Namespace,
    command: str,
    groups: Iterable[str] | None = None,
    environ: Mapping[str, str] | None = None,
    skip: Iterable[str] = (),
    **values: Any,
) -> list[str]:
    """The arguments that give a ``command`` process started with ``environ`` the options of ``ns``
    (those of ``groups``; not those in ``skip``, by dest), ``values`` (by dest) replacing them.
    What the child's environment gives already is not repeated, and secrets stay in the environment."""
    environ = os.environ if environ is None else environ
    args: list[str] = []
    for o in declared(command, groups):
        if o.dest not in skip:
            args += o.arguments(values[o.dest] if o.dest in values else getattr(ns, o.dest, None), environ)
    return args


def env_names(command: str) -> set[str]:
    """Every environment variable ``command`` reads."""
    return {name for o in declared(command) for name in o.env}


def markdown_table() -> str:
    """The table of options in docs/options.md: a row a declaration, with the commands that take it."""
    rows = ["| flag | environment | default | commands | meaning |", "|---|---|---|---|---|"]
    for o in OPTIONS:
        if o.commands >= CONNECTED:  # "all", naming those of the commands that meet no NATS it leaves out
            left_out = [c for c in COMMANDS if c not in CONNECTED and c not in o.commands and not c.startswith("jobs ")]
            commands = "all" + (f" but {' and '.join(left_out)}" if left_out else "")
        else:
            commands = ", ".join(c for c in COMMANDS if c in o.commands)
        rows.append(o.table_row(commands))
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # docs/options.md's table, to paste between its options markers
    print(markdown_table(), end="")
