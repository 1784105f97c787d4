"""The search methods of the indexes, declared once: each shows its transformer's arguments and builds it."""
import inspect
import pydoc

import pytest

from pyterrier_multiquery.index import MultiVectorIndex, ShardedMultiVectorIndex
from pyterrier_multiquery.index.distributed import RayIndex
from pyterrier_multiquery.index.ann_retriever import ApproxMaxSimRetriever
from pyterrier_multiquery.index.maxsim import MaxSimRetriever, MaxSimScorer
from pyterrier_multiquery.index.mean import MeanRetriever
from pyterrier_multiquery.index.multiquery import MultiQueryRetriever

METHODS = {'retriever': MaxSimRetriever, 'maxsim_retriever': MaxSimRetriever, 'ann_retriever': ApproxMaxSimRetriever,
           'scorer': MaxSimScorer, 'mean_retriever': MeanRetriever, 'multiquery_retriever': MultiQueryRetriever}


@pytest.mark.parametrize('index_class', [MultiVectorIndex, ShardedMultiVectorIndex, RayIndex])
@pytest.mark.parametrize('name', list(METHODS))
def test_every_search_method_lists_its_arguments(index_class, name):
    method, cls = getattr(index_class, name), METHODS[name]
    parameters = inspect.signature(method).parameters
    expected = [p for p in inspect.signature(cls.__init__).parameters if p not in ('self', 'index')]
    assert [p for p in parameters if p != 'self'] == expected
    text = pydoc.render_doc(method)
    for argument in expected:
        if argument != 'maxsim_args':
            assert f'{argument}:' in text, f'{index_class.__name__}.{name} does not describe {argument}'
    assert '    index:' not in text  # the index is the object the method is called on


def test_search_methods_build_their_transformer(tmp_path):
    import numpy as np
    index = MultiVectorIndex(tmp_path / 'index', verbose=False)
    index.index([{'docno': 'd', 'doc_embs': np.ones((1, 2), dtype=np.float32)}])
    assert index.retriever(num_results=5) == MaxSimRetriever(index, num_results=5)
    assert index.ann_retriever(ann='flat') == ApproxMaxSimRetriever(index, ann='flat')
    assert index.maxsim_retriever(num_results=5) == index.retriever(num_results=5)
    with pytest.raises(TypeError, match="unexpected keyword argument 'exact'"):
        index.retriever(exact=False)
    with pytest.raises(TypeError, match="unexpected keyword argument 'block_vectors'"):
        index.ann_retriever(block_vectors=10)
    assert index.multiquery_retriever('rrf', num_results=3) == MultiQueryRetriever(index, merge='rrf', num_results=3)
    with pytest.raises(TypeError, match=r"scorer\(\) takes at most 0 positional arguments \(none\), got 1"):
        index.scorer('mean')
    with pytest.raises(TypeError, match='unexpected keyword argument'):
        index.mean_retriever(candidates=10)
