"""The benchmark drops both systems' program files from the page cache (bench/page_cache.py): the pages
really leave the cache, unreadable files are skipped, and the list covers this Python's libraries and the
ClickHouse binary with what ldd names."""

from __future__ import annotations

import ctypes
import mmap
import os
import subprocess
from pathlib import Path

import pytest

from bench import page_cache


def _resident_pages(path: Path) -> int:
    """Pages of ``path`` in the page cache: mincore over a shared read-only mapping of it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                          ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    size = path.stat().st_size
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
        try:
            vec = (ctypes.c_ubyte * pages)()
            assert libc.mincore(addr, size, vec) == 0, ctypes.get_errno()
            return sum(v & 1 for v in vec)
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def test_evict_drops_a_files_cached_pages(tmp_path: Path) -> None:
    lib = tmp_path / "libx.so.1"
    lib.write_bytes(os.urandom(1 << 20))
    lib.read_bytes()
    if _resident_pages(lib) == 0:
        pytest.skip("this file system does not keep the file in the page cache")
    assert page_cache.evict([lib, tmp_path / "missing.so"]) == (1, 1 << 20)
    assert _resident_pages(lib) == 0
    assert lib.read_bytes()  # still whole on disk


def test_program_files_lists_this_pythons_libraries_and_the_server_with_its_libraries(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = tmp_path / "server"
    server.write_text("#!/bin/sh\n")
    server.chmod(0o755)
    lib = tmp_path / "libserver.so.18"
    lib.write_bytes(b"x")
    ldd_out = (f"\tlinux-vdso.so.1 (0x00007ffd)\n\tlibserver.so.18 => {lib} (0x00007f43)\n"
               "\tlibgone.so.2 => not found\n")

    def fake_run(argv: list[str], **_kw: object) -> subprocess.CompletedProcess[str]:
        assert argv == ["ldd", str(server)]
        return subprocess.CompletedProcess(argv, 0, ldd_out, "")

    monkeypatch.setattr(page_cache.subprocess, "run", fake_run)
    files = {str(p) for p in page_cache.program_files(str(server))}
    assert str(server) in files and str(lib) in files
    assert not any("libgone" in f or "vdso" in f for f in files)
    numpy_core = Path(__import__("numpy").__file__).parent
    assert any(f.startswith(os.path.realpath(numpy_core)) and ".so" in f for f in files)
    assert all(Path(f).is_file() for f in files)


def test_is_library() -> None:
    assert page_cache._is_library("libarrow.so.2600")
    assert page_cache._is_library("_zstd.cpython-311-x86_64-linux-gnu.so")
    assert not page_cache._is_library("numpy.py")
    assert not page_cache._is_library("libfoo.sox")
