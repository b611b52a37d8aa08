"""Turn one raw /metrics page into a small immutable ``Reading``.

This runs for every backend at every scrape, so it reads only the handful of series the
verdict needs: one compiled regular expression per engine picks those lines out of a ~55 KB
page in C, instead of parsing a thousand series we would throw away (see
``bench/bench_reading.py``). Anything odd in the lines we do need — a truncated line,
NaN, a duplicate series, nothing recognisable at all — makes the page unreadable, which
the verdict reports as ``blind``; it never guesses.
"""
from __future__ import annotations

import hashlib
import math
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass

from .engines import COUNTER_FIELDS, ENGINES_BY_NAME, EngineMetrics, detect_engine
from .seriesroles import kept_roles, roles

# A page is untrusted input: at most this many model names are taken from it, each cut to this
# many characters (a real server serves a handful; 50,000 names would be 50,000 series).
MAX_MODELS = 32
MAX_MODEL_NAME = 128


def bounded_models(names) -> tuple[str, ...]:
    """The first ``MAX_MODELS`` distinct non-empty names, each cut to ``MAX_MODEL_NAME``
    characters, in page order; linear in the number of names."""
    kept: dict[str, None] = {}
    for name in names:
        if len(kept) >= MAX_MODELS:
            break
        if name:
            kept.setdefault(name[:MAX_MODEL_NAME])
    return tuple(kept)


class UnreadablePage(ValueError):
    """The page cannot give a truthful reading; the message says why (shown to users)."""


@dataclass(frozen=True)
class Reading:
    """What one backend's own counters said at one moment, normalized across engines.

    Field meanings (all summed over every label set, e.g. vLLM's ``engine`` and ``model_name``):

    - ``running`` / ``waiting``: requests being processed / queued. Their sum is "in flight".
    - ``deferred``: the waiting requests the engine cannot schedule by itself (vLLM: waiting on a
      KV transfer or a LoRA budget); they are in flight, but their standing still is no stall.
    - ``steps``: a counter that moves once per engine iteration (the engine's heartbeat).
    - ``prompt_tokens`` / ``generation_tokens``: token counters. Beware: in vLLM 0.32 they do
      not move during a long chunked prefill; in llama.cpp ``tokens_predicted`` moves only when
      a request finishes.
    - ``prefix_cache_queries``: moves when a prefill is scheduled (vLLM: jumps by the prompt
      length at the start of a prefill).
    - ``finished``: requests completed by the engine (vLLM: aborted and failed ones included).
    - ``served``: requests that finished with an answer: not aborted, not failed (vLLM's
      ``request_success_total`` without ``finished_reason="abort"|"error"``). Clients that give up
      on a stalled server abort, and an abort must not read as output.
    - ``decodes``: successful decode calls (TGI); each gives every running request one token.
    - ``preemptions``: requests preempted (their KV evicted) to make room: thrash when KV is full.
    - ``kv_cache_usage``: a 0..1 gauge; climbs chunk by chunk during a long prefill.
    - ``process_start``: seconds since the epoch; absent in vLLM's multiprocess mode.
    """

    engine: str
    running: float
    waiting: float
    steps: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    prefix_cache_queries: float | None = None
    finished: float | None = None
    served: float | None = None         # finished with an answer (not aborted, not failed)
    decodes: float | None = None        # successful decode calls (TGI)
    preemptions: float | None = None
    kv_cache_usage: float | None = None
    process_start: float | None = None
    models: tuple[str, ...] = ()
    asleep: bool = False
    version: str | None = None
    deferred: float | None = None  # waiting on something outside the engine (vLLM), if told

    @property
    def in_flight(self) -> float:
        return self.running + self.waiting

    @property
    def schedulable(self) -> float:
        """In flight and up to the engine itself: all of it but the deferred requests."""
        return self.in_flight - min(self.deferred or 0.0, self.waiting)

    def counters(self) -> dict[str, float]:
        """The counter fields this engine provides (absent ones are left out, not zeroed)."""
        values = {}
        for name in COUNTER_FIELDS:
            value = getattr(self, name)
            if value is not None:
                values[name] = value
        return values

    def output(self) -> float | None:
        """The sum of the engine's output fields (``EngineMetrics.output``): it moves only when a
        token comes out or a request is answered. None: the engine (or this page) gives none."""
        spec = ENGINES_BY_NAME.get(self.engine)
        values = [getattr(self, name) for name in (spec.output if spec else ())]
        present = [value for value in values if value is not None]
        return sum(present) if present else None

    def as_dict(self) -> dict:
        data = {name: getattr(self, name) for name in self.__dataclass_fields__ }
        data["models"] = list(self.models)
        data["in_flight"] = self.in_flight
        data["schedulable"] = self.schedulable
        return data


_LABELS = r'(?:\{(?P<labels>(?:[^"}\n]|"(?:[^"\\\n]|\\.)*")*)\})?'
_VALUE = r'[ \t]+(?P<value>[^ \t\n]+)(?:[ \t]+-?\d+)?[ \t]*$'
_COMPLETE_LINE = re.compile(r'^(?:#.*|[A-Za-z_:][A-Za-z0-9_:]*' + _LABELS + r'[ \t]+\S+(?:[ \t]+-?\d+)?[ \t]*)$')


@dataclass(frozen=True)
class _Plan:
    """The precompiled way to read one engine's page."""

    engine: EngineMetrics
    prefixes: tuple[str, ...]          # every wanted sample name, for str.startswith
    lines: re.Pattern                  # every line starting with one of them (after a newline)
    byte_lines: re.Pattern             # the same over the page's bytes
    fields_of: dict[str, tuple[str, ...]]  # sample name -> the normalized fields it feeds
    preference: dict[str, tuple[str, ...]]  # field -> sample names, most preferred first
    declared_zero: dict[str, tuple[str, ...]]  # field -> families whose bare TYPE line means 0


def _counter_spellings(base: str) -> tuple[str, ...]:
    if base.endswith(("_count", "_sum", "_bucket")):
        return (base,)
    return (base + "_total", base)


def _plan_for(engine: EngineMetrics) -> _Plan:
    preference: dict[str, tuple[str, ...]] = {
        "running": engine.running,
        "waiting": engine.waiting,
        "process_start": engine.process_start,
    }
    for name, bases in engine.counters.items():
        preference[name] = tuple(s for base in bases for s in _counter_spellings(base))
    for name, families in engine.gauges.items():
        preference[name] = families
    if engine.sleep_state:
        preference["sleep_state"] = (engine.sleep_state[0],)
    if engine.deferred:
        preference["deferred"] = (engine.deferred[0],)
    fields_of: dict[str, tuple[str, ...]] = {}
    for name, samples in preference.items():
        for sample in samples:
            fields_of[sample] = fields_of.get(sample, ()) + (name,)
    declared_zero = {
        "running": engine.running,
        "waiting": engine.waiting,
        **{name: families for name, families in engine.gauges.items()},
    }
    prefixes = tuple(fields_of)
    lines = "\n" + _trie(prefixes) + "[^\n]*"
    return _Plan(engine, prefixes, re.compile(lines), re.compile(lines.encode("ascii")), fields_of, preference,
                 declared_zero)


NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:")
_NAME_ENDS = "(?![" + re.escape("".join(sorted(NAME_CHARS))) + "])"  # the metric name stops here: not a longer name sharing the prefix


def _trie(words) -> str:
    """A regular expression matching any of ``words`` as a whole metric name at a line's start
    (what follows is not a name character), shaped as a trie, so each line start costs one pass
    over its first characters, not one try per word."""
    trie: dict = {}
    for word in words:
        node = trie
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}
    if not trie:
        return "(?!)"  # no words (FastChat has no page): no line matches

    def build(node: dict) -> str:
        alternatives = [re.escape(char) + build(child) for char, child in sorted(node.items()) if char]
        if "" in node:
            alternatives.insert(0, _NAME_ENDS)  # a word ends here; a longer one may go on
        return alternatives[0] if len(alternatives) == 1 else "(?:" + "|".join(alternatives) + ")"
    return build(trie)


def wanted_lines(page: str | bytes, plan: "_Plan") -> list[str]:
    """The page's lines whose metric name is one of ``plan.prefixes``, in page order: the lines
    that start with one of them where the name stops there (``vllm:prompt_tokens`` is wanted,
    ``vllm:prompt_tokens_cached_total`` is another metric). Found by one compiled expression in
    C instead of a Python loop over every line: most of a vLLM page is histogram buckets and
    ``*_created`` samples nobody reads. Whatever follows a wanted name (labels, a value, or
    garbage) is the parser's to judge: a malformed wanted line still makes the page unreadable.

    A page as it came off the wire (bytes) is searched as bytes — a third faster than the same
    expression over text, and the ~55 KB page is never decoded: only the lines found are, each
    exactly as decoding the whole page would give it (a newline is never part of a UTF-8
    sequence, so an undecodable byte cannot move a line's start or end)."""
    if isinstance(page, bytes):
        return [line.decode("utf-8", "replace") for line in _raw_wanted_lines(page, plan)]
    found = [match.group()[1:] for match in plan.lines.finditer(page)]
    if page.startswith(plan.prefixes):  # the first line has no newline before it
        end = page.find("\n")
        first = page if end == -1 else page[:end]
        if plan.lines.match("\n" + first):
            found.insert(0, first)
    return found


def _raw_wanted_lines(page: bytes, plan: "_Plan") -> list[bytes]:
    found = [line[1:] for line in plan.byte_lines.findall(page)]
    end = page.find(b"\n")
    first = page if end == -1 else page[:end]
    if plan.byte_lines.match(b"\n" + first):  # the first line has no newline before it
        found.insert(0, first)
    return found


_PLANS = {name: _plan_for(engine) for name, engine in ENGINES_BY_NAME.items()}

# An idle engine's wanted lines are the same at both readings of an idle check and from scrape
# to scrape, so the Reading made from them is kept (by a digest of the lines, per engine) and
# given again; only a Reading that depended on nothing but its lines is kept. At most this
# many, the least recently used going first (one per backend of a large idle fleet).
READINGS_KEPT = 1024
_made: OrderedDict[tuple[str, bytes], "Reading"] = OrderedDict()
_made_lock = threading.Lock()  # the webhook reads on its own thread


def _number(text: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UnreadablePage(f"{name}: value {text[:40]!r} is not a number") from None
    if not math.isfinite(value):
        raise UnreadablePage(f"{name}: non-finite value {text!r}")
    return value


def _split_sample(line: str) -> tuple[str, str, str]:
    """``name{labels} value [timestamp]`` → (name, labels, value text), with plain str ops."""
    brace, space = line.find("{"), line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        close = line.rfind("}")
        if close < brace:
            raise UnreadablePage(f"malformed line: {line[:80]!r}")
        name, labels, rest = line[:brace], line[brace + 1:close], line[close + 1:]
    else:
        name, labels, rest = (line, "", "") if space == -1 else (line[:space], "", line[space:])
    fields = rest.split()
    if not 1 <= len(fields) <= 2:
        raise UnreadablePage(f"malformed line: {line[:80]!r}")
    return name.rstrip(), labels, fields[0]


def _declared(page: str | bytes, family: str) -> bool:
    if isinstance(page, bytes):
        declared = f"# TYPE {family}".encode("utf-8")
        return declared + b" " in page or declared + b"\n" in page
    return f"# TYPE {family} " in page or f"# TYPE {family}\n" in page


def _last_line_complete(page: str | bytes) -> bool:
    if isinstance(page, bytes):
        return page.endswith(b"\n") or bool(_COMPLETE_LINE.match(
            page[page.rfind(b"\n") + 1:].decode("utf-8", "replace")))
    return page.endswith("\n") or bool(_COMPLETE_LINE.match(page[page.rfind("\n") + 1:]))


def parse(page: str | bytes, engine: str | None = None) -> Reading:
    """Read the normalized fields from a /metrics page — text, or its bytes as they came (the
    same reading either way; bytes are cheaper: see ``wanted_lines``) — or raise
    UnreadablePage if it can't."""
    spec = ENGINES_BY_NAME.get(engine) if engine else detect_engine(page)
    if spec is not None and not spec.running:
        raise UnreadablePage(f"{spec.name} has no Prometheus page to read")
    if spec is None:
        raise UnreadablePage("no known engine metrics on the page (vLLM, llama.cpp, SGLang, TGI)")
    plan = _PLANS[spec.name]
    if not _last_line_complete(page):
        raise UnreadablePage("page is truncated (its last line is cut off)")
    if not isinstance(page, bytes):
        return _read(page, spec, plan, wanted_lines(page, plan))[0]
    raw = _raw_wanted_lines(page, plan)
    key = (spec.name, hashlib.blake2b(b"\n".join(raw), digest_size=16).digest())
    with _made_lock:
        made = _made.get(key)
        if made is not None:
            _made.move_to_end(key)
            return made
    reading, by_lines_alone = _read(page, spec, plan, [line.decode("utf-8", "replace") for line in raw])
    if by_lines_alone:
        with _made_lock:
            _made[key] = reading
            while len(_made) > READINGS_KEPT:
                _made.popitem(last=False)
    return reading


def _read(page: str | bytes, spec: EngineMetrics, plan: _Plan, lines: list[str]) -> tuple[Reading, bool]:
    """The Reading from the wanted ``lines``, and whether it depended on them alone (not on
    the rest of ``page``: a family declared with no sample yet)."""
    looked_beyond = False
    samples: dict[tuple[str, str], float] = {}  # (field, sample name) -> sum over label sets
    seen: set[tuple[str, str]] = set()
    models: dict[str, None] = {}  # an ordered set: membership is O(1)
    asleep = False
    fields_of, engine = plan.fields_of, spec.name
    # Only the ~40 wanted lines are looked at in Python (``wanted_lines``).
    for line in lines:
        name, labels, value_text = _split_sample(line)
        fields = fields_of.get(name)
        if fields is None:
            continue  # (wanted_lines gives wanted names only)
        if (name, labels) in seen:
            raise UnreadablePage(f"duplicate series {name}{{{labels}}}")
        seen.add((name, labels))
        value = _number(value_text, name)
        adds, sleeps, model = kept_roles.get((engine, name, labels)) or roles(spec, name, labels, fields)
        if sleeps and value == 0:
            asleep = True
        for field_name in adds:
            key = (field_name, name)
            samples[key] = samples.get(key, 0.0) + value
        if model and len(models) < MAX_MODELS:
            models.setdefault(model[:MAX_MODEL_NAME])

    def pick(field_name: str) -> float | None:
        nonlocal looked_beyond
        for sample_name in plan.preference.get(field_name, ()):
            if (field_name, sample_name) in samples:
                return samples[(field_name, sample_name)]
        for family in plan.declared_zero.get(field_name, ()):
            looked_beyond = True
            if _declared(page, family):
                return 0.0  # multiprocess start-up: declared, no sample yet
        if field_name in spec.absent_is_zero:
            return 0.0  # registered on first use (TGI): never set means nothing ever queued
        return None

    running, waiting = pick("running"), pick("waiting")
    if running is None or waiting is None:
        missing = spec.running[0] if running is None else spec.waiting[0]
        raise UnreadablePage(f"{spec.name} page without {missing} (truncated or not an engine page?)")
    kv = pick("kv_cache_usage")
    if kv is not None and spec.name == "llamacpp" and kv > 1:
        kv = None  # older llama.cpp reported cells, not a ratio
    return Reading(
        engine=spec.name,
        running=running,
        waiting=waiting,
        steps=pick("steps"),
        prompt_tokens=pick("prompt_tokens"),
        generation_tokens=pick("generation_tokens"),
        prefix_cache_queries=pick("prefix_cache_queries"),
        finished=pick("finished"),
        served=pick("served"),
        decodes=pick("decodes"),
        preemptions=pick("preemptions"),
        kv_cache_usage=kv,
        process_start=pick("process_start"),
        models=tuple(models),  # at most MAX_MODELS names of at most MAX_MODEL_NAME characters
        asleep=asleep,
        deferred=pick("deferred") if spec.deferred else None,
    ), not looked_beyond

