"""The HTTP contract with Alertmanager: 401 before parsing, 400 for bad shapes, the token never logged."""
import json
import logging

import pytest

from .fakes import TOKEN, payload

BEARER = {"Authorization": f"Bearer {TOKEN}"}


@pytest.mark.parametrize("headers", [
    {},
    {"Authorization": "Bearer wrong"},
    {"Authorization": f"Bearer {TOKEN}x"},
    {"Authorization": f"Basic {TOKEN}"},
    {"Authorization": TOKEN},
    {"Authorization": "Bearer "},
])
def test_missing_or_wrong_token_is_401_and_nothing_happens(harness, headers):
    h = harness()
    response = h.post(payload(h.alert()), headers=headers)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    h.settle()
    assert h.restarter.gets == [] and h.restarter.restarts == [] and h.decisions() == []


def test_token_is_checked_before_the_body_is_parsed(harness):
    h = harness()
    response = h.client.post("/alerts", data=b"{not json", headers={"Authorization": "Bearer nope"})
    assert response.status_code == 401


@pytest.mark.parametrize("body, reason", [
    (b"{not json", "body is not JSON"),
    (b"[]", "body must be a JSON object"),
    (json.dumps({"alerts": []}).encode(), 'version must be "4"'),
    (json.dumps({"version": 4, "alerts": []}).encode(), 'version must be "4"'),
    (json.dumps({"version": "3", "alerts": []}).encode(), 'version must be "4"'),
    (json.dumps({"version": "4"}).encode(), "alerts: must be a list"),
    (json.dumps({"version": "4", "alerts": [1]}).encode(), "alerts[0]: must be an object"),
    (json.dumps({"version": "4", "alerts": [{"status": "firing!", "labels": {}}]}).encode(), "alerts[0].status"),
    (json.dumps({"version": "4", "alerts": [{"status": "firing", "labels": []}]}).encode(), "alerts[0].labels"),
    (json.dumps({"version": "4", "alerts": [{"status": "firing", "labels": {"target": 1}}]}).encode(),
     "alerts[0].labels: values must be strings"),
    (json.dumps({"version": "4", "alerts": [{"status": "firing", "labels": {}}]}).encode(), "alerts[0].startsAt"),
    (json.dumps({"version": "4", "alerts": [{"status": "firing", "labels": {}, "startsAt": "yesterday"}]}).encode(),
     "alerts[0].startsAt"),
    (b"[" * 100000 + b"]" * 100000, "body"),
])
def test_bad_payload_is_400_with_a_short_reason(harness, body, reason):
    h = harness()
    response = h.client.post("/alerts", data=body, headers=BEARER, content_type="application/json")
    assert response.status_code == 400
    assert reason in response.get_json()["error"]
    assert h.restarter.gets == []


def test_oversized_body_is_413(harness):
    h = harness()
    response = h.client.post("/alerts", data=b"x" * (5 * 1024 * 1024), headers=BEARER)
    assert response.status_code == 413


def test_empty_alert_list_is_fine(harness):
    h = harness()
    assert h.post(payload()).get_json() == {"alerts": 0, "queued": []}


def test_token_and_payloads_are_never_logged_at_info(harness, caplog):
    caplog.set_level(logging.DEBUG)
    h = harness()
    h.post(payload(h.alert(secret_annotation="PAYLOAD-MARKER")))
    h.post(payload(h.alert()), headers={"Authorization": "Bearer wrong-token-XYZ"})
    h.client.post("/circuit/vllm-a/reset", headers=BEARER)
    h.settle()
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert TOKEN not in text and "wrong-token-XYZ" not in text
    assert not [r for r in caplog.records if "PAYLOAD-MARKER" in r.getMessage() and r.levelno > logging.DEBUG]


def test_unknown_routes_and_methods_are_4xx(harness):
    h = harness()
    assert h.client.get("/alerts").status_code == 405
    assert h.client.get("/nope").status_code == 404


def test_every_decision_and_restart_series_exists_at_zero_from_the_start(harness):
    """rate() and Grafana annotations need a series before its first event."""
    from hangwatch.webhook.policy import REASONS
    metrics = harness().client.get("/metrics").text
    for reason in REASONS:
        action = "restart" if reason in ("hung", "startup_stuck") else "skip"
        assert f'hangwatch_webhook_decisions_total{{action="{action}",reason="{reason}"}} 0.0' in metrics
    for target in ("vllm-a", "vllm-b"):
        for result in ("ok", "failed"):
            assert f'hangwatch_webhook_restarts_total{{result="{result}",target="{target}"}} 0.0' in metrics


def test_a_separate_reset_token_is_the_only_key_to_the_circuit(harness):
    reset_token = "operator-reset-token-0123456789-abcdef"
    h = harness(reset_token=reset_token, cooldown="0s", budget={"restarts": 1, "window": "1h"})
    h.post(payload(h.alert()))
    h.settle()
    assert h.client.post("/circuit/vllm-a/reset", headers=BEARER).status_code == 401  # Alertmanager's token
    assert h.post(payload(h.alert()), headers={"Authorization": f"Bearer {reset_token}"}).status_code == 401
    assert 'hangwatch_webhook_circuit_open{target="vllm-a"} 1.0' in h.client.get("/metrics").text
    answer = h.client.post("/circuit/vllm-a/reset", headers={"Authorization": f"Bearer {reset_token}"})
    assert answer.status_code == 200 and answer.get_json() == {"target": "vllm-a", "reset": True}
    assert 'hangwatch_webhook_circuit_open{target="vllm-a"} 0.0' in h.client.get("/metrics").text


def test_without_a_reset_token_the_alert_token_resets(harness):
    h = harness()
    assert h.client.post("/circuit/vllm-a/reset", headers=BEARER).status_code == 200
