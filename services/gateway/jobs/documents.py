"""An inline job's documents (POST /v1/jobs with 'documents'): texts, or images (a two-tower model's)
given as data URIs, all one or the other; ids unique; each image's size and header within the gateway's
--max-image-bytes and --max-image-pixels. A bad one is a 400 naming it, before anything is published.
An inline image is never a path: the gateway reads no file of its own for it (a path job reads its
images from --jobs-dir: files.py). ``check_image_job``: what a job of images cannot ask (texts to
store, chunks, other vectors than dense), whichever way its documents came."""

from __future__ import annotations

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.jobs.body import DocumentBody
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.images.decode import ImageError, ImageLimits, from_data_uri
from embedfleet.shared.jobs.fit import JobRefused, check_image_options
from embedfleet.shared.jobs.image_docs import ImageDoc, image_bytes
from embedfleet.shared.protocol import EmbedOptions
from embedfleet.shared.text_chunks import JobChunking


def inline_documents(raw: list[DocumentBody]) -> tuple[list[tuple[str, str]], dict[str, dict] | None]:
    """The documents of a job of texts, and each one's other fields (None: no document has any)."""
    ids = _unique_ids(raw)
    return [(doc_id, _text(i, d)) for i, (doc_id, d) in enumerate(zip(ids, raw))], _fields(ids, raw)


def inline_images(
    raw: list[DocumentBody], limits: ImageLimits
) -> tuple[list[tuple[str, ImageDoc]], dict[str, dict] | None]:
    """The documents of a job of images, each checked against ``limits``, and their other fields."""
    ids = _unique_ids(raw)
    return [(doc_id, _image(i, d, limits)) for i, (doc_id, d) in enumerate(zip(ids, raw))], _fields(ids, raw)


def _unique_ids(raw: list[DocumentBody]) -> list[str]:
    ids = [str(d.id) for d in raw]
    if len(set(ids)) < len(ids):  # the first repeat named only then: a set is the cheap check of thousands
        seen: set[str] = set()
        for i, doc_id in enumerate(ids):
            if doc_id in seen:
                raise ApiError(
                    ErrorCode.INVALID_REQUEST,
                    f"document ids must be unique: 'documents[{i}]' repeats id {doc_id!r}",
                    "documents",
                )
            seen.add(doc_id)
    return ids


def _fields(ids: list[str], raw: list[DocumentBody]) -> dict[str, dict] | None:
    # __pydantic_extra__: model_extra's dict without its property call, a document at a time
    fields = {doc_id: extra for doc_id, d in zip(ids, raw) if (extra := d.__pydantic_extra__)}
    return fields or None


def _text(i: int, doc: DocumentBody) -> str:
    _one_kind(i, doc, images=False)
    return doc.text


def _image(i: int, doc: DocumentBody, limits: ImageLimits) -> ImageDoc:
    _one_kind(i, doc, images=True)
    try:
        return image_bytes(from_data_uri(doc.image, limits), f"documents[{i}]", limits)
    except ImageError as exc:
        raise ApiError(
            ErrorCode.INVALID_REQUEST,
            f"'documents[{i}].image' (document {str(doc.id)[:200]!r}): {exc}",
            "documents.image",
        ) from None


def _one_kind(i: int, doc: DocumentBody, images: bool) -> None:
    """400 for document ``i`` with both a text and an image or neither, or of the other kind than the job's."""
    if (doc.text is None) == (doc.image is None):
        both = doc.text is not None
        raise ApiError(
            ErrorCode.INVALID_REQUEST,
            f"'documents[{i}]' has both 'text' and 'image': give one of the two"
            if both
            else f"'documents[{i}].text' is required (or 'image', a data URI, for a two-tower model)",
            "documents" if both else "documents.text",
        )
    if (doc.image is not None) != images:
        raise ApiError(
            ErrorCode.INVALID_REQUEST,
            f"'documents[{i}]' is {'an image' if images is False else 'a text'} and 'documents[0]' is not: a "
            "job's documents are all texts or all images (submit them as two jobs)",
            "documents",
        )


def check_image_job(options: EmbedOptions, chunking: JobChunking | None, with_text: bool) -> None:
    """400 for what a job of images cannot do: texts to store, chunks, vectors other than dense."""
    if with_text:
        raise ApiError(
            ErrorCode.INVALID_REQUEST,
            "'with_text' stores texts; these documents are images (a row keeps its id and its other fields)",
            "with_text",
        )
    try:
        check_image_options(options, chunking)
    except JobRefused as exc:
        raise ApiError(ErrorCode.INVALID_REQUEST, str(exc), exc.field) from None
