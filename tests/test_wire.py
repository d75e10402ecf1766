"""Edge conversion: raw bodies are decoded strictly."""

from __future__ import annotations

import pytest

from mlxrt.api.wire import parse_json_object
from mlxrt.errors import InvalidRequest


@pytest.mark.parametrize("raw", [b'{"temperature": NaN}', b'{"x": Infinity}', b'{"x": -Infinity}',
                                 b"\xff\xfe", b""])
def test_not_json_is_refused(raw):
    with pytest.raises(InvalidRequest, match="invalid JSON body"):
        parse_json_object(raw)


def test_object_required():
    with pytest.raises(InvalidRequest, match="Request should be a JSON dictionary"):
        parse_json_object(b"[]")
    assert parse_json_object(b'{"a": 1.5}') == {"a": 1.5}
