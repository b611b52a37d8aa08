"""A 40-line fake vLLM for the real-Docker tests: stdlib only, run inside a container.

Its mode is read from a file at every request, so a test can flip it while the container
runs: ``hung`` (one request running, counters frozen), ``busy`` (one running, counters
moving), ``idle`` (nothing running; the 1-token probe answers). ``process_start_time_seconds``
is this process's start, so a container restart shows as a new process.
``--ignore-sigterm``: a server that does not stop on SIGTERM, so ``docker restart`` waits its
whole stop timeout before SIGKILL (a slow restart, to stop the webhook in the middle of).
``--say LINE``: print LINE to stderr once it listens (a server's own words before it hung, for the
signature catalogue's tests).
``--never-listen``: a start-up that hangs before the port opens (CUDA-graph capture, NCCL init):
one log line, then nothing, port closed.
``--mirror FILE``: print every line of FILE, from its start and as it grows, to stderr (a stub
container whose Docker log is a server's log, for the chain test of the log catalogue).
Usage: python3 fake_backend.py PORT MODE_FILE [--ignore-sigterm] [--say LINE] [--never-listen] [--mirror FILE]
"""
import http.server
import json
import signal
import sys
import time

PORT, MODE_FILE = int(sys.argv[1]), sys.argv[2]
if "--ignore-sigterm" in sys.argv[3:]:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
STARTED = time.time()
PAGE = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="tiny"}} {running}
vllm:num_requests_waiting{{engine="0",model_name="tiny"}} 0.0
vllm:iteration_tokens_total_count{{engine="0",model_name="tiny"}} {steps}
vllm:generation_tokens_total{{engine="0",model_name="tiny"}} {steps}
process_start_time_seconds {started}
"""


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        mode = open(MODE_FILE).read().strip()
        if self.path == "/metrics":
            steps = 100.0 if mode == "hung" else float(int((time.time() - STARTED) * 50))
            self.reply(PAGE.format(running=0.0 if mode == "idle" else 1.0, steps=steps, started=STARTED), "text/plain")
        elif self.path == "/v1/models":
            self.reply(json.dumps({"object": "list", "data": [{"id": "tiny", "object": "model"}]}))
        else:
            self.reply('{"error": "not found"}', code=404)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.reply(json.dumps({"choices": [{"text": "!"}]}))

    def reply(self, body, content_type="application/json", code=200):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        sys.stderr.write("fake-backend " + (args[0] % args[1:]) + "\n")


if "--never-listen" in sys.argv[3:]:
    print("fake backend: capturing CUDA graphs (never finishes)", flush=True)
    signal.pause() if hasattr(signal, "pause") else time.sleep(10 ** 9)
def mirror(path):
    import os
    while not os.path.exists(path):
        time.sleep(0.2)
    partial = ""
    with open(path, errors="replace") as handle:
        while True:
            chunk = handle.readline()
            if not chunk:
                time.sleep(0.2)
                continue
            partial += chunk
            if partial.endswith("\n"):
                sys.stderr.write(partial)
                sys.stderr.flush()
                partial = ""


if "--mirror" in sys.argv[3:]:
    import threading
    threading.Thread(target=mirror, args=(sys.argv[sys.argv.index("--mirror") + 1],), daemon=True).start()
server = http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
print(f"fake backend on 127.0.0.1:{PORT}, started {STARTED}", flush=True)
if "--say" in sys.argv[3:]:
    print(sys.argv[sys.argv.index("--say") + 1], file=sys.stderr, flush=True)
server.serve_forever()
