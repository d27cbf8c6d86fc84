"""Writing files so that a reader, or a crash at any moment, sees the old file or the new one: the one place for it,
light enough for modules that name runs before anything heavy is imported."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO


def write_atomic(path: Path, content: str | bytes | Callable[[IO[bytes]], None]) -> None:
    """Write ``path`` so that a reader, or a crash at any moment, sees the old file or the new one, never a part of
    either: a temporary file beside it (``.<name>.<random>.tmp``, so the rename never crosses a filesystem), flushed
    to disk, renamed over it, and the rename made durable. ``content``: text, bytes, or a function that writes into
    the open binary file (``torch.save``). If the write fails (a full disk) the temporary file is removed and the old
    file stays as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as fh:
            os.fchmod(fh.fileno(), 0o666 & ~current_umask())  # mkstemp's 0600 would hide the file from the group
            if callable(content):
                content(fh)
            else:
                fh.write(content.encode() if isinstance(content, str) else content)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_directory(directory: Path) -> None:
    """Make a rename itself durable (the directory entry), not only the file's bytes."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


STAGING = ".staging-"  # .<name>.staging-<pid>-<random>/: a directory being written beside <name>


def staging_directory(parent: Path, name: str) -> Path:
    """A new directory beside ``parent / name`` to write it in before it is moved into place, named with this
    process's id so that ``remove_abandoned_staging`` knows when its writer is gone (killed mid-write)."""
    remove_abandoned_staging(parent, name)
    return Path(tempfile.mkdtemp(dir=parent, prefix=f".{name}{STAGING}{os.getpid()}-"))


def remove_abandoned_staging(parent: Path, name: str) -> None:
    """The staging directories of ``name`` whose writing process is gone (a SIGKILL leaves them): removed, so no
    later run inherits them; one a live process writes is left alone."""
    import shutil

    for staging in parent.glob(f".{name}{STAGING}*"):
        pid = staging.name.removeprefix(f".{name}{STAGING}").partition("-")[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(staging, ignore_errors=True)
        except PermissionError:  # another user's live process
            continue


def modes_from_umask(directory: Path) -> None:
    """A directory built in a ``tempfile`` staging area (0700; some writers leave files 0600) gets the modes the
    user's umask gives new files and directories (0644 and 0755 under umask 022): an export is theirs to share."""
    mask = current_umask()
    for path in [directory, *directory.rglob("*")]:
        path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)
