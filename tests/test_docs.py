"""Every example in README.md, CONTRIBUTING.md and docs/*.md runs: the documentation cannot drift from the code.

Each ```python fenced block is executed as one test, with an id such as ``README.md:L123`` (the line
of its opening fence). Blocks run in a fresh module namespace, with a fresh temporary directory as the
working directory, and line numbers in tracebacks are those of the Markdown file. Clients left open
by an example are closed after it.

A block that needs setup says so in an HTML comment on the line just before its fence (Markdown
renders nothing for it). Several words may be combined, separated by spaces:

Each block runs twice, as a user reruns a script: the second run gets a fresh namespace but the same
working directory, the same moto state and the same Redis data, so an example that only works once
(a table that already exists, a record stored by the first run) fails.

``<!-- test: dynamodb -->``
    runs inside moto's in-process ``mock_aws``, with fake credentials and ``AWS_DEFAULT_REGION`` set to
    ``us-east-1``. The example creates the tables it needs, as a real deployment script would.
``<!-- test: redis -->``
    the session's ``redis-server`` (the ``redis_url`` fixture of ``tests/conftest.py``) is emptied, and
    its URL is both the environment variable ``FASTLEASE_REDIS_URL`` (the name the ``fastlease`` command
    reads too) and a global name of that name.
``<!-- test: redis-cluster -->``
    the session's three-node Redis Cluster (the ``redis_cluster_db`` fixture), every primary emptied;
    its ``redis+cluster://`` URL is both the environment variable ``FASTLEASE_REDIS_URL`` and a global name.
``<!-- test: postgres -->``
    an empty database on the session's PostgreSQL server (the ``postgres_db`` fixture of
    ``tests/conftest.py``): its DSN is both the environment variable ``FASTLEASE_POSTGRES_DSN`` and a global
    name.
``<!-- test: server -->``
    the example starts a service process of its own (a moto server, a ``redis-server``). Like ``redis``,
    it gives the test pytest's ``server`` mark, which the wheel tests deselect (``-m "not server"``).
``<!-- test: continue -->``
    runs after the previous python block of the same file, in the same namespace and with that
    block's setup (the chain is re-run from its first block, so each id still runs on its own).
``<!-- test: pytest -->``
    the block is a test module: it is written to ``test_example.py`` in a temporary directory, beside
    the file's latest ``conftest`` block if there is one, and pytest runs it in a subprocess. The test
    requires exit status 0 and at least one passed test.
``<!-- test: conftest -->``
    the block is a ``conftest.py`` for the ``pytest`` blocks after it in the same file. On its own it
    is executed, and every module in its ``pytest_plugins`` must import.

There is no marker that skips a block. Blocks in other languages are not executed, but every ```json
block must parse, and every relative link must point to an existing file (and heading, for links into
another Markdown file). The Lua scripts and SQL statements that ``docs/protocol.md`` quotes must still
be in the store modules (Redis; SQLite or PostgreSQL), word for word. The README's Redis fencing example
uses ``fastlease.fencing``, whose refusals ``tests/test_fencing.py`` checks.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
import types
import unicodedata
from pathlib import Path
from typing import Any, Iterator, NamedTuple, Optional

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKERS = frozenset({"dynamodb", "redis", "redis-cluster", "postgres", "server", "continue", "pytest", "conftest"})
#: The test needs (or starts) a service process.
SERVER_MARKERS = frozenset({"redis", "redis-cluster", "postgres", "server"})
PYTEST_TIMEOUT_S = 300  # bound for one example test module run in a subprocess

_FENCE = re.compile(r"^(\s*)```([\w+-]*)\s*$")
_MARKER = re.compile(r"^\s*<!--\s*test:\s*(.*?)\s*-->\s*$")
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


class Block(NamedTuple):
    """One fenced code block: where it is, its language, its text and its test markers."""

    path: Path
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    markers: frozenset

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:L{self.line}"


def parse_blocks(path: Path) -> list[Block]:
    """Every fenced block of a Markdown file, with the markers of the comment just before it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, language = len(opening.group(1)), opening.group(2)
        marker = _MARKER.match(lines[i - 1]) if i > 0 else None
        markers = frozenset(marker.group(1).split()) if marker else frozenset()
        body = []
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            text = lines[j]
            body.append(text[indent:] if text[:indent].strip() == "" else text.lstrip())  # a list item's block
            j += 1
        if j == len(lines):
            raise AssertionError(f"{path.name}:{i + 1}: fenced block never closed")
        blocks.append(Block(path, i + 1, language, "\n".join(body) + "\n", markers))
        i = j + 1
    return blocks


BLOCKS = [block for path in DOCUMENTS for block in parse_blocks(path)]
PYTHON = [block for block in BLOCKS if block.language == "python"]
JSON_BLOCKS = [block for block in BLOCKS if block.language == "json"]


def chain_of(block: Block) -> list[Block]:
    """The blocks to run for ``block``: itself, after the blocks it continues."""
    same_file = [b for b in PYTHON if b.path == block.path]
    index = same_file.index(block)
    chain = [block]
    while "continue" in chain[0].markers:
        if index == 0:
            raise AssertionError(f"{block.id}: 'continue' with no python block before it")
        index -= 1
        chain.insert(0, same_file[index])
    return chain


def conftest_for(block: Block) -> Optional[Block]:
    """The file's latest ``conftest`` block before ``block``, if any."""
    earlier = [b for b in PYTHON if b.path == block.path and b.line < block.line and "conftest" in b.markers]
    return earlier[-1] if earlier else None


@pytest.fixture
def logging_restored() -> Iterator[None]:
    """Examples may configure logging (levels, handlers); undo it so later tests see no difference."""
    manager = logging.Logger.manager
    levels = {name: logger.level for name, logger in manager.loggerDict.items() if isinstance(logger, logging.Logger)}
    root_level, root_handlers = logging.root.level, list(logging.root.handlers)
    yield
    for name, logger in list(manager.loggerDict.items()):
        if isinstance(logger, logging.Logger):
            logger.setLevel(levels.get(name, logging.NOTSET))
    logging.root.setLevel(root_level)
    for handler in [h for h in logging.root.handlers if h not in root_handlers]:
        logging.root.removeHandler(handler)
        handler.close()


def _run_in_namespace(chain: list[Block], setup: frozenset, request: pytest.FixtureRequest,
                      monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("fastlease_docs_example")
    module.__file__ = str(chain[0].path)
    monkeypatch.setitem(sys.modules, module.__name__, module)  # dataclasses and pydantic look modules up
    if "redis" in setup:
        import redis

        url = request.getfixturevalue("redis_url")
        admin = redis.Redis.from_url(url)
        try:
            admin.flushdb()
        finally:
            admin.close()
        monkeypatch.setenv("FASTLEASE_REDIS_URL", url)
        module.__dict__["FASTLEASE_REDIS_URL"] = url
    if "redis-cluster" in setup:
        request.getfixturevalue("redis_cluster_db")  # every primary emptied
        url = request.getfixturevalue("redis_cluster_url")
        monkeypatch.setenv("FASTLEASE_REDIS_URL", url)
        module.__dict__["FASTLEASE_REDIS_URL"] = url
    if "postgres" in setup:
        dsn = request.getfixturevalue("postgres_db")
        monkeypatch.setenv("FASTLEASE_POSTGRES_DSN", dsn)
        module.__dict__["FASTLEASE_POSTGRES_DSN"] = dsn
    initial = dict(module.__dict__)
    for run in (1, 2):  # a rerun finds what the first run left: files, tables, records
        module.__dict__.clear()
        module.__dict__.update(initial)  # but a fresh namespace, as a new interpreter would have
        try:
            for block in chain:
                # Padding puts each line at its line number in the Markdown file, for tracebacks.
                code = compile("\n" * block.line + block.code, str(block.path), "exec")
                exec(code, module.__dict__)
        except BaseException as error:
            if run == 2:
                error.add_note(f"{chain[-1].id}: the example failed when run a second time")
            raise
        finally:
            _close_clients(module.__dict__)


def _close_clients(namespace: dict[str, Any]) -> None:
    """Stop what an example left open: fastlease clients (renewal threads, connections)."""
    from fastlease.client import LeaseClient

    for value in list(namespace.values()):
        if isinstance(value, LeaseClient):
            value.close()


def _run_pytest_module(block: Block, tmp_path: Path) -> None:
    conftest = conftest_for(block)
    if conftest is not None:
        (tmp_path / "conftest.py").write_text(conftest.code, encoding="utf-8")
    (tmp_path / "test_example.py").write_text(block.code, encoding="utf-8")
    # No pytest options of this run, and no AWS endpoint that would send moto's requests elsewhere.
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("PYTEST_", "AWS_ENDPOINT_URL", "AWS_PROFILE"))}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_example.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=PYTEST_TIMEOUT_S, env=env,
    )
    report = f"{block.id}\n{result.stdout}\n{result.stderr}"
    assert result.returncode == 0, report
    passed = re.search(r"(\d+) passed", result.stdout)
    assert passed and int(passed.group(1)) >= 1, report


def _param(block: Block) -> Any:
    needs_server = any(b.markers & SERVER_MARKERS for b in chain_of(block))
    return pytest.param(block, id=block.id, marks=[pytest.mark.server] if needs_server else [])


@pytest.mark.parametrize("block", [_param(block) for block in PYTHON])
def test_python_example_runs(block: Block, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
                             tmp_path: Path, logging_restored: None) -> None:
    monkeypatch.chdir(tmp_path)
    if "pytest" in block.markers:
        _run_pytest_module(block, tmp_path)
        return
    if "conftest" in block.markers:
        namespace: dict[str, Any] = {}
        exec(compile("\n" * block.line + block.code, str(block.path), "exec"), namespace)
        for plugin in namespace.get("pytest_plugins", []):
            __import__(plugin)
        return
    chain = chain_of(block)
    setup = frozenset().union(*(b.markers for b in chain))
    if "dynamodb" in setup:
        from moto import mock_aws

        for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_DYNAMODB", "AWS_PROFILE", "AWS_CONFIG_FILE"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        with mock_aws():
            _run_in_namespace(chain, setup, request, monkeypatch)
    else:
        _run_in_namespace(chain, setup, request, monkeypatch)


def test_the_documents_have_examples_and_known_markers() -> None:
    assert len(PYTHON) >= 20, [block.id for block in PYTHON]
    for path in DOCUMENTS:
        lines = path.read_text(encoding="utf-8").splitlines()
        fences = {block.line for block in BLOCKS if block.path == path}
        for number, text in enumerate(lines, start=1):
            marker = _MARKER.match(text)
            if marker is None:
                continue
            where = f"{path.relative_to(ROOT)}:L{number}"
            unknown = set(marker.group(1).split()) - MARKERS
            assert not unknown, f"{where}: unknown test marker(s) {sorted(unknown)}; known: {sorted(MARKERS)}"
            assert number + 1 in fences, f"{where}: a test marker must be on the line just before a fence"
            block = next(b for b in BLOCKS if b.path == path and b.line == number + 1)
            assert block.language == "python", f"{where}: test markers apply to python blocks only"


@pytest.mark.parametrize("block", JSON_BLOCKS, ids=[block.id for block in JSON_BLOCKS])
def test_json_example_parses(block: Block) -> None:
    json.loads(block.code)


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    anchors: set[str] = set()
    counts: dict[str, int] = {}
    in_fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line) or line.strip() == "```":
            in_fence = not in_fence
            continue
        heading = None if in_fence else _HEADING.match(line)
        if heading:
            slug = _slug(heading.group(2))
            anchors.add(slug if slug not in counts else f"{slug}-{counts[slug]}")
            counts[slug] = counts.get(slug, 0) + 1
    return anchors


def _links(path: Path) -> list[tuple[int, str]]:
    """Relative links outside code: (line number, target)."""
    found = []
    in_fence = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if _FENCE.match(line) or line.strip() == "```":
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        outside_code = re.sub(r"`[^`]*`", "", line)
        for target in _LINK.findall(outside_code):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
                found.append((number, target))
    return found


@pytest.mark.parametrize("path", DOCUMENTS, ids=[str(path.relative_to(ROOT)) for path in DOCUMENTS])
def test_relative_links_point_to_existing_files(path: Path) -> None:
    broken = []
    for number, target in _links(path):
        file_part, _, fragment = target.partition("#")
        destination = (path.parent / file_part).resolve() if file_part else path
        if not destination.exists():
            broken.append(f"L{number}: {target} (no such file)")
        elif fragment and destination.suffix == ".md" and fragment not in _anchors(destination):
            broken.append(f"L{number}: {target} (no such heading in {destination.name})")
    assert not broken, f"{path.relative_to(ROOT)}: " + "; ".join(broken)


# The modules as imported (the installed package when a wheel is tested, where no src/ is beside tests/).
QUOTED_SOURCES = {language: [Path(importlib.util.find_spec(module).origin)  # type: ignore[union-attr,arg-type]
                              for module in modules]
                  for language, modules in (("lua", ["fastlease.stores.redis.scripts"]),
                                            ("sql", ["fastlease.stores.sqlite", "fastlease.stores.postgres.sql"]))}
QUOTED = [block for block in BLOCKS if block.path.name == "protocol.md" and block.language in QUOTED_SOURCES]


@pytest.mark.parametrize("block", QUOTED, ids=[block.id for block in QUOTED])
def test_protocol_scripts_and_statements_are_quoted_verbatim(block: Block) -> None:
    """docs/protocol.md quotes the Redis scripts and the SQLite and PostgreSQL statements: each must still
    be in a store module, word for word."""
    paths = QUOTED_SOURCES[block.language]
    assert any(block.code.strip() in path.read_text(encoding="utf-8") for path in paths), (
        f"{block.id} no longer matches {' or '.join(path.name for path in paths)}")


# ---- the repository cites only itself ------------------------------------------------------------
#: Citations of what lies outside the repository: the old homes of the protocol's rules and of the
#: reference library's examples (spelled in pieces, so this file does not cite them itself), and the
#: numbered sections of that outside contract. The rules are stated in docs/protocol.md: cite its
#: section by name instead.
OUTSIDE_CITATIONS = re.compile("|".join(
    [re.escape(".." + "/shared"), re.escape("lock" + "-contract"), re.escape("seeds" + "/"), "\u00a7"]))
CITING_PATHS = ("src", "tests", "docs", "bench", "wheels", "README.md", "CONTRIBUTING.md")


def _citing_files() -> list[Path]:
    """The tracked files under CITING_PATHS; without a git checkout (the wheel's copy of the tests and
    docs), the files present there."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--", *CITING_PATHS], cwd=ROOT, capture_output=True,
                                text=True, timeout=60)
    except OSError:  # no git on the machine
        listed = None
    if listed is not None and listed.returncode == 0 and listed.stdout:
        return [ROOT / name for name in listed.stdout.split("\0") if name]
    files = []
    for name in CITING_PATHS:
        path = ROOT / name
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files.extend(p for p in sorted(path.rglob("*")) if p.is_file() and "__pycache__" not in p.parts)
    return files


def test_nothing_cites_a_file_outside_the_repository() -> None:
    files = _citing_files()
    assert ROOT / "README.md" in files and ROOT / "tests" / "test_docs.py" in files, files[:5]
    found = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):  # a binary file, or one deleted but still tracked
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            match = OUTSIDE_CITATIONS.search(line)
            if match:
                found.append(f"{path.relative_to(ROOT)}:L{number} ({match.group(0)})")
    assert not found, "cite docs/protocol.md and its section by name instead: " + "; ".join(found)
