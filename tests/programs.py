"""Programs the suite runs from Debian packages: ``scripts/setup`` installs them, never a test."""

from __future__ import annotations

import shutil

import pytest


def required(name: str, package: str) -> str:
    """Path of ``name`` on PATH; fails the test saying how to get it when it is missing."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is missing: run scripts/setup (it installs Debian's {package} package)",
            pytrace=False,
        )
    return path
