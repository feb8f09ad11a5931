"""The commands the docs show (README.md, docs/*.md, cards/*.md), read as a
shell would read them when a user pastes them: `bertkit ...` (also behind python -m,
torchrun -m, accelerate launch -m, taskset, environment assignments), `bertkit-report ...`,
`make ...` and a benchmark's `python -m benchmarks.<module> ...`, from code blocks (fenced,
or indented) and inline code spans.

Shell rules kept: a trailing backslash continues the line, `#` starts a comment, quotes group,
`;` `&&` `|` `&` separate commands, `NAME=value` lines set variables a later `$NAME` of the
same page expands (unquoted `$NAME` alone splits into words). What is not shell is an explicit
rule of the docs' own, below: <placeholders>, `...` and optional `[...]`.
"""

from __future__ import annotations

import itertools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
             *sorted((REPO / "cards").glob("*.md"))]

PROGRAMS = ("bertkit", "bertkit-report", "make")
# A benchmark beside bertkit (benchmarks/): `python -m benchmarks.<module>` (torchrun -m too);
# its program is the module, benchmarks.<module>.
BENCHMARK = re.compile(r"benchmarks\.\w+")
# Programs that run a command given later on their line: `taskset -c 0 bertkit ...`, and
# the Makefile's run_noting_failure (its targets that run several commands, make --dry-run).
# (python -m, torchrun -m and accelerate launch -m are recognised by their `-m bertkit`.)
WRAPPERS = {"taskset", "nohup", "time", "env", "nice", "run_noting_failure"}
# Shell keywords that may open a line before a command (`for ...; do bertkit ...`).
KEYWORDS = {"do", "then", "else", "!"}

# The docs' placeholders and what stands in for each when the command is checked: a value of
# the kind the reader types there. <a|b|c> is a choice: each alternative is checked. Any other
# <placeholder> fails the test, so that a new one is a decision made here, not a command
# that silently goes unchecked.
PLACEHOLDERS = {
    "stamp": "2025-01-01_00-00-00",                           # a run's time stamp directory
    "the run directory": "outputs/glue/rte/2025-01-01_00-00-00",
    "run dir": "outputs/pretrain_small/wikitext2/2025-01-01_00-00-00",
    "runs": "multirun/glue/2025-01-01_00-00-00",               # run directories to report on
    "scratch runs": "multirun/cpt/scratch",
    "pretrained runs": "multirun/cpt/none",
    "full runs": "multirun/toolbox/mrpc/mrpc/*/full",
    "method runs": "multirun/toolbox/mrpc-lora/mrpc/*",
    "arm": "llrd",                                             # a finetuning method
    "k": "1",                                                  # a seed
    "task": "rte",                                             # a task of conf/task
    "user": "my-team", "name": "bert-mrpc",                    # a Hub repository, <user>/<name>
    "generated": "/tmp/swag",                                  # a data directory
    "its vocab": "/tmp/swag/vocab",                            # a WordPiece vocabulary
}
# `...` as a word stands for more arguments, and NAME=... (make's O="...") for a value of the
# reader's own: both are left out. A word opening with `[` and one closing with `]` mark an
# optional part ([seed=1,2,3], [O="..."], [--paired]): checked with the part given (a Hydra
# override never starts with `[`).
ELLIPSIS = "..."
# Values of the environment variables the docs use.
ENVIRONMENT = {"BERTKIT_DATA": "../shared/data", "PWD": "/home/user/bertkit",
               "HOME": "/home/user"}

_FENCE = re.compile(r"^\s*(```|~~~)\s*([\w+-]*)")
_SHELL_LANGUAGES = {"", "sh", "bash", "shell", "console"}
_PLACEHOLDER = re.compile(r"<([^<>\n]+)>")
_SENTINEL = re.compile("\x01(\\d+)\x02")
_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|([A-Za-z_]\w*))")
_ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")
_SEPARATOR = re.compile(r"^[;&|]+$")
# A line holding a command even where the shell lexer gives up (unbalanced quotes).
_LOOKS_LIKE_COMMAND = re.compile(
    r"(^|[;&|]\s*)(\w+=\S*\s+)*(\S*/)?(bertkit|bertkit-report|make)(\s|$)"
    r"|-m (bertkit|benchmarks\.\w+)(\s|$)")
# A dotted Hydra override opening an indented line that no backslash joined to a command.
_ORPHAN_OVERRIDE = re.compile(r"^\s+[+~]*[\w-]+\.[\w.-]+=")


@dataclass(frozen=True)
class Command:
    source: str                 # "README.md:83", "[cola]" appended for a choice's alternative
    program: str                # bertkit | bertkit-report | make | benchmarks.<module>
    args: tuple[str, ...]
    text: str                   # as written, for messages
    error: str | None = None    # why it could not be read as a command

    def __str__(self) -> str:
        return f"{self.source}: {self.text}"


class _Page:
    """One page's shell state: its variables and its placeholders (numbered sentinels, so a
    variable's value may carry one to a later line)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.variables = dict(ENVIRONMENT)
        self.placeholders: list[str] = []

    def mark_placeholders(self, text: str) -> str:
        def sentinel(match: re.Match) -> str:
            self.placeholders.append(match.group(1))
            return f"\x01{len(self.placeholders) - 1}\x02"
        return _PLACEHOLDER.sub(sentinel, text)

    def expand(self, word: str) -> list[str]:
        """A word with its variables expanded; `$NAME` alone splits like an unquoted one."""
        whole = _VARIABLE.fullmatch(word)
        if whole:
            return shlex.split(self._value(whole.group(1) or whole.group(2)))
        return [_VARIABLE.sub(lambda m: self._value(m.group(1) or m.group(2)), word)]

    def _value(self, name: str) -> str:
        if name not in self.variables:
            raise ValueError(f"${name} is not set on the page before it is used")
        return self.variables[name]


def _words(text: str) -> list[str]:
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return list(lexer)


def _simple_commands(words: list[str]) -> list[list[str]]:
    commands, current = [], []
    for word in words:
        if _SEPARATOR.match(word):
            commands.append(current)
            current = []
        else:
            current.append(word)
    return [command for command in [*commands, current] if command]


def _program_at(words: list[str]) -> int | None:
    first = 0
    while first < len(words) and (_ASSIGNMENT.match(words[first]) or words[first] in KEYWORDS):
        first += 1
    if first == len(words):
        return None
    for index in range(first, len(words)):
        name = words[index].rsplit("/", 1)[-1]
        after_m = index > first and words[index - 1] == "-m"
        if BENCHMARK.fullmatch(words[index]) and after_m:
            return index
        if name not in PROGRAMS:
            continue
        if index == first or (name == "bertkit" and after_m) or words[first] in WRAPPERS:
            return index
    return None


def _optional_and_ellipsis(args: list[str]) -> list[str]:
    kept = []
    for arg in args:
        if arg.startswith("["):
            arg = arg[1:]
        if arg.endswith("]") and arg.count("]") > arg.count("["):
            arg = arg[:-1]
        if arg == ELLIPSIS or re.fullmatch(r"[A-Za-z_]\w*=\.\.\.", arg):
            continue
        if arg:
            kept.append(arg)
    return kept


def _fill_placeholders(page: _Page, args: list[str]) -> list[tuple[str, list[str]]]:
    """(label, args) per combination of the choices' alternatives; named placeholders take
    their stand-in value. An unknown one raises."""
    used = sorted({int(n) for arg in args for n in _SENTINEL.findall(arg)})
    options: list[list[str]] = []
    for number in used:
        name = page.placeholders[number]
        if "|" in name:
            options.append(name.split("|"))
        elif name in PLACEHOLDERS:
            options.append([PLACEHOLDERS[name]])
        else:
            raise ValueError(f"<{name}> is not a known placeholder (tests/doc_commands.py "
                             f"PLACEHOLDERS): write a real value, or add it there")
    variants = []
    for values in itertools.product(*options):
        chosen = dict(zip(used, values, strict=True))
        filled = [_SENTINEL.sub(lambda m, chosen=chosen: chosen[int(m.group(1))], arg)
                  for arg in args]
        label = ",".join(v for n, v in chosen.items() if "|" in page.placeholders[n])
        variants.append((label, filled))
    return variants


def commands_in(text: str, source: str, page: _Page | None = None) -> list[Command]:
    """The commands of one shell snippet (a fenced block's logical line, an inline span)."""
    page = page or _Page(source)
    shown = " ".join(text.split())
    try:
        words = _words(page.mark_placeholders(text))
    except ValueError as err:
        if _LOOKS_LIKE_COMMAND.search(text.split("#", 1)[0]):
            return [Command(source, "?", (), shown, f"cannot be read as shell: {err}")]
        return []
    found = []
    for raw in _simple_commands(words):
        if raw[0] == "for" and len(raw) > 3 and raw[2] == "in":
            page.variables[raw[1]] = raw[3]  # the loop's first value
            continue
        assignments = all(_ASSIGNMENT.match(word) for word in raw)
        if _program_at(raw) is None and not assignments:
            continue  # another program's command, or prose in a code span
        try:
            words = [part for word in raw for part in page.expand(word)]
        except ValueError as err:
            found.append(Command(source, "?", (), shown, str(err)))
            continue
        at = _program_at(words)
        if at is None:
            if assignments:  # the shell expands a leading ~ of an assigned value
                page.variables.update(
                    (name, re.sub(r"^~(?=/|$)", page.variables["HOME"], value))
                    for name, value in (word.split("=", 1) for word in words))
            continue
        program = words[at].rsplit("/", 1)[-1]
        try:
            variants = _fill_placeholders(page, _optional_and_ellipsis(words[at + 1:]))
        except ValueError as err:
            found.append(Command(source, program, (), shown, str(err)))
            continue
        for label, args in variants:
            where = f"{source}[{label}]" if label else source
            found.append(Command(where, program, tuple(args), shown))
    return found


_LIST_ITEM = re.compile(r"^\s*([-*+]|\d+[.)])\s")


def _code_lines(lines: list[str]) -> list[int | None]:
    """Per line, the number of the shell code block it is in (fenced, or indented by four
    spaces after a blank line below a top-level paragraph), None for prose; fence lines are
    None and not prose (blank)."""
    blocks: list[int | None] = []
    block, language, indented, last_text = 0, None, False, ""
    for line in lines:
        fence = _FENCE.match(line)
        if fence:
            if language is None:
                language, block = fence.group(2), block + 1
            else:
                language = None
            blocks.append(-1)
            continue
        if language is not None:
            blocks.append(block if language in _SHELL_LANGUAGES else -1)
            continue
        code_indent = line.startswith("    ") and line.strip()
        if code_indent and (indented or (blocks and not lines[len(blocks) - 1].strip()
                                         and not last_text.startswith((" ", "\t"))
                                         and not _LIST_ITEM.match(last_text))):
            if not indented:
                indented, block = True, block + 1
            blocks.append(block)
            continue
        if line.strip():
            indented, last_text = False, line
        blocks.append(block if indented else None)
    return blocks


def _code_snippets(lines: list[str], blocks: list[int | None]) -> list[tuple[int, str, str | None]]:
    """(line number, logical line, problem) of each line of the shell code blocks."""
    snippets, current, start, pending, after_command = [], None, 0, [], False
    for number, (line, block) in enumerate(zip(lines, blocks, strict=True), 1):
        if block is None or block < 0:
            continue
        if block != current:
            current, pending, after_command = block, [], False
        if not pending:
            start = number
            if after_command and _ORPHAN_OVERRIDE.match(line):
                snippets.append((number, line, "an indented override with no backslash on "
                                 "the line before: the shell runs it as a command of its own"))
                continue
        if line.endswith("\\"):
            pending.append(line[:-1])
            continue
        snippets.append((start, " ".join([*pending, line]), None))
        after_command = bool(line.strip()) and not line.lstrip().startswith("#")
        pending = []
    return snippets


def _inline_spans(lines: list[str], blocks: list[int | None]) -> list[tuple[int, str]]:
    """Inline code spans of the prose; a span may run over a line break."""
    text = "\n".join(line if block is None else "" for line, block in zip(lines, blocks,
                                                                          strict=True))
    spans = []
    for match in re.finditer(r"(?<!`)`([^`]+)`(?!`)", text):
        if "\n\n" in match.group(1):
            continue
        spans.append((text.count("\n", 0, match.start()) + 1, " ".join(match.group(1).split())))
    return spans


def documented_commands(paths: list[Path] = DOC_FILES) -> list[Command]:
    commands = []
    for path in paths:
        name = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name
        lines = path.read_text().splitlines()
        blocks = _code_lines(lines)
        page = _Page(name)
        snippets = _code_snippets(lines, blocks)
        # A span that is only a program's name names it; it is not a command.
        snippets += [(n, text, None) for n, text in _inline_spans(lines, blocks)
                     if text not in PROGRAMS]
        for number, text, problem in sorted(snippets, key=lambda item: item[0]):
            if problem:
                commands.append(Command(f"{name}:{number}", "?", (), text.strip(), problem))
            else:
                commands.extend(commands_in(text, f"{name}:{number}", page))
    return commands
