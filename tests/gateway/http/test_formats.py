"""Binary answers (services/gateway/http/formats.py): the Accept header negotiated, the rows' bytes and msgpack map
for each form, and rows of another form than asked refused."""

import msgpack
import numpy as np
import pytest

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.http.formats import binary_response, negotiate, rows_form
from embedfleet.shared.vectors.forms import FORMS
from embedfleet.shared.vectors.quantize import quantize


def test_content_negotiation():
    assert negotiate(None) == "json"
    assert negotiate("application/json") == "json"
    assert negotiate("application/octet-stream") == "octet"
    assert negotiate("application/x-msgpack;q=0.9, */*;q=0.1") == "msgpack"
    assert negotiate("application/x-msgpack;q=0.9, */*") == "json"  # */* weighs 1: JSON, the default, first
    assert negotiate("*/*, application/vnd.msgpack") == "msgpack"  # a tie: the more specific range
    assert negotiate("application/json, application/octet-stream") == "json"  # a tie: the range given first
    assert negotiate("application/octet-stream;q=0, */*") == "json"  # q=0: never that one


def test_binary_bodies():
    v = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    octet = binary_response("octet", "m", v, 9, {"x-a": "1"})
    assert octet.headers["x-embedding-rows"] == "3" and octet.headers["x-embedding-dim"] == "4"
    np.testing.assert_array_equal(np.frombuffer(octet.body, "<f4").reshape(3, 4), v)
    packed = msgpack.unpackb(binary_response("msgpack", "m", v, 9, {}).body)
    assert (packed["rows"], packed["dim"], packed["dtype"], packed["usage"]["prompt_tokens"]) == (3, 4, "<f4", 9)
    np.testing.assert_array_equal(np.frombuffer(packed["data"], "<f4").reshape(3, 4), v)


@pytest.mark.parametrize("form", list(FORMS))
def test_binary_bodies_carry_each_forms_dtype_and_shape(form):
    floats = np.random.default_rng(3).standard_normal((3, 20)).astype(np.float32)
    stored = quantize(floats, form)  # [3, 20] or, bit-packed, [3, 3]
    width, element = stored.shape[1], FORMS[form].dtype
    octet = binary_response("octet", "m", stored, 5, {}, form, 20)
    assert (octet.headers["x-embedding-rows"], octet.headers["x-embedding-dim"]) == ("3", "20")
    assert octet.headers["x-embedding-row-bytes"] == str(width * element.itemsize)
    assert octet.headers["x-embedding-dtype"] == {"float32": "float32-le", "float16": "float16-le"}.get(form, form)
    assert np.array_equal(np.frombuffer(octet.body, element).reshape(3, width), stored)
    packed = msgpack.unpackb(binary_response("msgpack", "m", stored, 5, {}, form, 20).body)
    assert (packed["rows"], packed["dim"], packed["shape"], packed["embedding_type"]) == (3, 20, [3, width], form)
    assert np.dtype(packed["dtype"]) == element
    assert np.array_equal(np.frombuffer(packed["data"], packed["dtype"]).reshape(packed["shape"]), stored)


def test_rows_of_another_form_than_asked_are_an_error():
    assert rows_form("binary", "binary") == "binary"
    with pytest.raises(ApiError) as err:
        rows_form("int8", "float32")
    assert err.value.status == 500 and "float32 rows to a request for int8" in err.value.message
