"""Issue 19's S3 proof, over real HTTP to a moto server: export 100,000 rows in parts, download
the parts, ``cat`` them into one CSV equal to the source, and import that object back."""

from __future__ import annotations

import csv
import io
from typing import Any

import boto3
from pydantic import BaseModel

from ie_helpers import ListReader, run_one
from jobs_core import JobRegistry, JobState
from jobs_core.drivers.memory import MemoryDriver
from jobs_import_export import ErrorSink, export_rows, import_rows, s3_sink, s3_source

TOTAL = 100_000


class Export(BaseModel):
    org_id: str
    export_id: str


class Order(BaseModel):
    id: int
    customer: str
    note: str | None
    total: str


def _orders() -> list[dict[str, Any]]:
    return [
        {
            "id": i,
            "customer": f"customer {i % 977}",
            "note": None if i % 4 else f'line one\nline "two", {i}',
            "total": f"{i % 1000}.{i % 100:02d}",
        }
        for i in range(TOTAL)
    ]


async def test_export_100k_rows_to_s3_cat_the_parts_and_import_them_back(
    driver: MemoryDriver, registry: JobRegistry, bucket: str, s3_options: dict[str, Any]
) -> None:
    orders = _orders()
    export = export_rows(
        name="orders.export",
        input=Export,
        tenant=lambda i: i.org_id,
        prefix=lambda i: f"exports/{i.org_id}/{i.export_id}",
        source=lambda ctx, i: ListReader(orders),
        columns=["id", "customer", "note", "total"],
        sink=lambda: s3_sink(bucket, **s3_options),
        batch=7_000,
        registry=registry,
    )
    info = await run_one(driver, export, Export(org_id="acme", export_id="e1"), registry)
    assert info.state == JobState.DONE, info.last_error
    assert info.result["rows"] == TOTAL and info.result["parts"] == 15

    client = boto3.session.Session().client("s3", **s3_options)
    listed = client.list_objects_v2(Bucket=bucket, Prefix="exports/acme/e1/")
    keys = sorted(entry["Key"] for entry in listed["Contents"])
    parts = [key for key in keys if "/part-" in key]
    assert parts == [f"exports/acme/e1/part-{i:05d}.csv" for i in range(15)]
    assert set(keys) - set(parts) == {"exports/acme/e1/manifest.json"}
    whole = b"".join(client.get_object(Bucket=bucket, Key=key)["Body"].read() for key in parts)
    parsed = list(csv.reader(io.StringIO(whole.decode(), newline="")))
    assert parsed[0] == ["id", "customer", "note", "total"]
    assert parsed[1:] == [
        [str(o["id"]), o["customer"], o["note"] or "", o["total"]] for o in orders
    ]

    client.put_object(Bucket=bucket, Key="imports/acme/orders.csv", Body=whole)
    imported: list[Order] = []

    class Import(BaseModel):
        org_id: str
        key: str

    back = import_rows(
        name="orders.import",
        input=Import,
        tenant=lambda i: i.org_id,
        source=lambda: s3_source(bucket, **s3_options),
        key=lambda i: i.key,
        columns=["id", "customer", "note", "total"],
        schema=Order,
        handle=lambda rows, i: imported.extend(rows),
        errors=ErrorSink(
            sink=lambda: s3_sink(bucket, **s3_options),
            prefix=lambda i: f"imports/{i.org_id}/errors",
        ),
        page_bytes=512 * 1024,
        max_record_bytes=4 * 1024,
        registry=registry,
    )
    result = await run_one(
        driver, back, Import(org_id="acme", key="imports/acme/orders.csv"), registry
    )
    assert result.state == JobState.DONE, result.last_error
    assert result.result["rows"] == TOTAL and result.result["rejected"] == 0
    assert result.result["parts"] == len([s for s in result.steps if s.name.startswith("page:")])
    assert result.result["parts"] >= len(whole) // (512 * 1024)  # ranged GETs, page by page
    assert [o.model_dump() for o in imported] == orders
