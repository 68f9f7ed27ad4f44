"""Stop requests: SIGTERM (what Slurm and Kubernetes send before they kill a job), SIGINT (Ctrl-C) and SIGUSR1
(Slurm's `--signal=USR1@SECONDS`) finish the current optimizer step, write a checkpoint and end the run with a
message saying how to resume.

A handler only records the request; the trainer acts on it between optimizer steps, where a checkpoint is
consistent. Under several processes the ranks agree (one flag summed over ranks), so a signal that reached one
rank stops every rank after the same step. A second SIGINT while the save is pending interrupts at once, for a user
who does not want to wait.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

SIGNALS = tuple(s for s in (getattr(signal, name, None) for name in ("SIGTERM", "SIGINT", "SIGUSR1")) if s)


class StopRequests:
    """Installed for the training loop only (a context manager), in the main thread; elsewhere it does nothing
    (Python delivers signals to the main thread only)."""

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopRequests:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # asked twice: the user does not want to wait for the save
        if self.signum is None:
            self.signum = signum
            # Logging from a handler can deadlock on the handler's lock; the trainer logs it at the step's end.
