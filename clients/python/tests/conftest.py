"""The tests run against a real dispatchd: DISPATCH_TEST_URL and DISPATCH_TEST_TOKEN (an admin
key) name it. Tests/ServerIntegrationTests/PythonClientTests.swift starts one (with its own
PostgreSQL) and runs this suite, as `make test` does; by hand:

    DISPATCH_TEST_URL=http://127.0.0.1:8080 DISPATCH_TEST_TOKEN=$(cat .dispatch/dev-key) \\
        .build/pyenv/bin/python -m pytest clients/python/tests
"""
from __future__ import annotations

import os
import sys
import uuid
from typing import Iterator

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from faults import FaultProxy  # noqa: E402

from dispatch_client import Client  # noqa: E402


@pytest.fixture(scope="session")
def server() -> tuple:
    url, token = os.environ.get("DISPATCH_TEST_URL"), os.environ.get("DISPATCH_TEST_TOKEN")
    if not url or not token:
        pytest.fail("DISPATCH_TEST_URL and DISPATCH_TEST_TOKEN must name a running dispatchd and an admin key")
    return url, token


@pytest.fixture
def client(server: tuple) -> Client:
    return Client(*server, retry_for=10)


@pytest.fixture
def proxy(server: tuple) -> Iterator[FaultProxy]:
    p = FaultProxy(server[0])
    yield p
    p.close()


@pytest.fixture
def new_id() -> str:
    return "py-" + uuid.uuid4().hex[:12]
