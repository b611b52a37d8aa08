"""Text from a server, shown to a person: control characters escaped, never interpreted.

A backend's log lines, a frame name, a process title reach an operator's terminal through
``incidents show``, ``hangwatch forensics`` and log lines. An ESC there can move the cursor,
rewrite what was printed or set the window title; so every human-readable output passes
through ``printable`` first: C0/C1 controls and DEL become ``\\xNN`` (tab stays; a newline
only where the caller allows one).
"""
from __future__ import annotations

import re

_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_CONTROLS_AND_NEWLINE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text, *, newlines: bool = False) -> str:
    """``text`` safe for a terminal (``newlines``: keep line breaks, for a multi-line report)."""
    return (_CONTROLS if newlines else _CONTROLS_AND_NEWLINE).sub(_escape, str(text))
