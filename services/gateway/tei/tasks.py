"""TEI's task routes beyond embedding (shapes only, no I/O): /predict (a sequence classifier's label
scores), /similarity (cosines of sentences to a source sentence), /decode (token IDs back to text),
/rerank's body (its answer is rerank/api.py's, shared with the Cohere routes), and
which of the routes ``POST /`` runs for a model of each kind.

Shapes are text-embeddings-inference's (router/src/http/types.rs, server.rs): ``PredictRequest``,
``Prediction``, ``SimilarityRequest``, ``DecodeRequest`` and the default routes its server mounts on ``/``;
the bodies are task_bodies.py's typed models.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from pydantic_core import ErrorDetails

from embedfleet.services.gateway.http.body_errors import fault_error, input_fault, read_body
from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.inputs import Inputs, Limits, json_type, typed_inputs, within_limits
from embedfleet.services.gateway.rerank.api import RerankCall
from embedfleet.services.gateway.tei.task_bodies import (
    DecodeBody,
    PredictBody,
    RerankBody,
    SimilarityBody,
    SimilarityParameters,
)
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.protocol import EmbedOptions

Sequence = str | tuple[str, str]  # one text, or a (text, text_pair) pair


@dataclass(frozen=True, slots=True)
class PredictCall:
    inputs: list[Sequence]
    batch: bool  # inputs came as a batch: the answer is a list of predictions per input
    raw_scores: bool  # logits instead of softmax (several labels) or sigmoid (one)
    truncate: bool
    truncation_direction: str
    model: str | None = None  # the extension: which served model answers (None: the default)

    @property
    def options(self) -> EmbedOptions:
        # a classifier's "vectors" are its logits: never normalised
        return EmbedOptions(normalize=False, truncate=self.truncate, truncation_direction=self.truncation_direction)


def parse_predict(body: bytes, limits: Limits) -> PredictCall:
    """``inputs`` (PredictBody): a string, a [text, text_pair] pair, or a batch of [text] / [text, text_pair]
    lists; within the gateway's ``limits``."""
    doc = read_body(PredictBody, body, _predict_fault)
    raw = doc.inputs
    if isinstance(raw, str):
        inputs, batch = [_sequence([raw], "inputs", limits)], False
    elif isinstance(raw[0], str):
        inputs, batch = [_sequence(raw, "inputs", limits)], False
    else:
        if len(raw) > limits.max_inputs:
            raise ApiError(
                ErrorCode.TOO_MANY_INPUTS, f"'inputs' has {len(raw)} items; the limit is {limits.max_inputs}", "inputs"
            )
        inputs, batch = [_sequence(item, f"inputs[{i}]", limits) for i, item in enumerate(raw)], True
    return PredictCall(
        inputs,
        batch,
        doc.raw_scores is True,
        doc.truncate is True,
        doc.truncation_direction or "right",
        doc.model,
    )


def _predict_fault(errors: list[ErrorDetails]) -> ApiError:
    """A fault in ``inputs`` named by the item at fault in a batch, the forms it takes listed."""
    err = errors[0]
    loc = err["loc"]
    if loc[:1] != ("inputs",) or err["type"] == "missing":  # () for a body that is no JSON object
        return fault_error(errors)
    where = f"inputs[{loc[2]}]" if loc[1:2] == ("<batch>",) and len(loc) > 2 else "inputs"
    return ApiError(
        ErrorCode.INVALID_REQUEST,
        f"'{where}' must be a string, a pair of strings [text, text_pair] or a "
        "batch of [text] and [text, text_pair] lists",
        "inputs",
    )


def _sequence(parts: list[str], where: str, limits: Limits) -> Sequence:
    """A validated [text] or [text, text_pair] within the gateway's ``limits``."""
    for part in parts:
        if len(part) > limits.max_input_chars:
            raise ApiError(
                ErrorCode.INPUT_TOO_LONG,
                f"'{where}' has a text of {len(part)} characters; the limit is {limits.max_input_chars}",
                "inputs",
            )
    return parts[0] if len(parts) == 1 else (parts[0], parts[1])


def worker_labels(worker: dict[str, str]) -> list[str]:
    """A classifier's label names by logit, from its worker's metadata (LABEL_i where it names none)."""
    count = int(worker.get("dim") or 1)
    try:
        names = json.loads(worker.get("labels") or "[]")
    except ValueError:
        names = []
    if isinstance(names, list) and len(names) == count and all(isinstance(n, str) for n in names):
        return names
    return [f"LABEL_{i}" for i in range(count)]


def label_scores(logits: np.ndarray, raw_scores: bool) -> np.ndarray:
    """[n, labels] logits -> scores as TEI gives them: softmax over several labels, sigmoid of one."""
    x = logits.astype(np.float64)
    if raw_scores:
        return x
    if x.shape[1] == 1:
        return 1.0 / (1.0 + np.exp(-x))
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def render_predict(call: PredictCall, scores: np.ndarray, labels: list[str]) -> bytes:
    """Per input ``[{"score", "label"}]``, best first; one such list for a single input, a list of them for a batch."""
    if np.isnan(scores).any():
        raise ApiError(ErrorCode.INTERNAL, "score is NaN")
    if scores.shape[1] != len(labels):
        raise ApiError(ErrorCode.INTERNAL, f"the model gave {scores.shape[1]} scores for {len(labels)} labels")
    rows = [
        [{"score": float(row[j]), "label": labels[j]} for j in np.argsort(-row, kind="stable").tolist()]
        for row in scores
    ]
    return orjson.dumps(rows if call.batch else rows[0])


@dataclass(frozen=True, slots=True)
class SimilarityCall:
    inputs: Inputs  # the source sentence, then the sentences
    options: EmbedOptions
    model: str | None = None


def parse_similarity(body: bytes, limits: Limits) -> SimilarityCall:
    """``{"inputs": {"source_sentence", "sentences"}, "parameters": {"truncate", "truncation_direction",
    "prompt_name"}}`` (SimilarityBody), within the gateway's ``limits``."""
    doc = read_body(SimilarityBody, body)
    source, sentences = doc.inputs.source_sentence, doc.inputs.sentences
    within_limits(Inputs([source], None), "inputs.source_sentence", limits)
    within_limits(Inputs(sentences, None), "inputs.sentences", limits)
    if len(sentences) + 1 > limits.max_inputs:  # the source sentence is embedded with them
        raise ApiError(
            ErrorCode.TOO_MANY_INPUTS,
            f"'inputs.sentences' has {len(sentences)} items, {len(sentences) + 1} "
            f"inputs with the source sentence; the limit is {limits.max_inputs}",
            "inputs",
        )
    parameters = doc.parameters or SimilarityParameters()
    options = EmbedOptions(
        truncate=parameters.truncate is True,
        truncation_direction=parameters.truncation_direction or "right",
        prompt_name=parameters.prompt_name,
    )
    return SimilarityCall(Inputs([source, *sentences], None), options, doc.model)


def render_similarity(vectors: np.ndarray) -> bytes:
    """[source; sentences] vectors -> the cosine of each sentence's vector with the source's."""
    v = vectors.astype(np.float64)
    norms = np.linalg.norm(v, axis=1)
    norms[norms == 0] = 1.0  # a zero vector is similar to nothing: cosine 0
    # clipped: rounding may put a sentence equal to the source a hair above 1
    return orjson.dumps(np.clip((v[1:] @ v[0]) / (norms[1:] * norms[0]), -1.0, 1.0).tolist())


@dataclass(frozen=True, slots=True)
class DecodeCall:
    ids: list[np.ndarray]  # per sequence, [n] int32
    skip_special_tokens: bool
    model: str | None = None


def parse_decode(body: bytes, limits: Limits) -> DecodeCall:
    """``{"ids": [id, ...] or [[id, ...], ...], "skip_special_tokens": true}`` (DecodeBody)."""
    doc = read_body(DecodeBody, body, _decode_fault)
    inputs = typed_inputs(doc.ids, "ids", limits)
    assert inputs.token_ids is not None
    return DecodeCall(inputs.token_ids, doc.skip_special_tokens is not False, doc.model)


def _decode_fault(errors: list[ErrorDetails]) -> ApiError:
    """``ids`` in no form of its own named by what it holds ('got a list of strings')."""
    err = errors[0]
    if err["type"] != "ids_form":
        return input_fault(errors, "ids")
    raw = err["input"]
    shown = f"a list of {json_type(raw[0])}s" if isinstance(raw, list) else json_type(raw)
    return ApiError(
        ErrorCode.INVALID_REQUEST, f"'ids' must be a list of token IDs or a list of token-ID lists, got {shown}", "ids"
    )


def check_vocabulary(ids: list[np.ndarray], vocab_size: int) -> None:
    """IDs to decode must be in the model's vocabulary [0, ``vocab_size``): 422 naming the first that is
    not (the tokenizers library would drop it silently, and an empty text tells nothing)."""
    for row, seq in enumerate(ids):
        bad = np.flatnonzero((seq < 0) | (seq >= vocab_size))
        if bad.size:
            at = int(bad[0])
            raise ApiError(
                ErrorCode.INVALID_TOKENS,
                f"token id {int(seq[at])} (ids[{row}][{at}]) is outside the "
                f"vocabulary of {vocab_size} ids [0, {vocab_size})",
                "ids",
            )


def render_decode(texts: list[str]) -> bytes:
    return orjson.dumps(texts)


def parse_rerank(body: bytes, limits: Limits) -> RerankCall:
    """``{"query", "texts", "raw_scores": false, "return_text": false, "truncate": false}`` (RerankBody), and
    the extensions ``top_n`` and ``model`` (none: the default model); within the gateway's ``limits``."""
    doc = read_body(RerankBody, body)
    if len(doc.query) > limits.max_input_chars:
        raise ApiError(
            ErrorCode.INPUT_TOO_LONG,
            f"'query' has {len(doc.query)} characters; the limit is {limits.max_input_chars}",
            "query",
        )
    within_limits(Inputs(doc.texts, None), "texts", limits)
    return RerankCall(
        model=doc.model,
        query=doc.query,
        texts=doc.texts,
        top_n=doc.top_n,
        raw_scores=doc.raw_scores is True,
        truncate=doc.truncate is True,
        return_text=doc.return_text is True,
    )


def root_task(doc: dict, worker: dict[str, str]) -> str:
    """The route ``POST /`` runs: "similarity" for a sentence-similarity body (``inputs`` an object with
    ``source_sentence``), whatever the model; else by the model's kind, as TEI mounts its default route:
    a classifier of several labels "predict", a one-logit reranker "rerank" (or "predict" for a body with
    ``inputs`` and no ``query``), a model that makes only sparse vectors (SPLADE) "embed_sparse", any
    other embedder "embed"."""
    inputs = doc.get("inputs")
    if isinstance(inputs, dict) and "source_sentence" in inputs:
        return "similarity"
    if worker.get("task") == "score":
        if len(worker_labels(worker)) > 1 or ("inputs" in doc and "query" not in doc):
            return "predict"
        return "rerank"
    outputs = (worker.get("outputs") or "dense").split(",")
    return "embed_sparse" if "sparse" in outputs and "dense" not in outputs else "embed"


def model_type(worker: dict[str, str], tokenizer: dict[str, str]) -> dict[str, Any]:
    """/info's ``model_type`` as TEI names it: a classifier or a one-logit reranker with its labels, or
    an embedding model with its pooling ("splade" for a model that makes only sparse vectors)."""
    if worker.get("task") == "score":
        labels = worker_labels(worker)
        kind = "classifier" if len(labels) > 1 else "reranker"
        return {
            kind: {
                "id2label": {str(i): name for i, name in enumerate(labels)},
                "label2id": {name: i for i, name in enumerate(labels)},
            }
        }
    outputs = (worker.get("outputs") or "dense").split(",")
    pooling = "splade" if outputs == ["sparse"] else worker.get("pooling") or tokenizer.get("pooling", "mean")
    return {"embedding": {"pooling": pooling}}
