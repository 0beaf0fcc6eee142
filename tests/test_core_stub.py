"""``_core.pyi`` declares the compiled engine exactly as the pure-Python twin ``_core_py.py`` is annotated.

Type checkers read the stub for ``fastlease._core`` and the twin wherever code is typed against it, so the
two must not drift. Both files are parsed with ``ast`` and compared declaration by declaration: every
public module-level function, class, method, property and attribute (names, parameter names and kinds,
defaults and annotations, normalised by ``ast.unparse``), and the constants the stub declares. The sets
of public names are compared with what the compiled module really exports, and the compiled functions'
own parameter names and defaults with the stub's.

"Public" means not starting with ``_`` (plus the dunder methods a class defines, such as ``__init__``).
What a module merely imports (``heapq``, ``threading``, the exception classes, typing helpers) is not
exported by the engine, so it is not public here: in the sources, only definitions count; at run time,
modules and objects defined in another module are left out.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import re
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

import fastlease._core_py as twin

PACKAGE = Path(twin.__file__).parent
STUB_PATH = PACKAGE / "_core.pyi"
TWIN_PATH = PACKAGE / "_core_py.py"


# ---------------------------------------------------------------------------------------------
# Declarations, as read from a source file
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Param:
    kind: str  # "positional-only", "positional", "*args", "keyword-only" or "**kwargs"
    name: str
    annotation: Optional[str]
    default: Optional[str]

    def __str__(self) -> str:
        text = {"*args": "*", "**kwargs": "**"}.get(self.kind, "") + self.name
        if self.annotation is not None:
            text += f": {self.annotation}"
        if self.default is not None:
            text += f" = {self.default}"
        return text + (f" [{self.kind}]" if self.kind in ("positional-only", "keyword-only") else "")


@dataclass
class Decl:
    """A function, method, property, attribute, constant or class."""

    kind: str  # "function", "staticmethod", "classmethod", "property", "attribute", "constant", "class"
    params: List[Param] = field(default_factory=list)
    returns: Optional[str] = None
    annotation: Optional[str] = None  # attributes and constants
    alias_of: Optional[str] = None  # ``name = staticmethod(expr)`` in a class body: the expr
    members: Dict[str, "Decl"] = field(default_factory=dict)  # classes

    def signature(self) -> str:
        return f"({', '.join(map(str, self.params))}) -> {self.returns}"


def _text(node: Optional[ast.AST]) -> Optional[str]:
    return None if node is None else ast.unparse(node)


def _function(node: ast.FunctionDef | ast.AsyncFunctionDef) -> Decl:
    decorators = {ast.unparse(decorator) for decorator in node.decorator_list}
    kind = "function"
    for name in ("staticmethod", "classmethod", "property"):
        if name in decorators:
            kind = name
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    defaults: List[Optional[ast.expr]] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    params = [
        Param("positional-only" if index < len(args.posonlyargs) else "positional", arg.arg, _text(arg.annotation),
              _text(default))
        for index, (arg, default) in enumerate(zip(positional, defaults))
    ]
    if args.vararg is not None:
        params.append(Param("*args", args.vararg.arg, _text(args.vararg.annotation), None))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        params.append(Param("keyword-only", arg.arg, _text(arg.annotation), _text(default)))
    if args.kwarg is not None:
        params.append(Param("**kwargs", args.kwarg.arg, _text(args.kwarg.annotation), None))
    return Decl(kind, params=params, returns=_text(node.returns))


def _is_public(name: str) -> bool:
    return not name.startswith("_")


def _is_public_member(name: str) -> bool:
    return _is_public(name) or (name.startswith("__") and name.endswith("__") and name != "__slots__")


def _self_attributes(function: ast.AST) -> Dict[str, Optional[str]]:
    """``self.name = ...`` and ``self.name: T = ...`` in a method body: name -> annotation (or None)."""
    found: Dict[str, Optional[str]] = {}
    for node in ast.walk(function):
        targets: List[ast.expr] = []
        annotation = None
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets, annotation = [node.target], _text(node.annotation)
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                if annotation is not None or target.attr not in found:
                    found[target.attr] = annotation
    return found


def _class(node: ast.ClassDef) -> Decl:
    members: Dict[str, Decl] = {}
    for statement in node.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if _is_public_member(statement.name):
                members[statement.name] = _function(statement)
            for name, annotation in _self_attributes(statement).items():
                if _is_public(name) and (name not in members or annotation is not None):
                    members[name] = Decl("attribute", annotation=annotation)
        elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            if _is_public_member(statement.target.id):
                members[statement.target.id] = Decl("attribute", annotation=_text(statement.annotation))
        elif isinstance(statement, ast.Assign):
            for target in statement.targets:
                if not isinstance(target, ast.Name):
                    continue
                if target.id == "__slots__":
                    for slot in ast.literal_eval(statement.value):
                        if _is_public(slot):
                            members.setdefault(slot, Decl("attribute"))
                elif _is_public_member(target.id):
                    value = statement.value
                    if isinstance(value, ast.Call) and ast.unparse(value.func) == "staticmethod":
                        members[target.id] = Decl("staticmethod", alias_of=ast.unparse(value.args[0]))
                    else:
                        members[target.id] = Decl("attribute")
    return Decl("class", members=members)


def declarations(source: str) -> Dict[str, Decl]:
    """The public module-level definitions of a module's source (imports are not definitions)."""
    found: Dict[str, Decl] = {}
    for statement in ast.parse(source).body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found[statement.name] = _function(statement)
        elif isinstance(statement, ast.ClassDef):
            found[statement.name] = _class(statement)
        elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            found[statement.target.id] = Decl("constant", annotation=_text(statement.annotation))
        elif isinstance(statement, ast.Assign):
            for target in statement.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = Decl("constant")
    return {name: decl for name, decl in found.items() if _is_public(name)}


# ---------------------------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------------------------
def _compare_signatures(where: str, stub: Decl, twin_decl: Decl) -> List[str]:
    problems = []
    if stub.returns != twin_decl.returns:
        problems.append(f"{where}: return annotation: stub {stub.returns} != twin {twin_decl.returns}")
    for index in range(max(len(stub.params), len(twin_decl.params))):
        mine = stub.params[index] if index < len(stub.params) else None
        theirs = twin_decl.params[index] if index < len(twin_decl.params) else None
        if mine != theirs:
            problems.append(f"{where}: parameter {index + 1}: stub `{mine or '(none)'}` != twin `{theirs or '(none)'}`")
    return problems


def _compare_alias(where: str, stub: Decl, alias_of: str, runtime: Any) -> List[str]:
    """A twin member ``name = staticmethod(expr)``: compare the stub with the object at run time."""
    if stub.kind != "staticmethod":
        return [f"{where}: stub declares a {stub.kind}, twin has staticmethod({alias_of})"]
    try:
        parameters = list(inspect.signature(runtime).parameters)
    except ValueError:  # a builtin without a signature (time.monotonic_ns): call it as the stub says
        if stub.params:
            return [f"{where}: twin's staticmethod({alias_of}) has no readable signature; the stub takes "
                    f"parameters ({stub.signature()})"]
        result = runtime()
        expected = getattr(builtins, stub.returns or "", None)
        if not isinstance(expected, type) or not isinstance(result, expected):
            return [f"{where}: staticmethod({alias_of})() returned {type(result).__name__}, stub says {stub.returns}"]
        return []
    names = [param.name for param in stub.params]
    return [] if parameters == names else [f"{where}: parameters: stub {names} != {alias_of} {parameters}"]


def compare(stub: Dict[str, Decl], twin_decls: Dict[str, Decl], twin_module: Any = None) -> List[str]:
    """Every difference between the stub's and the twin's declarations, one line each."""
    problems = [f"only in the stub: {name}" for name in sorted(stub.keys() - twin_decls.keys())]
    problems += [f"only in the twin: {name}" for name in sorted(twin_decls.keys() - stub.keys())]
    for name in sorted(stub.keys() & twin_decls.keys()):
        mine, theirs = stub[name], twin_decls[name]
        if mine.kind != theirs.kind:
            problems.append(f"{name}: stub declares a {mine.kind}, twin defines a {theirs.kind}")
        elif mine.kind == "function":
            problems += _compare_signatures(name, mine, theirs)
        elif mine.kind == "class":
            problems += _compare_class(name, mine, theirs, getattr(twin_module, name, None))
    return problems


def _compare_class(name: str, stub: Decl, twin_decl: Decl, runtime_class: Any) -> List[str]:
    problems = [f"{name}.{member}: only in the stub"
                for member in sorted(stub.members.keys() - twin_decl.members.keys())]
    problems += [f"{name}.{member}: only in the twin"
                 for member in sorted(twin_decl.members.keys() - stub.members.keys())]
    for member in sorted(stub.members.keys() & twin_decl.members.keys()):
        where = f"{name}.{member}"
        mine, theirs = stub.members[member], twin_decl.members[member]
        if theirs.alias_of is not None:
            problems += _compare_alias(where, mine, theirs.alias_of, getattr(runtime_class, member, None))
        elif mine.kind != theirs.kind:
            problems.append(f"{where}: stub declares a {mine.kind}, twin defines a {theirs.kind}")
        elif mine.kind == "attribute":
            if mine.annotation is None:
                problems.append(f"{where}: the stub declares no type")
            elif theirs.annotation is not None and theirs.annotation != mine.annotation:
                problems.append(f"{where}: type: stub {mine.annotation} != twin {theirs.annotation}")
        else:
            problems += _compare_signatures(where, mine, theirs)
    return problems


def _report(problems: List[str], what: str) -> None:
    if problems:
        pytest.fail(f"{what} ({len(problems)} mismatches):\n  " + "\n  ".join(problems), pytrace=False)


STUB = declarations(STUB_PATH.read_text(encoding="utf-8"))
TWIN = declarations(TWIN_PATH.read_text(encoding="utf-8"))


def test_stub_matches_the_twin_declaration_by_declaration() -> None:
    _report(compare(STUB, TWIN, twin), "_core.pyi and _core_py.py differ")


def test_the_comparison_reports_each_mismatch() -> None:
    stub = declarations(
        "X: int\n"
        "def f(a: int, b: str = 'x') -> int: ...\n"
        "class C:\n"
        "    size: int\n"
        "    def m(self, a: int) -> None: ...\n"
        "    @property\n"
        "    def p(self) -> int: ...\n"
    )
    twin_decls = declarations(
        "X = 1\n"
        "Y = 2\n"
        "def f(a: int, b: bytes = 'x', *, c: int = 0) -> int: ...\n"
        "class C:\n"
        "    def __init__(self) -> None:\n"
        "        self.size: str = ''\n"
        "    def m(self, a: int) -> None: ...\n"
        "    def p(self) -> int: ...\n"
        "    def extra(self) -> None: ...\n"
    )
    assert compare(stub, twin_decls) == [
        "only in the twin: Y",
        "C.__init__: only in the twin",
        "C.extra: only in the twin",
        "C.p: stub declares a property, twin defines a function",
        "C.size: type: stub int != twin str",
        "f: parameter 2: stub `b: str = 'x'` != twin `b: bytes = 'x'`",
        "f: parameter 3: stub `(none)` != twin `c: int = 0 [keyword-only]`",
    ]


# ---------------------------------------------------------------------------------------------
# What the modules export at run time
# ---------------------------------------------------------------------------------------------
def exported(module: types.ModuleType) -> set[str]:
    """Public names a module defines: not modules, and not objects defined in another module."""
    names = set()
    for name, value in vars(module).items():
        if not _is_public(name) or isinstance(value, types.ModuleType):
            continue
        if callable(value) and getattr(value, "__module__", module.__name__) != module.__name__:
            continue  # imported (LockLost, StoreError, ...): the engine uses it, it does not define it
        names.add(name)
    return names


def _compiled() -> types.ModuleType:
    import fastlease._core as compiled

    return compiled


@pytest.mark.c_extension
def test_public_names_are_the_same_in_the_stub_and_the_compiled_module() -> None:
    """(The twin's public names are its definitions, compared with the stub's above: at run time its
    namespace also holds what it imports for annotations, such as TYPE_CHECKING and cast.)"""
    compiled = _compiled()
    problems = [f"exported by fastlease._core, not declared in the stub: {name}"
                for name in sorted(exported(compiled) - STUB.keys())]
    problems += [f"declared in the stub, not exported by fastlease._core: {name}"
                 for name in sorted(STUB.keys() - exported(compiled))]
    _report(problems, "public names differ")


def _embedded_init(cls: type) -> List[tuple[str, Optional[str]]]:
    """``__init__``'s parameters from Cython's embedded signature (``Lease(client, ..., on_lost=None)``,
    C types such as ``KeyTemplate template`` included): [(name, default text)], self first."""
    first_line = (cls.__doc__ or "").split("\n", 1)[0]
    match = re.fullmatch(rf"{cls.__name__}\((.*)\)", first_line)
    assert match, f"{cls.__name__}: no embedded signature in its docstring ({first_line!r})"
    params: List[tuple[str, Optional[str]]] = [("self", None)]
    for part in filter(None, (piece.strip() for piece in match.group(1).split(","))):
        declaration, _, default = part.partition("=")
        params.append((declaration.split()[-1], default.strip() or None))
    return params


@pytest.mark.c_extension
def test_compiled_parameters_match_the_stub() -> None:
    """Parameter names (and defaults) as the compiled functions report them, against the stub."""
    compiled = _compiled()
    problems: List[str] = []

    def check(where: str, runtime: Any, decl: Decl, init_of: Optional[type] = None) -> None:
        expected = [(param.name, param.default) for param in decl.params]
        if init_of is not None:
            actual = _embedded_init(init_of)
        else:
            try:
                signature = inspect.signature(runtime)
            except ValueError:
                return  # slot wrappers (__len__) and builtin aliases (checked by the twin comparison)
            actual = [(name, None if param.default is param.empty else repr(param.default))
                      for name, param in signature.parameters.items()]
            expected = [(name, None if default is None else repr(eval(default, vars(compiled))))
                        for name, default in expected]
        if actual != expected:
            problems.append(f"{where}: compiled {actual} != stub {expected}")

    for name, decl in STUB.items():
        runtime = getattr(compiled, name, None)
        if decl.kind == "function":
            check(name, runtime, decl)
        elif decl.kind == "class":
            public = {member for member in dir(runtime) if _is_public(member)}
            declared = {member for member in decl.members if _is_public(member)}
            problems += [f"{name}.{member}: on the compiled class, not in the stub"
                         for member in sorted(public - declared)]
            problems += [f"{name}.{member}: in the stub, not on the compiled class"
                         for member in sorted(declared - public)]
            for member, member_decl in decl.members.items():
                if member_decl.kind in ("attribute", "property") or member not in dir(runtime):
                    continue
                if member == "__init__":
                    check(f"{name}.__init__", None, member_decl, init_of=runtime)
                else:
                    check(f"{name}.{member}", getattr(runtime, member), member_decl)
    _report(problems, "fastlease._core and _core.pyi differ")


def _conforms(value: Any, annotation: ast.expr, module: types.ModuleType) -> bool:
    if isinstance(annotation, ast.Name):
        expected = getattr(builtins, annotation.id, None) or getattr(module, annotation.id)
        if expected is int:
            return type(value) is int
        return isinstance(value, expected)
    if isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value) == "tuple":
        element, ellipsis = getattr(annotation.slice, "elts", (None, None))
        assert isinstance(ellipsis, ast.Constant) and ellipsis.value is Ellipsis, ast.unparse(annotation)
        return isinstance(value, tuple) and all(_conforms(item, element, module) for item in value)
    raise AssertionError(f"the test cannot check a constant declared as {ast.unparse(annotation)}")


@pytest.mark.c_extension
def test_declared_constants_have_their_types_in_both_engines() -> None:
    problems = []
    for module in (_compiled(), twin):
        for name, decl in STUB.items():
            if decl.kind != "constant":
                continue
            if not hasattr(module, name):
                problems.append(f"{module.__name__}.{name}: missing")
                continue
            annotation = ast.parse(decl.annotation or "", mode="eval").body
            value = getattr(module, name)
            if not _conforms(value, annotation, module):
                problems.append(f"{module.__name__}.{name} = {value!r:.60}: not a {decl.annotation}")
    _report(problems, "constants differ from their declarations")
