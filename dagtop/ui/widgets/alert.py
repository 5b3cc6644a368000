"""A red line for what the user must know at once: the demo job died, collecting failed."""

from __future__ import annotations

from textual.widgets import Static


class Alert(Static):
    """Hidden while there is nothing to say."""

    def say(self, message: str | None) -> None:
        """Show ``message``, or hide the line when None."""
        self.update(message or "")
        self.display = bool(message)
