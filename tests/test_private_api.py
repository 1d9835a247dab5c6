"""No module of ``src/`` but ``src/speedups.py`` touches a private name of Lightning, torch or jsonargparse.

A private name (a leading underscore: ``_x``; dunders such as ``__init__`` are public protocol) can change
in any release without a deprecation, so code that reads it breaks on an upgrade, loudly or silently.
Lightning's loops count too though their attributes look public: they are private classes (``_FitLoop``,
``_TrainingEpochLoop``), so ``trainer.fit_loop.epoch_loop.batch_progress`` is as internal as ``_results``.
A speed-up that needs an internal lives in ``src/speedups.py``, which names it and has a canary test.

The scanner reads the code with ``ast``. It flags private names imported from those packages, and
private attributes read or written on whatever the code got from them: a name bound by an import, a
parameter annotated with one of their types, a variable assigned from either, the objects they hand
to our code by a conventional name (``trainer``, ``pl_module``, ``optimizer``, ...) or reached through
one (``self.trainer.strategy``), and on ``self`` the private attributes a library base class owns. Our own
private names (``self._before`` on our own attribute, a module's ``_helper``) are not its business.
It is tried on snippets first, each one it must flag and each one it must not, so that a scanner that
finds nothing cannot pass for a clean ``src/``.
"""

import ast
import functools
import importlib
import inspect
import re
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: the one module allowed internals: each use there names the internal and has a canary test
EXEMPT = {"src/speedups.py"}
#: (path, finding) -> why it is a documented public API despite the underscore; empty while none is
ALLOWED: dict[tuple[str, str], str] = {}

LIBRARIES = frozenset({"lightning", "pytorch_lightning", "lightning_fabric", "torch", "jsonargparse"})
#: names by which our code conventionally holds what those libraries hand it (hook arguments, the
#: Trainer's attributes, the parser and its namespaces)
LIBRARY_OBJECTS = frozenset({
    "trainer", "pl_module", "module", "model", "optimizer", "optimizers", "scheduler", "lr_scheduler",
    "parser", "cfg", "config", "logger", "writer", "experiment", "loader", "dataloader", "datamodule",
    "strategy", "accelerator", "precision_plugin", "checkpoint_io", "profiler", "callback",
    "checkpoint_callback", "fabric",
})  # fmt: skip
#: Lightning's private attributes, flagged on any object (a LightningModule's own ``self`` included)
LIGHTNING_PRIVATE = frozenset({
    "_current_fx_name", "_logger_connector", "_results", "_active_loop", "_batches_that_stepped",
    "_data_connector", "_checkpoint_connector", "_parse_ckpt_path", "_hparams", "_hparams_initial",
    "_trainer",
})  # fmt: skip
#: the Trainer's loops: every attribute read through one is an internal of a private class
LOOPS = frozenset({"fit_loop", "validate_loop", "test_loop", "predict_loop", "epoch_loop"})
#: loop internals flagged whatever they are reached through
LOOP_INTERNALS = frozenset({"epoch_loop", "batch_progress"})
#: a dotted path into one of them with a private part, as a string names it (``"torch._dynamo.config"``)
PRIVATE_PATH = re.compile(rf"({'|'.join(LIBRARIES)})(\.\w+)*\._\w*(\.\w+)*")
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def is_private(name: str) -> bool:
    return name.startswith("_") and name != "_" and not (name.startswith("__") and name.endswith("__"))


def is_library_path(dotted: str) -> bool:
    return dotted.split(".")[0] in LIBRARIES


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


@dataclass
class Chain:
    """An expression such as ``trainer.strategy.reduce(x)[0]._y``, taken apart."""

    root: str | None  # the name it starts at ("trainer"), "super()", or None for any other start
    attributes: list[ast.Attribute]  # its attribute accesses, outermost last
    inner: list[ast.expr]  # what it holds that is scanned on its own: call arguments, subscripts

    @property
    def names(self) -> list[str]:
        return [a.attr for a in self.attributes]


def chain(node: ast.expr) -> Chain:
    attributes: list[ast.Attribute] = []
    inner: list[ast.expr] = []
    while True:
        if isinstance(node, ast.Attribute):
            attributes.append(node)
            node = node.value
        elif isinstance(node, ast.Subscript):
            inner.append(node.slice)
            node = node.value
        elif isinstance(node, ast.Call):
            inner += [*node.args, *(k.value for k in node.keywords)]
            name = node.func.id if isinstance(node.func, ast.Name) else None
            if name == "super":
                return Chain("super()", attributes[::-1], inner)
            # type(trainer)._x reaches into trainer's class
            node = inner.pop() if name == "type" and len(node.args) == 1 and not node.keywords else node.func
        else:
            break
    if isinstance(node, ast.Name):
        return Chain(node.id, attributes[::-1], inner)
    return Chain(None, attributes[::-1], [*inner, node])


def own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``scope`` outside the functions and classes nested in it."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, SCOPES):
            todo += ast.iter_child_nodes(node)


def bindings(node: ast.AST) -> Iterator[tuple[str, ast.expr]]:
    """(name, value) for each plain name ``node`` binds to a value: ``=``, ``for``, ``with``, ``:=``."""
    pairs: list[tuple[ast.expr, ast.expr | None]] = []
    if isinstance(node, ast.Assign):
        pairs = [(target, node.value) for target in node.targets]
    elif isinstance(node, ast.AnnAssign | ast.NamedExpr):
        pairs = [(node.target, node.value)]
    elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
        pairs = [(node.target, node.iter)]
    elif isinstance(node, ast.withitem) and node.optional_vars is not None:
        pairs = [(node.optional_vars, node.context_expr)]
    for target, value in pairs:
        names = target.elts if isinstance(target, ast.Tuple | ast.List) else [target]
        for name in names:
            if isinstance(name, ast.Name) and value is not None:
                yield name.id, value


@dataclass
class Source:
    path: str  # as reported: "src/models/base.py"
    module: str  # "src.models.base"
    tree: ast.Module

    @functools.cached_property
    def imports(self) -> dict[str, str]:
        """Each name the module's imports bind, to the dotted path it stands for."""
        package = self.module if self.path.endswith("__init__.py") else self.module.rpartition(".")[0]
        bound = {}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:  # `import a.b` binds a; `import a.b as c` binds c to a.b
                    top = alias.name.split(".")[0]
                    bound[alias.asname or top] = alias.name if alias.asname else top
            elif isinstance(node, ast.ImportFrom):
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1]) if node.level else ""
                module = ".".join(p for p in (base, node.module or "") if p)
                for alias in node.names:
                    bound[alias.asname or alias.name] = f"{module}.{alias.name}"
        return bound

    def dotted(self, node: ast.expr) -> str | None:
        """The dotted path a base-class expression such as ``L.LightningModule`` stands for."""
        found = chain(node)
        if found.root is None or found.inner or found.root == "super()":
            return None
        start = self.imports.get(found.root, f"{self.module}.{found.root}")
        return ".".join([start, *found.names])


def import_dotted(dotted: str) -> object:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            found = getattr(found, part, None)
        return found
    return None


@functools.cache
def library_private_names(dotted: str) -> frozenset[str]:
    """The private names a library class and its library bases define or set on ``self``."""
    cls = import_dotted(dotted)
    if not isinstance(cls, type):
        return frozenset()
    names: set[str] = set()
    for klass in cls.__mro__:
        if not is_library_path(klass.__module__):
            continue
        names.update(name for name in vars(klass) if is_private(name))
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):  # compiled, or no source shipped
            continue
        names.update(
            node.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and is_private(node.attr)
        )
    return frozenset(names)


class Project:
    """The scanned modules, so that a class's library bases are found through our own classes."""

    def __init__(self, sources: list[Source]) -> None:
        self.modules = {source.module: source for source in sources}
        self.classes = {
            f"{source.module}.{node.name}": (source, node)
            for source in sources
            for node in source.tree.body
            if isinstance(node, ast.ClassDef)
        }

    def resolve(self, dotted: str, seen: frozenset[str] = frozenset()) -> str:
        """Follow re-exports (``from src.models import BaseTask``) to where a class is defined."""
        module, _, name = dotted.rpartition(".")
        source = self.modules.get(module)
        if dotted in self.classes or source is None or name not in source.imports or dotted in seen:
            return dotted
        return self.resolve(source.imports[name], seen | {dotted})

    def owned(self, dotted: str, seen: frozenset[str] = frozenset()) -> dict[str, str]:
        """Each private name a library base of the class ``dotted`` owns, to that base's path."""
        dotted = self.resolve(dotted)
        if is_library_path(dotted):
            return dict.fromkeys(library_private_names(dotted), dotted)
        if dotted not in self.classes or dotted in seen:
            return {}
        source, node = self.classes[dotted]
        owned: dict[str, str] = {}
        for base in node.bases:
            path = source.dotted(base)
            if path is not None:
                owned |= self.owned(path, seen | {dotted})
        return owned


class Scanner(ast.NodeVisitor):
    """The findings of one module."""

    def __init__(self, source: Source, project: Project) -> None:
        self.source, self.project = source, project
        self.findings: list[Finding] = []
        self.library_names = {name for name, path in source.imports.items() if is_library_path(path)}
        self.scopes: list[set[str]] = []  # the names each enclosing scope binds to library objects
        self.scopes.append(self.bound_in(source.tree))
        self.classes: list[dict[str, str]] = []  # what each enclosing class's library bases own
        self.docstrings = {
            id(node.value)
            for node in ast.walk(source.tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        }

    def flag(self, node: ast.AST, what: str, line: int | None = None) -> None:
        self.findings.append(Finding(self.source.path, line or getattr(node, "lineno", 0), what))

    # -- what a name holds -------------------------------------------------------------------------------

    def is_library_root(self, root: str | None) -> bool:
        return root is not None and (
            root in LIBRARY_OBJECTS or root in self.library_names or any(root in s for s in self.scopes)
        )

    def holds_library_object(self, node: ast.expr, local: set[str]) -> bool:
        found = chain(node)
        return (
            self.is_library_root(found.root)
            or found.root in local
            or any(name in LIBRARY_OBJECTS for name in found.names)
        )

    def mentions_library(self, annotation: ast.expr) -> bool:
        if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
            try:
                annotation = ast.parse(annotation.value, mode="eval").body
            except SyntaxError:
                return False
        return any(isinstance(n, ast.Name) and n.id in self.library_names for n in ast.walk(annotation))

    def bound_in(self, scope: ast.AST) -> set[str]:
        """The names a scope binds to library objects: annotated parameters, and assignments from them."""
        nodes = list(own_nodes(scope))
        local = {
            node.arg
            for node in nodes
            if isinstance(node, ast.arg) and node.annotation and self.mentions_library(node.annotation)
        }
        local |= {
            node.target.id
            for node in nodes
            if isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and self.mentions_library(node.annotation)
        }
        pairs = [pair for node in nodes for pair in bindings(node)]
        while new := {n for n, value in pairs if n not in local and self.holds_library_object(value, local)}:
            local |= new
        return local

    # -- the rules ---------------------------------------------------------------------------------------

    def problems(self, root: str | None, names: list[str]) -> list[tuple[str, str]]:
        """(name, why) for each name of ``root.names[0].names[1]...`` that is a library's internal."""
        owner_names = self.classes[-1] if self.classes else {}
        found = []
        in_loop = False  # past a loop's first internal, which names the whole reach into it
        for i, name in enumerate(names):
            before = names[:i]
            if not in_loop and (name in LOOP_INTERNALS or any(b in LOOPS for b in before)):
                in_loop = True
                found.append((name, "Lightning's loop internals (its loops are private classes)"))
            elif not is_private(name):
                continue
            elif name in LIGHTNING_PRIVATE:
                found.append((name, "Lightning's private attribute"))
            elif self.is_library_root(root) or any(b in LIBRARY_OBJECTS for b in before):
                found.append((name, "private to a library object"))
            elif i == 0 and root in ("self", "cls", "super()") and name in owner_names:
                found.append((name, f"private to {owner_names[name]}"))
        return found

    def report(self, node: ast.expr, shown: str, found: list[tuple[str, str]]) -> None:
        by_why: dict[str, list[str]] = {}
        for name, why in found:
            by_why.setdefault(why, []).append(name)
        shown = shown if len(shown) <= 90 else shown[:87] + "..."
        what = f"`{shown}`: " + "; ".join(f"{', '.join(n)}: {why}" for why, n in by_why.items())
        self.flag(node, what, node.end_lineno)  # where the attribute's name is, in a chain over lines

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if is_library_path(alias.name) and any(map(is_private, alias.name.split("."))):
                self.flag(node, f"imports the private module `{alias.name}`")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level or not is_library_path(module):
            return
        if any(map(is_private, module.split("."))):
            self.flag(node, f"imports from the private module `{module}`")
        for alias in node.names:
            if is_private(alias.name):
                self.flag(node, f"imports the private name `{alias.name}` from `{module}`")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        found = chain(node)
        problems = self.problems(found.root, found.names)
        if problems:
            self.report(node, ast.unparse(node), problems)
        for inner in found.inner:
            self.visit(inner)

    def visit_Call(self, node: ast.Call) -> None:
        name = node.func.id if isinstance(node.func, ast.Name) else None
        if name in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2:
            obj, key = node.args[:2]
            if isinstance(key, ast.Constant) and isinstance(key.value, str) and is_private(key.value):
                found = chain(obj)
                problems = [
                    p for p in self.problems(found.root, [*found.names, key.value]) if p[0] == key.value
                ]
                if problems:
                    self.report(node, f"{name}({ast.unparse(obj)}, {key.value!r})", problems)
                for arg in [obj, *node.args[2:], *(k.value for k in node.keywords)]:
                    self.visit(arg)
                return
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if not isinstance(node.value, str) or id(node) in self.docstrings:
            return
        if node.value in LIGHTNING_PRIVATE:
            self.flag(node, f"the string {node.value!r} names Lightning's private attribute")
        elif PRIVATE_PATH.fullmatch(node.value):
            self.flag(node, f"the string {node.value!r} names a private path")

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if node in self.source.tree.body:
            owned = self.project.owned(f"{self.source.module}.{node.name}")
        else:  # a nested class, which the project does not index: its bases as written
            paths = [self.source.dotted(base) for base in node.bases]
            owned = {k: v for path in paths if path for k, v in self.project.owned(path).items()}
        for statement in node.body:
            defined = (
                [statement.name] if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef) else []
            )
            defined += [n for n, _ in bindings(statement)]
            for name in defined:
                if name in owned:
                    self.flag(statement, f"`{node.name}.{name}` overrides {owned[name]}'s private `{name}`")
        self.classes.append(owned)
        self.generic_visit(node)
        self.classes.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        self.scopes.append(self.bound_in(node))
        self.generic_visit(node)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef
    visit_Lambda = visit_FunctionDef


def scan(sources: list[Source]) -> list[Finding]:
    project = Project(sources)
    findings = []
    for source in sources:
        scanner = Scanner(source, project)
        scanner.visit(source.tree)
        findings += scanner.findings
    return sorted(findings, key=lambda f: (f.path, f.line, f.what))


def read(path: Path) -> Source:
    relative = path.relative_to(ROOT)
    parts = relative.with_suffix("").parts
    module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return Source(relative.as_posix(), module, ast.parse(path.read_text(), filename=str(relative)))


def scan_snippet(code: str) -> list[str]:
    return [f.what for f in scan([Source("snippet.py", "src.snippet", ast.parse(textwrap.dedent(code)))])]


# -- the scanner itself: what it must flag, and what it must leave alone ----------------------------------

FLAGGED = {
    "private name from lightning": "from lightning.pytorch.trainer.call import _call_callback_hooks",
    "private type alias": "from lightning.fabric.utilities.types import _PATH",
    "private loop class": "from lightning.pytorch.loops.fit_loop import _FitLoop",
    "private name from torch": "from torch import _C",
    "name from a private torch module": "from torch._dynamo import config",
    "name from a private jsonargparse module": "from jsonargparse._namespace import Namespace",
    "private module imported": "import torch._dynamo",
    "private lightning module imported": "import lightning.pytorch.trainer._x as t",
    "attribute of torch": "import torch\ntorch._C._get_tracing_state()",
    "attribute of an aliased package": "import lightning as L\nL.pytorch.loops._FitLoop",
    "attribute of an imported class": "from lightning.pytorch import Trainer\nTrainer._run",
    "attribute of an imported module": "from lightning.pytorch.trainer import call\ncall._call_ttp_hook",
    "hook argument trainer": "def f(trainer):\n    return trainer._evaluation_loop",
    "hook argument pl_module": "def f(pl_module):\n    pl_module._compiler_ctx = None",
    "optimizer": "def f(optimizer):\n    optimizer._opt_called = True",
    "scheduler": "def f(self):\n    self.scheduler._get_lr_called_within_step = True",
    "parser": "def f(parser):\n    return parser._defaults",
    "logger experiment": "def f(logger):\n    return logger.experiment._get_file_writer()",
    "compiled model": "class C:\n    def f(self):\n        return self.model._orig_mod",
    "through self.trainer": "class C:\n    def f(self):\n        return self.trainer.strategy._launcher",
    "through any .trainer": "def f(x):\n    return x.trainer.accelerator_connector._x",
    "Lightning-owned on any root": "class C:\n    def f(self):\n        return self._trainer",
    "Lightning-owned on a module": "def f(m):\n    m._current_fx_name = 'training_step'",
    "loop internals": "def f(x):\n    return x.trainer.fit_loop.epoch_loop.batch_progress.current.ready",
    "anything through a loop": "def f(t):\n    return t.fit_loop.epoch_progress.current.completed",
    "batch_progress on any root": "def f(loop):\n    return loop.batch_progress",
    "type() of a library object": "def f(trainer):\n    return type(trainer)._run",
    "getattr": "def f(trainer):\n    return getattr(trainer, '_checkpoint_connector', None)",
    "setattr": "def f(pl_module):\n    setattr(pl_module, '_hparams', {})",
    "hasattr through self.trainer": "class C:\n    def f(self):\n        return hasattr(self.trainer, '_x')",
    "annotated parameter": "import lightning as L\ndef f(t: L.Trainer):\n    return t._accelerator_connector",
    "string annotation": "import lightning as L\ndef f(t: 'L.Trainer'):\n    return t._accelerator_connector",
    "assigned from a library object": "def f(x):\n    t = x.trainer\n    return t._x",
    "loop variable over a library object": "def f(trainer):\n    for o in trainer.optimizers:\n        o._x",
    "made by the library": "import torch\ndef f():\n    device = torch.device('cpu')\n    return device._x",
    "LightningModule's own private attribute": """
        import lightning as L
        class M(L.LightningModule):
            def f(self):
                return self._metric_attributes
    """,
    "nn.Module's own private attribute": """
        from torch import nn
        class N(nn.Module):
            def f(self):
                return self._modules
    """,
    "private override": """
        from lightning.pytorch.callbacks import ModelCheckpoint
        class C(ModelCheckpoint):
            def _save_checkpoint(self, trainer, filepath):
                pass
    """,
    "through our own base class": """
        import lightning as L
        class Base(L.LightningModule):
            pass
        class Child(Base):
            def f(self, fn):
                return super()._apply(fn)
    """,
    "name in a string": "PLAIN = frozenset({'_current_fx_name', 'grad_norm'})",
    "private path in a string": "import importlib\nimportlib.import_module('torch._dynamo')",
    "private name in a dotted string": "CLASS = 'lightning.pytorch.loops.fit_loop._FitLoop'",
}

NOT_FLAGGED = {
    "our own attribute": """
        class C:
            def __init__(self):
                self._before = 1
            def f(self):
                return self._before
    """,
    "our own helper": "def _helper():\n    pass\n_helper()\n_CACHE = {}\n_CACHE['x'] = 1",
    "our own private import": "from src.models.base import _subclasses",
    "a callback's own state": """
        from lightning.pytorch.callbacks import Callback
        class C(Callback):
            def __init__(self):
                super().__init__()
                self._restore_to = None
            def _restore(self):
                return self._restore_to
    """,
    "a LightningModule's own state": """
        import lightning as L
        class M(L.LightningModule):
            def __init__(self):
                super().__init__()
                self._own = 1
            def f(self):
                return self._own + super().f()
    """,
    "dunders": "import torch\nx = torch.nn.Linear(2, 2)\nx.__class__.__name__\ntorch.__version__",
    "public Trainer state": "def f(trainer):\n    return trainer.global_step, trainer.fit_loop",
    "docstrings": '"""Relies on ``torch._dynamo``."""\ndef f():\n    """_current_fx_name"""',
    "getattr on our own object": "def f(obj, name):\n    return getattr(obj, '_x'), getattr(obj, name)",
    "a private name on an unknown object": "def f(batch):\n    return batch._fields",
    "an annotated public use": "import torch\ndef f(x: torch.Tensor):\n    return x.shape",
    "a string that only looks similar": "NAME = 'torch_x._y'\nKEY = '_loss'",
}


@pytest.mark.parametrize("code", FLAGGED.values(), ids=FLAGGED.keys())
def test_the_scanner_flags(code: str) -> None:
    found = scan_snippet(code)
    assert len(found) == 1, found  # once: a reach through several private names is one finding


@pytest.mark.parametrize("code", NOT_FLAGGED.values(), ids=NOT_FLAGGED.keys())
def test_the_scanner_leaves_alone(code: str) -> None:
    assert scan_snippet(code) == []


# -- src/ -------------------------------------------------------------------------------------------------


def test_no_module_of_src_but_speedups_touches_a_private_name_of_its_libraries() -> None:
    paths = sorted(p for p in (ROOT / "src").rglob("*.py") if p.relative_to(ROOT).as_posix() not in EXEMPT)
    assert len(paths) > 10, "src/ was not found"
    findings = scan([read(path) for path in paths])
    unexplained = [str(f) for f in findings if (f.path, f.what) not in ALLOWED]
    stale = [f"{path}: {what} (allowlisted, no longer found)" for path, what in ALLOWED
             if not any((f.path, f.what) == (path, what) for f in findings)]  # fmt: skip
    assert not unexplained + stale, (
        "private names of lightning, torch or jsonargparse outside src/speedups.py (use a public API, or "
        "move the trick into src/speedups.py with a canary test):\n" + "\n".join(unexplained + stale)
    )
