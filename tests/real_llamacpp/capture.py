"""Capture real llama-server /metrics pages and timings into tests/data/llamacpp/.

    python -m tests.real_llamacpp.capture        # after .ci/setup-llamacpp.sh

Starts its own server (the same flags as the test fixture), captures the pages the unit
tests read, measures the facts the engine table relies on, writes measurements.json, and
stops the server by PID. Review the diff like code.
"""
from __future__ import annotations

import json
import pathlib
import time

from tests.real_llamacpp.llamacpp_server import LlamaServer, metric

OUT = pathlib.Path(__file__).resolve().parents[1] / "data" / "llamacpp"
PROCESSING, DEFERRED, DECODE = "llamacpp:requests_processing", "llamacpp:requests_deferred", "llamacpp:n_decode_total"


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    server = LlamaServer()
    facts: dict = {}
    try:
        started = time.monotonic()
        server.start()
        facts["startup_seconds"] = round(time.monotonic() - started, 2)
        server.completions(1, n_predict=8).wait(60)  # warm: counters are non-zero from here on
        (OUT / "idle.prom").write_text(server.wait_idle())

        # One request alone: tokens/s.
        t0 = time.monotonic()
        server.completions(1, n_predict=200).wait(120)
        facts["one_request_tokens_per_second"] = round(200 / (time.monotonic() - t0), 1)

        # Four busy slots and two deferred.
        load = server.completions(6, n_predict=300)
        page = server.wait_until(lambda t: metric(t, PROCESSING) == 4 and metric(t, DEFERRED) == 2, 60, "4+2")
        (OUT / "busy-4-slots-2-deferred.prom").write_text(page)
        time.sleep(2.0)
        later = server.metrics_text()
        facts["n_decode_per_second_4_slots"] = round((metric(later, DECODE) - metric(page, DECODE)) / 2.0, 1)
        t0 = time.monotonic()
        load.wait(300)
        facts["six_requests_of_300_tokens_seconds_after_capture"] = round(time.monotonic() - t0, 1)
        server.wait_idle()

        # One long prompt: one 4096-token batch.
        prompt = server.prompt_of(3900)
        load = server.completions(1, n_predict=2, prompt=prompt)
        page = server.wait_until(lambda t: metric(t, PROCESSING) == 1, 30, "long prompt")
        seen = time.monotonic()
        (OUT / "long-prompt-one-batch.prom").write_text(page)
        while metric(server.metrics_text(), DECODE) == metric(page, DECODE):
            time.sleep(0.1)
        facts["long_prompt_3900_tokens_n_decode_flat_at_least_seconds"] = round(time.monotonic() - seen, 1)
        load.wait(300)
        facts["long_prompt_prompt_tokens_total_delta"] = metric(server.metrics_text(), "llamacpp:prompt_tokens_total") \
            - metric(page, "llamacpp:prompt_tokens_total")
    finally:
        server.stop()
    (OUT / "measurements.json").write_text(json.dumps(facts, indent=2) + "\n")
    print(json.dumps(facts, indent=2))


if __name__ == "__main__":
    main()
