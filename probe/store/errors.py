"""The store's exceptions (one module, so that the chunk reader and the store share them)."""

from __future__ import annotations

from probe.errors import SpmlError


class StoreError(SpmlError):
    """A feature store is missing, malformed, incomplete, or used the wrong way."""


class StoreNotFoundError(StoreError, FileNotFoundError):
    """The store path does not exist."""


class StoreDamaged(StoreError):
    """A chunk of a store array cannot be read back as written (its file missing, of the wrong
    length, failing its checksum or undecodable); the message names the store, the array and
    the chunk, and how to repair it."""
