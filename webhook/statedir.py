"""The webhook's state directory: its private files, its locks, its incident records.

Whoever else could write in ``state_dir`` could plant a symbolic link there and have the webhook
truncate or append to a file it names, so ``state_dir`` must be the webhook's own (``check_state_dir``),
every file is opened without following a link, and a file written whole is a new one renamed into
place. Files are 0600, directories 0700: incident records hold container logs.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import time
from contextlib import contextmanager
from typing import Callable


class LedgerError(Exception):
    """The ledger (or an incident record) could not be read or written: fail closed."""


class StateDirError(LedgerError):
    """``state_dir`` (or a directory in it) is not private to the webhook's user."""


def check_state_dir(state_dir: str) -> None:
    """``state_dir``, ``incidents`` and ``locks`` are directories owned by this process's user
    and not writable by group or others (the two inside it no symbolic links either)."""
    for path, follow in ((state_dir, True), (os.path.join(state_dir, "incidents"), False),
                         (os.path.join(state_dir, "locks"), False)):
        try:
            status = os.stat(path) if follow else os.lstat(path)
        except OSError as exc:
            raise StateDirError(f"{path}: {exc.strerror or exc}") from None
        if stat.S_ISLNK(status.st_mode):
            raise StateDirError(f"{path} is a symbolic link; it must be a directory")
        if not stat.S_ISDIR(status.st_mode):
            raise StateDirError(f"{path} is not a directory")
        if status.st_uid != os.geteuid():
            raise StateDirError(f"{path} is owned by uid {status.st_uid}, not the webhook's user "
                                f"(uid {os.geteuid()}); chown it to that user")
        if status.st_mode & 0o022:
            raise StateDirError(f"{path} is writable by group or others (mode {stat.S_IMODE(status.st_mode):04o}); "
                                "chmod 0700 it")


def open_private(path: str, flags: int, mode: int = 0o600) -> int:
    """``os.open`` that never follows a symbolic link in the last component."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "it is a symbolic link (refused)", path) from None
        raise


def create_new(path: str) -> int:
    """A new file at ``path`` (0600), replacing whatever was left there (a link is not followed)."""
    try:
        os.unlink(path)
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
        os.replace(temporary, path)
        fsync_dir(directory)
    except OSError as exc:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise LedgerError(f"cannot write incident record {path}: {exc.strerror or exc}") from None
    return path
