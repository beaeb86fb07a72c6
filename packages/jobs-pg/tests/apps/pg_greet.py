"""A job for the first-run tests: a body of one parameter keyed by its input, with one step."""

from __future__ import annotations

from pydantic import BaseModel

from jobs_core import Step, job


class Greet(BaseModel):
    name: str


def greeting(name: str) -> str:
    return f"hello {name}"


@job(input=Greet, idempotency_key="input", tenant="none", name="greet")
async def greet(input: Greet, step: Step) -> dict[str, str]:
    said = await step.run("say", greeting, input.name)
    return {"said": said}
