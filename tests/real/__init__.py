import sys

import harness.tinymodel
import harness.vllm_server

# Moved to the shared harness (the soak benchmarks use them too); the old names still import.
for _module in (harness.tinymodel, harness.vllm_server):
    _name = _module.__name__.rsplit(".", 1)[1]
    sys.modules[f"{__name__}.{_name}"] = _module
    globals()[_name] = _module
