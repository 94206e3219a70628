"""The machinery of an option, none of the options themselves (those are declared in shared/config/sections/).

``Option``: one command-line option, its flag, environment variables, default, parser and help, and
what is made from them (an argparse argument, the value a child process is given, a row of the
table of docs/options.md); ``declare``, how the sections write one; the value parsers an option names (``positive_int``,
``port_number``…); ``ConfigError``.

A value comes from the flag, else from the first environment variable set (an empty one is unset),
else from the default. A secret has no flag (``ps`` would show it): it is read from its variable only,
as is a setting of the machine rather than of the command (where nats-server is).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    """A missing or invalid option; the message names the option and the bad value."""


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError(text)
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError(text)
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise ValueError(text)
    return value


def port_number(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise ValueError(text)
    return value


def budget(text: str) -> int | None:
    """'auto' (calibrate at start-up) or a positive number of tokens."""
    return None if text == "auto" else positive_int(text)


class _Append(argparse.Action):
    """``action="append"`` whose default (the environment's list) is replaced by the flags given, not
    added to: a flag wins over the environment here too."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        items = getattr(namespace, self.dest, None)
        setattr(namespace, self.dest, [*([] if items is self.default or items is None else items), values])


@dataclass(frozen=True, slots=True)
class Option:
    """``kind``: "value" (takes one value), "list" (repeatable; its variable holds the values comma
    separated), "switch" (no value: on when given; no variable), "secret" (a variable, no flag) or
    "variable" (a variable, no flag, not secret)."""

    flag: str  # "--port"; a variable without a flag: its name, as the dest
    env: tuple[str, ...]
    default: Any
    help: str
    commands: frozenset[str]
    group: str  # the part of the stack the option belongs to ("gateway", "metrics", ...): what `up` passes on
    type: Callable[[str], Any] = str
    choices: tuple | None = None
    kind: str = "value"
    required: bool = False
    metavar: str | None = None
    shows_value: bool = True  # False: --help never prints its value (it may carry credentials or keys)

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def secret(self) -> bool:
        return self.kind == "secret"

    @property
    def env_only(self) -> bool:
        return self.kind in ("secret", "variable")

    def parse(self, raw: str, source: str) -> Any:
        """``raw`` as the option's value; ``source`` names where it came from in the error."""
        try:
            value = self.type(raw)
        except ValueError:
            raise ConfigError(f"{source}={raw!r} is not a valid value for {self.flag}") from None
        if self.choices and value not in self.choices:
            raise ConfigError(f"{source}={raw!r}: choose one of {', '.join(map(str, self.choices))}")
        return value

    def from_env(self, environ: Mapping[str, str]) -> Any:
        """The value the environment gives (its default where no variable is set)."""
        for name in self.env:
            raw = environ.get(name)
            if raw:
                if self.kind == "list":
                    return [self.parse(item.strip(), f"${name}") for item in raw.split(",") if item.strip()] or None
                return raw if self.env_only else self.parse(raw, f"${name}")
        return self.default

    def value(self, environ: Mapping[str, str]) -> Any:
        """The value a parser built under ``environ`` gives when the flag is not given (argparse parses
        a default given as text, as it would the flag's)."""
        default = self.from_env(environ)
        return self.type(default) if isinstance(default, str) and not self.env_only else default

    def add_to(self, parser: argparse.ArgumentParser, environ: Mapping[str, str], suppress: bool = False) -> None:
        """Add the flag, its default taken from ``environ``; ``suppress``: a flag not given leaves the
        namespace as it is (an option accepted again after a sub-command)."""
        if self.env_only:
            return
        if self.kind == "switch":
            unset: dict[str, Any] = {"default": argparse.SUPPRESS} if suppress else {}
            parser.add_argument(self.flag, action="store_true", help=self.help, **unset)
            return
        default = self.from_env(environ)
        value = f"; default {default!r}" if self.shows_value else ""
        shown = f" (env {' or '.join(self.env)}{value})" if self.env else ""
        extra: dict[str, Any] = {"metavar": self.metavar} if self.metavar else {}
        if self.kind == "list":
            extra["action"] = _Append
        else:
            extra["choices"] = self.choices
        parser.add_argument(
            self.flag,
            default=argparse.SUPPRESS if suppress else default,
            type=self.type,
            required=self.required,
            help=self.help.replace("%", "%%") + shown,
            **extra,
        )

    def arguments(self, value: Any, environ: Mapping[str, str]) -> list[str]:
        """The arguments that give a child process, started with ``environ``, this ``value``: none where
        its environment gives it already (a variable without a flag never: it travels in the environment)."""
        if self.env_only or value is None or (self.kind != "switch" and value == self.value(environ)):
            return []
        if self.kind == "switch":
            return [self.flag] if value else []
        if self.kind == "list":
            return [arg for item in value for arg in (self.flag, str(item))]
        return [self.flag, str(value)]

    def table_row(self, commands: str) -> str:
        flag = "none: environment only" if self.env_only else f"`{self.flag}`"
        env = " or ".join(f"`{name}`" for name in self.env) or "none"
        default = (
            "required"
            if self.required
            else "none"
            if self.default is None
            else "off"
            if self.kind == "switch"
            else "empty"
            if self.default == ""
            else f"`{self.default}`"
        )
        meaning = self.help.replace("|", "\\|")
        return f"| {flag} | {env} | {default} | {commands} | {meaning} |"


def declare(
    flag: str,
    env: str | tuple[str, ...] | None,
    default: Any,
    help: str,
    commands: Iterable[str],
    group: str,
    **more: Any,
) -> Option:
    """An ``Option`` as the sections declare one: ``env`` one variable's name, several, or None; ``commands``
    any collection of command names."""
    names = (env,) if isinstance(env, str) else env or ()
    return Option(flag, names, default, help, frozenset(commands), group, **more)
