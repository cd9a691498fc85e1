"""The benchmark's scratch file system (bench/scratch_fs.py): which mount holds a path, how the report names
it, and the ``dir`` mode that leaves the directory as it is."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import scratch_fs

MOUNTS = """\
/dev/vda / ext4 rw,relatime,discard 0 0
/dev/loop0 /data/w ext4 rw,relatime 0 0
tmpfs /data/wide tmpfs rw 0 0
"""


@pytest.fixture
def mounts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    table = tmp_path / "mounts"
    table.write_text(MOUNTS)
    real = Path.read_text

    def read_text(self: Path, *a: object, **kw: object) -> str:
        return real(table) if str(self) == "/proc/mounts" else real(self, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", read_text)
    monkeypatch.setattr(Path, "resolve", lambda self, strict=False: self)


@pytest.mark.parametrize(("path", "point"), [
    ("/data/w/cluster/r1", "/data/w"),
    ("/data/w", "/data/w"),
    ("/data/wide/x", "/data/wide"),  # a longer name sharing the prefix is its own mount
    ("/data/wx", "/"),
    ("/", "/"),
])
def test_the_longest_mount_point_holding_a_path(mounts: None, path: str, point: str) -> None:
    found = scratch_fs._mount_of(Path(path))
    assert found is not None and found[1] == point


def test_an_ext4_without_a_jbd2_entry_is_named_unjournaled(mounts: None,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    class Entry:
        def __init__(self, name: str) -> None:
            self.name = name

    monkeypatch.setattr(scratch_fs, "_jbd2_entries", lambda: [Entry("loop0-8")])
    assert scratch_fs.describe(Path("/data/w/x")) == "ext4 (mount options rw,relatime), with a journal"
    assert scratch_fs.describe(Path("/srv")) == ("ext4 (mount options rw,relatime,discard), "
                                                 "**without a journal**")
    assert scratch_fs.describe(Path("/data/wide")) == "tmpfs (mount options rw)"


def test_dir_mode_mounts_nothing(tmp_path: Path) -> None:
    work = tmp_path / "w"
    said: list[str] = []
    with scratch_fs.journaled_scratch(work, "dir", said.append) as text:
        assert work.is_dir()
        assert "the scratch directory itself (--scratch-fs dir)" in text
    assert said == [] and not (tmp_path / "w.img").exists()


def test_image_mode_fails_loudly_where_it_cannot_mount(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scratch_fs, "can_mount_image", lambda: "not running as root")
    with pytest.raises(RuntimeError, match="not running as root"), \
            scratch_fs.journaled_scratch(tmp_path / "w", "image"):
        pass
    with scratch_fs.journaled_scratch(tmp_path / "w", "auto") as text:  # auto falls back to the directory
        assert "not running as root" in text


def test_auto_mode_falls_back_when_the_image_cannot_be_made(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """mkfs or mount failing (no space, no free loop device) leaves no image and, in ``auto``, the directory
    as it is with the reason; in ``image`` mode it is an error."""
    import subprocess

    monkeypatch.setattr(scratch_fs, "can_mount_image", lambda: None)
    calls: list[list[str]] = []

    def run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[bytes]:
        calls.append(argv)
        failed = argv[0] == "mount"
        return subprocess.CompletedProcess(argv, 32 if failed else 0, b"",
                                           b"mount: no free loop device\n" if failed else b"")

    monkeypatch.setattr(scratch_fs.subprocess, "run", run)
    monkeypatch.setattr(scratch_fs, "IMAGE_MAX_BYTES", 1 << 20)
    with scratch_fs.journaled_scratch(tmp_path / "w", "auto") as text:
        assert "mount failed (32): mount: no free loop device" in text
    assert [a[0] for a in calls] == ["mkfs.ext4", "mount"]
    assert not (tmp_path / "w.img").exists()
    with pytest.raises(RuntimeError, match="no free loop device"), \
            scratch_fs.journaled_scratch(tmp_path / "w", "image"):
        pass
