from collections.abc import Callable
from typing import Any

def split(block: bytes | bytearray | memoryview, width: int, delim: bytes, alloc: Callable[[int], Any],
          kinds: bytes | None = None, /) -> tuple[list[tuple[Any, Any, Any, bool]], int] | None: ...
