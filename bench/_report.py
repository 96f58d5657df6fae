"""Write one benchmark's section of BENCHMARKS.md, leaving the other sections as they are.

Each benchmark owns the text between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->`; rerunning it replaces
only that block, so figures always come from the script that prints them.
"""

from __future__ import annotations

import platform
import re
from pathlib import Path

from coevolve.jsonl import atomic_write_text

BENCHMARKS_MD = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"
HEADER = "# Benchmarks\n\nEvery figure below is written by the script named in its section; rerun it to refresh.\n"


def machine_line() -> str:
    import os

    return f"{platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}"


def write_section(name: str, markdown: str, path: Path = BENCHMARKS_MD) -> None:
    begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{begin}\n{markdown.strip()}\n{end}"
    text = path.read_text() if path.exists() else HEADER
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    atomic_write_text(path, text)
