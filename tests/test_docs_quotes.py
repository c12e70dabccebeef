"""What docs/cli.md and docs/operating.md quote the program saying, the program says.

A quote is checked when it is one of:

- an inline code span that starts ``helix-mesh: `` (an error line as the CLI prints it);
- a row of the log table in operating.md (a ``helix.*`` logger and its message);
- an output line of a fenced block: a block with a ``$ `` line is output but for those
  lines; a block without one is output unless its lines are commands (``helix-mesh ...``,
  ``HELIX_...=``, shell) and their continuations; what a person typed after a prompt
  (``[y/N] ``, ``none): ``) is theirs, not output;
- a double-quoted passage of prose of two words or more (``"session 'x' expired: ..."``).

Each is cut at its example values (quoted values, JSON, ``...``, ALL-CAPS placeholders,
numbers, identifiers with a digit or ``_``, columns of two spaces): every piece left of
two words or more must appear as is in the library's source (its Python and the inspect
page's files), where the code that prints it writes it. A reworded message breaks the
quote, and this test says which.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.helpers import ROOT

DOCS = ("docs/cli.md", "docs/operating.md")
_PROMPTS = ("[y/N] ", "none): ")
_COMMAND = re.compile(r"^(helix-mesh |HELIX_\w+=|case |\$ |[a-z]+ \||#)")
_EXAMPLE = re.compile(
    r"'[^']*'"  # a quoted value
    r"|\{.*\}"  # JSON
    r"|\.\.\.|…"  # elided
    r"|\b[A-Z][A-Z_]*\b"  # a placeholder: S, REASON, METHOD
    r"|[\w.-]*[\d_][\w.,-]*"  # an id, a number, a tool name
    r"|\b(?:running|suspended|completed|failed|interrupted|terminated)\b"  # a status
    r"|\s{2,}"  # a column
    r"|[├└─]+"  # a tree's drawing
)


def _source() -> str:
    package = ROOT / "helix_transport"
    files = [*package.rglob("*.py"), *(package / "cli" / "inspector" / "static").iterdir()]
    return "\n".join(path.read_text(encoding="utf-8") for path in files)


_SOURCE = _source()


def _pieces(quote: str, typed: tuple[str, ...] = ()) -> list[str]:
    """The parts of ``quote`` that are not example values (nor what a person typed),
    of two words or more."""
    for text in typed:
        quote = quote.replace(text, "...")
    pieces = (piece.strip(" ,;:()[]") for piece in _EXAMPLE.split(quote))
    return [piece for piece in pieces if len(piece.split()) >= 2]


def _skeleton(message: str) -> re.Pattern[str]:
    """``message`` with each example value a gap the code fills (``%s``, ``{name}``),
    its words in order: the code writes them so, within a few lines."""
    pieces = _EXAMPLE.split(" ".join(message.split()))
    literals = [re.escape(piece.strip()) for piece in pieces if piece.strip()]
    return re.compile(r".{0,120}?".join(literals), re.S)


def _in_order(piece: str) -> re.Pattern[str]:
    """The words of an output line's ``piece`` in order, a few lines apart at most: a
    line the code puts together from parts (``f"{said} ({done}; session ..."``)."""
    words = re.findall(r"\w+", piece)
    return re.compile(r"\W.{0,200}?".join(rf"\b{word}\b" for word in words) + r"\b", re.S)


def _blocks(lines: list[str]) -> list[list[str]]:
    blocks: list[list[str]] = []
    inside = False
    for line in lines:
        if line.startswith("```"):
            inside = not inside
            if inside:
                blocks.append([])
        elif inside:
            blocks[-1].append(line)
    return blocks


def _output(block: list[str]) -> Iterator[tuple[str, tuple[str, ...]]]:
    """Each output line of a fenced block, with what a person typed up to it."""
    prompted = any(line.startswith("$ ") for line in block)
    continued = False
    typed: list[str] = []
    for line in block:
        command = line.startswith("$ ") if prompted else bool(_COMMAND.match(line))
        if not (command or continued) and line.strip():
            for prompt in _PROMPTS:
                if prompt in line:
                    line, answer = line.split(prompt, 1)
                    line += prompt
                    typed += [answer.strip()] if answer.strip() else []
            yield line, tuple(typed)
        continued = (command or continued) and line.rstrip().endswith("\\")


@dataclass(frozen=True)
class Quote:
    where: str
    text: str
    output: bool = False
    """A line of output (checked piece by piece), else a message (checked whole)."""
    typed: tuple[str, ...] = ()


def _quotes(path: str) -> Iterator[Quote]:
    """Every quote of ``path`` the module docstring names."""
    text = (ROOT / path).read_text(encoding="utf-8")
    lines = text.splitlines()
    prose = " ".join(re.sub(r"```.*?```", "", text, flags=re.S).split())
    for span in re.findall(r"`(helix-mesh: [^`]+)`", prose):
        yield Quote(f"{path}: error line", span.removeprefix("helix-mesh: "))
    for line in lines:
        if re.match(r"\| (INFO|WARNING|ERROR) \| `helix\.", line):
            cells = [cell.strip().strip("`") for cell in line.strip("|").split(" | ")]
            yield Quote(f"{path}: logger {cells[1]}", cells[2])
    for block in _blocks(lines):
        for line, typed in _output(block):
            yield Quote(f"{path}: output", line, output=True, typed=typed)
    for passage in re.findall(r'"([^"]+)"', re.sub(r"`[^`]*`", "", prose)):
        if len(passage.split()) >= 2:
            yield Quote(f"{path}: quoted", passage)


QUOTES = [quote for path in DOCS for quote in _quotes(path)]


def test_the_rule_finds_the_quotes_it_should() -> None:
    # Not vacuous: each kind of quote is found, and cut as intended.
    kinds = {quote.where.split(": ", 1)[1] for quote in QUOTES}
    assert {"error line", "output", "quoted", "logger helix.loop"} <= kinds, kinds
    assert _pieces(
        "call_1_0: approved (looks right) (sent; session suspended)", ("looks right",)
    ) == ["sent; session"]
    assert _in_order("sent; session").search('"sent" if x else y\n    f"({done}; session {s})"')
    assert _pieces("orchestrator  completed  4.2 s  312 tokens, 2,730 with children  7f3c...") == [
        "with children"
    ]
    assert _skeleton("session S failed (REASON): ERROR").search('"session %s failed (%s): %s"')
    assert not _skeleton("session S failed (REASON): ERROR").search('"session %s failed: %s"')


@pytest.mark.parametrize("quote", QUOTES, ids=[f"{q.where}: {q.text[:40]}" for q in QUOTES])
def test_a_quoted_message_is_what_the_code_says(quote: Quote) -> None:
    if quote.output:
        pieces = _pieces(quote.text, quote.typed)
        missing = [p for p in pieces if p not in _SOURCE and not _in_order(p).search(_SOURCE)]
        assert not missing, f"{quote.where}: {quote.text!r}: the code never prints {missing}"
    else:
        assert _skeleton(quote.text).search(_SOURCE), (
            f"{quote.where}: {quote.text!r}: the code never says so"
        )


def test_each_quoted_logger_exists() -> None:
    loggers = {q.where.split("logger ", 1)[1] for q in QUOTES if "logger " in q.where}
    assert loggers and all(f'getLogger("{name}")' in _SOURCE for name in loggers), loggers


def test_cli_md_and_operating_md_name_the_newer_flags() -> None:
    # The flags `helix-mesh serve|conformance|proto|bench --help` list.
    cli = (ROOT / "docs/cli.md").read_text(encoding="utf-8")
    operating = (ROOT / "docs/operating.md").read_text(encoding="utf-8")
    for flag in ("--a2a-port", "--a2a-url", "--a2a-grpc-port", "--reconnect-deadline"):
        assert f"`{flag}" in operating, flag
    for flag in ("--a2a URL", "--section", "proto --out DIR", "bench [--log-format"):
        assert flag in cli, flag
