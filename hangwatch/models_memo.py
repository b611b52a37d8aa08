"""The model an idle probe names, remembered per process, so an idle scrape need not ask for it.

The probe must name a served model, and asking ``/v1/models`` before every probe made an idle
scrape four requests instead of three. A process cannot change the base model it serves without
restarting, and a restart changes its start time (``Reading.process_start``), so the first model
is remembered per (target, process start): a new process is asked again, and so is a target
whose page gives no start time (vLLM's multiprocess mode). A probe told the model does not exist
makes it forgotten (``probe.send_probe``). One event loop uses one memo: no locks; it holds at
most ``size`` targets, the least recently used going first.
"""
from __future__ import annotations

from collections import OrderedDict

__all__ = ["ModelMemo"]


class ModelMemo:
    """target → (process start, first model), at most ``size`` targets (least recently used out)."""

    def __init__(self, size: int = 4096):
        if size < 1:
            raise ValueError("a model memo holds at least one target")
        self.size = size
        self._models: OrderedDict[str, tuple[float, str]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._models)

    def model(self, target: str, started: float | None) -> str | None:
        """The model remembered for the process started at ``started``; None: ask for it (a
        process not seen yet, another process since, or no start time to tell them apart)."""
        if started is None:
            return None
        entry = self._models.get(target)
        if entry is None or entry[0] != started:
            return None
        self._models.move_to_end(target)
        return entry[1]

    def remember(self, target: str, started: float | None, model: str) -> None:
        """Keep ``model`` for this process (nothing is kept without a start time)."""
        if started is None:
            return
        self._models[target] = (started, model)
        self._models.move_to_end(target)
        while len(self._models) > self.size:
            self._models.popitem(last=False)

    def forget(self, target: str) -> None:
        """The target said the model does not exist: ask it next time."""
        self._models.pop(target, None)
