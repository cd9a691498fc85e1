from collections.abc import Callable
from typing import Any

def split(block: bytes | bytearray | memoryview, names: tuple[bytes, ...], skip_unknown: bool,
          alloc: Callable[[int], Any], kinds: bytes | None = None, /
          ) -> list[tuple[Any, Any, Any]] | None: ...
