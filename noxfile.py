"""The test matrix: lint, typing, each package's tests, and the demo.

``nox`` runs the default sessions (lint, typecheck, tests); ``nox -s demo`` runs the demo.
Every tool and test dependency is pinned once, in ``PINS``, so sessions never disagree.
"""

from __future__ import annotations

import nox

PYTHON = "3.11"

PINS = {
    "ruff": "ruff==0.17.6",
    "mypy": "mypy==2.4.1",
    "pytest": "pytest==9.0.3",
    "pytest-asyncio": "pytest-asyncio==1.5.0",
    "pytest-timeout": "pytest-timeout==2.4.0",
    "hypothesis": "hypothesis==6.155.2",
    "types-croniter": "types-croniter==6.2.4.20261118",
}

CORE = "packages/jobs-core"
CONFORMANCE = "conformance"

TEST_DEPS = [PINS["pytest"], PINS["pytest-asyncio"], PINS["pytest-timeout"], PINS["hypothesis"]]

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = False
nox.options.error_on_missing_interpreters = True


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """Check lint rules and formatting with ruff."""
    session.install(PINS["ruff"])
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """Type-check the library sources with mypy (strict; config in pyproject.toml)."""
    session.install(
        "-e", CORE, "-e", CONFORMANCE, PINS["mypy"], PINS["pytest"], PINS["types-croniter"]
    )
    session.run("mypy")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Run jobs-core's tests, slow (soak and benchmark) tests excluded."""
    session.install("-e", CORE, "-e", CONFORMANCE, *TEST_DEPS)
    session.run("pytest", f"{CORE}/tests", "-m", "not slow", "-q", *session.posargs)


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """Run the jobs-core demo on the memory driver."""
    session.install("-e", CORE)
    session.run("jobs", "demo", *session.posargs)
