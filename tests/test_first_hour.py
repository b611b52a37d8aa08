"""A newcomer's first hour (issue 36), command by command, as a user types them: the ``hangwatch``
command in a subprocess, from the checkout's root. Each answer says what to do next; each long wait
says what it waits for, on a terminal only.

Before: ``--interval 5s`` and ``--listen :9979`` were refused; ``hangwatch check http://HOST:8000/v1``
said ``blind: /metrics answered HTTP 404``; a YAML error gave a line but not what was wrong; a
Latin-1 byte in a config was a traceback and exit 1; a rejected API key still said "give hangwatch
the server's API key"; ``simulate --scenario nope`` said "cannot read nope"; ``--listen`` was named
twice in one error; ``hangwatch`` alone printed no usage, no ``--help`` had a description or exit
codes; ``check`` and ``forensics`` were silent for 5-25 s; ``forensics`` exited 0 with no stack read;
``incidents`` on a machine that never restarted anything exited 1.
"""
from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import time

import pytest

from hangwatch.demo.chain import hangwatch_command
from hangwatch.demo.processes import Process
from hangwatch.demo.wait import wait_until
from hangwatch.simulator import Simulator
from harness import REPO
from tests.support.servers import webhook_config


def hangwatch(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*hangwatch_command(), *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def on_a_terminal(*args: str, timeout: float = 60) -> tuple[int, str, str]:
    """``hangwatch ARGS`` with stderr on a terminal (a pty), stdout piped: (exit code, stdout, terminal)."""
    leader, follower = pty.openpty()
    process = subprocess.Popen([*hangwatch_command(), *args], cwd=REPO, stdout=subprocess.PIPE, stderr=follower,
                               text=True)
    os.close(follower)
    shown, end = b"", time.monotonic() + timeout
    while time.monotonic() < end:
        ready, _, _ = select.select([leader], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the process closed the terminal: it is done
                break
            if not chunk:
                break
            shown += chunk
        elif process.poll() is not None:
            break
    os.close(leader)
    out, _ = process.communicate(timeout=max(1, end - time.monotonic()))
    return process.returncode, out, shown.decode().replace("\r\n", "\n")


@pytest.fixture
def sim():
    simulator = Simulator().start()
    yield simulator
    simulator.stop()


# -- 4. one duration grammar, and --listen :PORT ----------------------------------------------------
@pytest.mark.parametrize("interval, timeout", [("300ms", "2s"), ("0.3", "2")], ids=["units", "bare seconds"])
def test_time_flags_take_units_like_config_keys_and_bare_seconds_still(sim, interval, timeout):
    sim.set_state("busy", n=2)
    done = hangwatch("check", sim.url, "--interval", interval, "--timeout", timeout, "--grace", "0s", "--json")
    assert done.returncode == 0, done.stderr
    assert '"verdict": "busy"' in done.stdout


@pytest.mark.parametrize("command", ["exporter", "webhook", "simulate"])
def test_listen_takes_a_bare_port_on_loopback(command, tmp_path):
    extra = ["--config", str(webhook_config(tmp_path))] if command == "webhook" else []
    server = Process(command, [*hangwatch_command(), command, *extra, "--listen", ":0"], tmp_path / "log",
                     cwd=REPO).start()
    try:
        said = wait_until(lambda: server.check_alive() and re.search(r"listening on http://127\.0\.0\.1:(\d+)",
                                                                     server.log_text()), 20, f"{command}'s banner")
        assert int(said.group(1)) == server.wait_port()
    finally:
        server.stop()


# -- 5. every error says what to do -------------------------------------------------------------
def test_the_openai_base_url_is_refused_with_the_url_to_use(sim):
    done = hangwatch("check", sim.url + "/v1")
    assert done.returncode == 64, done.stdout
    assert "use the server's base URL, without /v1" in done.stderr and len(done.stderr.splitlines()) == 1


def test_a_yaml_error_says_what_the_parser_found_and_where(tmp_path):
    (tmp_path / "exporter.yml").write_text("timeout: 10s\nallow_targets: [http://vllm:8000\n")
    done = hangwatch("exporter", "--config", str(tmp_path / "exporter.yml"))
    assert done.returncode == 64
    assert "not valid YAML: line 3, column 1: expected ',' or ']', but got '<stream end>'" in done.stderr


@pytest.mark.parametrize("command", ["exporter", "webhook"])
def test_a_config_that_is_not_utf8_exits_64_naming_the_byte(command, tmp_path):
    config = tmp_path / "config.yml"
    config.write_bytes("timeout: 10s\n# caf\u00e9\n".encode("latin-1"))
    done = hangwatch(command, "--config", str(config))
    assert done.returncode == 64 and "Traceback" not in done.stderr, done.stderr
    assert f"{config}: not UTF-8: byte 0xe9 at offset 18 (line 2, column 6)" in done.stderr


def test_a_rejected_api_key_is_said_to_be_rejected(tmp_path):
    keyed = Simulator(api_key="the-servers-key-0123456789").start()
    try:
        (tmp_path / "wrong").write_text("another-key-0123456789\n")
        (tmp_path / "wrong").chmod(0o600)
        wrong = hangwatch("check", keyed.url, "--api-key-file", str(tmp_path / "wrong"))
        none = hangwatch("check", keyed.url)
    finally:
        keyed.stop()
    assert wrong.returncode == 0 and none.returncode == 0, wrong.stderr + none.stderr
    assert "rejected with HTTP 401: the server rejected the API key hangwatch sent" in wrong.stdout
    assert "give hangwatch" not in wrong.stdout
    assert "rejected with HTTP 401: give hangwatch the server's API key" in none.stdout


def test_an_unknown_scenario_lists_the_known_ones():
    done = hangwatch("simulate", "--scenario", "nope")
    assert done.returncode == 64
    assert "'nope' is not a state, a built-in scenario or a file" in done.stderr
    assert "busy-then-hang" in done.stderr and "unresponsive" in done.stderr


def test_a_bad_listen_names_the_flag_once():
    done = hangwatch("simulate", "--listen", "8000")
    assert done.returncode == 64
    assert done.stderr.count("--listen") == 1, done.stderr
    assert ":PORT" in done.stderr


def test_hangwatch_alone_prints_the_usage():
    done = hangwatch()
    assert done.returncode == 64
    assert done.stderr.startswith("usage: hangwatch")
    for command in ("check", "exporter", "webhook", "forensics", "incidents", "simulate", "demo", "rules", "dashboard"):
        assert re.search(rf"^\s+{command}\s+\S", done.stderr, re.M), f"{command} is not listed:\n{done.stderr}"


@pytest.mark.parametrize("command", ["check", "exporter", "webhook", "forensics", "incidents", "rules", "dashboard",
                                     "simulate", "demo"])
def test_every_subcommands_help_says_what_it_is_for_and_its_exit_codes(command):
    done = hangwatch(command, "--help")
    assert done.returncode == 0, done.stderr
    usage, description = done.stdout.split("\n\n")[:2]
    assert usage.startswith(f"usage: hangwatch {command}")
    assert not description.startswith(("options:", "positional")), f"no description:\n{done.stdout}"
    assert "exit codes: 0 " in done.stdout and "64" in done.stdout.split("exit codes:")[1]


def test_module_has_help():
    done = hangwatch("check", "--help")
    help_text = " ".join(done.stdout.split())
    assert "--module MODULE how the target is read: backend, proxy" in help_text


# -- 6. long waits say what they wait for, on a terminal only ------------------------------------
def test_check_prints_each_reading_on_a_terminal(sim):
    sim.set_state("busy", n=3)
    code, out, shown = on_a_terminal("check", sim.url, "--interval", "300ms", "--timeout", "2s")
    assert code == 0 and out.startswith("busy: "), out + shown
    lines = shown.splitlines()
    assert lines[0].startswith("reading 1: in_flight=3 probe=no -> busy: ") and "reading again in 300ms" in lines[0]
    assert lines[-1].startswith(f"reading {len(lines)}: in_flight=3 probe=no -> busy: ")


def test_check_prints_only_its_answer_when_not_on_a_terminal_or_with_json(sim):
    sim.set_state("busy", n=3)
    piped = hangwatch("check", sim.url, "--interval", "300ms", "--timeout", "2s")
    assert piped.returncode == 0 and piped.stdout.startswith("busy: ") and piped.stderr == ""
    code, out, shown = on_a_terminal("check", sim.url, "--interval", "300ms", "--timeout", "2s", "--json")
    assert code == 0 and '"verdict": "busy"' in out and shown == ""


def failing_py_spy(tmp_path) -> str:
    tool = tmp_path / "py-spy"
    tool.write_text("#!/bin/sh\necho 'Error: Failed to find python version' >&2\nexit 1\n")
    tool.chmod(0o755)
    return str(tool)


def test_forensics_says_when_a_capture_starts_and_ends_and_exits_2_without_a_stack(sim, tmp_path):
    sim.set_state("unresponsive")
    code, out, shown = on_a_terminal("forensics", sim.url, "--interval", "300ms", "--timeout", "500ms",
                                     "--py-spy", failing_py_spy(tmp_path))
    assert code == 2, out + shown
    assert out.startswith("hung:")
    assert re.search(r"^hung: capturing the stacks of its processes \(at most 10s\)$", shown, re.M), shown
    assert re.search(r"^captured 1 process\(es\), 0 with stacks, in \d+\.\ds$", shown, re.M), shown


def test_forensics_without_py_spy_names_the_install_that_fits(sim, tmp_path):
    sim.set_state("unresponsive")
    done = hangwatch("forensics", sim.url, "--interval", "300ms", "--timeout", "500ms", "--json",
                     "--py-spy", str(tmp_path / "no-py-spy-here"))
    assert done.returncode == 2, done.stderr
    assert done.stderr == ""  # --json: the one object, nothing else
    # this checkout is installed editable: its extra comes from the checkout, not from an index
    assert f"-m pip install '{REPO}[forensics]'" in done.stdout, done.stdout


def test_incidents_with_nothing_recorded_says_so_and_exits_0(tmp_path):
    done = hangwatch("incidents", "--state-dir", str(tmp_path / "never-used"))
    assert done.returncode == 0, done.stderr
    assert "no incidents recorded in" in done.stderr
    assert done.stdout.split() == ["ID", "TIME", "TARGET", "VERDICT", "SIGNATURE", "CLASS", "POLICY", "ACTION",
                                   "RECOVERED"]
    assert hangwatch("incidents", "--state-dir", str(tmp_path / "never-used"), "--json").stdout.strip() == "[]"
