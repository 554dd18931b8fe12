"""Fixtures shared by the test modules."""

from __future__ import annotations

import os

import pytest
import torch
import torch._functorch.config
from hypothesis import settings

# Property tests draw the same examples on every CI run (a pass never depends
# on the seed drawn), and fresh ones locally: HYPOTHESIS_PROFILE=ci (.ci/run
# sets it; so does a CI environment variable) or explore.
settings.register_profile("ci", derandomize=True)
settings.register_profile("explore")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "explore"))


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


@pytest.fixture(autouse=True)
def restore_threads():
    """Tests that plan at one thread (CPU kernels' scratch depends on the
    count) leave the next test at the count it started with."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def reset_dynamo():
    """Each test compiles afresh: no graphs, guards or backends left over."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
