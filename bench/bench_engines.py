"""Benchmark: normalizing one page per engine vs prometheus_client's full text parse.

How it measures: bench/README.md.
"""
from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from bench_reading import full_parse, per_call  # noqa: E402

from hangwatch.engines import detect_engine  # noqa: E402
from hangwatch.reading import UnreadablePage, parse  # noqa: E402
from harness.engine_pages import sglang_page, tgi_page  # noqa: E402


def pages() -> list[tuple[str, str]]:
    """(name, page): one or more per engine."""
    out = []
    for path in sorted((ROOT / "tests" / "data").glob("*/*.prom")):
        out.append((f"{path.parent.name}/{path.name}", path.read_text()))
    out.append(("sglang (from collector.py), 1 rank", sglang_page()))
    out.append(("sglang (from collector.py), 8 dp ranks", sglang_page(ranks=tuple(range(8)))))
    out.append(("tgi (from the Metrics docs)", tgi_page()))
    out.append(("tgi, fresh (no request yet)", tgi_page(fresh=True)))
    return out


def main() -> int:
    worst_ratio, worst_ms, by_engine = float("inf"), 0.0, {}
    print(f"{'engine':9} {'page':42} {'bytes':>7} {'hangwatch':>11} {'full parse':>11} {'ratio':>7}")
    for name, page in pages():
        try:
            engine = parse(page).engine
        except UnreadablePage:
            continue  # deliberately unreadable captures
        ours, theirs = per_call(parse, page, 0.3), per_call(full_parse, page, 0.3)
        ratio = theirs / ours
        worst_ratio, worst_ms = min(worst_ratio, ratio), max(worst_ms, ours * 1000)
        by_engine.setdefault(engine, []).append(ratio)
        print(f"{engine:9} {name[:42]:42} {len(page):7d} {ours * 1000:9.3f}ms {theirs * 1000:9.3f}ms "
              f"{ratio:6.1f}x")
    missing = [e for e in ("vllm", "llamacpp", "sglang", "tgi") if e not in by_engine]
    ok = worst_ratio >= 5 and worst_ms < 5 and not missing
    print(f"engines: {', '.join(sorted(by_engine))}" + (f"; MISSING {', '.join(missing)}" if missing else ""))
    print(f"worst: {worst_ms:.3f} ms per page, {worst_ratio:.1f}x faster than a full parse "
          f"(goal ≥ 5x and < 5 ms): {'met' if ok else 'MISSED'}")
    assert detect_engine(tgi_page()).name == "tgi"
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
