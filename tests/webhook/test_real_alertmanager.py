"""End to end: a real Alertmanager with the shipped routes → ``hangwatch webhook`` (a real
process) → a real container, and the same notification to people.

Alertmanager runs ``examples/alertmanager.yml`` with only addresses and timings replaced: the
webhook receiver sends with ``http_config.authorization.credentials_file`` to the real
webhook, the people receiver (e-mail in the example) to a small recorder here. One firing
``HangwatchBackendHung`` must reach both: the container is restarted exactly once, the
re-sends every 2 s (``repeat_interval``) are skipped, the resolved notification is only
counted, and a person has been told.
"""
import pytest
import requests
import yaml

from hangwatch.demo.processes import start_server
from hangwatch.demo.receiver import Receiver
from tests.support.require import require_binary

from .real_parts import (
    REAL_TOKEN,
    REPO,
    WebhookProcess,
    ledger,
    now_rfc3339,
    wait_for,
    webhook_config,
)


def example_config(webhook_url: str, token_file, people_url: str) -> dict:
    """examples/alertmanager.yml with test addresses and a 2 s re-send, its routes untouched."""
    config = yaml.safe_load((REPO / "examples" / "alertmanager.yml").read_text())
    config.pop("global", None)  # the example's mail relay
    config["route"].update({"group_wait": "0s", "group_interval": "1s", "repeat_interval": "2s"})
    for route in config["route"]["routes"]:
        route.update({key: value for key, value in (("group_interval", "1s"), ("repeat_interval", "2s"))
                      if key in route})
    for receiver in config["receivers"]:
        if receiver["name"] == "hangwatch-webhook":
            hook = receiver["webhook_configs"][0]
            hook["url"] = webhook_url + "/alerts"
            hook["send_resolved"] = True  # the webhook must count a resolved alert and do nothing
            hook["http_config"]["authorization"]["credentials_file"] = str(token_file)
        else:
            receiver.pop("email_configs", None)
            receiver["webhook_configs"] = [{"url": people_url, "send_resolved": True}]
    return config


@pytest.fixture
def alertmanager(tmp_path):
    """start(config) → the URL of a real Alertmanager on port 0, ready when it answers /-/ready
    itself (on a port guessed free, whoever took it first could answer for it)."""
    binary = require_binary("prometheus-alertmanager")
    started = []

    def start(config: dict) -> str:
        path = tmp_path / "alertmanager.yml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        process = start_server("alertmanager", [binary, f"--config.file={path}", f"--storage.path={tmp_path / 'am-data'}",
                                                "--web.listen-address=127.0.0.1:0", "--cluster.listen-address="],
                               tmp_path / "alertmanager.log", "/-/ready", deadline=20)
        started.append(process)
        return process.url

    yield start
    for process in started:
        process.stop()


def counted(webhook, reason: str) -> float:
    prefix = f'hangwatch_webhook_decisions_total{{action="skip",reason="{reason}"}} '
    text = requests.get(webhook.url + "/metrics", timeout=5).text
    return next(float(line[len(prefix):]) for line in text.splitlines() if line.startswith(prefix))


@pytest.mark.real
def test_one_hang_notification_restarts_the_container_once_and_reaches_people(tmp_path, backend, alertmanager):
    hung = backend("hung")
    webhook = WebhookProcess(webhook_config(tmp_path, [hung]), tmp_path / "webhook.log")
    people = Receiver()
    try:
        am = alertmanager(example_config(webhook.url, tmp_path / "token", people.url + "/people"))
        labels = {"alertname": "HangwatchBackendHung", "severity": "critical", "action": "restart",
                  "target": hung.name, "container": hung.name}
        posted = requests.post(am + "/api/v2/alerts", json=[{"labels": labels, "startsAt": now_rfc3339()}], timeout=5)
        assert posted.status_code == 200, posted.text
        def decided():
            return [d for d in ledger(tmp_path / "state") if d["event"] == "decision"]
        wait_for(lambda: any(d["reason"] == "hung" for d in decided()), 60, "the webhook to restart", 0.2)
        wait_for(lambda: people.alerts("/people", "HangwatchBackendHung"), 30, "the people receiver to hear of the hang", 0.2)
        assert people.alerts("/people", "HangwatchBackendHung")[0][1]["labels"]["target"] == hung.name
        # Alertmanager keeps re-sending the still-active alert every 2 s; each re-send must be refused.
        # Counted after the restart's own line: re-sends that came while the re-check ran are refused
        # as duplicates before it, and counting those could end this wait with no re-send tested
        # against the restarted container.
        def refused_after_restart():
            made = decided()
            restart = next(i for i, d in enumerate(made) if d["reason"] == "hung")
            return [d for d in made[restart + 1:] if d["reason"] in ("already_restarted", "duplicate")]
        wait_for(lambda: len(refused_after_restart()) >= 2, 30,
                 "two of Alertmanager's re-sends refused after the restart", 0.2)
        assert hung.restarts() == 1
        # An operator (or Prometheus) resolves it: the resolved notification is only counted.
        requests.post(am + "/api/v2/alerts", json=[{"labels": labels, "startsAt": now_rfc3339(),
                                                    "endsAt": now_rfc3339()}], timeout=5)
        wait_for(lambda: counted(webhook, "resolved") >= 1, 30, "the resolved notification", 0.2)
        assert webhook.idle()
        assert hung.restarts() == 1
        assert {d["reason"] for d in decided()} <= {"hung", "already_restarted", "duplicate"}
        assert REAL_TOKEN not in webhook.log()
        text = requests.get(webhook.url + "/metrics", timeout=5).text
        assert 'hangwatch_webhook_requests_total{code="401"}' not in text
    finally:
        webhook.stop()
        people.close()
    assert webhook.process.returncode == 0
