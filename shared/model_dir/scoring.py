"""Folders that score pairs instead of embedding texts (sentence-transformers' CrossEncoder): a
``…ForSequenceClassification`` checkpoint (a logit per label), or a causal LM run as Transformer ->
LogitScore (an LLM reranker such as Qwen3-Reranker: one logit from its answer tokens, its pairs
rendered by its chat template)."""

from __future__ import annotations

from typing import Any

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.model_dir.folder import ModelFolder, read_json

# model types whose chat templates take a message's content as a string whatever they look like
# (sentence-transformers' KNOWN_MODEL_TYPES_MESSAGE_FORMATS)
_FLAT_MESSAGE_TYPES = frozenset({"apertus", "deepseek_v3", "gpt_oss", "seed_oss"})
# a template that reads any of these takes content as typed parts (sentence-transformers' own test)
_STRUCTURED_PATTERNS = ("content[0]", ".type", "'type'", '"type"', "item.type", "message.content[")


def classifier_labels(config: dict[str, Any]) -> int:
    """Logits of a sequence classifier: transformers' default of 2 when the config names none (it
    leaves ``id2label`` out of config.json when it is the default)."""
    return int(config.get("num_labels") or len(config.get("id2label") or {}) or 2)


def label_names(config: dict[str, Any], count: int) -> tuple[str, ...]:
    """The name of each of a classifier's ``count`` logits: config.json's ``id2label``, else transformers'
    defaults (LABEL_0, LABEL_1, ...)."""
    id2label = config.get("id2label")
    names = [f"LABEL_{i}" for i in range(count)]
    if isinstance(id2label, dict):
        for key, name in id2label.items():
            if str(key).isdigit() and int(key) < count:
                names[int(key)] = str(name)
    return tuple(names)


def is_classifier(config: dict[str, Any]) -> bool:
    """A sequence-classification checkpoint (BERT + pooler + classifier, or RoBERTa's head) scores pairs."""
    return any(str(a).endswith("ForSequenceClassification") for a in config.get("architectures") or [])


def logit_score_tokens(folder: ModelFolder) -> tuple[int, ...]:
    """An LLM reranker's answer tokens, () for any other folder.

    sentence-transformers' CrossEncoder on a ``…ForCausalLM`` is Transformer (transformer_task
    "text-generation") -> LogitScore: the score is the last token's logit of ``true_token_id``, less
    that of ``false_token_id`` when one is set (Qwen3-Reranker: "yes" and "no").
    """
    at = [m for m in folder.modules if m.type.startswith("sentence_transformers.") and m.type.endswith(".LogitScore")]
    if not at:
        return ()
    kinds = folder.kinds
    if kinds != ["Transformer", "LogitScore"]:
        raise ConfigError(
            f"modules.json runs {' -> '.join(kinds)}: an LLM reranker is served as Transformer -> LogitScore"
        )
    config = folder.config
    architectures = [str(a) for a in config.get("architectures") or []]
    if not any(a.endswith("ForCausalLM") for a in architectures):
        raise ConfigError(
            f"modules.json ends in LogitScore, which reads a causal LM's logits, but config.json's architectures are "
            f"{architectures or 'not given'} (a …ForCausalLM is needed)"
        )
    transformer_task = folder.st_config.get("transformer_task", "text-generation")
    if transformer_task != "text-generation":
        raise ConfigError(
            f"sentence_bert_config.json: transformer_task {transformer_task!r} cannot feed LogitScore "
            "(it reads the causal LM's logits: 'text-generation')"
        )
    where = folder.module_dir(at[0]) / "config.json"
    score = read_json(where)
    if score.get("module_input_name", "causal_logits") != "causal_logits":
        raise ConfigError(
            f"{where}: LogitScore reading {score['module_input_name']!r} is not supported (only 'causal_logits')"
        )
    tokens = [
        score.get("true_token_id"),
        *([score["false_token_id"]] if score.get("false_token_id") is not None else []),
    ]
    vocab = int(config.get("vocab_size") or 0)
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in tokens):
        raise ConfigError(
            f"{where}: true_token_id / false_token_id must be token ids below the vocabulary size {vocab}"
        )
    return tuple(tokens)


def pair_template(folder: ModelFolder) -> tuple[str | None, str]:
    """(chat template, message format) when sentence-transformers renders a pair as query/document
    messages: its Transformer's modality_config lists "message", or names no modalities and the tokenizer
    has a chat template. (None, "flat"): the pair is tokenized as a text pair."""
    modalities = folder.st_config.get("modality_config")
    template = _chat_template(folder)
    if isinstance(modalities, dict) and "message" not in modalities:
        return None, "flat"
    if template is None:
        if isinstance(modalities, dict):
            raise ConfigError(
                f"{folder.path / 'sentence_bert_config.json'} renders pairs as chat messages, but the "
                "folder has no chat template (chat_template.jinja or tokenizer_config.json's chat_template)"
            )
        return None, "flat"
    message = modalities.get("message") if isinstance(modalities, dict) else None
    declared = message.get("format", "auto") if isinstance(message, dict) else "auto"
    if declared in ("flat", "structured"):
        return template, declared
    if folder.config.get("model_type") in _FLAT_MESSAGE_TYPES:
        return template, "flat"
    return template, "structured" if any(p in template for p in _STRUCTURED_PATTERNS) else "flat"


def _chat_template(folder: ModelFolder) -> str | None:
    """The tokenizer's chat template as transformers loads it: chat_template.jinja wins over
    tokenizer_config.json's ``chat_template`` (a string, or named templates of which "default" is used)."""
    path = folder.path
    if (path / "chat_template.jinja").is_file():
        return (path / "chat_template.jinja").read_text(encoding="utf-8")
    if (path / "additional_chat_templates").is_dir():
        raise ConfigError(
            f"{path} has named chat templates (additional_chat_templates/) but no chat_template.jinja to use by default"
        )
    template = folder.tok_config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        if "default" not in named:
            raise ConfigError(
                f"{path / 'tokenizer_config.json'}: chat templates {sorted(map(str, named))} name no 'default'"
            )
        template = named["default"]
    if template is not None and not isinstance(template, str):
        raise ConfigError(f"{path / 'tokenizer_config.json'}: chat_template is not a string")
    return template or None


def score_activation(folder: ModelFolder) -> str:
    """What ``CrossEncoder.predict`` applies to the one logit by default: the saved ``activation_fn``
    (a torch.nn class; others are not loaded without trust_remote_code), else sigmoid."""
    name = folder.st_general.get("activation_fn") or (folder.config.get("sentence_transformers") or {}).get(
        "activation_fn"
    )
    if not isinstance(name, str) or not name.startswith("torch."):
        return "sigmoid"
    kind = {"Sigmoid": "sigmoid", "Identity": "identity"}.get(name.rsplit(".", 1)[-1])
    if kind is None:
        raise ConfigError(
            f"config_sentence_transformers.json: activation_fn {name!r} is not supported for a reranker "
            "(supported: torch.nn Sigmoid, Identity)"
        )
    return kind
