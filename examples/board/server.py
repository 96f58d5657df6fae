"""A task board as an MCP server, written with the official SDK's server API: cards in columns, with tags.

`make_server(cards=...)` is a factory: env `mcp` makes one server per episode, with the task's `reset` arguments,
so every episode starts from its own board. Run as a program it serves one board over stdio (the task's `reset`
arrives as JSON in COEVOLVE_MCP_RESET):

    .venv/bin/coevolve eval --env mcp:examples.board.server:make_server --tasks examples/board/tasks.jsonl --policy oracle
    .venv/bin/python -m examples.board.server          # the same board as a stdio server

`list_cards` and `find_card` only read: the config's `state_calls` probe the board through them after each turn.
"""

from __future__ import annotations

import json
import os
from typing import Literal, Optional

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

Column = Literal["todo", "doing", "done"]


def make_server(cards: Optional[list[dict]] = None) -> MCPServer:
    """A board holding `cards` ({"title", "column", "tags"}), empty by default."""
    server = MCPServer("board")
    board: dict[str, dict] = {card["title"]: {"column": card.get("column", "todo"), "tags": list(card.get("tags", []))}
                              for card in cards or []}

    def card(title: str) -> dict:
        if title not in board:
            raise ToolError(f"no card titled {title!r}")
        return board[title]

    @server.tool()
    def add_card(title: str, column: Column = "todo") -> str:
        """Add a new card to the board.

        Args:
            title: The card's title, unique on the board.
            column: The column to put it in.
        """
        if title in board:
            raise ToolError(f"a card titled {title!r} exists already")
        board[title] = {"column": column, "tags": []}
        return f"added {title!r} to {column}"

    @server.tool()
    def move_card(title: str, column: Column) -> str:
        """Move a card to another column.

        Args:
            title: The card to move.
            column: The column to move it to.
        """
        card(title)["column"] = column
        return f"moved {title!r} to {column}"

    @server.tool()
    def tag_card(title: str, tag: str) -> str:
        """Put a tag on a card.

        Args:
            title: The card to tag.
            tag: The tag, e.g. urgent.
        """
        tags = card(title)["tags"]
        if tag not in tags:
            tags.append(tag)
        return f"tagged {title!r} {tag}"

    @server.tool()
    def delete_card(title: str) -> str:
        """Delete a card from the board.

        Args:
            title: The card to delete.
        """
        card(title)
        del board[title]
        return f"deleted {title!r}"

    @server.tool()
    def list_cards(column: Optional[Column] = None) -> str:
        """List the cards on the board, or in one column.

        Args:
            column: Only this column's cards.
        """
        return json.dumps([{"title": title, **value} for title, value in sorted(board.items())
                           if column in (None, value["column"])])

    @server.tool()
    def find_card(title: str) -> str:
        """Say which column a card is in and how it is tagged.

        Args:
            title: The card to look up.
        """
        found = card(title)
        return f"{title!r} is in {found['column']}, tagged {', '.join(found['tags']) or 'nothing'}"

    return server


if __name__ == "__main__":
    make_server(**json.loads(os.environ.get("COEVOLVE_MCP_RESET") or "{}")).run("stdio")
