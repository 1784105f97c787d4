"""ShardedMultiVectorIndex: shards searched as one rank exactly as one index over the same documents."""
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pyterrier_multiquery.index import CorruptIndexError, MultiVectorIndex, ShardedMultiVectorIndex

DIM = 8


def collection(doc_count=120, integer=False, seed=0):
    """Documents of 1 to 6 vectors; integer-valued vectors make scores exact, so ties are many."""
    rng = np.random.default_rng(seed)
    draw = (lambda n: rng.integers(-2, 3, size=(n, DIM))) if integer else (lambda n: rng.normal(size=(n, DIM)))
    return [{'docno': f'd{i}', 'doc_embs': draw(rng.integers(1, 7)).astype(np.float32)} for i in range(doc_count)]


def topics(integer, count=9, seed=1):
    rng = np.random.default_rng(seed)
    draw = (lambda n: rng.integers(-2, 3, size=(n, DIM))) if integer else (lambda n: rng.normal(size=(n, DIM)))
    return pd.DataFrame({'qid': [f'q{i}' for i in range(count)], 'query': 'x',
                         'query_embs': [draw(rng.integers(1, 8)).astype(np.float32) for _ in range(count)]})


@pytest.fixture(scope='module', params=['integer', 'gaussian'])
def indexes(request, tmp_path_factory):
    integer = request.param == 'integer'
    docs = collection(integer=integer)
    folder = tmp_path_factory.mktemp('shards')
    whole = MultiVectorIndex(folder / 'whole', verbose=False).index(docs)
    three = ShardedMultiVectorIndex(folder / 'three', verbose=False).indexer(num_shards=3).index(docs)
    # shards of 50, 50 and 20 documents written by two processes at once, from an iterator
    parallel = ShardedMultiVectorIndex(folder / 'parallel', verbose=False).indexer(shard_size=50, processes=2).index(
        iter(docs))
    # shards of 30, 50 and 40 documents built apart, as on the nodes of a cluster
    nodes = [MultiVectorIndex(folder / f'node{i}', verbose=False).index(docs[start:stop]).path
             for i, (start, stop) in enumerate([(0, 30), (30, 80), (80, 120)])]
    assembled = ShardedMultiVectorIndex.from_shards(folder / 'assembled', nodes, verbose=False)
    return integer, whole, [three, parallel, assembled]


def test_shards_hold_the_corpus_in_order(indexes):
    _, whole, sharded = indexes
    three, parallel, assembled = sharded
    assert [len(shard) for shard in three.shards()] == [40, 40, 40]
    assert [len(shard) for shard in parallel.shards()] == [50, 50, 20]
    assert [len(shard) for shard in assembled.shards()] == [30, 50, 40]
    assert [shard.path.name for shard in assembled.shards()] == ['shard-000', 'shard-001', 'shard-002']
    meta, vectors, offsets, docnos = whole.payload()
    for index in sharded:
        sharded_meta, sharded_vectors, sharded_offsets, sharded_docnos = index.payload()
        assert len(index) == 120 and sharded_meta['vec_count'] == meta['vec_count']
        np.testing.assert_array_equal(sharded_offsets, offsets)
        np.testing.assert_array_equal(sharded_vectors[0:len(vectors)], vectors)
        rows = np.array([0, 5, len(vectors) - 1, 77, 3])
        np.testing.assert_array_equal(sharded_vectors[rows], vectors[rows])
        assert sharded_docnos.fwd[np.arange(120)].tolist() == docnos.fwd[np.arange(120)].tolist()
        assert sharded_docnos.inv[np.array(['d119', 'd0', 'nope', 'd45'])].tolist() == [119, 0, -1, 45]
        assert sharded_docnos.fwd[61] == 'd61' and sharded_docnos.inv['d61'] == 61


@pytest.mark.parametrize('aggregate', ['mean', 'sum'])
def test_maxsim_rankings_equal_one_index(indexes, aggregate):
    integer, whole, sharded = indexes
    queries = topics(integer)
    candidates = 10_000 if integer else 5  # integer vectors tie at FAISS's cut-off, which then picks any of them
    retrievers = [
        lambda index: index.maxsim_retriever(num_results=30, aggregate=aggregate),
        # blocks and tiles that straddle the shards
        lambda index: index.maxsim_retriever(num_results=200, aggregate=aggregate, block_vectors=70, tile_bytes=900),
        lambda index: index.ann_retriever(ann='flat', candidates=candidates, num_results=20,
                                             aggregate=aggregate),
        # IVF of float32 vectors probing every list: exhaustive, as flat (8-bit codes, the default, are trained on
        # each shard's own value ranges)
        lambda index: index.ann_retriever(ann='ivf', quantizer='Flat', search_effort=10_000,
                                             candidates=candidates, num_results=20, aggregate=aggregate),
    ]
    for make in retrievers:
        expected = make(whole)(queries)
        for index in sharded:
            pd.testing.assert_frame_equal(make(index)(queries), expected)


def test_multiquery_mean_and_scorer_equal_one_index(indexes):
    integer, whole, sharded = indexes
    queries = topics(integer)
    for index in sharded:
        for merge in ('round_robin', 'score_sum', 'rrf'):
            pd.testing.assert_frame_equal(index.multiquery_retriever(merge, num_results=15)(queries),
                                          whole.multiquery_retriever(merge, num_results=15)(queries))
        pd.testing.assert_frame_equal(index.mean_retriever(num_results=15)(queries),
                                      whole.mean_retriever(num_results=15)(queries))
        results = whole.maxsim_retriever(num_results=40)(queries).assign(score=0.)
        pd.testing.assert_frame_equal(index.scorer()(results), whole.scorer()(results))


def test_duplicate_docnos_across_shards_are_refused(tmp_path):
    docs = collection(30)
    docs[25]['docno'] = 'd3'
    for processes in (1, 2):
        with pytest.raises(ValueError, match="docno 'd3' occurs in shard-000 and shard-002; docnos must be unique"):
            ShardedMultiVectorIndex(tmp_path / 'index', verbose=False).indexer(
                shard_size=10, processes=processes).index(docs)
        assert list(tmp_path.iterdir()) == []


def test_a_bad_record_in_a_worker_process_is_named(tmp_path):
    docs = collection(30)
    docs[17]['doc_embs'] = np.ones((2, DIM + 1), dtype=np.float32)
    with pytest.raises(ValueError, match="document 'd17' has vectors of size 9, expected 8"):
        ShardedMultiVectorIndex(tmp_path / 'index', verbose=False).indexer(shard_size=10, processes=2).index(docs)
    # each shard alike within itself, the second unlike the first
    docs = docs[:10] + [dict(doc, doc_embs=np.ones((1, DIM + 1), dtype=np.float32)) for doc in docs[10:]]
    with pytest.raises(ValueError, match=r"the documents of shard-001 \(from 'd10' on\) have vectors of size 9, "
                                         "expected 8"):
        ShardedMultiVectorIndex(tmp_path / 'index', verbose=False).indexer(shard_size=10).index(docs)
    assert list(tmp_path.iterdir()) == []


def test_a_missing_or_rebuilt_shard_is_named(tmp_path):
    index = ShardedMultiVectorIndex(tmp_path / 'index', verbose=False).indexer(num_shards=3).index(collection(30))
    queries = topics(False)
    shutil.move(tmp_path / 'index' / 'shard-001', tmp_path / 'elsewhere')
    reopened = ShardedMultiVectorIndex(tmp_path / 'index', verbose=False)
    missing = f"shard 1 of the sharded index .* is missing: no folder '{tmp_path / 'index' / 'shard-001'}'"
    with pytest.raises(FileNotFoundError, match=missing):
        reopened.maxsim_retriever()(queries)
    with pytest.raises(FileNotFoundError, match=missing):
        index.maxsim_retriever()(queries)  # an open index checks its shards at every search
    MultiVectorIndex(tmp_path / 'index' / 'shard-001', verbose=False).index(collection(10))
    with pytest.raises(CorruptIndexError, match="shard-001' was rebuilt after the sharded index .* was built"):
        reopened.maxsim_retriever()(queries)


def test_indexer_arguments_and_target_are_checked(tmp_path):
    docs = collection(5)
    with pytest.raises(ValueError, match='num_shards=6 is more than the 5 documents'):
        ShardedMultiVectorIndex(tmp_path / 'a').indexer(num_shards=6).index(docs)
    with pytest.raises(ValueError, match='num_shards needs a corpus of known length'):
        ShardedMultiVectorIndex(tmp_path / 'a').indexer(num_shards=2).index(iter(docs))
    with pytest.raises(ValueError, match='give shard_size or num_shards, not both'):
        ShardedMultiVectorIndex(tmp_path / 'a').indexer(num_shards=2, shard_size=3)
    with pytest.raises(ValueError, match='processes must be a positive integer, got 0'):
        ShardedMultiVectorIndex(tmp_path / 'a').indexer(processes=0)
    with pytest.raises(ValueError, match='nothing to index'):
        ShardedMultiVectorIndex(tmp_path / 'a', verbose=False).index([])
    assert list(tmp_path.iterdir()) == []
    MultiVectorIndex(tmp_path / 'plain', verbose=False).index(docs)
    with pytest.raises(FileExistsError, match='multi_vector_index/mvi artifact, not a ShardedMultiVectorIndex'):
        ShardedMultiVectorIndex(tmp_path / 'plain', verbose=False).indexer(overwrite=True).index(docs)
    index = ShardedMultiVectorIndex(tmp_path / 'b', verbose=False).index(docs)  # default: one shard
    assert [shard.path.name for shard in index.shards()] == ['shard-000']
    with pytest.raises(FileExistsError, match='an index already exists'):
        index.index(docs)
    assert len(index.indexer(overwrite=True, shard_size=2).index(docs).shards()) == 3


def test_assembled_shards_are_copied_or_moved(tmp_path):
    docs = collection(30)
    nodes = [MultiVectorIndex(tmp_path / f'node{i}', verbose=False).index(docs[10 * i:10 * i + 10]).path
             for i in range(3)]
    (nodes[1] / '.ann.Flat.faiss.tmp-999999').write_bytes(b'left by a killed build')
    copied = ShardedMultiVectorIndex.from_shards(tmp_path / 'copied', [str(node) for node in nodes], verbose=False)
    assert sorted(p.name for p in (tmp_path / 'copied' / 'shard-001').iterdir()) == \
        sorted(p.name for p in nodes[1].iterdir() if not p.name.startswith('.'))
    assert all(MultiVectorIndex(node, verbose=False).built() for node in nodes)
    with pytest.raises(FileExistsError, match='an index already exists'):
        ShardedMultiVectorIndex.from_shards(tmp_path / 'copied', nodes, verbose=False)
    moved = ShardedMultiVectorIndex.from_shards(tmp_path / 'copied', nodes, move=True, overwrite=True, verbose=False)
    assert not any(node.exists() for node in nodes)
    assert sorted(p.name for p in tmp_path.iterdir()) == ['copied']
    queries = topics(False)
    whole = MultiVectorIndex(tmp_path / 'whole', verbose=False).index(docs)
    pd.testing.assert_frame_equal(moved.maxsim_retriever(num_results=20)(queries),
                                  whole.maxsim_retriever(num_results=20)(queries))
    pd.testing.assert_frame_equal(copied.maxsim_retriever(num_results=20)(queries),
                                  whole.maxsim_retriever(num_results=20)(queries))  # reloads the rebuilt folder


def test_assembly_refuses_shards_that_do_not_fit(tmp_path):
    docs = collection(30)
    nodes = [tmp_path / f'node{i}' for i in range(3)]
    for i, node in enumerate(nodes):
        MultiVectorIndex(node, verbose=False).index(docs[10 * i:10 * i + 10])

    def refused(error, match, shard_paths):
        with pytest.raises(error, match=match):
            ShardedMultiVectorIndex.from_shards(tmp_path / 'index', shard_paths, move=True, verbose=False)
        assert not (tmp_path / 'index').exists() and all(node.is_dir() for node in nodes)

    MultiVectorIndex(tmp_path / 'dup', verbose=False).index([docs[25]] + collection(40)[35:])
    refused(ValueError, f"docno 'd25' occurs in '{nodes[2]}' and '{tmp_path / 'dup'}'; docnos must be unique",
            nodes + [tmp_path / 'dup'])
    refused(ValueError, f"docno 'd0' occurs in '{nodes[0]}' and '{nodes[0]}'", [nodes[0], nodes[1], nodes[0]])
    MultiVectorIndex(tmp_path / 'wide', verbose=False).index(
        [{'docno': 'w1', 'doc_embs': np.ones((2, DIM + 1), dtype=np.float32)}])
    refused(ValueError, rf"the documents of '{tmp_path / 'wide'}' \(from 'w1' on\) have vectors of size 9, "
            "expected 8", nodes + [tmp_path / 'wide'])
    MultiVectorIndex(tmp_path / 'half', verbose=False).indexer(dtype='float16').index(collection(40)[30:])
    refused(ValueError, rf"the documents of '{tmp_path / 'half'}' \(from 'd30' on\) are stored as float16, "
            "expected float32", nodes + [tmp_path / 'half'])
    (tmp_path / 'empty').mkdir()
    refused(FileNotFoundError, f"no finished MultiVectorIndex at '{tmp_path / 'empty'}'",
            [nodes[0], tmp_path / 'empty'])
    refused(FileNotFoundError, f"no finished MultiVectorIndex at '{tmp_path / 'absent'}'", [tmp_path / 'absent'])
    ShardedMultiVectorIndex(tmp_path / 'sharded', verbose=False).indexer(shard_size=20).index(collection(40)[30:])
    refused(CorruptIndexError, 'sharded_mvi artifact, not a MultiVectorIndex', [nodes[0], tmp_path / 'sharded'])
    refused(ValueError, 'shard_paths is empty', [])
    refused(TypeError, 'shard_paths must be a list of shard folders', str(nodes[0]))


def test_loads_as_a_pyterrier_artifact_by_its_metadata(indexes):
    import tomllib
    _, _, (index, _, _) = indexes
    meta = json.loads((index.path / 'pt_meta.json').read_text())
    project = tomllib.loads((Path(__file__).resolve().parents[1] / 'pyproject.toml').read_text())['project']
    entry = project['entry-points']['pyterrier.artifact'][f'{meta["type"]}.{meta["format"]}']
    assert entry == 'pyterrier_multiquery.index:ShardedMultiVectorIndex'
