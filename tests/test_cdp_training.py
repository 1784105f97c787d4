import numpy as np
import pandas as pd
import pytest

from pyterrier_multiquery.cdp.training import synthetic_pairs, train_bi_encoder

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
    assert len(synthetic_pairs(documents)) == 6


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
    out = train_bi_encoder(pairs, tiny_sbert, tmp_path / 'trained', epochs=30, batch_size=3, learning_rate=1e-3)
    after = margin(SentenceTransformer(str(out), device='cpu'))
    assert after > before + 0.05, (before, after)
    assert not any(p.name.startswith('.trained') for p in tmp_path.iterdir())  # no temporary folder left
    import pyterrier as pt
    from pyterrier_dr import SBertBiEncoder
    loaded = pt.Artifact.load(str(out))  # through the bi_encoder.sentence_transformers entry point
    assert type(loaded) is SBertBiEncoder
    np.testing.assert_allclose(loaded.encode_queries(['q a b']),
                               SentenceTransformer(str(out), device='cpu').encode(['q a b']),
                               atol=1e-5)


def test_training_rejects_too_few_pairs(tiny_sbert, tmp_path):
    with pytest.raises(ValueError, match='at least two pairs'):
        train_bi_encoder(pd.DataFrame({'query': ['q'], 'text': ['t']}), tiny_sbert, tmp_path / 'x')
    assert not (tmp_path / 'x').exists()
