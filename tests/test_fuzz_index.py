"""Random frames for the public transformers of the MultiVectorIndex and for MMR.

Each generated cell carries whether it is valid. A frame missing a column fails PyTerrier's validation; a repeated
qid, a bad vector or an unknown docno raises an error naming it; a valid frame gives exactly the brute-force result.
"""
import re
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyterrier as pt
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from pyterrier_multiquery.baselines import MMR
from pyterrier_multiquery.index import MultiVectorIndex
from pyterrier_multiquery.index.multiquery import round_robin

DIM = 4
NUM_RESULTS = 5
FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

rng = np.random.default_rng(0)
DOCS = {f'd{i}': rng.normal(size=(rng.integers(1, 4), DIM)).astype(np.float32) for i in range(12)}

finite = st.floats(-4, 4, allow_nan=False, allow_infinity=False, width=32)


NOISE = np.random.default_rng(1).normal(scale=1e-2, size=(4, DIM + 1)).astype(np.float32)
DEFAULT_ROWS = st.integers(1, 3)
DEFAULT_COLUMNS = st.just(DIM)


def matrices(rows=DEFAULT_ROWS, columns=DEFAULT_COLUMNS):
    """Random matrices, made generic by a little fixed noise so that no two documents tie by chance."""
    return st.tuples(rows, columns).flatmap(lambda shape: arrays(np.float32, shape, elements=finite)).map(
        lambda m: m + NOISE[:m.shape[0], :m.shape[1]])


def with_non_finite(matrix):
    return st.tuples(st.integers(0, matrix.size - 1), st.sampled_from([np.nan, np.inf, -np.inf])).map(
        lambda change: np.where(np.arange(matrix.size).reshape(matrix.shape) == change[0], change[1], matrix))


# (cell, valid): what a user may put in query_embs
query_cells = st.one_of(
    matrices().map(lambda m: (m, True)),
    matrices(rows=st.just(1)).map(lambda m: (m[0], True)),  # a query_vec-like row is one vector
    matrices().map(lambda m: (m.astype(np.float64).tolist(), True)),  # nested lists of floats
    st.just((np.arange(2 * DIM).reshape(2, DIM), True)),  # integers
    matrices().flatmap(with_non_finite).map(lambda m: (m, False)),
    matrices(columns=st.sampled_from([1, DIM - 1, DIM + 1])).map(lambda m: (m, False)),
    st.just((np.zeros((0, DIM), dtype=np.float32), False)),
    st.just((np.ones((1, 1, DIM), dtype=np.float32), False)),
    st.sampled_from([None, 'a query', [[1., 2.], [3.]], {'a': 1}]).map(lambda junk: (junk, False)),
)
qids = st.sampled_from(['q0', 'q1', 'q2', 'q3'])
columns_dropped = st.sets(st.sampled_from(['qid', 'query', 'query_embs']), max_size=2)


@pytest.fixture(scope='module')
def index(tmp_path_factory):
    return MultiVectorIndex(tmp_path_factory.mktemp('fuzz') / 'index', verbose=False).index(
        {'docno': docno, 'doc_embs': embs} for docno, embs in DOCS.items())


def maxsim(query, embs, aggregate='mean'):
    best = (np.asarray(query, dtype=np.float64) @ embs.T.astype(np.float64)).max(axis=1)
    return best.mean() if aggregate == 'mean' else best.sum()


def as_matrix(cell):
    return np.atleast_2d(np.asarray(cell, dtype=np.float32))


def top(scores: dict, k=NUM_RESULTS):
    return dict(sorted(scores.items(), key=lambda item: -item[1])[:k])


def expected_maxsim(query, aggregate='mean'):
    return {docno: maxsim(as_matrix(query), embs, aggregate) for docno, embs in DOCS.items()}


def expected_mean(query):
    return {docno: float(embs.mean(axis=0) @ as_matrix(query).mean(axis=0)) for docno, embs in DOCS.items()}


def expected_multiquery(query, merge):
    lists = [top({docno: maxsim(vector[None], embs) for docno, embs in DOCS.items()}) for vector in as_matrix(query)]
    if merge == 'round_robin':
        merged = round_robin([list(ranking) for ranking in lists], NUM_RESULTS)
        return {docno: -float(rank) for rank, docno in enumerate(merged)}
    fused = {}  # every document of the lists with its fused score (equal RRF scores tie at the cut)
    for ranking in lists:
        for rank, (docno, score) in enumerate(ranking.items()):
            fused[docno] = fused.get(docno, 0.) + (score if merge == 'score_sum' else 1 / (60 + rank))
    return fused


RETRIEVERS = {
    'maxsim_exact_mean': (lambda index: index.maxsim_retriever(num_results=NUM_RESULTS, block_vectors=7),
                          expected_maxsim),
    'maxsim_exact_sum': (lambda index: index.maxsim_retriever(num_results=NUM_RESULTS, aggregate='sum'),
                         lambda query: expected_maxsim(query, 'sum')),
    # every stored vector is a candidate of a flat search over these few: the exact result
    'maxsim_approximate': (lambda index: index.ann_retriever(num_results=NUM_RESULTS, ann='flat'),
                           expected_maxsim),
    'mean': (lambda index: index.mean_retriever(num_results=NUM_RESULTS), expected_mean),
    **{f'multiquery_{merge}': (lambda index, merge=merge: index.multiquery_retriever(merge, num_results=NUM_RESULTS),
                               lambda query, merge=merge: expected_multiquery(query, merge))
       for merge in ('round_robin', 'score_sum', 'rrf')},
}


def assert_ranking(got: pd.DataFrame, expected: dict):
    """The top scores of ``expected`` (docno: score of every candidate) rank by rank, each docno with its own
    score (so that tied documents may come in either order)."""
    assert list(got['rank']) == list(range(min(NUM_RESULTS, len(expected))))
    best = sorted(expected.values(), reverse=True)[:NUM_RESULTS]
    np.testing.assert_allclose(got['score'], best, rtol=1e-4, atol=1e-5)
    for docno, score in zip(got['docno'], got['score']):
        assert score == pytest.approx(expected[docno], rel=1e-4, abs=1e-5)


@pytest.mark.parametrize('name', list(RETRIEVERS))
@FUZZ
@given(rows=st.lists(st.tuples(qids, query_cells), max_size=4), dropped=columns_dropped, with_docno=st.booleans())
def test_retrievers_on_random_query_frames(index, name, rows, dropped, with_docno):
    make, expected = RETRIEVERS[name]
    frame = pd.DataFrame({'qid': [qid for qid, _ in rows], 'query': 'text',
                          'query_embs': pd.Series([cell for _, (cell, _) in rows], dtype=object)})
    frame = frame.drop(columns=sorted(dropped))
    if with_docno:
        frame['docno'] = 'd0'
    if {'qid', 'query_embs'} & dropped or with_docno:
        with pytest.raises(pt.validate.InputValidationError):
            make(index)(frame)
        return
    repeated = [qid for i, (qid, _) in enumerate(rows) if qid in [q for q, _ in rows[:i]]]
    invalid = [qid for qid, (_, valid) in rows if not valid]
    if repeated:
        with pytest.raises(ValueError, match=f"qid '{repeated[0]}' has more than one row"):
            make(index)(frame)
    elif invalid:
        with pytest.raises(ValueError, match=f"query '{invalid[0]}': query_embs"):
            make(index)(frame)
    else:
        out = make(index)(frame)
        assert {'qid', 'docno', 'score', 'rank'} <= set(out.columns)
        assert list(out['qid'].unique()) == [qid for qid, _ in rows]
        for qid, (cell, _) in rows:
            assert_ranking(out[out['qid'] == qid], expected(cell))


@FUZZ
@given(queries=st.dictionaries(qids, query_cells, max_size=3),
       picks=st.lists(st.sampled_from(list(DOCS) + ['nope', 3]), max_size=6),
       dropped=st.sets(st.sampled_from(['qid', 'query', 'docno', 'score', 'query_embs']), max_size=2))
def test_scorer_on_random_result_frames(index, queries, picks, dropped):
    rows = [(qid, docno) for qid in queries for docno in picks]
    frame = pd.DataFrame({'qid': [qid for qid, _ in rows], 'query': 'text', 'docno': [d for _, d in rows],
                          'score': 0., 'query_embs': pd.Series([queries[q][0] for q, _ in rows], dtype=object)})
    frame = frame.drop(columns=sorted(dropped))
    scorer = index.scorer()
    if {'qid', 'docno', 'query_embs'} & dropped:
        with pytest.raises(pt.validate.InputValidationError):
            scorer(frame)
        return
    unknown = [docno for _, docno in rows if docno not in DOCS]
    invalid = [qid for qid in queries if not queries[qid][1] and picks]
    if unknown:
        with pytest.raises(KeyError, match=f'docno {unknown[0]!r} is not in the index'):
            scorer(frame)
    elif invalid:
        with pytest.raises(ValueError, match=f"query '{invalid[0]}': query_embs"):
            scorer(frame)
    else:
        out = scorer(frame)
        assert len(out) == len(rows)
        for qid, docno, score in zip(out['qid'], out['docno'], out['score']):
            assert score == pytest.approx(maxsim(as_matrix(queries[qid][0]), DOCS[docno]), rel=1e-4, abs=1e-5)
        for _, group in out.groupby('qid'):
            assert list(group.sort_values('rank')['score']) == sorted(group['score'], reverse=True)


# (docno, valid) and (doc_embs, valid) for the indexer
docnos = st.one_of(st.sampled_from(['a', 'b', 'c', 'doc-1', 'é']).map(lambda d: (d, True)),
                   st.sampled_from([7, '', None, b'a', 'x\0y']).map(lambda d: (d, False)))
doc_cells = st.one_of(
    matrices(rows=st.integers(1, 4)).map(lambda m: (m, True)),
    matrices().map(lambda m: (m.tolist(), True)),
    matrices().flatmap(with_non_finite).map(lambda m: (m, False)),
    st.just((np.zeros((0, DIM), dtype=np.float32), False)),
    st.just((np.ones(DIM, dtype=np.float32), False)),  # doc_embs is 2-D (doc_vec is the one-vector column)
    st.sampled_from([None, 'text', [[1., 2.], [3.]]]).map(lambda junk: (junk, False)),
)


@settings(max_examples=60, deadline=None)
@given(records=st.lists(st.tuples(docnos, doc_cells, st.sampled_from([DIM, DIM, DIM, 2])), max_size=5))
def test_indexer_on_random_records(records):
    docs = [{'docno': docno, 'doc_embs': np.asarray(cell)[:, :dim] if valid and dim != DIM else cell}
            for (docno, _), (cell, valid), dim in records]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / 'index'
        problem = None
        for (docno, docno_valid), (_, valid), dim in records:
            if not docno_valid:
                problem = (ValueError,
                           f'docno {re.escape(repr(docno))} \\({type(docno).__name__}\\) is not a non-empty')
            elif not valid:
                problem = (ValueError, f'document {re.escape(repr(docno))}')
            elif dim != records[0][2] and records[0][0][1] and records[0][1][1]:
                problem = (ValueError, f'document {re.escape(repr(docno))} has vectors of size {dim}')
            if problem:
                break
        names = [docno for (docno, _), _, _ in records]
        repeated = {docno for i, docno in enumerate(names) if docno in names[:i]}
        if not records:
            problem = (ValueError, 'nothing to index')
        elif problem is None and repeated:
            problem = (ValueError, f"docno '({'|'.join(map(re.escape, repeated))})' occurs more than once")
        if problem:
            with pytest.raises(problem[0], match=problem[1]):
                MultiVectorIndex(path, verbose=False).index(docs)
            assert list(Path(folder).iterdir()) == []
            return
        index = MultiVectorIndex(path, verbose=False).index(docs)
        meta, vectors, offsets, lookup = MultiVectorIndex(path).payload()
        assert list(lookup) == names and meta['doc_count'] == len(records)
        for i, doc in enumerate(docs):
            np.testing.assert_array_equal(vectors[offsets[i]:offsets[i + 1]],
                                          np.asarray(doc['doc_embs'], dtype=np.float32))
        assert sorted(p.name for p in Path(folder).iterdir()) == ['index'] and len(index) == len(records)


def assert_mmr_order(scores, vectors, lam, order):
    """Each pick has the highest MMR value among the documents left (Eq. 3; ties in either order)."""
    unit = [np.asarray(v, dtype=float) / np.linalg.norm(v) for v in vectors]
    picked, left = [], list(range(len(scores)))
    for pick in order:
        values = {i: lam * scores[i] - (1 - lam) * max((unit[i] @ unit[j] for j in picked), default=0.) for i in left}
        assert values[pick] >= max(values.values()) - 1e-9
        picked.append(pick)
        left.remove(pick)
    assert left == []


vec_cells = st.one_of(  # (doc_vec, valid): a valid vector of another size than the first row's is invalid
    arrays(np.float64, 3, elements=st.floats(-4, 4, width=32).filter(lambda x: abs(x) > 1e-3)).map(lambda v: (v, True)),
    st.just((np.array([1., 2]), True)),
    st.sampled_from([np.array([np.nan, 1, 0]), np.array([0., 0, 0]), 'vec', None]).map(lambda v: (v, False)),
)


@FUZZ
@given(rows=st.lists(st.tuples(st.sampled_from(['q0', 'q1']), st.one_of(finite.map(lambda s: (s, True)),
                                                                          st.just((np.nan, False))), vec_cells),
                     max_size=6),
       lam=st.sampled_from([0., 0.3, 1.]), dropped=st.sets(st.sampled_from(['qid', 'docno', 'score', 'doc_vec']),
                                                             max_size=1))
@example(rows=[('q1', (0., True), (np.array([np.nan, 1, 0]), False)),   # q1 comes first: its bad vector is named
               ('q0', (0., True), (np.array([np.nan, 1, 0]), False))], lam=0., dropped=set())
def test_mmr_on_random_result_frames(rows, lam, dropped):
    frame = pd.DataFrame({'qid': [qid for qid, _, _ in rows], 'docno': [f'd{i}' for i in range(len(rows))],
                          'score': [score for _, (score, _), _ in rows],
                          'doc_vec': pd.Series([vec for _, _, (vec, _) in rows], dtype=object)})
    frame = frame.drop(columns=sorted(dropped))
    if dropped:
        with pytest.raises(pt.validate.InputValidationError, match=next(iter(dropped))):
            MMR(lam)(frame)
        return
    bad_score = [i for i, (_, (_, ok), _) in enumerate(rows) if not ok]
    # vectors are checked per query (queries in order of first appearance, documents by score) against the query's
    # first vector's size
    appearance = {qid: position for position, qid in enumerate(dict.fromkeys(qid for qid, _, _ in rows))}
    in_order = sorted(range(len(rows)), key=lambda i: (appearance[rows[i][0]], -rows[i][1][0]))
    first = {qid: next(i for i in in_order if rows[i][0] == qid) for qid, _, _ in rows}
    size = [len(vec) if ok else None for _, _, (vec, ok) in rows]
    bad_vec = [i for i in in_order if not rows[i][2][1] or size[i] != size[first[rows[i][0]]]]
    if bad_score:
        with pytest.raises(ValueError, match=f"docno 'd{bad_score[0]}' has score nan"):
            MMR(lam)(frame)
    elif bad_vec:
        with pytest.raises(ValueError, match=f"the doc_vec of qid '[^']+', docno 'd{bad_vec[0]}'"):
            MMR(lam)(frame)
    else:
        out = MMR(lam)(frame)
        assert 'doc_vec' not in out.columns and len(out) == len(rows)
        for qid, group in out.groupby('qid'):
            mine = frame[frame['qid'] == qid].reset_index(drop=True)
            order = [int(np.flatnonzero(mine['docno'] == docno)[0]) for docno in group['docno']]
            assert_mmr_order(mine['score'].to_numpy(), list(mine['doc_vec']), lam, order)
            assert list(group['rank']) == list(range(len(group)))
