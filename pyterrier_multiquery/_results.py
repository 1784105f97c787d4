"""Result frames as rerankers take them in and give them out: checked (finite scores, each document once per
query) and ordered (queries as they first appear, each one's rows by descending score)."""
import numpy as np
import pandas as pd


def check_results(inp: pd.DataFrame, reranker: str) -> None:
    """Raises naming the first row whose score is not a finite number, or the first document listed twice for one
    query (``reranker`` names the caller in the message)."""
    scores = pd.to_numeric(inp['score'], errors='coerce').to_numpy(dtype=float)
    if not np.isfinite(scores).all():
        row = inp.iloc[int(np.argmin(np.isfinite(scores)))]
        raise ValueError(f'{reranker}: qid {row["qid"]!r}, docno {row["docno"]!r} has score {row["score"]}; '
                         'scores must be finite numbers')
    repeated = inp.duplicated(['qid', 'docno'])
    if repeated.any():
        row = inp[repeated].iloc[0]
        raise ValueError(f'{reranker}: qid {row["qid"]!r} lists docno {row["docno"]!r} more than once')


def by_query_and_score(frame: pd.DataFrame, ties: tuple = ()) -> pd.DataFrame:
    """``frame`` sorted stably by query (in order of first appearance), descending ``score``, then the ``ties``
    columns ascending."""
    position = pd.factorize(frame['qid'])[0]
    order = frame.assign(_query_position=position).sort_values(
        ['_query_position', 'score', *ties], ascending=[True, False] + [True] * len(ties), kind='stable')
    return order.drop(columns='_query_position')
