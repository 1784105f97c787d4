"""The package's structure: its modules import one another without cycles."""
import ast
import functools
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


@functools.lru_cache(maxsize=None)
def module_files() -> dict:
    """Each of the package's modules by name, with its file."""
    return {module_name(f): f for f in PACKAGE.rglob('*.py')}


def import_graph() -> dict:
    files = module_files()
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


#: The layers of docs/architecture.md, top to bottom: the harness; one package per method; the shared parts (the
#: package's root, which holds only ``__version__`` and its lazy names, counts as shared).
METHODS = ('amer', 'diffretriever', 'jpr', 'qaencoder', 'cdp', 'baselines')


def part(module: str) -> str:
    """The top-level part of the package a module belongs to (``amer``, ``index``, ``experiment``, ...)."""
    return module.removeprefix('pyterrier_multiquery').lstrip('.').split('.')[0]


def layer(module: str) -> int:
    """2 for the harness, 1 for a method's package, 0 for the shared parts."""
    return 2 if is_harness(module) else 1 if part(module) in METHODS else 0


def layer_violations(graph: dict) -> list:
    """The imports that go up a layer, or from one method's package into another's."""
    return sorted(f'{module} -> {imported}' for module, imports in graph.items() for imported in imports
                  if layer(imported) > layer(module)
                  or (layer(module) == layer(imported) == 1 and part(module) != part(imported)))


def test_every_import_goes_down_the_layers_of_the_architecture():
    assert layer_violations(import_graph()) == []


def test_the_layer_check_finds_an_import_up_or_across():
    graph = import_graph()
    graph['pyterrier_multiquery.index.mean'] = graph['pyterrier_multiquery.index.mean'] | {
        'pyterrier_multiquery.baselines'}
    graph['pyterrier_multiquery.jpr.model'] = graph['pyterrier_multiquery.jpr.model'] | {
        'pyterrier_multiquery.amer.model'}
    assert layer_violations(graph) == ['pyterrier_multiquery.index.mean -> pyterrier_multiquery.baselines',
                                       'pyterrier_multiquery.jpr.model -> pyterrier_multiquery.amer.model']


def test_the_top_level_offers_operators_indexes_models_and_trainers_only():
    import re

    import pyterrier as pt

    import pyterrier_multiquery as pm
    assert len(pm.__all__) <= 30
    kinds = {name: getattr(pm, name) for name in pm.__all__}
    # functions that return an operator, an index or a collection, and the measures (ir_measures objects)
    factories = {'minilm', 'bm25', 'flex_index', 'load_dataset', 'MRecall', 'AnswerRecall'}
    for name, value in kinds.items():
        assert isinstance(value, type) or name in factories, name
    assert {n for n, v in kinds.items() if isinstance(v, type) and issubclass(v, pt.Transformer)} >= {
        'MMR', 'AMER', 'JPR', 'IndepPR', 'DiffRetriever', 'QAEncoder', 'BackOff'}
    assert {n for n in pm.__all__ if n.endswith('Trainer')} == {
        'AMERTrainer', 'JPRTrainer', 'DiffRetrieverTrainer', 'BiEncoderTrainer'}
    assert not {'paired_bootstrap', 'self_bleu', 'content_words', 'answer_coverage'} & set(pm.__all__)
    readme = (PACKAGE.parent / 'README.md').read_text()
    imported = {name.strip() for line in re.findall(r'from pyterrier_multiquery import ([^\n(]+)', readme)
                for name in line.split(',')}
    assert imported and imported <= set(pm.__all__), imported - set(pm.__all__)
    for module, names in re.findall(r'from (pyterrier_multiquery\.[\w.]+) import ([^\n(]+)', readme):
        offered = {name.strip() for name in names.split(',')} & set(pm.__all__)
        assert not offered, f'the README imports {offered} from {module}: the top level offers them'


def test_experiments_import_the_installed_package():
    """No experiment puts the checkout on ``sys.path``: they run against the package as installed."""
    scripts = sorted((PACKAGE.parent / 'experiments').rglob('*.py'))
    assert scripts
    assert [str(s.relative_to(PACKAGE.parent)) for s in scripts if 'sys.path.insert' in s.read_text()] == []


def defined_names(module: str) -> set:
    """The names ``from module import ...`` can take, read from the source without importing it: its top-level
    definitions, assignments and imports, a lazy ``_ATTRIBUTES`` table's keys and, for a package, its submodules."""
    files = module_files()
    tree = ast.parse(files[module].read_text())
    names = {sub.rsplit('.', 1)[-1] for sub in files if sub.rpartition('.')[0] == module}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split('.')[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for target in targets for t in ast.walk(target) if isinstance(t, ast.Name))
            if any(isinstance(t, ast.Name) and t.id == '_ATTRIBUTES' for t in targets):
                names.update(ast.literal_eval(node.value))
    return names


def unresolved_imports(source: str) -> list:
    """Each ``from pyterrier_multiquery... import name`` in ``source`` whose module or name the package lacks."""
    modules = module_files()
    missing = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or '').split('.')[0] == PACKAGE.name:
            if node.module not in modules:
                missing.append(node.module)
                continue
            offered = defined_names(node.module)
            missing += [f'{node.module}.{alias.name}' for alias in node.names if alias.name not in offered]
    return missing


def test_experiments_import_only_what_the_package_defines():
    """Every name an experiment imports from the package exists (read from the sources: no script is run)."""
    scripts = sorted((PACKAGE.parent / 'experiments').rglob('*.py'))
    assert {f'{s.relative_to(PACKAGE.parent)}: {name}' for s in scripts for name in unresolved_imports(s.read_text())} \
        == set()


def test_the_import_check_finds_a_moved_module_and_a_missing_name():
    assert unresolved_imports('from pyterrier_multiquery import minilm, MMR, experiment') == []
    assert unresolved_imports('from pyterrier_multiquery.experiment.evaluation import write_report, SPLIT') == [
        'pyterrier_multiquery.experiment.evaluation.SPLIT']
    assert unresolved_imports('def f():\n    from pyterrier_multiquery import minilm, systems\n') == [
        'pyterrier_multiquery.systems']
    assert unresolved_imports('from pyterrier_multiquery.nowhere import x') == ['pyterrier_multiquery.nowhere']


def public_names(files) -> dict:
    """Each public name defined in ``files`` (module names, top-level functions and classes), lower-cased, with the
    module that defines it."""
    names = {}
    for file in files:
        module = module_name(file)
        names.setdefault(module.rsplit('.', 1)[-1].lower(), module)
        for node in ast.parse(file.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith('_'):
                names.setdefault(node.name.lower(), module)
    return names


def shadowed_names(harness: dict, library: dict) -> list:
    """The harness's names that a library module also defines (case aside: ``mmr`` shadows ``MMR``)."""
    return sorted(f'{harness[name]}.{name} <-> {library[name]}' for name in set(harness) & set(library))


def library_and_harness_names():
    files = sorted(PACKAGE.rglob('*.py'))
    return (public_names([f for f in files if not is_harness(module_name(f))]),
            public_names([f for f in files if is_harness(module_name(f))]))


def test_no_harness_name_shadows_a_library_name():
    library, harness = library_and_harness_names()
    assert {'bm25', 'amer', 'jpr', 'retrieval_pipelines'} <= set(library)
    assert {'bm25_system', 'amer_system', 'jpr_system', 'diffretriever_system'} <= set(harness)
    assert shadowed_names(harness, library) == []


def test_the_shadowing_check_finds_a_harness_name_like_a_library_one():
    library, harness = library_and_harness_names()
    harness.update({'bm25': 'pyterrier_multiquery.experiment.systems', 'mmr': 'pyterrier_multiquery.experiment.x'})
    assert shadowed_names(harness, library) == [
        'pyterrier_multiquery.experiment.systems.bm25 <-> pyterrier_multiquery.baselines',
        'pyterrier_multiquery.experiment.x.mmr <-> pyterrier_multiquery.baselines']
