"""``python -m hangwatch.simulator --listen 127.0.0.1:8000 --scenario busy-then-hang``."""
import sys

from . import main

sys.exit(main())
