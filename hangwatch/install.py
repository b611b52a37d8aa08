"""How this hangwatch was installed, so that a hint names the install command that fits it.

A hint such as "install py-spy with ``pip install 'hangwatch[forensics]'``" is wrong for most users:
hangwatch is installed from a checkout (``pip install .``), and that line fetches a release from an
index instead. pip records where an install came from (PEP 610, ``direct_url.json``): a checkout's
extra is ``pip install '/the/checkout[forensics]'``, an index's ``hangwatch[forensics]``, and a wheel
file's (the image) the extra's own requirements. Each with the pip of the Python running now.
"""
from __future__ import annotations

import json
import re
import sys
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlsplit


def extra_command(extra: str) -> str:
    """The command that adds ``extra`` (``forensics``) to the hangwatch running now."""
    pip = f"{sys.executable} -m pip install"
    distribution = _installed()
    if distribution is None:  # run from a checkout that was never installed
        return f"{pip} '{Path(__file__).resolve().parents[1]}[{extra}]'"
    source = _direct_url(distribution)
    if source is None:
        return f"{pip} 'hangwatch[{extra}]'"  # from an index
    if "dir_info" in source and source.get("url", "").startswith("file://"):
        return f"{pip} '{unquote(urlsplit(source['url']).path)}[{extra}]'"  # from a checkout
    wanted = [r.split(";")[0].strip() for r in distribution.requires or ()
              if re.search(rf"""extra\s*==\s*["']{re.escape(extra)}["']""", r)]
    return f"{pip} " + " ".join(f"'{r}'" for r in wanted)  # from a wheel file: the extra's own requirements


def _installed():
    """hangwatch's distribution as an installer wrote it (not a build's ``*.egg-info`` in a checkout)."""
    return next((d for d in metadata.distributions(name="hangwatch") if d.read_text("INSTALLER")), None)


def _direct_url(distribution) -> dict | None:
    try:
        return json.loads(distribution.read_text("direct_url.json") or "null")
    except ValueError:
        return None
