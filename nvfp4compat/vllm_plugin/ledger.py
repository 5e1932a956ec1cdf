"""The patch ledger: every object the plugin changes in vLLM, with the original to put back.

A target is an item of a mapping (vLLM's attention-backend override table, set by vLLM's own
``register_backend``) or an ``override``: a vLLM method that the registered nvfp4compat subclass
overrides (vLLM's own class is untouched, so there is nothing to put back for it). :class:`Ledger` records the original value the first time a target is set (``MISSING``
when it was absent), so :meth:`Ledger.restore_all` puts every target back exactly as it was, in
reverse order, and a test can compare identities before and after. Nothing here imports vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MISSING", "LedgerEntry", "Ledger", "Registered"]


class _Missing:
    """Marker for "the target did not exist before the patch"."""

    _instance: _Missing | None = None

    def __new__(cls) -> _Missing:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


@dataclass
class LedgerEntry:
    """One patched target.

    Attributes
    ----------
    patch_id : str
        The patch (``gate_nvfp4``, ``kv_cache_update``, ...) that set it first.
    target : str
        Dotted name of the target as written in ``docs/patches.md``, e.g.
        ``vllm.v1.attention.backends.registry._ATTN_OVERRIDES[FLASHINFER]``.
    kind : str
        ``"item"`` (mapping item), ``"override"`` (subclass override) or ``"registered"`` (names
        registered through a vLLM API, e.g. ``register_kv_cache_dtype``).
    owner : object
        The mapping holding an item target; for ``registered``, a :class:`Registered`; None for
        overrides.
    key : object
        The mapping key (None for overrides).
    original : object
        The value before the first patch, or ``MISSING``.
    also : list[str]
        Other patch ids that set the same target later.
    """

    patch_id: str
    target: str
    kind: str
    owner: Any
    key: Any
    original: Any
    also: list[str] = field(default_factory=list)

    def current(self) -> Any:
        """The value the target holds now (``MISSING`` when absent or for an override; for
        ``registered``, the names still registered, ``MISSING`` when none is)."""
        if self.kind == "item":
            return self.owner.get(self.key, MISSING)
        if self.kind == "registered":
            return self.owner.current()
        return MISSING

    def restore(self) -> None:
        """Put the original back (delete the target when it was absent; nothing for overrides;
        unregister the names of a ``registered`` target)."""
        if self.kind == "override":
            return
        if self.kind == "registered":
            self.owner.undo()
            return
        mapping: MutableMapping[Any, Any] = self.owner
        if self.original is MISSING:
            mapping.pop(self.key, None)
        else:
            mapping[self.key] = self.original


@dataclass
class Registered:
    """Names registered through a vLLM API, with what takes each one back out.

    ``undo[name]`` removes ``name`` again; ``present(name)`` says whether it is registered now."""

    present: Callable[[str], bool]
    undo_one: dict[str, Callable[[], None]] = field(default_factory=dict)

    def current(self) -> Any:
        names = tuple(n for n in self.undo_one if self.present(n))
        return names if names else MISSING

    def undo(self) -> None:
        for name in reversed(list(self.undo_one)):
            self.undo_one[name]()
        self.undo_one.clear()


class Ledger:
    """Ordered record of patched targets; one entry per target, the first original kept."""

    def __init__(self) -> None:
        self._entries: dict[str, LedgerEntry] = {}

    def __contains__(self, target: str) -> bool:
        return target in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[LedgerEntry]:
        """Entries in the order they were first patched."""
        return list(self._entries.values())

    def targets(self) -> dict[str, list[str]]:
        """``{target: [patch ids]}`` for every patched target (first setter first)."""
        return {e.target: [e.patch_id, *e.also] for e in self._entries.values()}

    def _record(self, patch_id: str, target: str, kind: str, owner: Any, key: Any) -> None:
        entry = self._entries.get(target)
        if entry is None:
            original = owner.get(key, MISSING) if kind == "item" else MISSING
            self._entries[target] = LedgerEntry(patch_id, target, kind, owner, key, original)
        elif patch_id != entry.patch_id and patch_id not in entry.also:
            entry.also.append(patch_id)

    def note_override(self, patch_id: str, target: str) -> None:
        """Record that the registered subclass overrides ``target`` for ``patch_id``."""
        self._record(patch_id, target, "override", None, None)

    def record_item(
        self, patch_id: str, target: str, mapping: MutableMapping[Any, Any], key: Any
    ) -> None:
        """Record ``mapping[key]``'s original before a vLLM API (e.g. ``register_backend``) sets it."""
        self._record(patch_id, target, "item", mapping, key)

    def record_registered(
        self, patch_id: str, target: str, name: str, present: Callable[[str], bool], undo: Callable[[], None]
    ) -> None:
        """Record that ``name`` was registered through the vLLM API ``target`` (absent before);
        ``undo`` takes it out again on :meth:`restore_all`."""
        entry = self._entries.get(target)
        if entry is None:
            entry = LedgerEntry(patch_id, target, "registered", Registered(present), None, MISSING)
            self._entries[target] = entry
        elif patch_id != entry.patch_id and patch_id not in entry.also:
            entry.also.append(patch_id)
        entry.owner.undo_one[name] = undo

    def restore_all(self, on_restore: Callable[[LedgerEntry], None] | None = None) -> list[str]:
        """Restore every target, newest first; return the targets restored and empty the ledger."""
        restored = []
        for entry in reversed(list(self._entries.values())):
            entry.restore()
            if on_restore is not None:
                on_restore(entry)
            restored.append(entry.target)
        self._entries.clear()
        return restored
