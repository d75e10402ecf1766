"""The response store behind ``previous_response_id``, ``GET`` and ``DELETE /v1/responses/{id}``.

Process-local, in memory: entries expire after a TTL (default 1 h) and the least recently
used go first once the stored JSON exceeds a byte cap (default 32 MiB), as in mlx-bun.
One store per app (the app host's ``plugin_state("responses")``), never a module global.

Every entry is bound to its creator's ``owner`` (a digest of the API key it was created with, or
``""`` on a server without keys, where the unguessable id alone is the capability): a lookup
under another owner finds nothing, exactly as if the id did not exist. The byte cap is each
owner's: an owner's entries are evicted only by its own traffic, never by another key's (the
store holds at most the cap times the number of keys).
"""

from __future__ import annotations

import hmac
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import attrs

__all__ = ["StoredResponse", "ResponseStore", "DEFAULT_TTL_S", "DEFAULT_MAX_BYTES"]

DEFAULT_TTL_S = 3600.0
DEFAULT_MAX_BYTES = 32 * 1024 * 1024


@attrs.frozen
class StoredResponse:
    """One finished response: the full input it ran with (prior turns included) and its body."""

    id: str
    input: tuple[Mapping[str, Any], ...]
    body: Mapping[str, Any]
    stored_at: float
    size: int
    owner: str = ""


class ResponseStore:
    """Stored responses, one least-recently-used list and byte cap per owner."""

    def __init__(self, *, ttl_s: float = DEFAULT_TTL_S, max_bytes: int = DEFAULT_MAX_BYTES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s, self.max_bytes, self._clock = ttl_s, max_bytes, clock
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()  # every owner's, by use
        self._owned: dict[str, OrderedDict[str, None]] = {}  # owner → its ids, least recently used first
        self._owned_bytes: dict[str, int] = {}
        self.bytes = 0
        self.evicted = 0
        self.expired = 0

    def put(self, id: str, input: tuple[Mapping[str, Any], ...], body: Mapping[str, Any], owner: str = "") -> None:
        self._expire()
        size = len(json.dumps(input, ensure_ascii=False)) + len(json.dumps(body, ensure_ascii=False))
        self._drop(id)
        self._items[id] = StoredResponse(id=id, input=input, body=body, stored_at=self._clock(), size=size,
                                         owner=owner)
        self._owned.setdefault(owner, OrderedDict())[id] = None
        self._owned_bytes[owner] = self._owned_bytes.get(owner, 0) + size
        self.bytes += size
        own = self._owned[owner]
        while self._owned_bytes[owner] > self.max_bytes and len(own) > 1:  # only this owner's entries
            self._drop(next(iter(own)))
            self.evicted += 1

    def get(self, id: str, owner: str = "") -> StoredResponse | None:
        """The entry ``id`` if ``owner`` created it (``None`` when absent, expired or another's)."""
        self._expire()
        item = self._items.get(id)
        if item is None or not hmac.compare_digest(item.owner.encode(), owner.encode()):
            return None
        self._items.move_to_end(id)
        self._owned[owner].move_to_end(id)  # least recently used goes first
        return item

    def delete(self, id: str, owner: str = "") -> bool:
        """Drop ``id`` if ``owner`` created it; whether it did."""
        return self.get(id, owner) is not None and self._drop(id)

    def stats(self) -> dict[str, Any]:
        """Totals over every owner (``max_bytes`` is each owner's cap)."""
        self._expire()
        return {"entries": len(self._items), "bytes": self.bytes, "max_bytes": self.max_bytes,
                "ttl_s": self.ttl_s, "evicted": self.evicted, "expired": self.expired}

    def _drop(self, id: str) -> bool:
        item = self._items.pop(id, None)
        if item is None:
            return False
        self.bytes -= item.size
        own = self._owned[item.owner]
        del own[id]
        self._owned_bytes[item.owner] -= item.size
        if not own:  # an owner with nothing stored keeps no bookkeeping
            del self._owned[item.owner], self._owned_bytes[item.owner]
        return True

    def _expire(self) -> None:
        deadline = self._clock() - self.ttl_s
        # Insertion order is not expiry order once get() touches entries: check them all.
        for id in [k for k, v in self._items.items() if v.stored_at < deadline]:
            self._drop(id)
            self.expired += 1
