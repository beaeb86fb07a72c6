"""``encode_records``: the public encoder other packages' exports write their parts with; it
writes what ``export_rows`` writes and ``import_rows`` reads back."""

from __future__ import annotations

from decimal import Decimal

import pytest

from jobs_core.errors import ExportRowInvalidError
from jobs_import_export import encode_records


def test_csv_parts_carry_the_header_once_the_guard_and_none_apart_from_empty_text() -> None:
    rows = [{"id": 1, "name": "=cmd()", "total": Decimal("-2.50")}, {"id": 2, "name": ""}]
    assert encode_records(["id", "name", "total"], rows, format="csv", header=True) == (
        b'id,name,total\n1,\'=cmd(),-2.50\n2,"",\n'
    )
    assert encode_records(["id"], rows, format="csv") == b"1\n2\n"


def test_ndjson_lines_keep_the_columns_order_and_nested_values() -> None:
    data = encode_records(["b", "a"], [{"a": [1, {"x": None}], "b": "é"}], format="ndjson")
    assert data == '{"b":"é","a":[1,{"x":null}]}\n'.encode()


def test_a_value_with_no_form_names_the_record_and_column_never_the_value() -> None:
    with pytest.raises(ExportRowInvalidError) as caught:
        encode_records(["a", "b"], [{"a": 1}, {"a": 2, "b": b"secret"}], format="csv")
    assert caught.value.meta == {"row": 1, "column": "b"}
    assert "secret" not in str(caught.value)


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="format"):
        encode_records(["a"], [], format="xml")  # type: ignore[arg-type]
