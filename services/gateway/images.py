"""Images a request sends, as data URIs: each decoded from base64 and its header checked (format, bytes,
declared pixels) before anything is published, so a refused image costs the fleet nothing. The
tokenizer fleet decodes the pixels (shared/images/)."""

from __future__ import annotations

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.images.decode import ImageError, ImageLimits, check_header, from_data_uri


def image_files(uris: list[str], where: list[str], limits: ImageLimits) -> list[bytes]:
    """The files of ``uris`` (data URIs), checked against ``limits``; ``where`` names each in the
    request ("input[2]"), for the 400 that refuses it."""
    files = []
    for uri, at in zip(uris, where, strict=True):
        try:
            data = from_data_uri(uri, limits)
            check_header(data, limits)
        except ImageError as exc:
            raise ApiError(ErrorCode.INVALID_REQUEST, f"'{at}': {exc}", at.split("[")[0]) from None
        files.append(data)
    return files
