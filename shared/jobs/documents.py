"""Documents for bulk jobs: reading them from files or folders, and the job id an input gets.

A file is read whole and checked before a job is made of it: every line or row parses, every id is a
string or an integer and appears once, every text is a string. The first problem is a ConfigError
that names the file and the line or row. A folder (``reindex`` only) is its text files, one
document a file.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.extras import imported

FOLDER_SUFFIXES = (".txt", ".md")  # the files of a folder that are documents (any case)


def read_input(path: Path) -> list[tuple[str, str]]:
    """(id, text) pairs of ``path``: a folder's text files (``read_folder``), else a file's documents
    (``read_documents``)."""
    if path.is_dir():
        return read_folder(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such file or folder")
    return read_documents(path)


def read_folder(path: Path) -> list[tuple[str, str]]:
    """Every .txt and .md file under ``path`` (sub-folders too, symlinked folders not followed), one
    document a file: its path relative to ``path`` (with /) for an id, its whole content for a text,
    in the order of those ids."""
    docs = []
    for file, doc_id in _folder_files(path):
        try:
            docs.append((doc_id, file.read_bytes().decode("utf-8")))
        except OSError as exc:
            raise ConfigError(f"{file}: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"{file}: not UTF-8 text (byte {exc.start}: {exc.reason}); every .txt and .md file "
                f"under {path} is a document"
            ) from None
    if not docs:
        raise ConfigError(f"{path} holds no documents: no {' or '.join(FOLDER_SUFFIXES)} file under it")
    return docs


def _folder_files(path: Path) -> list[tuple[Path, str]]:
    """(file, id) of the documents under ``path``, sorted by id."""
    found = []
    try:
        for top, _, names in os.walk(path, onerror=_raise):
            for name in names:
                file = Path(top) / name
                if file.suffix.lower() in FOLDER_SUFFIXES and file.is_file():
                    found.append((file, file.relative_to(path).as_posix()))
    except OSError as exc:
        raise ConfigError(f"{exc.filename or path}: {exc.strerror or exc}") from None
    return sorted(found, key=lambda pair: pair[1])


def _raise(exc: OSError) -> None:
    raise exc


def read_documents(path: Path) -> list[tuple[str, str]]:
    """(id, text) pairs of a JSONL file (``{"id", "text"}`` a line), a Parquet file (``id`` and ``text``
    columns) or plain text (one document a line, its line number for an id), in file order."""
    if not path.is_file():
        raise ConfigError(f"{path} is not a file")
    suffix = path.suffix.lower()
    try:
        if suffix in (".jsonl", ".ndjson"):
            docs = _read_jsonl(path)
        elif suffix == ".parquet":
            docs = _read_parquet(path)
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


def _read_jsonl(path: Path) -> list[tuple[str, str]]:
    docs = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{n}: not JSON ({exc.msg}, column {exc.colno})") from None
        if not isinstance(row, dict) or "id" not in row or "text" not in row:
            raise ConfigError(f'{path}:{n}: each line must be a JSON object with "id" and "text"')
        doc_id, text = row["id"], row["text"]
        if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)):
            raise ConfigError(f'{path}:{n}: "id" must be a string or an integer, not {_json_type(doc_id)}')
        if not isinstance(text, str):
            raise ConfigError(f'{path}:{n}: "text" must be a string, not {_json_type(text)}')
        docs.append((str(doc_id), text))
    return docs


def _read_parquet(path: Path) -> list[tuple[str, str]]:
    pa = imported("pyarrow", "reading a Parquet file")
    pq = imported("pyarrow.parquet", "reading a Parquet file")

    try:
        schema = pq.read_schema(path)
    except pa.ArrowException as exc:
        raise ConfigError(f"{path}: not a Parquet file ({exc})") from None
    missing = [c for c in ("id", "text") if c not in schema.names]
    if missing:
        raise ConfigError(f"{path}: no column {' or '.join(missing)} (columns: {', '.join(schema.names)})")
    id_type, text_type = schema.field("id").type, schema.field("text").type
    if not (pa.types.is_string(id_type) or pa.types.is_large_string(id_type) or pa.types.is_integer(id_type)):
        raise ConfigError(f"{path}: column id must hold strings or integers, not {id_type}")
    if not (pa.types.is_string(text_type) or pa.types.is_large_string(text_type)):
        raise ConfigError(f"{path}: column text must hold strings, not {text_type}")
    table = pq.read_table(path, columns=["id", "text"])
    ids, texts = table["id"].to_pylist(), table["text"].to_pylist()
    for column, values in (("id", ids), ("text", texts)):
        if None in values:
            raise ConfigError(f"{path}: row {values.index(None)} (counting from 0): {column} is null")
    return [(str(i), t) for i, t in zip(ids, texts)]


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
    path: Path, model: str, batch_size: int, form: str = "float32", output: str = "dense", chunking=None
) -> str:
    """The id of the job that embeds ``path`` with ``model`` into ``output`` vectors of ``form``: the same
    input, model, batch size, form, output and ``chunking`` (a JobChunking, or None) give the same id, so
    running a job again resumes it; any other is another job. A file is known by its size and time of
    change, a folder by its documents' names and contents (a file added, removed, renamed or edited:
    another job)."""
    if path.is_dir():
        source = f"folder:{_folder_digest(path)}"
    else:
        stat = path.stat()
        source = f"{stat.st_size}|{stat.st_mtime_ns}"
    cut = json.dumps(chunking.record() if chunking is not None else None, sort_keys=True)
    key = f"{path.resolve()}|{source}|{model}|{batch_size}|{form}|{output}|chunks:{cut}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _folder_digest(path: Path) -> str:
    """A digest of the documents of a folder: each one's id and the digest of its bytes, in id order."""
    digest = hashlib.sha256()
    for file, doc_id in _folder_files(path):
        digest.update(f"{doc_id}\0{hashlib.sha256(file.read_bytes()).hexdigest()}\0".encode())
    return digest.hexdigest()


def read_fields(path: Path) -> dict[str, dict] | None:
    """Each document's other fields than ``id`` and ``text`` (JSONL keys, Parquet columns), by id, for a
    sink's ``metadata``; None when the input has none (plain text, a folder, or only those two). The
    input was checked by ``read_input`` already."""
    if path.is_dir():
        return None
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        fields = {}
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                fields[str(row["id"])] = {k: v for k, v in row.items() if k not in ("id", "text")}
        return fields if any(fields.values()) else None
    if suffix == ".parquet":
        pq = imported("pyarrow.parquet", "reading a Parquet file")

        others = [c for c in pq.read_schema(path).names if c not in ("id", "text")]
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
