"""A calendar, written from scratch as a second example of your own tools: events on dates, search, conflicts.

Dates are ISO strings (`2026-12-01`), times are whole hours; two events on the same date whose hours overlap are
a conflict the tools refuse. Deterministic, with all state in public attributes.
"""

from __future__ import annotations


class Calendar:
    """A personal calendar: events with a title, a date and hours."""

    def __init__(self) -> None:
        self.events: list[dict] = []

    def reset(self, events: list | None = None) -> None:
        """Start with these events (each {"title", "date", "start", "end"})."""
        self.events = [dict(event) for event in (events or [])]

    def add_event(self, title: str, date: str, start: int, end: int) -> str:
        """Add an event to the calendar.

        Args:
            title: What the event is.
            date: The day, as YYYY-MM-DD.
            start: The hour it starts, 0-23.
            end: The hour it ends, after start, at most 24.
        """
        if not (len(date) == 10 and date[4] == date[7] == "-" and date.replace("-", "").isdigit()):
            raise ValueError(f"date {date!r} is not YYYY-MM-DD")
        if not 0 <= start < end <= 24:
            raise ValueError("hours must satisfy 0 <= start < end <= 24")
        for event in self.events:
            if event["date"] == date and start < event["end"] and event["start"] < end:
                raise ValueError(f"conflicts with {event['title']!r} ({event['start']}-{event['end']})")
        self.events.append({"title": title, "date": date, "start": start, "end": end})
        return f"added {title!r} on {date}"

    def find_events(self, date: str) -> list:
        """List the events on a day, earliest first.

        Args:
            date: The day, as YYYY-MM-DD.
        """
        return sorted((e for e in self.events if e["date"] == date), key=lambda e: e["start"])

    def cancel_event(self, title: str, date: str) -> str:
        """Remove an event.

        Args:
            title: The event's title.
            date: The day it is on, as YYYY-MM-DD.
        """
        for event in self.events:
            if event["title"] == title and event["date"] == date:
                self.events.remove(event)
                return f"cancelled {title!r}"
        raise ValueError(f"no event {title!r} on {date}")
