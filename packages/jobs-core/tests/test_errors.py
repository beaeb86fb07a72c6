"""The error registry: one class per code, fixes, classification and the README table."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from jobs_core import errors
from jobs_core.errors import (
    ERROR_CLASSES,
    ERROR_CODES,
    JobDeclarationInvalidError,
    JobsError,
    KeyBusyError,
    StepTimeoutError,
    classification_of,
    classify,
    error_class,
    error_code,
    markdown_table,
)

README = Path(__file__).resolve().parents[1] / "README.md"
SRC = Path(errors.__file__).resolve().parents[1]


def _all_subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_all_subclasses(sub))
    return found


@pytest.fixture
def restore_classification():
    saved = dict(errors._CLASSIFIED)
    yield
    errors._CLASSIFIED.clear()
    errors._CLASSIFIED.update(saved)


def test_every_code_has_exactly_one_class_with_that_code_and_the_registry_fix() -> None:
    library_classes = [c for c in _all_subclasses(JobsError) if c.__module__ == errors.__name__]
    codes = [entry.code for entry in ERROR_CODES]
    assert len(codes) == len(set(codes)), "a code is listed twice in ERROR_CODES"
    for entry in ERROR_CODES:
        matching = [c for c in library_classes if c.code == entry.code]
        assert len(matching) == 1, f"{entry.code}: {len(matching)} classes"
        cls = matching[0]
        assert cls.__name__ == entry.class_name
        assert cls.fix == entry.fix
        assert cls.fix.strip(), f"{entry.code} has an empty fix"
        assert entry.summary.strip()
        assert re.fullmatch(r"X_[A-Z_]+", entry.code)
        assert error_class(entry.code) is cls
        assert entry.classification in ("terminal", "retry_after", "retry")
    # No stray class carries a code the registry does not list.
    assert {c.code for c in library_classes} == set(codes)
    assert set(ERROR_CLASSES) == set(codes)


def test_error_carries_code_fix_message_and_meta() -> None:
    exc = JobDeclarationInvalidError("job 'x' is declared wrong", job="x", problems=["a", "b"])
    assert exc.code == "X_JOB_DECLARATION_INVALID"
    assert exc.meta == {"job": "x", "problems": ["a", "b"]}
    assert exc.message == "job 'x' is declared wrong"
    assert str(exc) == "X_JOB_DECLARATION_INVALID: job 'x' is declared wrong"
    assert exc.fix.startswith("Correct every field")
    assert error_code(exc) == "X_JOB_DECLARATION_INVALID"
    assert isinstance(exc, JobsError)
    assert isinstance(exc, Exception)
    json.dumps(exc.meta)


def test_message_defaults_to_the_registry_summary() -> None:
    exc = KeyBusyError()
    assert exc.message.startswith("A job with Concurrency(when_busy='fail')")
    assert exc.meta == {}
    assert str(exc).startswith("X_JOB_KEY_BUSY: ")


def test_meta_is_a_copy_per_instance() -> None:
    a = StepTimeoutError("a", step="s1")
    b = StepTimeoutError("b")
    a.meta["extra"] = 1
    assert b.meta == {}


def test_error_code_of_foreign_exceptions() -> None:
    class AppError(Exception):
        code = "X_APP_THING"

    class OddCode(Exception):
        code = 42

    assert error_code(AppError()) == "X_APP_THING"
    assert error_code(OddCode()) is None
    assert error_code(ValueError("x")) is None


def test_error_class_unknown_code_raises_keyerror() -> None:
    with pytest.raises(KeyError):
        error_class("X_NOT_A_CODE")


def test_registry_classifications_are_used() -> None:
    assert classification_of(KeyBusyError()) == "terminal"
    assert classification_of(StepTimeoutError()) == "retry"
    assert classification_of(RuntimeError("boom")) == "retry"


def test_classification_of_validation_and_permission_errors() -> None:
    class M(BaseModel):
        n: int

    with pytest.raises(ValidationError) as caught:
        M.model_validate({"n": "not a number"})
    assert classification_of(caught.value) == "terminal"
    assert classification_of(PermissionError("no")) == "terminal"
    # A subclass of PermissionError is still a permission failure.
    assert classification_of(type("Denied", (PermissionError,), {})()) == "terminal"


def test_classify_registers_app_codes(restore_classification) -> None:
    class PaymentDeclined(Exception):
        code = "X_APP_PAYMENT_DECLINED"

    class RateLimited(Exception):
        code = "X_APP_RATE_LIMITED"

        def __init__(self) -> None:
            super().__init__("slow down")
            self.meta = {"retry_after_seconds": 30}

    assert classification_of(PaymentDeclined()) == "retry"
    classify({"X_APP_PAYMENT_DECLINED": "terminal", "X_APP_RATE_LIMITED": "retry_after"})
    assert classification_of(PaymentDeclined()) == "terminal"
    assert classification_of(RateLimited()) == "retry_after"
    # A later registration replaces an earlier one.
    classify({"X_APP_PAYMENT_DECLINED": "retry"})
    assert classification_of(PaymentDeclined()) == "retry"


def test_classify_refuses_a_bad_classification_and_registers_nothing(
    restore_classification,
) -> None:
    class AppError(Exception):
        code = "X_APP_BAD"

    with pytest.raises(ValueError, match="X_APP_BAD") as caught:
        classify({"X_APP_BAD": "fatal"})  # type: ignore[dict-item]
    assert "'terminal', 'retry_after' or 'retry'" in str(caught.value)
    assert classification_of(AppError()) == "retry"


def test_markdown_table_has_one_row_per_code() -> None:
    table = markdown_table()
    lines = table.splitlines()
    assert lines[0] == "| Code | Class | Queue treats it as | Meaning | Fix |"
    assert len(lines) == 2 + len(ERROR_CODES)
    for entry, line in zip(ERROR_CODES, lines[2:], strict=True):
        assert line.startswith(
            f"| `{entry.code}` | `{entry.class_name}` | {entry.classification} |"
        )


def test_readme_table_equals_the_generated_table() -> None:
    text = README.read_text(encoding="utf-8")
    match = re.search(r"<!-- errors:start -->\n(.*?)\n<!-- errors:end -->", text, re.S)
    assert match is not None, "README lacks the <!-- errors:start/end --> block"
    assert match.group(1) == markdown_table(), (
        "README error table is stale: regenerate it with python -m jobs_core.errors"
    )


def test_module_main_prints_the_table() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "jobs_core.errors"],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(SRC)},
    )
    assert out.stdout == markdown_table() + "\n"
