"""Sparse representations from vocabulary logits (log(1 + ReLU) max-pooled over positions, on content words),
and the pyterrier-pisa or Lucene index that searches them."""
from typing import Dict, Iterable, List

import numpy as np

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery._files import build_once


def sparse_weights(logits):
    """``max_positions log(1 + ReLU(logits))``: ``(..., K, V)`` logits to ``(..., V)`` weights (torch)."""
    with requires('dense'):
        import torch
    return torch.log1p(torch.relu(logits)).amax(dim=-2)


def content_token_ids(tokenizer, ids: List[int]) -> List[int]:
    """The distinct ids among ``ids`` that are content words: whole-word tokens (no ``##`` continuation, and for
    tokenizers marking word starts with ``Ġ``/``▁``, only those and the text's first token), alphabetic, longer than
    one character and not English stopwords (scikit-learn's list, as :func:`pyterrier_multiquery.cdp.content_words`).
    """
    with requires('dense'):
        from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS
    marks_starts = _marks_word_starts(tokenizer)
    keep = []
    for i, (tid, tok) in enumerate(zip(ids, tokenizer.convert_ids_to_tokens(list(ids)))):
        if tok is None or tok.startswith('##'):
            continue
        if marks_starts:
            if tok[:1] in ('Ġ', '▁'):
                tok = tok[1:]
            elif i > 0:
                continue
        word = tok.lower()
        if len(word) > 1 and word.isalpha() and word not in ENGLISH_STOP_WORDS and tid not in keep:
            keep.append(tid)
    return keep


def to_toks(tokenizer, weights: np.ndarray, allowed: List[int]) -> Dict[str, float]:
    """The positive weights of the ``allowed`` token ids as a ``{word: weight}`` dict (pyterrier_pisa's ``toks``);
    ids that spell the same word (``Paris``, ``Ġparis``) keep the largest weight, as the pooling over positions does."""
    toks = {}
    for t, token in zip(allowed, tokenizer.convert_ids_to_tokens(list(allowed))):
        if weights[t] > 0:
            word = _word(token)
            toks[word] = max(toks.get(word, 0.), float(weights[t]))
    return toks


def _word(token: str) -> str:
    return token.lstrip('Ġ▁').lower()


def _marks_word_starts(tokenizer) -> bool:
    tokens = tokenizer.convert_ids_to_tokens(tokenizer(' retrieval of words', add_special_tokens=False)['input_ids'])
    return any(t.startswith(('Ġ', '▁')) for t in tokens)


def sparse_index(path, encoded_docs: Iterable[dict], *, overwrite: bool = False):
    """A pyterrier-pisa index (no stemming) of the ``toks`` weights of documents that went through a doc encoder,
    built at ``path``, or the one there where it was built from the same records.

    Raises:
        StaleBuildError: If ``path`` holds an index of other records and ``overwrite`` is False.
    """
    with requires('pisa'):
        from pyterrier_pisa import PisaIndex
    build_once(path, lambda tmp, docs: PisaIndex(tmp, stemmer='none').toks_indexer().index(docs),
               lambda: encoded_docs, settings={'engine': 'pisa'}, overwrite=overwrite)
    return PisaIndex(str(path), stemmer='none')


def lucene_sparse_index(path, encoded_docs: Iterable[dict], *, overwrite: bool = False):
    """A Lucene impact index (pyserini, Java 21+) of the ``toks`` weights, quantised as :func:`sparse_index`'s
    (``int(100 w)``); its ``impact()`` retriever scores ``query_toks`` as PISA's ``quantized()`` does. Built, or
    reused, as :func:`sparse_index`."""
    from pyterrier_multiquery.lucene import LuceneIndex
    build_once(path, lambda tmp, docs: LuceneIndex(tmp).toks_indexer().index(docs), lambda: encoded_docs,
               settings={'engine': 'lucene'}, overwrite=overwrite)
    return LuceneIndex(path)
