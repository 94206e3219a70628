"""Text -> token IDs (with the model's prompts and truncation), and packing into chunks. No NATS here."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from itertools import accumulate, chain
from typing import TYPE_CHECKING

import numpy as np
from tokenizers import Tokenizer
from tokenizers.processors import TemplateProcessing

from embedfleet.services.tokenizer import chunking
from embedfleet.services.tokenizer.chat_template import PairTemplate, special_token_variables
from embedfleet.services.tokenizer.cuts import CHARS_PER_TOKEN, SERIAL_CHARS, cut_chars
from embedfleet.services.tokenizer.tasks import resolve_task
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.errors import TRUNCATE_HINT, ErrorCode, ServiceError
from embedfleet.shared.model_dir.info import ModelInfo
from embedfleet.shared.protocol import EmbedOptions

if TYPE_CHECKING:
    from embedfleet.services.tokenizer.fast_encoder import FastEncoder

Token = tuple[int, str, bool, int | None, int | None]  # id, text, special, start, stop (characters)


@dataclass(frozen=True, slots=True)
class Chunk:
    start: int  # index of the first row in the request
    input_ids: np.ndarray  # [T] int32, sequences back to back
    cu_seqlens: np.ndarray  # [rows + 1] int32
    token_types: np.ndarray | None = None  # [T] int32 segment ids, for pairs


def encode_all(tokenizer: Tokenizer, inputs: list, add_special_tokens: bool = True) -> list:
    """``tokenizer.encode_batch(inputs)``: texts, or (first, second) pairs; the same encodings."""
    size = 0
    for item in inputs:
        size += len(item) if isinstance(item, str) else len(item[0]) + len(item[1])
        if size > SERIAL_CHARS:
            return tokenizer.encode_batch(inputs, add_special_tokens=add_special_tokens)
    if inputs and not isinstance(inputs[0], str):
        return [tokenizer.encode(a, b, add_special_tokens=add_special_tokens) for a, b in inputs]
    return [tokenizer.encode(text, add_special_tokens=add_special_tokens) for text in inputs]


def _read_config(path) -> dict:
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None


def special_tokens_template(tokenizer: Tokenizer, config: dict) -> TemplateProcessing | None:
    """The begin/end-of-sequence tokens the model's tokenizer adds, where tokenizer.json alone does not.

    transformers' Llama-style tokenizers (e5-mistral, Llama embedders) read ``add_bos_token`` and
    ``add_eos_token`` from tokenizer_config.json and rebuild their post-processor from them: a decoder
    embedder pools its last token, so a missing end-of-sequence token changes every vector. Returns the
    post-processor that adds exactly those tokens, or None when tokenizer.json already does.
    """
    if "add_eos_token" not in config and "add_bos_token" not in config:
        return None
    bos, eos = (
        _special(tokenizer, config, flag, key)
        for flag, key in (("add_bos_token", "bos_token"), ("add_eos_token", "eos_token"))
    )
    tokenizer.no_padding()
    tokenizer.no_truncation()
    expected = [i for _, i in bos] + tokenizer.encode("a", add_special_tokens=False).ids + [i for _, i in eos]
    if tokenizer.encode("a", add_special_tokens=True).ids == expected:
        return None

    def seq(part: str, type_id: int) -> str:
        return " ".join([*(f"{t}:{type_id}" for t, _ in bos), f"{part}:{type_id}", *(f"{t}:{type_id}" for t, _ in eos)])

    return TemplateProcessing(single=seq("$A", 0), pair=f"{seq('$A', 0)} {seq('$B', 1)}", special_tokens=bos + eos)


def _special(tokenizer: Tokenizer, config: dict, flag: str, key: str) -> list[tuple[str, int]]:
    """[(token, id)] when tokenizer_config.json sets ``flag`` and names the ``key`` token, else []."""
    token = config.get(key)
    token = token.get("content") if isinstance(token, dict) else token
    if not config.get(flag) or not token:
        return []
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise ConfigError(f"tokenizer_config.json sets {flag} but {token!r} is not in the vocabulary")
    return [(token, token_id)]


class TextEncoder:
    """The model's tokenizer with padding off and truncation at the model's real limit.

    tokenizer.json of many sentence-transformers models pads and truncates to a fixed length
    (all-MiniLM-L6-v2: 128) that is not the model's limit (256): both are replaced here.
    """

    def __init__(self, info: ModelInfo, prompts: dict[str, str] | None = None) -> None:
        self.max_length = info.max_seq_length
        self.vocab_size = info.vocab_size
        self.prompts = {**info.prompts, **(prompts or {})}  # configured prompts win over the folder's
        self.default_prompt = info.default_prompt
        self.adapters = info.adapters
        self.include_prompt = info.include_prompt
        # rows padded to this many tokens with pad_id (0: not padded): SigLIP's text tower saw only such rows
        self.pad_to, self.pad_id = info.pad_to, info.pad_id
        # a page model's texts are queries, each wrapped as its processor wraps them (ColQwen2: "Query: " ... pads)
        self.query_prefix, self.query_suffix = info.query_prefix, info.query_suffix
        # a page model's image token stands for a page's image: no text or token input may hold it (-1: none)
        self.image_token = info.image_token_id
        self.fast: FastEncoder | None = None  # kitoken for the texts it tokenizes as tokenizers does (fast_check)
        path = info.path / "tokenizer.json"
        if not path.is_file():
            raise ConfigError(f"{info.path} has no tokenizer.json (a fast Hugging Face tokenizer is needed)")
        self._by_mode: dict[str, Tokenizer] = {}
        self._frames: dict[str, tuple[int, int]] = {}  # prompt -> tokens before and after a text's (frame)
        tokenizer_config = _read_config(info.path / "tokenizer_config.json")
        template = special_tokens_template(Tokenizer.from_file(str(path)), tokenizer_config)
        for mode in ("right", "left", "none"):
            tokenizer = Tokenizer.from_file(str(path))
            if template is not None:
                tokenizer.post_processor = template
            tokenizer.no_padding()
            if mode == "none":
                tokenizer.no_truncation()
            else:
                tokenizer.enable_truncation(max_length=self.max_length, direction=mode)
            self._by_mode[mode] = tokenizer
        # pairs get the prompt CrossEncoder.predict applies by default (the folder's default_prompt_name)
        self.pair_prompt = self.prompts.get(info.default_prompt or "", "")
        self._pairs: PairTemplate | None = None
        self.pair_tail: list[int] = []  # the template's tokens after the document, written back over a cut pair's end
        if info.pair_template is not None:
            self._pairs = PairTemplate(
                info.pair_template, info.message_format, special_token_variables(tokenizer_config)
            )
            self._pairs.check_roles(self.pair_prompt or None)
            self.pair_tail = self._template_tail(self._pairs)
            if (overhead := self.pair_overhead()) >= self.max_length:
                raise ConfigError(
                    f"the chat template alone takes {overhead} tokens, the model's limit {self.max_length}: "
                    "every pair would be cut to the template"
                )

    def resolve(self, options: EmbedOptions) -> EmbedOptions:
        """``options`` with the task adapter its rows run with and that task's prompt (tasks.py); a
        ServiceError for a task the model lacks."""
        task, prompt_name = resolve_task(
            self.adapters, self.prompts, options.task, options.prompt_name, options.input_type
        )
        if (task, prompt_name) == (options.task, options.prompt_name):
            return options
        return replace(options, task=task, prompt_name=prompt_name)

    def with_prompt(self, texts: list[str], options: EmbedOptions) -> list[str]:
        """Prefix the texts with the prompt the request names (as sentence-transformers does)."""
        prompt = self._prompt(options)
        if self.query_prefix or self.query_suffix:
            return [f"{self.query_prefix}{prompt}{t}{self.query_suffix}" for t in texts]
        return [prompt + t for t in texts] if prompt else texts

    def prompt_tokens(self, options: EmbedOptions) -> int:
        """Leading tokens of each row that pooling skips: 0, or for a model whose Pooling has
        include_prompt=false, the prompt's tokens and the special tokens before them (as
        sentence-transformers counts them: the prompt tokenized alone, less its end token)."""
        prompt = self._prompt(options)
        if self.include_prompt or not prompt:
            return 0
        return max(len(self._by_mode["none"].encode(prompt, add_special_tokens=True).ids) - 1, 0)

    def room(self, options: EmbedOptions) -> int:
        """Content tokens a sequence holds besides the model's special tokens and the prompt ``options``
        name (tokenized with them, as it leads every text): what a chunk of a long text may hold."""
        prompt = self._prompt(options)
        return self.max_length - len(self._by_mode["none"].encode(prompt, add_special_tokens=True).ids)

    def frame_sizes(self, options: EmbedOptions) -> tuple[int, int]:
        """(before, after): how many tokens a sequence has before its text's content tokens (special
        tokens, then the prompt ``options`` name) and after them (special tokens), where late chunking's
        spans are placed. Refused for a model whose special tokens do not simply frame the text."""
        prompt = self._prompt(options)
        if prompt not in self._frames:
            before, after = (len(ids) for ids in self.frame(options))
            if before + after != self.max_length - self.room(options):
                raise ServiceError(
                    ErrorCode.INVALID_REQUEST,
                    "this model's special tokens and prompt do not frame a "
                    "text plainly: its spans cannot be placed (late chunking is not served for it)",
                )
            self._frames[prompt] = before, after
        return self._frames[prompt]

    def whole_text_tokenizer(self) -> Tokenizer:
        """The tokenizer ``chunking.cut`` reads a whole text's encoding from (no special tokens, no truncation)."""
        return chunking.whole_text_tokenizer(self._by_mode["none"])

    def frame(self, options: EmbedOptions) -> tuple[list[int], list[int]]:
        """The tokens before and after a chunk's content tokens in its sequence (``chunking.frame``)."""
        return chunking.frame(self._by_mode["none"], self._prompt(options))

    def _prompt(self, options: EmbedOptions) -> str:
        if options.prompt_name is not None:
            if options.prompt_name not in self.prompts:
                known = ", ".join(sorted(self.prompts)) or "none"
                raise ServiceError(
                    ErrorCode.INVALID_REQUEST, f"the model has no prompt {options.prompt_name!r} (its prompts: {known})"
                )
            prompt = self.prompts[options.prompt_name]
        else:
            name = (
                options.input_type or self.default_prompt or ""
            )  # the folder's default_prompt_name when none is asked for
            prompt = self.prompts.get(name, "")
        return prompt

    def encode(self, texts: list[str], truncate: bool = True, direction: str = "right") -> list[list[int]]:
        """Token IDs per text, special tokens included. Releases the GIL while encoding.

        With truncation, a text far longer than the limit is first cut at a whitespace a generous
        number of characters past what the kept tokens can span (``CHARS_PER_TOKEN`` per token),
        so a 50 KB document is not tokenized whole to keep 256 tokens. Words never span whitespace,
        so the kept tokens are those of the whole text; when the cut text does not even reach the
        limit (a text of very long tokens), the whole text is tokenized after all.
        """
        ids = self._encode(texts, truncate, direction)
        if not truncate:
            self._refuse_long(ids)
        return ids

    def encode_each(
        self, requests: list[list[str]], truncate: bool = True, direction: str = "right"
    ) -> list[list[list[int]] | ServiceError]:
        """``encode`` of several requests' texts in one call into the tokenizer: per request its token
        IDs, or the error its rows earn (the row counted within that request)."""
        ids = self._encode([t for texts in requests for t in texts], truncate, direction)
        checks: list[Callable[[list], None]] = [] if truncate else [self._refuse_long]
        if self.image_token >= 0:
            checks.append(self._image_token_check(ErrorCode.INVALID_REQUEST))

        def check(part: list) -> None:
            for each in checks:
                each(part)

        return _split_checked(ids, requests, check if checks else None)

    def _encode(self, texts: list[str], truncate: bool, direction: str) -> list[list[int]]:
        if self.fast is not None:
            ids = self.fast.encode(
                texts, direction if truncate else None, lambda rest: self._encode_hf(rest, truncate, direction)
            )
        else:
            ids = self._encode_hf(texts, truncate, direction)
        return self._padded(ids) if self.pad_to else ids

    def _padded(self, ids: list) -> list:
        """Each row made ``pad_to`` tokens long with ``pad_id`` (a longer one, not truncated, stays: refused later)."""
        return [list(row) + [self.pad_id] * (self.pad_to - len(row)) if len(row) < self.pad_to else row for row in ids]

    def _encode_hf(self, texts: list[str], truncate: bool, direction: str) -> list[list[int]]:
        tokenizer = self._by_mode[direction if truncate else "none"]
        if not truncate:
            return [e.ids for e in encode_all(tokenizer, texts)]
        window = self.max_length * CHARS_PER_TOKEN
        cut = [cut_chars(t, window, direction) for t in texts]
        encodings = encode_all(tokenizer, cut)
        ids = []
        for text, short, e in zip(texts, cut, encodings):
            if short is not text and not e.overflowing:  # the cut text fit whole: the cut may matter
                e = tokenizer.encode(text, add_special_tokens=True)
            ids.append(e.ids)
        return ids

    def encode_pairs(
        self, pairs: list[tuple[str, str]], truncate: bool = True, direction: str = "right"
    ) -> tuple[list[list[int]], list[list[int]] | None]:
        """(query, document) pairs as one sequence each: [CLS] q [SEP] d [SEP], with segment ids.

        Truncation cuts the longer of the two first, as the reference tokenizers do. A model with a pair
        template (an LLM reranker) gets its rendered pairs instead, and no segment ids.
        """
        ids, types = self._encode_pairs(pairs, truncate, direction)
        if not truncate:
            self._refuse_long(ids)
        return ids, types

    def encode_pairs_each(
        self, requests: list[list[tuple[str, str]]], truncate: bool = True, direction: str = "right"
    ) -> list[tuple[list[list[int]], list[list[int]] | None] | ServiceError]:
        """``encode_pairs`` of several requests' pairs in one call: per request (IDs, segment ids), or
        the error its rows earn."""
        ids, types = self._encode_pairs([p for pairs in requests for p in pairs], truncate, direction)
        each = _split_checked(ids, requests, None if truncate else self._refuse_long)
        if types is None:
            return [r if isinstance(r, ServiceError) else (r, None) for r in each]
        return [r if isinstance(r, ServiceError) else (r, t) for r, t in zip(each, _split(types, requests))]

    def _encode_pairs(
        self, pairs: list[tuple[str, str]], truncate: bool, direction: str
    ) -> tuple[list[list[int]], list[list[int]] | None]:
        if self._pairs is not None:
            return self._encode_rendered(self._pairs, pairs, truncate, direction), None
        if self.pair_prompt:  # sentence-transformers prefixes the query of a text pair
            pairs = [(self.pair_prompt + q, d) for q, d in pairs]
        tokenizer = self._by_mode[direction if truncate else "none"]
        encodings = encode_all(tokenizer, list(pairs))
        return [e.ids for e in encodings], [e.type_ids for e in encodings]

    def _encode_rendered(
        self, template: PairTemplate, pairs: list[tuple[str, str]], truncate: bool, direction: str
    ) -> list[list[int]]:
        """Pairs through the chat template, then tokenized as ``apply_chat_template`` does (no special tokens
        added: the template writes them).

        Truncation as sentence-transformers': the rendered sequence keeps its first ``max_length`` tokens,
        then the template's tail (the tokens after the document: Qwen3-Reranker's end of turn, assistant
        header and empty think block) is written back over its last tokens, so the last token is still the
        one the answer follows; the content loses its end (the document's, or with a long query the
        query's and the document's).
        ``direction="left"`` keeps the last ``max_length`` tokens instead: the tail intact, the template's
        head (system prompt, instruction) cut, which sentence-transformers never does.
        """
        texts = [template.render(q, d, self.pair_prompt or None) for q, d in pairs]
        ids = [e.ids for e in encode_all(self._by_mode["none"], texts, add_special_tokens=False)]
        if not truncate:
            return ids
        n, tail = self.max_length, self.pair_tail[-self.max_length :]
        if direction == "left":
            return [seq[-n:] for seq in ids]
        # as the reference, a row of exactly max_length tokens gets its tail rewritten too (with itself)
        return [seq if len(seq) < n else seq[: n - len(tail)] + tail for seq in ids]

    def pair_overhead(self) -> int:
        """Tokens a rendered pair takes besides its query and document (the template's, with the prompt)."""
        if self._pairs is None:
            return 0
        return len(
            self._by_mode["none"]
            .encode(self._pairs.render("", "", self.pair_prompt or None), add_special_tokens=False)
            .ids
        )

    def _template_tail(self, template: PairTemplate) -> list[int]:
        """The template's tokens after the document, as sentence-transformers derives them: the longest
        common token tail of two renders whose contents differ ("0" and "1 2 3 4"); [] when they share
        none or never differ."""
        a, b = (
            [
                *self._by_mode["none"]
                .encode(template.render(f, f, self.pair_prompt or None), add_special_tokens=False)
                .ids
            ]
            for f in ("0", "1 2 3 4")
        )
        common = 0
        for x, y in zip(reversed(a), reversed(b)):
            if x != y:
                break
            common += 1
        return a[len(a) - common :] if 0 < common < min(len(a), len(b)) else []

    def check_ids(
        self, token_ids: list[np.ndarray], truncate: bool = True, direction: str = "right"
    ) -> list[np.ndarray]:
        """Inputs given as token IDs: refused outside the vocabulary, cut (or refused) past the limit."""
        for i, ids in enumerate(token_ids):
            if len(ids) == 0:
                raise ServiceError(ErrorCode.INVALID_TOKENS, "has no tokens", i)
            if ids.min() < 0 or ids.max() >= self.vocab_size:
                raise ServiceError(
                    ErrorCode.INVALID_TOKENS, f"has token ids outside the vocabulary [0, {self.vocab_size})", i
                )
        if self.image_token >= 0:
            self._image_token_check(ErrorCode.INVALID_TOKENS)(token_ids)
        n = self.max_length
        if not truncate:
            self._refuse_long(token_ids)
            cut = token_ids
        else:
            cut = [ids if len(ids) <= n else (ids[:n] if direction == "right" else ids[-n:]) for ids in token_ids]
        if self.pad_to:
            cut = [np.asarray(row, dtype=np.int32) for row in self._padded(cut)]
        return cut

    def tokenize(self, texts: list[str], add_special_tokens: bool = True) -> list[list[Token]]:
        """Each text's tokens with their character offsets (None for special tokens)."""
        out = []
        for text, enc in zip(texts, encode_all(self._by_mode["right"], texts, add_special_tokens)):
            row: list[Token] = []
            for tid, token, special, (start, stop) in zip(enc.ids, enc.tokens, enc.special_tokens_mask, enc.offsets):
                if special:
                    row.append((tid, token, True, None, None))
                else:
                    row.append((tid, text[start:stop], False, start, stop))
            out.append(row)
        return out

    def decode(self, ids: list[np.ndarray], skip_special_tokens: bool = True) -> list[str]:
        """Each sequence of token IDs as text. IDs outside the vocabulary are left out, as the
        ``tokenizers`` library (and so text-embeddings-inference) leaves them out."""
        for i, seq in enumerate(ids):
            if len(seq) == 0:
                raise ServiceError(ErrorCode.INVALID_TOKENS, f"ids[{i}] has no token IDs")
            if seq.min() < 0:
                raise ServiceError(ErrorCode.INVALID_TOKENS, f"ids[{i}] holds a negative token ID")
        return self._by_mode["none"].decode_batch(
            [seq.tolist() for seq in ids], skip_special_tokens=skip_special_tokens
        )

    def _image_token_check(self, code: ErrorCode) -> Callable[[list], None]:
        """A page model's check that no row holds its image token, refused with ``code``."""
        token = self.image_token

        def refuse(ids: list) -> None:
            for i, seq in enumerate(ids):
                if token in seq:
                    raise ServiceError(
                        code,
                        f"holds the image token (id {token}), which stands for a page's image: embed the page as "
                        '{"image": ...}, and keep the token out of texts',
                        i,
                    )

        return refuse

    def _refuse_long(self, ids) -> None:
        for i, seq in enumerate(ids):
            if len(seq) > self.max_length:
                raise ServiceError(
                    ErrorCode.INPUT_TOO_LONG,
                    f"has {len(seq)} tokens; the model's limit is {self.max_length} {TRUNCATE_HINT}",
                    i,
                )


def _split(flat: list, requests: list[list]) -> list[list]:
    """``flat`` cut back into one list per request, as long as that request's inputs."""
    out, at = [], 0
    for inputs in requests:
        out.append(flat[at : at + len(inputs)])
        at += len(inputs)
    return out


def _split_checked(flat: list, requests: list[list], check: Callable[[list], None] | None) -> list:
    """``_split``, with each request's part replaced by the ServiceError ``check`` raises for it."""
    parts = _split(flat, requests)
    if check is None:
        return parts
    out: list = []
    for part in parts:
        try:
            check(part)
            out.append(part)
        except ServiceError as exc:
            out.append(exc)
    return out


def pack_chunks(ids: list, max_tokens: int, max_seqs: int, token_types: list | None = None) -> Iterator[Chunk]:
    """Split sequences, in order, into chunks of at most ``max_tokens`` tokens and ``max_seqs`` rows.

    A single sequence longer than ``max_tokens`` still gets a chunk of its own. ``token_types``,
    when given, holds one segment-id list per sequence and is packed alongside.
    """
    start = 0
    while start < len(ids):
        end, tokens = start, 0
        while end < len(ids) and end - start < max_seqs:
            n = len(ids[end])
            if end > start and tokens + n > max_tokens:
                break
            tokens += n
            end += 1
        cu_seqlens = np.array([0, *accumulate(map(len, ids[start:end]))], dtype=np.int32)
        flat = _flat(ids[start:end], tokens)
        types = None if token_types is None else _flat(token_types[start:end], tokens)
        yield Chunk(start=start, input_ids=flat, cu_seqlens=cu_seqlens, token_types=types)
        start = end


def _flat(seqs: list, tokens: int) -> np.ndarray:
    """[tokens] int32: ``seqs`` back to back. Lists of ints (the tokenizer's) are read straight into
    the array, several times faster than an array made of each then joined."""
    if all(type(s) is list for s in seqs):
        return np.fromiter(chain.from_iterable(seqs), dtype=np.int32, count=tokens)
    return np.concatenate([np.asarray(s, dtype=np.int32) for s in seqs])
