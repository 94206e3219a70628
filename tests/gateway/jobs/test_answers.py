"""The bulk-job routes' answers held to their models (services/gateway/jobs/answers.py): a job's state as
GET / DELETE /v1/jobs/{job} show it, every NDJSON line of its results, and /openapi.json's schemas
made from them. POST /v1/jobs' 202 answer is built with the job's publishing: the live answers of
tests/integration/test_job_results.py, test_job_chunks.py and test_job_sinks_http.py are held to
JobSubmitted, and every state tests/support/procs.py's job_finished polls to JobStatus."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, get_args

import numpy as np
import orjson
import pytest
from pydantic import BaseModel, ValidationError

from embedfleet.services.gateway.jobs.answers import (
    Boundary,
    Form,
    JobChunking,
    JobList,
    JobResultLine,
    JobSparseVector,
    JobStatus,
    JobSubmitted,
    Output,
    Status,
)
from embedfleet.services.gateway.jobs.api import _shown
from embedfleet.services.gateway.jobs.listing import JobListQuery, page_answer
from embedfleet.services.gateway.jobs.results import ndjson_lines
from embedfleet.services.gateway.openapi import openapi_spec, typed_schema
from embedfleet.shared.jobs.results import Stored
from embedfleet.shared.jobs.state import JOB_OUTPUTS, STATUSES, JobState
from embedfleet.shared.protocol import ChunkRows
from embedfleet.shared.text_chunks import BOUNDARIES
from embedfleet.shared.vectors.forms import FORMS
from tests.shared.jobs.test_state import FULL  # every field of a state away from its default

# what _shown leaves out of a job's record: the ledgers, the owner's key digest, the writer's lease
PRIVATE = {"accounted", "accounted_chunks", "cut", "owner", "sink_lease"}


def _spec() -> dict[str, Any]:
    return orjson.loads(orjson.dumps(openapi_spec("test")))


def _as_json(value: Any) -> Any:
    return orjson.loads(orjson.dumps(value))


def _documented(spec: dict, path: str, method: str, status: str, media: str, model: type[BaseModel]) -> None:
    """The schema ``spec`` serves for the answer is ``model``'s, its nested models among the components."""
    defs: dict[str, Any] = {}
    assert spec["paths"][path][method]["responses"][status]["content"][media]["schema"] == _as_json(
        typed_schema(model, defs)
    )
    assert {name: spec["components"]["schemas"][name] for name in defs} == _as_json(defs)


def _held(model: type[BaseModel], body: bytes) -> BaseModel:
    """``body`` validated by ``model`` (strict, no field it does not name) and said back whole."""
    answer = model.model_validate_json(body)
    assert answer.model_dump(mode="json", exclude_unset=True) == orjson.loads(body)
    return answer


def test_the_literals_are_the_values_the_code_writes():
    assert get_args(Status) == STATUSES
    assert get_args(Form) == tuple(FORMS)
    assert get_args(Output) == JOB_OUTPUTS
    assert get_args(Boundary) == BOUNDARIES


def test_openapi_documents_each_answer_by_its_model():
    spec = _spec()
    json = "application/json"
    _documented(spec, "/v1/jobs", "post", "202", json, JobSubmitted)
    _documented(spec, "/v1/jobs", "post", "200", json, JobStatus)  # the same request again
    _documented(spec, "/v1/jobs", "get", "200", json, JobList)
    parameters = spec["paths"]["/v1/jobs"]["get"]["parameters"]
    assert [(p["name"], p["in"]) for p in parameters] == [(name, "query") for name in JobListQuery.model_fields]
    assert parameters[0]["schema"] == {"default": 20, "maximum": 100, "minimum": 1, "title": "Limit", "type": "integer"}
    _documented(spec, "/v1/jobs/{job}", "get", "200", json, JobStatus)
    _documented(spec, "/v1/jobs/{job}", "delete", "200", json, JobStatus)
    _documented(spec, "/v1/jobs/{job}/results", "get", "200", "application/x-ndjson", JobResultLine)
    results = spec["paths"]["/v1/jobs/{job}/results"]["get"]["responses"]["200"]["content"]
    assert results["application/vnd.apache.parquet"]["schema"]["format"] == "binary"  # binary: no model


def test_every_field_of_a_job_s_state_but_the_private_ones_is_a_field_of_the_answer():
    shown = {f.name for f in fields(JobState)} - PRIVATE - {"job"} | {"id"}
    assert set(JobStatus.model_fields) == shown


@pytest.mark.parametrize(
    "state",
    [
        FULL,
        JobState(
            "j2", status="running", model="m", input="inline", documents=1, embedding_type="float32", output="dense"
        ),
        JobState(
            "j3", status="cancelled", model="m", input="inline", documents=5, embedding_type="float16", output="sparse"
        ),
    ],
    ids=["every-field", "just-submitted", "sparse-cancelled"],
)
def test_a_job_s_state_as_shown_is_a_job_status(state):
    # as the bucket holds it and the routes read it back, then show it
    body = orjson.dumps(_shown(JobState.decode(state.encode(), state.job)))
    answer = _held(JobStatus, body)
    assert answer.model_fields_set >= {"id", "status", "documents"}
    assert not (PRIVATE & set(orjson.loads(body)))


def test_a_page_of_jobs_is_a_job_list():
    just_submitted = JobState(
        "j2", status="running", model="m", input="inline", documents=1, embedding_type="float32", output="dense"
    )
    page = _held(JobList, orjson.dumps(page_answer([_shown(FULL), _shown(just_submitted)], True)))
    assert [job.id for job in page.data] == [FULL.job, "j2"] and page.last_id == "j2"
    _held(JobList, orjson.dumps(page_answer([], False)))
    with pytest.raises(ValidationError):  # each item is a job's state, as strict as GET /v1/jobs/{job}'s
        JobList.model_validate_json(orjson.dumps(page_answer([{**_shown(FULL), "owner": "digest"}], False)))


def test_every_field_of_a_job_status_is_written_for_some_state():
    assert set(orjson.loads(orjson.dumps(_shown(FULL)))) == set(JobStatus.model_fields)


def test_wrong_answers_are_refused():
    shown = _as_json(_shown(FULL))
    JobStatus.model_validate_json(orjson.dumps(shown))  # each wrong one below differs from it in one thing
    for wrong in (
        {**shown, "owner": "digest"},  # a private field shown
        {**shown, "done": None},  # an absent field is left out, never null
        {**shown, "status": "finished"},  # a status the code never writes
        {**shown, "sink_shape": ["int8", "dense", 384]},
        {k: v for k, v in shown.items() if k != "id"},
        {**shown, "dead": [{**shown["dead"][0], "why": "x"}]},
        {**shown, "documents": "40"},  # strict: a string is no count
    ):
        with pytest.raises(ValidationError):
            JobStatus.model_validate_json(orjson.dumps(wrong))
    submitted = {"id": "j", "status": "running", "documents": 2, "model": "m", "embedding_type": "float32"}
    with pytest.raises(ValidationError):  # batch_size missing
        JobSubmitted.model_validate_json(orjson.dumps(submitted))
    JobSubmitted.model_validate_json(orjson.dumps({**submitted, "batch_size": 64}))
    with pytest.raises(ValidationError):  # a chunking's fields are all recorded
        JobChunking.model_validate_json(b'{"size": 8, "overlap": 0, "boundary": "token", "late": false}')


def _lines(part: Stored, output: str) -> list[bytes]:
    lines = ndjson_lines(part, output).splitlines()
    assert lines
    return lines


def _parts() -> dict[str, tuple[Stored, str]]:
    """A part of every kind of job's results, by name: dense of each form, sparse, multivector, chunked
    with and without texts."""
    floats = np.array([[0.25, -1.5], [3.0, 0.1]], dtype="<f4")
    forms = {
        "float32": floats,
        "float16": floats.astype("<f2"),
        "int8": np.array([[-128, 127], [5, 0]], np.int8),
        "uint8": np.array([[0, 255], [5, 1]], np.uint8),  # binary and ubinary rows too: packed bits
    }
    parts = {form: (Stored(0, 0, ["d0", "d1"], rows, 2), "dense") for form, rows in forms.items()}
    parts["sparse"] = (
        Stored(
            3,
            7,
            ["a", "b"],
            [(np.array([2, 9], np.int32), np.array([0.5, 1.25], "<f4")), (np.zeros(0, np.int32), np.zeros(0, "<f4"))],
            30,
        ),
        "sparse",
    )
    multi = [np.array([[1, -2], [3, 4]], np.int8), np.array([[0.5, 1.0]], "<f4")]
    parts["multivector"] = (Stored(0, 0, ["m", "n"], multi, 2), "multivector")
    for name, texts in (("chunked", None), ("chunked-with-text", ["abcd", "defghi"])):
        chunks = ChunkRows.of(1, [(0, 0, 2, 0, 4), (0, 1, 2, 3, 9)], texts)
        parts[name] = (Stored(0, 0, ["a", "a"], floats, 2, chunks), "dense")
    return parts


@pytest.mark.parametrize("name", list(_parts()))
def test_every_results_line_is_a_job_result_line(name):
    for line in _lines(*_parts()[name]):
        _held(JobResultLine, line)


def test_a_chunked_line_has_its_place_and_text_and_a_plain_one_has_none():
    parts = _parts()
    assert JobResultLine.model_validate_json(_lines(*parts["float32"])[0]).model_fields_set == {"id", "vector"}
    assert JobResultLine.model_validate_json(_lines(*parts["chunked"])[1]).model_fields_set == {
        "id",
        "chunk",
        "start",
        "end",
        "vector",
    }
    line = JobResultLine.model_validate_json(_lines(*parts["chunked-with-text"])[1])
    assert (line.chunk, line.start, line.end, line.text) == (1, 3, 9, "defghi")
    assert isinstance(JobResultLine.model_validate_json(_lines(*parts["sparse"])[0]).vector, JobSparseVector)


def test_a_wrong_line_is_refused():
    for wrong in (
        b'{"id": "a", "vectors": [1.0]}',  # a field renamed
        b'{"id": "a", "vector": [1.0], "chunk": null}',
        b'{"id": "a", "vector": {"indices": [1], "values": [0.5], "dim": 30}}',
        b'{"id": "a", "vector": "AACAPw=="}',  # no base64 in a job's results
        b'{"id": 3, "vector": [1.0]}',
    ):
        with pytest.raises(ValidationError):
            JobResultLine.model_validate_json(wrong)
