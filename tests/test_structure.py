"""The package's structure: its modules import one another without cycles."""
import ast
import graphlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / 'pyterrier_multiquery'


def module_name(file: Path) -> str:
    parts = file.relative_to(PACKAGE.parent).with_suffix('').parts
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def imports(file: Path, modules: set) -> set:
    """The package's modules that ``file`` imports, at its top or inside its functions."""
    found = set()
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f'{node.module}.{alias.name}' for alias in node.names]
        else:
            continue
        found.update(name for name in names if name in modules)
    return found


def import_graph() -> dict:
    files = {module_name(f): f for f in PACKAGE.rglob('*.py')}
    modules = set(files)
    # a package's __init__ re-exports its modules lazily by name; importing it is not importing them
    return {name: imports(file, modules) - {name} for name, file in files.items()}


def test_import_graph_has_no_cycles():
    graph = import_graph()
    try:
        list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as e:
        raise AssertionError(f'import cycle: {" -> ".join(e.args[1])}') from None


def test_cycle_check_finds_a_cycle():
    graph = import_graph()
    graph['pyterrier_multiquery.index.errors'] = {'pyterrier_multiquery.index.core'}
    try:
        list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError:
        return
    raise AssertionError('a cycle between index.core and index.errors was not found')


def is_harness(module: str) -> bool:
    return module == 'pyterrier_multiquery.__main__' or module.startswith('pyterrier_multiquery.experiment')


def test_library_never_imports_the_harness():
    graph = import_graph()
    library = {name for name in graph if not is_harness(name)}
    assert 'pyterrier_multiquery.index.core' in library and 'pyterrier_multiquery.experiment.systems' in graph
    offenders = {name: sorted(filter(is_harness, graph[name])) for name in library if any(map(is_harness, graph[name]))}
    assert offenders == {}, f'library modules import the harness: {offenders}'


def test_pyterrier_is_imported_before_pyterrier_alpha():
    # pyterrier loads its extensions' entry points when it is first imported; an extension that imports
    # pyterrier_alpha (pyterrier-anserini does) then finds a half-initialised pyterrier_alpha if pyterrier_alpha was
    # imported first, and the import fails
    offenders = []
    for file in PACKAGE.rglob('*.py'):
        top = [node for node in ast.parse(file.read_text()).body if isinstance(node, (ast.Import, ast.ImportFrom))]
        names = [alias.name if isinstance(node, ast.Import) else node.module
                 for node in top for alias in node.names]
        if 'pyterrier_alpha' in names and names.index('pyterrier_alpha') < names.index('pyterrier') \
                if 'pyterrier' in names else 'pyterrier_alpha' in names:
            offenders.append(module_name(file))
    assert offenders == []
