"""Which torch release this is, which ones fxckpt is tested on, and the
error a feature raises where the release lacks what it needs."""

from __future__ import annotations

import warnings

import torch
from packaging.version import Version

# Every release the test suite runs on (.ci/run); the first is the oldest
# fxckpt imports on.
TESTED = (Version("2.11.0"), Version("2.12.1"), Version("2.13.0"), Version("2.14.1"),
          Version("2.15.0"))
OLDEST, NEWEST = TESTED[0], TESTED[-1]


def torch_release(text: str | None = None) -> Version:
    """torch's release, without a local tag (``2.13.0+cpu`` is 2.13.0)."""
    return Version(Version(text or torch.__version__).base_version)


TORCH = torch_release()


def at_least(release: str) -> bool:
    return TORCH >= Version(release)


class UnsupportedRelease(RuntimeError):
    """A feature needs a newer torch than the one installed."""


def require(feature: str, release: str, why: str) -> None:
    """Raise UnsupportedRelease naming ``feature`` and the release it needs,
    where this torch is older."""
    if not at_least(release):
        raise UnsupportedRelease(
            f"fxckpt: {feature} needs torch {release} or newer ({why}); this is torch "
            f"{torch.__version__}. Upgrade torch (pip install 'torch>={release}').")


def newer_than_tested(version: Version = TORCH) -> bool:
    """Whether ``version`` is a release after the newest one tested."""
    return (version.major, version.minor) > (NEWEST.major, NEWEST.minor)


def check_release(version: Version = TORCH) -> str | None:
    """What to say of ``version`` at import: an error for one older than
    the oldest supported, a warning for one newer than the newest tested
    (None for a tested one). Raises for the older."""
    if version < Version(f"{OLDEST.major}.{OLDEST.minor}"):
        raise ImportError(
            f"fxckpt needs torch {OLDEST.major}.{OLDEST.minor} or newer; this is torch "
            f"{torch.__version__}. Upgrade torch (pip install 'torch>={OLDEST}').")
    if newer_than_tested(version):
        return (f"fxckpt is tested on torch {', '.join(map(str, TESTED))}; this is torch "
                f"{torch.__version__}. It checks what it reads of torch at run time (the "
                "code Inductor generates above all) and says where it cannot rely on it.")
    return None


def warn_if_untested() -> None:
    message = check_release()
    if message is not None:
        warnings.warn(message, stacklevel=3)
