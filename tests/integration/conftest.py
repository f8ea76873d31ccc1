"""Fixtures of the integration tests that need more than the engine."""

from __future__ import annotations

import pytest

from tests.support import node2


@pytest.fixture(scope="module")
def node():
    """The second, air-gapped node (own network namespace, dockerd and sshd), started once per test module."""
    n = node2.start()
    try:
        yield n
    finally:
        node2.stop(n)
