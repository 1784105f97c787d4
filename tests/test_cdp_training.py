import numpy as np
import pandas as pd
import pytest

from pyterrier_multiquery.cdp.training import synthetic_pairs
from pyterrier_multiquery.training.bi_encoder import BiEncoderTrainer
from pyterrier_multiquery.training.contrastive import hard_negative_triples

WORDS = ['moon', 'apollo', 'landing', 'armstrong', 'einstein', 'gravity', 'relativity', 'theory', 'curie', 'radium',
         'nobel', 'prize', 'who', 'what', 'when', 'why']


@pytest.fixture(scope='module')
def tiny_sbert(tmp_path_factory):
    """A randomly initialised 2-layer BERT with a word-level tokenizer and mean pooling, saved as a checkpoint."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast
    import torch
    path = tmp_path_factory.mktemp('tiny') / 'bert'
    vocab = {w: i for i, w in enumerate(['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'] + WORDS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token='[UNK]'))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token='[PAD]', unk_token='[UNK]',
                                   cls_token='[CLS]', sep_token='[SEP]', mask_token='[MASK]')
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=64)).save_pretrained(path / 'hf')
    fast.save_pretrained(path / 'hf')
    transformer = Transformer(str(path / 'hf'), max_seq_length=32)
    SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), 'mean')]).save(str(path))
    return path


@pytest.fixture
def documents():
    return pd.DataFrame({'docno': ['d1', 'd2', 'd3'],
                         'text': ['armstrong apollo moon landing', 'einstein relativity gravity theory',
                                  'curie radium nobel prize'],
                         'querygen': [['who moon', 'when landing', 'what apollo'], ['who relativity', 'what theory'],
                                      ['why nobel']]})


def test_synthetic_pairs_take_the_first_m_queries(documents):
    pairs = synthetic_pairs(documents, num_queries=2)
    assert pairs['query'].tolist() == ['who moon', 'when landing', 'who relativity', 'what theory', 'why nobel']
    assert pairs['docno'].tolist() == ['d1', 'd1', 'd2', 'd2', 'd3']
    assert pairs['qid'].tolist() == ['d1#0', 'd1#1', 'd2#0', 'd2#1', 'd3#0']
    assert len(synthetic_pairs(documents)) == 6
    with pytest.raises(TypeError, match=r"querygen of docno 'd2' must be a list of query strings, got 'what'"):
        synthetic_pairs(documents.assign(querygen=[['who'], 'what', []]))  # not the pairs w, h, a, t


def test_hard_negative_triples_take_the_first_stages_top_passages_that_are_not_relevant():
    results = pd.DataFrame({'qid': ['q1'] * 4 + ['q2'] * 2, 'query': ['a'] * 4 + ['b'] * 2,
                            'docno': ['d3', 'd1', 'd4', 'd2', 'd1', 'd2'], 'rank': [0, 1, 2, 3, 0, 1]})
    qrels = pd.DataFrame({'qid': ['q1', 'q1', 'q2', 'q2', 'q3'], 'docno': ['d1', 'd2', 'd1', 'd2', 'd1'],
                          'label': [1, 1, 1, 1, 1]})
    texts = {f'd{i}': f'text {i}' for i in range(1, 5)}
    triples = hard_negative_triples(results, qrels, texts, hard_negatives=2)
    # q1: both relevant passages with its top two others (d3, d4); q2's top holds no other passage; q3 has no results
    assert triples[['qid', 'docno']].values.tolist() == [['q1', 'd1']] * 2 + [['q1', 'd2']] * 2
    assert triples['negative'].tolist() == ['text 3', 'text 4'] * 2 and triples['text'].tolist()[0] == 'text 1'
    alone = hard_negative_triples(results[['qid', 'query']].drop_duplicates(), qrels, texts, hard_negatives=0)
    assert alone['docno'].tolist() == ['d1', 'd2', 'd1', 'd2'] and 'negative' not in alone
    with pytest.raises(ValueError, match="first stage's results"):
        hard_negative_triples(results[['qid', 'query']], qrels, texts)
    with pytest.raises(KeyError, match="no text for docno 'd2'"):
        hard_negative_triples(results, qrels, {'d1': 'x', 'd3': 'y', 'd4': 'z'})


def test_training_pulls_queries_to_their_documents_and_saves(tiny_sbert, documents, tmp_path, declared_entry_points):
    from sentence_transformers import SentenceTransformer
    pairs = synthetic_pairs(documents)

    def margin(model):
        q = model.encode(list(pairs['query']), normalize_embeddings=True)
        d = model.encode(list(documents['text']), normalize_embeddings=True)
        sims = q @ d.T
        gold = documents['docno'].tolist()
        own = sims[np.arange(len(pairs)), [gold.index(x) for x in pairs['docno']]]
        return float(np.mean(own - sims.mean(axis=1)))

    before = margin(SentenceTransformer(str(tiny_sbert), device='cpu'))
    trainer = BiEncoderTrainer(tiny_sbert, dict(zip(documents['docno'], documents['text'])), hard_negatives=0,
                               epochs=30, batch_size=3, learning_rate=1e-3, verbose=False)
    history = trainer.fit(pairs, pairs.assign(label=1))
    out = trainer.save(tmp_path / 'trained')
    after = margin(SentenceTransformer(str(out), device='cpu'))
    assert after > before + 0.05, (before, after)
    assert len(history.curve) == 31 and len(history.losses) >= 60   # 6 pairs, 3 documents: 2 batches an epoch
    assert history.curve[-1]['loss'] < history.curve[1]['loss']
    assert not any(p.name.startswith('.trained') for p in tmp_path.iterdir())  # no temporary folder left
    import json

    import pyterrier as pt
    from pyterrier_dr import SBertBiEncoder
    loaded = pt.Artifact.load(str(out))  # through the bi_encoder.sentence_transformers entry point
    assert type(loaded) is SBertBiEncoder
    np.testing.assert_allclose(loaded.encode_queries(['q a b']),
                               SentenceTransformer(str(out), device='cpu').encode(['q a b']),
                               atol=1e-5)
    record = json.loads((out / 'training.json').read_text())
    assert record['trainer'] == 'BiEncoderTrainer' and record['history'] == history.to_dict()


def test_batches_never_hold_one_passage_twice(tiny_sbert, documents):
    pairs = synthetic_pairs(documents)
    trainer = BiEncoderTrainer(tiny_sbert, {}, hard_negatives=0, batch_size=3, verbose=False)
    batches = trainer.batches(pairs)
    assert sorted(np.concatenate(batches).tolist()) == list(range(6))
    assert all(pairs['docno'].iloc[b].is_unique for b in batches) and max(len(b) for b in batches) == 3


def test_batches_hold_no_passage_as_positive_and_negative_nor_one_question_twice(tiny_sbert):
    # q1's passage A is q2's hard negative; q3 has two relevant passages, each the other's false negative together
    triples = pd.DataFrame({'qid': ['q1', 'q2', 'q3', 'q3'], 'query': ['a', 'b', 'c', 'c'],
                            'docno': ['A', 'B', 'C', 'D'], 'text': ['text A', 'text B', 'text C', 'text D'],
                            'negative': ['text E', 'text A', 'text F', 'text G']})
    trainer = BiEncoderTrainer(tiny_sbert, {}, batch_size=4, verbose=False)
    for _ in range(20):   # whatever the order drawn
        batches = trainer.batches(triples)
        assert sorted(np.concatenate(batches).tolist()) == [0, 1, 2, 3]
        for rows in batches:
            batch = triples.iloc[rows]
            assert batch['qid'].is_unique and pd.concat([batch['text'], batch['negative']]).is_unique
        assert len(batches) == 2   # {q1, q3}, {q2, q3} or the like: two rows of four wait once


def test_validation_scores_each_question_by_its_positive_against_its_negative(tiny_sbert):
    texts = {'d1': 'moon apollo', 'd2': 'einstein theory', 'd3': 'curie radium'}
    trainer = BiEncoderTrainer(tiny_sbert, texts, verbose=False)
    results = pd.DataFrame({'qid': ['q1', 'q1', 'q1'], 'query': 'moon apollo', 'docno': ['d2', 'd1', 'd3'],
                            'rank': [0, 1, 2]})
    qrels = pd.DataFrame({'qid': ['q1'], 'docno': ['d1'], 'label': [1]})
    scores = trainer.dev_scores(trainer.dev_examples(results, qrels))
    assert scores.to_dict() == {'q1': 1.}   # the query's own text scores 1 against its passage, less against d2


def test_training_rejects_too_few_pairs(tiny_sbert, tmp_path):
    trainer = BiEncoderTrainer(tiny_sbert, {'t': 't'}, hard_negatives=0, verbose=False)
    with pytest.raises(ValueError, match='at least two'):
        trainer.fit(pd.DataFrame({'qid': ['q'], 'query': ['q']}), pd.DataFrame({'qid': ['q'], 'docno': ['t'],
                                                                              'label': [1]}))
