"""The file a path job names (POST /v1/jobs with ``path``), read from the gateway's --jobs-dir off the
event loop (a file of tens of MB takes seconds to read and check: other requests go on meanwhile),
up to --jobs-max-file-bytes; the images it names (a job of images) are read from inside --jobs-dir
only, each within --max-image-bytes and --max-image-pixels by its header. Messages name the file as the
client gave it, never the server's folders."""

from __future__ import annotations

import asyncio
import errno
import os
from dataclasses import dataclass
from pathlib import Path

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.images.decode import ImageLimits
from embedfleet.shared.jobs.documents import Document, read_documents


@dataclass(frozen=True, slots=True)
class JobFile:
    path: Path  # on the server: for the job id reindex would give the same file
    given: str  # as the client named it: in messages and the job's state
    docs: list[Document]


def _refused(message: str) -> ApiError:
    return ApiError(ErrorCode.INVALID_REQUEST, message, "path")


def _located(jobs_dir: Path, given: str) -> Path:
    """The file ``given`` names inside ``jobs_dir``; 400 for a name no file can have or one outside."""
    if "\0" in given:
        raise _refused("'path' must not hold a NUL character")
    try:
        path = (jobs_dir / given).resolve()
    except (OSError, RuntimeError) as exc:  # too long a name, a symlink loop
        raise _refused(
            f"'path' {given[:200]!r} names no usable file: {getattr(exc, 'strerror', None) or exc}"
        ) from None
    if not path.is_relative_to(jobs_dir):
        raise _refused("'path' must name a file inside the jobs folder")
    return path


def _read(path: Path, given: str, max_bytes: int, limits: ImageLimits, root: Path) -> list[Document]:
    """Every document of the file, each checked (ids unique, texts strings, images within ``limits``
    and their files inside ``root``); runs in a thread."""
    try:
        size = os.stat(path).st_size
    except OSError as exc:
        why = "no such file" if exc.errno == errno.ENOENT else exc.strerror or str(exc)
        raise _refused(f"'path' {given[:200]!r}: {why}") from None
    if size > max_bytes:
        raise _refused(
            f"'path' {given[:200]!r} is {size} bytes, over this gateway's limit of {max_bytes} "
            "(--jobs-max-file-bytes): split it, or run it with `embedfleet reindex`"
        )
    try:
        return read_documents(path, limits, root.resolve())
    except ConfigError as exc:
        raise _refused(str(exc).replace(str(path), given[:200])) from None


async def read_job_file(jobs_dir: Path, given: str, max_bytes: int, limits: ImageLimits | None = None) -> JobFile:
    """The documents of the file ``given`` names in ``jobs_dir``; an image's path in it is taken from the
    file's folder and must name a file inside ``jobs_dir`` too."""
    path = _located(jobs_dir, given)
    docs = await asyncio.to_thread(_read, path, given, max_bytes, limits or ImageLimits(), jobs_dir)
    return JobFile(path, given, docs)
