"""The compiled-grammar cache: one per server, bounded in bytes, shared by every served model.

A compiled matcher's size depends on its grammar, not on how many there are (a small schema:
tens of kilobytes; a long counted repetition over a large vocabulary: far more), so the cache
holds matchers up to a memory budget (``--grammar-cache-mb``) rather than a count. Each entry is
charged what its compile allocated: the C heap's bytes in use before and after (glibc's
``mallinfo2``, macOS's ``malloc_zone_statistics``; llguidance allocates through the system
``malloc``), measured while compiles run one at a time, and never less than a floor per
grammar character. ``/stats`` shows the entries, their bytes and the budget (``grammars``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import attrs

__all__ = ["GrammarCache", "DEFAULT_BUDGET_MB", "heap_bytes"]

#: The default budget of compiled grammars, all models together.
DEFAULT_BUDGET_MB = 256
#: Bytes an entry is charged at least per character of its grammar (and a fixed part): the
#: heap measure can miss an allocation freed memory served, never the grammar's own copy.
_FLOOR_PER_CHAR, _FLOOR_FIXED = 16, 64 * 1024


@attrs.define
class _Entry:
    template: Any
    cost: int
    owner: int


class GrammarCache:
    """Compiled matchers by (owner, kind, canonical text), least recently used first out, their
    charged bytes at most ``budget_bytes`` (one larger than the whole budget is not kept).

    Thread-safe. ``compiling`` is the lock compiles hold (one at a time, so the heap measure
    is the compile's own).
    """

    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_MB * 2**20) -> None:
        self.budget_bytes = budget_bytes
        self.compiling = threading.Lock()
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[int, str, str], _Entry] = OrderedDict()
        self._bytes = 0
        self.evicted = 0
        self.refused = 0  # compiles larger than the budget, served once and not kept
        #: The C heap's bytes in use (``None`` where the platform cannot say).
        self.measure = heap_bytes()

    def owner(self, obj: object) -> int:
        """A key for ``obj``'s entries (one per served tokenizer), dropped when ``obj`` dies, so
        an unloaded model's matchers (which keep its tokenizer alive) go with it."""
        key = id(obj)
        weakref.finalize(obj, self._forget, key)
        return key

    def get(self, key: tuple[int, str, str]) -> Any:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry.template

    def put(self, key: tuple[int, str, str], template: Any, cost: int) -> None:
        cost = max(cost, _FLOOR_FIXED + _FLOOR_PER_CHAR * len(key[2]))
        with self._lock:
            if cost > self.budget_bytes:
                self.refused += 1
                return
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.cost
            self._entries[key] = _Entry(template, cost, key[0])
            self._bytes += cost
            while self._bytes > self.budget_bytes:
                _key, gone = self._entries.popitem(last=False)
                self._bytes -= gone.cost
                self.evicted += 1

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"entries": len(self._entries), "bytes": self._bytes, "budget_bytes": self.budget_bytes,
                    "evicted": self.evicted, "not_kept": self.refused}

    def _forget(self, owner: int) -> None:
        with self._lock:
            for key in [k for k, e in self._entries.items() if e.owner == owner]:
                self._bytes -= self._entries.pop(key).cost


def heap_bytes() -> Callable[[], int] | None:
    """A function returning the C heap's bytes in use, or ``None`` where this platform has none."""
    try:
        if sys.platform.startswith("linux"):
            libc = ctypes.CDLL(None)
            if not hasattr(libc, "mallinfo2"):
                return None

            class MallInfo2(ctypes.Structure):
                _fields_ = [(n, ctypes.c_size_t) for n in (
                    "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                    "fordblks", "keepcost")]

            libc.mallinfo2.restype = MallInfo2

            def linux() -> int:
                info = libc.mallinfo2()
                return int(info.uordblks + info.hblkhd)

            return linux
        if sys.platform == "darwin":
            libc = ctypes.CDLL(ctypes.util.find_library("c"))

            class ZoneStats(ctypes.Structure):
                _fields_ = [("blocks_in_use", ctypes.c_uint), ("size_in_use", ctypes.c_size_t),
                            ("max_size_in_use", ctypes.c_size_t), ("size_allocated", ctypes.c_size_t)]

            libc.malloc_zone_statistics.argtypes = [ctypes.c_void_p, ctypes.POINTER(ZoneStats)]

            def darwin() -> int:
                stats = ZoneStats()
                libc.malloc_zone_statistics(None, ctypes.byref(stats))  # NULL: every zone
                return int(stats.size_in_use)

            return darwin
    except (OSError, AttributeError):
        return None
    return None
