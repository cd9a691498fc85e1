from collections.abc import Sequence
from os import PathLike

def read_whole_streams(
    directory: str | bytes | PathLike[str], streams: Sequence[tuple[str, str]], max_bytes: int, /,
) -> list[tuple[bytes, bytes, int] | None]: ...
