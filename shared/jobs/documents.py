"""Documents for bulk jobs: reading them from files or folders, and the job id an input gets.

A document is an id and its content: a text, or an image (shared/jobs/image_docs.py) for a two-tower
model; a job's documents are all texts or all images. A file is read whole and checked before a job is
made of it: every line or row parses, every id is a string or an integer and appears once, every text
is a string, every image's size and header are within the limits given. The first problem is a
ConfigError that names the file and the line or row. A folder (``reindex`` only) is its text files,
or where it holds none its image files, one document a file.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.extras import imported
from embedfleet.shared.images.decode import ImageError, ImageLimits
from embedfleet.shared.jobs.image_docs import IMAGE_SUFFIXES, ImageDoc, image_bytes, image_field, image_file

FOLDER_SUFFIXES = (".txt", ".md")  # the files of a folder that are documents (any case)
CONTENT = ("text", "image")  # a document's content field: one of the two
Document = tuple[str, str | ImageDoc]  # (id, its text or its image)


def images_of(docs: Sequence[Document]) -> list[ImageDoc] | None:
    """The documents' images when they are a job of images (readers and the gateway refuse a mix), else None."""
    if not docs or not isinstance(docs[0][1], ImageDoc):
        return None
    return [content for _, content in docs if isinstance(content, ImageDoc)]


def texts_of(docs: Sequence[Document]) -> list[str]:
    """The documents' texts (none for a job of images)."""
    return [content for _, content in docs if isinstance(content, str)]


def read_input(path: Path, limits: ImageLimits | None = None) -> list[Document]:
    """The documents of ``path``: a folder's files (``read_folder``), else a file's (``read_documents``);
    images checked against ``limits``."""
    if path.is_dir():
        return read_folder(path, limits)
    if not path.exists():
        raise ConfigError(f"{path}: no such file or folder")
    return read_documents(path, limits)


def read_folder(path: Path, limits: ImageLimits | None = None) -> list[Document]:
    """Every .txt and .md file under ``path`` (sub-folders too, symlinked folders not followed), one
    document a file: its path relative to ``path`` (with /) for an id, its whole content for a text,
    in the order of those ids. A folder with no text file is a job of its image files (.png, .jpg,
    .jpeg, .webp, .gif, any case), each checked against ``limits``."""
    files, suffixes = _folder_documents(path)
    if suffixes == IMAGE_SUFFIXES:
        return [(doc_id, _image(file, doc_id, limits)) for file, doc_id in files]
    docs: list[Document] = []
    for file, doc_id in files:
        try:
            docs.append((doc_id, file.read_bytes().decode("utf-8")))
        except OSError as exc:
            raise ConfigError(f"{file}: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"{file}: not UTF-8 text (byte {exc.start}: {exc.reason}); every .txt and .md file "
                f"under {path} is a document"
            ) from None
    return docs


def _image(file: Path, doc_id: str, limits: ImageLimits | None) -> ImageDoc:
    try:
        return image_file(file, doc_id, limits or ImageLimits())
    except ImageError as exc:
        raise ConfigError(f"{file}: {exc}") from None


def _folder_documents(path: Path) -> tuple[list[tuple[Path, str]], tuple[str, ...]]:
    """(file, id) of the documents under ``path``, sorted by id, and the suffixes they were chosen by:
    its text files, else (none) its image files; ConfigError when it holds neither."""
    texts, images = _folder_files(path, FOLDER_SUFFIXES + IMAGE_SUFFIXES)
    if texts:
        return texts, FOLDER_SUFFIXES
    if images:
        return images, IMAGE_SUFFIXES
    raise ConfigError(
        f"{path} holds no documents: no {' or '.join(FOLDER_SUFFIXES)} file under it (nor an image: "
        f"{', '.join(IMAGE_SUFFIXES)})"
    )


def _folder_files(path: Path, suffixes: tuple[str, ...]) -> tuple[list[tuple[Path, str]], list[tuple[Path, str]]]:
    """(file, id) of the text files and of the image files under ``path`` (of ``suffixes``), each sorted by id."""
    texts: list[tuple[Path, str]] = []
    images: list[tuple[Path, str]] = []
    try:
        for top, _, names in os.walk(path, onerror=_raise):
            for name in names:
                file = Path(top) / name
                suffix = file.suffix.lower()
                if suffix in suffixes and file.is_file():
                    found = texts if suffix in FOLDER_SUFFIXES else images
                    found.append((file, file.relative_to(path).as_posix()))
    except OSError as exc:
        raise ConfigError(f"{exc.filename or path}: {exc.strerror or exc}") from None
    return sorted(texts, key=lambda pair: pair[1]), sorted(images, key=lambda pair: pair[1])


def _raise(exc: OSError) -> None:
    raise exc


def read_documents(path: Path, limits: ImageLimits | None = None, root: Path | None = None) -> list[Document]:
    """The documents of a JSONL file (``{"id", "text"}`` or ``{"id", "image"}`` a line), a Parquet file
    (``id`` and ``text`` or ``image`` columns) or plain text (one document a line, its line number for
    an id), in file order. An image is a data URI or a file's path (relative to ``path``'s folder, inside
    ``root`` when given; a Parquet column may hold the files' bytes), checked against ``limits``."""
    if not path.is_file():
        raise ConfigError(f"{path} is not a file")
    suffix = path.suffix.lower()
    images = _ImageReader(path.parent, limits or ImageLimits(), root)
    try:
        if suffix in (".jsonl", ".ndjson"):
            docs = _read_jsonl(path, images)
        elif suffix == ".parquet":
            docs = _read_parquet(path, images)
        else:
            docs = [
                (str(n), line) for n, line in enumerate(path.read_text(encoding="utf-8").splitlines()) if line.strip()
            ]
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    if not docs:
        raise ConfigError(f"{path} holds no documents")
    seen: set[str] = set()
    for doc_id, _ in docs:
        if doc_id in seen:
            raise ConfigError(f"{path}: document id {doc_id!r} appears more than once: ids must be unique")
        seen.add(doc_id)
    return docs


class _ImageReader:
    """A file's image documents: each read (a path from ``base``, inside ``root`` when given) and checked."""

    def __init__(self, base: Path, limits: ImageLimits, root: Path | None) -> None:
        self._base, self._limits, self._root = base, limits, root

    def __call__(self, value: str | bytes, where: str) -> ImageDoc:
        """The image ``value`` gives (a data URI or a path, or a file's bytes); ConfigError naming ``where``."""
        try:
            if isinstance(value, bytes):
                return image_bytes(value, where, self._limits)
            return image_field(value, self._base, self._limits, self._root)
        except ImageError as exc:
            raise ConfigError(f"{where}: {exc}") from None


def _read_jsonl(path: Path, images: _ImageReader) -> list[Document]:
    docs: list[Document] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{n}: not JSON ({exc.msg}, column {exc.colno})") from None
        if not isinstance(row, dict) or "id" not in row or sum(k in row for k in CONTENT) != 1:
            raise ConfigError(f'{path}:{n}: each line must be a JSON object with "id" and "text" (or "image")')
        doc_id = row["id"]
        if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)):
            raise ConfigError(f'{path}:{n}: "id" must be a string or an integer, not {_json_type(doc_id)}')
        kind = "text" if "text" in row else "image"
        value = row[kind]
        if not isinstance(value, str):
            raise ConfigError(f'{path}:{n}: "{kind}" must be a string, not {_json_type(value)}')
        _same_kind(docs, kind, f"{path}:{n}")
        where = f"{path}:{n}: document {str(doc_id)[:200]!r}"
        docs.append((str(doc_id), value if kind == "text" else images(value, where)))
    return docs


def _same_kind(docs: list[Document], kind: str, where: str) -> None:
    """ConfigError naming ``where`` when a document of ``kind`` would join documents of the other kind."""
    if docs and isinstance(docs[0][1], ImageDoc) != (kind == "image"):
        first = "an image" if isinstance(docs[0][1], ImageDoc) else "a text"
        raise ConfigError(
            f"{where}: a {kind} among documents that begin with {first}: a job's documents are all texts or all "
            "images (submit them as two jobs)"
        )


def _read_parquet(path: Path, images: _ImageReader) -> list[Document]:
    pa = imported("pyarrow", "reading a Parquet file")
    pq = imported("pyarrow.parquet", "reading a Parquet file")

    try:
        schema = pq.read_schema(path)
    except pa.ArrowException as exc:
        raise ConfigError(f"{path}: not a Parquet file ({exc})") from None
    given = [c for c in CONTENT if c in schema.names]
    missing = [c for c in ("id",) if c not in schema.names] + ([] if given else ["text"])
    if missing:
        raise ConfigError(f"{path}: no column {' or '.join(missing)} (columns: {', '.join(schema.names)})")
    if len(given) > 1:
        raise ConfigError(f"{path}: columns text and image: a document is a text or an image, not both")
    kind = given[0]
    id_type, value_type = schema.field("id").type, schema.field(kind).type
    strings = pa.types.is_string(value_type) or pa.types.is_large_string(value_type)
    binary = pa.types.is_binary(value_type) or pa.types.is_large_binary(value_type)
    if not (pa.types.is_string(id_type) or pa.types.is_large_string(id_type) or pa.types.is_integer(id_type)):
        raise ConfigError(f"{path}: column id must hold strings or integers, not {id_type}")
    if not (strings or (kind == "image" and binary)):
        held = "strings" if kind == "text" else "binary (the files' bytes) or strings (their paths)"
        raise ConfigError(f"{path}: column {kind} must hold {held}, not {value_type}")
    table = pq.read_table(path, columns=["id", kind])
    ids, values = table["id"].to_pylist(), table[kind].to_pylist()
    for column, held_values in (("id", ids), (kind, values)):
        if None in held_values:
            raise ConfigError(f"{path}: row {held_values.index(None)} (counting from 0): {column} is null")
    if kind == "text":
        return [(str(i), t) for i, t in zip(ids, values)]
    return [(str(i), images(v, f"{path}: row {r} (counting from 0)")) for r, (i, v) in enumerate(zip(ids, values))]


def _json_type(value: object) -> str:
    return {
        type(None): "null",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "an object",
    }.get(type(value), type(value).__name__)


def job_id_for(
    path: Path,
    model: str,
    batch_size: int,
    form: str = "float32",
    output: str = "dense",
    chunking=None,
    batch_bytes: int = 0,
) -> str:
    """The id of the job that embeds ``path`` with ``model`` into ``output`` vectors of ``form``: the same
    input, model, batch size (and ``batch_bytes``, a job of images' bytes a batch: shared/jobs/batches.py),
    form, output and ``chunking`` (a JobChunking, or None) give the same id, so running a job again
    resumes it; any other is another job. A file is known by its size and time of change, a folder by
    its documents' names and contents (a file added, removed, renamed or edited: another job)."""
    if path.is_dir():
        source = f"folder:{_folder_digest(path)}"
    else:
        stat = path.stat()
        source = f"{stat.st_size}|{stat.st_mtime_ns}"
    cut = json.dumps(chunking.record() if chunking is not None else None, sort_keys=True)
    key = f"{path.resolve()}|{source}|{model}|{batch_size}|{form}|{output}|chunks:{cut}"
    key += f"|bytes:{batch_bytes}" if batch_bytes else ""  # a text job's id as it always was
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _folder_digest(path: Path) -> str:
    """A digest of the documents of a folder: each one's id and the digest of its bytes, in id order."""
    digest = hashlib.sha256()
    for file, doc_id in _folder_documents(path)[0]:
        digest.update(f"{doc_id}\0{hashlib.sha256(file.read_bytes()).hexdigest()}\0".encode())
    return digest.hexdigest()


def read_fields(path: Path) -> dict[str, dict] | None:
    """Each document's other fields than ``id`` and its ``text`` or ``image`` (JSONL keys, Parquet
    columns), by id, for a sink's ``metadata``; None when the input has none (plain text, a folder, or
    only those two). The input was checked by ``read_input`` already."""
    if path.is_dir():
        return None
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        fields = {}
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                fields[str(row["id"])] = {k: v for k, v in row.items() if k != "id" and k not in CONTENT}
        return fields if any(fields.values()) else None
    if suffix == ".parquet":
        pq = imported("pyarrow.parquet", "reading a Parquet file")

        others = [c for c in pq.read_schema(path).names if c != "id" and c not in CONTENT]
        if not others:
            return None
        table = pq.read_table(path, columns=["id", *others])
        rows = table.select(others).to_pylist()  # JSON-able values: Parquet dates and decimals become strings below
        return {str(i): {k: _plain(v) for k, v in row.items()} for i, row in zip(table["id"].to_pylist(), rows)}
    return None


def _plain(value: object) -> object:
    """A Parquet value as JSON holds it (dates, decimals and bytes as text)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value.hex() if isinstance(value, bytes) else str(value)
