from typing import Any

def parse(offsets: Any, data: Any, validity: Any, offset: int, n: int, signed: bool, bits: int, /
          ) -> bytes | int: ...
