"""``hangwatch rules`` and ``hangwatch dashboard``: write the rules and the dashboard a pip user needs.

The flags are defined here and wired into the one command line by ``hangwatch/cli.py``.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from hangwatch.settings import ConfigError, duration

from . import dashboard
from . import gpu as gpu_rules
from .render import DEFAULT_SCRAPE, RUNBOOK_URL, Settings, format_duration, parse_interval, write


def _interval(text: str) -> float:
    try:
        return parse_interval(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[-1]) from None


def add_rules_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scrape-interval", type=_interval, default=DEFAULT_SCRAPE,
                        help="the scrape_interval of the hangwatch job, e.g. 5s (default 15s)")
    parser.add_argument("--job", default="hangwatch",
                        help="the job that scrapes the exporter's /probe (a regex; default hangwatch)")
    parser.add_argument("--exporter-job", default="hangwatch_exporter",
                        help="the job that scrapes the exporter's own /metrics (default hangwatch_exporter)")
    parser.add_argument("--webhook-job", default="hangwatch_webhook",
                        help="the job that scrapes the webhook's own /metrics (default hangwatch_webhook)")
    parser.add_argument("--runbook-url", default=RUNBOOK_URL, metavar="URL",
                        help="the runbook the alerts link to (default: the project's docs/runbook.md)")
    parser.add_argument("--kubernetes", action="store_true",
                        help="write PrometheusRule objects (hangwatch-rules.yaml) and the settings of the "
                             "hangwatch-sidecar Component (hangwatch-settings.yaml) instead of rule files")
    parser.add_argument("--release", metavar="NAME",
                        help="with --kubernetes: the release label your Prometheus selects rules and monitors by "
                             "(kube-prometheus-stack: its Helm release name)")
    parser.add_argument("--vllm-port", type=int, default=8000, metavar="PORT",
                        help="with --kubernetes: vLLM's own port in the pod (llm-d decode: 8200; default 8000)")
    parser.add_argument("--prometheus-namespace", default="monitoring", metavar="NAMESPACE",
                        help="with --kubernetes: the namespace Prometheus runs in (default monitoring)")
    parser.add_argument("--prometheus-pod-name", default="prometheus", metavar="NAME",
                        help="with --kubernetes: the app.kubernetes.io/name label of Prometheus' pods, the only pods "
                             "let in to the sidecar's port (default prometheus: prometheus-operator's)")
    parser.add_argument("--stall-window", type=_stall_window, action="append", default=None,
                        metavar="[ENGINE=]DURATION",
                        help="the stall window of every engine (e.g. 10m), or of one (vllm=10m); repeatable "
                             "(default: each engine's own, see docs/engines.md)")
    parser.add_argument("--gpu-labels", metavar="LABEL[,LABEL]",
                        help="also write hangwatch-gpu.yml: HangwatchGPUFault joins hung or stalled backends to "
                             "dcgm-exporter's Xid series on these labels, which both scrape configs set "
                             "(e.g. node; docs/gpu.md)")
    parser.add_argument("--gpu-window", default=gpu_rules.DEFAULT_WINDOW, type=_gpu_window, metavar="DURATION",
                        help="with --gpu-labels: how recent an Xid counts (default 15m)")
    parser.add_argument("--gpu-xid-series", action="append", default=None, metavar="NAME",
                        help="with --gpu-labels: another Xid series name to read (repeatable; "
                             "DCGM_FI_DEV_XID_ERRORS and DCGM_EXP_XID_ERRORS_COUNT are always read)")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR", help="directory for the rule files")


def _gpu_window(text: str) -> float:
    try:
        return gpu_rules.window(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[-1]) from None


def _stall_window(text: str) -> tuple[str, float]:
    engine, _, value = text.rpartition("=")
    try:
        return engine or "*", duration(value, "--stall-window", low=1.0, high=7 * 86400.0)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[-1]) from None


def add_dashboard_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runbook-url", default=RUNBOOK_URL, metavar="URL",
                        help="the runbook the panels link to (default: the project's docs/runbook.md)")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR", help="directory for hangwatch.json")


def run_rules(args) -> int:
    try:
        settings = Settings(scrape_interval=args.scrape_interval, job=args.job, exporter_job=args.exporter_job,
                            webhook_job=args.webhook_job, runbook_url=args.runbook_url,
                            stall_windows=tuple(args.stall_window or ()))
    except ConfigError as exc:
        sys.stderr.write(f"hangwatch: {exc}\n")
        return 64
    try:
        if args.gpu_labels is not None:
            if args.kubernetes:
                raise ConfigError("--gpu-labels: not with --kubernetes yet (write the rule files and load them)")
            settings = dataclasses.replace(settings, gpu=(
                gpu_rules.labels(args.gpu_labels), args.gpu_window,
                gpu_rules.series_names(tuple(args.gpu_xid_series or ()))))
        elif args.gpu_xid_series or args.gpu_window != gpu_rules.DEFAULT_WINDOW:
            raise ConfigError("--gpu-window, --gpu-xid-series: only with --gpu-labels")
    except ConfigError as exc:
        sys.stderr.write(f"hangwatch: {exc}\n")
        return 64
    if args.release is not None and not args.kubernetes:
        sys.stderr.write("hangwatch: --release: only with --kubernetes (plain rule files carry no labels)\n")
        return 64
    if args.kubernetes:
        from . import kubernetes
        try:
            written = kubernetes.write(args.out, settings, args.release, args.vllm_port, args.prometheus_namespace,
                                       args.prometheus_pod_name)
        except ConfigError as exc:
            sys.stderr.write(f"hangwatch: {exc}\n")
            return 64
        for path in written:
            print(path)
        return 0
    for path in write(args.out, settings):
        print(path)
    if settings.gpu is not None:
        print(gpu_rules.write(args.out, settings))
    sys.stderr.write(f"set scrape_interval: {format_duration(settings.scrape_interval)} (and scrape_timeout at most "
                     f"{format_duration(settings.scrape_interval * 2 / 3)}) on job {settings.job!r}\n")
    return 0


def run_dashboard(args) -> int:
    try:
        path = dashboard.write(args.out, args.runbook_url)
    except ConfigError as exc:
        sys.stderr.write(f"hangwatch: {exc}\n")
        return 64
    print(path)
    return 0
