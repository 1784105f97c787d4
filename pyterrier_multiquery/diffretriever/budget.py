"""The (K_query, K_doc) budget analysis: the grid, selection on training data, and the per-query oracle."""
from typing import Callable, Dict, Iterable, Mapping

import numpy as np
import pandas as pd

from pyterrier_multiquery._extras import requires

#: The paper's grid of budgets for each side.
BUDGETS = (1, 2, 4, 8, 16)


def budget_grid(evaluate: Callable[[int, int], Mapping[str, float]], budgets: Iterable[int] = BUDGETS) -> pd.DataFrame:
    """Per-query effectiveness of every ``(k_query, k_doc)`` pair.

    Args:
        evaluate: ``evaluate(k_query, k_doc)`` returns one measure value per qid.
        budgets: The values of each side's K.

    Returns:
        A long frame with columns ``k_query``, ``k_doc``, ``qid``, ``value``.
    """
    budgets = list(budgets)
    frames = []
    for kq in budgets:
        for kd in budgets:
            per_query = pd.Series(evaluate(kq, kd), dtype=float)
            frames.append(pd.DataFrame({'k_query': kq, 'k_doc': kd, 'qid': per_query.index.astype(str),
                                        'value': per_query.to_numpy()}))
    return pd.concat(frames, ignore_index=True)


def grid_means(grid: pd.DataFrame) -> pd.DataFrame:
    """The mean over queries as a ``k_query`` x ``k_doc`` table (what the heatmap shows)."""
    return grid.pivot_table(index='k_query', columns='k_doc', values='value', aggfunc='mean')


def select_budget(grid: pd.DataFrame) -> Dict[str, int]:
    """The ``(k_query, k_doc)`` with the best mean (on training queries); ties go to the smaller total budget."""
    means = grid.groupby(['k_query', 'k_doc'])['value'].mean().reset_index()
    means['total'] = means['k_query'] + means['k_doc']
    best = means.sort_values(['value', 'total', 'k_query'], ascending=[False, True, True], kind='stable').iloc[0]
    return {'k_query': int(best['k_query']), 'k_doc': int(best['k_doc'])}


def oracle_budgets(grid: pd.DataFrame) -> pd.DataFrame:
    """Each query's best pair (ties to the smaller total budget): columns ``qid``, ``k_query``, ``k_doc``, ``value``."""
    ordered = grid.assign(total=grid['k_query'] + grid['k_doc']).sort_values(
        ['qid', 'value', 'total', 'k_query'], ascending=[True, False, True, True], kind='stable')
    return ordered.groupby('qid', sort=True).head(1)[['qid', 'k_query', 'k_doc', 'value']].reset_index(drop=True)


def token_entropy(logits) -> np.ndarray:
    """Mean over positions of the entropy (nats) of the softmax of ``(B, k, V)`` logits, per text."""
    with requires('dense'):
        import torch
    logp = torch.log_softmax(logits.float(), dim=-1)
    return (-(logp.exp() * logp).sum(-1)).mean(-1).cpu().numpy()


def query_features(encoder, topics: pd.DataFrame) -> pd.DataFrame:
    """Query length (tokens) and mean token entropy at the query's mask positions, by qid."""
    with requires('dense'):
        import torch
    rows = []
    tok = encoder.backbone.tokenizer
    with torch.no_grad():
        for start in range(0, len(topics), encoder.batch_size):
            part = topics.iloc[start:start + encoder.batch_size]
            input_ids, attention, positions, _, _ = encoder.batch(part['query'].tolist(), encoder.k_query, 'query')
            _, logits = encoder.represent(input_ids, attention, positions)
            for qid, query, entropy in zip(part['qid'], part['query'], token_entropy(logits)):
                rows.append({'qid': str(qid), 'length': len(tok(query, add_special_tokens=False)['input_ids']),
                             'entropy': float(entropy)})
    return pd.DataFrame(rows)


def oracle_correlations(oracle: pd.DataFrame, features: pd.DataFrame) -> pd.DataFrame:
    """Spearman correlation of each query's oracle budget (``k_query``, ``k_doc``, their sum) with its length and
    token entropy: rows are budgets, columns ``feature``, ``rho``, ``p_value``."""
    from scipy.stats import spearmanr
    merged = oracle.assign(total=oracle['k_query'] + oracle['k_doc']).merge(features, on='qid')
    rows = []
    for budget in ('k_query', 'k_doc', 'total'):
        for feature in ('length', 'entropy'):
            rho, p = spearmanr(merged[budget], merged[feature])
            rows.append({'budget': budget, 'feature': feature, 'rho': float(rho), 'p_value': float(p)})
    return pd.DataFrame(rows)
