"""The storage seams and their implementations: key rules, local atomic writes, ranged reads,
S3 over real HTTP (a moto server started by the session)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobs_core.errors import StorageKeyInvalidError, StorageNotFoundError
from jobs_import_export import (
    ExportSink,
    ImportSource,
    check_key,
    local_sink,
    local_source,
    memory_sink,
    memory_source,
    s3_sink,
    s3_source,
)


@pytest.mark.parametrize(
    "key",
    ["", "/etc/passwd", "a/../b", "..", "a//b", "a/", "./a", "a\\b", "a\nb", "a\x00b", "x" * 1025],
)
def test_unsafe_keys_are_refused(key: str) -> None:
    with pytest.raises(StorageKeyInvalidError) as caught:
        check_key(key)
    assert "\n" not in caught.value.message and "\x00" not in caught.value.message


@pytest.mark.parametrize("key", ["a", "exports/org-1/e 1/part-00000.csv", "é/ü", ".hidden/x"])
def test_safe_keys_pass(key: str) -> None:
    assert check_key(key) == key


def test_every_implementation_satisfies_both_protocols(tmp_path: Path) -> None:
    for store in (memory_sink(), local_sink(tmp_path), s3_sink("bucket")):
        assert isinstance(store, ImportSource)
        assert isinstance(store, ExportSink)


def test_a_local_put_is_atomic_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    sink = local_sink(tmp_path / "root")
    sink.put("a/b/part-00000.csv", b"first")
    sink.put("a/b/part-00000.csv", b"second")
    assert (tmp_path / "root/a/b/part-00000.csv").read_bytes() == b"second"
    with pytest.raises(TypeError):
        sink.put("a/b/part-00000.csv", "not bytes")  # type: ignore[arg-type]
    # The failed write left the previous object whole and no temporary file behind.
    assert (tmp_path / "root/a/b/part-00000.csv").read_bytes() == b"second"
    assert [p.name for p in (tmp_path / "root/a/b").iterdir()] == ["part-00000.csv"]


def test_a_local_key_never_reaches_outside_the_root(tmp_path: Path) -> None:
    sink = local_sink(tmp_path / "root")
    with pytest.raises(StorageKeyInvalidError):
        sink.put("../escaped", b"x")
    assert not (tmp_path / "escaped").exists()


def test_local_ranged_reads_and_sizes(tmp_path: Path) -> None:
    (tmp_path / "in.csv").write_bytes(b"0123456789")
    source = local_source(tmp_path)
    assert source.size("in.csv") == 10
    assert source.read_range("in.csv", 3, 4) == b"3456"
    assert source.read_range("in.csv", 8, 100) == b"89"
    with pytest.raises(StorageNotFoundError):
        source.size("missing.csv")
    with pytest.raises(StorageNotFoundError):
        source.read_range("missing.csv", 0, 1)


def test_memory_ranged_reads_and_sizes() -> None:
    source = memory_source({"k": b"abcdef"})
    assert (source.size("k"), source.read_range("k", 2, 3), source.read_range("k", 5, 9)) == (
        6,
        b"cde",
        b"f",
    )
    with pytest.raises(StorageNotFoundError):
        source.size("nope")


def test_s3_over_http_puts_sizes_and_ranged_gets(bucket: str, s3_options: dict[str, Any]) -> None:
    sink = s3_sink(bucket, **s3_options)
    data = bytes(range(256)) * 40
    sink.put("dir/obj.bin", data)
    source = s3_source(bucket, **s3_options)
    assert source.size("dir/obj.bin") == len(data)
    assert source.read_range("dir/obj.bin", 0, 5) == data[:5]
    assert source.read_range("dir/obj.bin", 1_000, 3_000) == data[1_000:4_000]
    assert source.read_range("dir/obj.bin", len(data) - 3, 100) == data[-3:]
    sink.put("dir/obj.bin", b"replaced")
    assert source.read_range("dir/obj.bin", 0, 100) == b"replaced"


def test_s3_missing_objects_are_not_found(bucket: str, s3_options: dict[str, Any]) -> None:
    source = s3_source(bucket, **s3_options)
    with pytest.raises(StorageNotFoundError):
        source.size("missing")
    with pytest.raises(StorageNotFoundError):
        source.read_range("missing", 0, 10)


def test_an_s3_client_is_made_at_first_use_not_when_declared() -> None:
    # Nothing listens on this port: building the sink must not dial it.
    sink = s3_sink("b", endpoint_url="http://127.0.0.1:9", region_name="us-east-1")
    assert sink.bucket == "b"
