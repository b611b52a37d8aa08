"""Forensics before a restart: where each process of a hung server was stuck, and why (a signature).

``capture`` reads the server's processes (found from its URL alone) with py-spy within one
deadline; ``signatures`` names the cause. The callers — ``hangwatch forensics``, the
exporter's ``/forensics``, the webhook before a restart — capture only a target judged hung.
"""
from .capture import DEADLINE, capture, render
from .signatures import NAMES, SIGNATURES, classify

__all__ = ["DEADLINE", "NAMES", "SIGNATURES", "capture", "classify", "render"]
