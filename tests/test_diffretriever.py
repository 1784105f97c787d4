"""DiffRetriever on tiny random models: prompt layout, representations, scoring, fusion, training, budgets."""
import numpy as np
import pandas as pd
import pyterrier as pt
import pytest

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

from pyterrier_multiquery._files import StaleBuildError  # noqa: E402
from pyterrier_multiquery.diffretriever import (DiffEmbed, DiffRetriever, HybridRetriever, PromptReps,  # noqa: E402
                                                budget_grid, oracle_budgets, oracle_correlations,
                                                retrieval_pipelines, select_budget)
from pyterrier_multiquery.diffretriever.encoder import MaskedBackbone  # noqa: E402
from pyterrier_multiquery.diffretriever.prompts import prompt_ids  # noqa: E402
from pyterrier_multiquery.diffretriever.sparse import content_token_ids, sparse_weights, to_toks  # noqa: E402
from pyterrier_multiquery.experiment.systems import diffretriever_system  # noqa: E402
from pyterrier_multiquery.diffretriever.training import DiffRetrieverTrainer, contrastive_loss, dense_scores  # noqa: E402

WORDS = ['query', 'passage', 'use', 'one', 'word', 'words', 'to', 'represent', 'the', 'in', 'a', 'few', 'retrieval',
         'task', 'make', 'sure', 'your', 'is', 'are', 'lowercase', 'cats', 'dogs', 'heart', 'disease', 'protein',
         'of', 'and', 'user', 'assistant', '##s', '.', ',', ':', '"']
SPECIAL = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', '<|im_start|>', '<|im_end|>']
CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope='module')
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp('vocab') / 'vocab.txt'
    path.write_text('\n'.join(SPECIAL + WORDS) + '\n')
    tok = transformers.BertTokenizerFast(str(path), do_lower_case=True)
    tok.add_special_tokens({'additional_special_tokens': ['<|im_start|>', '<|im_end|>']})
    return tok


def tiny_bert(tokenizer, seed=0):
    torch.manual_seed(seed)
    config = transformers.BertConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=32, max_position_embeddings=128,
                                     hidden_dropout_prob=0., attention_probs_dropout_prob=0.)
    return transformers.BertForMaskedLM(config)


@pytest.fixture
def encoder(tokenizer):
    return DiffRetriever(MaskedBackbone(tiny_bert(tokenizer), tokenizer, 'lm'), k_query=2, k_doc=3, device='cpu')


def ids_of(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)['input_ids']


def test_mask_positions_plain_layout(encoder, tokenizer):
    input_ids, _, positions, _, _ = encoder.batch(['cats'], 2, 'query')
    ids = input_ids[0].tolist()
    pos = positions[0].tolist()
    assert [ids[p] for p in pos] == [tokenizer.mask_token_id] * 2
    prefix = ids_of(tokenizer, 'The words are: "')
    assert ids[pos[0] - len(prefix):pos[0]] == prefix
    assert ids[pos[-1] + 1:] == ids_of(tokenizer, '"') + [tokenizer.sep_token_id]
    assert ids[0] == tokenizer.cls_token_id and ids.count(tokenizer.mask_token_id) == 2


def test_mask_positions_chat_layout(tokenizer):
    tok = tokenizer
    tok.chat_template, tok.eos_token = CHAT, '[SEP]'
    try:
        enc = DiffRetriever(MaskedBackbone(tiny_bert(tok), tok, 'lm'), k_query=1, k_doc=1, device='cpu')
        input_ids, _, positions, _, _ = enc.batch(['heart disease'], 1, 'doc')
        ids, (pos,) = input_ids[0].tolist(), positions[0].tolist()
        assert ids[pos] == tok.mask_token_id
        im_end, im_start = tok.convert_tokens_to_ids(['<|im_end|>', '<|im_start|>'])
        assert ids[pos + 1:] == ids_of(tok, '"') + [im_end, tok.sep_token_id]
        assistant = [im_start] + ids_of(tok, 'assistant') + ids_of(tok, 'The word is: "')
        assert ids[pos - len(assistant):pos] == assistant
        assert ids[:2] == [im_start, tok.convert_tokens_to_ids('user')]
    finally:
        tok.chat_template, tok.eos_token = None, None


def test_promptreps_prompt_and_steps(tokenizer):
    torch.manual_seed(0)
    config = transformers.Qwen2Config(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, intermediate_size=32)
    model = transformers.Qwen2ForCausalLM(config)
    reps = PromptReps(model, tokenizer, n_query=3, n_doc=2, device='cpu')
    assert repr(reps) == 'PromptReps(Qwen2ForCausalLM, n_query=3, n_doc=2, max_length=256)'
    prompt = prompt_ids(tokenizer, ids_of(tokenizer, 'cats'), 3, 'query')
    assert prompt[-len(ids_of(tokenizer, 'The words are: "')):] == ids_of(tokenizer, 'The words are: "')
    out = reps.query_encoder()(pd.DataFrame({'qid': ['1'], 'query': ['cats and dogs']}))
    embs = out['query_embs'][0]
    assert embs.shape == (3, 16)
    np.testing.assert_allclose(np.linalg.norm(embs, axis=1), 1., rtol=1e-5)
    # the first generated step reads the prompt's last position: same as a plain forward pass
    with torch.no_grad():
        full = model(torch.tensor([prompt_ids(tokenizer, ids_of(tokenizer, 'cats and dogs'), 3, 'query')]),
                     output_hidden_states=True)
    first = torch.nn.functional.normalize(full.hidden_states[-1][0, -1], dim=-1).numpy()
    np.testing.assert_allclose(embs[0], first, atol=1e-5)
    assert set(out['query_toks'][0]) <= {'cats', 'dogs'}


def test_k1_maxsim_equals_dot_product(encoder, tmp_path):
    from pyterrier_multiquery.index import MultiVectorIndex
    enc = encoder.with_k(1, 1)
    docs = enc.doc_encoder()(pd.DataFrame({'docno': ['a', 'b', 'c'], 'text': ['cats', 'heart disease', 'protein']}))
    index = MultiVectorIndex(tmp_path / 'x.mvi', verbose=False)
    index.indexer().index(docs[['docno', 'doc_embs']].to_dict(orient='records'))
    queries = enc.query_encoder()(pd.DataFrame({'qid': ['q'], 'query': ['dogs']}))
    res = index.maxsim_retriever()(queries).set_index('docno')['score']
    q = queries['query_embs'][0][0]
    for docno, embs in zip(docs['docno'], docs['doc_embs']):
        assert embs.shape == (1, 16)
        assert res[docno] == pytest.approx(float(q @ embs[0]), abs=1e-5)


def test_max_then_log1p_equals_log1p_then_max():
    logits = torch.tensor([[[-1., 2., 0.5], [3., -2., 0.1]]])
    expected = torch.log1p(torch.relu(logits.amax(dim=1)))
    torch.testing.assert_close(sparse_weights(logits), expected)
    expected = torch.tensor([[np.log(4.), np.log(3.), np.log(1.5)]], dtype=torch.float32)
    torch.testing.assert_close(sparse_weights(logits), expected)


def test_content_word_filter(tokenizer):
    ids = ids_of(tokenizer, 'The cats of the heart, cats') + tokenizer.convert_tokens_to_ids(['##s', 'a'])
    assert tokenizer.convert_ids_to_tokens(content_token_ids(tokenizer, ids)) == ['cats', 'heart']


def test_token_ids_spelling_one_word_keep_its_largest_weight():
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {token: i for i, token in enumerate(['<unk>', 'Paris', 'Ġis', 'Ġparis', 'Ġheart', 'Ġretrieval', 'Ġof',
                                                 'Ġwords'])}
    words = Tokenizer(models.WordLevel(vocab, unk_token='<unk>'))
    words.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=words, unk_token='<unk>')
    allowed = content_token_ids(tok, ids_of(tok, 'Paris is paris heart'))
    assert allowed == [1, 3, 4]
    for first, second in ((2., .5), (.5, 2.)):
        weights = np.array([0., first, 7., second, 0., 0., 0., 0.])
        assert to_toks(tok, weights, allowed) == {'paris': 2.}  # neither the last id's weight nor a sum


def test_sparse_output_restricted_to_input_content_words(encoder):
    out = encoder.query_encoder()(pd.DataFrame({'qid': ['1'], 'query': ['the cats of heart disease.']}))
    assert set(out['query_toks'][0]) <= {'cats', 'heart', 'disease'}
    assert out['query_embs'][0].shape == (2, 16)


def test_encoder_errors_and_empty(encoder):
    with pytest.raises(ValueError, match='k_query must be at least 1'):
        DiffRetriever(encoder.backbone, k_query=0)
    with pytest.raises(ValueError, match='k_doc must be at least 1, got 0'):  # 0 is not "the default"
        encoder.with_k(k_doc=0)
    with pytest.raises(pt.validate.InputValidationError, match=r"\['query'\]"):
        encoder.query_encoder()(pd.DataFrame({'qid': ['1']}))
    empty = encoder.doc_encoder()(pd.DataFrame({'docno': [], 'text': []}))
    assert list(empty.columns) == ['docno', 'text', 'doc_embs', 'toks'] and len(empty) == 0


DOCS = pd.DataFrame({'docno': ['a', 'b', 'c', 'd'],
                     'text': ['cats', 'heart disease of the protein', 'dogs and cats', 'the user']})


@pytest.mark.parametrize('cls', [DiffRetriever, DiffEmbed])
def test_batch_size_does_not_change_the_representations(encoder, cls):
    one = cls(encoder.backbone, batch_size=1, device='cpu').doc_encoder()(DOCS)
    three = cls(encoder.backbone, batch_size=3, device='cpu').doc_encoder()(DOCS)
    for x, y in zip(one['doc_embs'], three['doc_embs']):
        np.testing.assert_allclose(x, y, atol=1e-6)
    if cls is DiffRetriever:
        assert [t.keys() for t in one['toks']] == [t.keys() for t in three['toks']]


def test_diffembed_is_one_mean_pooled_vector_and_dense_only(encoder, tokenizer):
    embed = DiffEmbed(encoder.backbone, device='cpu')
    out = embed.query_encoder()(pd.DataFrame({'qid': ['1'], 'query': ['heart disease']}))
    assert list(out.columns) == ['qid', 'query', 'query_embs']
    ids = torch.tensor([tokenizer('heart disease')['input_ids']])
    with torch.no_grad():
        hidden = encoder.backbone.model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0]
    expected = torch.nn.functional.normalize(hidden.mean(0), dim=-1).numpy()
    np.testing.assert_allclose(out['query_embs'][0], expected[None], atol=1e-6)


def test_reprs_and_equality(encoder):
    assert repr(encoder) == ("DiffRetriever(BertForMaskedLM, k_query=2, k_doc=3, steps=1, max_length=256, "
                             "vectors='masks')")
    assert repr(encoder.doc_encoder()) == f'{encoder!r}.doc_encoder()'
    assert encoder.with_k() == encoder and encoder.with_k(k_doc=1) != encoder
    assert encoder.with_k().query_encoder() == encoder.query_encoder()
    assert repr(DiffEmbed(encoder.backbone, device='cpu')) == 'DiffEmbed(BertForMaskedLM, max_length=256)'


def test_iterative_unmasking_matches_manual(encoder, tokenizer):
    enc = DiffRetriever(encoder.backbone, k_query=2, k_doc=2, steps=2, device='cpu')
    input_ids, attention, positions, _, _ = enc.batch(['cats and dogs'], 2, 'query')
    with torch.no_grad():
        hidden, logits = enc.represent(input_ids, attention, positions)
        first = encoder.backbone.model(input_ids=input_ids, attention_mask=attention).logits[0, positions[0]]
        conf, tok = first.softmax(-1).max(-1)
        chosen = int(conf.argmax())
        manual = input_ids.clone()
        manual[0, positions[0, chosen]] = tok[chosen]
        out = encoder.backbone.model(input_ids=manual, attention_mask=attention, output_hidden_states=True)
    torch.testing.assert_close(logits[0], out.logits[0, positions[0]])
    torch.testing.assert_close(hidden[0], out.hidden_states[-1][0, positions[0]])


def test_tied_head_for_encoder_only_checkpoint(tokenizer, tmp_path):
    bert = tiny_bert(tokenizer).bert
    bert.config.architectures = ['BertModel']
    bert.save_pretrained(tmp_path / 'enc')
    tokenizer.save_pretrained(tmp_path / 'enc')
    enc = DiffRetriever.from_pretrained(str(tmp_path / 'enc'), k_query=1, k_doc=1, device='cpu')
    assert enc.backbone.head == 'tied'
    assert enc.vectors == 'tokens'  # untrained mask positions are not read zero-shot by default
    assert DiffRetriever.from_pretrained(str(tmp_path / 'enc'), vectors='masks', device='cpu').vectors == 'masks'
    with pytest.raises(ValueError, match='k_query must be at least 1, got 0'):
        DiffRetriever.from_pretrained(str(tmp_path / 'enc'), k_query=0, device='cpu')
    ids = torch.tensor([ids_of(tokenizer, 'cats')])
    hidden, logits = enc.backbone.forward(ids, torch.ones_like(ids))
    torch.testing.assert_close(logits, hidden @ enc.backbone.model.embeddings.word_embeddings.weight.T)


@pytest.mark.parametrize('head', ['tied', 'lm'])
def test_reading_at_positions_equals_every_position_gathered(tokenizer, tmp_path, head):
    # the tied head multiplies only the positions read by the vocabulary; the outputs are those of every position
    model = tiny_bert(tokenizer)
    if head == 'tied':
        model = model.bert
        model.config.architectures = ['BertModel']
    model.save_pretrained(tmp_path / 'enc')
    tokenizer.save_pretrained(tmp_path / 'enc')
    backbone = DiffRetriever.from_pretrained(str(tmp_path / 'enc'), device='cpu').backbone
    assert backbone.head == head
    ids = torch.tensor([ids_of(tokenizer, 'cats eat fish'), ids_of(tokenizer, 'dogs chase cats')])
    positions = torch.tensor([[1, 2], [0, 2]])
    hidden, logits = backbone.read(ids, torch.ones_like(ids), positions)
    every_hidden, every_logits = backbone.forward(ids, torch.ones_like(ids))
    rows = torch.arange(2)[:, None]
    assert hidden.shape == (2, 2, every_hidden.shape[-1]) and logits.shape == (2, 2, every_logits.shape[-1])
    torch.testing.assert_close(hidden, every_hidden[rows, positions], rtol=0, atol=0)
    torch.testing.assert_close(logits, every_logits[rows, positions], rtol=1e-6, atol=1e-6)


def test_dense_scores_hand_worked():
    q = torch.tensor([[[1., 0.], [0., 1.]]])
    d = torch.tensor([[[1., 0.], [0.6, 0.8]], [[0., 1.], [0., 1.]]])
    torch.testing.assert_close(dense_scores(q, d, 'maxsim'), torch.tensor([[(1. + .8) / 2, (0. + 1.) / 2]]))
    mean_d0 = np.array([.8, .4]) / np.linalg.norm([.8, .4])
    expected = [float(np.array([.5, .5]) / np.linalg.norm([.5, .5]) @ mean_d0), float(np.sqrt(.5))]
    torch.testing.assert_close(dense_scores(q, d, 'mean'), torch.tensor([expected]))


def test_hybrid_fusion_hand_worked():
    topics = pd.DataFrame({'qid': ['1'], 'query': ['x']})
    dense = pt.Transformer.from_df(pd.DataFrame({'qid': '1', 'docno': ['a', 'b', 'c'], 'score': [10., 6., 2.],
                                                 'rank': [0, 1, 2]}))
    sparse = pt.Transformer.from_df(pd.DataFrame({'qid': '1', 'docno': ['c', 'd'], 'score': [5., 1.],
                                                  'rank': [0, 1]}))
    res = HybridRetriever(dense, sparse)(topics)
    # dense normalised: a 1, b .5, c 0; sparse: c 1, d 0 -> a .5, b .25, c .5, d 0; ties by docno
    assert res['docno'].tolist() == ['a', 'c', 'b', 'd']
    np.testing.assert_allclose(res['score'], [.5, .5, .25, 0.])
    assert res['rank'].tolist() == [0, 1, 2, 3]
    cut = HybridRetriever(dense, sparse, weight=0.8, num_results=2)(topics)
    # dense top 2: a 1, b 0; sparse top 2: c 1, d 0 -> a .8, c .2, others 0
    assert cut['docno'].tolist() == ['a', 'c'] and np.allclose(cut['score'], [.8, .2])
    with pytest.raises(ValueError, match='weight'):
        HybridRetriever(dense, sparse, weight=2.)


TRIPLES = [('cats', 'cats and dogs', 'heart disease'), ('heart disease', 'the heart', 'protein'),
           ('protein', 'protein of cats', 'dogs')]


@pytest.mark.parametrize('lora', [False, True])
def test_one_training_step_lowers_the_loss(encoder, lora, fine_tune):
    torch.manual_seed(0)
    with torch.no_grad():
        before = float(contrastive_loss(encoder, TRIPLES))
    losses = fine_tune(encoder, TRIPLES, lora=lora, batch_size=3, learning_rate=1e-3).losses
    with torch.no_grad():
        after = float(contrastive_loss(encoder, TRIPLES))
    if not lora:  # no dropout anywhere: the step's loss is the loss of the batch before the update
        assert losses == [pytest.approx(before, rel=1e-4)]
    assert after < before


def test_validation_questions_score_every_epoch_and_choose_it(encoder, triple_frames):
    results, qrels, texts = triple_frames(TRIPLES)
    trainer = DiffRetrieverTrainer(encoder, texts, lora=False, epochs=2, batch_size=3, learning_rate=1e-3,
                                   choose_epoch=True, verbose=False)
    history = trainer.fit(results, qrels, results, qrels)
    assert [c['epoch'] for c in history.curve] == [0, 1, 2] and history.best_epoch in (0, 1, 2)
    assert all(c['dev'] in (0., 1 / 3, 2 / 3, 1.) for c in history.curve)   # three questions, right or wrong
    scores = trainer.dev_scores(trainer.dev_examples(results, qrels))
    assert float(scores.mean()) == history.curve[history.best_epoch]['dev']   # the kept epoch's weights


def test_diffembed_training_step_lowers_the_loss(encoder, fine_tune):
    embed = DiffEmbed(encoder.backbone, device='cpu')
    with torch.no_grad():
        before = float(contrastive_loss(embed, TRIPLES))
    fine_tune(embed, TRIPLES, lora=False, batch_size=3, learning_rate=1e-3)
    with torch.no_grad():
        assert float(contrastive_loss(embed, TRIPLES)) < before


def test_save_load_round_trip(encoder, tmp_path, fine_tune):
    history = fine_tune(encoder, TRIPLES, lora=True, batch_size=3, learning_rate=1e-3)
    frame = pd.DataFrame({'docno': ['a'], 'text': ['cats and heart disease']})
    before = encoder.doc_encoder()(frame)
    encoder.save_pretrained(tmp_path / 'model')
    loaded = DiffRetriever.from_pretrained(str(tmp_path / 'model'), device='cpu')
    assert (loaded.k_query, loaded.k_doc, loaded.backbone.head) == (2, 3, 'lm')
    assert loaded.training_record['history'] == history.to_dict()   # the training record travels with the model
    assert loaded.training_record['trainer'] == 'DiffRetrieverTrainer' and loaded.training_record['lora'] is True
    after = loaded.doc_encoder()(frame)
    np.testing.assert_allclose(after['doc_embs'][0], before['doc_embs'][0], atol=1e-5)
    assert after['toks'][0].keys() == before['toks'][0].keys()


def test_budget_selection_oracle_and_correlation():
    values = {(1, 1): {'a': .1, 'b': .9}, (1, 2): {'a': .5, 'b': .2}, (2, 1): {'a': .5, 'b': .6},
              (2, 2): {'a': .2, 'b': .3}}
    grid = budget_grid(lambda kq, kd: values[(kq, kd)], budgets=(1, 2))
    assert len(grid) == 8
    assert select_budget(grid) == {'k_query': 2, 'k_doc': 1}  # means .5, .35, .55, .25
    oracle = oracle_budgets(grid)
    # a: .5 at (1,2) and (2,1), same total, smaller k_query first -> (1,2); b: .9 at (1,1)
    assert oracle[['qid', 'k_query', 'k_doc']].values.tolist() == [['a', 1, 2], ['b', 1, 1]]
    features = pd.DataFrame({'qid': ['a', 'b', 'c'], 'length': [5, 2, 9], 'entropy': [1., 2., 0.]})
    three = pd.concat([oracle, pd.DataFrame({'qid': ['c'], 'k_query': [2], 'k_doc': [2], 'value': [1.]})])
    corr = oracle_correlations(three, features).set_index(['budget', 'feature'])
    # totals a 3, b 2, c 4 against lengths 5, 2, 9: same order -> rho 1; entropy reversed -> -1
    assert corr.loc[('total', 'length'), 'rho'] == pytest.approx(1.)
    assert corr.loc[('total', 'entropy'), 'rho'] == pytest.approx(-1.)


class _Corpus:
    def get_corpus_iter(self, verbose=False):
        yield {'docno': 'a', 'title': 'cats', 'text': 'cats and dogs'}  # the loaders' text: title first
        yield {'docno': 'b', 'title': '', 'text': 'heart disease protein'}


def test_diffretriever_modes(encoder, tmp_path):
    encoder.save_pretrained(tmp_path / 'model')
    topics = pd.DataFrame({'qid': ['1'], 'query': ['heart disease']})
    runs = {mode: diffretriever_system(_Corpus(), tmp_path / 'cache', tmp_path / 'model', mode=mode,
                                       device='cpu')(topics)
            for mode in ('dense', 'mean', 'sparse', 'hybrid')}
    assert len(list((tmp_path / 'cache').glob('diffretriever-*.mvi'))) == 1  # one index, keyed by the model's weights
    queries = encoder.query_encoder()(topics)
    docs = encoder.doc_encoder()(pd.DataFrame({'docno': ['a', 'b'],
                                               'text': ['cats and dogs', 'heart disease protein']}))
    q = queries['query_embs'][0]
    maxsim = {d: float((q @ e.T).max(1).mean()) for d, e in zip(docs['docno'], docs['doc_embs'])}
    dense = runs['dense'].set_index('docno')['score']
    for docno, value in maxsim.items():
        assert dense[docno] == pytest.approx(value, abs=1e-5)
    assert set(runs['hybrid']['docno']) == set(runs['dense']['docno']) | set(runs['sparse']['docno'])
    assert runs['hybrid']['score'].max() <= 1. + 1e-9
    with pytest.raises(ValueError, match="mode must be"):
        diffretriever_system(_Corpus(), tmp_path / 'cache', tmp_path / 'model', mode='colbert')


def test_token_vectors_are_the_text_tokens_states_of_the_same_pass(encoder, tokenizer):
    tokens = DiffRetriever(encoder.backbone, k_query=2, k_doc=3, vectors='tokens', device='cpu')
    assert repr(tokens).endswith("vectors='tokens')")
    docs = pd.DataFrame({'docno': ['a', 'b'], 'text': ['cats and dogs', '']})
    out = tokens.doc_encoder()(docs)
    masks = encoder.doc_encoder()(docs)
    input_ids, attention, positions, _, spans = encoder.batch(['cats and dogs', ''], 3, 'doc')
    text = ids_of(tokenizer, 'cats and dogs')
    start, end = spans[0]
    assert input_ids[0, start:end].tolist() == text and spans[1][0] == spans[1][1]
    with torch.no_grad():
        states = encoder.backbone.model(input_ids=input_ids, attention_mask=attention,
                                        output_hidden_states=True).hidden_states[-1]
    expected = torch.nn.functional.normalize(states[0, start:end], dim=-1).numpy()
    np.testing.assert_allclose(out['doc_embs'][0], expected, atol=1e-5)  # one vector per text token
    np.testing.assert_allclose(out['doc_embs'][1], masks['doc_embs'][1], atol=1e-6)  # no tokens: the masks' states
    assert out['toks'].tolist() == masks['toks'].tolist()  # the sparse side reads the masks either way
    with pytest.raises(ValueError, match="vectors must be one of \\('masks', 'tokens'\\), got 'cls'"):
        DiffRetriever(encoder.backbone, vectors='cls')
    with pytest.raises(ValueError, match="DiffRetrieverTrainer trains the mask positions' vectors"):
        DiffRetrieverTrainer(tokens, {})


def test_token_vectors_are_saved_with_the_model(encoder, tmp_path):
    tokens = DiffRetriever(encoder.backbone, vectors='tokens', device='cpu')
    tokens.save_pretrained(tmp_path / 'model')
    assert DiffRetriever.from_pretrained(tmp_path / 'model', device='cpu').vectors == 'tokens'
    assert DiffRetriever.from_pretrained(tmp_path / 'model', vectors='masks', device='cpu').vectors == 'masks'


def scores_by_docno(run):
    return run.set_index('docno')['score'].to_dict()


def unit_vector(v):
    v = np.asarray(v, dtype=np.float64)
    return v / np.linalg.norm(v)


def test_retrieval_pipelines(tmp_path):
    words = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'cats', 'dogs', 'heart', 'disease', 'protein', 'and', 'the']
    (tmp_path / 'vocab.txt').write_text('\n'.join(words) + '\n')
    tokenizer = transformers.BertTokenizerFast(str(tmp_path / 'vocab.txt'))
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=len(words), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=128))
    encoder = DiffRetriever(MaskedBackbone(model, tokenizer, 'lm'), k_query=2, k_doc=3, device='cpu')
    documents = pd.DataFrame({'docno': ['a', 'b'], 'text': ['cats and dogs', 'heart disease protein']})
    topics = pd.DataFrame({'qid': ['1'], 'query': ['heart disease']})
    modes = ['dense', 'mean', 'sparse', 'hybrid', 'mean hybrid']
    built = retrieval_pipelines(encoder, lambda: documents, tmp_path / 'x', modes=modes)
    assert list(built) == modes and (tmp_path / 'x.mvi').exists() and (tmp_path / 'x.pisa').exists()
    runs = {mode: scores_by_docno(system(topics)) for mode, system in built.items()}
    q = encoder.query_encoder()(topics)['query_embs'][0]
    d = dict(zip(documents['docno'], encoder.doc_encoder()(documents)['doc_embs']))
    assert runs['dense'] == pytest.approx({k: float((q @ e.T).max(1).mean()) for k, e in d.items()}, abs=1e-5)
    means = {k: float(unit_vector(q.mean(0)) @ unit_vector(e.mean(0))) for k, e in d.items()}
    assert runs['mean'] == pytest.approx(means, abs=1e-5)
    assert set(runs['mean hybrid']) == set(runs['mean']) | set(runs['sparse'])
    encode = encoder.doc_encoder
    encoder.doc_encoder = lambda: pytest.fail('the indexes are built already')
    again = retrieval_pipelines(encoder, lambda: documents, tmp_path / 'x', modes=['hybrid'])
    assert scores_by_docno(again['hybrid'](topics)) == pytest.approx(runs['hybrid'])
    encoder.doc_encoder = encode
    assert encoder.with_k(k_query=1).doc_repr() == encoder.doc_repr() != encoder.with_k(k_doc=1).doc_repr()
    other_queries = retrieval_pipelines(encoder.with_k(k_query=1), lambda: documents, tmp_path / 'x')
    assert len(other_queries['dense'](topics)) == 2  # K_query encodes no document: the index is shared
    with pytest.raises(StaleBuildError, match='other settings'):
        retrieval_pipelines(encoder.with_k(k_doc=1), lambda: documents, tmp_path / 'x')
    with pytest.raises(StaleBuildError, match='other records'):  # another corpus: never the old encodings
        retrieval_pipelines(encoder, lambda: documents.head(1), tmp_path / 'x', modes=['hybrid'])
    with torch.no_grad():
        model.bert.embeddings.word_embeddings.weight[5] += 1.  # trained further, in place
    with pytest.raises(StaleBuildError, match='other settings'):
        retrieval_pipelines(encoder, lambda: documents, tmp_path / 'x', modes=['dense'])
    with pytest.raises(ValueError, match='mode must be one of'):
        retrieval_pipelines(encoder, lambda: documents, tmp_path / 'y', modes=['colbert'])
