"""The values of the simulator's /metrics page: the engine's stats, the HTTP instrumentator's, the process'.

``page.render`` walks the real page's families and asks a source for every sample; this is that
source, taken from one consistent copy of the simulator's state per scrape. It is built from the
values it reads (the engine, the HTTP stats, the model and start time), never from the ``Simulator``
that owns them: a child that reached back for its parent made an import circle.
"""
from __future__ import annotations

import gc
import os
import threading

from .engine import Engine, Histogram

# The instrumentator vLLM configures ignores these handlers.
EXCLUDED_HANDLERS = {"/metrics", "/health", "/load", "/ping", "/version", "/server_info"}
HTTP_LATENCY_BUCKETS = ["0.1", "0.5", "1.0", "+Inf"]


class HttpStats:
    """What prometheus-fastapi-instrumentator would have recorded."""

    def __init__(self, bounds_highr: list[float]):
        self.lock = threading.Lock()
        self.totals: dict[tuple, float] = {}
        self.created: dict[tuple, float] = {}
        self.in_size: dict[str, list] = {}
        self.out_size: dict[str, list] = {}
        self.lowr: dict[tuple, Histogram] = {}
        self.highr = Histogram(bounds_highr)

    def record(self, method, status, handler, in_size, out_size, seconds, now):
        if handler in EXCLUDED_HANDLERS:
            return
        with self.lock:
            key = (method, f"{str(status)[0]}xx", handler)
            self.totals[key] = self.totals.get(key, 0.0) + 1
            self.created.setdefault(("t",) + key, now)
            self.created.setdefault(("h", handler), now)
            self.created.setdefault(("l", method, handler), now)
            for store, size in ((self.in_size, in_size), (self.out_size, out_size)):
                entry = store.setdefault(handler, [0, 0.0])
                entry[0] += 1
                entry[1] += size
            hist = self.lowr.setdefault((method, handler),
                                        Histogram([float(b) for b in HTTP_LATENCY_BUCKETS]))
            hist.observe(seconds)
            self.highr.observe(seconds)


class PageSource:
    """Answers simulator_page.render() from one simulator state."""

    def __init__(self, eng: Engine, http: HttpStats, *, model: str, multiprocess: bool, start_time: float):
        with eng.lock:
            self.counters = dict(eng.counters)
            self.hists = {k: (h.cumulative(), h.count, h.sum) for k, h in eng.hists.items()}
            self.gauges = eng.gauges()
            self.sleep_level = eng.sleep_level
            self.seen = eng.seen_request
            self.created_at = eng.created
        self.http = http
        self.multiprocess = multiprocess
        self.model = model
        self.start_time = start_time

    def _labels(self, labels):
        return tuple(sorted((k, v) for k, v in labels.items() if k not in ("model_name", "engine")))

    def rows(self, fam):
        if fam.name.startswith("vllm:") and fam.type == "gauge" and not fam.rows:
            # multiprocess ("mostrecent") gauges have no sample until first set
            if not self.seen:
                return []
            base = {"engine": "0", "model_name": self.model}
            if fam.name == "vllm:num_requests_waiting_by_reason":
                return [{**base, "reason": r} for r in ("capacity", "deferred")]
            return [base]
        if not fam.dynamic:
            return None
        http = self.http
        with http.lock:
            if fam.name == "http_requests":
                return [dict(method=m, status=s, handler=h) for m, s, h in http.totals]  # first seen first
            if fam.name in ("http_request_size_bytes", "http_response_size_bytes"):
                return [dict(handler=h) for h in http.in_size]
            if fam.name == "http_request_duration_seconds":
                if not fam.buckets:
                    fam.buckets = list(HTTP_LATENCY_BUCKETS)
                return [dict(method=m, handler=h) for m, h in http.lowr]
        return []

    def value(self, fam, labels):
        name = fam.name
        if name in self.gauges:
            if self.multiprocess and not self.seen:
                return None
            return self.gauges[name]
        if name == "vllm:num_requests_waiting_by_reason":
            waiting = self.gauges["vllm:num_requests_waiting"]
            return waiting if labels.get("reason") == "capacity" else 0.0
        if name == "vllm:engine_sleep_state":
            state = labels.get("sleep_state")
            level = self.sleep_level
            return float({"awake": level == 0, "weights_offloaded": level == 1,
                          "discard_all": level == 2}.get(state, 0))
        if name.startswith("vllm:"):
            if fam.type == "gauge":
                return 1.0 if name.endswith("_info") else 0.0
            return self.counters.get((name, self._labels(labels)), 0.0)
        if name == "http_requests":
            return self.http.totals.get((labels["method"], labels["status"], labels["handler"]), 0.0)
        return process_value(self.start_time, name, labels)

    def hist(self, fam, labels):
        name = fam.name
        if name == "http_request_duration_highr_seconds":
            h = self.http.highr
            return h.cumulative(), h.count, h.sum
        if name in ("http_request_size_bytes", "http_response_size_bytes"):
            store = self.http.in_size if "request" in name else self.http.out_size
            count, total = store.get(labels.get("handler"), [0, 0.0])
            return count, total
        if name == "http_request_duration_seconds":
            h = self.http.lowr.get((labels["method"], labels["handler"]))
            if h is None:
                return [0] * len(fam.buckets), 0, 0.0
            return h.cumulative(), h.count, h.sum
        if name in self.hists:
            return self.hists[name]
        return [0] * len(fam.buckets), 0.0, 0.0

    def created(self, fam, labels):
        name = fam.name
        if name.startswith("http_"):
            c = self.http.created
            if name == "http_requests":
                return c.get(("t", labels["method"], labels["status"], labels["handler"]), self.created_at)
            if name == "http_request_duration_seconds":
                return c.get(("l", labels["method"], labels["handler"]), self.created_at)
            if name in ("http_request_size_bytes", "http_response_size_bytes"):
                return c.get(("h", labels["handler"]), self.created_at)
        return self.created_at



def process_value(start_time: float, name: str, labels: dict) -> float:
    if name == "process_start_time_seconds":
        return round(start_time, 2)
    if name.startswith("python_gc_"):
        stats = gc.get_stats()[int(labels.get("generation", 0))]
        key = {"python_gc_objects_collected": "collected",
               "python_gc_objects_uncollectable": "uncollectable",
               "python_gc_collections": "collections"}.get(name)
        return float(stats.get(key, 0))
    if name == "python_info":
        return 1.0
    if name == "process_cpu_seconds":
        t = os.times()
        return t.user + t.system
    if name == "process_open_fds":
        try:
            return float(len(os.listdir("/proc/self/fd")))
        except OSError:
            return 0.0
    if name == "process_max_fds":
        import resource
        return float(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    if name in ("process_virtual_memory_bytes", "process_resident_memory_bytes"):
        try:
            with open("/proc/self/statm") as f:
                vm, rss = f.read().split()[:2]
            page = os.sysconf("SC_PAGE_SIZE")
            return float(int(vm if "virtual" in name else rss) * page)
        except OSError:
            return 0.0
    return 0.0
