"""The one declaration of the vector forms: the wire codes stay the protocol's, every API name leads to a
declared form, and what a form says of its rows is what quantize makes."""

import numpy as np
import pytest

from embedfleet.shared.protocol import EmbedOptions, ProtocolError, row_bytes
from embedfleet.shared.vectors.forms import (
    COHERE_TYPES,
    EMBEDDING_TYPES,
    FORMS,
    OCTET_DTYPES,
    WIRE_FORMS,
    form_named,
    vector_form,
)
from embedfleet.shared.vectors.quantize import quantize


def test_the_wire_codes_and_element_types_are_the_protocols():
    # workers and gateways of one fleet read each other's codes: these never change
    assert {name: (form.wire, form.dtype.str, form.bits) for name, form in FORMS.items()} == {
        "float32": ("f4", "<f4", 32),
        "float16": ("f2", "<f2", 16),
        "int8": ("i1", "|i1", 8),
        "uint8": ("u1", "|u1", 8),
        "binary": ("b1", "|i1", 1),
        "ubinary": ("ub1", "|u1", 1),
    }
    assert {code: form.name for code, form in WIRE_FORMS.items()} == {
        "f4": "float32",
        "f2": "float16",
        "i1": "int8",
        "u1": "uint8",
        "b1": "binary",
        "ub1": "ubinary",
    }


@pytest.mark.parametrize("name", list(FORMS))
def test_a_form_describes_the_rows_quantize_makes(name):
    form = FORMS[name]
    rows = quantize(np.random.default_rng(0).standard_normal((3, 385)), name)
    assert rows.dtype == form.dtype and rows.shape == (3, form.width(385))
    assert rows[0].nbytes == form.row_bytes(385) == row_bytes(form.wire, 385)
    assert EmbedOptions(dtype=form.wire).form == name


def test_every_api_name_leads_to_a_declared_form():
    assert {"float": FORMS["float32"], **FORMS} == EMBEDDING_TYPES
    assert {t: f.name for t, f in COHERE_TYPES.items()} == {
        "float": "float32",
        "int8": "int8",
        "uint8": "uint8",
        "binary": "binary",
        "ubinary": "ubinary",
        "base64": "float32",
    }
    assert set(OCTET_DTYPES) == set(FORMS)
    assert form_named("float") is FORMS["float32"] and form_named("ubinary") is FORMS["ubinary"]


def test_unknown_names_are_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="unknown embedding type 'INT8' \\(known: float, float32, float16, int8"):
        form_named("INT8")
    with pytest.raises(ValueError, match="unknown vector form 'float' \\(known: float32, float16"):
        vector_form("float")  # an API's name, not a form's
    with pytest.raises(ProtocolError, match=r"options\.dtype must be one of"):
        EmbedOptions(dtype="float32")  # a form's name is not its wire code
