"""How long an insert block waits when its table's partitions hold many parts, and when it is refused:
MergeTree's ``parts_to_delay_insert`` / ``parts_to_throw_insert`` / ``max_delay_to_insert``, applied before
each block as ClickHouse applies them (``delayInsertOrThrowIfNeeded``).

With ``n`` active parts in the busiest partition: below ``parts_to_delay_insert`` no wait; from
``parts_to_throw_insert`` on, TOO_MANY_PARTS (252, HTTP 429); between them the block waits
``(max_delay_to_insert * 1000) ** (k / max_k)`` milliseconds, ``k = 1 + n - parts_to_delay_insert`` of
``max_k = parts_to_throw_insert - parts_to_delay_insert``: a millisecond or so just past the first threshold,
growing to ``max_delay_to_insert`` seconds just below the second.  The wait gives merges room before inserts
fail: without it, clients that insert faster than merges keep up run into the refusal.
"""

from __future__ import annotations

from dataclasses import dataclass

from replicad.errors import TooManyPartsError

__all__ = ["PartsLimit"]


@dataclass(frozen=True)
class PartsLimit:
    delay_at: int = 150  #: parts_to_delay_insert
    throw_at: int = 300  #: parts_to_throw_insert
    max_delay_s: float = 1.0  #: max_delay_to_insert

    def delay_s(self, parts: int) -> float:
        """Seconds a block waits before it is written when the busiest partition has ``parts`` active parts
        (0.0: none); TooManyPartsError when the block is refused."""
        if parts >= self.throw_at:
            raise TooManyPartsError(
                f"Too many parts ({parts}). Merges are processing significantly slower than inserts.")
        if parts < self.delay_at:
            return 0.0
        max_k = self.throw_at - self.delay_at  # > 0 here: delay_at <= parts < throw_at
        k = 1 + parts - self.delay_at
        return float((self.max_delay_s * 1000.0) ** (k / max_k)) / 1000.0
