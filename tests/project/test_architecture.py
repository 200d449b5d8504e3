"""The layout rules of docs/architecture.md, each checked here (run by the README's test command).

- the import-linter contracts in .importlinter: the client side never
  imports the engine, the engine never imports admin or management, the store imports nothing above it;
- no import cycle among weft_django's modules, function-level and TYPE_CHECKING imports included (grimp);
- SQL only under weft_django/store/ (migrations excepted);
- claim rows written only by weft_django/store/claims/;
- no library module over 600 lines.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "weft_django"
MAX_LINES = 600


def _library_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts)


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


LINT_IMPORTS = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def test_import_contracts() -> None:
    """import-linter's contracts (.importlinter) hold."""
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _cycles(graph: grimp.ImportGraph, modules: set[str]) -> list[list[str]]:
    adjacency = {m: sorted(graph.find_modules_directly_imported_by(m) & modules) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(start: str) -> None:  # iterative Tarjan
        nonlocal counter
        work = [(start, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            recurse = False
            for j in range(i, len(adjacency[node])):
                nxt = adjacency[node][j]
                if nxt not in index:
                    work.append((node, j + 1))
                    work.append((nxt, 0))
                    recurse = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if recurse:
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])

    for module in sorted(modules):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycles() -> None:
    """No cycle among weft_django's modules, counting imports inside functions and TYPE_CHECKING ones."""
    graph = grimp.build_graph("weft_django", exclude_type_checking_imports=False, cache_dir=None)
    modules = {m for m in graph.modules if ".migrations" not in m}
    assert _cycles(graph, modules) == []


SQL = re.compile(r"\.cursor\(|\.execute\(|\.executemany\(|\.raw\(|\bRawSQL\b|\.vendor\b")


def test_sql_only_in_store() -> None:
    """No statement, cursor or vendor branch outside weft_django/store/ (migrations excepted)."""
    offenders = []
    for path in _library_files():
        if "store" in path.relative_to(PACKAGE).parts[:1]:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if SQL.search(line.split("#", 1)[0]):
                offenders.append(f"{_rel(path)}:{number}: {line.strip()}")
    assert offenders == []


CLAIM_WRITE_SQL = re.compile(r"(INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+\"?weft_django_workflowclaim\b", re.I)
CLAIM_ORM_WRITE = re.compile(
    r"WorkflowClaim\.objects\b[^\n]*\.(update|create|bulk_create|delete|get_or_create|update_or_create)\("
)


# An engine heartbeat compared with a time: an ORM lookup, or SQL with the column beside an operator.
HEARTBEAT_COMPARED = re.compile(
    r"heartbeat_at__(lt|lte|gt|gte|range)\b|heartbeat_at\s*[-+]|heartbeat_at\s*[<>]=?|[<>]=?\s*\w*\.?heartbeat_at\b"
)


def test_heartbeats_judged_only_by_the_liveness_rule() -> None:
    """Whether an engine's heartbeat is evidence of life is decided in weft_django/store/liveness.py only
    (``now - ttl <= heartbeat_at <= now + ttl``): every reader calls it, none compares the column itself
    (a copy that forgot the upper bound kept an engine with a heartbeat of 'infinity' alive for ever)."""
    offenders = []
    for path in _library_files():
        if path == PACKAGE / "store" / "liveness.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if HEARTBEAT_COMPARED.search(line.split("#", 1)[0]):
                offenders.append(f"{_rel(path)}:{number}: {line.strip()}")
    assert offenders == []


def test_claims_written_only_by_claims_module() -> None:
    """Claim rows are written (SQL or ORM) only by weft_django/store/claims/."""
    offenders = []
    for path in _library_files():
        if path.parent == PACKAGE / "store" / "claims":
            continue
        text = path.read_text()
        for pattern in (CLAIM_WRITE_SQL, CLAIM_ORM_WRITE):
            for match in pattern.finditer(text):
                offenders.append(f"{_rel(path)}:{text.count(chr(10), 0, match.start()) + 1}: {match.group(0)}")
    assert offenders == []


def test_module_sizes() -> None:
    """No library module over 600 lines (split by job instead)."""
    too_long = {}
    for path in _library_files():
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            too_long[_rel(path)] = lines
    assert too_long == {}
