"""Secret files as hangwatch accepts them: the webhook and the exporter refuse a token, key or
netrc that others may read, so every test writes one the same way."""
from __future__ import annotations

from pathlib import Path


def private_file(path: Path, text: str) -> Path:
    """Write ``text`` to ``path``, readable by its owner only (0600); returns ``path``."""
    path.write_text(text)
    path.chmod(0o600)
    return path
