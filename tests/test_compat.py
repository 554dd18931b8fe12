"""The compat layer (fxckpt/compat/): the one place fxckpt reads torch's
private surface, the release checks, and the fallbacks for releases that
lack an API."""

from __future__ import annotations

import pathlib
import re
import warnings

import pytest
import torch
import torch.fx as fx
from packaging.version import Version

from fxckpt.compat import autograd, dynamo, inductor, releases

pytestmark = pytest.mark.releases

_PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "fxckpt"
# torch's private modules and attributes: a leading underscore after torch.
_PRIVATE = re.compile(r"\btorch\.(?:_[a-zA-Z]|utils\._|fx\._|nn\.Module\._)|_execution_engine"
                      r"|\._schema\b|\._overloadname\b|\._cdata\b|\._version\b|_boxed_call")


def test_no_module_outside_compat_reads_torchs_private_surface():
    """Every private torch API goes through fxckpt/compat/ (its docstring's
    table): no other module names one, in code or in comments."""
    found = []
    for path in sorted(_PACKAGE.rglob("*.py")):
        if path.parent.name == "compat":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if _PRIVATE.search(line.replace("torch.__version__", "").replace("torch.__file__", "")):
                found.append(f"{path.relative_to(_PACKAGE.parent)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_releases_are_read_as_versions_not_strings():
    """'2.9.1' < '2.13' is False as strings; as versions it is True."""
    assert releases.torch_release("2.9.1") < releases.torch_release("2.13.0")
    assert releases.torch_release("2.13.0+cpu") == Version("2.13.0")
    assert releases.torch_release("2.16.0.dev20261201+cu132") == Version("2.16.0")


def test_an_older_release_is_refused_and_a_newer_one_said():
    with pytest.raises(ImportError, match="needs torch 2.11 or newer"):
        releases.check_release(Version("2.10.0"))
    assert releases.check_release(Version("2.11.0")) is None
    assert releases.check_release(Version("2.15.3")) is None
    message = releases.check_release(Version("2.16.0"))
    assert message is not None and "tested on torch 2.11.0" in message


def test_a_feature_names_the_release_it_needs():
    releases.require("this feature", "2.0", "it is old")
    with pytest.raises(releases.UnsupportedRelease, match=r"needs torch 99\.0 or newer \(why\)"):
        releases.require("this feature", "99.0", "why")


@pytest.mark.parametrize("emulated", [False, True])
def test_a_saved_tensor_goes_through_the_hooks_around_it(emulated, monkeypatch):
    """``saved_tensor`` packs through the innermost saved-tensor hooks, as
    autograd's own saved tensors (torch 2.11 has no ``_make_saved_tensor``:
    emulated there, and here when asked), and refuses a tensor written in
    place since, as autograd does."""
    if emulated:
        monkeypatch.setattr(autograd, "_make_saved_tensor", None)
        monkeypatch.setattr(autograd, "SavedTensor", None)
    packed = []
    x = torch.ones(3)
    with torch.autograd.graph.saved_tensors_hooks(
            lambda t: packed.append(t) or ("packed", len(packed)),
            lambda p: torch.full((3,), float(p[1]))):
        saved = autograd.saved_tensor(x)
    assert len(packed) == 1 and packed[0] is x
    assert torch.equal(autograd.unpacked(saved), torch.full((3,), 1.0))
    plain = autograd.saved_tensor(x)
    assert torch.equal(autograd.unpacked(plain), x)
    x.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        autograd.unpacked(plain)


class _Counting(inductor.CustomGraphPass):
    def __init__(self, name, calls, uuid="u"):
        self.name, self.calls, self._uuid = name, calls, uuid

    def __call__(self, graph):
        self.calls.append(self.name)

    def uuid(self):
        return self._uuid


@pytest.mark.parametrize("chained", [False, True])
def test_the_users_post_grad_pass_runs_before_fxckpts(chained, monkeypatch):
    """Where torch takes a tuple of post-grad passes (2.13 and newer) they
    are passed as one; before, the user's and fxckpt's run as one pass."""
    if chained:
        import torch._inductor.custom_graph_pass as passes

        monkeypatch.delattr(passes, "get_custom_graph_passes", raising=False)
    calls: list[str] = []
    ours = _Counting("fxckpt", calls)
    with inductor.inductor_config.patch(post_grad_custom_post_pass=_Counting("user", calls)):
        value = inductor.post_grad_passes(ours)
    for one in value if isinstance(value, tuple) else (value,):
        one(fx.Graph())
    assert calls == ["user", "fxckpt"]
    if chained:
        assert value.uuid() == ("u", "u")
        assert inductor._Both(lambda graph: None, ours).uuid() is None


def test_a_capture_kept_apart_or_said_to_count(monkeypatch):
    """explain's captures are their own recompile region where torch can
    keep them apart; where it cannot, that they count is said once."""
    def f(x):
        return x * 2

    calls = []

    def backend(gm, inputs):
        calls.append(gm)
        return gm.forward

    monkeypatch.setattr(dynamo, "ISOLATES_RECOMPILES", False)
    from fxckpt import errors

    monkeypatch.setattr(errors, "_warned", set())
    with pytest.warns(UserWarning, match="counts against Dynamo's recompile limit"):
        assert torch.equal(dynamo.compile_isolated(f, backend=backend)(torch.ones(2)),
                           torch.full((2,), 2.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dynamo.compile_isolated(f, backend=backend)(torch.ones(3))
    assert calls


def test_a_newer_release_reads_no_compiled_peak_below_the_memory_models(monkeypatch,
                                                                          reset_dynamo):
    """On a release newer than those tested, the code Inductor generates is
    read, but a plan's peak never drops below the memory model's on it."""
    import fxckpt
    import fxckpt.planning.capture as capture

    def plan(newer: bool):
        monkeypatch.setattr(capture, "newer_than_tested", lambda: newer)
        torch.compiler.reset()
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(),
                                    torch.nn.Linear(64, 16))
        backend = fxckpt.backend(compiler="inductor", budget="1GiB")
        torch.compile(model, backend=backend)(torch.randn(8, 16)).sum().backward()
        return backend.plans[0]

    tested, newer = plan(False), plan(True)
    assert tested.model_peak_bytes == newer.model_peak_bytes
    assert newer.peak_bytes == max(tested.peak_bytes, tested.model_peak_bytes)
    assert any("newer than the releases" in note for note in newer.notes)
