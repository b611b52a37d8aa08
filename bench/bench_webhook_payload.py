"""How big is Alertmanager's largest notification to the webhook? Measured, not guessed.

    python bench/bench_webhook_payload.py [--alerts 1000] [--save FILE]

How it measures: bench/README.md.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hangwatch.demo.receiver import Receiver  # noqa: E402
from harness.alert_payloads import alert_labels, annotations, generator_url, payload  # noqa: E402
from harness.ports import free_port  # noqa: E402


def measure(count: int, binary: str) -> bytes:
    capture = Receiver()
    work = pathlib.Path(tempfile.mkdtemp(prefix="hangwatch-am-"))
    config = {"route": {"receiver": "hook", "group_by": ["alertname"], "group_wait": "3s",
                        "group_interval": "1m", "repeat_interval": "1h"},
              "receivers": [{"name": "hook", "webhook_configs": [{"url": capture.url + "/alerts", "send_resolved": False}]}]}
    (work / "am.yml").write_text(json.dumps(config))
    port = free_port()
    process = subprocess.Popen([binary, f"--config.file={work / 'am.yml'}", f"--storage.path={work / 'data'}",
                                f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(base + "/-/ready", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise SystemExit("alertmanager did not become ready")
                time.sleep(0.2)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        alerts = [{"labels": alert_labels(i), "annotations": annotations(i), "startsAt": now,
                   "generatorURL": generator_url()} for i in range(count)]
        request = urllib.request.Request(base + "/api/v2/alerts", data=json.dumps(alerts).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        urllib.request.urlopen(request, timeout=30).read()
        deadline = time.monotonic() + 60
        while not capture.bodies("/alerts") or len(json.loads(capture.bodies("/alerts")[-1])["alerts"]) < count:
            if time.monotonic() > deadline:
                raise SystemExit(f"no notification with {count} alerts within 60 s "
                                 f"({[len(json.loads(b)['alerts']) for b in capture.bodies('/alerts')]})")
            time.sleep(0.2)
        return capture.bodies("/alerts")[-1]
    finally:
        process.terminate()
        process.wait(10)
        capture.close()
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alerts", type=int, default=1000)
    parser.add_argument("--alertmanager", default=shutil.which("prometheus-alertmanager") or "alertmanager")
    parser.add_argument("--save", help="write the captured notification here")
    args = parser.parse_args()
    body = measure(args.alerts, args.alertmanager)
    built = json.dumps(payload(args.alerts)).encode()
    real = json.loads(body)
    print(f"alertmanager notification: {len(real['alerts'])} alerts, {len(body):,} bytes "
          f"({len(body) / 1024 / 1024:.2f} MiB, {len(body) / len(real['alerts']):.0f} bytes per alert)")
    print(f"harness/alert_payloads.py for the same alerts: {len(built):,} bytes "
          f"({len(built) / len(body):.3f} of the real one)")
    if args.save:
        pathlib.Path(args.save).write_bytes(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
