"""reindex's output files: rows written in the job's form, as they came from the workers; an output
that could not be written is refused before any work."""

import json
from pathlib import Path

import numpy as np
import pytest

from embedfleet.services.jobs.files import FAILED, IDS, beside, check_output_path, write_output
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.vectors.forms import FORMS
from embedfleet.shared.vectors.quantize import quantize


@pytest.mark.parametrize("form", list(FORMS))
def test_npy_keeps_the_forms_dtype_and_packed_width(tmp_path, form):
    stored = quantize(np.random.default_rng(0).standard_normal((4, 20)).astype(np.float32), form)
    out = tmp_path / "v.npy"
    write_output(out, ["a", "b", "c", "d"], stored, form, 20)
    back = np.load(out)
    assert back.dtype == FORMS[form].dtype and back.shape == stored.shape and np.array_equal(back, stored)
    assert json.loads(out.with_suffix(".ids.json").read_text()) == ["a", "b", "c", "d"]


@pytest.mark.parametrize("form", ["int8", "binary", "float16"])
def test_parquet_holds_the_rows_and_names_the_form(tmp_path, form):
    import pyarrow as pa  # a dependency: Parquet in and out works on the default install
    import pyarrow.parquet as pq

    stored = quantize(np.random.default_rng(0).standard_normal((3, 20)).astype(np.float32), form)
    out = tmp_path / "v.parquet"
    write_output(out, ["a", "b", "c"], stored, form, 20)
    table = pq.read_table(out)
    assert table.schema.metadata == {b"embedding_type": form.encode(), b"dim": b"20"}
    assert table["id"].to_pylist() == ["a", "b", "c"]
    assert table.schema.field("vector").type.value_type == pa.from_numpy_dtype(stored.dtype)  # int8, not int64
    assert np.array_equal(np.array(table["vector"].to_pylist(), stored.dtype), stored)


# -- the output, checked before anything is published ----------------------------------------


def test_the_files_beside_the_output_are_named_as_the_docs_say():
    """Beside --out go the rows' ids and the ids given up, named as the output with its suffix replaced:
    `--out fail.parquet` writes `fail.failed.json`, as docs/bulk-jobs.md says."""
    assert beside(Path("fail.parquet"), FAILED) == Path("fail.failed.json")
    assert beside(Path("out/v.npy"), IDS) == Path("out/v.ids.json")
    root = Path(__file__).resolve().parents[2]
    for page in ("docs/bulk-jobs.md",):
        text = " ".join((root / page).read_text().split())  # a sentence may break anywhere
        assert "OUT.failed.json" not in text, page
        assert "`--out fail.parquet` writes `fail.failed.json`" in text, page


@pytest.mark.parametrize(
    "name, output",
    [("v.npy", "dense"), ("v.parquet", "dense"), ("v.NPY", "dense"), ("v.npz", "sparse"), ("v.npz", "multivector")],
)
def test_a_writable_output_passes_and_its_folder_is_made(tmp_path, name, output):
    out = tmp_path / "new" / "deeper" / name
    check_output_path(out, output)
    assert out.parent.is_dir()
    assert list(out.parent.iterdir()) == []  # the file written to try the folder is gone again


@pytest.mark.parametrize(
    "name, output, fragment",
    [
        ("v.bin", "dense", "dense vectors are written to .npy (with .ids.json beside it) or .parquet, not .bin"),
        ("vectors", "dense", "not a name without a suffix"),
        ("v.npz", "dense", "not .npz"),
        ("v.npy", "sparse", "sparse vectors are written to .npz"),
        ("v.parquet", "multivector", "multivector vectors are written to .npz"),
    ],
)
def test_an_unsupported_format_is_refused(tmp_path, name, output, fragment):
    with pytest.raises(ConfigError) as exc:
        check_output_path(tmp_path / name, output)
    assert fragment in str(exc.value)


def test_an_output_under_a_file_is_refused(tmp_path):
    (tmp_path / "plain.txt").write_text("x")
    with pytest.raises(ConfigError) as exc:
        check_output_path(tmp_path / "plain.txt" / "sub" / "v.npy", "dense")
    assert str(exc.value).endswith(f"{tmp_path / 'plain.txt'} is a file, not a folder")


@pytest.mark.parametrize("folder", ["v.npy", "v.ids.json", "v.failed.json"])
def test_a_folder_where_a_file_goes_is_refused(tmp_path, folder):
    (tmp_path / folder).mkdir()
    with pytest.raises(ConfigError) as exc:
        check_output_path(tmp_path / "v.npy", "dense")
    assert str(exc.value).endswith(f"{tmp_path / folder} is a folder")


def test_a_read_only_folder_is_refused(tmp_path):
    import os

    if os.geteuid() == 0:
        pytest.skip("root writes in a read-only folder")
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(ConfigError) as exc:
            check_output_path(folder / "v.npy", "dense")
        assert f"cannot write in {folder}: Permission denied" in str(exc.value)
    finally:
        folder.chmod(0o700)


def test_the_collector_reopens_a_lost_consumer_after_the_last_result_read(nats_url):
    """Its consumer gone (a restarted or lost node), the collector opens another that starts after
    the last result it read: the results stored meanwhile are read, none twice. Results stored before
    it opened are an earlier run's; those stored after, this run's (the only ones a rate counts)."""
    import asyncio
    import uuid

    import nats

    from embedfleet.shared.jobs.collector import Collector
    from embedfleet.shared.jobs.streams import ensure_streams, stream_names
    from embedfleet.shared.nats.subjects import Subjects
    from embedfleet.shared.protocol import JobResult, encode

    subjects = Subjects(f"c{uuid.uuid4().hex[:8]}")

    def result(batch: int) -> bytes:
        rows = np.full((2, 4), batch, dtype="<f4")
        return encode(JobResult("j", batch, 0, [f"d{batch}a", f"d{batch}b"], 4, "f4", rows.tobytes(), 3))

    async def main() -> None:
        nc = await nats.connect(nats_url)
        js = nc.jetstream()
        try:
            await ensure_streams(js, subjects)
            stream = stream_names(subjects)["results"]
            for batch in range(3):
                await js.publish(subjects.results("j"), result(batch))
            collector = Collector(js, "j", None, subjects.results("j"), stream)
            await collector.open()
            first = await collector.poll()
            assert (first.earlier, first.now, first.tokens) == (6, 0, 0)
            await js.delete_consumer(stream, (await collector._psub.consumer_info()).name)
            for batch in range(3, 5):
                await js.publish(subjects.results("j"), result(batch))
            fresh = tokens = 0
            for _ in range(40):
                polled = await collector.poll()
                assert polled.earlier == 0
                fresh, tokens = fresh + polled.now, tokens + polled.tokens
                if fresh >= 4:
                    break
            assert (fresh, tokens) == (4, 6) and sorted(collector.got) == sorted(
                f"d{b}{r}" for b in range(5) for r in "ab"
            )
            assert (await collector._psub.consumer_info()).config.opt_start_seq == 4
            assert collector.got["d4a"].tolist() == [4.0] * 4
            await collector.close()
        finally:
            await nc.close()

    asyncio.run(main())


def test_a_result_is_the_jobs_only_at_its_documents_places():
    from embedfleet.shared.jobs.collector import Layout
    from embedfleet.shared.protocol import JobResult

    layout = Layout.of([(f"d{i}", "text") for i in range(10)], 4)  # batches [d0..d3], [d4..d7], [d8, d9]

    def result(batch: int, start: int, ids: list[str]) -> JobResult:
        return JobResult("j", batch, start, ids, 1, "f4", b"\0" * 4 * len(ids), 1)

    assert layout.holds(result(1, 0, ["d4", "d5", "d6", "d7"])) and layout.holds(result(1, 2, ["d6", "d7"]))
    assert layout.holds(result(2, 0, ["d8", "d9"]))
    assert not layout.holds(result(0, 0, ["d4"]))  # a real id at another place
    assert not layout.holds(result(1, 3, ["d7", "d8"]))  # past its batch
    assert not layout.holds(result(2, 1, ["d9", "x"]))  # past the job
    assert not layout.holds(result(0, 0, ["x"]))
    assert not layout.holds(result(3, 0, ["d8"]))  # no such batch


def test_a_job_of_images_is_laid_out_as_its_batches_were_cut_by_bytes():
    """Images of 100, 100, 300, 100 bytes in batches of at most 3 documents and 300 bytes (ids and
    their overhead counted): [a, b], [c], [d]; a result is the job's at those places only."""
    from embedfleet.shared.jobs.batches import DOCUMENT_OVERHEAD, batch_starts
    from embedfleet.shared.jobs.collector import Layout
    from embedfleet.shared.jobs.image_docs import ImageDoc
    from embedfleet.shared.protocol import JobResult

    docs = [(name, ImageDoc(name, size, "0" * 64, data=b"x")) for name, size in zip("abcd", (100, 100, 300, 100))]
    room = 300 + 1 + DOCUMENT_OVERHEAD  # c alone fits; a and b together do
    assert batch_starts(docs, 3, room) == [0, 2, 3, 4]
    assert batch_starts(docs, 3, room - 1) == [0, 2, 3, 4]  # c alone passes it: a batch alone (refused before)
    assert batch_starts(docs, 1, room) == [0, 1, 2, 3, 4] and batch_starts(docs, 3) == [0, 3, 4]
    assert batch_starts([], 3, room) == [0]
    layout = Layout.of(docs, 3, room)

    def result(batch: int, start: int, ids: list[str]) -> JobResult:
        return JobResult("j", batch, start, ids, 1, "f4", b"\0" * 4 * len(ids), 1)

    assert (
        layout.holds(result(0, 0, ["a", "b"]))
        and layout.holds(result(1, 0, ["c"]))
        and layout.holds(result(2, 0, ["d"]))
    )
    assert not layout.holds(result(0, 0, ["a", "b", "c"])) and not layout.holds(result(1, 0, ["d"]))


# -- a chunked job's files ----------------------------------------------------------------------


def _chunk_table(texts: bool):
    from embedfleet.shared.jobs.chunks import ChunkTable

    return ChunkTable(["a", "a", "b"], [0, 1, 0], [0, 5, 0], [6, 12, 3], ["first", "second", "b's"] if texts else None)


CHUNKING = {"size": 8, "overlap": 1, "boundary": "token", "late": False, "with_text": True}


@pytest.mark.parametrize("texts", [True, False])
def test_a_chunked_npy_has_a_row_a_chunk_and_its_place_beside_it(tmp_path, texts):
    from embedfleet.services.jobs.chunked_output import write_chunked

    stored = quantize(np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32), "int8")
    out = tmp_path / "v.npy"
    write_chunked(out, _chunk_table(texts), stored, "int8", 16, CHUNKING)
    assert np.array_equal(np.load(out), stored) and np.load(out).dtype == np.int8
    assert json.loads(out.with_suffix(".ids.json").read_text()) == ["a", "a", "b"]
    lines = [json.loads(line) for line in out.with_suffix(".chunks.jsonl").read_text().splitlines()]
    assert lines[1] == {"id": "a", "chunk": 1, "start": 5, "end": 12, **({"text": "second"} if texts else {})}
    assert len(lines) == 3


def test_a_chunked_parquet_has_the_chunk_columns_and_says_how_it_was_cut(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from embedfleet.services.jobs.chunked_output import write_chunked

    stored = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
    out = tmp_path / "v.parquet"
    write_chunked(out, _chunk_table(True), stored, "float32", 4, CHUNKING)
    table = pq.read_table(out)
    assert table.column_names == ["id", "chunk", "start", "end", "vector", "text"]
    assert [table.schema.field(c).type for c in ("chunk", "start", "end")] == [pa.int32(), pa.int64(), pa.int64()]
    assert json.loads(table.schema.metadata[b"chunking"]) == CHUNKING and table.schema.metadata[b"dim"] == b"4"
    assert table.select(["id", "chunk", "start", "end", "text"]).to_pylist()[2] == {
        "id": "b",
        "chunk": 0,
        "start": 0,
        "end": 3,
        "text": "b's",
    }
    assert np.array_equal(np.stack(table.column("vector").to_numpy(zero_copy_only=False)), stored)


def test_a_chunked_npys_sidecar_is_checked_before_any_work(tmp_path):
    (tmp_path / "v.chunks.jsonl").mkdir()
    check_output_path(tmp_path / "v.npy", "dense")  # without chunks the sidecar is not written
    with pytest.raises(ConfigError) as exc:
        check_output_path(tmp_path / "v.npy", "dense", chunked=True)
    assert str(exc.value).endswith(f"{tmp_path / 'v.chunks.jsonl'} is a folder")


def test_a_job_of_images_refuses_what_images_cannot_do_before_any_work(tmp_path):
    """reindex of a folder of images: --with-text, --chunk-size and another output than dense refused,
    and an image past --max-image-pixels by its header, naming the file; all before NATS is asked."""
    from embedfleet.services.cli.main import build_parser
    from embedfleet.services.jobs.plan import plan_of
    from embedfleet.shared.jobs.documents import images_of
    from tests.support.image_files import encoded, noise

    folder = tmp_path / "pictures"
    folder.mkdir()
    (folder / "a.png").write_bytes(encoded(noise(20, 30, np.random.default_rng(0))))

    def plan(*args: str):
        return plan_of(build_parser().parse_args(["reindex", str(folder), "--model", "clip", *args]))

    out = ["--out", str(tmp_path / "v.npy")]
    assert images_of(plan(*out).docs) is not None
    for args, says in (
        ([*out, "--with-text", "--sink", f"lancedb://{tmp_path}/l?table=t"], "--with-text: an image has no text"),
        ([*out, "--chunk-size", "8"], "--chunk-size: chunks are cut from texts; an image is one vector"),
        (["--out", str(tmp_path / "v.npz"), "--output", "sparse"], "--output sparse: images make dense"),
        ([*out, "--max-image-pixels", "599"], "a.png: the image is 20x30 = 600 pixels, over the limit of 599"),
    ):
        with pytest.raises(ConfigError) as caught:
            plan(*args)
        assert says in str(caught.value), caught.value
