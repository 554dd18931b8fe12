"""Fixtures shared by the test modules."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def reset_dynamo():
    """Each test compiles afresh: no graphs, guards or backends left over."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
