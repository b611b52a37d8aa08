"""The capture finds a server's processes from its URL alone, reads their stacks within one
deadline, explains every failure and never lets a secret into its answer."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from hangwatch.forensics import capture
from hangwatch.forensics.processes import find_server, redact_argv
from hangwatch.forensics.pyspy import find_py_spy

API_KEY = "sk-hangwatch-test-0123456789abcdef"
HF_TOKEN = "hf_ThisIsATokenThatMustNeverLeak1234"

# A server (listening on port 0, printing the port) with a child, both parked in named functions;
# the key lives in a local variable, in argv and in the environment.
SERVER = textwrap.dedent('''
    import os, socket, subprocess, sys, threading, time
    CHILD = "import time\\ndef hangwatch_child_parked_here():\\n    print(1, flush=True)\\n    time.sleep(600)\\nhangwatch_child_parked_here()"
    def hangwatch_parked_here(api_key):
        header = "Bearer " + sys.argv[2]
        parked.set()
        time.sleep(600)
    parked = threading.Event()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE)
    child.stdout.readline()  # parked
    threading.Thread(target=hangwatch_parked_here, args=(sys.argv[2],), name="parked", daemon=True).start()
    parked.wait(60)
    print(listener.getsockname()[1], child.pid, flush=True)
    time.sleep(600)
''')


@pytest.fixture
def server(tmp_path):
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    proc = subprocess.Popen([sys.executable, str(script), "--api-key", API_KEY], stdout=subprocess.PIPE, text=True,
                            env=os.environ | {"HF_TOKEN": HF_TOKEN}, start_new_session=True)
    try:
        port, child = map(int, proc.stdout.readline().split())
        yield f"http://127.0.0.1:{port}", proc.pid, child
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def needs_py_spy():
    if find_py_spy() is None:
        pytest.fail("py-spy is not installed (pip install -e '.[test,forensics]', as .ci/run does)")


def test_the_listener_and_its_children_are_found_from_the_url(server):
    url, pid, child = server
    found = find_server(url)
    assert [p.pid for p in found.processes] == [pid, child], found
    assert not found.errors


def test_nothing_listening_says_why(server):
    found = find_server("http://127.0.0.1:1")
    assert not found.processes and "no socket listening on port 1" in found.errors[0]


def test_the_capture_names_each_process_and_its_parked_functions(server):
    needs_py_spy()
    url, pid, child = server
    result = capture(url, deadline=10)
    assert [p["pid"] for p in result["processes"]] == [pid, child]
    functions = {p["pid"]: {f["name"] for t in p["threads"] for f in t["frames"]} for p in result["processes"]}
    assert "hangwatch_parked_here" in functions[pid] and "hangwatch_child_parked_here" in functions[child]
    assert result["errors"] == [] and result["signature"] and result["seconds"] < 10
    assert all(p["state"] in "RSD" for p in result["processes"])  # running or waiting, never stopped


def test_api_keys_and_tokens_never_appear_even_with_locals(server):
    needs_py_spy()
    url, pid, child = server
    result = capture(url, with_locals=True, secrets=[API_KEY])
    text = json.dumps(result)
    locals_seen = [v for p in result["processes"] for t in p["threads"] for f in t["frames"] for v in f.get("locals", ())]
    assert any(v["name"] == "api_key" for v in locals_seen), "the locals were not read at all"
    assert API_KEY not in text and HF_TOKEN not in text
    assert "sk-hangwatch" not in text and "Bearer sk" not in text
    assert "<redacted>" in text


def test_locals_are_not_read_unless_asked(server):
    needs_py_spy()
    result = capture(server[0])
    assert not any("locals" in f for p in result["processes"] for t in p["threads"] for f in t["frames"])


def test_a_py_spy_that_never_exits_is_cut_at_the_deadline(server, tmp_path):
    stuck = tmp_path / "py-spy"
    stuck.write_text("#!/bin/sh\nsleep 600 &\nwait\n")  # a grandchild too: the whole group is killed
    stuck.chmod(0o755)
    started = time.monotonic()
    result = capture(server[0], deadline=1.5, py_spy=str(stuck))
    took = time.monotonic() - started
    assert took < 1.5 + 2.5, took
    assert result["cut_at_deadline"] is True
    assert any("deadline" in e and "killed" in e for e in result["errors"]), result["errors"]
    assert [p["pid"] for p in result["processes"]] == [server[1], server[2]]  # what was read still is


@pytest.mark.parametrize("stderr, says", [
    ("Error: Permission denied (os error 13)", "CAP_SYS_PTRACE"),
    ("Error: Operation not permitted (os error 1)", "ptrace_scope"),
    ("Error: Failed to find python version from target process", "not a Python process"),
])
def test_a_failing_py_spy_is_explained(server, tmp_path, stderr, says):
    failing = tmp_path / "py-spy"
    failing.write_text(f"#!/bin/sh\necho '{stderr}' >&2\nexit 1\n")
    failing.chmod(0o755)
    result = capture(server[0], py_spy=str(failing))
    assert len(result["errors"]) == 2 and all(says in e for e in result["errors"]), result["errors"]
    assert result["cut_at_deadline"] is False


def test_no_py_spy_still_gives_process_states(server, tmp_path):
    result = capture(server[0], py_spy=str(tmp_path / "absent"))
    assert any("py-spy not found" in e for e in result["errors"])
    assert [p["pid"] for p in result["processes"]] == [server[1], server[2]]
    assert all(p["state"] in "RSD" and p["threads"] == [] for p in result["processes"])


def test_a_stopped_process_is_named_by_its_state(server):
    url, pid, child = server
    os.kill(child, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 10
        while open(f"/proc/{child}/stat").read().rsplit(")", 1)[1].split()[0] != "T":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        result = capture(url)
    finally:
        os.kill(child, signal.SIGCONT)
    assert result["signature"] == "process_stopped"
    assert f"pid {child}" in result["evidence"][0]


def test_secret_flag_values_leave_command_lines():
    assert redact_argv(("vllm", "--api-key", "K1", "--hf-token=K2", "--port", "8000")) == (
        "vllm", "--api-key", "<redacted>", "--hf-token=<redacted>", "--port", "8000")


def test_a_discovery_that_never_ends_is_cut_at_the_deadline(monkeypatch):
    import importlib
    import threading as threads
    module = importlib.import_module("hangwatch.forensics.capture")
    never = threads.Event()
    monkeypatch.setattr(module, "find_server", lambda url, proc, **how: never.wait(30))
    started = time.monotonic()
    result = capture("http://127.0.0.1:8000", deadline=0.5)
    never.set()
    assert time.monotonic() - started < 2.0
    assert result["processes"] == [] and "discovery did not finish" in result["errors"][0]
