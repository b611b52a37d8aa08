"""Ten thousand generated payloads against the app: only 2xx/4xx, and not one restart.

The fake re-checker always says "hung", so the only thing between a payload and a restart
is the webhook's own triage: the payloads are built never to name a configured target with
its configured container in a firing alert with a configured alertname. The app, the fake
Docker client and the state_dir are shared across examples (one app per test, like a
long-running webhook being hammered); the Docker client records every call.
"""
import json
import os
import pathlib
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import Harness
from .fakes import TOKEN, iso

PAYLOADS = 10_000
CONFIGURED = {"vllm-a": "vllm-a", "vllm-b": "vllm-b"}
# Hypothesis draws are the slow part (≈0.3 ms each), so most choices are one draw from a pool
# of hostile values; free text is mixed in for the rest.
HOSTILE = ["", " ", "x" * 100_000, "\u202e\u0000" * 5_000, "vllm-a" * 10_000, "\x00\n\r" * 1000, "vllm-a\n",
           "vllm-a ", "VLLM-A", "../../etc/passwd", "postgres", "vllm-c", "alertname=X action=restart",
           "\ud83d\udd25", "\ufeffvllm-a", "HangwatchBackendHung", "restart", "firing", "resolved", "vllm-a",
           "vllm-b", "2026-11-30T03:00:00Z"]
text = st.one_of(st.sampled_from(HOSTILE), st.text(max_size=20))
JUNK = [None, True, False, 0, -1, 2 ** 70, 1.5, -1e308, [], {}, ["vllm-a"], {"target": "vllm-a"}, [[[[]]]],
        {"labels": {"target": 1}}, "4", 4, "x" * 100_000]
junk = st.sampled_from(JUNK)
value = st.one_of(text, junk)
times = st.sampled_from(["2026-11-30T03:00:00.123456789Z", iso(4_000_000_000), "2026-13-45T99:99:99Z",
                         "0001-01-01T00:00:00Z", "yesterday", "", None, 1764471600, "2026-11-30T03:00:00+25:00"])
header_text = st.text(st.characters(min_codepoint=32, max_codepoint=255, blacklist_characters="\x7f"), max_size=40)
wrong_auth = st.one_of(header_text, header_text.map(lambda t: "Bearer " + t),
                       st.sampled_from(["Bearer " + TOKEN[:-1], "Bearer " + TOKEN + "x", "Basic " + TOKEN, TOKEN,
                                        "bearer", "Bearer", "Bearer  " + TOKEN.upper()]))
KEYS = ["alertname", "target", "container", "action", "severity", "instance", "", "x" * 1000, "\u00e9"]


@st.composite
def alerts(draw):
    shape = draw(st.integers(0, 31))
    if shape == 0:
        return draw(value)  # not an object at all
    labels = draw(st.dictionaries(st.sampled_from(KEYS), st.one_of(text, text, text, junk), max_size=5))
    alert = {"status": draw(st.sampled_from(["firing", "resolved", "firing", "FIRING", "", None, 1])),
             "labels": labels if shape != 1 else draw(value),
             "startsAt": draw(times)}
    if shape == 2:
        del alert[draw(st.sampled_from(["status", "labels", "startsAt"]))]
    return alert


def actionable(alert) -> bool:
    """Would a correct webhook act on this alert? (Then it must not be generated.)"""
    if not isinstance(alert, dict) or alert.get("status") != "firing" or not isinstance(alert.get("labels"), dict):
        return False
    labels = alert["labels"]
    return (labels.get("alertname") == "HangwatchBackendHung" and labels.get("target") in CONFIGURED
            and labels.get("container") == CONFIGURED[labels["target"]])


@st.composite
def bodies(draw):
    kind = draw(st.integers(0, 15))
    if kind == 0:
        return draw(st.binary(max_size=100))
    if kind == 1:
        return json.dumps(draw(value)).encode()
    body = {"version": draw(st.sampled_from(["4"] * 6 + ["3", 4, "", None, "4 "])),
            "alerts": draw(value) if kind == 2 else [a for a in draw(st.lists(alerts(), max_size=3)) if not actionable(a)]}
    if kind == 3:
        body[draw(st.sampled_from(["status", "receiver", "groupLabels", "commonLabels", "truncatedAlerts"]))] = draw(value)
    return json.dumps(body).encode()


@pytest.fixture
def fast_state_dir(tmp_path):
    """tmpfs if there is one: this test is about triage, and 30,000 fsyncs on disk take minutes."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        path = tempfile.mkdtemp(prefix="hangwatch-fuzz-", dir="/dev/shm")
        yield pathlib.Path(path)
        shutil.rmtree(path, ignore_errors=True)
    else:
        yield tmp_path


def test_ten_thousand_hostile_payloads_cause_no_5xx_and_no_restart(fast_state_dir):
    h = Harness(fast_state_dir / "state")
    codes = {}
    authorized = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}

    auth_header = st.one_of(st.just(authorized), st.just(authorized), st.just(authorized),
                            st.fixed_dictionaries({"Authorization": wrong_auth}))

    # Three payloads per example: Hypothesis' per-example overhead is the slow part.
    @settings(max_examples=PAYLOADS // 3 + 1, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(requests=st.lists(st.tuples(bodies(), auth_header), min_size=3, max_size=3))
    def hammer(requests):
        for body, header in requests:
            response = h.client.post("/alerts", data=body, headers=header)
            codes[response.status_code] = codes.get(response.status_code, 0) + 1
            assert 200 <= response.status_code < 500, response.get_data(as_text=True)[:300]

    try:
        hammer()
        h.settle(30)
    finally:
        h.state.close()
    assert sum(codes.values()) >= PAYLOADS
    assert h.restarter.restarts == [] and h.rechecker.calls == []
    assert {200, 400, 401} <= set(codes), codes
