"""PyTerrier transformers over a :class:`TextGenerator`: document-side query generation and query expansion."""
import re
from typing import Iterable, List

import numpy as np
import pandas as pd
import pyterrier as pt

from pyterrier_multiquery._transformer import DerivedIdentity
from pyterrier_multiquery.generation.base import TextGenerator
from pyterrier_multiquery.generation.parsing import parse_queries

#: The AMER paper's keyword query-expansion instruction (Appendix A.7, as released with the authors' code);
#: ``[Question]`` is replaced by the query.
AMER_KEYWORD_PROMPT = (
    'Write a list of keywords for the given question. The goal is to help retrieving relevant documents to the '
    'question, which contains multiple answers, so generate keywords as diverse as possible. Do not generate similar '
    'keywords; they should be distinct. Just answer with the list, and do not generate anything else. Keywords are '
    'separated by commas.  \n\nQuestion:\n[Question]'
)

#: Query-generation prompts with ``{text}`` and ``{num_queries}`` placeholders. These are written for this
#: project from the papers' descriptions (QAEncoder: questions covering who/what/when/where/why/how; CDP: M
#: queries in one call, either as different as possible or rewordings of one information need); the papers'
#: verbatim prompt texts were not available here. The passage comes first and the answer is asked for as a
#: numbered list: SmolLM2-135M-Instruct followed that form far more often than one-query-per-line instructions.
QUERY_PROMPTS = {
    '5w1h': ('Passage:\n{text}\n\nWrite {num_queries} different questions that this passage answers, asking who, '
             'what, when, where, why or how. Answer with a numbered list of {num_queries} questions and nothing else.'),
    'diverse': ('Passage:\n{text}\n\nWrite {num_queries} search queries that this passage answers. Each query must '
                'ask about a different part of the passage, in different words. Answer with a numbered list of '
                '{num_queries} queries and nothing else.'),
    'paraphrase': ('Passage:\n{text}\n\nWrite {num_queries} questions that this passage answers. All '
                   '{num_queries} questions must ask the same thing, worded differently. Answer with a numbered list '
                   'of {num_queries} questions and nothing else.'),
}


class QueryGenerator(DerivedIdentity, pt.Transformer):
    """Writes ``querygen``, a list of queries generated for each document's ``text`` (in the manner of
    pyterrier_doc2query), all ``num_queries`` of them asked for in one call."""
    schematic = {'label': 'QueryGenerator'}

    def __init__(self, generator: TextGenerator, prompt: str = '5w1h', *, num_queries: int = 5,
                 text_field: str = 'text', max_text_chars: int = 4000):
        """
        Args:
            generator: The text generator (wrap it in ``.cached(path)`` to generate each document once).
            prompt: A key of :data:`QUERY_PROMPTS` or a template with ``{text}`` and ``{num_queries}``.
            num_queries: Queries asked for (and kept at most) per document.
            text_field: The document column read.
            max_text_chars: Documents are cut to this many characters in the prompt.
        """
        template = QUERY_PROMPTS.get(prompt, prompt)
        if '{text}' not in template:
            raise ValueError(f'prompt must be one of {sorted(QUERY_PROMPTS)} or a template with {{text}}, '
                             f'got {prompt!r}')
        if num_queries < 1:
            raise ValueError(f'num_queries must be at least 1, got {num_queries}')
        try:
            template.format(text='', num_queries=num_queries)
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f'the prompt template has a placeholder other than {{text}} and {{num_queries}} ({e!r}): '
                             'write literal braces as {{ and }}') from None
        self.generator = generator
        self.prompt = prompt
        self.template = template
        self.num_queries = num_queries
        self.text_field = text_field
        self.max_text_chars = max_text_chars

    def prompts(self, texts: List[str]) -> List[str]:
        """The prompts sent for these document texts."""
        return [self.template.format(text=text[:self.max_text_chars], num_queries=self.num_queries) for text in texts]

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        pt.validate.columns(inp, includes=[self.text_field])
        missing = ~inp[self.text_field].map(lambda text: isinstance(text, str))
        if missing.any():
            row = inp[missing].iloc[0]
            raise ValueError(f'{self.text_field!r} is missing or not a string for docno {row.get("docno")!r} '
                             f'({int(missing.sum())} rows)')
        out = inp.copy()
        answers = self.generator.generate(self.prompts(list(inp[self.text_field])))
        out['querygen'] = pd.Series([parse_queries(a, limit=self.num_queries) for a in answers], index=inp.index,
                                    dtype=object)
        return out


class KeywordExpansion(DerivedIdentity, pt.Transformer):
    """LLM keyword query expansion (the AMER paper's baseline): keywords generated for the query are appended
    to it; the original query moves to ``query_0`` (:func:`pyterrier.model.push_queries`)."""
    schematic = {'label': 'KeywordExpansion'}

    def __init__(self, generator: TextGenerator, prompt: str = AMER_KEYWORD_PROMPT, *, max_keywords: int = 20):
        """
        Args:
            generator: The text generator.
            prompt: The instruction, with ``[Question]`` where the query goes.
            max_keywords: Most keywords appended.
        """
        if '[Question]' not in prompt:
            raise ValueError('the keyword prompt needs a [Question] placeholder')
        if max_keywords < 1:
            raise ValueError(f'max_keywords must be at least 1, got {max_keywords}')
        self.generator = generator
        self.prompt = prompt
        self.max_keywords = max_keywords

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        pt.validate.query_frame(inp, extra_columns=['query'])
        answers = self.generator.generate([self.prompt.replace('[Question]', q) for q in inp['query']])
        out = pt.model.push_queries(inp)
        out['query'] = [query if not kws else f'{query} {" ".join(kws)}'
                        for query, kws in zip(inp['query'], map(self.keywords, answers))]
        return out

    def keywords(self, answer: str) -> List[str]:
        """The distinct keywords of a generated answer (comma- or line-separated; list markers dropped)."""
        items = [k for line in parse_queries(answer) for k in re.split(r'[,;]', line)]
        return parse_queries('\n'.join(items), limit=self.max_keywords)


def query_lists(docnos: Iterable[str], querygen: Iterable) -> List[List[str]]:
    """Each document's generated queries as a list of strings.

    Raises:
        TypeError: Naming the document, if its ``querygen`` is a string (which would be split into characters)
            or anything else than a sequence of strings.
    """
    lists = []
    for docno, queries in zip(docnos, querygen):
        if isinstance(queries, (str, bytes)) or not isinstance(queries, (list, tuple, np.ndarray, pd.Series)) or \
                not all(isinstance(q, str) for q in queries):
            raise TypeError(f'querygen of docno {docno!r} must be a list of query strings, got {queries!r}; '
                            'wrap a single query as [query]')
        lists.append(list(queries))
    return lists
