"""The local demo: the whole hangwatch chain on one machine, without Docker or a GPU.

``hangwatch demo`` starts the vLLM simulator, the exporter, Prometheus and Alertmanager (when
installed) and the webhook in dry-run, drives a busy phase and a hang, and prints what each
part saw and decided. ``stack`` is the part that starts and stops the processes (the end-to-end
dashboard test reuses it); ``chain``, ``processes``, ``wait``, ``files`` and ``receiver`` are what
the tests share with it, installed with it so the demo runs wherever hangwatch is installed.
"""
