"""Regenerate the real vLLM captures in ``tests/data/vllm-0.32/``.

    python3 -m tests.real.capture [--out tests/data/vllm-0.32] [--no-multiprocess]

Starts a real vLLM (CPU, tiny random Llama, see ``vllm_server.py``), records /metrics pages in
known states plus a few JSON answers, and writes ``measurements.json`` with what moved when.
Takes ≈ 3–4 minutes (two server start-ups). Needs the venv of ``.ci/setup-vllm.sh``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import requests

from harness.vllm_server import HERE, LONG_PROMPT_TOKENS, MODEL_NAME, VLLMServer, descendants, proc_title, venv_path

OUT_DEFAULT = os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "data", "vllm-0.32")


def moved(a, b, prefix="vllm:"):
    """Families (sample names) whose value differs between two pages."""
    names = set()
    for key in set(a.series(prefix)) | set(b.series(prefix)):
        if a.samples.get(key) != b.samples.get(key):
            names.add(key[0])
    return sorted(names)


def timed_metrics(server):
    t0 = time.monotonic()
    page = server.metrics(timeout=30)
    return page, time.monotonic() - t0


def write(out, name, text):
    with open(os.path.join(out, name), "w") as f:
        f.write(text)
    print(f"  wrote {name} ({len(text)} bytes)", flush=True)


def families(page):
    return sorted((name, typ) for name, typ in page.types.items() if name.startswith("vllm:"))


def capture_single(out, facts):
    with VLLMServer() as server:
        server.start()
        facts["start_up_s"] = round(server.ready_after_s, 1)
        facts["server_argv"] = [a if a != server.model_dir else "MODEL_DIR" for a in server.argv()]
        facts["server_argv"][0] = "<venv>/bin/python"
        facts["processes"] = sorted({proc_title(p).split()[0] if proc_title(p).startswith("VLLM")
                                     else "resource_tracker" for p in descendants(server.proc.pid)})
        print(f"ready after {server.ready_after_s:.1f} s on {server.url}", flush=True)

        # -- idle: nothing sent yet except /health --------------------------------------------
        idle, latency = timed_metrics(server)
        write(out, "idle.prom", idle.text)
        facts["idle"] = {"metrics_latency_s": round(latency, 4), "bytes": len(idle.text),
                         "vllm_families": families(idle),
                         "engine_sleep_state_present": "vllm:engine_sleep_state" in idle.types}
        health = requests.get(f"{server.url}/health", timeout=5)
        write(out, "health.json", json.dumps({"status": health.status_code,
                                              "body": health.text}, indent=2) + "\n")
        write(out, "version.json", json.dumps(requests.get(f"{server.url}/version",
                                                           timeout=5).json(), indent=2) + "\n")
        write(out, "models.json", json.dumps(requests.get(f"{server.url}/v1/models",
                                                          timeout=5).json(), indent=2) + "\n")
        before = server.metrics()
        completion = server.complete("hello world", max_tokens=1)
        write(out, "completion-max-tokens-1.json", json.dumps(completion, indent=2) + "\n")
        after = server.metrics()
        facts["probe_1_token"] = {"moved": moved(before, after),
                                  "request_success_total": {
                                      json.dumps(dict(k[1])): v for k, v in after.samples.items()
                                      if k[0] == "vllm:request_success_total"}}

        # -- busy: 4 concurrent long generations ----------------------------------------------
        with server.generations(4, max_tokens=20000, deadline_s=90) as load:
            server.wait_until(lambda p: p.value("vllm:num_requests_running") == 4, 30,
                              interval=0.2, what="4 running")
            pages, latencies = [], []
            for _ in range(4):
                page, lat = timed_metrics(server)
                pages.append(page)
                latencies.append(round(lat, 3))
                time.sleep(1)
            write(out, "busy.prom", pages[-1].text)
            it = [p.value("vllm:iteration_tokens_total_count") for p in pages]
            gen = [p.value("vllm:generation_tokens_total") for p in pages]
            dt = pages[-1].at - pages[0].at
            facts["busy"] = {
                "requests": 4, "max_tokens": 20000, "ignore_eos": True,
                "running": [p.value("vllm:num_requests_running") for p in pages],
                "waiting": [p.value("vllm:num_requests_waiting") for p in pages],
                "metrics_latency_s": latencies,
                "iterations_per_s": round((it[-1] - it[0]) / dt, 1),
                "generation_tokens_per_s": round((gen[-1] - gen[0]) / dt, 1),
                "moved_between_readings": [moved(a, b) for a, b in zip(pages, pages[1:])],
                "client_errors": load.errors(),
            }

            # -- frozen: SIGSTOP the EngineCore with the 4 requests in flight -----------------
            pid = server.freeze()
            f1, lat1 = timed_metrics(server)
            time.sleep(2.5)
            f2, lat2 = timed_metrics(server)
            h = requests.get(f"{server.url}/health", timeout=5)
            write(out, "frozen.prom", f2.text)
            server.thaw()
            resumed = server.wait_until(
                lambda p: p.value("vllm:iteration_tokens_total_count")
                > f2.value("vllm:iteration_tokens_total_count"), 30, what="progress after thaw")
            facts["frozen"] = {
                "engine_pid_title": proc_title(pid),
                "metrics_latency_s": [round(lat1, 4), round(lat2, 4)],
                "health_status": h.status_code,
                "seconds_between_readings": round(f2.at - f1.at, 2),
                "running": f2.value("vllm:num_requests_running"),
                "changed_vllm_series": moved(f1, f2),
                "changed_any_series": sorted({k[0] for k in set(f1.samples) | set(f2.samples)
                                              if f1.samples.get(k) != f2.samples.get(k)}),
                "moved_after_thaw": moved(f2, resumed),
            }
            load.cancel()
        server.wait_idle(60)

        # -- prefill: one long prompt, chunked (512-token chunks) ----------------------------
        g = server.long_prompt(LONG_PROMPT_TOKENS, max_tokens=8)
        pages = []
        while g.first_token_at is None and g.running:
            pages.append(server.metrics())
            time.sleep(1)
        g.join(60)
        during = [p for p in pages if p.at < g.first_token_at
                  and p.value("vllm:num_requests_running") == 1]
        if len(during) >= 2:
            write(out, "prefill.prom", during[len(during) // 2].text)
        facts["prefill"] = {
            "prompt_tokens_sent": LONG_PROMPT_TOKENS,
            "usage": g.usage,
            "tokenize_count": server.tokenize(g.prompt),
            "first_token_after_s": round(g.first_token_at - g.started_at, 2),
            "readings_during_prefill": len(during),
            "readings": [{"t_s": round(p.at - g.started_at, 2),
                          "running": p.value("vllm:num_requests_running"),
                          "waiting": p.value("vllm:num_requests_waiting"),
                          "kv_cache_usage_perc": p.value("vllm:kv_cache_usage_perc"),
                          "prefix_cache_queries_total": p.value("vllm:prefix_cache_queries_total"),
                          "prompt_tokens_total": p.value("vllm:prompt_tokens_total"),
                          "generation_tokens_total": p.value("vllm:generation_tokens_total"),
                          "iteration_tokens_total_count":
                              p.value("vllm:iteration_tokens_total_count")} for p in pages],
            "moved_between_readings_during_prefill": [moved(a, b)
                                                      for a, b in zip(during, during[1:])],
        }
        final = server.metrics()
        facts["request_success_total_samples"] = {
            json.dumps(dict(k[1])): v for k, v in final.samples.items()
            if k[0] == "vllm:request_success_total"}


def capture_multiprocess(out, facts):
    launcher = [os.path.join(venv_path(), "bin", "python"), os.path.join(HERE, "vllm_cli.py"),
                "serve"]
    with VLLMServer(command=launcher, extra_args=["--api-server-count", "2"]) as server:
        server.start()
        print(f"multiprocess ready after {server.ready_after_s:.1f} s", flush=True)
        page = server.metrics()
        write(out, "multiprocess-start.prom", page.text)
        empty = sorted(n for n, t in page.types.items() if n.startswith("vllm:")
                       and not any(k[0].startswith(n) for k in page.samples))
        server.complete("hello world", max_tokens=1)
        later = server.metrics()
        facts["multiprocess"] = {
            "start_up_s": round(server.ready_after_s, 1),
            "processes": sorted({proc_title(p).split()[0] for p in descendants(server.proc.pid)
                                 if proc_title(p).startswith("VLLM")}),
            "bytes": len(page.text),
            "has_process_series": any(k[0].startswith("process_") for k in page.samples),
            "has_python_series": any(k[0].startswith("python_") for k in page.samples),
            "has_created_series": any(k[0].endswith("_created") for k in page.samples),
            "vllm_families_without_samples_at_start": empty,
            "after_one_request_running": later.value("vllm:num_requests_running"),
            "after_one_request_families_without_samples": sorted(
                n for n, t in later.types.items() if n.startswith("vllm:")
                and not any(k[0].startswith(n) for k in later.samples)),
        }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--out", default=OUT_DEFAULT)
    ap.add_argument("--no-multiprocess", action="store_true")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    facts = {"captured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
             "model": MODEL_NAME}
    capture_single(args.out, facts)
    if not args.no_multiprocess:
        capture_multiprocess(args.out, facts)
    write(args.out, "measurements.json", json.dumps(facts, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
