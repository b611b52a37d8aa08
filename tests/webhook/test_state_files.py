"""Nobody else can turn the webhook's state files against other files, or plant them at all.

Before: the ledger, its lock files and the compaction's ``ledger.jsonl.compact`` (opened with
``O_TRUNC``) followed symbolic links planted in ``state_dir``, so whoever could write there
could have the webhook (root, in some installs) truncate or append to any file; and a
``state_dir`` of mode 0777, or another user's, was used as it was. Now a link is refused,
never followed; a file written whole is a new one renamed into place; and the webhook does not
start (exit 64, naming ``state_dir``) unless the directory is its user's and writable by no one
else.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from hangwatch.demo.files import private_file
from hangwatch.webhook.ledger import Ledger, LedgerError
from hangwatch.webhook.statedir import StateDirError, fleet_lock, target_lock, write_incident

from .real_parts import REPO

PRECIOUS = b"root:x:0:0:root:/root:/bin/bash\n"  # what an attacker points a link at


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "precious"
    path.write_bytes(PRECIOUS)
    return path


def state(tmp_path) -> str:
    directory = tmp_path / "state"
    Ledger(str(directory))  # made as the webhook makes it
    return str(directory)


def plant(link: str, victim) -> None:
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(victim, link)


def test_a_ledger_that_is_a_link_is_refused_and_its_target_untouched(tmp_path, victim):
    directory = state(tmp_path)
    plant(os.path.join(directory, "ledger.jsonl"), victim)
    with pytest.raises(LedgerError, match="symbolic link"):
        Ledger(directory)
    assert victim.read_bytes() == PRECIOUS


def test_a_ledger_replaced_by_a_link_while_running_is_never_written_through(tmp_path, victim):
    directory = state(tmp_path)
    ledger = Ledger(directory)
    plant(os.path.join(directory, "ledger.jsonl"), victim)
    with pytest.raises(LedgerError, match="symbolic link"):
        ledger.append({"event": "restart", "at": 1.0, "target": "vllm-a"})
    with pytest.raises(LedgerError, match="symbolic link"):
        ledger.refresh()
    assert victim.read_bytes() == PRECIOUS


@pytest.mark.parametrize("name", ["ledger.lock", "vllm-a.lock", "_fleet.lock"])
def test_lock_files_that_are_links_are_refused(tmp_path, victim, name):
    directory = state(tmp_path)
    plant(os.path.join(directory, "locks", name), victim)
    with pytest.raises(LedgerError, match="symbolic link"):
        if name == "ledger.lock":
            Ledger(directory)
        elif name == "_fleet.lock":
            with fleet_lock(directory, deadline=1):
                pass
        else:
            with target_lock(directory, "vllm-a", deadline=1):
                pass
    assert victim.read_bytes() == PRECIOUS


def test_compaction_never_truncates_through_a_planted_compact_file(tmp_path, victim):
    """Before: ``ledger.jsonl.compact`` was opened with O_TRUNC, following a link: the victim
    was emptied and overwritten with the compacted ledger."""
    directory = state(tmp_path)
    ledger = Ledger(directory, keep=3600, rotate_bytes=5_000)
    plant(os.path.join(directory, "ledger.jsonl.compact"), victim)
    ledger.append({"event": "restart", "at": 5_000.0, "target": "vllm-a"})
    for i in range(60):
        ledger.append({"event": "decision", "at": 5_001.0 + i, "target": "vllm-a", "detail": "q" * 100})
    assert victim.read_bytes() == PRECIOUS
    assert os.path.getsize(os.path.join(directory, "ledger.jsonl")) < 5_000, "compaction ran"
    assert not os.path.islink(os.path.join(directory, "ledger.jsonl"))
    assert Ledger(directory).last_restart("vllm-a") == 5_000.0


def test_an_incident_record_never_writes_through_planted_links(tmp_path, victim):
    directory = state(tmp_path)
    name = "20261203T000000Z-vllm-a-1"
    plant(os.path.join(directory, "incidents", f".{name}.{os.getpid()}.tmp"), victim)
    plant(os.path.join(directory, "incidents", f"{name}.json"), victim)
    path = write_incident(directory, name, {"target": "vllm-a", "logs": ["line"]})
    assert victim.read_bytes() == PRECIOUS
    assert not os.path.islink(path) and json.loads(open(path).read())["target"] == "vllm-a"
    assert os.stat(path).st_mode & 0o777 == 0o600


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o720, 0o702], ids=lambda mode: f"{mode:04o}")
def test_a_state_dir_others_or_the_group_may_write_is_refused(tmp_path, mode):
    directory = tmp_path / "state"
    directory.mkdir(mode=0o700)
    directory.chmod(mode)
    with pytest.raises(StateDirError, match=f"writable by group or others \\(mode {mode:04o}\\)"):
        Ledger(str(directory))


@pytest.mark.parametrize("mode", [0o700, 0o750, 0o755], ids=lambda mode: f"{mode:04o}")
def test_a_state_dir_only_its_user_may_write_is_used(tmp_path, mode):
    directory = tmp_path / "state"
    directory.mkdir(mode=0o700)
    directory.chmod(mode)
    Ledger(str(directory)).append({"event": "restart", "at": 1.0, "target": "vllm-a"})


@pytest.mark.parametrize("inside", ["incidents", "locks"])
def test_a_directory_inside_that_others_may_write_or_that_is_a_link_is_refused(tmp_path, inside):
    directory = state(tmp_path)
    os.chmod(os.path.join(directory, inside), 0o777)
    with pytest.raises(StateDirError, match=f"{inside} is writable by group or others"):
        Ledger(directory)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    shutil.rmtree(os.path.join(directory, inside))
    os.symlink(elsewhere, os.path.join(directory, inside))
    with pytest.raises(StateDirError, match=f"{inside} is a symbolic link"):
        Ledger(directory)


def another_users_directory(tmp_path):
    """A directory owned by someone else: made and given away as root, else one root owns."""
    if os.geteuid() == 0:
        directory = tmp_path / "theirs"
        directory.mkdir(mode=0o700)
        os.chown(directory, 65534, 65534)
        return directory
    return "/"  # root's, and we are not root


def test_a_state_dir_owned_by_another_user_is_refused(tmp_path):
    directory = another_users_directory(tmp_path)
    with pytest.raises(StateDirError, match="is owned by uid .*, not the webhook's user"):
        Ledger(str(directory))


def run_webhook(tmp_path, state_dir) -> subprocess.CompletedProcess:
    token = private_file(tmp_path / "token", "proc-token-0123456789-0123456789-abc\n")
    config = tmp_path / "webhook.yml"
    config.write_text(json.dumps({"token_file": str(token), "state_dir": str(state_dir), "targets": [
        {"name": "vllm-a", "container": "vllm-a", "url": "http://127.0.0.1:9"}]}))
    return subprocess.run([sys.executable, "-m", "hangwatch", "webhook", "--config", str(config),
                           "--listen", "127.0.0.1:0"], cwd=REPO, capture_output=True, text=True, timeout=60)


def test_the_webhook_does_not_start_on_a_shared_state_dir_exit_64_naming_it(tmp_path):
    directory = tmp_path / "state"
    directory.mkdir()
    directory.chmod(0o777)
    done = run_webhook(tmp_path, directory)
    assert done.returncode == 64, done.stderr
    assert f"state_dir: {directory} is writable by group or others (mode 0777)" in done.stderr
    other = another_users_directory(tmp_path)
    done = run_webhook(tmp_path, other)
    assert done.returncode == 64 and f"state_dir: {other} is owned by uid" in done.stderr


def test_the_shipped_systemd_unit_makes_a_state_dir_the_webhook_accepts():
    import configparser
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read_string((REPO / "deploy" / "systemd" / "hangwatch-webhook.service").read_text())
    service = parser["Service"]
    assert int(service["StateDirectoryMode"], 8) & 0o022 == 0  # systemd makes it the service user's
    assert service["MemoryMax"] == "256M"


@pytest.mark.parametrize("lock", ["vllm-a.lock", "_fleet.lock"])
def test_a_hung_target_whose_lock_is_a_planted_link_is_not_restarted_and_says_why(harness, victim, lock):
    """Fail closed: no lock, no restart; one ledger_error decision, nothing written through the link."""
    h = harness()
    plant(os.path.join(h.state_dir, "locks", lock), victim)
    from .fakes import payload
    assert h.post(payload(h.alert())).status_code == 200
    h.settle()
    assert h.restarter.restarts == []
    (decision,) = h.decisions()
    assert decision["reason"] == "ledger_error" and "symbolic link" in decision["detail"], decision
    assert victim.read_bytes() == PRECIOUS
