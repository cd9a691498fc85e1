from collections.abc import Callable
from typing import Any

def split(block: bytes | bytearray | memoryview, width: int, delim: bytes, alloc: Callable[[int], Any], /
          ) -> tuple[list[tuple[Any, Any, Any, bool]], int] | None: ...
