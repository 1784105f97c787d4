"""The index's CUDA path gives the CPU path's rankings (run where torch sees a GPU; skipped elsewhere)."""
import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip('torch')
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason='no GPU visible to torch')


@pytest.fixture(scope='module')
def index_and_topics(tmp_path_factory):
    from pyterrier_multiquery.experiment.clustered_collection import clustered_collection
    from pyterrier_multiquery.index import MultiVectorIndex
    stream, queries = clustered_collection(3000, dim=32, min_vectors=2, max_vectors=12, topics=100, query_count=30,
                                           query_vectors=5, seed=3)
    index = MultiVectorIndex(tmp_path_factory.mktemp('cuda') / 'index', verbose=False).indexer().index(stream)
    return index, pd.DataFrame({'qid': [f'q{i}' for i in range(len(queries))], 'query_embs': queries})


@pytest.mark.parametrize('search', ['retriever', 'ann_retriever'])
def test_cuda_ranks_as_the_cpu(index_and_topics, search):
    index, topics = index_and_topics
    cpu = getattr(index, search)(device='cpu', num_results=20)(topics)
    cuda = getattr(index, search)(device='cuda', num_results=20)(topics)
    assert list(cuda['docno']) == list(cpu['docno'])
    np.testing.assert_allclose(cuda['score'], cpu['score'], rtol=1e-5, atol=1e-5)


def test_exact_search_keeps_the_documents_grouped_on_the_gpu(index_and_topics):
    index, topics = index_and_topics
    index.retriever(device='cuda', num_results=5)(topics)
    groups = index.searchers().searchers[0]._resident[('groups', 'cuda')][1]
    assert groups.streamed_bytes == 0 and all(chunk.vectors.device.type == 'cuda' for chunk in groups.chunk_list)
    _, vectors, offsets, _ = index.payload()
    docids = np.concatenate([chunk.docids.cpu().numpy() for chunk in groups.chunk_list])
    assert sorted(docids.tolist()) == list(range(len(offsets) - 1))  # every document once
    for chunk in groups.chunk_list:  # its vectors in float16 (norms below FLOAT16_LIMIT), then copies of its last
        assert chunk.vectors.dtype == torch.float16
        docid, stored = int(chunk.docids[0]), chunk.vectors[0].float().cpu().numpy()
        own = torch.from_numpy(np.asarray(vectors[offsets[docid]:offsets[docid + 1]])).half().float().numpy()
        np.testing.assert_array_equal(stored[:len(own)], own)
        np.testing.assert_array_equal(stored[len(own):], np.repeat(own[-1:], len(stored) - len(own), axis=0))


def test_the_scorer_keeps_the_stored_vectors_resident(index_and_topics):
    index, topics = index_and_topics
    frame = index.retriever(device='cpu', num_results=5)(topics)[['qid', 'docno']].merge(topics, on='qid')
    index.scorer(device='cuda')(frame)
    resident = index.searchers().searchers[0]._resident['cuda'][1]
    assert resident.device.type == 'cuda'
    np.testing.assert_array_equal(resident.cpu().numpy(), np.asarray(index.payload()[1]))


def test_cuda_rescores_as_the_cpu(index_and_topics):
    index, topics = index_and_topics
    candidates = index.retriever(device='cpu', num_results=50)(topics)[['qid', 'docno']]
    frame = candidates.merge(topics, on='qid')
    cpu = index.scorer(device='cpu')(frame)
    cuda = index.scorer(device='cuda')(frame)
    assert list(cuda['docno']) == list(cpu['docno'])
    np.testing.assert_allclose(cuda['score'], cpu['score'], rtol=1e-5, atol=1e-5)


def faiss_gpus() -> int:
    faiss = pytest.importorskip('faiss')
    return faiss.get_num_gpus() if hasattr(faiss, 'get_num_gpus') else 0


@pytest.mark.skipif(not torch.cuda.is_available() or faiss_gpus() == 0, reason='FAISS built without GPU support')
def test_faiss_searches_on_the_gpu_and_ranks_as_the_cpu(index_and_topics):
    index, topics = index_and_topics
    setting = {'candidates': 64, 'search_effort': 8, 'num_results': 20}
    cpu = index.ann_retriever(device='cpu', **setting)(topics)
    cuda = index.ann_retriever(device='cuda', **setting)(topics)
    stages = index.searchers().searchers[0]._stages
    assert [type(stage.ann).__name__ for key, (_, stage) in stages.items() if key[-1] == 'cuda'] == \
        ['GpuIndexIVFScalarQuantizer']
    assert list(cuda['docno']) == list(cpu['docno'])
    np.testing.assert_allclose(cuda['score'], cpu['score'], rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available() or faiss_gpus() > 0, reason='FAISS searches this GPU itself')
def test_an_ivf_stage_that_faiss_cannot_search_on_the_gpu_is_searched_in_torch_there(index_and_topics):
    from pyterrier_multiquery.index.device_ivf import DeviceIVF
    index, topics = index_and_topics
    setting = {'ann': 'ivf', 'quantizer': 'Flat', 'candidates': 64, 'search_effort': 8, 'num_results': 20}
    cpu = index.ann_retriever(device='cpu', **setting)(topics)
    cuda = index.ann_retriever(device='cuda', **setting)(topics)
    stages = index.searchers().searchers[0]._stages
    stage = stages[('ivf', 'Flat', 'cuda')][1]
    assert isinstance(stage.ann, DeviceIVF) and stage.ann.members.device.type == 'cuda'
    # the same lists and members as FAISS's on the CPU, scored in float16: the candidates may differ at a tie
    # with the 64th, so the top 20 (re-scored exactly) are compared by overlap and by the scores they share
    shared = cpu.merge(cuda, on=['qid', 'docno'], suffixes=('_cpu', '_cuda'))
    assert len(shared) >= 0.98 * len(cpu)
    np.testing.assert_allclose(shared['score_cuda'], shared['score_cpu'], rtol=1e-5, atol=1e-5)


def test_an_hnsw_candidate_stage_stays_on_the_cpu_under_cuda(index_and_topics):
    index, topics = index_and_topics
    setting = {'ann': 'hnsw', 'candidates': 64, 'search_effort': 64, 'num_results': 20}
    cpu = index.ann_retriever(device='cpu', **setting)(topics)
    cuda = index.ann_retriever(device='cuda', **setting)(topics)
    assert list(cuda['docno']) == list(cpu['docno'])
