"""Trained models as PyTerrier artifacts: pt_meta.json, pt.Artifact.load through the entry points, packages as
to_hf/from_hf move them, and clear errors for missing or damaged files.

The entry points are read from this checkout's pyproject.toml (the installed metadata may be another checkout's),
so ``pt.Artifact.load`` is tested against what this checkout declares.
"""
import contextlib
import importlib.metadata
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyterrier as pt
import pytest

from pyterrier_multiquery._saved_model import CorruptModelError

tomllib = pytest.importorskip('tomllib')
torch = pytest.importorskip('torch')

ROOT = Path(__file__).resolve().parents[1]
DECLARED = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']['entry-points']['pyterrier.artifact']
WORDS = ['who', 'won', 'the', 'cup', 'in', 'year', 'which', 'city', 'cats', 'heart', 'disease', 'protein']
KINDS = ('amer', 'encoder_amer', 'jpr', 'diffretriever')


@pytest.fixture(scope='module')
def tiny_bert(save_tiny_bert):
    """A random 2-layer BERT with a word-level tokenizer over this module's words, saved as a checkpoint."""
    return save_tiny_bert(WORDS)


def randomised(model):
    """``model`` with every parameter drawn at random, so a round trip that dropped one would show."""
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, .2)
    return model.eval()


def make(kind: str, tiny_bert: Path):
    """A model of ``kind`` with random weights, and a function of it whose output the round trip keeps."""
    if kind == 'amer':
        from transformers import LlamaConfig
        from pyterrier_multiquery.amer import AMERModel, EncoderAMERModel
        config = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
        queries = np.random.default_rng(0).normal(size=(3, 8)).astype(np.float32)
        return randomised(AMERModel.from_backbone(config, doc_dim=8, num_vectors=2, lora=False)), \
            lambda m: m.encode(queries)
    if kind == 'encoder_amer':
        from pyterrier_multiquery.amer import AMERModel, EncoderAMERModel
        return randomised(EncoderAMERModel.from_encoder(tiny_bert, num_vectors=2, train_encoder='full')), \
            lambda m: m.encode(['who won the cup', 'which city'])
    if kind == 'jpr':
        from pyterrier_multiquery.jpr import JPRModel
        model = randomised(JPRModel(str(tiny_bert), decoder_layers=1, decoder_heads=2, decoder_dropout=0.))

        def scores(m):
            memory = m.passages('who won the cup', ['the cup in year', 'which city', 'cats']).unsqueeze(0)
            with torch.no_grad():
                return m(memory, torch.tensor([[1]]), ranks=torch.tensor([[0, 1, 2]])).numpy()
        return model, scores
    from pyterrier_multiquery.diffretriever import DiffRetriever
    encoder = DiffRetriever.from_pretrained(str(tiny_bert), k_query=2, k_doc=3, vectors='masks', device='cpu')
    randomised(encoder.backbone.model)
    return encoder, lambda m: np.stack(m.encode_queries(['heart disease protein', 'cats']).embs)


@pytest.mark.parametrize('kind', KINDS)
def test_artifact_load_round_trip(kind, tiny_bert, tmp_path, declared_entry_points):
    from pyterrier_multiquery import __version__
    model, output = make(kind, tiny_bert)
    assert model.path is pt.Artifact.NO_PATH
    model.save_pretrained(tmp_path / 'model')
    assert model.path == tmp_path / 'model'
    meta = json.loads((tmp_path / 'model' / 'pt_meta.json').read_text())
    assert (meta['type'], meta['format']) == (model.ARTIFACT_TYPE, model.ARTIFACT_FORMAT)
    assert meta['package_hint'] == 'pyterrier-multiquery' and meta['package_version'] == __version__
    assert 'pt_meta.json' not in meta['files'] and all((tmp_path / 'model' / f).is_file() for f in meta['files'])
    assert pt.inspect.artifact_type_format(model) == (model.ARTIFACT_TYPE, model.ARTIFACT_FORMAT)
    loaded = pt.Artifact.load(str(tmp_path / 'model'))
    assert type(loaded) is type(model) and loaded.path == tmp_path / 'model'
    np.testing.assert_array_equal(output(loaded), output(model))
    np.testing.assert_array_equal(output(type(model).load(tmp_path / 'model')), output(model))


def test_entry_points_name_the_types_of_their_classes():
    from pyterrier_multiquery.training.bi_encoder import BI_ENCODER_ARTIFACT, load_bi_encoder
    for name, value in DECLARED.items():
        target = importlib.metadata.EntryPoint(name, value, 'pyterrier.artifact').load()
        if target is load_bi_encoder:  # a bi-encoder loads as pyterrier_dr's SBertBiEncoder, which has no type
            assert name == '.'.join(BI_ENCODER_ARTIFACT)
            continue
        cls = getattr(target, '__self__', target)  # a model's entry point is its `load`
        assert name == f'{cls.ARTIFACT_TYPE}.{cls.ARTIFACT_FORMAT}'


def test_every_artifact_class_of_the_package_has_an_entry_point():
    """Each class that writes a ``pt_meta.json`` type and format (indexes, trained models) is loadable by
    ``pt.Artifact.load``: its ``type.format`` is declared."""
    import importlib
    import pkgutil

    import pyterrier_multiquery
    classes = set()
    for module in pkgutil.walk_packages(pyterrier_multiquery.__path__, 'pyterrier_multiquery.'):
        if '.experiment' in module.name:
            continue
        for value in vars(importlib.import_module(module.name)).values():
            declares = isinstance(value, type) and value.__module__ == module.name and \
                ('ARTIFACT_TYPE' in vars(value) or 'ARTIFACT_FORMAT' in vars(value))
            if declares and isinstance(getattr(value, 'ARTIFACT_TYPE', None), str):  # not the bases without a type
                classes.add(value)
    assert len(classes) >= 7, classes
    missing = sorted(f'{c.__module__}.{c.__name__} ({c.ARTIFACT_TYPE}.{c.ARTIFACT_FORMAT})' for c in classes
                     if f'{c.ARTIFACT_TYPE}.{c.ARTIFACT_FORMAT}' not in DECLARED)
    assert missing == []


def test_a_lucene_index_loads_as_an_artifact(tmp_path, declared_entry_points):
    from pyterrier_multiquery.lucene import LuceneIndex
    (tmp_path / 'bm25.lucene').mkdir()
    (tmp_path / 'bm25.lucene' / 'pt_meta.json').write_text(json.dumps({'type': 'sparse_index', 'format': 'lucene',
                                                                      'contents': 'text'}))
    assert pt.Artifact.load(str(tmp_path / 'bm25.lucene')) == LuceneIndex(tmp_path / 'bm25.lucene')


def weights_of(folder: Path) -> Path:
    return next(p for p in sorted(folder.rglob('*')) if p.name in ('model.safetensors', 'decoder.pt'))


CONFIGS = {'amer': 'amer_config.json', 'encoder_amer': 'amer_config.json', 'jpr': 'jpr_config.json',
           'diffretriever': 'diffretriever.json'}


@pytest.mark.parametrize('kind', KINDS)
def test_damaged_folders_name_what_is_wrong(kind, tiny_bert, tmp_path, declared_entry_points):
    model, _ = make(kind, tiny_bert)
    model.save_pretrained(tmp_path / 'saved')
    cls = type(model)

    @contextlib.contextmanager
    def copy():
        shutil.copytree(tmp_path / 'saved', tmp_path / 'copy')
        yield tmp_path / 'copy'
        shutil.rmtree(tmp_path / 'copy')

    with copy() as path:
        weights = weights_of(path)
        weights.unlink()
        with pytest.raises(FileNotFoundError, match=f"missing .*{weights.name}"):
            pt.Artifact.load(str(path))
    with copy() as path:
        weights = weights_of(path)
        weights.write_bytes(weights.read_bytes()[:-10])
        with pytest.raises(CorruptModelError, match=f'{weights.name}.* truncated or damaged'):
            cls.load(path)
    with copy() as path:
        (path / CONFIGS[kind]).write_text('{"k_query": ')
        with pytest.raises(CorruptModelError, match=f'{CONFIGS[kind]}.*(truncated|not valid JSON)'):
            cls.from_pretrained(path)
    with copy() as path:
        (path / CONFIGS[kind]).unlink()
        with pytest.raises(FileNotFoundError, match=f'missing .*{CONFIGS[kind]}'):
            pt.Artifact.load(str(path))
    with copy() as path:
        (path / 'pt_meta.json').write_text('{"type": "amer_model", ')
        with pytest.raises(CorruptModelError, match='pt_meta.json.* not valid JSON'):
            cls.load(path)
    with copy() as path:
        meta = json.loads((path / 'pt_meta.json').read_text())
        (path / 'pt_meta.json').write_text(json.dumps({**meta, 'type': 'dense_index', 'format': 'flex'}))
        with pytest.raises(ValueError, match=f'holds a dense_index.flex artifact, not a {cls.__name__}'):
            cls.load(path)
        if kind != 'diffretriever':  # a DiffRetriever takes any checkpoint as its backbone
            with pytest.raises(ValueError, match='holds a dense_index.flex artifact'):
                cls.from_pretrained(path)
    with copy() as path:
        (path / 'pt_meta.json').unlink()
        with pytest.raises(FileNotFoundError, match='no pt_meta.json'):
            cls.load(path)
        assert cls.from_pretrained(path).path == path  # saved before models had pt_meta.json: loads unchecked


def test_to_hf_and_from_hf_move_a_model_through_a_package(tiny_bert, tmp_path, monkeypatch, declared_entry_points):
    """``to_hf`` packages the folder and ``from_hf`` unpacks it, with the hub replaced by a folder (offline)."""
    import huggingface_hub
    hub = tmp_path / 'hub'
    monkeypatch.setenv('PYTERRIER_HOME', str(tmp_path / 'pyterrier_home'))
    monkeypatch.setenv('HF_TOKEN', '')
    for name in ('create_repo', 'update_repo_visibility', 'create_branch'):
        monkeypatch.setattr(huggingface_hub, name, lambda *args, **kwargs: None, raising=False)
    monkeypatch.setattr(huggingface_hub, 'upload_folder', lambda repo_id, folder_path, revision, **kwargs:
                        shutil.copytree(folder_path, hub / repo_id / revision))

    @contextlib.contextmanager
    def download_stream(url, **kwargs):
        prefix = 'https://huggingface.co/datasets/'
        repo, file = url[len(prefix):].split('/resolve/')
        with open(hub / repo / file, 'rb') as fin:
            yield fin
    monkeypatch.setattr(pt.io, 'download_stream', download_stream)
    model, output = make('jpr', tiny_bert)
    with pytest.raises(AssertionError, match='without a path'):
        model.to_hf('someone/jpr')
    model.save_pretrained(tmp_path / 'model')
    model.to_hf('someone/jpr', branch='v1')
    loaded = pt.Artifact.from_hf('someone/jpr', 'v1')
    assert type(loaded) is type(model)
    np.testing.assert_array_equal(output(loaded), output(model))


def test_a_trained_model_loads_into_its_transformer(tiny_bert, tmp_path, declared_entry_points):
    from pyterrier_multiquery.jpr import JPR
    model, _ = make('jpr', tiny_bert)
    model.save_pretrained(tmp_path / 'jpr')
    frame = pd.DataFrame({'qid': '1', 'query': 'who won the cup', 'docno': ['a', 'b', 'c'],
                          'text': ['the cup in year', 'which city', 'cats'], 'score': [3., 2., 1.]})
    expected = JPR(model, k=2, num_candidates=3, device='cpu')(frame)
    pd.testing.assert_frame_equal(JPR(pt.Artifact.load(str(tmp_path / 'jpr')), k=2, num_candidates=3,
                                      device='cpu')(frame), expected)


@pytest.mark.parametrize('kind', KINDS)
def test_changed_bytes_in_a_saved_model_are_refused(kind, tiny_bert, tmp_path):
    """A flipped byte or a NaN in the weights, or a flipped first byte of any file, is named at load, and verify()
    names it too."""
    model, _ = make(kind, tiny_bert)
    model.save_pretrained(tmp_path / 'saved')
    cls = type(model)
    files = [p for p in sorted((tmp_path / 'saved').rglob('*')) if p.is_file() and p.name != 'pt_meta.json']
    weights = weights_of(tmp_path / 'saved')
    changes = [(weights, len(weights.read_bytes()) - 4, np.float32(np.nan).tobytes())]
    changes += [(file, 0, bytes([file.read_bytes()[0] ^ 1])) for file in files]
    for file, position, new in changes:
        shutil.copytree(tmp_path / 'saved', tmp_path / 'copy')
        damaged = tmp_path / 'copy' / file.relative_to(tmp_path / 'saved')
        data = bytearray(damaged.read_bytes())
        data[position:position + len(new)] = new
        damaged.write_bytes(bytes(data))
        with pytest.raises(CorruptModelError, match=f'{damaged.name}.* SHA-256 differs'):
            cls.load(tmp_path / 'copy')
        with pytest.raises(CorruptModelError, match=f'{damaged.name}.* SHA-256 differs'):
            cls.verify(tmp_path / 'copy')
        shutil.rmtree(tmp_path / 'copy')
    cls.verify(tmp_path / 'saved')
