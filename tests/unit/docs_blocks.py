"""The manual's code blocks, as the docs tests read them (tests/unit/test_docs_*.py).

A fenced block (```...```) of a Markdown page, with the line it starts on and the
HTML comment right above it, if any (`<!-- replayed: SESSION -->` marks a block whose
commands tests/unit/test_docs_sessions.py runs).  A command line is `$ ` and the
command; its output is every line after it up to the next `$ ` line or the block's end.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "vagrant").rglob("README.md")),
    *sorted((ROOT / "ansible").rglob("README.md")),
]
MARK = re.compile(r"^<!-- replayed: ([a-z-]+) -->$")


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lines: list[str]
    mark: str | None  # the session of a `<!-- replayed: SESSION -->` block

    def where(self, offset: int = 0) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line + 1 + offset}"


@dataclass
class Command:
    block: Block
    offset: int  # its line within the block
    argv: str  # the command line after "$ "
    output: list[str] = field(default_factory=list)


def blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            m = MARK.match(lines[i - 1]) if i else None
            out.append(Block(page, i + 1, lines[i + 1 : j], m.group(1) if m else None))
            i = j + 1
        else:
            i += 1
    return out


def commands(block: Block) -> list[Command]:
    out: list[Command] = []
    for k, line in enumerate(block.lines):
        if line.startswith("$ "):
            out.append(Command(block, k, line[2:]))
        elif out:
            out[-1].output.append(line)
    return out
