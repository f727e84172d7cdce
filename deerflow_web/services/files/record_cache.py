"""Results worked out from a thread's records, reused while those records are unchanged.

The records store hands out the very same record objects while a thread is unchanged (its
per-connection cache, see storage/records.py), so "the same objects in the same order"
tells that a listing or a page can be reused, and holding a reference to them means a
recycled id can never fool the check. A thread of 10,000 files is shaped once per change
instead of on every request.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from collections.abc import Sequence
from typing import Generic
from typing import TypeVar

T = TypeVar("T")


class RecordCache(Generic[T]):
    """An LRU of results, each valid while its key's records are the same objects."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._entries: OrderedDict[Hashable, tuple[list[object], T]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, records: Sequence[object]) -> T | None:
        """The result stored for `key`, if it was worked out from exactly these records."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
        if entry is None or len(entry[0]) != len(records):
            return None
        if not all(a is b for a, b in zip(entry[0], records, strict=True)):
            return None
        return entry[1]

    def put(self, key: Hashable, records: Sequence[object], result: T) -> None:
        """Remember `result` for `key` and these records, dropping the oldest beyond size."""
        with self._lock:
            self._entries[key] = (list(records), result)
            self._entries.move_to_end(key)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
