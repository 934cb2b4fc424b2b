"""No two attnbench modules import each other, directly or around a longer loop.

Every ``import`` statement counts: at module level and inside functions, methods and ``if`` blocks alike (a
function-level import only hides a cycle until the function runs). The graph is read from the source with
``ast``, nothing is imported; names handed to ``importlib.import_module`` (the backend registry's lazy
adapters) are not statements and are not counted. Importing ``attnbench.a.b`` runs ``attnbench/a/__init__.py``
first; that implied edge is not counted either, so a package's ``__init__`` may import its own submodules.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "attnbench"


def modules(package: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, whether it is a package's ``__init__``)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports anywhere in its source."""
    mods = modules(package)
    root = package.name

    def owner(name: str) -> str | None:
        """The longest prefix of ``name`` that is a module of the package (``a.b.func`` -> ``a.b``)."""
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, (path, is_package) in mods.items():
        here = name if is_package else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(owner(alias.name) for alias in node.names if alias.name.split(".")[0] == root)
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: from . import x, from ..a import b
                    base = here.split(".")[:len(here.split(".")) - node.level + 1]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                if source.split(".")[0] != root:
                    continue
                for alias in node.names:  # from pkg import submodule, or from module import name
                    found.add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in mods else owner(source))
        found.discard(None)
        found.discard(name)
        graph[name] = found
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]  # iterative: no recursion limit on a long chain
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
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
    return sorted(found)


def loop(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One import loop through the component's first module: a -> b -> ... -> a (shortest, breadth first)."""
    start, members = component[0], set(component)
    came_from = {start: None}
    queue = [start]
    for node in queue:
        for nxt in sorted(graph[node] & members):
            if nxt == start:
                path = [node]
                while came_from[path[-1]] is not None:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if nxt not in came_from:
                came_from[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"no loop through {start} in {component}")


def test_no_attnbench_modules_import_each_other():
    graph = import_graph(PACKAGE)
    assert len(graph) > 50 and sum(map(len, graph.values())) > 100  # the source was read
    found = cycles(graph)
    assert not found, "import cycles among attnbench modules:\n" + "\n".join(
        f"  {' -> '.join(loop(graph, c))}   (all of {', '.join(c)} reach each other)" for c in found)


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "attnbench" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path / "attnbench"


def test_a_cycle_through_a_function_level_import_is_found(tmp_path):
    package = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "from attnbench.b import thing\n",
        "b.py": "def thing():\n    from attnbench import c\n",
        "c.py": "import os\n\nif os.name:\n    import attnbench.a.x\n",
        "d.py": "from attnbench import a, b\n",
        "sub/__init__.py": "from . import e\n",
        "sub/e.py": "from .. import d\nfrom ..sub import f\n",
        "sub/f.py": "from attnbench.sub.e import name\n",
    })
    graph = import_graph(package)
    assert graph["attnbench.c"] == {"attnbench.a"} and graph["attnbench.d"] == {"attnbench.a", "attnbench.b"}
    assert graph["attnbench.sub"] == {"attnbench.sub.e"}
    assert graph["attnbench.sub.e"] == {"attnbench.d", "attnbench.sub.f"}
    assert cycles(graph) == [["attnbench.a", "attnbench.b", "attnbench.c"], ["attnbench.sub.e", "attnbench.sub.f"]]
    assert loop(graph, ["attnbench.a", "attnbench.b", "attnbench.c"]) == [
        "attnbench.a", "attnbench.b", "attnbench.c", "attnbench.a"]


def test_a_package_importing_its_own_submodules_is_no_cycle(tmp_path):
    package = _package(tmp_path, {
        "__init__.py": "",
        "cli/__init__.py": "from attnbench.cli import run\n",
        "cli/run.py": "from attnbench.cli import common\n",
        "cli/common.py": "import attnbench\n",
    })
    graph = import_graph(package)
    assert graph["attnbench.cli.common"] == {"attnbench"}
    assert cycles(graph) == []
