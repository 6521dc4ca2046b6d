"""The documents hold together: links land, code paths exist, every setting is documented once,
and architecture.md's code layout names every module of the service.

Scanned: README.md, docs/**/*.md and loadtest/README.md. A setting counts as *documented*
where it is the first cell of a Markdown table row, in backticks and alone
(| `TIMELINE_PORT` | ...); any other mention is a reference and counts nothing.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from functools import cache
from pathlib import Path
from urllib.parse import unquote

from timeline.config import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CODE_ROOTS = ("timeline", "api", "fanout_worker", "tests", "loadtest")
GENERATED = ("loadtest/results/",)
"""Where programs write (git-ignored): what the docs name under it need not exist."""

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`([^`]+)`")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.MULTILINE)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
CODE_PATH = re.compile(rf"^(?:{'|'.join(CODE_ROOTS)})/[\w./-]*$")
DOTTED = re.compile(rf"^(?:{'|'.join(CODE_ROOTS)})(?:\.[A-Za-z_]\w*)+$")
SETTING_ROW = re.compile(r"^\|\s*`(TIMELINE_[A-Z0-9_]+)`\s*\|")


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md")), ROOT / "loadtest" / "README.md"]


def name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@cache
def prose(path: Path) -> str:
    """The document without its fenced code blocks (their lines are neither links nor
    headings), line count kept."""
    text = path.read_text(encoding="utf-8")
    return FENCE.sub(lambda block: "\n" * block.group(0).count("\n"), text)


def without_inline_code(text: str) -> str:
    return INLINE_CODE.sub(lambda code: " " * len(code.group(0)), text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link targets and markup dropped, lower case, every
    character but letters, digits, ``-``, ``_`` and spaces removed, spaces made hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: Counter[str] = Counter()
    found = set()
    for match in HEADING.finditer(prose(path)):
        base = slug(match.group(2))
        found.add(f"{base}-{seen[base]}" if seen[base] else base)
        seen[base] += 1
    return frozenset(found)


def links(path: Path) -> list[tuple[int, str]]:
    """Every link target with its line: inline links, images and reference definitions."""
    text = without_inline_code(prose(path))
    found = [*LINK.finditer(text), *REFERENCE_LINK.finditer(text)]
    return [(text.count("\n", 0, match.start()) + 1, match.group(1)) for match in found]


def link_problem(path: Path, target: str) -> str | None:
    """Why a relative link does not land, or None when it does (or is not relative)."""
    if SCHEME.match(target):
        return None
    file_part, _, anchor = target.partition("#")
    destination = (path.parent / unquote(file_part)).resolve() if file_part else path
    if not destination.exists():
        return "no such file"
    if not anchor:
        return None
    if destination.suffix != ".md":
        return "an anchor into a file that is not Markdown"
    if unquote(anchor) not in anchors(destination):
        return f"no heading with anchor #{anchor} in {name(destination)}"
    return None


def test_every_relative_link_lands() -> None:
    broken = [
        f"{name(path)}:{line}: {target}: {problem}"
        for path in documents()
        for line, target in links(path)
        if (problem := link_problem(path, target))
    ]
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_every_document_is_linked_from_the_readme() -> None:
    readme = ROOT / "README.md"
    linked = {
        (readme.parent / unquote(target.partition("#")[0])).resolve()
        for _, target in links(readme)
        if not SCHEME.match(target) and target.partition("#")[0]
    }
    unlinked = [name(path) for path in documents()[1:] if path.resolve() not in linked]
    assert not unlinked, "documents the README does not link: " + ", ".join(unlinked)


def code_spans(path: Path) -> list[tuple[int, str]]:
    text = prose(path)
    return [
        (text.count("\n", 0, match.start()) + 1, " ".join(match.group(1).split()))
        for match in INLINE_CODE.finditer(text)
    ]


@cache
def top_level_names(module: Path) -> frozenset[str]:
    """Names a module defines or imports at its top level."""
    names: set[str] = set()
    for node in ast.parse(module.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return frozenset(names)


def dotted_problem(dotted: str) -> str | None:
    """Why ``package.module.Name`` names nothing: the longest prefix that is a module, then
    one top-level name of it (what follows that name is not checked)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:end])
        module = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if module.is_file():
            rest = parts[end:]
            if rest and rest[0] not in top_level_names(module):
                return f"{name(module)} defines no {rest[0]}"
            return None
    return "no such module"


def code_problem(span: str) -> str | None:
    """Why a backticked code path or dotted module name is not there, or None."""
    if CODE_PATH.match(span):
        if span.startswith(GENERATED) or (ROOT / span).exists():
            return None
        return "no such file or folder"
    return dotted_problem(span) if DOTTED.match(span) else None


def test_every_code_path_in_backticks_exists() -> None:
    missing = [
        f"{name(path)}:{line}: {span}: {problem}"
        for path in documents()
        for line, span in code_spans(path)
        if (problem := code_problem(span))
    ]
    assert not missing, "code the docs name that is not there:\n" + "\n".join(missing)


def test_every_setting_is_documented_exactly_once() -> None:
    prefix = str(Settings.model_config.get("env_prefix", "")).upper()
    settings = {prefix + field.upper() for field in Settings.model_fields}
    where: dict[str, list[str]] = {}
    for path in documents():
        for number, line in enumerate(prose(path).splitlines(), start=1):
            if row := SETTING_ROW.match(line):
                where.setdefault(row.group(1), []).append(f"{name(path)}:{number}")
    problems = [f"{setting}: not documented" for setting in sorted(settings - where.keys())]
    problems += [
        f"{setting}: documented {len(places)} times ({', '.join(places)})"
        for setting, places in sorted(where.items())
        if len(places) > 1
    ]
    problems += [
        f"{setting}: documented ({', '.join(where[setting])}) but not a setting"
        for setting in sorted(where.keys() - settings)
    ]
    assert not problems, (
        "every TIMELINE_* setting needs exactly one table row whose first cell is its name "
        "in backticks:\n" + "\n".join(problems)
    )


ARCHITECTURE = DOCS / "architecture.md"
LAYOUT_HEADING = "Code layout"
LAYOUT_PACKAGES = ("timeline", "api", "fanout_worker")
"""The packages architecture.md's code layout names module by module (loadtest/ has its own
layout, in loadtest/README.md)."""
MODULE_NAME = re.compile(r"^[\w/]*\w\.py$")


def section(path: Path, heading: str) -> str:
    """The prose of a ``## heading`` section (its subsections included), fences blanked."""
    text = prose(path)
    start = re.search(rf"^## {re.escape(heading)}\s*$", text, re.MULTILINE)
    assert start, f"{name(path)} has no section '## {heading}'"
    end = re.search(r"^## ", text[start.end() :], re.MULTILINE)
    return text[start.end() : start.end() + end.start() if end else len(text)]


def layout_modules() -> list[str]:
    """The module paths the code layout names, in order: a full path (``api/app.py``) as it
    is, a bare name (``keys.py``) in the folder the layout named last (``timeline/model/``, in
    a heading or a list item); a bare name before any folder is kept bare, so it is missing."""
    named: list[str] = []
    folder = ""
    for span in INLINE_CODE.findall(section(ARCHITECTURE, LAYOUT_HEADING)):
        if span.endswith("/") and CODE_PATH.match(span):
            folder = span
        elif MODULE_NAME.match(span):
            named.append(span if CODE_PATH.match(span) else folder + span)
    return named


def only_a_docstring(module: Path) -> bool:
    body = ast.parse(module.read_text(encoding="utf-8")).body
    return len(body) == 1 and ast.get_docstring(ast.Module(body=body, type_ignores=[])) is not None


def test_the_code_layout_names_every_module_and_only_modules_that_exist() -> None:
    named = layout_modules()
    modules = sorted(
        name(module)
        for package in LAYOUT_PACKAGES
        for module in (ROOT / package).rglob("*.py")
        if not (module.name == "__init__.py" and only_a_docstring(module))
    )
    unnamed = [module for module in modules if module not in named]
    missing = sorted({module for module in named if not (ROOT / module).is_file()})
    problems = [f"{module}: not in the code layout" for module in unnamed]
    problems += [f"{module}: in the code layout, but no such module" for module in missing]
    assert not problems, (
        f"{name(ARCHITECTURE)}'s '{LAYOUT_HEADING}' must name every module of "
        f"{', '.join(p + '/' for p in LAYOUT_PACKAGES)} (an __init__.py that holds only its "
        "docstring excepted), and nothing else:\n" + "\n".join(problems)
    )
