"""No module of ``src/`` reads a private name of Lightning, torch or jsonargparse, patches them, or writes
``sys.argv``: no exemptions, no allow-list.

A private name (a leading underscore; dunders are public protocol) can change in any release without
notice. The scanner reads each module with ``ast`` and flags: (a) a private name or module imported from
those libraries; (b) a private attribute on anything but ``self`` or ``cls``, or one named by a string to
``getattr`` and its kin; (c) a string naming a private key LightningCLI writes or a private path in them;
(d) a write to ``sys.argv``; (e) an assignment to, or ``setattr`` on, what was imported from them. It is
tried on snippets first, so that a scanner that finds nothing cannot pass for a clean ``src/``.
"""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: the libraries whose internals src/ leaves alone
LIBRARIES = (
    "lightning",
    "pytorch_lightning",
    "lightning_fabric",
    "lightning_utilities",
    "torch",
    "jsonargparse",
)
PRIVATE_PATH = re.compile(rf"\b({'|'.join(LIBRARIES)})(\.\w+)*\._\w+")
PRIVATE_KEYS = {"_class_path", "_instantiator"}
BY_NAME = {"getattr", "setattr", "hasattr", "delattr"}
ARGV_METHODS = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse"}


def private(name: str) -> bool:
    return name.startswith("_") and name != "_" and not (name.startswith("__") and name.endswith("__"))


def root(node: ast.expr) -> ast.expr:
    """Where ``a.b[c].d`` starts: ``a``."""
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node


def is_name(node: ast.expr, *names: str) -> bool:
    return isinstance(node, ast.Name) and node.id in names


def is_argv(node: ast.expr) -> bool:
    """``sys.argv``, or an item or slice of it."""
    node = node.value if isinstance(node, ast.Subscript) else node
    return isinstance(node, ast.Attribute) and node.attr == "argv" and is_name(node.value, "sys")


def unpacked(target: ast.expr) -> list[ast.expr]:
    """The targets ``a, (b, *c) = ...`` assigns to."""
    if isinstance(target, ast.Tuple | ast.List):
        return [t for each in target.elts for t in unpacked(each)]
    return unpacked(target.value) if isinstance(target, ast.Starred) else [target]


def findings(code: str) -> list[str]:
    """``"line: (rule) what"`` for each thing in ``code`` that breaks the rule."""
    tree = ast.parse(code)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }  # fmt: skip
    imported: set[str] = set()  # the names bound to a module or object of the libraries
    found: set[tuple[int, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in LIBRARIES:
                    imported.add(alias.asname or alias.name.split(".")[0])
                    if any(private(part) for part in alias.name.split(".")):
                        found.add((node.lineno, f"(a) import {alias.name}"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in LIBRARIES:
            for alias in node.names:
                imported.add(alias.asname or alias.name)
                if any(private(part) for part in [*str(node.module).split("."), alias.name]):
                    found.add((node.lineno, f"(a) from {node.module} import {alias.name}"))
    for node in ast.walk(tree):
        ours = isinstance(node, ast.Attribute) and is_name(node.value, "self", "cls")
        if isinstance(node, ast.Attribute) and private(node.attr) and not ours:
            found.add((node.lineno, f"(b) .{node.attr}"))
        text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""
        if id(node) not in docstrings and (text in PRIVATE_KEYS or PRIVATE_PATH.search(text)):
            found.add((node.lineno, f"(c) {text!r}"))
        if isinstance(node, ast.Call) and is_name(node.func, *BY_NAME) and len(node.args) >= 2:
            call, (target, name) = ast.unparse(node.func), node.args[:2]
            named = name.value if isinstance(name, ast.Constant) and isinstance(name.value, str) else ""
            if private(named) and not is_name(target, "self", "cls"):
                found.add((node.lineno, f"(b) {call}(..., {named!r})"))
            if call in ("setattr", "delattr") and is_name(target, "sys"):
                found.add((node.lineno, f"(d) {call}(sys, ...)"))
            elif call in ("setattr", "delattr") and is_name(root(target), *imported):
                found.add((node.lineno, f"(e) {call} on {ast.unparse(target)}"))
        called = node.func if isinstance(node, ast.Call) else None
        if isinstance(called, ast.Attribute) and called.attr in ARGV_METHODS and is_argv(called.value):
            found.add((node.lineno, f"(d) sys.argv.{called.attr}(...)"))
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
            targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
            for target in (t for each in targets for t in unpacked(each)):
                if isinstance(target, ast.Attribute | ast.Subscript) and is_argv(target):
                    found.add((node.lineno, f"(d) {ast.unparse(target)} written"))
                elif isinstance(target, ast.Attribute) and is_name(root(target), *imported):
                    found.add((node.lineno, f"(e) {ast.unparse(target)} replaced"))
    return [f"{line}: {what}" for line, what in sorted(found)]


FLAGGED = {
    "(a) private name from lightning": "from lightning.pytorch.trainer.call import _call_callback_hooks",
    "(a) name from a private module": "from jsonargparse._namespace import Namespace",
    "(a) private name from torch": "from torch import _C",
    "(a) private module imported": "import torch._dynamo",
    "(a) private name of lightning_utilities": "from lightning_utilities.core.imports import _x",
    "(b) attribute of a library object": "def f(trainer):\n    return trainer._checkpoint_connector",
    "(b) attribute reached through self": "class C:\n    def f(self):\n        return self.trainer._results",
    "(b) attribute of a module": "import torch\ntorch._C._get_tracing_state()",
    "(b) private attribute of our own objects": "def f(run):\n    return run._cache",
    "(b) getattr by a private name": "def f(trainer):\n    return getattr(trainer, '_accelerator_connector')",
    "(c) the key LightningCLI saves": "def f(hparams):\n    return hparams.get('_class_path')",
    "(c) the instantiator's key": "KEYS = ('class_path', '_instantiator')",
    "(c) private path in a string": "import importlib\nimportlib.import_module('torch._dynamo')",
    "(c) private class in a dotted string": "CLASS = 'lightning.pytorch.loops.fit_loop._FitLoop'",
    "(c) private path in an f-string": "def f(x):\n    return f'{x} lightning.pytorch._graveyard'",
    "(d) argv replaced": "import sys\nsys.argv = sys.argv[:1]",
    "(d) argv sliced": "import sys\nsys.argv[1:] = ['fit']",
    "(d) argv item": "import sys\nsys.argv[1] = 'fit'",
    "(d) argv deleted": "import sys\ndel sys.argv[1:]",
    "(d) argv extended": "import sys\nsys.argv.extend(['fit'])",
    "(d) argv by setattr": "import sys\nsetattr(sys, 'argv', ['x'])",
    "(e) a method of an imported class replaced": "from lightning import Trainer\nTrainer.fit = print",
    "(e) a function of torch replaced": "import torch\ntorch.load = print",
    "(e) deep in an aliased package": "import lightning as L\nL.pytorch.Trainer.fit = print",
    "(e) replaced by setattr": "from lightning.pytorch import Trainer\nsetattr(Trainer, 'fit', print)",
    "(e) a patch inside a function": "def f():\n    from torch import nn\n    nn.Module.forward = print",
}

NOT_FLAGGED = {
    "our own attribute": "class C:\n    def f(self):\n        self._before = 1\n        self._before += 1",
    "our own class attribute": "class C:\n    @classmethod\n    def f(cls):\n        return cls._cache",
    "our own helper": "def _helper():\n    pass\n_helper()\n_CACHE = {}\n_CACHE['x'] = 1",
    "our own private import": "from src.models.base import _subclasses",
    "dunders": "import torch\nx = torch.nn.Linear(2, 2)\nx.__class__.__name__\ntorch.__version__",
    "public state set": "def f(trainer):\n    trainer.should_stop = True\n    trainer.callbacks.append(1)",
    "a public use of torch": "import torch.nn.functional as F\ndef f(x):\n    return F.relu(x)",
    "docstrings": '"""Relies on ``torch._dynamo``."""\ndef f():\n    """``_class_path``"""',
    "strings that only look similar": "NAME = 'torch_x._y'\nKEY = '_loss'\nPATH = 'class_path'",
    "argv read": "import sys\nwords = sys.argv[1:]\nname = sys.argv[0]",
    "our own objects set by name": "def f(obj, name):\n    setattr(obj, name, 1)\n    setattr(obj, 'x', 2)",
    "a library object held on ours": "import torch\nclass C:\n    def f(self):\n        self.x = torch.load",
}


@pytest.mark.parametrize("case", FLAGGED)
def test_the_scanner_flags(case: str) -> None:
    rule = case[:3]  # "(a)" ... "(e)": the rule the snippet breaks, and no other rule may stand in for it
    assert [each for each in findings(FLAGGED[case]) if rule in each]


@pytest.mark.parametrize("case", NOT_FLAGGED)
def test_the_scanner_leaves_alone(case: str) -> None:
    assert findings(NOT_FLAGGED[case]) == []


def test_no_module_of_src_reaches_inside_lightning_torch_or_jsonargparse() -> None:
    paths = sorted(p for p in (ROOT / "src").rglob("*.py") if not p.name.startswith("test_"))
    assert len(paths) > 10, "src/ was not found"
    found = [f"{p.relative_to(ROOT)}:{each}" for p in paths for each in findings(p.read_text())]
    assert not found, "private names, patches or sys.argv writes in src/:\n" + "\n".join(found)
