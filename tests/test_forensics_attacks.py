"""Issue 35, reproduced as an attacker would: each test aims forensics at real processes it must
never touch (a victim with a secret in a local, read by the real py-spy), or feeds it what a
malicious backend or neighbour would, and checks that nothing is captured, bounded or leaked."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import requests

from hangwatch.exporter.config import ConfigError, exporter_config
from hangwatch.forensics import capture
from hangwatch.forensics.pyspy import find_py_spy

FAST = {"liveness_interval": "0.3s", "liveness_timeout": "0.5s", "liveness_budget": "3s"}
COOKIE = "victim-session-cookie-4f1e9a0b7c"
PROMPT = "victim prompt: the launch codes are 0000"

# A process that is not the target: it listens on HOST:PORT (argv), holds a prompt and a session
# cookie in the locals of a named function, and prints its pid once parked there.
VICTIM = textwrap.dedent(f'''
    import os, socket, sys, threading, time
    def victim_parked_here():
        prompt = {PROMPT!r}
        session_cookie = {COOKIE!r}
        parked.set()
        time.sleep(600)
    parked = threading.Event()
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((sys.argv[1], int(sys.argv[2])))
    listener.listen()
    threading.Thread(target=victim_parked_here, daemon=True).start()
    parked.wait(60)
    print(os.getpid(), listener.getsockname()[1], flush=True)
    time.sleep(600)
''')


@pytest.fixture
def victims(tmp_path):
    started = []

    def start(host: str, port: int = 0, *, prefix: tuple[str, ...] = ()) -> tuple[int, int]:
        script = tmp_path / "victim.py"
        script.write_text(VICTIM)
        proc = subprocess.Popen([*prefix, sys.executable, str(script), host, str(port)], stdout=subprocess.PIPE,
                                text=True, start_new_session=True)
        started.append(proc)
        line = proc.stdout.readline()  # the victim prints once parked (or exits: an empty line)
        assert line, f"the victim did not start (exit {proc.wait(10)})"
        pid, bound = map(int, line.split())
        return pid, bound
    yield start
    for proc in started:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


MUTE = textwrap.dedent('''
    import socket, sys, time
    def hung_server_waits_here():
        time.sleep(600)
    listener = socket.socket()
    listener.bind((sys.argv[1], int(sys.argv[2])))
    listener.listen()
    print(listener.getsockname()[1], flush=True)
    hung_server_waits_here()
''')


@pytest.fixture
def hung_at(tmp_path):
    """A hung server of its own (a process, not this test's): it accepts connections and never answers."""
    started = []

    def start(host: str, port: int) -> str:
        script = tmp_path / "mute.py"
        script.write_text(MUTE)
        proc = subprocess.Popen([sys.executable, str(script), host, str(port)], stdout=subprocess.PIPE, text=True,
                                start_new_session=True)
        started.append(proc)
        line = proc.stdout.readline()
        assert line, f"the hung server did not start (exit {proc.wait(10)})"
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{int(line)}"
    yield start
    for proc in started:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def forensics(exporter: str, target: str, **params) -> requests.Response:
    return requests.get(exporter + "/forensics", params={"target": target, **params}, timeout=60)


def require_py_spy():
    if find_py_spy() is None:
        pytest.fail("py-spy is not installed (pip install -e '.[test,forensics]', as .ci/run does)")


@pytest.mark.parametrize("forensics_config", [
    {"enabled": True},                                                    # no allowlist at all
    {"enabled": True, "__allow_any": True},                                # allow_any_target
])
def test_forensics_without_an_exact_allowlist_is_a_config_error(forensics_config):
    data = {"forensics": {k: v for k, v in forensics_config.items() if not k.startswith("__")}}
    if forensics_config.get("__allow_any"):
        data |= {"allow_any_target": True}
    with pytest.raises(ConfigError, match=r"forensics\.enabled"):
        exporter_config(data)


def test_the_exporter_exits_64_naming_the_key(tmp_path):
    config = tmp_path / "exporter.yml"
    config.write_text("forensics: {enabled: true}\n")
    done = subprocess.run([sys.executable, "-m", "hangwatch", "exporter", "--listen", "127.0.0.1:0", "--config",
                           str(config)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 64 and "forensics.enabled" in done.stderr, (done.returncode, done.stderr)


def test_another_loopback_address_does_not_capture_the_process_on_127_0_0_1(exporters, victims, hung_at):
    """The issue's first finding: a hung server on 127.0.0.2:P, an unrelated process on 127.0.0.1:P."""
    require_py_spy()
    victim, port = victims("127.0.0.1")
    target = hung_at("127.0.0.2", port)
    _, exporter = exporters(exporter_config(FAST | {"allow_targets": [target],
                                                    "forensics": {"enabled": True, "locals": True}}))
    answer = forensics(exporter, target)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert victim not in [p["pid"] for p in body["processes"]], body["processes"]
    assert any("hung_server_waits_here" in f["name"] for p in body["processes"] for t in p["threads"]
               for f in t["frames"]), body  # the hung server itself was read
    assert COOKIE not in answer.text and PROMPT not in answer.text
    assert body["netns"] == [os.readlink("/proc/self/ns/net")]


def test_another_network_namespace_listening_on_the_same_port_is_not_captured(exporters, victims, hung_at):
    """With an exact allowlist, a process in another network namespace (``unshare -n``: another
    container) listening on 0.0.0.0:P is never read for a target on 127.0.0.1:P."""
    require_py_spy()
    url = hung_at("127.0.0.1", 0)
    port = int(url.rsplit(":", 1)[1])
    victim, _ = victims("0.0.0.0", port, prefix=("unshare", "-n"))
    assert os.readlink(f"/proc/{victim}/ns/net") != os.readlink("/proc/self/ns/net")
    _, exporter = exporters(exporter_config(FAST | {"allow_targets": [url],
                                                    "forensics": {"enabled": True, "locals": True}}))
    answer = forensics(exporter, url)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert victim not in [p["pid"] for p in body["processes"]], body["processes"]
    assert COOKIE not in answer.text and "victim_parked_here" not in answer.text
    assert body["netns"] == [os.readlink("/proc/self/ns/net")]


def test_four_spellings_of_one_address_are_one_target_to_the_guard(exporters, hung_at):
    port = int(hung_at("127.0.0.2", 0).rsplit(":", 1)[1])
    _, exporter = exporters(exporter_config(FAST | {"allow_targets": [f"http://127.0.0.2:{port}"],
                                                    "forensics": {"enabled": True, "deadline": "5s"}}))
    spellings = [f"http://{host}:{port}" for host in ("127.0.0.2", "127.2", "2130706434", "0x7f000002")]
    codes = [forensics(exporter, url) for url in spellings]
    assert [c.status_code for c in codes] == [200, 429, 429, 429], [(c.status_code, c.text[:100]) for c in codes]
    assert all(int(c.headers["Retry-After"]) > 0 for c in codes[1:])


def test_livez_captures_and_forensics_share_one_guard(exporters, hung_at):
    url = hung_at("127.0.0.1", 0)
    _, exporter = exporters(exporter_config(FAST | {"allow_targets": [url],
                                                    "forensics": {"enabled": True, "deadline": "5s"}}))
    assert requests.get(exporter + "/livez", params={"target": url}, timeout=30).status_code == 503
    deadline = time.monotonic() + 30
    while (code := forensics(exporter, url).status_code) == 503:  # the /livez capture still running
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert code == 429  # the capture /livez took counts: no second one within min_interval


@pytest.mark.parametrize("path", ["/forensics", "/probe", "/livez"])
def test_a_zone_id_target_is_400_with_a_reason(exporters, path):
    target = "http://[::1%25lo]:8000"
    config = {"allow_targets": ["http://127.0.0.1:8000"], "forensics": {"enabled": True}} if path == "/forensics" else {}
    _, exporter = exporters(exporter_config(config))
    answer = requests.get(exporter + path, params={"target": target}, timeout=30)
    assert answer.status_code == 400 and "zone" in answer.text, (answer.status_code, answer.text)


def test_forensics_asks_for_the_token_when_one_is_configured(exporters, hung_at, tmp_path):
    token = tmp_path / "token"
    token.write_text("forensics-token-0123456789abcdef\n")
    token.chmod(0o600)
    url = hung_at("127.0.0.1", 0)
    _, exporter = exporters(exporter_config(FAST | {"allow_targets": [url], "forensics": {
        "enabled": True, "token_file": str(token), "deadline": "5s"}}))
    assert forensics(exporter, url).status_code == 401
    answer = requests.get(exporter + "/forensics", params={"target": url}, timeout=60,
                          headers={"Authorization": "Bearer forensics-token-0123456789abcdef"})
    assert answer.status_code == 200, answer.text


def test_livez_logs_the_signature_and_a_summary_not_the_locals(exporters, victims, caplog):
    """The victim is the hung target itself here (pinned by pid_file): its locals are read (locals: true)
    and go to the debug line only; the warning line says what was found."""
    import logging
    require_py_spy()
    caplog.set_level(logging.INFO, logger="hangwatch.exporter")
    victim, port = victims("127.0.0.1")
    target = f"http://127.0.0.1:{port}"  # it never answers HTTP: the bounded check says hung
    _, exporter = exporters(exporter_config(FAST | {"allow_targets": [target],
                                                    "forensics": {"enabled": True, "locals": True}}))
    assert requests.get(exporter + "/livez", params={"target": target}, timeout=30).status_code == 503
    deadline = time.monotonic() + 30
    while not [r for r in caplog.records if "forensics after /livez 503" in r.getMessage()]:
        assert time.monotonic() < deadline, "no capture was logged"
        time.sleep(0.1)
    (line,) = [r.getMessage() for r in caplog.records if "forensics after /livez 503" in r.getMessage()]
    assert "signature=" in line and "processes=1" in line, line
    assert COOKIE not in line and PROMPT not in line


def test_at_most_max_processes_are_read_and_the_rest_counted(tmp_path):
    script = tmp_path / "tree.py"
    script.write_text(textwrap.dedent('''
        import socket, subprocess, sys, time
        listener = socket.socket(); listener.bind(("127.0.0.1", 0)); listener.listen()
        kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(6)]
        print(listener.getsockname()[1], flush=True)
        time.sleep(600)
    '''))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        port = int(proc.stdout.readline())
        answer = capture(f"http://127.0.0.1:{port}", max_processes=3, py_spy=str(tmp_path / "absent"))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    assert len(answer["processes"]) == 3 and answer["not_read"] == 4, answer["errors"]
    assert any("4 more processes not read" in e for e in answer["errors"])


def slow_py_spy(tmp_path, body: str) -> str:
    tool = tmp_path / "py-spy"
    tool.write_text("#!/bin/sh\n" + body)
    tool.chmod(0o755)
    return str(tool)


@pytest.fixture
def many_children(tmp_path):
    script = tmp_path / "tree.py"
    script.write_text(textwrap.dedent('''
        import socket, subprocess, sys, time
        listener = socket.socket(); listener.bind(("127.0.0.1", 0)); listener.listen()
        kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(7)]
        print(listener.getsockname()[1], flush=True)
        time.sleep(600)
    '''))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, start_new_session=True)
    port = int(proc.stdout.readline())
    yield f"http://127.0.0.1:{port}"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def test_at_most_max_concurrent_py_spy_run_at_once(tmp_path, many_children):
    log = tmp_path / "runs"
    tool = slow_py_spy(tmp_path, f"echo start $$ >> {log}\nsleep 0.4\necho end $$ >> {log}\necho '[]'\n")
    answer = capture(many_children, py_spy=tool, max_concurrent=2, deadline=20)
    running, most = 0, 0
    for line in log.read_text().splitlines():
        running += 1 if line.startswith("start") else -1
        most = max(most, running)
    assert len(answer["processes"]) == 8 and most == 2, (most, answer["errors"])


def test_a_py_spy_output_past_the_byte_cap_is_cut_and_its_group_killed(tmp_path, many_children):
    marker = tmp_path / "grandchild"
    tool = slow_py_spy(tmp_path, f"(sleep 30; touch {marker}) &\necho $! >> {tmp_path / 'pids'}\n"
                                 "head -c 3000000 /dev/zero\nsleep 30\n")
    started = time.monotonic()
    answer = capture(many_children, py_spy=tool, max_output_bytes=65536, max_processes=2, deadline=20)
    assert time.monotonic() - started < 10
    assert all("more than 65536 bytes" in p["error"] for p in answer["processes"]), answer["errors"]
    gone_within((tmp_path / "pids").read_text().split(), 5)


def gone_within(pids: list[str], seconds: float) -> None:
    """Every one of ``pids`` dead (gone or a zombie) within ``seconds``: SIGKILL lands asynchronously."""
    deadline = time.monotonic() + seconds
    for pid in pids:
        while os.path.exists(f"/proc/{pid}") and _state(pid) not in ("Z", None):
            assert time.monotonic() < deadline, f"py-spy's child {pid} outlived the capture"
            time.sleep(0.05)


def _state(pid: str) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None


def test_nothing_is_left_running_after_the_deadline(tmp_path, many_children):
    tool = slow_py_spy(tmp_path, f"sleep 60 &\necho $! >> {tmp_path / 'pids'}\nwait\n")
    started = time.monotonic()
    answer = capture(many_children, py_spy=tool, deadline=1.5, max_concurrent=8)
    assert time.monotonic() - started < 5 and answer["cut_at_deadline"]
    gone_within((tmp_path / "pids").read_text().split(), 5)


def test_no_secret_of_a_command_line_reaches_the_answer(tmp_path):
    """``--api-key k1 k2``, a JSON-valued flag and ``user:pass@`` in a real server's argv."""
    script = tmp_path / "server.py"
    script.write_text(MUTE.replace("int(sys.argv[2])", "0"))
    secrets = ["first-key-0123456789", "second-key-0123456789", "json-held-secret-01234", "hunter2hunter2"]
    argv = [sys.executable, str(script), "127.0.0.1", "--api-key", secrets[0], secrets[1],
            "--engine-config", json.dumps({"hf_token": secrets[2], "dtype": "float32"}),
            "--upstream", f"http://admin:{secrets[3]}@db.internal:5432/x"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        port = int(proc.stdout.readline())
        answer = capture(f"http://127.0.0.1:{port}", py_spy=str(tmp_path / "absent"))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    (process,) = answer["processes"]
    assert "--api-key" in process["cmdline"] and "float32" in " ".join(process["cmdline"])
    assert not [s for s in secrets if s in json.dumps(answer)], process["cmdline"]
