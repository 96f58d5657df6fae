"""The task board of `examples/board/server.py` as a plain class for env `python`: the same six tools, the same
answers, so `bench/mcp_env.py` can time the MCP env against the python env on the same tools."""

from __future__ import annotations

import json
from typing import Literal, Optional

Column = Literal["todo", "doing", "done"]


class Board:
    """Cards in columns, with tags."""

    def reset(self, cards: Optional[list] = None) -> None:
        self.board = {card["title"]: {"column": card.get("column", "todo"), "tags": list(card.get("tags", []))}
                      for card in cards or []}

    def _card(self, title: str) -> dict:
        if title not in self.board:
            raise ValueError(f"no card titled {title!r}")
        return self.board[title]

    def add_card(self, title: str, column: Column = "todo") -> str:
        """Add a new card to the board.

        Args:
            title: The card's title, unique on the board.
            column: The column to put it in.
        """
        if title in self.board:
            raise ValueError(f"a card titled {title!r} exists already")
        self.board[title] = {"column": column, "tags": []}
        return f"added {title!r} to {column}"

    def move_card(self, title: str, column: Column) -> str:
        """Move a card to another column.

        Args:
            title: The card to move.
            column: The column to move it to.
        """
        self._card(title)["column"] = column
        return f"moved {title!r} to {column}"

    def tag_card(self, title: str, tag: str) -> str:
        """Put a tag on a card.

        Args:
            title: The card to tag.
            tag: The tag, e.g. urgent.
        """
        tags = self._card(title)["tags"]
        if tag not in tags:
            tags.append(tag)
        return f"tagged {title!r} {tag}"

    def delete_card(self, title: str) -> str:
        """Delete a card from the board.

        Args:
            title: The card to delete.
        """
        self._card(title)
        del self.board[title]
        return f"deleted {title!r}"

    def list_cards(self, column: Optional[Column] = None) -> str:
        """List the cards on the board, or in one column.

        Args:
            column: Only this column's cards.
        """
        return json.dumps([{"title": title, **value} for title, value in sorted(self.board.items())
                           if column in (None, value["column"])])

    def find_card(self, title: str) -> str:
        """Say which column a card is in and how it is tagged.

        Args:
            title: The card to look up.
        """
        found = self._card(title)
        return f"{title!r} is in {found['column']}, tagged {', '.join(found['tags']) or 'nothing'}"
