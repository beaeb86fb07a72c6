"""Declaring a job: every refusal happens at declaration, all problems at once; the handle."""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import math
from typing import Any
from uuid import UUID

import pytest
from pydantic import BaseModel

from jobs_core import REGISTRY, UNWIND_MARGIN, Concurrency, JobRegistry, Retry, job
from jobs_core.errors import (
    IdempotencyRequiredError,
    JobDeclarationInvalidError,
    JobDuplicateError,
    TenantRequiredError,
)
from jobs_core.job import declaration_site, input_key


class Onboard(BaseModel):
    org_id: UUID
    email: str = "a@example.com"


def key(i: Onboard) -> str:
    return f"onboard:{i.org_id}"


def tenant(i: Onboard) -> str:
    return str(i.org_id)


GOOD: dict[str, Any] = {"input": Onboard, "idempotency_key": key, "tenant": tenant}


async def body(input: Onboard, step: Any, ctx: Any) -> str:
    """Onboard an org."""
    return f"done:{input.org_id}"


def _problem_fields(error: Any) -> list[str]:
    return [p.split(":")[0] for p in error.meta["problems"]]


def test_missing_idempotency_key_is_refused_at_declaration(registry: JobRegistry) -> None:
    decorate = job(input=Onboard, tenant=tenant, name="decl.no-key", registry=registry)
    with pytest.raises(IdempotencyRequiredError) as caught:
        decorate(body)
    assert caught.value.code == "X_IDEMPOTENCY_REQUIRED"
    assert _problem_fields(caught.value) == ["idempotency_key"]
    assert "idempotency_key" in str(caught.value)
    assert registry.get("decl.no-key") is None


def test_missing_tenant_is_refused_at_declaration(registry: JobRegistry) -> None:
    with pytest.raises(TenantRequiredError) as caught:
        job(input=Onboard, idempotency_key=key, name="decl.no-tenant", registry=registry)(body)
    assert caught.value.code == "X_JOB_TENANT_REQUIRED"
    assert _problem_fields(caught.value) == ["tenant"]
    assert registry.get("decl.no-tenant") is None


def test_missing_key_and_tenant_and_more_are_all_listed(registry: JobRegistry) -> None:
    with pytest.raises(IdempotencyRequiredError) as caught:
        job(input=Onboard, queue="", name="decl.missing-all", registry=registry)(body)
    assert _problem_fields(caught.value) == ["idempotency_key", "tenant", "queue"]


def test_several_bad_fields_are_all_named_in_message_and_meta(registry: JobRegistry) -> None:
    def four_args(input: Any, step: Any, ctx: Any, extra: Any) -> None:
        return None

    with pytest.raises(JobDeclarationInvalidError) as caught:
        job(
            **GOOD,
            name="decl.many-bad",
            retry=Retry(attempts=0),
            timeout=-5,
            step_timeout="soon",
            event_poll=math.nan,
            on_settled_timeout="0s",
            queue="",
            concurrency=0,
            on_settled=42,  # type: ignore[arg-type]
            compensates="yes",  # type: ignore[arg-type]
            registry=registry,
        )(four_args)
    error = caught.value
    assert error.code == "X_JOB_DECLARATION_INVALID"
    expected = [
        "retry.attempts",
        "queue",
        "concurrency",
        "timeout",
        "step_timeout",
        "event_poll",
        "on_settled_timeout",
        "compensates",
        "on_settled",
        "body",
    ]
    assert _problem_fields(error) == expected
    for problem in error.meta["problems"]:
        assert problem in str(error)
    assert error.meta["job"] == "decl.many-bad"
    assert registry.get("decl.many-bad") is None


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"input": object()}, "input"),
        ({"input": "NoSuchModelAnywhere"}, "input"),
        ({"idempotency_key": "onboard"}, "idempotency_key"),
        ({"tenant": "org-1"}, "tenant"),
        ({"retry": {"attempts": 3}}, "retry"),
        ({"retry": Retry(attempts=True)}, "retry.attempts"),
        ({"retry": Retry(backoff="cubic")}, "retry.backoff"),  # type: ignore[arg-type]
        ({"retry": Retry(delay="-1s")}, "retry.delay"),
        ({"retry": Retry(max_delay=math.inf)}, "retry.max_delay"),
        ({"name": ""}, "name"),
        ({"name": "   "}, "name"),
        ({"queue": " "}, "queue"),
        ({"queue": None}, "queue"),
        ({"queue": "mail\x00"}, "queue"),
        ({"name": "decl.nul\x00"}, "name"),
        ({"concurrency": -1}, "concurrency"),
        ({"concurrency": True}, "concurrency"),
        ({"concurrency": 1.5}, "concurrency"),
        ({"concurrency": Concurrency(key=key, limit=0)}, "concurrency.limit"),
        ({"concurrency": Concurrency(key="k")}, "concurrency.key"),  # type: ignore[arg-type]
        ({"concurrency": Concurrency(key=key, when_busy="drop")}, "concurrency.when_busy"),  # type: ignore[arg-type]
        ({"timeout": 0}, "timeout"),
        ({"timeout": "10 minutes"}, "timeout"),
        ({"timeout": True}, "timeout"),
        ({"step_timeout": math.inf}, "step_timeout"),
        ({"event_poll": -1}, "event_poll"),
        ({"on_settled": "hook"}, "on_settled"),
        ({"compensates": 1}, "compensates"),
    ],
)
def test_each_bad_field_is_refused_and_named(
    registry: JobRegistry, options: dict[str, Any], field: str
) -> None:
    fields = {**GOOD, "name": "decl.one-bad", **options}
    with pytest.raises(JobDeclarationInvalidError) as caught:
        job(**fields, registry=registry)(body)
    assert _problem_fields(caught.value) == [field]


def test_input_is_required(registry: JobRegistry) -> None:
    with pytest.raises(JobDeclarationInvalidError) as caught:
        job(idempotency_key=key, tenant=tenant, name="decl.no-input", registry=registry)(body)
    assert _problem_fields(caught.value) == ["input"]
    assert "input: required" in str(caught.value)


def test_an_unresolved_forward_reference_is_refused_at_declaration(registry: JobRegistry) -> None:
    class Outer(BaseModel):
        inner: NotYetDefined  # type: ignore[name-defined]  # noqa: F821

    with pytest.raises(JobDeclarationInvalidError) as caught:
        job(
            input=Outer,
            idempotency_key=lambda i: "k",
            tenant="none",
            name="decl.forward-ref",
            registry=registry,
        )(body)
    assert _problem_fields(caught.value) == ["input"]


@pytest.mark.parametrize(
    "bad_body",
    [
        42,
        lambda input, step, ctx, extra: None,
        lambda input, *, payload: None,
        lambda *, payload: None,
        lambda *args, extra: None,
    ],
)
def test_a_body_of_the_wrong_shape_is_refused(registry: JobRegistry, bad_body: Any) -> None:
    with pytest.raises(JobDeclarationInvalidError) as caught:
        job(**GOOD, name="decl.bad-body", registry=registry)(bad_body)
    assert _problem_fields(caught.value) == ["body"]


@pytest.mark.parametrize(
    "good_body",
    [
        lambda input, step, ctx: None,
        lambda input, step, ctx, extra=None: None,
        lambda *args: None,
        lambda input, *rest, **kw: None,
    ],
)
def test_bodies_that_accept_three_positionals_are_called_as_declared(
    registry: JobRegistry, good_body: Any
) -> None:
    handle = job(**GOOD, name="decl.good-body", registry=registry)(good_body)
    assert registry.get("decl.good-body") is handle
    assert handle.body is good_body


def _recorder(shape: str) -> Any:
    """A body of ``shape`` (its parameter list) that answers what it was given, by name."""
    names = [
        part.strip().split("=")[0].lstrip("*")
        for part in shape.split(",")
        if part.strip() not in ("", "*", "/")
    ]
    source = f"def body({shape}):\n    return {{{', '.join(f'{n!r}: {n}' for n in names)}}}\n"
    scope: dict[str, Any] = {}
    exec(source, scope)
    return scope["body"]


@pytest.mark.parametrize(
    ("shape", "received"),
    [
        ("input", {"input": "I"}),
        ("input, step", {"input": "I", "step": "S"}),
        ("order, step, ctx", {"order": "I", "step": "S", "ctx": "C"}),
        ("payload", {"payload": "I"}),
        ("input, ctx", {"input": "I", "ctx": "C"}),
        ("ctx", {"ctx": "C"}),
        ("step, input", {"step": "S", "input": "I"}),
        ("order, *, ctx", {"order": "I", "ctx": "C"}),
        ("*, ctx, input", {"ctx": "C", "input": "I"}),
        ("input, /, step", {"input": "I", "step": "S"}),
        ("input, retries=3", {"input": "I", "retries": 3}),
        ("", {}),
    ],
)
def test_a_body_takes_what_it_asks_for(
    registry: JobRegistry, shape: str, received: dict[str, Any]
) -> None:
    """(input), (input, step), (input, step, ctx) by position, or any of them by name."""
    handle = job(**GOOD, name="decl.shaped", registry=registry)(_recorder(shape))
    assert handle.body("I", "S", "C") == received
    assert handle("I", "S", "C") == received


async def test_bodies_of_one_and_two_parameters_run_on_a_worker(
    registry: JobRegistry, driver: Any, clock: Any
) -> None:
    from jobs_core.testing import run_jobs

    @job(input=int, idempotency_key="input", tenant="none", name="decl.one", registry=registry)
    async def double(n: int) -> int:
        return n * 2

    @job(input=int, idempotency_key="input", tenant="none", name="decl.two", registry=registry)
    def tally(n: int, step: Any) -> int:
        return int(step.run("add", lambda: n + 1)) * 10

    assert double.is_async
    assert not tally.is_async
    queued = [await double.enqueue(21), await tally.enqueue(4)]
    await run_jobs(driver, clock=clock, registry=registry)
    rows = [await driver.introspect.get(q.id) for q in queued]
    assert [(r.state.value, r.result) for r in rows if r is not None] == [
        ("done", 42),
        ("done", 50),
    ]


def test_idempotency_key_input_is_a_stable_hash_of_the_canonical_json(
    registry: JobRegistry,
) -> None:
    class Order(BaseModel):
        id: int
        lines: dict[str, int]

    handle = job(input=Order, idempotency_key="input", tenant="none", registry=registry)(body)
    first = handle.build_request({"id": 1, "lines": {"b": 2, "a": 1}})
    reordered = handle.build_request({"lines": {"a": 1, "b": 2}, "id": 1})
    other = handle.build_request({"id": 2, "lines": {"a": 1, "b": 2}})

    assert first.idempotency_key == reordered.idempotency_key
    assert first.idempotency_key != other.idempotency_key
    assert first.idempotency_key == input_key({"id": 1, "lines": {"a": 1, "b": 2}})
    # Pinned: the key is durable, so its derivation may never change silently.
    assert first.idempotency_key == (
        "sha256:" + hashlib.sha256(b'{"id":1,"lines":{"a":1,"b":2}}').hexdigest()
    )
    assert handle.describe()["idempotency_key"] == "input"


async def test_idempotency_key_input_dedupes_an_equal_input(
    registry: JobRegistry, driver: Any
) -> None:
    handle = job(input=dict[str, int], idempotency_key="input", tenant="none", registry=registry)(
        body
    )
    first = await handle.enqueue({"a": 1, "b": 2})
    again = await handle.enqueue({"b": 2, "a": 1})
    other = await handle.enqueue({"a": 1})
    assert again.deduped and again.id == first.id
    assert not other.deduped and other.id != first.id


def test_idempotency_key_other_text_is_refused_and_saying_nothing_still_is(
    registry: JobRegistry,
) -> None:
    with pytest.raises(JobDeclarationInvalidError) as caught:
        job(input=int, idempotency_key="inputs", tenant="none", registry=registry)(body)  # type: ignore[arg-type]
    assert _problem_fields(caught.value) == ["idempotency_key"]
    with pytest.raises(IdempotencyRequiredError):
        job(input=int, tenant="none", registry=registry)(body)


def test_two_declarations_with_one_name_fail_at_the_second(registry: JobRegistry) -> None:
    @job(**GOOD, name="decl.shared-name", registry=registry)
    async def first(input: Onboard, step: Any, ctx: Any) -> None:
        return None

    async def second(input: Onboard, step: Any, ctx: Any) -> None:
        return None

    with pytest.raises(JobDuplicateError) as caught:
        job(**GOOD, name="decl.shared-name", registry=registry)(second)
    assert caught.value.code == "X_JOB_DUPLICATE"
    assert caught.value.meta["name"] == "decl.shared-name"
    assert "first" in str(caught.value)
    assert "second" in str(caught.value)
    assert registry.get("decl.shared-name") is first


def test_a_default_name_clash_between_two_functions_is_refused(registry: JobRegistry) -> None:
    def make() -> Any:
        async def twin(input: Onboard, step: Any, ctx: Any) -> None:
            return None

        return twin

    a = make()
    job(**GOOD, registry=registry)(a)

    # Same module and qualname, different code location: a different function.
    namespace: dict[str, Any] = {"__name__": a.__module__}
    exec(
        compile("async def twin(input, step, ctx):\n    return None\n", "<other>", "exec"),
        namespace,
    )
    other = namespace["twin"]
    other.__qualname__ = a.__qualname__
    with pytest.raises(JobDuplicateError):
        job(**GOOD, registry=registry)(other)


def _factory(name: str, registry: JobRegistry) -> Any:
    """A toy factory over job(): every job it makes has the body below."""
    site = declaration_site()

    async def made(input: Onboard, step: Any, ctx: Any) -> None:
        return None

    return job(**GOOD, name=name, registry=registry, declared_at=site)(made)


def test_two_factory_jobs_of_one_name_are_a_duplicate_and_a_reload_is_not(
    registry: JobRegistry,
) -> None:
    """Every job a factory makes shares one body; the factory's call site tells them apart."""

    def declare() -> Any:
        return _factory("decl.factory", registry)

    first = declare()
    again = declare()  # the same call site again: a reload, which replaces
    assert registry.get("decl.factory") is again is not first
    with pytest.raises(JobDuplicateError) as caught:
        _factory("decl.factory", registry)
    assert caught.value.code == "X_JOB_DUPLICATE"
    assert str(caught.value).count("test_job_declaration.py:") == 2
    assert registry.get("decl.factory") is again


def test_declared_at_must_be_a_file_and_a_line(registry: JobRegistry) -> None:
    with pytest.raises(JobDeclarationInvalidError) as caught:
        job(**GOOD, name="decl.site", registry=registry, declared_at="here:1")(body)  # type: ignore[arg-type]
    assert _problem_fields(caught.value) == ["declared_at"]


def test_redeclaring_the_identical_function_is_allowed(registry: JobRegistry) -> None:
    first = job(**GOOD, name="decl.reload", registry=registry)(body)
    again = job(**GOOD, name="decl.reload", registry=registry)(body)
    assert registry.get("decl.reload") is again
    assert again is not first


def test_a_module_reload_is_allowed(registry: JobRegistry) -> None:
    source = "async def reloaded(input, step, ctx):\n    '''Reloaded body.'''\n    return 'v'\n"

    def load() -> Any:
        namespace: dict[str, Any] = {"__name__": "decl_reload_module"}
        exec(compile(source, "/virtual/decl_reload_module.py", "exec"), namespace)
        return namespace["reloaded"]

    old, new = load(), load()
    assert old is not new
    job(**GOOD, registry=registry)(old)
    handle = job(**GOOD, registry=registry)(new)
    assert handle.name == "decl_reload_module.reloaded"
    assert registry.get(handle.name) is handle


def test_default_name_is_module_and_qualname(registry: JobRegistry) -> None:
    async def onboard_org(input: Onboard, step: Any, ctx: Any) -> None:
        return None

    handle = job(**GOOD, registry=registry)(onboard_org)
    assert handle.name == f"{onboard_org.__module__}.{onboard_org.__qualname__}"
    assert handle.name.endswith("test_default_name_is_module_and_qualname.<locals>.onboard_org")
    assert registry.get(handle.name) is handle


def test_declared_fields_are_normalised(registry: JobRegistry) -> None:
    handle = job(
        **GOOD,
        name="decl.fields",
        queue="emails",
        timeout="10m",
        step_timeout=30_000,
        event_poll="30s",
        on_settled_timeout="5s",
        concurrency=3,
        registry=registry,
    )(body)
    assert handle.queue == "emails"
    assert handle.timeout_ms == 600_000
    assert handle.step_timeout_ms == 30_000
    assert handle.event_poll_ms == 30_000
    assert handle.on_settled_timeout_ms == 5_000
    assert handle.concurrency == 3
    assert handle.retry == Retry()
    assert repr(handle) == "<job decl.fields queue=emails>"


def test_defaults(registry: JobRegistry) -> None:
    handle = job(**GOOD, name="decl.defaults", registry=registry)(body)
    assert handle.queue == "default"
    assert handle.timeout_ms is None
    assert handle.step_timeout_ms is None
    assert handle.on_settled_timeout_ms == 30_000
    assert handle.compensates is False
    assert handle.max_attempts == 3


def test_max_attempts_adds_the_unwind_margin_for_compensating_jobs(registry: JobRegistry) -> None:
    assert UNWIND_MARGIN == 2
    plain = job(**GOOD, name="decl.plain", retry=Retry(attempts=4), registry=registry)(body)
    unwinding = job(
        **GOOD, name="decl.unwinding", retry=Retry(attempts=4), compensates=True, registry=registry
    )(body)
    assert plain.max_attempts == 4
    assert unwinding.max_attempts == 6


def test_describe_is_json_and_carries_the_declaration(registry: JobRegistry) -> None:
    handle = job(
        **GOOD,
        name="decl.describe",
        queue="billing",
        retry=Retry(attempts=5, backoff="linear", delay="2s", max_delay="1m", dead_letter=False),
        compensates=True,
        timeout="1m",
        on_settled=lambda settled: None,
        registry=registry,
    )(body)
    described = json.loads(json.dumps(handle.describe()))
    assert described["kind"] == "job"
    assert described["name"] == "decl.describe"
    assert described["queue"] == "billing"
    assert described["compensates"] is True
    assert described["max_attempts"] == 7
    assert described["retry"] == {
        "attempts": 5,
        "backoff": "linear",
        "delay_ms": 2_000,
        "max_delay_ms": 60_000,
        "jitter": True,
        "dead_letter": False,
    }
    assert described["timeout_ms"] == 60_000
    assert described["tenant"] == "function"
    assert described["on_settled"] is True
    assert described["sync_body"] is False
    assert described["input_schema"]["properties"]["org_id"]["format"] == "uuid"


def test_describe_with_per_key_concurrency_and_no_tenant(registry: JobRegistry) -> None:
    def sync_body(input: int, step: Any, ctx: Any) -> int:
        return input

    handle = job(
        input=int,
        idempotency_key=lambda i: f"n:{i}",
        tenant="none",
        name="decl.describe-sync",
        concurrency=Concurrency(key=lambda i: str(i), limit=2, when_busy="fail"),
        registry=registry,
    )(sync_body)
    described = json.loads(json.dumps(handle.describe()))
    assert described["tenant"] == "none"
    assert described["concurrency"] == {"limit": 2, "per_key": True, "when_busy": "fail"}
    assert described["sync_body"] is True
    assert described["compensates"] is False
    assert described["input_schema"] == {"type": "integer"}


async def test_async_body_handle_keeps_identity_and_calls_the_body(registry: JobRegistry) -> None:
    handle = job(**GOOD, name="decl.async-call", registry=registry)(body)
    assert handle.is_async
    assert handle.__name__ == "body"
    assert handle.__doc__ == "Onboard an org."
    assert handle.__qualname__ == body.__qualname__
    assert handle.__module__ == body.__module__
    assert handle.__wrapped__ is body
    assert handle.body is body
    assert inspect.signature(handle) == inspect.signature(body)
    org = UUID(int=7)
    result = handle(Onboard(org_id=org), "step", "ctx")
    assert inspect.iscoroutine(result)
    assert await result == f"done:{org}"


def test_sync_body_is_accepted_and_called(registry: JobRegistry) -> None:
    seen: list[tuple[Any, Any, Any]] = []

    def sync_body(input: Onboard, step: Any, ctx: Any) -> str:
        """Sync onboarding."""
        seen.append((input, step, ctx))
        return "sync-done"

    handle = job(**GOOD, name="decl.sync-call", registry=registry)(sync_body)
    assert not handle.is_async
    assert handle.__name__ == "sync_body"
    assert handle.__doc__ == "Sync onboarding."
    payload = Onboard(org_id=UUID(int=1))
    assert handle(payload, "s", "c") == "sync-done"
    assert seen == [(payload, "s", "c")]


def test_a_partial_is_accepted_as_a_body(registry: JobRegistry) -> None:
    def with_extra(prefix: str, input: int, step: Any, ctx: Any) -> str:
        return f"{prefix}{input}"

    handle = job(
        input=int,
        idempotency_key=str,
        tenant="none",
        name="decl.partial",
        registry=registry,
    )(functools.partial(with_extra, "n="))
    assert handle(5, None, None) == "n=5"


def test_declaring_without_a_registry_joins_the_global_one() -> None:
    name = "tests.test_job_declaration.global-probe"
    try:
        handle = job(**GOOD, name=name)(body)
        assert handle.registry is REGISTRY
        assert REGISTRY.get(name) is handle
    finally:
        REGISTRY.unregister(name)
    assert REGISTRY.get(name) is None


def test_registry_lists_jobs_by_name(registry: JobRegistry) -> None:
    b = job(**GOOD, name="decl.b", registry=registry)(body)
    a = job(**GOOD, name="decl.a", registry=registry)(body)
    assert registry.all() == [a, b]
    registry.unregister("decl.a")
    registry.unregister("decl.unknown")
    assert registry.all() == [b]
