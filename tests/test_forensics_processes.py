"""Finding a server's processes from its URL, on a /proc tree built for each case."""
from __future__ import annotations

import os

from hangwatch.forensics.processes import find_server, process_name

HEAD = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def line(local: str, state: str, inode: int) -> str:
    return f"   0: {local} 00000000:0000 {state} 00000000:00000000 00:00000000 00000000     0        0 {inode} 1\n"


def fake_proc(root, processes, tcp="", tcp6="", netns="net:[1]"):
    """processes: pid -> (comm, ppid, state, [socket inodes], cmdline)."""
    for pid, (comm, ppid, state, sockets, cmdline) in processes.items():
        base = root / str(pid)
        (base / "fd").mkdir(parents=True)
        (base / "ns").mkdir()
        (base / "net").mkdir()
        (base / "stat").write_text(f"{pid} ({comm}) {state} {ppid} 1 1 0 -1\n")
        (base / "cmdline").write_bytes(b"\0".join(a.encode() for a in cmdline) + b"\0")
        os.symlink(netns, base / "ns" / "net")
        for n, inode in enumerate(sockets):
            os.symlink(f"socket:[{inode}]", base / "fd" / str(n + 3))
        (base / "net" / "tcp").write_text(HEAD + tcp)
        (base / "net" / "tcp6").write_text(HEAD + tcp6)
    os.symlink(str(next(iter(processes))), root / "self")
    return str(root)


TREE = {
    100: ("python3", 1, "S", [555, 556], ["python3", "-m", "vllm.entrypoints.openai.api_server", "--api-key", "K"]),
    200: ("VLLM::EngineCor", 100, "T", [], ["VLLM::EngineCore"]),
    300: ("VLLM::Worker_TP", 200, "S", [], ["VLLM::Worker_TP0"]),
    400: ("nginx", 1, "S", [777], ["nginx"]),
}


def test_the_listener_on_the_urls_port_and_its_descendants(tmp_path):
    proc = fake_proc(tmp_path, TREE, tcp=line("00000000:1F40", "0A", 555) + line("0100007F:0050", "0A", 777)
                     + line("0100007F:1F40", "01", 556))
    found = find_server("http://127.0.0.1:8000", proc)
    assert [(p.pid, p.name, p.state) for p in found.processes] == [
        (100, "python3", "S"), (200, "VLLM::EngineCore", "T"), (300, "VLLM::Worker_TP0", "S")]
    assert found.processes[0].cmdline[-1] == "<redacted>"  # --api-key's value


def test_an_ipv6_wildcard_listener_counts(tmp_path):
    proc = fake_proc(tmp_path, TREE, tcp6=line("00000000000000000000000000000000:1F40", "0A", 555))
    assert [p.pid for p in find_server("http://localhost:8000", proc).processes] == [100, 200, 300]


def test_a_listener_bound_to_another_address_is_not_the_server(tmp_path):
    proc = fake_proc(tmp_path, TREE, tcp=line("0A00000A:1F40", "0A", 555))  # 10.0.0.10:8000
    found = find_server("http://127.0.0.1:8000", proc)
    assert not found.processes and "no socket listening on port 8000" in found.errors[0]


def test_a_socket_nobody_readable_holds_says_so(tmp_path):
    proc = fake_proc(tmp_path, TREE, tcp=line("00000000:1F40", "0A", 999))
    found = find_server("http://127.0.0.1:8000", proc)
    assert not found.processes and "no process holding it could be read" in found.errors[0]


def test_names_prefer_a_process_title():
    assert process_name(1, "VLLM::EngineCor", ("VLLM::EngineCore",)) == "VLLM::EngineCore"
    assert process_name(1, "python3", ("/usr/bin/python3", "-m", "x")) == "python3"
