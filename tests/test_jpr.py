import itertools

import numpy as np
import pandas as pd
import pytest
import pyterrier as pt

from pyterrier_multiquery._saved_model import CorruptModelError
from pyterrier_multiquery.jpr.decoding import independent_decode, length_penalty, seq_decode, tree_decode
from pyterrier_multiquery.jpr.oracle import greedy_answer_cover, gumbel_top_k

WORDS = ['who', 'won', 'the', 'cup', 'brazil', 'france', 'italy', 'spain', 'in', 'year', 'question', 'index',
         'passage', ':', '0', '1', '2', '3', '4', '5', '6', '7']


# --- Algorithm 2: greedy answer cover -------------------------------------------------------------------------

def test_greedy_cover_takes_the_largest_gain_first_and_stops_when_all_answers_are_covered():
    answers = [{'a'}, {'a', 'b'}, {'c'}, set(), {'b', 'c'}]
    # {a,b} adds 2; then {c} and {b,c} each add 1 (c): the earlier one wins; then nothing is left to cover
    assert greedy_answer_cover(answers, 3) == [1, 2]
    assert greedy_answer_cover(answers, 1) == [1]
    assert greedy_answer_cover(answers, 0) == []


def test_greedy_cover_of_negatives_only_is_empty_and_rejects_negative_k():
    assert greedy_answer_cover([set(), set()], 5) == []
    with pytest.raises(ValueError, match='k must not be negative'):
        greedy_answer_cover([{'a'}], -1)


def test_greedy_cover_prefers_the_passage_with_more_new_answers_over_an_earlier_one():
    assert greedy_answer_cover([{'a'}, {'b'}, {'a', 'c'}, {'d'}], 10) == [2, 1, 3]


def test_gumbel_top_k_at_low_temperature_is_the_top_k_and_skips_excluded():
    rng = np.random.default_rng(0)
    logits = np.array([0., 3., 1., 2., -1.])
    assert gumbel_top_k(logits, 3, 1e-4, rng) == [1, 3, 2]
    assert gumbel_top_k(logits, 3, 1e-4, rng, exclude=[1, 2]) == [3, 0, 4]
    assert gumbel_top_k(logits, 10, 1e-4, rng, exclude=[0]) == [1, 3, 2, 4]


def test_gumbel_top_k_at_high_temperature_samples_every_candidate_first_sometimes():
    rng = np.random.default_rng(0)
    firsts = {gumbel_top_k(np.array([0., 5., 1.]), 1, 100., rng)[0] for _ in range(200)}
    assert firsts == {0, 1, 2}
    with pytest.raises(ValueError, match='gamma'):
        gumbel_top_k(np.zeros(3), 1, 0., rng)


# --- decoding ----------------------------------------------------------------------------------------------------

def table(probs):
    """log P(next | prefix) from a dict of probabilities; chosen passages at -inf."""
    def log_probs(prefix):
        with np.errstate(divide='ignore'):
            values = np.log(np.asarray(probs[tuple(prefix)], dtype=float))
        values[list(prefix)] = -np.inf
        return values
    return log_probs


HAND_TABLE = {(): [.5, .3, .2], (0,): [0, .1, .9], (1,): [.6, 0, .4], (2,): [.5, .5, 0],
              (0, 1): [0, 0, 1], (0, 2): [0, 1, 0], (1, 0): [0, 0, 1], (1, 2): [1, 0, 0], (2, 0): [0, 1, 0],
              (2, 1): [1, 0, 0]}


def test_length_penalty_values():
    assert length_penalty(1, 3.) == 1.
    assert length_penalty(7, 2.) == pytest.approx(4.)
    assert length_penalty(4, 0.) == 1.


def test_tree_decode_on_a_hand_worked_table():
    # beta = 0: (0) at log .5; then (0,2) at log .9 beats (1) at log .3; then (0,2,1) at log 1
    assert tree_decode(table(HAND_TABLE), 3, 0.) == ([0, 2, 1], 3)
    # beta = 20: l(2) = (7/6)^20 = 21.8 makes (0,2) cost 2.30 > (1)'s 1.20 and (2)'s 1.61: breadth first
    assert tree_decode(table(HAND_TABLE), 3, 20.) == ([0, 1, 2], 1)
    assert seq_decode(table(HAND_TABLE), 3) == ([0, 2, 1], 3)
    assert independent_decode(table(HAND_TABLE), 2) == ([0, 1], 1)


def test_tree_decode_takes_any_beta_without_overflow():
    # ((5 + y) / 6) ** 1000 overflows a float; in log space a large beta is simply breadth first
    assert tree_decode(table(HAND_TABLE), 3, 1000.) == tree_decode(table(HAND_TABLE), 3, 1e6) == ([0, 1, 2], 1)


def brute_force_tree(log_probs, n, k, beta):
    """The same objective searched by enumerating every sequence whose parent is in the tree and whose last
    passage is not output yet."""
    tree, output = {()}, []
    while len(output) < k:
        options = []
        for length in range(1, n + 1):
            for sequence in itertools.permutations(range(n), length):
                if sequence[:-1] in tree and sequence[-1] not in output:
                    value = length_penalty(length, beta) * log_probs(sequence[:-1])[sequence[-1]]
                    if np.isfinite(value):
                        options.append((-value, length, sequence))
        if not options:
            break
        _, _, best = min(options, key=lambda o: o[0])
        tree.add(best)
        output.append(best[-1])
    return output, max(len(s) for s in tree)


@pytest.mark.parametrize('seed', range(6))
@pytest.mark.parametrize('beta', [0., 0.7, 3.])
def test_tree_decode_matches_brute_force_on_random_tables(seed, beta):
    n, k = 5, 4
    rng = np.random.default_rng(seed)
    probs = {prefix: rng.dirichlet(np.ones(n) * .5)
             for length in range(n) for prefix in itertools.permutations(range(n), length)}
    assert tree_decode(table(probs), k, beta) == brute_force_tree(table(probs), n, k, beta)


def answer_oracle(answers):
    """P(p | prefix) strongly preferring passages that add answers the prefix lacks."""
    def log_probs(prefix):
        covered = set().union(*(answers[p] for p in prefix)) if prefix else set()
        gains = np.array([len(a - covered) for a in answers], dtype=float)
        logits = 6. * gains - 0.01 * np.arange(len(answers))
        logits[list(prefix)] = -np.inf
        return logits - np.logaddexp.reduce(logits[np.isfinite(logits)])
    return log_probs


def test_tree_decode_limits():
    answers = [{'a'}, {'a'}, {'b'}, {'a'}, {'c'}, set()]
    oracle = answer_oracle(answers)
    assert tree_decode(oracle, 4, 0.).passages == seq_decode(oracle, 4).passages == [0, 2, 4, 1]
    assert tree_decode(oracle, 4, 200.) == independent_decode(oracle, 4)
    assert independent_decode(oracle, 4).passages == [0, 1, 2, 3]


@pytest.mark.parametrize('decode', [lambda f, k: tree_decode(f, k, 1.), seq_decode, independent_decode])
def test_decoders_never_repeat_and_stop_when_candidates_run_out(decode):
    rng = np.random.default_rng(3)
    probs = {prefix: rng.dirichlet(np.ones(4))
             for length in range(4) for prefix in itertools.permutations(range(4), length)}
    passages = decode(table(probs), 10).passages
    assert sorted(passages) == [0, 1, 2, 3]


# --- model, training, reranker on a tiny random BERT ----------------------------------------------------------

@pytest.fixture(scope='module')
def tiny_bert(save_tiny_bert):
    """A random 2-layer BERT with a word-level tokenizer over this module's words, saved as a checkpoint."""
    return save_tiny_bert(WORDS)


def new_model(tiny_bert, seed=0, prior=False):
    import torch
    from pyterrier_multiquery.jpr import JPRModel
    torch.manual_seed(seed)
    return JPRModel(str(tiny_bert), decoder_layers=1, decoder_heads=2, decoder_dropout=0., prior=prior)


def examples():
    from pyterrier_multiquery.jpr import JPRExample
    passages = ['brazil won the cup', 'france won the cup', 'italy won the cup', 'spain in year', 'the year',
                'brazil won in year']
    answers = [{'brazil'}, {'france'}, {'italy'}, set(), set(), {'brazil'}]
    return [JPRExample('who won the cup', passages, answers, [3, 0, 5, 1, 2, 4]),
            JPRExample('who won in year', passages[::-1], answers[::-1], [0, 1, 2, 3, 4, 5])]


def test_forward_masks_the_chosen_passages_and_padding(tiny_bert):
    import torch
    model = new_model(tiny_bert).eval()
    memory = model.passages('who won', ['brazil', 'france', 'italy']).unsqueeze(0)
    prefix = torch.tensor([[2, 0]])
    log_probs = model(memory, prefix, torch.tensor([[False, False, True]]))
    assert log_probs.shape == (1, 3, 3)
    assert torch.isinf(log_probs[0, :, 2]).all()          # padding
    assert torch.isinf(log_probs[0, 2, 0]) and torch.isfinite(log_probs[0, 1, 0])  # 0 masked after it is chosen
    assert torch.allclose(log_probs[0, 0].exp().sum(), torch.tensor(1.))
    assert torch.allclose(log_probs[0, 2, 1], torch.tensor(0.))   # the only one left


@pytest.mark.parametrize('prior', [False, True])
@pytest.mark.parametrize('mode', ['dynamic_oracle', 'teacher_forcing', 'independent'])
def test_one_training_step_lowers_the_loss(tiny_bert, mode, prior):
    import torch
    from pyterrier_multiquery.jpr import JPRTrainer
    model = new_model(tiny_bert, prior=prior)
    trainer = JPRTrainer(model, mode=mode, k=3, train_candidates=6, learning_rate=3e-3, verbose=False)

    def loss():
        trainer.rng = np.random.default_rng(7)   # the same subsets, orders and negatives
        model.eval()
        with torch.no_grad():
            return float(trainer.loss(examples()))

    before = loss()
    trainer.rng = np.random.default_rng(7)
    trainer.step(examples())
    assert loss() < before


def test_dynamic_oracle_targets_are_the_positives_not_yet_chosen(tiny_bert):
    from pyterrier_multiquery.jpr import JPRTrainer
    model = new_model(tiny_bert)
    trainer = JPRTrainer(model, k=4, verbose=False)
    answers = [set(), {'a'}, set(), {'b'}, set(), {'a'}]
    prefix, targets = trainer.targets(answers, np.log(np.full(6, 1 / 6)))
    assert len(prefix) == 4 and len(set(prefix)) == 4 and {1, 3} <= set(prefix)   # cover + 2 negatives
    for step, target in enumerate(targets):
        assert target == [p for p in [1, 3] if p not in prefix[:step]]
    trainer.mode = 'teacher_forcing'
    assert trainer.targets(answers) == ([1, 3], [[1], [3]])
    trainer.mode = 'independent'
    assert trainer.targets(answers) == ([], [[1, 3, 5]])


def test_trainer_rejects_bad_settings(tiny_bert):
    from pyterrier_multiquery.jpr import JPRTrainer
    model = new_model(tiny_bert)
    with pytest.raises(ValueError, match='unknown JPR training mode'):
        JPRTrainer(model, mode='beam')
    frame, qrels = first_stage_with_answers_on_top()
    with pytest.raises(ValueError, match='no training question'):
        JPRTrainer(model, verbose=False).fit(frame, qrels.assign(label=0))
    with pytest.raises(ValueError, match='give both'):
        JPRTrainer(model, verbose=False).fit(frame, qrels, frame)
    with pytest.raises(ValueError, match='choose on the validation questions'):
        JPRTrainer(model, choose_epoch=True, verbose=False).fit(frame, qrels)
    with pytest.raises(ValueError, match='needs a model with a prior'):
        JPRTrainer(model, departure='one_se', verbose=False)


def test_save_and_load_round_trip(tiny_bert, tmp_path):
    import torch
    from pyterrier_multiquery.jpr import JPRModel, JPRTrainer
    model = new_model(tiny_bert)
    JPRTrainer(model, k=3, epochs=2, verbose=False).fit(*first_stage_with_answers_on_top())
    model.save_pretrained(tmp_path / 'jpr')
    assert not any(p.name.startswith('.') for p in tmp_path.iterdir())   # no temporary folder left
    loaded = JPRModel.from_pretrained(tmp_path / 'jpr').eval()
    memory = model.eval().passages('who won', ['brazil', 'france', 'italy']).unsqueeze(0)
    prefix = torch.tensor([[1]])
    assert torch.allclose(model(memory, prefix), loaded(memory, prefix), atol=1e-6)
    (tmp_path / 'jpr' / 'decoder.pt').write_bytes(b'not weights')
    # pt_meta.json's file sizes name the damaged file before torch reads it
    with pytest.raises(CorruptModelError, match='decoder.pt.* truncated or damaged'):
        JPRModel.from_pretrained(tmp_path / 'jpr')


# --- the first-stage prior -------------------------------------------------------------------------------------

def test_an_untrained_prior_is_the_first_stage_rank_distribution(tiny_bert):
    import torch
    model = new_model(tiny_bert, prior=True).eval()
    memory = model.passages('who won', ['brazil', 'france', 'italy']).unsqueeze(0)
    log_probs = model(memory, torch.tensor([[1]]), ranks=torch.tensor([[2, 0, 1]]))
    # logits -log(1 + rank) = -log 3, 0, -log 2: probabilities 1/3, 1, 1/2 over 11/6; then 1/3, 1/2 over 5/6
    assert torch.allclose(log_probs[0].exp(), torch.tensor([[2 / 11, 6 / 11, 3 / 11], [2 / 5, 0., 3 / 5]]))
    with pytest.raises(ValueError, match='ranks'):
        model(memory, torch.tensor([[1]]))


def scored_results():
    """Two queries whose scores do not follow their docnos: q1's order by score is d1 d4 d3 d0 d5 d2."""
    passages = examples()[0].passages
    return pd.DataFrame({'qid': ['q1'] * 6 + ['q2'] * 2, 'query': ['who won the cup'] * 6 + ['who won'] * 2,
                         'docno': [f'd{i}' for i in range(6)] + ['e0', 'e1'],
                         'text': list(passages) + ['italy', 'spain'], 'score': [.3, .9, .1, .5, .7, .2, .1, .4]})


@pytest.mark.parametrize('decode,beta', [('tree', 0.), ('tree', 1.), ('tree', 1000.), ('seq', 1.), ('independent', 1.)])
def test_an_untrained_prior_model_returns_the_first_stage_order(tiny_bert, decode, beta):
    from pyterrier_multiquery.jpr import JPR
    model = new_model(tiny_bert, prior=True)   # random decoder and encoder; only the query head starts at zero
    out = JPR(model, k=5, decode=decode, beta=beta)(scored_results())
    assert out.query('qid == "q1"')['docno'].tolist() == ['d1', 'd4', 'd3', 'd0', 'd5']
    assert out.query('qid == "q2"')['docno'].tolist() == ['e1', 'e0']


def trained_prior_model(tiny_bert):
    from pyterrier_multiquery.jpr import JPRTrainer
    model = new_model(tiny_bert, prior=True)
    JPRTrainer(model, k=3, epochs=2, learning_rate=1e-2, verbose=False).fit(*first_stage_with_answers_on_top())
    return model


@pytest.mark.parametrize('decode', ['tree', 'seq', 'independent'])
def test_a_trained_model_at_departure_zero_returns_the_first_stage_order(tiny_bert, decode):
    from pyterrier_multiquery.jpr import JPR
    model = trained_prior_model(tiny_bert)
    assert model.query_head.weight.any()   # trained: the pointer's logits are not zero
    model.departure = 0.
    out = JPR(model, k=5, decode=decode)(scored_results())
    assert out.query('qid == "q1"')['docno'].tolist() == ['d1', 'd4', 'd3', 'd0', 'd5']


def test_departure_scales_the_pointer_logits_and_is_saved(tiny_bert, tmp_path):
    import torch
    from pyterrier_multiquery.jpr import JPRModel
    model = trained_prior_model(tiny_bert).eval()
    memory = model.passages('who won', ['brazil', 'france', 'italy']).unsqueeze(0)
    prefix, ranks = torch.tensor([[1]]), torch.tensor([[2, 0, 1]])
    prior = -model.prior_weight * torch.log1p(ranks.float())
    full = model(memory, prefix, ranks=ranks)
    model.departure = .3
    half = model(memory, prefix, ranks=ranks)
    # recover the pointer's logits from the full model (log-softmax up to a constant), then scale them by hand
    pointer = full[0, 0] - prior[0]
    assert torch.allclose(half[0, 0], (.3 * pointer + prior[0]).log_softmax(-1), atol=1e-5)
    model.save_pretrained(tmp_path / 'jpr')
    assert JPRModel.from_pretrained(tmp_path / 'jpr').departure == .3


def test_departure_is_validated(tiny_bert):
    with pytest.raises(ValueError, match=r'departure must lie in \[0, 1\]'):
        new_model(tiny_bert, prior=True).departure = 1.5
    with pytest.raises(ValueError, match='no first stage to fall back to'):
        new_model(tiny_bert, prior=False).departure = .5


def test_jpr_examples_carry_ranks_and_answers_in_the_rerankers_index_order():
    from pyterrier_multiquery.jpr import jpr_examples
    from pyterrier_multiquery.jpr.reranker import index_order
    frame = scored_results()
    qrels = pd.DataFrame({'qid': ['q1', 'q1', 'q1', 'q2'], 'docno': ['d0', 'd5', 'd1', 'e1'], 'label': [1, 1, 1, 0],
                          'iteration': ['1', '1', '2', '1']})
    examples = jpr_examples(frame, qrels, num_candidates=5, seed=3)
    top = ['d1', 'd4', 'd3', 'd0', 'd5']
    order = index_order('q1', 5, seed=3)
    texts = dict(zip(frame['docno'], frame['text']))
    assert examples['q1'].ranks == order.tolist()
    assert examples['q1'].passages == [texts[top[i]] for i in order]
    assert examples['q1'].answers == [{'d1': {'2'}, 'd0': {'1'}, 'd5': {'1'}}.get(top[i], set()) for i in order]
    assert examples['q2'].answers == [set(), set()]


def first_stage_with_answers_on_top(questions=4):
    """Questions whose two answers are supported by their first-stage top two passages."""
    passages = examples()[0].passages
    frame = pd.DataFrame([{'qid': f'q{q}', 'query': f'who won the cup {q}', 'docno': f'q{q}d{i}',
                           'text': passages[(i + q) % 6], 'score': 6. - i} for q in range(questions) for i in range(6)])
    qrels = pd.DataFrame([{'qid': f'q{q}', 'docno': f'q{q}d{i}', 'label': 1, 'iteration': str(i + 1)}
                          for q in range(questions) for i in range(2)])
    return frame, qrels


def split_questions(frame, qrels, dev=('q2', 'q3')):
    """``(frame, qrels, dev frame, dev qrels)``: the questions ``dev`` held out for validation."""
    held = frame['qid'].isin(dev), qrels['qid'].isin(dev)
    return frame[~held[0]], qrels[~held[1]], frame[held[0]], qrels[held[1]]


def prior_trainer(tiny_bert, epochs, **settings):
    from pyterrier_multiquery.jpr import JPRTrainer
    return JPRTrainer(new_model(tiny_bert, prior=True), num_candidates=6, train_candidates=6, k=3, epochs=epochs,
                      learning_rate=1e-2, verbose=False, **settings)


def test_the_trainer_records_the_curve_and_keeps_the_best_dev_epoch(tiny_bert):
    from pyterrier_multiquery.jpr import JPR
    frame, qrels = first_stage_with_answers_on_top()
    trainer = prior_trainer(tiny_bert, 3)
    history = trainer.fit(frame, qrels)
    assert [c['epoch'] for c in history.curve] == [0, 1, 2, 3] and history.best_epoch == 3
    assert history.curve[0]['loss'] is None and all(c['loss'] > 0 for c in history.curve[1:])
    assert all(c['dev'] is None for c in history.curve)
    assert len(history.losses) == 3   # 4 questions, batches of 16: one step an epoch
    assert history.curve[1]['loss'] == history.losses[0]
    assert trainer.model.prior_weight.item() != 1.     # trained
    # the first stage covers every dev answer (score 1), which no epoch beats: the untrained model is kept
    trainer = prior_trainer(tiny_bert, 3, choose_epoch=True)
    history = trainer.fit(*split_questions(frame, qrels))
    assert history.curve[0]['dev'] == 1. and history.best_epoch == 0
    model = trainer.model
    assert model.prior_weight.item() == 1. and not model.query_head.weight.any()
    out = JPR(model, k=3, num_candidates=6)(frame)
    assert out['docno'].tolist() == frame.groupby('qid').head(3)['docno'].tolist()


def test_a_fixed_schedule_keeps_the_last_epoch_and_the_held_out_questions_choose_the_departure(tiny_bert, tmp_path):
    from pyterrier_multiquery.jpr import JPR, JPRModel
    frame, qrels = first_stage_with_answers_on_top()
    trainer = prior_trainer(tiny_bert, 2, departure='one_se')
    history = trainer.fit(*split_questions(frame, qrels))
    model = trainer.model
    assert history.best_epoch == 2 and model.prior_weight.item() != 1.   # the last epoch, trained
    # the first stage already covers every held-out answer: no weight does better, so the first stage is kept
    assert history.departure_scores == {'0.0': 1., '0.25': 1., '0.5': 1., '0.75': 1., '1.0': 1.}
    assert model.departure == history.departure == 0.
    assert JPR(model, k=3, num_candidates=6)(frame)['docno'].tolist() == frame.groupby('qid').head(3)['docno'].tolist()
    # the saved model keeps its training record and loads through pt.Artifact.load
    model.save_pretrained(tmp_path / 'jpr')
    loaded = pt.Artifact.load(str(tmp_path / 'jpr'))
    assert isinstance(loaded, JPRModel) and loaded.departure == 0.
    assert loaded.training_record['history'] == history.to_dict()
    assert loaded.training_record['trainer'] == 'JPRTrainer'
    assert loaded.training_record['settings']['departure'] == 'one_se'


def test_prior_model_save_and_load_round_trip(tiny_bert, tmp_path):
    import torch
    from pyterrier_multiquery.jpr import JPR, JPRModel, JPRTrainer
    model = new_model(tiny_bert, prior=True)
    JPRTrainer(model, k=3, epochs=2, learning_rate=1e-2, verbose=False).fit(*first_stage_with_answers_on_top())
    model.save_pretrained(tmp_path / 'jpr')
    loaded = JPRModel.from_pretrained(tmp_path / 'jpr').eval()
    assert loaded.prior and loaded.prior_weight.item() == model.prior_weight.item() != 1.
    memory = model.eval().passages('who won', ['brazil', 'france', 'italy']).unsqueeze(0)
    prefix, ranks = torch.tensor([[1]]), torch.tensor([[2, 0, 1]])
    assert torch.equal(model(memory, prefix, ranks=ranks), loaded(memory, prefix, ranks=ranks))
    assert JPR(loaded, k=4)(scored_results()).equals(JPR(model, k=4)(scored_results()))


def test_models_saved_before_the_prior_load_without_it(tiny_bert, tmp_path):
    import json
    import torch
    from pyterrier_multiquery.jpr import JPRModel
    model = new_model(tiny_bert).eval()
    model.save_pretrained(tmp_path / 'old')
    config = tmp_path / 'old' / 'jpr_config.json'
    config.write_text(json.dumps({k: v for k, v in json.loads(config.read_text()).items() if k != 'prior'}))
    (tmp_path / 'old' / 'pt_meta.json').unlink()  # such models also predate pt_meta.json
    loaded = JPRModel.from_pretrained(tmp_path / 'old').eval()
    memory = model.passages('who won', ['brazil', 'france', 'italy']).unsqueeze(0)
    assert not loaded.prior and torch.equal(model(memory, torch.tensor([[1]])), loaded(memory, torch.tensor([[1]])))
    with pytest.raises(ValueError, match='prior_weight'):
        JPRModel.from_pretrained(tmp_path / 'old', prior=True)


def test_a_missing_model_folder_is_a_file_not_found_error_naming_it():
    from pyterrier_multiquery.jpr import JPR
    with pytest.raises(FileNotFoundError, match="'missing/dir'"):
        JPR('missing/dir')


def results(n=6):
    passages = examples()[0].passages
    return pd.DataFrame({'qid': ['q1'] * n + ['q2'] * 2, 'query': ['who won the cup'] * n + ['who won'] * 2,
                         'docno': [f'd{i}' for i in range(n)] + ['e0', 'e1'],
                         'text': list(passages[:n]) + ['italy', 'spain'],
                         'score': list(np.arange(n, 0, -1.)) + [2., 1.], 'rank': list(range(n)) + [0, 1]})


def test_reranker_outputs_k_distinct_passages_in_selection_order(tiny_bert):
    from pyterrier_multiquery.jpr import JPR, IndepPR
    model = new_model(tiny_bert)
    for reranker in [JPR(model, k=4, num_candidates=5), JPR(model, k=4, decode='seq'), IndepPR(model, k=4)]:
        out = reranker(results())
        q1 = out[out['qid'] == 'q1']
        assert len(q1) == 4 and q1['docno'].is_unique and set(q1['docno']) <= {f'd{i}' for i in range(6)}
        assert list(q1['rank']) == [0, 1, 2, 3] and q1['score'].is_monotonic_decreasing
        assert sorted(out[out['qid'] == 'q2']['docno']) == ['e0', 'e1']
        assert reranker(results()).equals(out)     # deterministic
    assert 'd5' not in set(JPR(model, k=5, num_candidates=5)(results())['docno'])   # only the top 5 are candidates


def test_indeppr_is_the_top_k_of_the_first_step(tiny_bert):
    import torch
    from pyterrier_multiquery.jpr import IndepPR
    from pyterrier_multiquery.jpr.reranker import index_order
    model = new_model(tiny_bert).eval()
    reranker = IndepPR(model, k=3)
    frame = results()
    q1 = frame[frame['qid'] == 'q1']
    order = index_order('q1', 6)
    with torch.no_grad():
        first = model(model.passages('who won the cup', q1['text'].iloc[order].tolist()).unsqueeze(0),
                      torch.zeros(1, 0, dtype=torch.long))[0, 0].numpy()
    expected = q1['docno'].iloc[order[np.argsort(-first)[:3]]].tolist()
    assert reranker(frame).query('qid == "q1"')['docno'].tolist() == expected


def test_rank_cutoff_fuses_into_a_smaller_k(tiny_bert):
    from pyterrier_multiquery.jpr import JPR
    model = new_model(tiny_bert)
    reranker = JPR(model, k=5, beta=0.5)
    assert reranker.fuse_rank_cutoff(10) is reranker
    small = reranker.fuse_rank_cutoff(2)
    assert small == JPR(model, k=2, beta=0.5) and small != reranker
    full, cut = reranker(results()), small(results())
    assert cut['docno'].tolist() == full.groupby('qid').head(2)['docno'].tolist()


def test_reranker_errors_and_empty_input(tiny_bert):
    from pyterrier_multiquery.jpr import JPR, IndepPR
    model = new_model(tiny_bert)
    with pytest.raises(ValueError, match='unknown decode'):
        JPR(model, decode='beam')
    with pytest.raises(ValueError, match='k=34 passages take 33 decoder steps .* at most max_steps=32'):
        JPR(model, k=34)
    assert JPR(model, k=33).k == IndepPR(model, k=34).k - 1   # one step per pick after the first; IndepPR has none
    with pytest.raises(pt.validate.InputValidationError, match=r"\['text'\]"):
        JPR(model)(results().drop(columns='text'))
    with pytest.raises(ValueError, match="JPR: qid 'q2', docno 'e1' has score nan"):
        JPR(model)(results().assign(score=[6., 5., 4., 3., 2., 1., 2., np.nan]))
    with pytest.raises(ValueError, match="JPR: qid 'q2' lists docno 'e0' more than once"):
        JPR(model)(results().assign(docno=[f'd{i}' for i in range(6)] + ['e0', 'e0']))
    empty = JPR(model)(results().iloc[:0])
    assert empty.empty and {'qid', 'docno', 'score', 'rank'} <= set(empty.columns)


def test_reranker_can_append_the_first_stages_other_passages(tiny_bert):
    from pyterrier_multiquery.jpr import JPR
    model = new_model(tiny_bert, prior=True)            # untrained with a prior: picks the first-stage order
    out = JPR(model, k=2, num_candidates=3, append_rest=True)(results())
    assert out.groupby('qid')['docno'].agg(list).to_dict() == {'q1': [f'd{i}' for i in range(6)], 'q2': ['e0', 'e1']}
    assert out['rank'].tolist() == [0, 1, 2, 3, 4, 5, 0, 1]
    assert len(JPR(model, k=2, num_candidates=3)(results())) == 4


def test_reranker_keeps_the_frozen_encoders_states_across_runs(tiny_bert, tmp_path):
    from pyterrier_multiquery.jpr import JPR
    model = new_model(tiny_bert)
    first = JPR(model, k=3, state_cache=tmp_path / 'states')(results())
    stored = sorted((tmp_path / 'states').iterdir())
    assert len(stored) == results()['qid'].nunique() and all(p.suffix == '.npy' for p in stored)
    again = new_model(tiny_bert)            # a fresh model: its encoder must not run, the states come from disk
    again.load_state_dict(model.state_dict())
    again.passages.model.forward = None
    pd.testing.assert_frame_equal(JPR(again, k=3, state_cache=tmp_path / 'states')(results()), first)


def test_rerankers_sharing_a_model_keep_their_own_state_caches(tiny_bert, tmp_path):
    from pyterrier_multiquery.jpr import JPR
    model = new_model(tiny_bert)
    cached = JPR(model, k=3, state_cache=tmp_path / 'states')
    uncached = JPR(model, k=3)                  # built after: must not switch the first one's cache off
    cached(results())
    assert len(list((tmp_path / 'states').iterdir())) == results()['qid'].nunique()
    uncached(results())
    assert model.passages.state_cache is None


def test_stored_states_belong_to_the_encoder_that_made_them(tiny_bert, tmp_path):
    import torch

    from pyterrier_multiquery.jpr import PassageEncoder
    texts = ('the first passage', 'the second passage')
    encoder, fine_tuned = PassageEncoder(tiny_bert), PassageEncoder(tiny_bert)
    with torch.no_grad():   # another encoder at the same path: a fine-tuned copy, say
        for parameter in fine_tuned.model.parameters():
            parameter.add_(0.1)
    expected = fine_tuned('q', texts).clone()   # computed, nothing stored
    fine_tuned._states.clear()
    encoder.state_cache = fine_tuned.state_cache = tmp_path / 'states'
    assert not torch.allclose(encoder('q', texts), expected)   # stored first, under the same texts
    torch.testing.assert_close(fine_tuned('q', texts), expected)
    assert len(list((tmp_path / 'states').iterdir())) == 2


def test_main_job_runs_jpr_from_a_saved_model(tiny_bert, tmp_path):
    from pyterrier_multiquery.experiment.main import main
    from pyterrier_multiquery.loaders import load_dataset
    from pyterrier_multiquery.experiment.systems import DenseFirstStage, jpr_system
    folder = tmp_path / 'beir'
    (folder / 'qrels').mkdir(parents=True)
    texts = ['brazil won the cup', 'france won the cup', 'italy won the cup', 'spain in year', 'the year']
    (folder / 'corpus.jsonl').write_text(''.join(f'{{"_id": "d{i}", "title": "", "text": "{t}"}}\n'
                                                 for i, t in enumerate(texts)))
    (folder / 'queries.jsonl').write_text('{"_id": "q1", "text": "who won the cup"}\n'
                                          '{"_id": "q2", "text": "which year"}\n')
    (folder / 'qrels' / 'test.tsv').write_text('query-id\tcorpus-id\tscore\nq1\td0\t1\nq1\td1\t1\nq2\td3\t1\n')
    new_model(tiny_bert).save_pretrained(tmp_path / 'jpr')
    dataset = load_dataset(folder)
    first_stage = DenseFirstStage(dataset, tmp_path / 'cache', verbose=False)
    system = jpr_system(first_stage.retriever(4), dataset, tmp_path / 'jpr', num_candidates=4, k=2, verbose=False)
    out = system(dataset.get_topics())
    top4 = first_stage.retriever(4)(dataset.get_topics()).groupby('qid')['docno'].agg(set)
    # two choices from MiniLM's top 4, then the other two of them
    assert out.groupby('qid').size().tolist() == [4, 4]
    assert all(set(frame['docno'].iloc[:2]) <= top4[qid] for qid, frame in out.groupby('qid'))
    assert all(frame['docno'].is_unique for _, frame in out.groupby('qid'))
    table = tmp_path / 'table.csv'
    assert main(['--dataset', str(folder), '--cache-dir', str(tmp_path / 'cache'), '--jpr', str(tmp_path / 'jpr'),
                 '--save', str(table)]) == 0
    assert 'MiniLM >> JPR' in pd.read_csv(table)['name'].tolist()
