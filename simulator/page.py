"""The /metrics page of the vLLM simulator, rebuilt from a real vLLM 0.32 page.

Fidelity comes from the template, not from this code: ``pages/single.prom`` holds a real
page (families, HELP text, types, label rows, histogram bucket boundaries, sample order) with
its values stripped and the model name replaced by ``@MODEL@``. This module parses that
template into families and renders a page in the Prometheus text format 0.0.4, exactly as
prometheus_client writes it (labels sorted, ``_created`` samples moved into a separate
``<name>_created`` gauge family), asking a value source for every sample.

Regenerate the template from new captures (review the diff like code)::

    python -m hangwatch.simulator.page regen tests/data/vllm-0.32/idle.prom \
        tests/data/vllm-0.32/multiprocess-start.prom     # rewrites simulator/pages/*.prom

A rendered line looks like::

    vllm:num_requests_running{engine="0",model_name="tiny-llama"} 3.0
"""
from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

PAGES = Path(__file__).resolve().parent / "pages"
CONTENT_TYPE_METRICS = "text/plain; version=1.0.0; charset=utf-8"  # what vLLM 0.32 answers (prometheus_client 0.26)
MODEL = "@MODEL@"
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?(?:\s+(\S+))?(?:\s+\S+)?\s*$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("_count", "_sum", "_created", ""),
    "gauge": ("",),
    "untyped": ("",),
}
# Families whose label rows exist only once a request was seen (the instrumentator's).
DYNAMIC_PREFIX = "http_"


@dataclass
class Family:
    name: str                      # base name: "vllm:prompt_tokens" (no _total)
    type: str                      # counter, gauge, histogram, summary
    help: str
    rows: list = field(default_factory=list)      # label dicts without le/quantile
    buckets: list = field(default_factory=list)   # le strings, in order, "+Inf" last
    order: list = field(default_factory=list)     # sample suffixes in page order
    created: bool = False          # has a separate <name>_created gauge family

    @property
    def exposed_name(self) -> str:
        return self.name + "_total" if self.type == "counter" else self.name

    @property
    def dynamic(self) -> bool:
        return self.name.startswith(DYNAMIC_PREFIX) and self.name != "http_request_duration_highr_seconds"

    @property
    def bounds(self) -> list:
        return [float(b) for b in self.buckets]


def parse_labels(text: str | None) -> dict:
    if not text:
        return {}
    return {k: v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
            for k, v in _LABEL.findall(text)}


def _split_suffix(family: Family, sample_name: str) -> str | None:
    for suffix in _SUFFIXES.get(family.type, ("",)):
        if sample_name == family.name + suffix:
            return suffix
    return None


def parse_template(text: str) -> list[Family]:
    """Turn a (value-stripped or real) page into ordered families."""
    families: list[Family] = []
    by_name: dict[str, Family] = {}
    helps: dict[str, str] = {}
    current: Family | None = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, doc = line[7:].partition(" ")
            helps[name] = doc
            continue
        if line.startswith("# TYPE "):
            name, _, mtype = line[7:].partition(" ")
            base = name[:-6] if mtype == "counter" and name.endswith("_total") else name
            owner = by_name.get(base[:-8]) if base.endswith("_created") and mtype == "gauge" else None
            if owner is not None:
                owner.created = True
                current = owner
                continue
            if base in by_name:      # a family repeated on the page (multiprocess quirk)
                current = None
                continue
            current = Family(base, mtype, helps.get(name, ""))
            families.append(current)
            by_name[base] = current
            continue
        if not line.strip() or line.startswith("#") or current is None:
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        suffix = _split_suffix(current, match.group(1))
        if suffix is None:
            continue
        labels = parse_labels(match.group(2))
        le = labels.pop("le", None)
        labels.pop("quantile", None)
        if suffix == "_created":
            continue
        if suffix not in current.order:
            current.order.append(suffix)
        if le is not None and le not in current.buckets:
            current.buckets.append(le)
        if labels not in current.rows:
            current.rows.append(labels)
    return families


def go_float(value: float) -> str:
    """A value as prometheus_client's floatToGoString writes it."""
    d = float(value)
    if d == math.inf:
        return "+Inf"
    if d == -math.inf:
        return "-Inf"
    if math.isnan(d):
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _line(name: str, labels: dict, value: float) -> str:
    if labels:
        inner = ",".join(f'{k}="{_escape(str(v))}"' for k, v in sorted(labels.items()))
        return f"{name}{{{inner}}} {go_float(value)}\n"
    return f"{name} {go_float(value)}\n"


def render(families: list[Family], source, model: str, *, with_created: bool = True) -> str:
    """Render a page. ``source`` answers for every sample:

    - ``rows(family)`` -> the label rows to print (None: the template's rows),
    - ``value(family, labels)`` -> float for counters/gauges (None: omit the row),
    - ``hist(family, labels)`` -> (cumulative bucket counts, count, sum) for histograms
      and (count, sum) for summaries,
    - ``created(family, labels)`` -> the row's creation time (unix seconds).
    """
    out: list[str] = []
    for fam in families:
        doc = fam.help            # as on the page: already escaped
        out.append(f"# HELP {fam.exposed_name} {doc}\n")
        out.append(f"# TYPE {fam.exposed_name} {fam.type}\n")
        rows = source.rows(fam)
        if rows is None:
            rows = [{k: (model if v == MODEL else v) for k, v in r.items()} for r in fam.rows]
        created_lines = []
        for labels in rows:
            lines = _family_lines(fam, source, labels)
            if lines is None:
                continue
            out.extend(lines)
            if with_created and fam.created:
                created_lines.append(_line(fam.name + "_created", labels, source.created(fam, labels)))
        if created_lines:
            out.append(f"# HELP {fam.name}_created {doc}\n")
            out.append(f"# TYPE {fam.name}_created gauge\n")
            out.extend(created_lines)
    return "".join(out)


def _family_lines(fam: Family, source, labels: dict) -> list | None:
    if fam.type in ("counter", "gauge", "untyped"):
        value = source.value(fam, labels)
        if value is None:
            return None
        return [_line(fam.exposed_name, labels, value)]
    if fam.type == "histogram":
        cumulative, count, total = source.hist(fam, labels)
        parts = {
            "_bucket": [_line(fam.name + "_bucket", {**labels, "le": le}, c)
                        for le, c in zip(fam.buckets, cumulative)],
            "_count": [_line(fam.name + "_count", labels, count)],
            "_sum": [_line(fam.name + "_sum", labels, total)],
        }
    elif fam.type == "summary":
        count, total = source.hist(fam, labels)
        parts = {"_count": [_line(fam.name + "_count", labels, count)],
                 "_sum": [_line(fam.name + "_sum", labels, total)]}
    else:
        return None
    order = [s for s in fam.order if s in parts] or list(parts)
    order += [s for s in parts if s not in order]
    return [line for suffix in order for line in parts[suffix]]


def skeletonize(page: str) -> str:
    """A real page -> template text: values dropped, model name -> @MODEL@, rows of the
    instrumentator's labelled families dropped (they follow the simulator's own traffic)."""
    model = None
    found = re.search(r'model_name="((?:[^"\\]|\\.)*)"', page)
    if found:
        model = found.group(1)
    out = []
    for line in page.splitlines():
        if line.startswith("#"):
            out.append(line)
            continue
        match = _SAMPLE.match(line)
        if not match or not line.strip():
            continue
        name, labels = match.group(1), match.group(2) or ""
        if name.startswith(DYNAMIC_PREFIX) and "handler=" in labels:
            continue
        if model is not None:
            labels = labels.replace(f'model_name="{model}"', f'model_name="{MODEL}"')
        out.append(f"{name}{{{labels}}}" if labels else name)
    return "\n".join(out) + "\n"


def template(multiprocess: bool = False) -> str:
    """The skeleton of a real vLLM 0.32 page (``pages/*.prom``, data regenerated by ``regen``)."""
    name = "multiprocess.prom" if multiprocess else "single.prom"
    return (PAGES / name).read_text(encoding="utf-8")


def _regen(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "regen":
        print("usage: python -m hangwatch.simulator.page regen SINGLE.prom [MULTIPROCESS.prom]",
              file=sys.stderr)
        return 64
    (PAGES / "single.prom").write_text(skeletonize(open(argv[1], encoding="utf-8").read()), encoding="utf-8")
    if len(argv) > 2:
        (PAGES / "multiprocess.prom").write_text(skeletonize(open(argv[2], encoding="utf-8").read()),
                                                 encoding="utf-8")
    print(f"wrote {PAGES}/*.prom from {', '.join(argv[1:])}: review the diff like code")
    return 0


if __name__ == "__main__":
    sys.exit(_regen(sys.argv[1:]))
