"""Release versions, through the ``packaging`` library (PEP 440).

:func:`parse_version` returns a :class:`packaging.version.Version` (``0.6.15``, ``0.6.15.post1``,
``0.7.0rc1``, ``0.7.5.dev20261101``, ``2.13.0+cpu``, ``v1.2``) and turns anything else (``latest``,
``0.6.x``, an empty string) into :class:`VersionError`, which names what was found and what is
expected. :func:`public_version` drops a ``+local`` label (``0.6.15+cu129`` is release ``0.6.15``).
Ordering is PEP 440's: ``1.0.dev1 < 1.0a1 < 1.0rc1 < 1.0 < 1.0+local < 1.0.post1``, and ``0.7 == 0.7.0``.
"""

from __future__ import annotations

import functools

from packaging.version import InvalidVersion, Version

__all__ = ["Version", "VersionError", "parse_version", "public_version"]

_EXAMPLES = "'0.6.15', '0.6.15.post1', '0.7.0rc1', '0.7.5.dev20261101' or '0.6.15+cu129'"


class VersionError(ValueError):
    """A version string that is not PEP 440."""


@functools.lru_cache(maxsize=1024)
def parse_version(text: str) -> Version:
    """Parse ``text`` into a :class:`~packaging.version.Version`.

    Raises
    ------
    VersionError
        When ``text`` is not a version; the message quotes it and shows the accepted form.
    """
    if not isinstance(text, str):
        raise VersionError(
            f"version must be a string like '0.6.15', got {type(text).__name__} {text!r}"
        )
    try:
        return Version(text)
    except InvalidVersion:
        raise VersionError(
            f"invalid version {text!r}: expected a PEP 440 version such as {_EXAMPLES}"
        ) from None


def public_version(text: str) -> Version:
    """The version ``text`` names without its ``+local`` label (``0.6.15+cu129`` -> ``0.6.15``)."""
    return parse_version(parse_version(text).public)
