"""Random multi-vector collections clustered as real embeddings are, for tests and benchmarks of the index."""
from typing import Iterator, Tuple

import numpy as np


def clustered_collection(doc_count: int, dim: int = 128, min_vectors: int = 8, max_vectors: int = 8,
                         topics: int = 1000, query_count: int = 100, query_vectors: int = 8,
                         spread: float = 0.5, seed: int = 0) -> Tuple[Iterator[dict], np.ndarray]:
    """Documents whose vectors scatter around a few topic centres, and queries drawn near documents.

    Each document takes two topics and each of its vectors is a topic centre plus Gaussian noise of scale
    ``spread``, normalised; each query perturbs ``query_vectors`` vectors of a random document (so queries have
    true near neighbours, as real queries do). Documents are generated lazily.

    Returns:
        ``(documents, queries)``: an iterator of ``{'docno', 'doc_embs'}`` and a list of ``(Q, dim)`` arrays.
    """
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(topics, dim)).astype(np.float32)
    doc_topics = rng.integers(0, topics, size=(doc_count, 2))
    sizes = rng.integers(min_vectors, max_vectors + 1, size=doc_count)

    def document(i, generator):
        picks = doc_topics[i][generator.integers(0, 2, size=sizes[i])]
        embs = centres[picks] + spread * generator.normal(size=(sizes[i], dim)).astype(np.float32)
        return embs / np.linalg.norm(embs, axis=1, keepdims=True)

    def documents():
        generator = np.random.default_rng(seed + 1)
        for i in range(doc_count):
            yield {'docno': f'd{i}', 'doc_embs': document(i, generator)}

    query_rng = np.random.default_rng(seed + 2)
    queries = []
    for i in query_rng.integers(0, doc_count, size=query_count):
        picks = doc_topics[i][query_rng.integers(0, 2, size=query_vectors)]
        embs = centres[picks] + spread * query_rng.normal(size=(query_vectors, dim)).astype(np.float32)
        queries.append((embs / np.linalg.norm(embs, axis=1, keepdims=True)).astype(np.float32))
    return documents(), queries
