from collections.abc import Callable
from typing import Any

def split(block: bytes | bytearray | memoryview, width: int, skip_empty: bool, alloc: Callable[[int], Any],
          kinds: bytes | None = None, /) -> list[tuple[Any, Any, bool, bool]] | None: ...
