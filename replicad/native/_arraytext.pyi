from typing import Any

def split_flat(offsets: Any, data: Any, validity: Any, offset: int, n: int, /
               ) -> tuple[bytes, bytes, bytes, bytes | None, int] | int: ...
