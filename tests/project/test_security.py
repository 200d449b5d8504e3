"""Security properties, proved over the whole package rather than case by case (docs/security.md):

- no pickle, marshal, shelve, eval, exec or yaml.load anywhere in weft_django (an AST scan, so
  comments and strings do not count, and a new call site fails the test);
- payloads are JSON only: the codec refuses every other type and decodes only its documented tags;
- SQL is parameterised: every ``cursor.execute`` interpolates only identifiers and SQL fragments built
  from constants (table names, vendor clock expressions, ``%s`` placeholder lists), never values;
- every admin URL of the app refuses anonymous users and staff without permissions; every POST without
  a CSRF token is refused; a view-only user changes nothing through any URL;
- engine-owned rows are read-only from the web; the editable Schedule admin never exposes the fields
  the engine maintains;
- destructive ``manage.py weft`` subcommands refuse without --yes when not interactive;
- payloads over WEFT["PAYLOAD_MAX_BYTES"] are refused with PayloadSizeExceededError and nothing stored;
- the admin escapes what workflow code and clients wrote (ids, payloads, errors).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.test import Client, RequestFactory

import weft_django as weft
from weft_django import codec
from weft_django.exceptions import CorruptPayloadError, PayloadNotSerializableError, PayloadSizeExceededError
from weft_django.models import BufferedSignal, PendingUpdate, QueryRequest, Schedule, Step, Timer, Workflow
from weft_django.status import TimerKind
from weft_django.store.clock import db_now

PACKAGE = Path(weft.__file__).resolve().parent
SOURCES = sorted(PACKAGE.rglob("*.py"))


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(PACKAGE.parent)}:{getattr(node, 'lineno', '?')}"


# ------------------------------------------------------------------ no pickle, eval or friends

UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle", "jsonpickle"}
UNSAFE_BUILTINS = {"eval", "exec", "compile", "__import__", "execfile"}
UNSAFE_ATTRIBUTES = {
    ("yaml", "load"),
    ("yaml", "unsafe_load"),
    ("yaml", "full_load"),
    ("yaml", "load_all"),
    ("os", "system"),
    ("os", "popen"),
}


def unsafe_calls(tree: ast.AST) -> Iterator[tuple[ast.AST, str]]:
    """Imports of deserialisers that run code, calls of eval-like builtins, shell=True."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in UNSAFE_MODULES:
                    yield node, f"import {alias.name}"
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[0] in UNSAFE_MODULES:
                yield node, f"from {node.module} import ..."
            for alias in node.names:
                if alias.name in UNSAFE_BUILTINS:
                    yield node, f"from {node.module} import {alias.name}"
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in UNSAFE_BUILTINS:
                yield node, f"{func.id}()"
            if isinstance(func, ast.Attribute):
                if isinstance(func.value, ast.Name) and (func.value.id, func.attr) in UNSAFE_ATTRIBUTES:
                    yield node, f"{func.value.id}.{func.attr}()"
                if func.attr in UNSAFE_BUILTINS and isinstance(func.value, ast.Name) and func.value.id == "builtins":
                    yield node, f"builtins.{func.attr}()"
            for keyword in node.keywords:
                if keyword.arg == "shell" and not (isinstance(keyword.value, ast.Constant) and not keyword.value.value):
                    yield node, "shell=True"


def test_the_scanner_finds_what_it_looks_for():
    sample = (
        "import pickle\nfrom marshal import loads\nimport yaml\neval('1')\nexec('x=1')\n"
        "yaml.load(s)\nimport subprocess\nsubprocess.run('ls', shell=True)\n"
        "# eval(x) in a comment is fine\ntext = 'pickle.loads'\n"
    )
    found = [what for _, what in unsafe_calls(ast.parse(sample))]
    assert found == ["import pickle", "from marshal import ...", "eval()", "exec()", "yaml.load()", "shell=True"]


def test_no_pickle_marshal_shelve_eval_exec_or_yaml_load_in_weft_django():
    found = [f"{_where(path, node)} {what}" for path in SOURCES for node, what in unsafe_calls(_parse(path))]
    assert SOURCES and found == []


def test_payload_columns_are_text_not_binary_or_pickled():
    """Every payload is codec text (JSON) in a TextField or a JSONField; no BinaryField anywhere."""
    binary = [
        f"{model.__name__}.{field.name}"
        for model in apps.get_app_config("weft_django").get_models()
        for field in model._meta.get_fields()
        if field.get_internal_type() == "BinaryField"
    ]
    assert binary == []


# ------------------------------------------------------------------------------ JSON-only codec


class Opaque:
    def __reduce__(self) -> Any:  # what pickle would call: the codec must never get this far
        raise AssertionError("the codec tried to reduce an object")


@pytest.mark.parametrize(
    "value",
    [Opaque(), print, lambda: 1, type, object(), Exception("x"), range(3), iter([1]), 1j, bytearray(b"x")],
    ids=lambda v: type(v).__name__,
)
def test_codec_refuses_everything_that_is_not_json_or_a_documented_type(value):
    with pytest.raises(PayloadNotSerializableError, match="not serialisable"):
        codec.encode({"nested": [value]})


@pytest.mark.parametrize(
    "text",
    [
        '{"$weft": "pickle", "v": "gASVAAAAAAAAAAA="}',
        '{"$weft": "object", "v": ["os", "system"]}',
        '{"$weft": "call", "v": "__import__(\'os\')"}',
        '{"$weft": "tuple", "v": [], "extra": 1}',
        '{"py/object": "os.system"}',  # jsonpickle's tag: just a dict here
        "NaN",
        "cos(0)",
    ],
)
def test_decode_knows_only_its_own_tags(text):
    if text.startswith('{"py/object"'):
        assert codec.decode(text) == {"py/object": "os.system"}  # stays data
        return
    with pytest.raises(CorruptPayloadError):
        codec.decode(text)


def test_decoded_values_are_only_json_and_the_documented_types():
    from datetime import date, datetime, time
    from decimal import Decimal
    from uuid import UUID

    allowed = (str, int, float, bool, type(None), list, dict, tuple, set, frozenset, bytes)
    allowed += (Decimal, UUID, date, datetime, time, timedelta)
    value = codec.decode(
        codec.encode([1, "a", (1, 2), {3}, frozenset(), b"x", Decimal("1.10"), UUID(int=1), {1: 2}, timedelta(1)])
    )

    def walk(item: Any) -> Iterator[Any]:
        yield item
        if isinstance(item, dict):
            for key, inner in item.items():
                yield from walk(key)
                yield from walk(inner)
        elif isinstance(item, (list, tuple, set, frozenset)):
            for inner in item:
                yield from walk(inner)

    assert all(type(item) in allowed for item in walk(value))


# ------------------------------------------------------------------------- parameterised SQL


@dataclass
class Interpolation:
    where: str
    expression: str
    function: str = ""


def _scopes(tree: ast.Module) -> dict[ast.AST, ast.AST]:
    """Every node -> its innermost enclosing function (or the module)."""
    scopes: dict[ast.AST, ast.AST] = {}

    def visit(node: ast.AST, scope: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            scopes[child] = scope
            visit(child, child if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else scope)

    visit(tree, tree)
    return scopes


class _Resolved(ast.expr):
    """Element ``position`` of a tuple unpacked from ``source`` (``sql, params = statement``)."""

    def __init__(self, source: ast.expr, position: int) -> None:
        super().__init__()
        self.source = source
        self.position = position
        self.lineno = getattr(source, "lineno", 0)


def _constant_name(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id.lstrip("_").isupper()


def _loop_only(node: ast.expr, names: set[str]) -> bool:
    """Text made only of constants and the loop variables (``f"{c} = EXCLUDED.{c}"``)."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.IfExp):
        return _loop_only(node.body, names) and _loop_only(node.orelse, names)
    if isinstance(node, ast.JoinedStr):
        return all(
            isinstance(v, ast.Constant) or (isinstance(v, ast.FormattedValue) and _loop_only(v.value, names))
            for v in node.values
        )
    return isinstance(node, ast.Name) and node.id in names


def _constant_join(node: ast.expr) -> bool:
    """``", ".join(COLUMNS)`` or ``", ".join(f"{c} = EXCLUDED.{c}" for c in COLUMNS)`` (also over
    ``enumerate(COLUMNS)``): identifiers from a module constant, formatted only with the loop variables."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join"):
        return False
    if not (isinstance(node.func.value, ast.Constant) and len(node.args) == 1):
        return False
    arg = node.args[0]
    if isinstance(arg, ast.Name):
        return _constant_name(arg)
    if not (isinstance(arg, ast.GeneratorExp) and len(arg.generators) == 1):
        return False
    loop = arg.generators[0]
    source = loop.iter
    if isinstance(source, ast.Call) and isinstance(source.func, ast.Name) and source.func.id in ("enumerate", "sorted"):
        source = source.args[0] if len(source.args) == 1 else source
    if not _constant_name(source):
        return False
    names = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    return _loop_only(arg.elt, names)


def _sql_builder(node: ast.expr) -> bool:
    """A call of a function returning a SQL fragment from constants (``workflow_now_sql(vendor)``,
    ``next_epoch_sql(...)``): by naming convention, ``*_sql``; their own bodies are scanned as well."""
    func = node.func if isinstance(node, ast.Call) else None
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    return name.endswith("_sql")


def _placeholders(node: ast.expr) -> bool:
    """``", ".join(["%s"] * n)``: a list of placeholders, one per value passed as a parameter."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join"):
        return False
    if not (isinstance(node.func.value, ast.Constant) and len(node.args) == 1):
        return False
    arg = node.args[0]
    if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Mult):
        arg = arg.left if isinstance(arg.left, ast.List) else arg.right
    if isinstance(arg, (ast.List, ast.Tuple)):
        return all(isinstance(e, ast.Constant) and e.value in ("%s", "?") for e in arg.elts)
    if isinstance(arg, ast.GeneratorExp):
        return isinstance(arg.elt, ast.Constant) and arg.elt.value in ("%s", "?")
    return False


class SqlScan:
    """Follows the SQL text given to ``execute``/``executemany`` back to its parts, within the
    function, and reports every interpolated part that is not an identifier or a constant fragment."""

    def __init__(self, path: Path, tree: ast.Module, package: dict[Path, ast.Module] | None = None) -> None:
        self.path = path
        self.tree = tree
        self.package = package or {path: tree}  # where callers of a pass-through function are looked for
        self.problems: list[Interpolation] = []
        self.functions = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}

    def run(self) -> list[Interpolation]:
        for node, scope in _scopes(self.tree).items():
            if isinstance(node, ast.Call) and node.args:
                func = node.func
                raw = isinstance(func, ast.Name) and func.id == "RawSQL"
                via_prepared = (  # prepared.execute(cursor, connection, sql, params): the SQL is the third
                    isinstance(func, ast.Attribute)
                    and func.attr == "execute"
                    and isinstance(func.value, ast.Name)
                    and func.value.id == "prepared"
                )
                if via_prepared and len(node.args) >= 3:
                    self.check(node.args[2], scope, set())
                elif raw or (
                    isinstance(func, ast.Attribute) and func.attr in ("execute", "executemany", "raw", "extra")
                ):
                    self.check(node.args[0], scope, set())
            returns_str = isinstance(getattr(node, "returns", None), ast.Name) and node.returns.id == "str"
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_sql") and returns_str:
                for ret in (n for n in ast.walk(node) if isinstance(n, ast.Return) and n.value is not None):
                    self.check(ret.value, node, set())
        return self.problems

    def flag(self, node: ast.AST, why: str) -> None:
        line = getattr(node, "lineno", 0)
        enclosing = [
            f.name
            for f in ast.walk(self.tree)
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.lineno <= line <= (f.end_lineno or 0)
        ]
        where = _where(self.path, node)
        function = f"{where.split(':')[0]}:{enclosing[-1] if enclosing else ''}"
        self.problems.append(Interpolation(where, f"{why}: {ast.unparse(node)[:80]}", function))

    def check(self, node: ast.expr, scope: ast.AST, seen: set[str]) -> None:
        if isinstance(node, _Resolved):
            source = node.source
            while isinstance(source, ast.Name) and (values := list(self.assignments(source.id, scope))):
                source = values[0] if len(values) == 1 else source  # statement = build(...)
                if len(values) != 1:
                    break
            parts = list(self.returned(source, node.position))
            if not parts:
                self.flag(node.source, "SQL unpacked from something the scan cannot follow")
            for part, function in parts:
                self.check(part, function, set())
            return
        if isinstance(node, ast.Constant):
            return
        if isinstance(node, ast.JoinedStr):
            for part in node.values:
                if isinstance(part, ast.FormattedValue):
                    self.trusted(part.value, scope, seen)
            return
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            self.check(node.left, scope, seen)
            self.check(node.right, scope, seen)
            return
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            self.flag(node, "%-formatting of SQL text (pass the values as parameters)")
            return
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
            arguments = [*node.args, *(k.value for k in node.keywords)]
            if all(isinstance(a, ast.Constant) for a in arguments):  # a template filled with constants
                self.trusted(node.func.value, scope, seen)
            else:
                self.flag(node, "str.format() of SQL text (pass the values as parameters)")
            return
        self.trusted(node, scope, seen)

    def trusted(self, node: ast.expr, scope: ast.AST, seen: set[str]) -> None:
        """An interpolated part: an UPPER_CASE constant, a model's ``_meta.db_table``, a ``*_sql``
        builder, a placeholder list, a conditional between those, or a local assigned only those."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return
        if isinstance(node, (ast.JoinedStr, ast.BinOp)) or (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format"
        ):
            self.check(node, scope, seen)
            return
        if isinstance(node, ast.IfExp):
            self.trusted(node.body, scope, seen)
            self.trusted(node.orelse, scope, seen)
            return
        if isinstance(node, ast.Attribute) and (node.attr.isupper() or node.attr == "db_table"):
            return
        if isinstance(node, ast.Name) and node.id.lstrip("_").isupper():
            return
        if _sql_builder(node) or _placeholders(node):
            return
        if _constant_join(node):
            return
        replaced = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "replace"
        if replaced and all(isinstance(a, ast.Constant) for a in node.args):  # fragment.replace("x, ", "")
            self.trusted(node.func.value, scope, seen)
            return
        joined = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join"
        if joined and len(node.args) == 1 and isinstance(node.args[0], ast.Name) and node.args[0].id.islower():
            for item in self.list_items(node.args[0].id, scope):  # ", ".join(ctes): each CTE is checked
                self.check(item, scope, seen)
            return
        if isinstance(node, ast.Name):
            if node.id in seen:  # sql = f"SELECT {sql}": its other assignments are checked
                return
            values = list(self.assignments(node.id, scope))
            if not values and not self.from_callers(node, scope, seen):
                self.flag(node, "interpolated name with no local assignment (a parameter or a value?)")
            for value in values:
                self.check(value, scope, seen | {node.id})
            return
        self.flag(node, "interpolated expression that is not an identifier or a constant SQL fragment")

    def from_callers(self, node: ast.Name, scope: ast.AST, seen: set[str]) -> bool:
        """A parameter passed straight to SQL (of this function, or of an enclosing one for a closure):
        check what every caller in the package passes for it."""
        if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
        params = [a.arg for a in scope.args.args]
        if node.id not in params:
            outer = _scopes(self.tree).get(scope)
            return outer is not None and outer is not scope and self.from_callers(node, outer, seen)
        index = params.index(node.id) - (1 if params and params[0] in ("self", "cls") else 0)
        found = False
        for path, tree in self.package.items():
            caller_scan = SqlScan(path, tree, self.package)
            for call, caller in _scopes(tree).items():
                if not isinstance(call, ast.Call):
                    continue
                name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
                if name != scope.name:
                    continue
                passed = [k.value for k in call.keywords if k.arg == node.id]
                passed += [call.args[index]] if 0 <= index < len(call.args) else []
                for value in passed:
                    found = True
                    caller_scan.check(value, caller, set())
            self.problems += caller_scan.problems
        return found

    @staticmethod
    def list_items(name: str, scope: ast.AST) -> Iterator[ast.expr]:
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                yield from node.value.elts if isinstance(node.value, ast.List) else [node.value]
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                if isinstance(owner, ast.Name) and owner.id == name and node.func.attr in ("append", "extend"):
                    for arg in node.args:
                        yield from arg.elts if node.func.attr == "extend" and isinstance(arg, ast.List) else [arg]

    def returned(self, value: ast.expr, position: int) -> Iterator[tuple[ast.expr, ast.AST]]:
        """``sql, params = statement`` where ``statement = build(...)``: the ``position``-th element of
        every tuple the module's ``build`` returns, with its scope."""
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in self.functions:
            function = self.functions[value.func.id]
            for ret in (n for n in ast.walk(function) if isinstance(n, ast.Return)):
                if isinstance(ret.value, ast.Tuple):
                    yield ret.value.elts[position], function

    def assignments(self, name: str, scope: ast.AST) -> Iterator[ast.expr]:
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name) and target.id == name:
                        yield node.value
                    elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                        for element, value in zip(target.elts, node.value.elts, strict=False):
                            if isinstance(element, ast.Name) and element.id == name:
                                yield value
                    elif isinstance(target, ast.Tuple):
                        names = [e.id if isinstance(e, ast.Name) else "" for e in target.elts]
                        if name in names:
                            yield _Resolved(node.value, names.index(name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
                yield from [node.value] if node.value is not None else []


def sql_problems(source: str, path: Path = PACKAGE / "sample.py") -> list[str]:
    return [f"{p.where} {p.expression}" for p in SqlScan(path, ast.parse(source)).run()]


def test_the_sql_scan_flags_values_formatted_into_sql():
    bad = """
def find(cursor, user_id, name):
    cursor.execute(f"SELECT * FROM {TABLE} WHERE id = {user_id}")
    cursor.execute("SELECT * FROM t WHERE name = '%s'" % name)
    cursor.execute("SELECT * FROM t WHERE name = '{}'".format(name))
    sql = "SELECT * FROM t WHERE name = " + name
    cursor.execute(sql)
    Model.objects.raw(f"SELECT * FROM t WHERE x = {name}")
"""
    found = sql_problems(bad)
    assert len(found) == 5, found
    good = """
TABLE = "t"
def find(cursor, ids, vendor):
    marks = ", ".join(["%s"] * len(ids))
    lock = " FOR UPDATE" if vendor == "postgresql" else ""
    table, other = Model._meta.db_table, OTHER_TABLE
    sql = f"SELECT {workflow_now_sql(vendor)} FROM {table} JOIN {other} WHERE id IN ({marks}){lock}"
    sql = f"WITH x AS ({sql}) SELECT 1"
    cursor.execute(sql, ids)
"""
    assert sql_problems(good) == []


# SQL the scan cannot follow, reviewed by hand; an entry that stops matching fails the test, so the
# list cannot go stale. Review again whenever one of these functions changes.
REVIEWED = {
    "weft_django/store/maintenance.py:held_elsewhere": (
        "identifiers only from Model._meta (each table's db_table and pk column, the claim table's "
        "workflow_id column) and a run of %s placeholders; every value (the run ids, the idempotency keys) "
        "is a parameter"
    ),
    "weft_django/store/runs.py:_insert_run_sql": (
        "runs the statement _build_start_statement() builds once per shape and caches: identifiers from "
        "Model._meta (db_table, column), enum constants and the *_sql clock/epoch fragments; every value "
        "(id, run id, input, key, delay, timeout, column defaults) is a %(name)s parameter"
    ),
    "weft_django/store/runs_bulk.py:_insert_chunk": (
        "runs the statement _build() builds once and caches: identifiers from Model._meta (db_table, "
        "column), enum constants, the channel-free *_sql clock/epoch fragments; every value (the arrays of "
        "ids, run ids, inputs, keys, delays, timeouts, trace contexts, and the column defaults) is a "
        "%(name)s parameter"
    ),
    "weft_django/store/prepared.py:execute": (
        "PREPARE/EXECUTE of its caller's statement: the name is a hex digest of that text, the text is the "
        "caller's (checked at each prepared.execute call site) with its placeholders renumbered $1..$n, and "
        "EXECUTE's arguments are %s placeholders: every value is still a parameter"
    ),
    "weft_django/store/replay.py:read_only": (
        "runs the backend's constant read_only_sql statements (SET TRANSACTION READ ONLY, PRAGMA query_only "
        "ON/OFF: class attributes of store/backend.py, no value in them)"
    ),
    "weft_django/store/prepared.py:_prepare_on": (
        "PREPARE of its caller's statement (moved out of prepared.execute): the name is a hex digest of "
        "that text, the text is the caller's with its placeholders renumbered $1..$n; no value in it"
    ),
    "weft_django/store/prepared.py:execute_committed_then": (
        "BEGIN; EXECUTE <digest name>(%s, ...); COMMIT; <the caller's statement>: EXECUTE's arguments and "
        "the caller's statement's are %s placeholders (checked at its call site, store/runs.py), every "
        "value a parameter"
    ),
    "weft_django/store/prepared.py:_forget_if_missing": (
        "DEALLOCATE <name>: each name a hex digest of a statement's text (statement_name), no value"
    ),
    "weft_django/store/prepared.py:execute_statements": (
        "joins its caller's statements (checked at the call site, store/claims/taking.py) with EXECUTE "
        "<digest name>(%s, ...) in place of those prepared: every value is still a %s parameter"
    ),
    "weft_django/migrations/0016_drop_pattern_indexes.py:drop_pattern_indexes": (
        "DROP INDEX of index names read from pg_index (the pattern-ops indexes on weft's own tables), "
        "quoted with schema_editor.quote_name; the catalogue query's table list is a parameter"
    ),
    "weft_django/store/histories.py:load_sql": (
        "joins load_statements' six constant statements (table names from Model._meta, the ids clause "
        "its callers pass: placeholders or the constant transaction-setting array); values are parameters"
    ),
}


def test_every_raw_sql_call_site_in_weft_django_is_parameterised():
    """Identifiers (table names from module constants or ``Model._meta.db_table``, the epoch sequence,
    the NOTIFY channel) and vendor SQL fragments are formatted in; every value is a parameter."""
    package = {path: _parse(path) for path in SOURCES}
    found = [p for path, tree in package.items() for p in SqlScan(path, tree, package).run()]
    assert [str(p) for p in found if p.function not in REVIEWED] == []
    assert {p.function for p in found} == set(REVIEWED), "a REVIEWED entry no longer matches: remove it"
    call_sites = sum(
        1
        for path in SOURCES
        for node in ast.walk(_parse(path))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "execute"
    )
    assert call_sites >= 30  # the scan saw the raw SQL it is meant to check


# ------------------------------------------------------------------------------ admin: who may do what

ADMIN = "/admin/weft_django"
# Object actions served at <object>/act/<action>/ by each ModelAdmin that has them.
OBJECT_ACTIONS = {
    "workflow": ("cancel", "suspend", "resume", "retry", "signal", "purge"),
    "schedule": ("pause", "resume", "trigger"),
}
# Every field Django would accept in a POST to any of the app's pages, and each bulk action's confirmation.
POST_DATA = {"name": "go", "payload": "1", "reason": "x", "post": "yes", "apply": "1", "index": "0"}


@weft.workflow(name="security_tests.waits")
def waits(ctx, *args, **kwargs):
    yield ctx.wait_for_signal("go")


@pytest.fixture
def one_of_each(db) -> dict[str, Any]:
    """A row for every model the admin shows, so object pages exist."""
    from weft_django.store import engines

    weft.start("security_tests.waits", id="wf/1", args=[1])
    weft.start("security_tests.waits", id="done", args=[1])
    Workflow.objects.filter(pk="done").update(status="completed", finished_at=db_now(), result="1")
    engines.register_engine("engine-x", "workflow-lease", "default")
    weft.signal("wf/1", "go", {"n": 1})
    run_id = Workflow.objects.get(pk="wf/1").run_id
    Timer.objects.create(workflow_id="wf/1", run_id=run_id, kind=TimerKind.SLEEP, seq=0, fire_at=db_now())
    PendingUpdate.objects.create(workflow_id="wf/1", run_id=run_id, name="u", payload="1", created_at=db_now())
    weft.schedule("security_tests.waits", id="nightly", every="1h")
    return {"workflow": "wf/1"}


def weft_model_admins() -> list[tuple[Any, admin.ModelAdmin[Any]]]:
    return [(m, ma) for m, ma in admin.site._registry.items() if m._meta.app_label == "weft_django"]


def admin_urls(preferred: dict[str, Any]) -> list[str]:
    """Every URL of every weft_django ModelAdmin (its get_urls(), Django's own pages included), filled in
    with a real object and each object action."""
    urls = []
    for model, model_admin in weft_model_admins():
        name = model._meta.model_name
        obj = model._default_manager.filter(pk=preferred[name]).first() if name in preferred else None
        obj = obj or model._default_manager.order_by("pk").first()
        assert obj is not None, f"the fixture must create a {model.__name__} row"
        for pattern in model_admin.urls:
            route = str(pattern.pattern)
            route = route.replace("<path:object_id>", quote(str(obj.pk)))
            if "<str:action>" in route:
                assert name in OBJECT_ACTIONS, f"add {name}'s object actions to OBJECT_ACTIONS"
                urls += [f"{ADMIN}/{name}/{route.replace('<str:action>', a)}" for a in OBJECT_ACTIONS[name]]
            else:
                assert "<" not in route, f"unexpected URL parameter in {route}"
                urls.append(f"{ADMIN}/{name}/{route}")
    return urls


def snapshot() -> dict[str, list[dict[str, Any]]]:
    from weft_django.models import ClockOffset, EpochCounter

    return {
        model.__name__: list(model._default_manager.order_by("pk").values())
        for model in apps.get_app_config("weft_django").get_models()
        if model not in (ClockOffset, EpochCounter)
    }


def test_every_admin_url_sends_anonymous_users_to_login(client, one_of_each):
    urls = admin_urls(one_of_each)
    assert len(urls) > 20
    for url in urls:
        for response in (client.get(url), client.post(url, POST_DATA)):
            assert response.status_code == 302, url
            assert response["Location"].startswith("/admin/login/"), url


def test_every_admin_url_refuses_staff_without_permissions(one_of_each, django_user_model):
    user = django_user_model.objects.create_user("staff", password="pw", is_staff=True)
    client = Client()
    client.force_login(user)
    before = snapshot()
    for url in admin_urls(one_of_each):
        assert client.get(url, follow=True).status_code == 403, url
        assert client.post(url, POST_DATA, follow=True).status_code == 403, url
    assert snapshot() == before


def test_a_view_only_user_changes_nothing_through_any_admin_url(one_of_each, django_user_model):
    user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="weft_django", codename__startswith="view_")
    )
    client = Client()
    client.force_login(user)
    before = snapshot()
    bulk_actions = [
        name for _, model_admin in weft_model_admins() for name in getattr(model_admin, "actions", None) or []
    ]
    for url in admin_urls(one_of_each):
        assert client.get(url, follow=True).status_code in (200, 403, 405), url
        client.post(url, POST_DATA)
        for action in bulk_actions:
            action_name = action if isinstance(action, str) else action.__name__
            client.post(url, {**POST_DATA, "action": action_name, "_selected_action": ["wf/1", "done", "nightly"]})
    assert snapshot() == before


def _required_permission(model_name: str, action: str) -> str:
    if model_name == "workflow":
        from weft_django.admin import actions

        return actions.CODENAMES[actions.PERMISSION_OF[action]]
    from weft_django.admin import schedules

    return schedules.CODENAMES[action]


def test_each_object_action_needs_its_own_permission_not_just_any(one_of_each, django_user_model):
    """A staff user with every weft permission except the one an action needs is refused that action,
    on GET and POST, and nothing changes."""
    every = list(Permission.objects.filter(content_type__app_label="weft_django"))
    before = snapshot()
    for model_name, names in OBJECT_ACTIONS.items():
        target = quote(one_of_each.get(model_name, "nightly"))
        for action in names:
            needed = _required_permission(model_name, action)
            user = django_user_model.objects.create_user(f"no-{model_name}-{action}", password="pw", is_staff=True)
            user.user_permissions.add(*[p for p in every if p.codename != needed])
            client = Client()
            client.force_login(user)
            url = f"{ADMIN}/{model_name}/{target}/act/{action}/"
            assert client.get(url).status_code == 403, url
            assert client.post(url, POST_DATA).status_code == 403, url
    assert snapshot() == before


def test_every_admin_post_without_a_csrf_token_is_refused(admin_user, one_of_each):
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    before = snapshot()
    for url in admin_urls(one_of_each):
        response = client.post(url, {**POST_DATA, "action": "cancel_workflows", "_selected_action": ["wf/1"]})
        assert response.status_code == 403, url
        assert b"CSRF" in response.content, url
    assert snapshot() == before


# Rows the engine maintains. Schedule is configuration a person edits, through forms that call the
# public API; its engine-maintained fields must not be editable.
SCHEDULE_ENGINE_FIELDS = {
    "next_fire_at",
    "next_nominal_at",
    "last_fired_at",
    "missed_fire_count",
    "created_at",
    "updated_at",
}


def test_engine_owned_rows_are_read_only_from_the_web(admin_user, one_of_each):
    request = RequestFactory().get("/")
    request.user = admin_user  # a superuser: every permission, so only the ModelAdmin can refuse
    checked = set()
    for model, model_admin in weft_model_admins():
        obj = model._default_manager.order_by("pk").first()
        if model is Schedule:
            for instance in (None, obj):
                form = model_admin.get_form(request, instance)
                assert not SCHEDULE_ENGINE_FIELDS & set(form.base_fields), form.base_fields
            continue
        assert not model_admin.has_add_permission(request), model
        assert not model_admin.has_change_permission(request, obj), model
        assert not model_admin.has_delete_permission(request, obj), model
        assert "delete_selected" not in model_admin.get_actions(request), model
        checked.add(model.__name__)
    assert {"Workflow", "WorkflowClaim", "Engine", "Timer", "BufferedSignal", "PendingUpdate"} <= checked


def test_a_superuser_cannot_edit_an_engine_owned_row_by_posting_its_form(admin_client, one_of_each):
    before = snapshot()
    for model, _ in weft_model_admins():
        if model is Schedule:
            continue
        obj = model._default_manager.order_by("pk").first()
        name = model._meta.model_name
        for url in (f"{ADMIN}/{name}/{quote(str(obj.pk))}/change/", f"{ADMIN}/{name}/add/"):
            assert admin_client.post(url, {"status": "completed", "engine_id": "me", "epoch": "1"}).status_code == 403
        assert admin_client.post(f"{ADMIN}/{name}/{quote(str(obj.pk))}/delete/", {"post": "yes"}).status_code == 403
    assert snapshot() == before


def test_the_admin_escapes_what_clients_and_workflow_code_wrote(admin_client, db):
    script = "<script>alert(1)</script>"
    weft.start("security_tests.waits", id="xss", args=[script], kwargs={script: script})
    Workflow.objects.filter(pk="xss").update(
        status="failed", finished_at=db_now(), error={"type": script, "message": script, "traceback": script}
    )
    weft.start("security_tests.waits", id="xss-2", args=[1])
    weft.signal("xss-2", "go", script)
    for url in (
        f"{ADMIN}/workflow/",
        f"{ADMIN}/workflow/xss/change/",
        f"{ADMIN}/workflow/xss-2/change/",
        f"{ADMIN}/bufferedsignal/",
    ):
        page = admin_client.get(url).content.decode()
        assert script not in page, url
    assert "&lt;script&gt;" in admin_client.get(f"{ADMIN}/workflow/xss/change/").content.decode()


# ------------------------------------------------------------------------------ the CLI asks first


def _weft_subcommands() -> dict[str, Any]:
    from weft_django.management.commands.weft import Command

    parser = Command().create_parser("manage.py", "weft")
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return dict(sub.choices)


def test_destructive_subcommands_have_yes_and_refuse_without_it_when_not_interactive(db, monkeypatch):
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False, raising=False)
    subcommands = _weft_subcommands()
    asking = {name for name, parser in subcommands.items() if any("--yes" in a.option_strings for a in parser._actions)}
    destructive = {"cancel", "purge"} | {
        n for n in subcommands if any(w in n for w in ("delete", "purge", "reset", "drop"))
    }
    assert destructive <= asking, f"destructive subcommands without --yes: {destructive - asking}"
    weft.start("security_tests.waits", id="keep", args=[1])
    weft.start("security_tests.waits", id="old", args=[1])
    Workflow.objects.filter(pk="old").update(status="completed", finished_at=db_now() - timedelta(days=365))
    before = snapshot()
    arguments = {"cancel": ["keep"], "purge": ["--older-than", "1d"], "bulk": ["cancel", "--where", "id_prefix=keep"]}
    for name in sorted(asking):
        with pytest.raises(CommandError, match="pass --yes"):
            call_command("weft", name, *arguments.get(name, ["keep"]))
    assert snapshot() == before


# ------------------------------------------------------------------------------ payload size limits

LIMIT = 256
BIG = "x" * (LIMIT + 1)


@weft.activity(name="security_tests.big_result", retry=weft.RetryPolicy(max_attempts=1))
def big_result() -> str:
    return BIG


@weft.workflow(name="security_tests.calls_big_activity")
def calls_big_activity(ctx):
    return (yield ctx.run(big_result))


@weft.workflow(name="security_tests.returns_big")
def returns_big(ctx):
    yield ctx.sleep(0)
    return BIG


@pytest.fixture
def small_limit(settings):
    settings.WEFT = {**settings.WEFT, "PAYLOAD_MAX_BYTES": LIMIT}


def test_oversize_client_payloads_are_refused_and_nothing_is_stored(small_limit, db):
    handle = weft.start("security_tests.waits", id="sized", args=[1])
    before = snapshot()
    attempts = {
        "start": lambda: weft.start("security_tests.waits", id="too-big", args=[BIG]),
        "signal": lambda: handle.signal("go", BIG),
        "update": lambda: handle.update("u", BIG, timeout="100ms"),
        "query": lambda: handle.query("q", BIG, timeout="100ms"),
        "schedule": lambda: weft.schedule("security_tests.waits", id="too-big", every="1h", args=[BIG]),
    }
    for what, attempt in attempts.items():
        with pytest.raises(PayloadSizeExceededError, match=rf"over the limit of {LIMIT} bytes"):
            attempt()
        assert snapshot() == before, what
    assert not BufferedSignal.objects.exists() and not QueryRequest.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_oversize_activity_and_workflow_results_are_refused_not_stored(small_limit, weft_run_until_idle):
    activity = weft.start("security_tests.calls_big_activity")
    workflow = weft.start("security_tests.returns_big")
    weft_run_until_idle()
    step = Step.objects.get(workflow_id=activity.id)
    assert step.result is None and "PayloadSizeExceededError" in str(step.error)
    for handle in (activity, workflow):
        row = Workflow.objects.get(pk=handle.id)
        assert row.status == "failed" and row.result is None, row.error
    assert Workflow.objects.get(pk=workflow.id).error["type"].endswith("PayloadSizeExceededError")
