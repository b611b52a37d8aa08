"""A fake dcgm-exporter: one node's GPUs and their Xid series, for the GPU-fault tests and demos.

HangwatchGPUFault (``hangwatch rules --gpu-labels``) joins hung backends to dcgm-exporter's Xid
series; the tests need a Prometheus scraping those series without a GPU. This serves the page
dcgm-exporter serves from its default counters (names, types and help texts as its
``etc/default-counters.csv`` and its Xid count have them): ``DCGM_FI_DEV_XID_ERRORS`` (the last
Xid, a gauge, ``err_code``/``err_msg`` labels) and ``DCGM_EXP_XID_ERRORS_COUNT`` (Xid errors in the
exporter's window, one series per ``xid``), beside a utilisation gauge. ``set_xid(48)`` puts a fault
on GPU 0; ``set_xid(0)`` clears it (the count series go away, the gauge reads 0).

    gpu = DcgmSimulator(hostname="gpu-1").start()   # port 0: any free loopback port
    gpu.set_xid(48)
    requests.get(gpu.url + "/metrics")
    gpu.stop()
"""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

XID_TEXT = {48: "Double Bit ECC Error", 63: "ECC page retirement or row remapping recording event",
            79: "GPU has fallen off the bus", 94: "Contained ECC error", 95: "Uncontained ECC error"}


class DcgmSimulator:
    def __init__(self, hostname: str = "gpu-1", gpus: int = 2, host: str = "127.0.0.1"):
        self.hostname = hostname
        self.gpus = gpus
        self.host = host
        self._xid = {gpu: 0 for gpu in range(gpus)}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def set_xid(self, code: int, gpu: int = 0) -> None:
        with self._lock:
            self._xid[gpu] = code

    def page(self) -> str:
        with self._lock:
            xids = dict(self._xid)
        lines = ["# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).", "# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
        lines += [f"DCGM_FI_DEV_GPU_UTIL{{{self._labels(gpu)}}} 96" for gpu in xids]
        lines += ["# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.",
                  "# TYPE DCGM_FI_DEV_XID_ERRORS gauge"]
        for gpu, code in xids.items():
            text = XID_TEXT.get(code, "No Error" if code == 0 else "Unknown Error")
            lines.append(f'DCGM_FI_DEV_XID_ERRORS{{{self._labels(gpu)},err_code="{code}",err_msg="{text}"}} {code}')
        lines += ["# HELP DCGM_EXP_XID_ERRORS_COUNT Count of XID Errors within user-specified time window "
                  "(see xid-count-window-size param).", "# TYPE DCGM_EXP_XID_ERRORS_COUNT gauge"]
        lines += [f'DCGM_EXP_XID_ERRORS_COUNT{{{self._labels(gpu)},window_size_in_ms="300000",xid="{code}"}} 1'
                  for gpu, code in xids.items() if code]
        return "\n".join(lines) + "\n"

    def _labels(self, gpu: int) -> str:
        return (f'gpu="{gpu}",UUID="GPU-{self.hostname}-{gpu:04d}",pci_bus_id="00000000:{0x3b + gpu:02X}:00.0",'
                f'device="nvidia{gpu}",modelName="NVIDIA H100 80GB HBM3",hostname="{self.hostname}",'
                'DCGM_FI_SYSTEM_DRIVER_VERSION="580.95.05"')

    def start(self, port: int = 0) -> "DcgmSimulator":
        simulator = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = simulator.page().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer((self.host, port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="dcgm-simulator")
        self._thread.start()
        return self

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
