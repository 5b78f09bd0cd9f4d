"""Atomic writes: build in a temporary sibling, rename when complete, so nothing half-written stays.

The temporary file or folder gets the permissions an ordinary `open` or `mkdir` would give
it (0666 or 0777 less the umask), not tempfile's private 0600 / 0700: a results folder is
as readable as the parquet files a library writes into it. Its name carries this host and
process id (`owned_prefix`), so that a later write beside it can remove what a killed
process left (`remove_orphans`: only this host's, only a process that no longer runs).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path


def current_umask() -> int:
    """Return the process's umask (it can only be read by setting it, so set it back at once)."""
    # 0o077 while it is briefly in force: a file another thread creates meanwhile is private, not open
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def owned_prefix(stem: str) -> str:
    """Return a temporary name's prefix: `stem`, this host and this process id."""
    return f"{stem}{socket.gethostname()}-{os.getpid()}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it runs
        return True
    return True


def remove_orphans(parent: Path, stem: str) -> list[Path]:
    """Remove the temporaries named `owned_prefix(stem)…` in `parent` whose process is gone.

    A process killed outright (SIGKILL, SIGTERM, a lost node) cannot clean up after itself;
    the next write beside it does. Only this host's are judged: a process id means nothing
    on another machine sharing the disk. Returns what was removed.
    """
    mine = f"{stem}{socket.gethostname()}-"
    gone = []
    for path in parent.glob(f"{glob.escape(mine)}*"):
        pid = path.name[len(mine):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            gone.append(path)
    return gone


@contextlib.contextmanager
def atomic_dir(target: Path | str, *, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temporary directory that replaces `target` only if the block completes.

    On an exception the temporary directory is removed and `target` is left as it was.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_orphans(target.parent, f".{target.name}.")
    tmp = Path(tempfile.mkdtemp(prefix=owned_prefix(f".{target.name}."), suffix=".tmp", dir=target.parent))
    try:
        tmp.chmod(0o777 & ~current_umask())
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if target.exists():
        if not overwrite:
            shutil.rmtree(tmp, ignore_errors=True)
            raise FileExistsError(f"{target} exists; refusing to overwrite")
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
        os.replace(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, target)


@contextlib.contextmanager
def atomic_file(target: Path | str, mode: str = "w") -> Iterator[Path]:
    """Yield a temporary path beside `target`; rename it over `target` if the block completes."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_orphans(target.parent, f".{target.name}.")
    fd, name = tempfile.mkstemp(prefix=owned_prefix(f".{target.name}."), suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        tmp.chmod(0o666 & ~current_umask())
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, target)


def write_text(target: Path | str, text: str) -> None:
    """Write `text` to `target` atomically."""
    with atomic_file(target) as tmp:
        tmp.write_text(text)
