"""Fixtures shared by the test modules."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def plan_afresh():
    """Tests plan every graph afresh: torch's cache of partitioned graphs, and
    with it fxckpt's plan cache, stays off (tests monkeypatch stages the cache
    keys cannot see). tests/test_cache.py turns them on where it tests them."""
    with torch._functorch.config.patch(enable_autograd_cache=False):
        yield


@pytest.fixture(autouse=True)
def frontiers_afresh(monkeypatch):
    """Each test starts with no frontier remembered (fxckpt/planning/memo.py): tests
    monkeypatch stages the memo's key cannot see."""
    import fxckpt.planning.memo

    monkeypatch.setattr(fxckpt.planning.memo, "FRONTIERS", fxckpt.planning.memo.FrontierMemo())


@pytest.fixture
def reset_dynamo():
    """Each test compiles afresh: no graphs, guards or backends left over."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
