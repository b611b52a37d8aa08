"""``python -m hangwatch check URL`` — the same as the ``hangwatch`` command."""
import sys

from .cli import main

sys.exit(main())
