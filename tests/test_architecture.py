"""The package's structure: no import cycles, the import floors, file sizes.

Every module under ``mmpe/`` is parsed with ``ast`` (nothing is imported) and
its imports of mmpe modules, absolute and relative, at module level and
inside functions, become the edges of a graph. The checks:

* no cycle between modules;
* the floors of :data:`FLOORS` (docs/design.md, "Import floors", states the
  same list): a module imports only modules of its own package (its entry of
  a floor) or of lower floors, never a sibling package of its floor;
* no source file of the package (``*.py``, ``*.cpp``, ``*.h``) has more than
  :data:`MAX_LINES` lines;
* the tools (``tools/``) keep the same size rule, and neither a tool nor a
  test changes the import path (``sys.path``): the tools import the
  installed mmpe and the modules beside them (a script's own folder is on
  its path), the tests their helpers from ``tests/`` (the folder of
  ``tests/conftest.py``) and the tools' folders through pytest.ini.

Each check runs per part of the package (:data:`PARTS`), so that a failure
names the part it is in; the messages list the offending edges.
"""
import ast
import os
import os.path as osp
from typing import Dict, List, Set, Tuple

import pytest

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..'))
PACKAGE = osp.join(ROOT, 'mmpe')

#: The floors, bottom up, numbered from 1 as docs/design.md numbers them. A
#: floor's entries are packages (or modules); a module belongs to the
#: longest entry its name starts with.
FLOORS: List[Tuple[str, ...]] = [
    ('mmpe.version', ),
    ('mmpe.utils', ),
    ('mmpe.models.layers.common', ),
    ('mmpe.models.layers.terms', 'mmpe.models.layers.encodings',
     'mmpe.models.layers.windows'),
    ('mmpe.models.layers.irpe', 'mmpe.models.layers.box',
     'mmpe.models.layers.grid_bias'),
    ('mmpe.models.layers.decomposed', ),
    ('mmpe.models.layers.attention', ),
    ('mmpe.models.layers.blocks', 'mmpe.models.layers.rtdetr'),
    ('mmpe.models.layers', ),  # the public names
    ('mmpe.models.utils', ),
    ('mmpe.models.backbones', 'mmpe.models.necks',
     'mmpe.models.dense_heads'),
    ('mmpe.models.detectors', ),
    ('mmpe.models', ),
    ('mmpe.datasets', ),
    ('mmpe.engine', ),
    ('mmpe.seg', 'mmpe.deployment'),
    ('mmpe', ),
]
#: Compiled modules (setup.py): leaves of the graph, no source here.
EXTENSIONS = ('mmpe._ext', )
#: The most lines a source file of the package may have.
MAX_LINES = 450
SOURCE_SUFFIXES = ('.py', '.cpp', '.h')
#: Folders outside the package: the tools (size rule, import path) and the
#: tests (import path).
TOOLS = osp.join(ROOT, 'tools')
TESTS = osp.join(ROOT, 'tests')
#: Calls that change a process's import path.
PATH_CHANGES = ('sys.path.insert', 'sys.path.append', 'sys.path.extend',
                'sys.path.remove', 'sys.path.pop', 'sys.path.clear',
                'sys.path.__setitem__', 'site.addsitedir')
#: The parts each check reports separately (longest prefix wins).
PARTS = ('mmpe.models.layers', 'mmpe.models', 'mmpe.datasets', 'mmpe.engine',
         'mmpe.seg', 'mmpe.deployment', 'mmpe.utils', 'mmpe.csrc', 'mmpe')


def find_modules() -> Dict[str, Tuple[str, bool]]:
    """Dotted name -> (file, is a package ``__init__``) of every module."""
    modules = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if not name.endswith('.py'):
                continue
            path = osp.join(folder, name)
            dotted = osp.relpath(path, ROOT)[:-3].replace(os.sep, '.')
            is_package = dotted.endswith('.__init__')
            if is_package:
                dotted = dotted[:-len('.__init__')]
            modules[dotted] = (path, is_package)
    return modules


MODULES = find_modules()


def imported_modules(module: str, is_package: bool,
                     node: ast.AST) -> List[str]:
    """The mmpe modules an import statement of ``module`` imports."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split('.')[0] == 'mmpe']
    if node.level:
        base = module.split('.') if is_package else module.split('.')[:-1]
        base = base[:len(base) - (node.level - 1)]
        target = '.'.join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ''
    if target.split('.')[0] != 'mmpe':
        return []
    found = []
    for alias in node.names:
        sub = f'{target}.{alias.name}'
        # `from package import module` imports the module
        found.append(sub if sub in MODULES or sub in EXTENSIONS else target)
    return found


def import_graph() -> Dict[str, Set[str]]:
    """Module -> the mmpe modules it imports (compiled ones left out)."""
    graph = {}
    for module, (path, is_package) in MODULES.items():
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        targets = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                targets.update(imported_modules(module, is_package, node))
        graph[module] = {
            t
            for t in targets if t != module and t not in EXTENSIONS
        }
    return graph


GRAPH = import_graph()


def entry_of(module: str) -> str:
    """The entry of :data:`FLOORS` a module belongs to."""
    entries = [e for floor in FLOORS for e in floor
               if module == e or module.startswith(e + '.')]
    return max(entries, key=len)


#: Entry -> its floor's number (from 1, the list of docs/design.md).
FLOOR_OF = {e: i for i, floor in enumerate(FLOORS, 1) for e in floor}


def part_of(name: str) -> str:
    return max((p for p in PARTS if name == p or name.startswith(p + '.')),
               key=len)


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components with more than one module
    (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
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
    return found


def floor_violations() -> List[Tuple[str, str]]:
    """Edges into a sibling package of the same floor or a higher floor."""
    bad = []
    for module, targets in GRAPH.items():
        mine = entry_of(module)
        for target in targets:
            theirs = entry_of(target)
            if theirs != mine and FLOOR_OF[theirs] >= FLOOR_OF[mine]:
                bad.append((module, target))
    return sorted(bad)


def describe(edge: Tuple[str, str]) -> str:
    a, b = (entry_of(m) for m in edge)
    return (f'{edge[0]} -> {edge[1]} (floor {FLOOR_OF[a]} {a} imports '
            f'floor {FLOOR_OF[b]} {b})')


def source_files() -> List[str]:
    found = []
    for folder, _, files in os.walk(PACKAGE):
        found += [
            osp.join(folder, name) for name in files
            if name.endswith(SOURCE_SUFFIXES)
        ]
    return sorted(found)


def file_part(path: str) -> str:
    dotted = osp.relpath(path, ROOT).replace(os.sep, '.')
    return part_of(osp.splitext(dotted)[0])


@pytest.mark.parametrize('part', PARTS)
def test_no_import_cycle(part):
    found = [c for c in cycles(GRAPH) if any(part_of(m) == part for m in c)]
    lines = []
    for component in found:
        members = set(component)
        lines += [
            f'{m} -> {t}' for m in component for t in sorted(GRAPH[m])
            if t in members
        ]
    assert not found, f'import cycles in {part}:\n  ' + '\n  '.join(lines)


@pytest.mark.parametrize('part', PARTS)
def test_imports_only_own_package_or_lower_floors(part):
    bad = [e for e in floor_violations() if part_of(e[0]) == part]
    assert not bad, (f'imports against the floors (tests/test_architecture.py '
                     f'FLOORS) in {part}:\n  ' +
                     '\n  '.join(describe(e) for e in bad))


@pytest.mark.parametrize('part', PARTS)
def test_no_source_file_over_max_lines(part):
    long = []
    for path in source_files():
        if file_part(path) != part:
            continue
        with open(path, 'rb') as f:
            count = f.read().count(b'\n')
        if count > MAX_LINES:
            long.append(f'{osp.relpath(path, ROOT)}: {count} lines')
    assert not long, f'files over {MAX_LINES} lines in {part}:\n  ' + \
        '\n  '.join(long)


def test_every_package_has_a_floor():
    """A new package of mmpe, mmpe.models or mmpe.models.layers is placed
    in :data:`FLOORS` rather than falling into its parent's floor."""
    listed = {e for floor in FLOORS for e in floor}
    parents = ('mmpe', 'mmpe.models', 'mmpe.models.layers')
    missing = sorted(
        m for m, (_, is_package) in MODULES.items()
        if is_package and m.rsplit('.', 1)[0] in parents and m not in listed
        and m not in parents)
    assert not missing, f'packages without a floor: {missing}'


def test_layers_packages_state_their_floor():
    """A package of ``mmpe.models.layers`` opens its docstring with its
    floor's number (``"Floor 5: ..."``), the number of :data:`FLOORS` and
    docs/design.md: one numbering."""
    wrong = []
    for module, (path, is_package) in sorted(MODULES.items()):
        if not is_package or module.rsplit('.', 1)[0] != 'mmpe.models.layers':
            continue
        with open(path) as f:
            doc = ast.get_docstring(ast.parse(f.read(), path)) or ''
        expected = f'Floor {FLOOR_OF[entry_of(module)]}:'
        if not doc.startswith(expected):
            wrong.append(f'{module}: {doc[:30]!r}, expected {expected!r}')
    assert not wrong, 'floor numbers in docstrings:\n  ' + '\n  '.join(wrong)


def test_design_md_lists_the_same_floors():
    """docs/design.md's numbered list of floors is :data:`FLOORS`, with
    the same numbers."""
    with open(osp.join(ROOT, 'docs', 'design.md')) as f:
        text = f.read()
    section = text.split('## Import floors', 1)[1].split('\n## ', 1)[0]
    listed = {}
    for line in section.splitlines():
        head, _, rest = line.partition('. ')
        if head.isdigit():
            # the entries are the leading backticked names (notes follow)
            names = rest.split(' (', 1)[0].split(', ')
            listed[int(head)] = tuple(n.strip('`') for n in names)
    assert listed == dict(enumerate(FLOORS, 1))


# the checks above, on small graphs whose answers are known
def test_cycles_finds_a_circle_and_nothing_else():
    graph = {'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}, 'e': set()}
    assert cycles(graph) == [['a', 'b', 'c']]
    assert cycles({'a': {'b'}, 'b': set()}) == []


def test_relative_imports_resolve():
    package = ast.parse('from ..common.cache import BoundedCache').body[0]
    assert imported_modules('mmpe.models.layers.irpe.plans', False,
                            package) == ['mmpe.models.layers.common.cache']
    sibling = ast.parse('from . import checker').body[0]
    assert imported_modules('mmpe.datasets.data_check', True,
                            sibling) == ['mmpe.datasets.data_check.checker']
    extension = ast.parse('from mmpe import _ext').body[0]
    assert imported_modules('mmpe.models.layers.attention.fused', False,
                            extension) == ['mmpe._ext']


def test_floors_know_the_layers_order():
    assert entry_of('mmpe.models.layers.irpe.plans') == \
        'mmpe.models.layers.irpe'
    assert entry_of('mmpe.models.layers.a_module') == 'mmpe.models.layers'
    assert FLOOR_OF['mmpe.models.layers.common'] < FLOOR_OF[
        'mmpe.models.layers.irpe'] < FLOOR_OF['mmpe.models.layers.attention']
    assert describe(('mmpe.models.layers.common.cache',
                     'mmpe.models.layers.irpe.plans')).startswith(
                         'mmpe.models.layers.common.cache -> ')


def python_files(top: str) -> List[str]:
    return sorted(
        osp.join(folder, name) for folder, _, files in os.walk(top)
        for name in files if name.endswith('.py'))


def _dotted(node: ast.AST, aliases: Dict[str, str]) -> str:
    """``a.b.c`` of a name / attribute chain, its first name resolved
    through the module's import aliases (``import sys as s``); '' for
    anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return ''
    parts.append(aliases.get(node.id, node.id))
    return '.'.join(reversed(parts))


def import_path_changes(path: str) -> List[str]:
    """Where a file changes ``sys.path``: calls of :data:`PATH_CHANGES`,
    assignments to ``sys.path`` or an item or slice of it, and
    ``from sys import path`` (a name that would hide such calls)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases.update({a.asname: a.name for a in node.names if a.asname})
    found = []
    for node in ast.walk(tree):
        where = f'{osp.relpath(path, ROOT)}:{getattr(node, "lineno", 0)}'
        if isinstance(node, ast.Call) and \
                _dotted(node.func, aliases) in PATH_CHANGES:
            found.append(f'{where} {_dotted(node.func, aliases)}(...)')
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = getattr(node, 'targets', None) or [node.target]
            for target in targets:
                base = target.value if isinstance(target,
                                                  ast.Subscript) else target
                if _dotted(base, aliases) == 'sys.path':
                    found.append(f'{where} assigns sys.path')
        elif isinstance(node, ast.ImportFrom) and node.module == 'sys' and \
                any(a.name == 'path' for a in node.names):
            found.append(f'{where} from sys import path')
    return found


def test_no_tool_over_max_lines():
    long = []
    for path in python_files(TOOLS):
        with open(path, 'rb') as f:
            count = f.read().count(b'\n')
        if count > MAX_LINES:
            long.append(f'{osp.relpath(path, ROOT)}: {count} lines')
    assert not long, f'tools over {MAX_LINES} lines:\n  ' + '\n  '.join(long)


@pytest.mark.parametrize('top', [TOOLS, TESTS], ids=['tools', 'tests'])
def test_no_import_path_changes(top):
    found = [c for path in python_files(top)
             for c in import_path_changes(path)]
    assert not found, 'sys.path changed (import the installed mmpe; tests: ' \
        'helpers from tests/, tools through pytest.ini):\n  ' + \
        '\n  '.join(found)


def test_import_path_check_sees_each_form(tmp_path):
    """The check above finds every way of changing the path it names (a
    check that finds nothing must not pass by blindness)."""
    path = tmp_path / 'changes.py'
    path.write_text(
        'import site\nimport sys\nimport sys as s\n'
        'from sys import path\n'
        "sys.path.insert(0, 'a')\ns.path.append('b')\n"
        "sys.path[:0] = ['c']\nsys.path = ['d']\nsys.path += ['e']\n"
        "site.addsitedir('f')\nsys.modules.pop('x', None)\n")
    found = import_path_changes(str(path))
    lines = {int(f.split(' ', 1)[0].rsplit(':', 1)[1]) for f in found}
    assert lines == set(range(4, 11))  # not line 11: sys.modules
    assert sorted(f.split(' ', 1)[1] for f in found) == sorted([
        'from sys import path', 'sys.path.insert(...)',
        'sys.path.append(...)', 'assigns sys.path', 'assigns sys.path',
        'assigns sys.path', 'site.addsitedir(...)'
    ])
