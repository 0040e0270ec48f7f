"""``version()``: the nvFuser direct-frontend API level pyfuser implements (not pyfuser's own version).

Clients such as Lightning Thunder gate features on ``nvfuser_direct.version()`` (Thunder 0.2.6 needs >= 0.2.34
for the direct bindings). ``pyfuser.__version__`` stays pyfuser's own release number.

``Version`` compares release numbers (``"0.2.36+git1234" > "0.2.8"``); a ``+local`` suffix is ignored, as
nvFuser's version object does. It is a ``str``, so ``LooseVersion(version())`` and printing work as well.
"""

from __future__ import annotations

import re
from typing import Any

# The upstream tests and bindings this API level corresponds to (nvFuser's python/version.txt at that time).
NVFUSER_API_VERSION = "0.2.36"


def _release(value: Any) -> tuple[int, ...]:
    if isinstance(value, Version):
        text = str.__str__(value)
    elif isinstance(value, str):
        text = value
    elif hasattr(value, "release"):  # packaging.version.Version
        return tuple(value.release)
    else:
        raise ValueError(f"can't convert {value!r} to a version")
    text = text.split("+")[0].strip()
    m = re.fullmatch(r"v?(\d+(?:\.\d+)*)(?:[._-]?(?:a|b|rc|dev|post)\d*)*", text)
    if m is None:
        raise ValueError(f"can't convert {value!r} to a version")
    parts = [int(p) for p in m.group(1).split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()  # 0.2 == 0.2.0
    return tuple(parts)


class Version(str):
    """A version string that compares by release number."""

    def __new__(cls, text: str = NVFUSER_API_VERSION):
        _release(text)  # reject what is not a version
        return super().__new__(cls, text)

    def _cmp(self, other, op):
        try:
            theirs = _release(other)
        except ValueError:
            return NotImplemented
        return op(_release(self), theirs)

    def __eq__(self, other):
        return self._cmp(other, lambda a, b: a == b)

    def __ne__(self, other):
        r = self.__eq__(other)
        return r if r is NotImplemented else not r

    def __lt__(self, other):
        return self._cmp(other, lambda a, b: a < b)

    def __le__(self, other):
        return self._cmp(other, lambda a, b: a <= b)

    def __gt__(self, other):
        return self._cmp(other, lambda a, b: a > b)

    def __ge__(self, other):
        return self._cmp(other, lambda a, b: a >= b)

    def __hash__(self):
        return hash(_release(self))


NvfuserVersion = Version
__version__ = Version(NVFUSER_API_VERSION)


def version() -> Version:
    """The nvFuser direct-frontend API level pyfuser implements, e.g. ``version() >= "0.2.34"``."""
    return __version__
