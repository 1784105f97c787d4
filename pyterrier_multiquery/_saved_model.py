"""Trained models as PyTerrier artifacts: a saved model folder carries ``pt_meta.json``, checked when it loads.

``pt_meta.json`` names the artifact's type and format (so ``pt.Artifact.load``, ``from_hf`` and ``from_url`` find
the class through the ``pyterrier.artifact`` entry points), the package and its version, and the size and SHA-256 of
every file the model wrote, so a missing, truncated or changed file is named when the model loads instead of failing
deep inside transformers or torch, or changing the model's output silently.
"""
import json
from pathlib import Path
from typing import Optional, Union

import pyterrier as pt

from pyterrier_multiquery._files import file_sha256

META_NAME = 'pt_meta.json'
#: The file of a saved model that holds how it was trained (:attr:`SavedModel.training_record`).
TRAINING_NAME = 'training.json'
PathLike = Union[str, Path]


class CorruptModelError(ValueError):
    """Raised when a saved model's files do not agree with its ``pt_meta.json`` or cannot be read."""


class SavedModel(pt.Artifact):
    """Base of the trained models that save to (and load from) an artifact folder.

    A subclass sets ``ARTIFACT_TYPE``, implements ``save_pretrained`` (calling :func:`write_meta` last inside its
    temporary folder) and ``from_pretrained`` (calling :func:`check_saved` first). ``path`` is the folder the model
    was last saved to or loaded from (``NO_PATH`` before), which :meth:`to_hf` and :meth:`build_package` package.
    ``training_record`` is what its trainer recorded (:class:`~pyterrier_multiquery.training.trainer.Trainer`: the
    history, the settings, the first stage it was trained over and, for AMER, the merge its lists are searched
    with), saved with the model in ``training.json`` and read back when it loads (None for an untrained model).
    """
    training_record = None
    ARTIFACT_FORMAT = 'hf'
    ARTIFACT_PACKAGE_HINT = 'pyterrier-multiquery'

    @classmethod
    def load(cls, path: PathLike, **kwargs):
        """The model saved at ``path`` (what ``pt.Artifact.load`` returns for a folder of this type).

        Raises:
            FileNotFoundError: If ``path`` has no ``pt_meta.json`` (load a folder saved before models had one with
                ``from_pretrained``) or misses a file the model wrote.
            ValueError: If ``pt_meta.json`` names another type of artifact.
            CorruptModelError: If a file is truncated or unreadable.
        """
        meta = read_meta(path)
        if meta is None:
            raise FileNotFoundError(f'{str(path)!r} has no {META_NAME}: it is not a saved {cls.__name__}')
        _check_type(path, meta, cls)
        return cls.from_pretrained(path, **kwargs)

    @classmethod
    def verify(cls, path: PathLike) -> None:
        """Checks every file of the model saved at ``path`` against the size and SHA-256 in its ``pt_meta.json``.

        Raises:
            FileNotFoundError: If ``path`` has no ``pt_meta.json`` or misses a file the model wrote.
            ValueError: If ``pt_meta.json`` names another type of artifact.
            CorruptModelError: If a file changed, or ``pt_meta.json`` has no checksums (a model saved before they
                were written: save it again).
        """
        meta = read_meta(path)
        if meta is None:
            raise FileNotFoundError(f'{str(path)!r} has no {META_NAME}: it is not a saved {cls.__name__}')
        _check_type(path, meta, cls)
        if 'sha256' not in meta:
            raise CorruptModelError(f'{str(Path(path) / META_NAME)!r} has no checksums (the model was saved before '
                                    'they were written): save it again')
        _check_files(Path(path), meta, cls)


def write_meta(folder: Path, model: SavedModel) -> None:
    """Writes the model's ``training.json`` (where it has a training record) and then ``pt_meta.json`` into a model
    folder whose other files are complete.

    Args:
        folder: The (temporary) folder the model was written to.
        model: The :class:`SavedModel` that wrote it.
    """
    cls = type(model)
    if model.training_record is not None:
        (folder / TRAINING_NAME).write_text(json.dumps(model.training_record, indent=2))
    from pyterrier_multiquery import __version__
    written = [p for p in sorted(folder.rglob('*')) if p.is_file()]
    files = {p.relative_to(folder).as_posix(): p.stat().st_size for p in written}
    meta = {'type': cls.ARTIFACT_TYPE, 'format': cls.ARTIFACT_FORMAT, 'package_hint': cls.ARTIFACT_PACKAGE_HINT,
            'package_version': __version__, 'files': files,
            'sha256': {p.relative_to(folder).as_posix(): file_sha256(p) for p in written}}
    (folder / META_NAME).write_text(json.dumps(meta, indent=2))


def read_training(path: PathLike) -> Optional[dict]:
    """The training record saved with the model at ``path`` (``training.json``), or None where it has none."""
    file = Path(path) / TRAINING_NAME
    return read_json(file) if file.is_file() else None


def read_meta(path: PathLike) -> Optional[dict]:
    """``pt_meta.json`` of the folder ``path``, or None where it has none.

    Raises:
        FileNotFoundError: If ``path`` is not a folder.
        CorruptModelError: If ``pt_meta.json`` is not a JSON object.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f'no saved model folder at {str(path)!r}')
    if not (path / META_NAME).is_file():
        return None
    return read_json(path / META_NAME)


def read_json(file: Path) -> dict:
    """A JSON object file of a saved model, with an error that names the file when it is absent or unreadable."""
    if not file.is_file():
        raise FileNotFoundError(f'{str(file)!r} is missing: the saved model is incomplete')
    try:
        value = json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptModelError(f'{str(file)!r} is not valid JSON ({e}): the saved model is damaged') from None
    if not isinstance(value, dict):
        raise CorruptModelError(f'{str(file)!r} holds a JSON {type(value).__name__}, not an object')
    return value


def check_saved(path: PathLike, cls: type, config_name: str) -> bool:
    """Whether ``path`` holds a model that ``cls`` saved, its files checked against ``pt_meta.json``.

    A folder is one when it has ``cls``'s ``config_name`` or a ``pt_meta.json`` of ``cls``'s type; folders saved
    before models had ``pt_meta.json`` pass unchecked, and those saved before it had checksums are checked by size.
    Every file is read once to check it: about what loading the model reads anyway.

    Returns:
        False where ``path`` is neither (a backbone checkpoint, say).

    Raises:
        FileNotFoundError: If ``path`` is not a folder or misses a file the model wrote.
        ValueError: If ``path`` has ``config_name`` but its ``pt_meta.json`` names another type of artifact.
        CorruptModelError: If a file has another size or SHA-256 than the one written, or ``pt_meta.json`` is
            unreadable.
    """
    path = Path(path)
    meta = read_meta(path)
    has_config = (path / config_name).exists()
    if meta is None:
        return has_config
    if not has_config and meta.get('type') != cls.ARTIFACT_TYPE:
        return False
    _check_type(path, meta, cls)
    _check_files(path, meta, cls)
    return True


def _check_files(path: Path, meta: dict, cls: type) -> None:
    """Checks the files ``pt_meta.json`` lists: present, of their sizes and (where it has them) their SHA-256."""
    files = meta.get('files')
    if not isinstance(files, dict):
        raise CorruptModelError(f'{str(path / META_NAME)!r} does not list the model\'s files')
    missing = sorted(name for name in files if not (path / name).is_file())
    if missing:
        raise FileNotFoundError(f'the {cls.__name__} saved at {str(path)!r} is missing {missing}; save or download '
                                'it again')
    for name, size in files.items():
        actual = (path / name).stat().st_size
        if actual != size:
            raise CorruptModelError(f'{str(path / name)!r} has {actual} bytes where {size} were written: it is '
                                    'truncated or damaged; save or download the model again')
    checksums = meta.get('sha256')
    if checksums is None:  # saved before models had checksums
        return
    if not isinstance(checksums, dict) or set(checksums) != set(files):
        raise CorruptModelError(f'{str(path / META_NAME)!r}: sha256 must list the SHA-256 of each of its files')
    for name, checksum in checksums.items():
        if file_sha256(path / name) != checksum:
            raise CorruptModelError(f'{str(path / name)!r}: its SHA-256 differs from the one in {META_NAME}: the file '
                                    'changed since the model was saved; save or download the model again')


def _check_type(path: PathLike, meta: dict, cls: type) -> None:
    found, expected = (meta.get('type'), meta.get('format')), (cls.ARTIFACT_TYPE, cls.ARTIFACT_FORMAT)
    if found != expected:
        raise ValueError(f'{str(path)!r} holds a {found[0]}.{found[1]} artifact, not a {cls.__name__} '
                         f'({expected[0]}.{expected[1]}); pt.Artifact.load({str(path)!r}) loads it as what it is')
