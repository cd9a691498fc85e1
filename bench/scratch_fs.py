"""The file system the benchmark's scratch directory lives on.

Both systems create and remove many small files (a part is a directory of ~20 files).  What that costs
depends on the file system far more than on either system: on an ext4 mounted **without a journal**, each
new inode is looked for past every inode freed in the last 60–300 s (the kernel's ``recently_deleted``
check, made only without a journal), so after a burst of removals a file creation costs 0.2–1 ms of
kernel CPU instead of ~15 µs, for minutes.  A data disk of a real server is a journaled file system, so
by default the scratch directory is a fresh ext4 (with its journal) made in a sparse image file and
loop-mounted there, when this process may do so (root, ``mkfs.ext4``, ``mount``, a loop device).
Otherwise the directory stays where it is and the report says what file system it is on.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

#: the image's size: an upper bound (the file is sparse; it takes the space written, at most)
IMAGE_MAX_BYTES = 64 << 30
#: at most this share of the free space under the image's directory
IMAGE_FREE_SHARE = 0.8


def describe(path: Path) -> str:
    """``path``'s file system as the report names it: type, mount options, and for ext4 whether it
    has a journal (an ext4 without one shows no ``/proc/fs/jbd2`` entry)."""
    mount = _mount_of(path)
    if mount is None:
        return "unknown file system"
    device, _, fstype, options = mount
    text = f"{fstype} (mount options {options})"
    if fstype == "ext4":
        journaled = any(e.name.startswith(Path(device).name + "-") for e in _jbd2_entries())
        text += ", with a journal" if journaled else ", **without a journal**"
    return text


def _jbd2_entries() -> list[os.DirEntry[str]]:
    try:
        return list(os.scandir("/proc/fs/jbd2"))
    except OSError:
        return []


def _mount_of(path: Path) -> tuple[str, str, str, str] | None:
    """(device, mount point, type, options) of the mount holding ``path``: the longest mount point that is a
    prefix of it."""
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    target = str(path.resolve())
    best: tuple[str, str, str, str] | None = None
    for line in lines:
        fields = line.split()
        if len(fields) < 4:
            continue
        device, point, fstype, options = fields[:4]
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[1])):
            best = (device, point, fstype, options)
    return best


def can_mount_image() -> str | None:
    """None if a loop-mounted image can be made here, else why not."""
    if os.geteuid() != 0:
        return "not running as root"
    for tool in ("mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not Path("/dev/loop-control").exists():
        return "no loop devices (/dev/loop-control)"
    return None


def _mount_image(work_dir: Path, image: Path) -> int | str:
    """A sparse image made, formatted (ext4, with its journal) and loop-mounted on ``work_dir``: its size,
    or why not (nothing left behind then)."""
    free = shutil.disk_usage(work_dir.parent).free
    size = min(IMAGE_MAX_BYTES, int(free * IMAGE_FREE_SHARE)) // (1 << 20) << 20
    try:
        image.unlink(missing_ok=True)
        with open(image, "wb") as f:
            f.truncate(size)
        for argv in (["mkfs.ext4", "-q", "-F", "-E", "nodiscard", str(image)],
                     ["mount", "-o", "loop", str(image), str(work_dir)]):
            done = subprocess.run(argv, capture_output=True, timeout=300, check=False)
            if done.returncode != 0:
                err = done.stderr.decode(errors="replace").strip().splitlines()
                raise OSError(f"{argv[0]} failed ({done.returncode}): {err[-1] if err else 'no message'}")
    except (OSError, subprocess.SubprocessError) as e:
        image.unlink(missing_ok=True)
        return str(e)
    return size


@contextlib.contextmanager
def journaled_scratch(work_dir: Path, mode: str, say: Callable[[str], None] = print,
                      keep: bool = False) -> Iterator[str]:
    """Make ``work_dir`` the mount point of a fresh journaled ext4 (mode ``image``, or ``auto`` when it
    can be made), or leave it as it is (mode ``dir``, or ``auto`` when it cannot: the description says
    why); yields the file system's description for the report.  The image (``<work_dir>.img``, beside it)
    is unmounted and removed at the end, unless ``keep`` (then both stay, for a look at the data)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    image = work_dir.with_name(work_dir.name + ".img")
    why_not = can_mount_image() if mode != "dir" else "--scratch-fs dir"
    made = _mount_image(work_dir, image) if why_not is None else why_not
    if isinstance(made, str):
        if mode == "image":
            raise RuntimeError(f"cannot make the scratch file system: {made}")
        yield describe(work_dir) + f" — the scratch directory itself ({made})"
        return
    gib = made / 2**30
    try:
        say(f"scratch file system: a fresh ext4 of {gib:.0f} GiB (sparse image) mounted on the work "
            "directory")
        yield (f"{describe(work_dir)}: a fresh ext4 with its journal, made for this run in a sparse image "
               f"of {gib:.0f} GiB and loop-mounted (--scratch-fs image; the machine's own file "
               f"system: {describe(work_dir.parent)})")
    finally:
        if keep:
            say(f"kept: the scratch file system stays mounted (umount {work_dir}; then remove {image})")
        else:
            subprocess.run(["umount", "-l", str(work_dir)], capture_output=True, timeout=120, check=False)
            image.unlink(missing_ok=True)
