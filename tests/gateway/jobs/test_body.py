"""POST /v1/jobs' typed body: /openapi.json's request schema is the model's and names exactly the
fields the route reads; the route accepts what the schema accepts and refuses what it refuses; every
fault answers in OpenAI's error shape naming the field; fields that do not go together are refused."""

from __future__ import annotations

from typing import Any, get_args

import orjson
import pytest

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.jobs.api import inline_documents, job_options, parse_job
from embedfleet.services.gateway.jobs.body import DEFAULT_BATCH, JobBody
from embedfleet.services.gateway.openai.body import ChunkingBody, ChunkSpecBody
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.jobs.state import JOB_OUTPUTS
from embedfleet.shared.protocol import EmbedOptions
from embedfleet.shared.text_chunks import BOUNDARIES, ChunkSpec, JobChunking
from embedfleet.shared.vectors.forms import EMBEDDING_TYPES
from tests.gateway.typed_bodies import added_field, is_generated, scalar_cases, served_body

BASE: dict[str, Any] = {"documents": [{"id": "a", "text": "one"}]}
# every field, none at its default ('documents' and 'path' together parse; the route takes one of them)
EVERY_FIELD: dict[str, Any] = {
    "model": "m",
    "id": "job-1",
    "documents": [{"id": "a", "text": "one", "lang": "en"}, {"id": 7, "text": "two"}],
    "path": "docs.jsonl",
    "input_type": "document",
    "embedding_type": "float16",
    "output": "dense",
    "batch_size": 8,
    "chunking": {"size": 8, "overlap": 2, "boundary": "sentence", "late": True},
    "with_text": True,
    "sink": "lancedb:///data?table=t",
}


def _refusal(doc: dict[str, Any]) -> ApiError:
    """The error the route answers ``doc`` with: a fault of a field, or of fields together."""
    with pytest.raises(ApiError) as err:
        body = parse_job(orjson.dumps(doc))
        job_options(body)
        if body.documents is not None:
            inline_documents(body.documents)
    return err.value


def test_openapi_body_is_the_model_s_generated_schema():
    assert is_generated("/v1/jobs", JobBody)
    served, components = served_body("/v1/jobs")
    assert set(served["properties"]) == set(EVERY_FIELD) and "required" not in served
    chunking = components["ChunkSpecBody"]
    assert set(chunking["properties"]) == {"size", "overlap", "boundary", "late"}
    assert chunking["additionalProperties"] is False and chunking["required"] == ["size"]
    document = components["DocumentBody"]
    assert document["required"] == ["id"] and document["additionalProperties"] is True
    assert {"text", "image"} <= set(document["properties"])  # one of the two: checked with the documents


def test_a_field_added_to_the_model_is_in_the_served_schema(monkeypatch):
    assert added_field(monkeypatch, "/v1/jobs", "JobBody") == {"default": 0, "title": "Added", "type": "integer"}


def test_the_chunking_of_a_job_is_the_embedding_routes_without_return():
    assert set(ChunkingBody.model_fields) - set(ChunkSpecBody.model_fields) == {"returns"}
    assert issubclass(ChunkingBody, ChunkSpecBody)


@pytest.mark.parametrize("field", sorted(JobBody.model_fields))
def test_the_route_accepts_what_the_schema_accepts_and_refuses_the_rest(field):
    served, _ = served_body("/v1/jobs")
    cases = scalar_cases(served["properties"][field])
    if cases is None:  # a list or an object: the tests below
        assert field in ("documents", "chunking")
        return
    accepted, refused = cases
    for value in accepted:
        doc = parse_job(orjson.dumps({**BASE, field: value}))
        assert getattr(doc, field) == value or value is None
    for value in refused:
        with pytest.raises(ApiError) as err:
            parse_job(orjson.dumps({**BASE, field: value}))
        assert (err.value.status, err.value.param) == (400, field), value
        assert err.value.message.startswith(f"'{field}' "), err.value.message


def test_every_field_of_the_schema_is_read():
    doc = parse_job(orjson.dumps(EVERY_FIELD))
    options, form, chunking = job_options(doc)
    assert options == EmbedOptions(input_type="document", dtype="f2", output="dense") and form == "float16"
    assert chunking == JobChunking(ChunkSpec(8, 2, "sentence"), late=True, with_text=True)
    assert (doc.model, doc.id, doc.path, doc.batch_size, doc.sink) == (
        "m",
        "job-1",
        "docs.jsonl",
        8,
        "lancedb:///data?table=t",
    )
    docs, fields = inline_documents(doc.documents)
    assert docs == [("a", "one"), ("7", "two")] and fields == {"a": {"lang": "en"}}


def test_the_model_s_enums_are_the_gateway_s():
    fields = JobBody.model_fields
    assert get_args(get_args(fields["output"].annotation)[0]) == JOB_OUTPUTS
    assert set(get_args(get_args(fields["embedding_type"].annotation)[0])) == set(EMBEDDING_TYPES)
    assert get_args(ChunkSpecBody.model_fields["boundary"].annotation) == BOUNDARIES


def test_unknown_fields_are_ignored_and_unknown_chunking_keys_refused():
    assert parse_job(orjson.dumps({**BASE, "priority": {"x": 1}})).documents is not None
    error = _refusal({**BASE, "chunking": {"size": 8, "return": "mean"}})
    assert (error.param, error.message) == ("chunking", "'chunking' has unknown keys 'return'")


def test_null_optional_fields_are_as_if_absent():
    nulls = dict.fromkeys(["model", "input_type", "embedding_type", "output", "batch_size", "chunking", "with_text"])
    doc = parse_job(orjson.dumps({**BASE, **nulls}))
    assert job_options(doc) == (EmbedOptions(dtype="f4", output="dense"), "float32", None)
    assert doc.batch_size is None and not doc.with_text and DEFAULT_BATCH == 64


@pytest.mark.parametrize(
    "doc, param, message",
    [
        ({"documents": None}, "documents", "'documents' must be a list, got null"),
        ({"documents": []}, "documents", "'documents' must not be an empty list"),
        ({"documents": ["a"]}, "documents", "'documents[0]' must be an object, got 'a'"),
        ({"documents": [{"id": "a"}]}, "documents.text", "'documents[0].text' is required (or 'image', a data URI, for a two-tower model)"),
        ({"documents": [{"id": "a", "text": "x", "image": "data:,"}]}, "documents", "'documents[0]' has both 'text' and 'image': give one of the two"),
        ({"documents": [{"id": "a", "text": "x"}, {"id": "b", "image": "data:,"}]}, "documents", "'documents[1]' is an image and 'documents[0]' is not: a job's documents are all texts or all images (submit them as two jobs)"),
        ({"documents": [{"id": "a", "text": 3}]}, "documents.text", "'documents[0].text' must be a string, got 3"),
        ({"documents": [{"id": True, "text": "x"}]}, "documents.id", "'documents[0].id' must be a string or an integer, got true"),
        ({"documents": [{"id": 1.5, "text": "x"}]}, "documents.id", "'documents[0].id' must be a string or an integer, got 1.5"),
        ({"documents": [{"id": 1, "text": "x"}, {"id": "1", "text": "y"}]}, "documents", "document ids must be unique: 'documents[1]' repeats id '1'"),
        ({**BASE, "id": None}, "id", "'id' must be a string, got null"),
        ({**BASE, "path": None}, "path", "'path' must be a string, got null"),
        ({**BASE, "sink": 7}, "sink", "'sink' must be a string, got 7"),
        ({**BASE, "batch_size": 4097}, "batch_size", "'batch_size' must be at most 4096, got 4097"),
        ({**BASE, "output": "ragged"}, "output", "'output' must be one of 'dense', 'sparse' or 'multivector', got 'ragged'"),
        ({**BASE, "chunking": {"size": 0}}, "chunking.size", "'chunking.size' must be at least 1, got 0"),
        ({**BASE, "chunking": {"size": "8"}}, "chunking.size", "'chunking.size' must be an integer, got '8'"),
        ({**BASE, "chunking": {"size": 8, "boundary": "page"}}, "chunking.boundary", "'chunking.boundary' must be 'token' or 'sentence', got 'page'"),
        ({**BASE, "chunking": {}}, "chunking.size", "'chunking.size' is required"),
        ({**BASE, "chunking": 8}, "chunking", "'chunking' must be an object, got 8"),
        # fields that do not go together (jobs_api.job_options)
        ({**BASE, "chunking": {"size": 8, "overlap": 8}}, "chunking", "chunking.overlap (8) must be less than chunking.size (8)"),
        ({**BASE, "chunking": {"size": 8}, "output": "sparse"}, "chunking", "a chunked job makes a dense vector a chunk, not sparse vectors"),
        ({**BASE, "output": "sparse", "embedding_type": "int8"}, "embedding_type", "sparse values are float32 or float16"),
        ({**BASE, "with_text": True}, "with_text", "'with_text' stores each chunk's text: give 'chunking' too"),
    ],
)  # fmt: skip
def test_faults_name_their_field(doc, param, message):
    error = _refusal(doc)
    assert (error.code, error.param, error.message) == (ErrorCode.INVALID_REQUEST, param, message)
    body = orjson.loads(error.response("/v1/jobs").body)
    assert body == {
        "error": {"message": message, "type": "invalid_request_error", "param": param, "code": "invalid_request"}
    }


def test_with_text_goes_with_a_sink_without_chunking():
    assert job_options(parse_job(orjson.dumps({**BASE, "with_text": True, "sink": "lancedb:///d?table=t"})))[2] is None


@pytest.mark.parametrize("body", [b"[1]", b"{", b'"job"'])
def test_a_body_that_is_no_json_object_is_refused(body):
    with pytest.raises(ApiError) as err:
        parse_job(body)
    assert err.value.status == 400 and err.value.param is None
