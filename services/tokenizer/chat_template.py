"""(query, document) pairs rendered by a model's chat template, as sentence-transformers renders them.

A CrossEncoder on a causal LM (an LLM reranker) turns each pair into two messages, roles "query" and
"document", after a "system" message holding the prompt when one applies, and renders them with the
tokenizer's chat template through transformers' ``apply_chat_template``: a sandboxed Jinja environment
(trim_blocks, lstrip_blocks, loop controls, its ``tojson`` and helpers), no generation prompt, the
tokenizer's named special tokens as variables. This module is that rendering, so the text the tokenizer
then encodes is the reference's, character for character.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from embedfleet.shared.config.option import ConfigError

# transformers' named special tokens (``special_tokens_map``), the variables a template may read
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# sentence-transformers' probes of whether the template carries both roles (PAIR_ROLE_PROBES)
_PROBES = (("alpha", "bravo"), ("charlie", "bravo"), ("alpha", "foxtrot"))
Messages = list[dict[str, Any]]


class _Generation(Extension):
    """``{% generation %}…{% endgeneration %}`` (transformers marks assistant turns so): its body as is."""

    tags = {"generation"}  # noqa: RUF012 (jinja2's Extension reads it so)

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys: bool = False
) -> str:
    # transformers' filter: JSON without Jinja's HTML escaping
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def special_token_variables(tokenizer_config: dict[str, Any]) -> dict[str, str]:
    """The named special tokens of tokenizer_config.json (a string, or an AddedToken dict's content), and
    named extras (``extra_special_tokens`` as a dict, e.g. ``image_token``), which transformers 5 adds."""
    extra = tokenizer_config.get("extra_special_tokens")
    extra = extra if isinstance(extra, dict) else {}
    found = {}
    for name in (*SPECIAL_TOKENS, *map(str, extra)):
        value = tokenizer_config.get(name, extra.get(name))
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            found[name] = value
    return found


class PairTemplate:
    """Renders pairs with one chat template; ``message_format`` "flat" gives content as a string,
    "structured" as a list of typed parts ``[{"type": "text", "text": …}]``."""

    def __init__(self, source: str, message_format: str, variables: dict[str, str]) -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise ConfigError(f"the chat template does not parse: {exc}") from None
        self._structured = message_format == "structured"
        self._variables = {k: v for k, v in variables.items() if k not in ("messages", "tools", "documents")}

    def messages(self, query: str, document: str, system: str | None = None) -> Messages:
        """sentence-transformers' ``pair_to_messages``, after ``prepend_prompt_to_messages`` when a prompt applies."""
        turns = [("system", system)] if system else []
        turns += [("query", query), ("document", document)]
        if self._structured:
            return [{"role": role, "content": [{"type": "text", "text": text}]} for role, text in turns]
        return [{"role": role, "content": text} for role, text in turns]

    def render(self, query: str, document: str, system: str | None = None) -> str:
        return self._template.render(
            messages=self.messages(query, document, system),
            tools=None,
            documents=None,
            add_generation_prompt=False,
            **self._variables,
        )

    def check_roles(self, system: str | None = None) -> None:
        """Refuse a template that drops the query or the document (sentence-transformers refuses it at the
        first pair): renders of pairs that differ in one role's content must differ."""
        try:
            base, *varied = [self.render(q, d, system) for q, d in _PROBES]
        except jinja2.TemplateError as exc:
            raise ConfigError(f"the chat template cannot render a (query, document) pair: {exc}") from None
        dropped = [role for role, render in zip(("query", "document"), varied) if render == base]
        if dropped:
            raise ConfigError(
                f"the chat template drops the {' and '.join(dropped)} of a pair (it renders no 'query' / 'document' "
                "messages): give the folder a reranking template (chat_template.jinja)"
            )
