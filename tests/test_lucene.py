"""Lucene through pyserini: the Java finder (fake JDK folders), BM25 on Vaswani against PISA's, DiffRetriever's
sparse ranking through PISA and through Lucene, and bad input."""
import importlib.util
import json
from collections import Counter

import pandas as pd
import pyterrier as pt
import pytest
from ir_measures import AP

from pyterrier_multiquery.baselines import bm25 as build_bm25
from pyterrier_multiquery.loaders import load_dataset
from pyterrier_multiquery.lucene import LuceneIndex, LuceneRetriever, find_java_home, java_version


def _anserini_missing():
    """Why Anserini cannot run here (pyserini absent, no Java 21+), or None when it can."""
    if importlib.util.find_spec('pyserini') is None:
        return "pyserini is not installed (pip install 'pyterrier-multiquery[pyserini]')"
    try:
        find_java_home()
    except RuntimeError as e:
        return str(e)
    return None


ANSERINI_MISSING = _anserini_missing()
needs_anserini = pytest.mark.skipif(ANSERINI_MISSING is not None, reason=str(ANSERINI_MISSING))


def fake_jdk(folder, version):
    folder.mkdir(parents=True)
    (folder / 'release').write_text(f'IMPLEMENTOR="Test"\nJAVA_VERSION="{version}"\nOS_NAME="Linux"\n')
    return str(folder)


def test_java_version_reads_the_release_file(tmp_path):
    assert java_version(fake_jdk(tmp_path / 'a', '21.0.2')) == 21
    assert java_version(fake_jdk(tmp_path / 'b', '1.8.0_292')) == 8
    assert java_version(fake_jdk(tmp_path / 'c', '25')) == 25
    assert java_version(tmp_path / 'none') is None


def test_find_java_home_prefers_java_home_then_the_newest(tmp_path, monkeypatch):
    old = fake_jdk(tmp_path / 'jvm' / 'java-17', '17.0.15')
    new = fake_jdk(tmp_path / 'jvm' / 'java-21', '21.0.2')
    newest = fake_jdk(tmp_path / 'opt' / 'jdk-25', '25.0.3')
    locations = [str(tmp_path / 'jvm' / '*'), str(tmp_path / 'opt' / '*jdk*')]
    monkeypatch.setenv('JAVA_HOME', new)
    assert find_java_home(locations=locations) == new        # JAVA_HOME, new enough, comes first
    monkeypatch.setenv('JAVA_HOME', old)
    assert find_java_home(locations=locations) == newest     # too old: the newest one found instead
    monkeypatch.delenv('JAVA_HOME')
    assert find_java_home(locations=locations[:1]) == new


def test_find_java_home_says_what_to_install(tmp_path, monkeypatch):
    old = fake_jdk(tmp_path / 'jvm' / 'java-17', '17.0.15')
    monkeypatch.setenv('JAVA_HOME', old)
    with pytest.raises(RuntimeError, match=r'pyserini needs Java 21 or newer; found 17 at .*java-17.*'
                                           r'install a JDK 21\+ and set JAVA_HOME'):
        find_java_home(locations=[str(tmp_path / 'jvm' / '*')])
    monkeypatch.delenv('JAVA_HOME')
    with pytest.raises(RuntimeError, match='found no JDK'):
        find_java_home(locations=[str(tmp_path / 'nothing' / '*')])


def test_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError, match='no finished Lucene index'):
        LuceneRetriever(tmp_path / 'missing')
    index = tmp_path / 'index'
    index.mkdir()
    (index / 'pt_meta.json').write_text(json.dumps({'type': 'sparse_index', 'format': 'lucene', 'contents': 'text'}))
    with pytest.raises(ValueError, match="'bm25' for a text index or 'impact' for a toks index"):
        LuceneRetriever(index, 'impact')
    with pytest.raises(pt.validate.InputValidationError, match=r"\['query'\]"):
        LuceneRetriever(index)(pd.DataFrame({'qid': ['1'], 'text': ['no query column']}))
    empty = LuceneRetriever(index)(pd.DataFrame({'qid': [], 'query': []}))
    assert list(empty.columns) == ['qid', 'query', 'docno', 'score', 'rank'] and len(empty) == 0
    with pytest.raises(FileExistsError, match='overwrite=True'):
        LuceneIndex(index).indexer().index([{'docno': 'd1', 'text': 'x'}])
    with pytest.raises(ValueError, match="non-empty string docno and 'toks'"):
        LuceneIndex(tmp_path / 'other').toks_indexer().index([{'docno': 'd1', 'text': 'no toks'}])
    assert not (tmp_path / 'other').exists()
    with pytest.raises(ValueError, match='stopwords must be'):
        LuceneIndex(tmp_path / 'other').indexer(stopwords='english')


def test_equality_repr_and_rank_cutoff(tmp_path):
    index = tmp_path / 'index'
    index.mkdir()
    (index / 'pt_meta.json').write_text(json.dumps({'contents': 'text'}))
    bm25 = LuceneIndex(index).bm25(num_results=100)
    same = LuceneRetriever(str(index), num_results=100)
    assert bm25 == same and hash(bm25) == hash(same)
    assert bm25 != LuceneIndex(index).bm25(k1=1.2, num_results=100)
    assert repr(bm25) == f'LuceneRetriever(LuceneIndex({str(index)!r}), num_results=100)'
    assert (bm25 % 10).compile() == LuceneIndex(index).bm25(num_results=10)
    assert (bm25 % 500).compile() != bm25  # a larger cutoff stays a cutoff


@needs_anserini
def test_vaswani_bm25_matches_pisa(data_dir, tmp_path):
    """Lucene's BM25 (Porter, Terrier's stopwords) against PISA's (Porter2, Terrier's stopwords): MAP within 0.01."""
    dataset = load_dataset(data_dir / 'vaswani')
    pisa = build_bm25(tmp_path / 'pisa', lambda: dataset.get_corpus_iter(verbose=False))
    lucene = build_bm25(tmp_path / 'lucene', lambda: dataset.get_corpus_iter(verbose=False), engine='lucene')
    topics = dataset.get_topics()
    run = lucene(topics)
    assert list(run.columns[:5]) == ['qid', 'query', 'docno', 'score', 'rank']
    assert run.groupby('qid')['rank'].min().eq(0).all() and run.groupby('qid').size().max() == 1000
    table = pt.Experiment([pisa, lucene], topics, dataset.get_qrels(), eval_metrics=[AP], names=['PISA', 'Lucene'])
    print(table)
    assert table['AP'].iloc[0] == pytest.approx(0.3053, abs=0.001)
    assert table['AP'].iloc[1] == pytest.approx(table['AP'].iloc[0], abs=0.01)


@needs_anserini
def test_diffretriever_sparse_ranking_same_through_pisa_and_lucene(data_dir, tmp_path):
    """DiffRetriever's toks (a tiny random BERT over the slice's own vocabulary) indexed by both engines with the
    same integer impacts ``int(100 w)``; query weights rounded to quarters, so that ``100 q`` is an integer for
    PISA's float query weights and Lucene's integer ones: scores equal, and the same top 10 (ties by docno)."""
    pytest.importorskip('torch')
    transformers = pytest.importorskip('transformers')
    from pyterrier_multiquery.diffretriever import DiffRetriever, lucene_sparse_index, sparse_index
    from pyterrier_multiquery.diffretriever.encoder import MaskedBackbone
    from test_diffretriever import SPECIAL, tiny_bert

    dataset = load_dataset(data_dir / 'vaswani')
    topics = dataset.get_topics().head(20)
    judged = set(dataset.get_qrels().query('qid in @topics.qid')['docno'])
    corpus = pd.DataFrame([doc for i, doc in enumerate(dataset.get_corpus_iter(verbose=False))
                           if i < 100 or doc['docno'] in judged])  # the slice: 100 documents and the judged ones
    words = Counter(w for text in list(corpus['text']) + list(topics['query']) for w in text.lower().split()
                    if w.isalpha())
    (tmp_path / 'vocab.txt').write_text('\n'.join(SPECIAL + [w for w, _ in words.most_common(600)]) + '\n')
    tokenizer = transformers.BertTokenizerFast(str(tmp_path / 'vocab.txt'), do_lower_case=True)
    encoder = DiffRetriever(MaskedBackbone(tiny_bert(tokenizer), tokenizer, 'lm'), k_query=2, k_doc=3,
                            max_length=64, device='cpu')  # the tiny BERT reads 128 positions, prompt included
    docs = encoder.doc_encoder()(corpus)[['docno', 'toks']].to_dict(orient='records')
    queries = encoder.query_encoder()(topics)
    queries['query_toks'] = [{t: round(4 * w) / 4 for t, w in toks.items() if round(4 * w)}
                             for toks in queries['query_toks']]
    pisa = sparse_index(tmp_path / 'pisa', docs).quantized(num_results=1000)(queries)
    lucene = lucene_sparse_index(tmp_path / 'lucene', docs).impact(num_results=1000)(queries)
    print(f'{len(corpus)} documents, {len(topics)} queries: {len(pisa)} results from PISA, {len(lucene)} from Lucene')
    assert len(lucene) == len(pisa) > 10 * len(topics)

    def top(run, k=10):
        ranked = run.sort_values(['qid', 'score', 'docno'], ascending=[True, False, True])
        return ranked.groupby('qid').head(k)[['qid', 'docno', 'score']].reset_index(drop=True)

    pd.testing.assert_frame_equal(top(lucene), top(pisa), check_dtype=False)
    pd.testing.assert_frame_equal(top(lucene, 1000), top(pisa, 1000), check_dtype=False)
