"""Fixtures of the integration tests that need more than the engine."""

from __future__ import annotations

import pytest

from tests.support import node2


@pytest.fixture(scope="module")
def node(request):
    """The second, air-gapped node (own network namespace, dockerd and sshd), started once per test module; at
    x.10 beside this host's x.9 where the module sets TEXT_ORDER_FLIPPED (node2.start)."""
    n = node2.start(text_order_flipped=getattr(request.module, "TEXT_ORDER_FLIPPED", False))
    try:
        yield n
    finally:
        node2.stop(n)
