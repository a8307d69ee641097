"""Fixtures shared by the hostile-client tests."""

from __future__ import annotations

import resource
from collections.abc import Iterator

import pytest


@pytest.fixture
def enough_descriptors() -> Iterator[None]:
    """Client and server sockets share this process: allow a few thousand."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(soft, 8192), hard), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
