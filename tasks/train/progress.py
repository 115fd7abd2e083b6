"""How far a training is, read from the epoch lines its ranks write (``training.epoch_log``).
Every rank writes the same lines and a resumed training restarts at its checkpoint's epoch, so
the percentage only ever grows."""

from __future__ import annotations

from hvdflow.training.epoch_log import epochs_done  # the one definition of the epoch lines


class EpochProgress:
    """The percentage of epochs done, from lines seen so far; ``see`` says when it moved."""

    def __init__(self) -> None:
        self.percent = 0.0
        self.epochs: int | None = None
        self.done = 0  # epochs done, by the furthest line seen

    def see(self, text: str) -> bool:
        """Take one line of rank output; True when the percentage grew."""
        shown = epochs_done(text)
        if shown is None:
            return False
        done, epochs = shown
        if epochs <= 0:
            return False
        self.epochs = epochs
        percent = min(100.0, 100.0 * done / epochs)
        if percent <= self.percent:
            return False
        self.percent, self.done = percent, done
        return True

    def description(self) -> str:
        """``3 of 5 epochs done``."""
        if self.epochs is None:
            return "waiting for the first epoch"
        return f"{self.done} of {self.epochs} epochs done"
