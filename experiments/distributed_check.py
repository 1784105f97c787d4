"""Do the trainers train the same model under ``accelerate launch`` as in one process?

Trains tiny random models with every trainer (AMERTrainer, JPRTrainer, DiffRetrieverTrainer, BiEncoderTrainer) once in
one process and once under ``accelerate launch --multi_gpu --num_processes N`` on the CPU, on the same examples at
the same global batch, and prints per trainer the largest absolute difference of the trained weights, the tolerance
and both wall times (of the training alone, and of the whole run with start-up). Exits 1 when a difference exceeds
its tolerance.

The tolerance is ``--atol``, except for DiffRetrieverTrainer, whose float32 rounding alone moves the weights further:
its temperature of 0.01 scales the scores' rounding by 100, and Adam's first step, ``lr * g / (|g| + eps)``, is
set by the rounding for the weights whose gradient lies within rounding of zero. Its one-process run is also trained
in float64 (exact by comparison), and its tolerance is ``2 * max |w1 - w1(float64)|``: two runs as accurate as the
one-process float32 run lie that close to each other (triangle inequality through the float64 weights).

JPR's key biases (the pointer's ``key_head.bias`` and the key third of each decoder attention's ``in_proj_bias``)
add the same amount to every logit of a softmax row, so the model's output does not depend on them and their true
gradient is zero; Adam trains them on the rounding noise they get instead, in steps as large as the learning rate.
They are compared apart (printed, not held to the tolerance), and every other JPR weight is held to ``--atol``.

    python experiments/distributed_check.py --out /tmp/distributed_check
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

TRAINERS = ('AMERTrainer', 'JPRTrainer', 'DiffRetrieverTrainer', 'BiEncoderTrainer')
WORDS = ['who', 'won', 'the', 'cup', 'in', 'year', 'which', 'city', 'cats', 'heart', 'disease', 'protein', 'dogs',
         'brazil', 'france', 'italy']


def tiny_bert(path: Path) -> Path:
    """A random 2-layer BERT without dropout (so every process computes the same), with a masked-LM head and a
    word-level tokenizer."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import BertConfig, BertForMaskedLM, PreTrainedTokenizerFast
    vocab = {w: i for i, w in enumerate(['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'] + WORDS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token='[UNK]'))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    torch.manual_seed(0)
    BertForMaskedLM(BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=64, max_position_embeddings=128, hidden_dropout_prob=0.,
                               attention_probs_dropout_prob=0.)).save_pretrained(path)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token='[PAD]', unk_token='[UNK]', cls_token='[CLS]',
                            sep_token='[SEP]', mask_token='[MASK]').save_pretrained(path)
    return path


def texts(count: int, length: int, seed: int):
    rng = np.random.default_rng(seed)
    return [' '.join(rng.choice(WORDS, length)) + f' {i}' for i in range(count)]


def question_frames(queries, positives, negatives=None):
    """``(results, qrels, texts)``: question i's relevant passage p{i} and, where given, a first stage that ranks
    its hard negative n{i} above it."""
    import pandas as pd
    qids = [str(i) for i in range(len(queries))]
    qrels = pd.DataFrame({'qid': qids, 'docno': [f'p{i}' for i in qids], 'label': 1})
    texts = {f'p{i}': t for i, t in zip(qids, positives)}
    if negatives is None:
        return pd.DataFrame({'qid': qids, 'query': queries}), qrels, texts
    texts.update({f'n{i}': t for i, t in zip(qids, negatives)})
    results = pd.DataFrame([{'qid': i, 'query': q, 'docno': d, 'rank': r} for i, q in zip(qids, queries)
                            for d, r in ((f'n{i}', 0), (f'p{i}', 1))])
    return results, qrels, texts


def train(trainer: str, bert: Path, out: Path, float64: bool = False) -> dict:
    """Trains a tiny model with ``trainer`` (DiffRetrieverTrainer: in float64 if asked); returns its weights (by
    parameter name) and the training's wall time."""
    import torch
    torch.manual_seed(0)
    start = time.perf_counter()
    if trainer == 'AMERTrainer':
        from transformers import LlamaConfig
        from pyterrier_multiquery.amer import AMERModel, AMERTrainer
        from pyterrier_multiquery.experiment.amer_task import make_task
        config = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
        model = AMERModel.from_backbone(config, doc_dim=8, num_vectors=2, lora=False)
        task = make_task('multi', 'linear', dim=8, train_size=16, test_size=1, negatives=16, seed=0)
        AMERTrainer(model, epochs=2, batch_size=8, negatives=8, learning_rate=1e-2, verbose=False).fit_vectors(
            task.train_queries, list(task.train_targets), task.corpus)
        weights = model.state_dict()
    elif trainer == 'JPRTrainer':
        import pandas as pd
        from pyterrier_multiquery.jpr import JPRModel, JPRTrainer
        model = JPRModel(str(bert), decoder_layers=1, decoder_heads=2, decoder_dropout=0.)
        rng = np.random.default_rng(0)
        results, qrels = [], []   # 16 questions of 6 candidates, each supporting its own answer with chance 0.4
        for i, question in enumerate(texts(16, 3, 100)):
            for j, text in enumerate(texts(6, 4, i)):
                results.append({'qid': str(i), 'query': question, 'docno': f'{i}-{j}', 'text': text, 'score': 6. - j})
                if rng.random() < .4:
                    qrels.append({'qid': str(i), 'docno': f'{i}-{j}', 'label': 1, 'iteration': str(j)})
        JPRTrainer(model, num_candidates=6, k=3, epochs=2, batch_size=8, train_candidates=4, learning_rate=1e-2,
                   verbose=False).fit(pd.DataFrame(results), pd.DataFrame(qrels))
        weights = {k: v for k, v in model.state_dict().items() if not k.startswith('passages.')}
    elif trainer == 'DiffRetrieverTrainer':
        from pyterrier_multiquery.diffretriever import DiffRetriever, DiffRetrieverTrainer
        encoder = DiffRetriever.from_pretrained(str(bert), k_query=2, k_doc=2, vectors='masks', device='cpu')
        encoder.backbone.model.to(torch.float64 if float64 else torch.float32)
        results, qrels, passages = question_frames(texts(16, 3, 1), texts(16, 6, 2), texts(16, 6, 3))
        DiffRetrieverTrainer(encoder, passages, lora=False, epochs=2, batch_size=8, learning_rate=1e-3,
                             verbose=False).fit(results, qrels)
        weights = encoder.backbone.model.state_dict()
    else:
        from sentence_transformers import SentenceTransformer
        from pyterrier_multiquery.training.bi_encoder import BiEncoderTrainer
        results, qrels, passages = question_frames(texts(16, 3, 4), texts(16, 6, 5))
        trainer = BiEncoderTrainer(bert, passages, hard_negatives=0, epochs=2, batch_size=8, learning_rate=1e-3,
                                   verbose=False)
        trainer.fit(results, qrels)
        trainer.save(out / 'bi_encoder')
        weights = SentenceTransformer(str(out / 'bi_encoder'), device='cpu').state_dict()
    return {'weights': {k: v.detach().float().cpu().numpy() for k, v in weights.items()},
            'seconds': time.perf_counter() - start}


def worker(bert: Path, out: Path) -> None:
    """Trains with every trainer in this process (one of several under ``accelerate launch``); the main process
    writes ``<trainer>.npz`` and ``seconds.json`` to ``out``, and a single process also the float64 reference
    ``DiffRetrieverTrainer.float64.npz``."""
    from accelerate import PartialState
    out.mkdir(parents=True, exist_ok=True)
    seconds = {}
    for trainer in TRAINERS:
        result = train(trainer, bert, out)
        seconds[trainer] = result['seconds']
        if PartialState().is_main_process:
            np.savez(out / f'{trainer}.npz', **result['weights'])
    if PartialState().num_processes == 1:
        exact = train('DiffRetrieverTrainer', bert, out, float64=True)
        np.savez(out / 'DiffRetrieverTrainer.float64.npz', **exact['weights'])
    if PartialState().is_main_process:
        (out / 'seconds.json').write_text(json.dumps({'processes': PartialState().num_processes, **seconds}))


def run(command, out: Path, **env) -> float:
    start = time.perf_counter()
    # the package of this checkout, whichever one is installed
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1', 'TOKENIZERS_PARALLELISM': 'false',
           'PYTHONPATH': os.pathsep.join([root] + [p for p in [os.environ.get('PYTHONPATH')] if p]), **env}
    subprocess.run(command + ['--worker', str(out)], check=True, env=env)
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out', type=Path, required=True, help='folder for the tiny backbone and trained weights')
    parser.add_argument('--processes', type=int, default=2)
    parser.add_argument('--atol', type=float, default=1e-5)
    parser.add_argument('--worker', type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    bert = args.out / 'bert'
    if args.worker:
        worker(bert, args.worker)
        return 0
    tiny_bert(bert)
    script = [str(Path(__file__).resolve()), '--out', str(args.out)]
    one = run([sys.executable] + script, args.out / 'one')
    # `accelerate launch --cpu` starts several processes only through mpirun; torchrun's launcher (--multi_gpu)
    # with ACCELERATE_USE_CPU starts them on the CPU, with gloo
    launched = run([sys.executable, '-m', 'accelerate.commands.launch', '--multi_gpu', '--num_processes',
                    str(args.processes), '--num_machines', '1', '--mixed_precision', 'no', '--dynamo_backend', 'no']
                   + script, args.out / 'launched', ACCELERATE_USE_CPU='true')
    times = {name: json.loads((args.out / name / 'seconds.json').read_text()) for name in ('one', 'launched')}
    if times['launched']['processes'] != args.processes:
        raise RuntimeError(f'accelerate launch ran {times["launched"]["processes"]} processes, not {args.processes}')
    print(f'{"trainer":<18} {"max |w1 - wN|":>14} {"tolerance":>10} {"1 process s":>12} {"N processes s":>14}   '
          f'(N = {args.processes})')
    failed = False
    for trainer in TRAINERS:
        a, b = np.load(args.out / 'one' / f'{trainer}.npz'), np.load(args.out / 'launched' / f'{trainer}.npz')
        if sorted(a.files) != sorted(b.files):
            raise ValueError(f'{trainer}: the runs saved different parameters')
        inert = inert_parameters(a) if trainer == 'JPRTrainer' else {}
        diff = largest_difference(a, b, inert)
        tolerance = args.atol
        if trainer == 'DiffRetrieverTrainer':
            exact = np.load(args.out / 'one' / f'{trainer}.float64.npz')
            tolerance = max(tolerance, 2 * largest_difference(a, exact))
        failed |= diff > tolerance
        print(f'{trainer:<18} {diff:>14.2e} {tolerance:>10.2e} {times["one"][trainer]:>12.1f} '
              f'{times["launched"][trainer]:>14.1f}')
        if inert:
            print(f'  {trainer}: its key biases, which its output does not depend on, differ by up to '
                  f'{largest_difference(a, b, only=inert):.2e} (not held to the tolerance)')
    print(f'whole runs with start-up: 1 process {one:.1f} s, {args.processes} processes {launched:.1f} s')
    return int(failed)


def inert_parameters(weights) -> dict:
    """JPR's key biases, by parameter name: a boolean mask of the entries that shift a whole softmax row."""
    inert = {}
    for name in weights.files:
        if name == 'key_head.bias':
            inert[name] = np.ones(weights[name].shape, dtype=bool)
        elif name.startswith('decoder.') and name.endswith('in_proj_bias'):
            mask = np.zeros(weights[name].shape, dtype=bool)
            third = len(mask) // 3
            mask[third:2 * third] = True
            inert[name] = mask
    return inert


def largest_difference(a, b, inert: dict = None, only: dict = None) -> float:
    """The largest absolute difference of the weights ``a`` and ``b``: outside the ``inert`` entries, or over the
    ``only`` entries."""
    largest = 0.
    for name in (only or a.files):
        diff = np.abs(a[name].astype(np.float64) - b[name])
        if only:
            diff = diff[only[name]]
        elif inert and name in inert:
            diff = diff[~inert[name]]
        largest = max(largest, float(diff.max(initial=0.)))
    return largest


if __name__ == '__main__':
    sys.exit(main())
