"""The approximate search's calibration, an explicit step: recall against exact search on sampled documents, the
fastest effort reaching the target, exact search where it is faster, the answer kept per build, setting and machine
outside the index folder; a search never calibrates by itself, and the user's setting wins."""
import json

import numpy as np
import pandas as pd
import pytest

pytest.importorskip('faiss')

from pyterrier_multiquery.experiment.clustered_collection import clustered_collection  # noqa: E402
from pyterrier_multiquery.index import MultiVectorIndex  # noqa: E402
from pyterrier_multiquery.index import calibration  # noqa: E402
from pyterrier_multiquery.index.ann_retriever import ApproxMaxSimRetriever  # noqa: E402
from pyterrier_multiquery.index.errors import CorruptIndexError  # noqa: E402

SETTING = {'ann': 'ivf', 'quantizer': 'SQ8', 'search_effort': 32, 'aggregate': 'mean', 'device': 'cpu',
           'num_results': 10}


def approximate(index, **settings):
    """The approximate retriever whose setting is calibrated (:data:`SETTING`, changed by ``settings``)."""
    return index.ann_retriever(**{**SETTING, **settings})


def build(path, doc_count: int = 1500, seed: int = 0):
    """A clustered index of ``doc_count`` documents (4 vectors of 16 dimensions) and 20 queries near documents."""
    documents, queries = clustered_collection(doc_count, dim=16, min_vectors=4, max_vectors=4, topics=150,
                                              query_count=20, query_vectors=4, seed=seed)
    index = MultiVectorIndex(path, verbose=False)
    index.indexer(overwrite=True).index(documents)
    return index, pd.DataFrame({'qid': [f'q{i}' for i in range(len(queries))], 'query_embs': queries})


@pytest.fixture(autouse=True)
def calibrations(tmp_path):
    """This machine's calibrations, kept in the test's folder (set apart from the tests' ``monkeypatch``, which
    some undo)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv('PYTERRIER_MULTIQUERY_CALIBRATIONS', str(tmp_path / 'calibrations'))
        yield tmp_path / 'calibrations'


@pytest.fixture
def clustered(tmp_path):
    return build(tmp_path / 'index')


def timings(monkeypatch, approx_s: float, exact_s: float):
    """Makes every timed search of the self-test take ``approx_s`` (approximate) or ``exact_s`` (exact) seconds."""
    monkeypatch.setattr(calibration, '_seconds', lambda retriever, queries:
                        approx_s if isinstance(retriever, ApproxMaxSimRetriever) else exact_s)


def test_first_count_reaching_the_target_is_kept(clustered, monkeypatch):
    index, _ = clustered
    timings(monkeypatch, approx_s=1., exact_s=2.)
    found = calibration.calibrate(approximate(index))
    assert list(found.tried) == [32] and found.search_effort == 32   # the effort the retriever names
    tried = found.tried[32]
    counts = list(tried)
    assert counts == list(calibration.CANDIDATE_COUNTS[:len(counts)])   # ascending, from the smallest
    assert found.candidates == counts[-1] and found.recall == tried[counts[-1]] >= calibration.TARGET_RECALL
    assert all(tried[c] < calibration.TARGET_RECALL for c in counts[:-1])
    assert (found.approx_s, found.exact_s) == (1., 2.)


def effort_timings(monkeypatch):
    """Makes a timed approximate search take (effort + count / 4) ms, and exact search a second."""
    monkeypatch.setattr(calibration, '_seconds', lambda retriever, queries:
                        (retriever.search_effort + retriever.candidates / 4) / 1000
                        if isinstance(retriever, ApproxMaxSimRetriever) else 1.)


def test_the_fastest_effort_reaching_the_target_is_kept(clustered, monkeypatch):
    index, _ = clustered
    effort_timings(monkeypatch)
    found = calibration.calibrate(approximate(index, search_effort=None))
    assert list(found.tried) == list(calibration.SEARCH_EFFORTS)   # the usual effort first
    firsts = {effort: next((c for c, r in counts.items() if r >= calibration.TARGET_RECALL), None)
              for effort, counts in found.tried.items()}
    reached = {effort: (effort + count / 4) / 1000 for effort, count in firsts.items() if count is not None}
    best = min(reached, key=reached.get)
    assert (found.search_effort, found.candidates) == (best, firsts[best])
    assert found.approx_s == pytest.approx(reached[best]) and found.recall == found.tried[best][firsts[best]]
    for effort, counts in found.tried.items():   # an effort stops where it reaches the target or is too slow
        last = list(counts)[-1]
        faster = [s for e, s in reached.items() if list(found.tried).index(e) < list(found.tried).index(effort)]
        assert counts[last] >= calibration.TARGET_RECALL or (effort + last / 4) / 1000 >= min(faster, default=1.)
    assert all(counts[c] < calibration.TARGET_RECALL for counts in found.tried.values() for c in list(counts)[:-1])


def test_the_flat_index_has_no_effort_to_calibrate(clustered, monkeypatch):
    index, _ = clustered
    effort_timings(monkeypatch)
    found = calibration.calibrate(approximate(index, ann='flat', quantizer=None, search_effort=None))
    assert list(found.tried) == [calibration.DEFAULT_SEARCH_EFFORT] == [found.search_effort]


def test_recall_is_measured_against_exact_search_leaving_each_document_out(clustered, monkeypatch):
    index, _ = clustered
    timings(monkeypatch, approx_s=1., exact_s=2.)
    found = calibration.calibrate(approximate(index))
    _, vectors, offsets, docnos = index.payload()
    sample = np.sort(np.random.default_rng(0).choice(len(offsets) - 1, calibration.SAMPLE_DOCUMENTS, replace=False))
    everything = np.asarray(vectors, dtype=np.float64)
    recalls = []
    for i in sample:   # brute force in float64, independently of the index's search
        sims = np.asarray(vectors[offsets[i]:offsets[i + 1]], dtype=np.float64) @ everything.T
        scores = np.array([sims[:, a:b].max(axis=1).mean() for a, b in zip(offsets[:-1], offsets[1:])])
        scores[i] = -np.inf
        truth = set(np.argsort(-scores, kind='stable')[:10])
        run = index.ann_retriever(candidates=found.candidates, num_results=11)(
            pd.DataFrame({'qid': ['x'], 'query_embs': [vectors[offsets[i]:offsets[i + 1]]]}))
        got = [docnos.inv[d] for d in run['docno'] if d != docnos.fwd[i]][:10]
        recalls.append(len(truth & set(got)) / 10)
    assert np.mean(recalls) == pytest.approx(found.recall)


def test_exact_search_where_the_approximate_one_is_not_faster(clustered, monkeypatch):
    index, queries = clustered
    timings(monkeypatch, approx_s=2., exact_s=1.)
    found = calibration.calibrate(approximate(index))
    assert found.candidates is None and list(found.tried[32]) == [calibration.CANDIDATE_COUNTS[0]]   # stops at once
    calibration.calibrated(approximate(index, search_effort=None))   # stored for the default retriever
    pd.testing.assert_frame_equal(index.ann_retriever(num_results=10)(queries),
                                  index.retriever(num_results=10)(queries))


def test_no_count_reaching_the_target_searches_exactly(clustered, monkeypatch):
    index, _ = clustered
    timings(monkeypatch, approx_s=1., exact_s=2.)
    monkeypatch.setattr(calibration, 'TARGET_RECALL', 1.01)   # unreachable
    found = calibration.calibrate(approximate(index))
    assert found.candidates is None and list(found.tried[32]) == list(calibration.CANDIDATE_COUNTS)
    monkeypatch.setattr(calibration, 'calibrate', lambda retriever: found)
    assert calibration.calibrated(approximate(index)) == found   # written,
    monkeypatch.undo()
    assert calibration.calibrated(approximate(index)) == found   # and read back (all ten counts)


def test_a_search_never_calibrates_and_an_uncalibrated_one_says_so(clustered, capfd):
    """The first approximate search builds FAISS (announced) and searches at the default count with a warning that
    names calibrate(); calibrate() is the step that measures (announced), and later searches use what it found."""
    index, queries = clustered
    capfd.readouterr()
    retriever = approximate(index, search_effort=None, verbose=False)
    with pytest.warns(UserWarning, match=r'not calibrated on this machine: searching with 256 candidates .* '
                                         r'calibrate\(\)'):
        uncalibrated = retriever(queries)
    shown = capfd.readouterr().err
    assert 'FAISS IVF' in shown and 'training on' in shown and 'adding 6,000 vectors' in shown
    assert 'calibrating' not in shown and calibration.stored(retriever) is None
    expected = index.ann_retriever(candidates=calibration.DEFAULT_CANDIDATES,
                                   search_effort=calibration.DEFAULT_SEARCH_EFFORT, num_results=10)(queries)
    pd.testing.assert_frame_equal(uncalibrated, expected)
    found = retriever.calibrate()   # real timings
    assert f'calibrating the ivf search of {index.path} on this machine' in capfd.readouterr().err
    assert calibration.stored(retriever) == found
    run = index.ann_retriever(num_results=10)(queries)
    expected = (index.retriever(num_results=10) if found.candidates is None else
                index.ann_retriever(candidates=found.candidates, search_effort=found.search_effort,
                                    num_results=10))(queries)
    pd.testing.assert_frame_equal(run, expected)
    assert capfd.readouterr().err == ''
    exact = index.retriever(num_results=10)(queries)
    overlap = [len(set(run[run['qid'] == q]['docno']) & set(group['docno'])) / 10 for q, group in exact.groupby('qid')]
    assert np.mean(overlap) >= 0.95   # queries near documents, as the sampled documents are


def test_the_users_setting_wins_over_the_calibration(clustered, monkeypatch):
    index, _ = clustered
    timings(monkeypatch, approx_s=2., exact_s=1.)
    assert approximate(index, search_effort=None).calibrate().candidates is None   # exact search was faster
    given = index.ann_retriever(candidates=16, num_results=10)
    assert given.setting() == (16, calibration.DEFAULT_SEARCH_EFFORT)
    assert index.ann_retriever(num_results=10).setting()[0] is None   # where none is given: exact search


def test_a_calibration_is_kept_outside_the_index_and_per_machine(clustered, calibrations, monkeypatch, tmp_path):
    import shutil
    index, queries = clustered
    timings(monkeypatch, approx_s=1., exact_s=2.)
    retriever = approximate(index, search_effort=None)
    found = retriever.calibrate()
    assert list(index.path.glob('calibration*')) == [] and calibration.calibration_file(retriever).is_relative_to(
        calibrations)
    index.verify()
    shutil.copytree(index.path, tmp_path / 'copy')   # a copied index is the same build: this machine's calibration
    copy = approximate(MultiVectorIndex(tmp_path / 'copy', verbose=False), search_effort=None)
    assert calibration.stored(copy) == found
    monkeypatch.setattr(calibration, 'machine', lambda device: 'another-machine')
    assert calibration.stored(retriever) is None   # another machine's timings do not hold here


def test_calibration_is_kept_per_build_and_redone_after_a_rebuild(tmp_path, monkeypatch):
    index, _ = build(tmp_path / 'index')
    timings(monkeypatch, approx_s=1., exact_s=2.)
    first = calibration.calibrated(approximate(index))
    path = calibration.calibration_file(approximate(index))
    stored = json.loads(path.read_text())
    assert stored['build_id'] == index.payload()[0]['build_id'] and stored['calibration']['candidates'] == \
        first.candidates
    assert [p.name for p in path.parent.iterdir() if p.name.startswith('.')] == []   # no temporary file left

    def refuse(*args, **kwargs):
        raise AssertionError('calibrated again')
    monkeypatch.setattr(calibration, 'calibrate', refuse)
    assert calibration.calibrated(approximate(index)) == first   # read back
    monkeypatch.undo()
    timings(monkeypatch, approx_s=2., exact_s=1.)
    index, _ = build(tmp_path / 'index', seed=1)   # rebuilt: a new build id
    assert calibration.calibrated(approximate(index)).candidates is None


@pytest.mark.parametrize('change', ['truncate', 'candidates', 'build'])
def test_a_changed_calibration_file_is_named(clustered, monkeypatch, change):
    index, queries = clustered
    timings(monkeypatch, approx_s=1., exact_s=2.)
    calibration.calibrated(approximate(index, search_effort=None))   # the default retriever's
    path = calibration.calibration_file(approximate(index, search_effort=None))
    text = path.read_text()
    path.write_text({'truncate': text[:len(text) // 2],
                     'candidates': text.replace('"candidates": ', '"candidates": 1'),
                     'build': text.replace(index.payload()[0]['build_id'], '0' * 32)}[change])
    with pytest.raises(CorruptIndexError, match=path.name.replace('.', r'\.')):
        index.ann_retriever(num_results=10)(queries)
    index.verify()   # the index itself is whole
    path.unlink()   # as the error says: calibrated again
    assert calibration.calibrated(approximate(index, search_effort=None)).candidates is not None


def test_a_calibration_of_a_build_replaced_meanwhile_is_not_kept(tmp_path, monkeypatch, calibrations):
    index, _ = build(tmp_path / 'index')
    made = calibration.calibrate

    def replaced_meanwhile(*args, **kwargs):
        found = made(*args, **kwargs)
        build(tmp_path / 'index', seed=1)
        return found
    timings(monkeypatch, approx_s=1., exact_s=2.)
    monkeypatch.setattr(calibration, 'calibrate', replaced_meanwhile)
    assert calibration.calibrated(approximate(index)).candidates is not None
    assert list(calibrations.rglob('*.json')) == []


def test_settings_are_calibrated_apart(clustered, monkeypatch, calibrations):
    index, _ = clustered
    timings(monkeypatch, approx_s=1., exact_s=2.)
    calibration.calibrated(approximate(index))
    calibration.calibrated(approximate(index, search_effort=4, aggregate='sum'))
    calibration.calibrated(approximate(index, search_effort=None))
    build_id = index.payload()[0]['build_id']
    assert sorted(p.relative_to(calibrations).as_posix().rsplit('_', 1)[0] for p in calibrations.rglob('*.json')) == [
        f'{build_id}/ivf_SQ8_e32_mean_k10_cpu', f'{build_id}/ivf_SQ8_e4_sum_k10_cpu',
        f'{build_id}/ivf_SQ8_eauto_mean_k10_cpu']


def test_a_tiny_index_searches_exactly(tmp_path):
    index = MultiVectorIndex(tmp_path / 'tiny', verbose=False)
    rng = np.random.default_rng(0)
    index.index({'docno': f'd{i}', 'doc_embs': rng.normal(size=(3, 8)).astype(np.float32)} for i in range(6))
    queries = pd.DataFrame({'qid': ['a'], 'query_embs': [rng.normal(size=(2, 8)).astype(np.float32)]})
    with pytest.warns(UserWarning, match='not calibrated'):
        pd.testing.assert_frame_equal(index.ann_retriever()(queries), index.retriever()(queries))
    assert calibration.calibrated(approximate(index)).candidates is None


def test_a_long_document_queries_with_some_of_its_vectors(tmp_path, monkeypatch):
    documents, _ = clustered_collection(300, dim=16, min_vectors=20, max_vectors=45, topics=30, query_count=1)
    index = MultiVectorIndex(tmp_path / 'long', verbose=False).index(documents)
    asked = []
    monkeypatch.setattr(calibration, '_seconds', lambda retriever, queries: asked.append(queries) or 1.)
    calibration.calibrate(approximate(index))
    _, vectors, offsets, docnos = index.payload()
    for qid, embs in zip(asked[0]['qid'], asked[0]['query_embs']):
        i = docnos.inv[qid]
        stored = np.asarray(vectors[offsets[i]:offsets[i + 1]])
        assert len(embs) == min(len(stored), calibration.QUERY_VECTORS)
        rows = [int(np.flatnonzero((stored == vector).all(axis=1))[0]) for vector in embs]
        assert rows == sorted(set(rows))   # distinct vectors of the document, in its order
    assert any(offsets[i + 1] - offsets[i] > calibration.QUERY_VECTORS for i in map(docnos.inv.__getitem__,
                                                                                 asked[0]['qid']))


def test_every_effort_searches_the_one_faiss_index_loaded(clustered, monkeypatch):
    from pyterrier_multiquery.index import ann
    index, queries = clustered
    loads = []
    load = ann.load_or_build
    monkeypatch.setattr(ann, 'load_or_build', lambda *args, **kwargs: loads.append(1) or load(*args, **kwargs))
    runs = {effort: index.ann_retriever(candidates=16, search_effort=effort, num_results=10)(queries)
            for effort in (1, 64)}
    assert len(loads) == 1   # not a copy in memory for every effort
    again = index.ann_retriever(candidates=16, search_effort=1, num_results=10)(queries)
    pd.testing.assert_frame_equal(again, runs[1])   # the effort is set for each search
    fresh = MultiVectorIndex(index.path, verbose=False)   # its own FAISS index, at effort 64 only
    pd.testing.assert_frame_equal(fresh.ann_retriever(candidates=16, search_effort=64, num_results=10)(
        queries), runs[64])
    assert not runs[1].equals(runs[64])   # one list probed misses some of what 64 find


def test_a_deeper_ranking_is_calibrated_at_its_depth(clustered, monkeypatch, calibrations):
    """A retriever asking for 100 documents is calibrated on recall at 100 (a count that finds the top 10 may miss
    the rest), kept apart from the one asking for 10, and one asking for more than MAX_DEPTH at MAX_DEPTH."""
    index, _ = clustered
    timings(monkeypatch, approx_s=1., exact_s=2.)
    depths = []
    measured = calibration._top_others
    monkeypatch.setattr(calibration, '_top_others', lambda run, top: depths.append(top) or measured(run, top))
    calibration.calibrated(approximate(index))
    calibration.calibrated(approximate(index, num_results=100))
    assert sorted(set(depths)) == [10, 100]
    assert {p.name.split('_')[4] for p in calibrations.rglob('*.json')} == {'k10', 'k100'}
    assert calibration.depth(approximate(index, num_results=5000)) == calibration.MAX_DEPTH
