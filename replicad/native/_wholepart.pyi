from collections.abc import Sequence
from typing import Any

def seal_streams(
    streams: Sequence[tuple[int, Any, Any]], order: Any, method: int, level: int, max_block: int, rows: int,
    granule: int, min_block: int, /,
) -> list[tuple[bytes, bytes, int, bytes, bytes]]: ...
