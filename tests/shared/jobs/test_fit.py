"""What a bulk job needs of the fleet, from the discovery metadata: the model served, the output one
it makes, and batches whose stored vectors fit in one NATS message; a job of images: a model that
embeds them, each image within one job batch's message."""

from __future__ import annotations

import pytest

from embedfleet.shared.jobs.batches import batch_room
from embedfleet.shared.jobs.fit import ID_OVERHEAD, RESULT_OVERHEAD, JobRefused, JobTooLarge, check_job
from embedfleet.shared.jobs.image_docs import ImageDoc
from embedfleet.shared.nats.fleet import FleetView
from embedfleet.shared.protocol import EmbedOptions
from embedfleet.shared.text_chunks import ChunkSpec, JobChunking

MB8 = 8 * 1024 * 1024
MINILM = (
    {"max_seq_length": "256", "dim": "384", "vocab_size": "30522"},
    {"dim": "384", "task": "embed", "outputs": "dense"},
)
SPLADE = (
    {"max_seq_length": "512", "dim": "30522", "vocab_size": "30522"},
    {"dim": "30522", "task": "embed", "outputs": "sparse", "sparse_entries": "30522"},
)
BGE_M3 = (
    {"max_seq_length": "8192", "dim": "1024", "vocab_size": "250002"},
    {
        "dim": "1024",
        "task": "embed",
        "outputs": "dense,sparse,multivector",
        "sparse_entries": "8192",
        "multivector_dim": "1024",
    },
)
RERANKER = ({"max_seq_length": "512", "dim": "384", "vocab_size": "30522"}, {"dim": "1", "task": "score"})


def _view(**models: tuple[dict, dict]) -> FleetView:
    return FleetView({m: t for m, (t, _) in models.items()}, {m: w for m, (_, w) in models.items()}, 0.0)


def _options(output: str = "dense", dtype: str = "f4") -> EmbedOptions:
    return EmbedOptions(dtype=dtype, output=output)


def test_a_dense_job_of_a_served_model_runs_as_asked():
    fit = check_job(_view(minilm=MINILM), "minilm", _options(), 64, MB8, ["doc-1", "doc-2"])
    assert (fit.batch_size, fit.note) == (64, None)


def test_a_model_not_served_is_refused_naming_the_served_ones():
    view = _view(minilm=MINILM, splade=SPLADE)
    with pytest.raises(JobRefused) as exc:
        check_job(view, "bge", _options(), 64, MB8, ["a"])
    assert (
        str(exc.value) == "model 'bge' is not served here (no live tokenizer and worker for it); served: minilm, splade"
    )
    assert exc.value.field == "model"
    # a tokenizer alone (no worker) does not serve a model
    half = FleetView({"minilm": MINILM[0]}, {}, 0.0)
    with pytest.raises(JobRefused, match="served: none"):
        check_job(half, "minilm", _options(), 64, MB8, ["a"])


@pytest.mark.parametrize(
    "model, output, message, field",
    [
        ("minilm", "sparse", "minilm makes no sparse vectors (it makes: dense)", "output"),
        ("splade", "dense", "splade makes no dense vectors (it makes: sparse)", "output"),
        (
            "reranker",
            "dense",
            "reranker is a cross-encoder: it scores (query, document) pairs and makes no vectors",
            "model",
        ),
    ],
)
def test_an_output_the_model_cannot_make_is_refused(model, output, message, field):
    view = _view(minilm=MINILM, splade=SPLADE, reranker=RERANKER)
    with pytest.raises(JobRefused) as exc:
        check_job(view, model, _options(output), 64, MB8, ["a"])
    assert (str(exc.value), exc.value.field) == (message, field)


def test_sparse_batches_are_cut_to_what_a_message_holds():
    """SPLADE may weigh every one of 30,522 vocabulary ids: 8 bytes an entry (id, float32 value) and
    its offset, 244,180 bytes a document; 64 of them are 15.6 MB, over 8 MiB."""
    ids = [f"doc-{i:04d}" for i in range(1000)]  # 8 bytes each
    per_doc = 30522 * 8 + 4 + 8 + ID_OVERHEAD
    fits = (MB8 - RESULT_OVERHEAD) // per_doc
    fit = check_job(_view(splade=SPLADE), "splade", _options("sparse"), 64, MB8, ids)
    assert fit.batch_size == fits == 34
    assert fit.note == (
        f"batch size cut from 64 to 34: a document's sparse vectors from splade may take {per_doc:,} "
        "bytes, and a batch's results must fit in one NATS message of 8,388,608 bytes (max_payload)"
    )
    assert 34 * per_doc + RESULT_OVERHEAD <= MB8 < 35 * per_doc + RESULT_OVERHEAD
    # float16 values: 6 bytes an entry, more documents a batch
    assert check_job(_view(splade=SPLADE), "splade", _options("sparse", "f2"), 64, MB8, ids).batch_size == 45
    # a batch size under the limit stays
    assert check_job(_view(splade=SPLADE), "splade", _options("sparse"), 16, MB8, ids) == type(fit)(16)


def test_bge_m3_sizes_by_its_token_limit_and_width():
    view = _view(bge=BGE_M3)
    assert (
        check_job(view, "bge", _options("sparse"), 64, MB8, ["a"]).batch_size == 64
    )  # 8,192 entries: 65 KB a document
    # a vector per token: 8,192 tokens of 1,024 bits (ubinary) is 1 MiB a document
    multi = check_job(view, "bge", _options("multivector", "ub1"), 64, MB8, ["a"])
    assert multi.batch_size == (MB8 - RESULT_OVERHEAD) // (8192 * 128 + 4 + 1 + ID_OVERHEAD) == 7


def test_a_document_that_cannot_fit_one_message_is_refused():
    with pytest.raises(JobRefused) as exc:
        check_job(_view(bge=BGE_M3), "bge", _options("multivector"), 64, MB8, ["a"])
    assert str(exc.value) == (
        "one document's multivector vectors from bge may take 33,554,442 bytes, over the NATS "
        "server's message limit of 8,388,608 (max_payload): raise max_payload in the server's "
        "configuration, or ask a smaller embedding_type"
    )
    assert exc.value.field == "output"


def test_a_worker_of_an_earlier_version_is_sized_by_the_vocabulary():
    """No sparse_entries in its metadata: the tokenizer's vocabulary bounds a sparse vector."""
    tokenizer, worker = SPLADE
    old = {k: v for k, v in worker.items() if k != "sparse_entries"}
    assert (
        check_job(_view(splade=(tokenizer, old)), "splade", _options("sparse"), 64, MB8, ["doc-0001"]).batch_size == 34
    )


CLIP = (
    {"max_seq_length": "77", "vocab_size": "30522"},
    {"dim": "24", "task": "embed", "outputs": "dense", "inputs": "text,image"},
)


def _image(size: int) -> ImageDoc:
    return ImageDoc("f", size, "0" * 64, data=b"x")


def test_a_job_of_images_is_cut_by_bytes_and_needs_a_model_that_embeds_them():
    images = [_image(100_000), _image(3_000_000)]
    fit = check_job(_view(clip=CLIP), "clip", _options(), 64, MB8, ["a", "b"], images=images)
    assert (fit.batch_size, fit.batch_bytes) == (64, batch_room(MB8)) and fit.batch_bytes == MB8 - (16 << 10)
    assert check_job(_view(clip=CLIP), "clip", _options(), 64, MB8, ["a"]).batch_bytes == 0  # texts: by count alone
    with pytest.raises(JobRefused) as exc:
        check_job(_view(minilm=MINILM), "minilm", _options(), 64, MB8, ["a"], images=images[:1])
    assert (str(exc.value), exc.value.field) == (
        "minilm embeds text only: it takes no image documents (a two-tower model, CLIP or SigLIP, embeds images)",
        "model",
    )
    with pytest.raises(JobTooLarge) as exc:
        check_job(_view(clip=CLIP), "clip", _options(), 64, 1 << 20, ["small", "large"], images=images)
    assert str(exc.value).startswith(
        "document 'large': its image is 3,000,000 bytes, more than one job batch can carry"
    )
    assert exc.value.field == "documents"
    with pytest.raises(JobRefused, match="images make dense vectors only, not sparse"):
        check_job(_view(clip=CLIP), "clip", _options("sparse", "f4"), 64, MB8, ["a"], images=images[:1])
    with pytest.raises(JobRefused, match="chunking applies to texts"):
        check_job(_view(clip=CLIP), "clip", _options(), 64, MB8, ["a"], JobChunking(ChunkSpec(8)), images=images[:1])


COLQWEN2 = (
    {"max_seq_length": "32768", "dim": "128", "vocab_size": "151936"},
    {
        "dim": "128",
        "task": "embed",
        "outputs": "multivector,tokens",
        "inputs": "text,image",
        "multivector_dim": "128",
        "page_tokens": "878",
    },
)


def test_a_page_models_image_job_is_sized_by_its_pages_tokens():
    """A page is at most its merged patches and prompt (878 tokens at ColQwen2's published bounds), far below
    the 32,768 a text may hold: a job of pages fits many a batch, where one text's bound would fit none."""
    view = _view(colqwen2=COLQWEN2)
    page = ImageDoc("page.png", 1000, "0" * 64, data=b"x")
    fit = check_job(view, "colqwen2", _options("multivector"), 64, MB8, ["p"], images=[page])
    assert fit.batch_size == (MB8 - RESULT_OVERHEAD) // (878 * 128 * 4 + 4 + 1 + ID_OVERHEAD) == 18
    with pytest.raises(JobRefused, match="may take 16,777,"):  # queries (texts) keep the text limit
        check_job(view, "colqwen2", _options("multivector"), 64, MB8, ["q"])
    with pytest.raises(JobRefused, match="makes no dense vectors"):
        check_job(view, "colqwen2", _options("dense"), 64, MB8, ["p"], images=[page])
