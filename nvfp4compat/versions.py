"""PEP 440-style version parsing and ordering, without the ``packaging`` dependency.

The runtime dependencies of :mod:`nvfp4compat` are only pydantic and PyYAML, so this module
implements the subset of PEP 440 that FlashInfer, vLLM, torch and Triton releases use:
``N(.N)*[{a|b|rc}N][.postN][.devN][+local]`` with an optional leading ``v``.

Examples that parse: ``0.6.15``, ``0.6.15.post1``, ``0.7.0rc1``, ``0.7.5.dev20261101``,
``2.13.0+cpu``, ``0.6.15+cu129``, ``0.0.0+unknown``. Anything else (``latest``, ``0.6``
followed by text, an empty string) raises :class:`VersionError` naming what was found and
what is expected.

Ordering follows PEP 440: ``1.0.dev1 < 1.0a1 < 1.0rc1 < 1.0 < 1.0.post1``; trailing zeros in
the release segment do not matter (``0.7 == 0.7.0``); a local label sorts after the same
public version without one.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

__all__ = ["Version", "VersionError", "parse_version"]

_VERSION_RE = re.compile(
    r"""
    ^\s*v?
    (?P<release>[0-9]+(?:\.[0-9]+)*)
    (?:[-_.]?(?P<pre_l>a|alpha|b|beta|rc|c|pre|preview)[-_.]?(?P<pre_n>[0-9]+)?)?
    (?P<post>(?:[-_.]?(?:post|rev|r)[-_.]?(?P<post_n>[0-9]+)?)|(?:-(?P<post_implicit>[0-9]+)))?
    (?P<dev>[-_.]?dev[-_.]?(?P<dev_n>[0-9]+)?)?
    (?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?
    \s*$
    """,
    re.VERBOSE | re.IGNORECASE,
)

_PRE_NORMALISE = {"alpha": "a", "a": "a", "beta": "b", "b": "b", "c": "rc", "rc": "rc", "pre": "rc", "preview": "rc"}


class VersionError(ValueError):
    """A version string that is not PEP 440-like."""


@functools.total_ordering
@dataclass(frozen=True)
class Version:
    """A parsed version; compare with ``<``/``==``; ``str()`` gives the normalised form."""

    release: tuple[int, ...]
    pre: tuple[str, int] | None = None
    post: int | None = None
    dev: int | None = None
    local: str | None = None
    _key: tuple = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        release = list(self.release)
        while len(release) > 1 and release[-1] == 0:
            release.pop()
        # PEP 440 ordering: dev-only releases sort before pre-releases, which sort before finals.
        if self.pre is None and self.post is None and self.dev is not None:
            pre_key: tuple = (-1, "", 0)
        elif self.pre is None:
            pre_key = (1, "", 0)
        else:
            pre_key = (0, self.pre[0], self.pre[1])
        post_key = (-1,) if self.post is None else (self.post,)
        dev_key: tuple = (1, 0) if self.dev is None else (0, self.dev)
        local_key: tuple = () if self.local is None else tuple(
            (1, int(p), "") if p.isdigit() else (0, 0, p) for p in re.split(r"[-_.]", self.local)
        )
        object.__setattr__(self, "_key", (tuple(release), pre_key, post_key, dev_key, local_key))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._key == other._key

    def __lt__(self, other: Version) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._key < other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __str__(self) -> str:
        out = ".".join(str(p) for p in self.release)
        if self.pre is not None:
            out += f"{self.pre[0]}{self.pre[1]}"
        if self.post is not None:
            out += f".post{self.post}"
        if self.dev is not None:
            out += f".dev{self.dev}"
        if self.local is not None:
            out += f"+{self.local}"
        return out

    @property
    def public(self) -> Version:
        """The same version without its ``+local`` label."""
        return Version(self.release, self.pre, self.post, self.dev, None)

    @property
    def is_prerelease(self) -> bool:
        """True for ``rc``/``a``/``b`` and ``.dev`` versions."""
        return self.pre is not None or self.dev is not None


@functools.lru_cache(maxsize=1024)
def parse_version(text: str) -> Version:
    """Parse ``text`` into a :class:`Version`.

    Parameters
    ----------
    text : str
        A PEP 440-like version such as ``"0.6.15.post1"``, ``"0.7.0rc1"``,
        ``"0.7.5.dev20261101"`` or ``"2.13.0+cpu"``.

    Raises
    ------
    VersionError
        When ``text`` is not a version; the message quotes it and shows the accepted form.
    """
    if not isinstance(text, str):
        raise VersionError(f"version must be a string like '0.6.15', got {type(text).__name__} {text!r}")
    m = _VERSION_RE.match(text)
    if m is None:
        raise VersionError(
            f"invalid version {text!r}: expected a PEP 440 version such as '0.6.15', "
            "'0.6.15.post1', '0.7.0rc1', '0.7.5.dev20261101' or '0.6.15+cu129'"
        )
    release = tuple(int(p) for p in m.group("release").split("."))
    pre = None
    if m.group("pre_l"):
        pre = (_PRE_NORMALISE[m.group("pre_l").lower()], int(m.group("pre_n") or 0))
    post = None
    if m.group("post") is not None:
        post = int(m.group("post_implicit") or m.group("post_n") or 0)
    dev = None
    if m.group("dev") is not None:
        dev = int(m.group("dev_n") or 0)
    local = m.group("local").lower() if m.group("local") else None
    return Version(release, pre, post, dev, local)
