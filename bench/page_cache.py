"""Both systems' program files leave the page cache before the servers start, so that their memory is
measured as on a machine that has booted since it installed them.

Found on this machine's kernel (6.18): a library that pip (or dpkg) has just written sits in the page cache
in large folios, and a process mapping it then counts whole folios in its RSS where it touched a few pages.
``import replicad.daemon`` right after ``make deps``: RSS 142 MiB (90 MiB of it file pages); the same import
after the cache was dropped: 106 MiB (51 MiB file pages), the private memory the same (55 MiB).  That is
~35 MiB of every replicad process's peak RSS owed to how recently the venv was installed, and the
ClickHouse binary's libraries likewise to when apt wrote them.  ``posix_fadvise(DONTNEED)`` drops a file's
clean cached pages without privileges; the first process to map the file again reads it back in small
folios, as after a reboot.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

__all__ = ["evict", "program_files"]


def _is_library(name: str) -> bool:
    return name.endswith(".so") or ".so." in name


def _libraries_under(root: Path) -> Iterator[Path]:
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            if _is_library(name):
                yield Path(dirpath, name)


def _ldd(binary: str) -> list[Path]:
    """The binary and the shared libraries ``ldd`` lists for it (none when ldd is missing or fails)."""
    try:
        out = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return [Path(binary)]
    libs = [Path(binary)]
    for line in out.splitlines():
        fields = line.split("=>")
        if len(fields) == 2 and (target := fields[1].split("(")[0].strip()).startswith("/"):
            libs.append(Path(target))
    return libs


def program_files(clickhouse_binary: str | None = None) -> list[Path]:
    """The files both servers map: every shared library of this Python (the venv's packages, the
    interpreter's own), and ClickHouse's binary (``clickhouse_binary``, else the one the bench runs) with
    its libraries."""
    roots = {Path(sys.prefix), Path(sys.base_prefix)}
    found = {os.path.realpath(p) for root in roots for p in _libraries_under(root)}
    if clickhouse_binary is None:
        from replicad.devtools.clickhouse import find_server_command

        command = find_server_command()
        clickhouse_binary = command[0] if command else None
    binary = clickhouse_binary and shutil.which(clickhouse_binary)
    if binary:
        found.update(os.path.realpath(p) for p in _ldd(binary))
    return [Path(p) for p in sorted(found)]


def evict(paths: Iterable[Path]) -> tuple[int, int]:
    """Drop the cached pages of ``paths`` (dirty ones are written back first); (files, bytes) evicted.  A
    file that cannot be opened is skipped."""
    os.sync()  # DONTNEED drops clean pages only: just-written files' dirty ones must reach the disk first
    files = total = 0
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            size = os.fstat(fd).st_size
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            continue
        finally:
            os.close(fd)
        files += 1
        total += size
    return files, total
