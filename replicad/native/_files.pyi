from collections.abc import Sequence
from os import PathLike

def write_files(
    directory: str | bytes | PathLike[str], files: Sequence[tuple[str, bytes | bytearray | memoryview]],
    fsync: bool, make_dir: bool = False, prepared: bool = False, /,
) -> None: ...
def read_files(
    directory: str | bytes | PathLike[str], names: Sequence[str], optional: int = 0, max_bytes: int = ..., /,
) -> list[bytes | None]: ...
