"""The webhook's state directory: its private files, its locks, its incident records.

Whoever else could write in ``state_dir`` — or in a directory above it — could plant a symbolic
link and have the webhook append to or truncate a file it names, or swap ``state_dir`` itself
for a link after start-up. So at start-up (``check_state_dir``) ``state_dir`` and its
``incidents`` and ``locks`` are opened once, as directories, without following a link
(``O_DIRECTORY|O_NOFOLLOW``), each ancestor must be writable by its owner alone (or be
root-owned and sticky, like /tmp), and from then on every file is opened, renamed and removed
relative to those descriptors (``dir_fd=``): a later swap of the path changes nothing. A file
owned by another user is refused; files are 0600, directories 0700 (incident records hold
container logs); a file written whole is a new one renamed into place.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import threading
import time
from contextlib import contextmanager
from typing import Callable

SUBDIRS = ("incidents", "locks")


class LedgerError(Exception):
    """The ledger (or an incident record) could not be read or written: fail closed."""


class StateDirError(LedgerError):
    """``state_dir`` (or a directory in it) is not private to the webhook's user."""


_opened: dict[str, int] = {}   # a state directory (or one inside it) by its path -> its descriptor
_opened_lock = threading.Lock()


def check_state_dir(state_dir: str) -> None:
    """Open ``state_dir``, ``incidents`` and ``locks`` once (no symbolic link, owned by this user,
    not writable by group or others) after checking every ancestor; every later file operation
    under them goes through these descriptors."""
    state_dir = os.path.abspath(state_dir)
    check_ancestors(state_dir)
    try:
        top = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(state_dir):
            raise StateDirError(f"{state_dir} is a symbolic link; it must be a directory") from None
        raise StateDirError(f"{state_dir}: {exc.strerror or exc}") from None
    fds = {state_dir: top}
    try:
        _private(top, state_dir)
        for name in SUBDIRS:
            path = os.path.join(state_dir, name)
            try:
                fds[path] = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=top)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise StateDirError(f"{path} is a symbolic link or not a directory; it must be a directory") \
                        from None
                raise StateDirError(f"{path}: {exc.strerror or exc}") from None
            _private(fds[path], path)
    except StateDirError:
        for fd in fds.values():
            os.close(fd)
        raise
    with _opened_lock:
        for path, fd in fds.items():
            old = _opened.get(path)
            if old is not None and _same(old, fd):
                os.close(fd)  # the same directory, already open: keep the one in use
            else:
                _opened[path] = fd  # a new directory at that path (a new start-up): the old fd stays valid


def _same(a: int, b: int) -> bool:
    one, two = os.fstat(a), os.fstat(b)
    return (one.st_dev, one.st_ino) == (two.st_dev, two.st_ino)


def _private(fd: int, path: str) -> None:
    status = os.fstat(fd)
    if status.st_uid != os.geteuid():
        raise StateDirError(f"{path} is owned by uid {status.st_uid}, not the webhook's user "
                            f"(uid {os.geteuid()}); chown it to that user")
    if status.st_mode & 0o022:
        raise StateDirError(f"{path} is writable by group or others (mode {stat.S_IMODE(status.st_mode):04o}); "
                            "chmod 0700 it")


def check_ancestors(state_dir: str) -> None:
    """Every directory above ``state_dir``: writable by its owner alone, or root-owned and sticky
    (/tmp): anyone else who may rename entries there could swap ``state_dir`` for a link."""
    parent = os.path.dirname(state_dir)
    while True:
        try:
            status = os.stat(parent)
        except OSError as exc:
            raise StateDirError(f"{parent}: {exc.strerror or exc}") from None
        loose = status.st_mode & 0o022
        sticky_root = status.st_uid == 0 and status.st_mode & stat.S_ISVTX
        if loose and not sticky_root:
            raise StateDirError(f"{parent} (above state_dir) is writable by group or others (mode "
                                f"{stat.S_IMODE(status.st_mode):04o}) and not root-owned and sticky: anyone who can "
                                "write there could swap state_dir for a link; put state_dir under a private directory")
        if status.st_uid not in (0, os.geteuid()):
            raise StateDirError(f"{parent} (above state_dir) is owned by uid {status.st_uid}: that user could swap "
                                "state_dir for a link; put state_dir under root's or the webhook user's directories")
        if parent == os.path.dirname(parent):
            return
        parent = os.path.dirname(parent)


def _at(path: str) -> tuple[int | None, str]:
    """(the opened directory's descriptor, the name in it) for a path in a state directory, else (None, path)."""
    directory, name = os.path.split(os.path.abspath(path))
    with _opened_lock:
        fd = _opened.get(directory)
    return (fd, name) if fd is not None else (None, path)


def open_private(path: str, flags: int, mode: int = 0o600) -> int:
    """``os.open`` relative to the opened state directory, never following a symbolic link in the last
    component, refusing a file owned by another user."""
    fd_dir, name = _at(path)
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd_dir)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "it is a symbolic link (refused)", path) from None
        raise
    owner = os.fstat(fd).st_uid
    if owner != os.geteuid():
        os.close(fd)
        raise OSError(errno.EPERM, f"owned by uid {owner}, not the webhook's user (refused)", path)
    return fd


def unlink(path: str) -> None:
    fd_dir, name = _at(path)
    os.unlink(name, dir_fd=fd_dir)


def replace(source: str, target: str) -> None:
    """``os.replace`` within one opened state directory."""
    src_dir, src = _at(source)
    dst_dir, dst = _at(target)
    os.replace(src, dst, src_dir_fd=src_dir, dst_dir_fd=dst_dir)


def rename(source: str, target: str) -> None:
    src_dir, src = _at(source)
    dst_dir, dst = _at(target)
    os.rename(src, dst, src_dir_fd=src_dir, dst_dir_fd=dst_dir)


def link(source: str, target: str) -> None:
    src_dir, src = _at(source)
    dst_dir, dst = _at(target)
    os.link(src, dst, src_dir_fd=src_dir, dst_dir_fd=dst_dir, follow_symlinks=False)


def create_new(path: str) -> int:
    """A new file at ``path`` (0600), replacing whatever was left there (a link is not followed)."""
    try:
        unlink(path)
    except FileNotFoundError:
        pass
    return open_private(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte is written (a full disk writes short, then fails)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.EIO, "write wrote nothing")
        view = view[written:]


def fsync_dir(directory: str) -> None:
    with _opened_lock:
        opened = _opened.get(os.path.abspath(directory))
    if opened is not None:
        os.fsync(opened)
        return
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


FLEET_LOCK = "_fleet"  # target names start with a letter or digit: no target's lock is this one


def target_lock(state_dir: str, target: str, *, deadline: float, poll: float = 0.05,
                cancelled: Callable[[], bool] = lambda: False):
    """Hold ``locks/<target>.lock`` exclusively (across processes); TimeoutError after ``deadline`` s
    (or as soon as ``cancelled()`` says so: the webhook is stopping)."""
    return _file_lock(state_dir, target, deadline=deadline, poll=poll, cancelled=cancelled)


def fleet_lock(state_dir: str, *, deadline: float, poll: float = 0.02, cancelled: Callable[[], bool] = lambda: False):
    """Hold ``locks/_fleet.lock``: checking the fleet-wide limits and recording a restart are one
    step for every target and replica. Always taken *inside* a target lock, never around one."""
    return _file_lock(state_dir, FLEET_LOCK, deadline=deadline, poll=poll, cancelled=cancelled)


@contextmanager
def _file_lock(state_dir: str, name: str, *, deadline: float, poll: float, cancelled: Callable[[], bool]):
    path = os.path.join(state_dir, "locks", f"{name}.lock")
    try:
        fd = open_private(path, os.O_RDWR | os.O_CREAT)
    except OSError as exc:  # fail closed: no lock, no restart
        raise LedgerError(f"cannot open lock {path}: {exc.strerror or exc}") from None
    try:
        give_up = time.monotonic() + deadline
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if cancelled():
                    raise TimeoutError(f"stopping while {path} was held elsewhere") from None
                if time.monotonic() >= give_up:
                    raise TimeoutError(f"lock {path} held elsewhere for {deadline:g}s") from None
                time.sleep(poll)
        yield
    finally:
        os.close(fd)  # closing the only descriptor releases the flock


def write_incident(state_dir: str, name: str, record: dict) -> str:
    """Write ``incidents/<name>.json`` (0600) atomically and durably; returns its path.
    ``LedgerError`` if it cannot be written whole (nothing half-written is left behind)."""
    directory = os.path.join(state_dir, "incidents")
    path = os.path.join(directory, f"{name}.json")
    temporary = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    data = (json.dumps(record, indent=2, sort_keys=True, default=str) + "\n").encode()
    try:
        fd = create_new(temporary)
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        replace(temporary, path)
        fsync_dir(directory)
    except OSError as exc:
        try:
            unlink(temporary)
        except OSError:
            pass
        raise LedgerError(f"cannot write incident record {path}: {exc.strerror or exc}") from None
    return path
