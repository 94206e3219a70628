"""The OpenAPI description of the gateway's real routes (served at /openapi.json)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from embedfleet.services.gateway.cohere.answers import (
    CohereEmbedByType,
    CohereEmbedV1Answer,
    CohereRerankV2Answer,
    RerankV1Answer,
)
from embedfleet.services.gateway.cohere.body import CohereEmbedV1Body, CohereEmbedV2Body
from embedfleet.services.gateway.http.health_answers import Healthy, Unhealthy
from embedfleet.services.gateway.jobs.answers import JobList, JobResultLine, JobStatus, JobSubmitted
from embedfleet.services.gateway.jobs.body import JobBody
from embedfleet.services.gateway.jobs.listing import JobListQuery
from embedfleet.services.gateway.openai.answers import ModelList, OpenAIEmbeddings
from embedfleet.services.gateway.openai.body import EmbeddingsBody
from embedfleet.services.gateway.rerank.body import CohereRerankV1Body, CohereRerankV2Body
from embedfleet.services.gateway.response_parts import (
    CohereError,
    OpenAIError,
    TeiError,
    inline_schema,
)
from embedfleet.services.gateway.search.answers import SearchAnswer
from embedfleet.services.gateway.search.body import SearchBody
from embedfleet.services.gateway.tei.answers import (
    TeiAllAnswer,
    TeiDecodeAnswer,
    TeiEmbedAnswer,
    TeiInfo,
    TeiPredictAnswer,
    TeiRerankAnswer,
    TeiRootAnswer,
    TeiSimilarityAnswer,
    TeiSparseAnswer,
    TeiTokenizeAnswer,
)
from embedfleet.services.gateway.tei.body import EmbedAllBody, EmbedBody, EmbedSparseBody, TokenizeBody
from embedfleet.services.gateway.tei.task_bodies import DecodeBody, PredictBody, RerankBody, SimilarityBody

_OPENAI_ERROR = inline_schema(OpenAIError)
_TEI_ERROR = inline_schema(TeiError)
_COHERE_ERROR = inline_schema(CohereError)
_BINARY = {
    "application/octet-stream": {
        "schema": {
            "type": "string",
            "format": "binary",
            "description": (
                "the rows' bytes in the request's embedding_type; headers x-embedding-rows, x-embedding-dim (components), "
                "x-embedding-dtype (float32-le, float16-le, int8, uint8, binary, ubinary), x-embedding-row-bytes"
            ),
        }
    },
    "application/msgpack": {
        "schema": {
            "type": "string",
            "format": "binary",
            "description": (
                "a map {model, rows, dim, shape, dtype, embedding_type, data, usage}: data holds the rows' bytes, "
                "shape [rows, stored elements per row] (ceil(dim / 8) for binary and ubinary), dtype numpy's name of one element"
            ),
        }
    },
}
# the field (a query parameter on GET /info) naming which served model answers
_MODEL = {
    "type": "string",
    "description": "an extension: which served model answers (default: the gateway's "
    "--default-model); an unknown one: 404",
}
_READINESS = [
    {
        "name": "model",
        "in": "query",
        "required": False,
        "schema": {"type": "array", "items": {"type": "string"}},
        "description": "readiness: 503 until each model named has a live tokenizer and worker (repeatable)",
    },
    {
        "name": "all",
        "in": "query",
        "required": False,
        "schema": {"type": "string", "enum": ["1", "true", "0", "false"]},
        "description": "readiness: 503 while any model a live tokenizer or worker announces lacks the other",
    },
]
# health's answers: flat, so written in place like the error bodies
_HEALTHY = inline_schema(Healthy)
_UNHEALTHY = inline_schema(Unhealthy)


def typed_schema(model: type[BaseModel], schemas: dict[str, Any]) -> dict[str, Any]:
    """``model``'s JSON schema as pydantic generates it; the models it refers to go into ``schemas``
    (the document's components.schemas, where its references point)."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, definition in schema.pop("$defs", {}).items():
        # one name, one model: two models of one class name would otherwise share (and lose) a component
        if schemas.setdefault(name, definition) != definition:
            raise ValueError(f"two models are named {name}: /openapi.json would hold one of them")
    return schema


def query_parameters(model: type[BaseModel]) -> list[dict[str, Any]]:
    """A typed query's fields as OpenAPI query parameters, each with its field's schema."""
    schema = model.model_json_schema()
    required = set(schema.get("required", ()))
    return [
        {
            "name": name,
            "in": "query",
            "required": name in required,
            **({"description": field.pop("description")} if "description" in field else {}),
            "schema": field,
        }
        for name, field in schema["properties"].items()
    ]


def _errors(schema: dict, codes: tuple[int, ...]) -> dict[str, Any]:
    return {str(c): {"description": "error", "content": {"application/json": {"schema": schema}}} for c in codes}


def _json_answer(model: type[BaseModel], schemas: dict[str, Any]) -> dict[str, Any]:
    """A JSON answer's content: ``model``'s schema (typed_schema)."""
    return {"application/json": {"schema": typed_schema(model, schemas)}}


def _post(summary: str, body: dict, ok: dict, error: dict, codes: tuple[int, ...]) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
            "responses": {"200": {"description": "success", "content": ok}, **_errors(error, codes)},
        }
    }


def _get(
    summary: str,
    schema: dict,
    codes: tuple[int, ...] = (),
    error: dict = _OPENAI_ERROR,
    parameters: list[dict] | None = None,
) -> dict[str, Any]:
    return {
        "get": {
            "summary": summary,
            **({"parameters": parameters} if parameters else {}),
            "responses": {
                "200": {"description": "success", "content": {"application/json": {"schema": schema}}},
                **_errors(error, codes),
            },
        }
    }


def _cohere_paths(schemas: dict[str, Any]) -> dict[str, Any]:
    """Cohere's /v1/embed, /v2/embed (embed v1 and v2 of its SDK) and /v2/rerank."""
    error = _COHERE_ERROR
    codes = (400, 401, 404, 422, 429, 503, 504)
    ok_v1 = {"application/json": {"schema": typed_schema(CohereEmbedV1Answer, schemas)}}
    ok_v2 = {"application/json": {"schema": typed_schema(CohereEmbedByType, schemas)}}
    ranked = {"application/json": {"schema": typed_schema(CohereRerankV2Answer, schemas)}}
    return {
        "/v1/embed": _post("Embed (Cohere v1)", typed_schema(CohereEmbedV1Body, schemas), ok_v1, error, codes),
        "/v2/embed": _post("Embed (Cohere v2)", typed_schema(CohereEmbedV2Body, schemas), ok_v2, error, codes),
        "/v2/rerank": _post(
            "Rerank documents by relevance to a query (Cohere v2)",
            typed_schema(CohereRerankV2Body, schemas),
            ranked,
            error,
            codes,
        ),
    }


def _tei_task_paths(
    embed_body: dict, sparse_body: dict, codes: tuple[int, ...], schemas: dict[str, Any]
) -> dict[str, Any]:
    """TEI's /predict, /similarity, /decode, POST / (and /invocations) by the model's kind, GET / and /ping."""
    predict_body = typed_schema(PredictBody, schemas)
    similarity_body = typed_schema(SimilarityBody, schemas)
    rerank_body = typed_schema(RerankBody, schemas)
    root = _post(
        "The task of the model's kind, as TEI: embed (embedders), embed_sparse (SPLADE), rerank (one-logit rerankers), "
        "predict (classifiers); a body with inputs.source_sentence runs similarity with any embedder",
        {
            "type": "object",
            "oneOf": [embed_body, sparse_body, rerank_body, predict_body, similarity_body],
            # every field of each (the last body's schema of a field they share)
            "properties": {
                k: v
                for body in (embed_body, sparse_body, rerank_body, predict_body, similarity_body)
                for k, v in body["properties"].items()
            },
        },
        {"application/json": {"schema": typed_schema(TeiRootAnswer, schemas)}, **_BINARY},
        _TEI_ERROR,
        codes,
    )
    health = _health("TEI's names for /health", _TEI_ERROR)
    return {
        "/predict": _post(
            "Label scores of a sequence classifier (TEI)",
            predict_body,
            {"application/json": {"schema": typed_schema(TeiPredictAnswer, schemas)}},
            _TEI_ERROR,
            codes,
        ),
        "/similarity": _post(
            "Cosine similarity of sentences to a source sentence (TEI)",
            similarity_body,
            {"application/json": {"schema": typed_schema(TeiSimilarityAnswer, schemas)}},
            _TEI_ERROR,
            codes,
        ),
        "/decode": _post(
            "Token IDs back to text (TEI)",
            typed_schema(DecodeBody, schemas),
            {"application/json": {"schema": typed_schema(TeiDecodeAnswer, schemas)}},
            _TEI_ERROR,
            (400, 401, 404, 422, 503, 504),
        ),
        "/": {**root, **health},
        "/invocations": root,
        "/ping": health,
    }


def _openai_paths(codes: tuple[int, ...], schemas: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's /v1/embeddings (and its unversioned path) and /v1/models."""
    body = typed_schema(EmbeddingsBody, schemas)
    ok = {"application/json": {"schema": typed_schema(OpenAIEmbeddings, schemas)}, **_BINARY}
    return {
        "/v1/embeddings": _post("Create embeddings (OpenAI)", body, ok, _OPENAI_ERROR, codes),
        "/embeddings": _post("Create embeddings (OpenAI, unversioned path)", body, ok, _OPENAI_ERROR, codes),
        "/v1/models": _get("Models served right now", typed_schema(ModelList, schemas), (401,)),
    }


def _job_results(job: list[dict], schemas: dict[str, Any]) -> dict[str, Any]:
    """GET /v1/jobs/{job}/results: a finished job's vectors, streamed (services/gateway/jobs/results.py)."""
    line = typed_schema(JobResultLine, schemas)
    parquet = {
        "type": "string",
        "format": "binary",
        "description": (
            "columns id and vector (as embedfleet reindex writes .parquet), schema metadata embedding_type, dim, output"
        ),
    }
    return {
        "get": {
            "summary": "A finished bulk job's vectors, streamed as they are read: NDJSON (the default) or Parquet",
            "parameters": [
                *job,
                {
                    "name": "accept",
                    "in": "header",
                    "required": False,
                    "schema": {
                        "type": "string",
                        "enum": ["application/x-ndjson", "application/vnd.apache.parquet", "application/x-parquet"],
                        "default": "application/x-ndjson",
                    },
                },
            ],
            "responses": {
                "200": {
                    "description": "every stored document's vector; headers x-job-status, x-job-documents, x-job-done, "
                    "x-job-failed, x-embedding-type, x-job-output (a chunked job: x-job-chunks)",
                    "content": {
                        "application/x-ndjson": {"schema": line},
                        "application/vnd.apache.parquet": {"schema": parquet},
                    },
                },
                **_errors(_OPENAI_ERROR, (401, 404, 406, 503)),
                "409": {
                    "description": "the job has not finished: the message names its status and progress",
                    "content": {"application/json": {"schema": _OPENAI_ERROR}},
                },
                "410": {
                    "description": "the job's results expired from the results stream",
                    "content": {"application/json": {"schema": _OPENAI_ERROR}},
                },
            },
        }
    }


def _job_paths(schemas: dict[str, Any]) -> dict[str, Any]:
    """Bulk jobs: POST and GET /v1/jobs, GET / DELETE /v1/jobs/{job} and GET /v1/jobs/{job}/results."""
    job = [{"name": "job", "in": "path", "required": True, "schema": {"type": "string"}}]
    state = _json_answer(JobStatus, schemas)
    return {
        "/v1/jobs": {
            "post": {
                "summary": "Submit a bulk job (inline documents, or a file in the gateway's jobs folder)",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": typed_schema(JobBody, schemas)}},
                },
                "responses": {
                    "202": {"description": "the job, submitted", "content": _json_answer(JobSubmitted, schemas)},
                    "200": {
                        "description": "the same request again (its 'id'): the job's state, its publishing resumed",
                        "content": state,
                    },
                    **_errors(_OPENAI_ERROR, (400, 401, 404, 409, 413, 503)),
                },
            },
            "get": {
                "summary": "The caller's bulk jobs (an operator key's: all), newest first, a page at a time",
                "parameters": query_parameters(JobListQuery),
                "responses": {
                    "200": {"description": "a page of jobs", "content": _json_answer(JobList, schemas)},
                    **_errors(_OPENAI_ERROR, (400, 401, 503)),
                },
            },
        },
        "/v1/jobs/{job}": {
            "get": {
                "summary": "A bulk job's state",
                "parameters": job,
                "responses": {
                    "200": {"description": "state", "content": state},
                    **_errors(_OPENAI_ERROR, (401, 404, 503)),
                },
            },
            "delete": {
                "summary": "Cancel a bulk job: nothing more of it is published or computed; what was stored stays",
                "parameters": job,
                "responses": {
                    "200": {
                        "description": "its state after: status 'cancelled' (a finished job's is unchanged)",
                        "content": state,
                    },
                    **_errors(_OPENAI_ERROR, (401, 404, 503)),
                },
            },
        },
        "/v1/jobs/{job}/results": _job_results(job, schemas),
    }


def _tei_bodies(schemas: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The bodies of TEI's /embed, /embed_sparse and /embed_all (POST / takes the first two too)."""
    return typed_schema(EmbedBody, schemas), typed_schema(EmbedSparseBody, schemas), typed_schema(EmbedAllBody, schemas)


def _tei_embed_paths(
    embed_body: dict, sparse_body: dict, all_body: dict, codes: tuple[int, ...], schemas: dict[str, Any]
) -> dict[str, Any]:
    """TEI's /embed, /embed_sparse, /embed_all, /tokenize and /rerank."""
    tokenize_body = typed_schema(TokenizeBody, schemas)
    return {
        "/embed": _post(
            "Embed (TEI)",
            embed_body,
            {"application/json": {"schema": typed_schema(TeiEmbedAnswer, schemas)}, **_BINARY},
            _TEI_ERROR,
            codes,
        ),
        "/embed_sparse": _post(
            "Sparse vectors: SPLADE, BGE-M3 lexical weights (TEI)",
            sparse_body,
            {"application/json": {"schema": typed_schema(TeiSparseAnswer, schemas)}},
            _TEI_ERROR,
            codes,
        ),
        "/embed_all": _post(
            "A vector per token: hidden states, or ColBERT-style multi-vectors (TEI)",
            all_body,
            {"application/json": {"schema": typed_schema(TeiAllAnswer, schemas)}},
            _TEI_ERROR,
            codes,
        ),
        "/tokenize": _post(
            "Tokenize (TEI)",
            tokenize_body,
            {"application/json": {"schema": typed_schema(TeiTokenizeAnswer, schemas)}},
            _TEI_ERROR,
            (400, 401, 404, 413, 503, 504),
        ),
        "/rerank": _post(
            "Rerank texts by relevance to a query (TEI)",
            typed_schema(RerankBody, schemas),
            {"application/json": {"schema": typed_schema(TeiRerankAnswer, schemas)}},
            _TEI_ERROR,
            codes,
        ),
    }


def _jina_rerank_path(codes: tuple[int, ...], schemas: dict[str, Any]) -> dict[str, Any]:
    """/v1/rerank in Cohere's and Jina's shape; its errors in OpenAI's."""
    return {
        "/v1/rerank": _post(
            "Rerank documents by relevance to a query (Cohere / Jina)",
            typed_schema(CohereRerankV1Body, schemas),
            {"application/json": {"schema": typed_schema(RerankV1Answer, schemas)}},
            _OPENAI_ERROR,
            codes,
        ),
    }


def _search_path(codes: tuple[int, ...], schemas: dict[str, Any]) -> dict[str, Any]:
    """/v1/search over the gateway's --search-sink store (services/gateway/search/serving.py), OpenAI's list style."""
    body = typed_schema(SearchBody, schemas)
    return {
        "/v1/search": _post(
            "Search the gateway's vector store (--search-sink) with a query, optionally reranked",
            body,
            _json_answer(SearchAnswer, schemas),
            _OPENAI_ERROR,
            codes,
        )
    }


def _service_paths() -> dict[str, Any]:
    """The gateway's own: /info, /health, /metrics and this document."""
    return {
        "/info": _get(
            "Model and limits (TEI)",
            inline_schema(TeiInfo),
            (401, 404, 503),
            _TEI_ERROR,
            [{"name": "model", "in": "query", "required": False, "schema": _MODEL}],
        ),
        "/health": _health("liveness"),
        "/metrics": {
            "get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "text exposition format"}}}
        },
        "/openapi.json": _get("This document", {"type": "object"}),
    }


def _health(summary: str, error: dict[str, Any] = _OPENAI_ERROR) -> dict[str, Any]:
    """A health route's; ``error``: the error shape of its path's API (TEI's on / and /ping), that of a
    bad query (400); its 503 is health's own on every path (Unhealthy: TEI's error body and more)."""
    return {
        "get": {
            "summary": f"200 when a tokenizer and a worker of a model answer ({summary}); readiness of models with "
            "?model=ID or ?all=1",
            "parameters": _READINESS,
            "responses": {
                "200": {"description": "success", "content": {"application/json": {"schema": _HEALTHY}}},
                **_errors(error, (400, 401, 429)),
                "503": {
                    "description": "not served (yet): what is missing",
                    "content": {"application/json": {"schema": _UNHEALTHY}},
                },
            },
        }
    }


def _with_not_acceptable(paths: dict[str, Any]) -> dict[str, Any]:
    """Every operation may answer 406 (the gateway's middleware refuses an Accept that takes none of a
    route's media types, services/gateway/http/route_media.py) and 403 (a Host or Origin not allowed,
    services/gateway/http/browser.py), a POST 415 (its body said not to be JSON), in the shape of the
    operation's other errors."""
    for item in paths.values():
        for method, operation in item.items():
            responses = operation["responses"]
            errors = [r for code, r in responses.items() if code.startswith("4")]
            schema = errors[0]["content"]["application/json"]["schema"] if errors else _OPENAI_ERROR
            refusals = {
                "406": "the request's Accept takes none of the media types this route answers",
                "403": "a Host the gateway is not served as (--allowed-hosts), or a web page's Origin not among "
                "--allowed-origins",
            }
            if method == "post":
                refusals["415"] = "a body said to be another type than JSON (text/plain, a form)"
            for code, description in refusals.items():
                responses.setdefault(
                    code, {"description": description, "content": {"application/json": {"schema": schema}}}
                )
    return paths


def openapi_spec(version: str) -> dict[str, Any]:
    codes = (400, 401, 404, 413, 422, 429, 503, 504)  # what most routes may answer besides 200 (and 406: every route)
    schemas: dict[str, Any] = {}  # the typed bodies' models (typed_schema)
    embed_body, sparse_body, all_body = _tei_bodies(schemas)
    return {
        "openapi": "3.1.0",
        "info": {"title": "embedfleet gateway", "version": version},
        "paths": _with_not_acceptable(
            {
                **_openai_paths(codes, schemas),
                **_job_paths(schemas),
                **_tei_embed_paths(embed_body, sparse_body, all_body, codes, schemas),
                **_jina_rerank_path(codes, schemas),
                **_search_path(codes, schemas),
                **_cohere_paths(schemas),
                **_tei_task_paths(embed_body, sparse_body, codes, schemas),
                **_service_paths(),
            }
        ),
        "components": {"schemas": schemas},
    }
