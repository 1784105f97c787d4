"""JPR and IndepPR as PyTerrier rerankers."""
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence, Union

import numpy as np
import pandas as pd
import pyterrier as pt

if TYPE_CHECKING:
    from pyterrier_multiquery.jpr.model import JPRModel

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery._results import by_query_and_score, check_results
from pyterrier_multiquery._transformer import DerivedIdentity
from pyterrier_multiquery.jpr.decoding import Decoded, independent_decode, seq_decode, tree_decode

DECODERS = ('tree', 'seq', 'independent')


def index_order(qid: str, count: int, seed: int = 0) -> np.ndarray:
    """The random order in which a query's ``count`` candidates get their index numbers (fixed by qid and seed)."""
    return np.random.default_rng([seed, zlib.crc32(str(qid).encode())]).permutation(count)


class JPR(DerivedIdentity, pt.Transformer):
    """Joint passage reranking: picks ``k`` of each query's top ``num_candidates`` passages one after another.

    Input: a result frame with ``query``, ``text`` and ``score``. Output: the chosen passages in selection order,
    scores ``-rank`` (so they keep that order), and ``decode_depth``, the depth of the search (the tree's longest
    sequence for TreeDecode, ``k`` for SeqDecode, 1 for the independent top-k). Candidates get their index
    numbers in a random order seeded by the qid, as in training; a model with a first-stage prior also gets each
    candidate's rank by input score, so an untrained one returns the input order.
    """
    schematic = {'label': 'JPR'}

    def __init__(self, model: Union[str, Path, 'JPRModel'], *, k: int = 10, num_candidates: int = 20,
                 decode: str = 'tree', beta: float = 1.0, seed: int = 0, device: Optional[str] = None,
                 state_cache: Optional[Union[str, Path]] = None, append_rest: bool = False, verbose: bool = False):
        """
        Args:
            model: A trained :class:`~pyterrier_multiquery.jpr.model.JPRModel` or the folder it was saved to.
            k: Passages chosen per query.
            num_candidates: Top input passages per query the model chooses from (``|B|``).
            decode: ``'tree'`` (TreeDecode), ``'seq'`` (SeqDecode) or ``'independent'`` (top k of the first step).
            beta: TreeDecode's length-penalty exponent.
            seed: Seed of the index-number order.
            device: Torch device (default: CUDA when available).
            state_cache: A folder where a frozen encoder keeps the candidates' states across runs.
            append_rest: Whether the input's other passages follow the ``k`` chosen ones, in input order (so
                measures deeper than ``k`` see the first stage's ranking there).
            verbose: Whether to show a progress bar over queries.
        """
        if decode not in DECODERS:
            raise ValueError(f'unknown decode {decode!r}; expected one of {DECODERS}')
        if k < 1 or num_candidates < 1:
            raise ValueError(f'k and num_candidates must be positive, got {k} and {num_candidates}')
        if isinstance(model, (str, Path)):
            from pyterrier_multiquery.jpr.model import JPRModel
            model = JPRModel.from_pretrained(model)
        max_steps = model.positions.num_embeddings - 1
        if decode != 'independent' and k > max_steps + 1:
            raise ValueError(f'k={k} passages take {k - 1} decoder steps after the first; this model decodes at most '
                             f'max_steps={max_steps}')
        from pyterrier_multiquery._device import resolve_device
        self.model = model.to(resolve_device(device)).eval()
        self.k = k
        self.num_candidates = num_candidates
        self.decode = decode
        self.beta = beta
        self.seed = seed
        self.device = device
        self.state_cache = state_cache
        self.append_rest = append_rest
        self.verbose = verbose

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        """Reranks each query's top ``num_candidates`` passages into the ``k`` chosen ones."""
        pt.validate.result_frame(inp, extra_columns=['query', 'text', 'score'])
        check_results(inp, 'JPR')
        full = by_query_and_score(inp)
        inp = full.groupby('qid', sort=False).head(self.num_candidates)
        rest = dict(iter(full.groupby('qid', sort=False))) if self.append_rest else {}
        groups = inp.groupby('qid', sort=False)
        if self.verbose:
            groups = pt.tqdm(groups, desc=repr(self), unit='q')
        out = []
        for qid, frame in groups:
            order = index_order(qid, len(frame), self.seed)
            decoded = self.rank(frame['query'].iloc[0], frame['text'].iloc[order].tolist(), order)
            chosen = frame.iloc[order[decoded.passages]]
            if self.append_rest:
                chosen = pd.concat([chosen, rest[qid][~rest[qid]['docno'].isin(set(chosen['docno']))]])
            out.append(chosen.assign(decode_depth=decoded.depth))
        out = pd.concat(out, ignore_index=True) if out else inp.iloc[:0].assign(decode_depth=pd.Series(dtype=int))
        out = out.assign(rank=out.groupby('qid').cumcount())
        return out.assign(score=-out['rank'].astype(float))

    def rank(self, question: str, passages: Sequence[str], ranks: Optional[Sequence[int]] = None) -> Decoded:
        """The decoded selection for one question over ``passages`` (positions in index order).

        Args:
            question: The question.
            passages: The candidates in index order.
            ranks: Each candidate's first-stage rank from 0 (needed by a model with a prior).
        """
        with requires('dense'):
            import torch
        self.model.passages.state_cache = self.state_cache  # set per call: rerankers may share one model
        with torch.no_grad():
            memory = self.model.passages(question, list(passages)).unsqueeze(0)
            if ranks is not None:
                ranks = torch.as_tensor(np.asarray(ranks), dtype=torch.long, device=memory.device).view(1, -1)

            def log_probs(prefix):
                prefix = torch.tensor(list(prefix), dtype=torch.long, device=memory.device).view(1, len(prefix))
                return self.model(memory, prefix, ranks=ranks)[0, -1].float().cpu().numpy()

            if self.decode == 'tree':
                return tree_decode(log_probs, self.k, self.beta)
            if self.decode == 'seq':
                return seq_decode(log_probs, self.k)
            return independent_decode(log_probs, self.k)

    def fuse_rank_cutoff(self, k: int) -> Optional['JPR']:
        """``self % k``: the first ``k`` selections are the same whatever ``k`` the decoder runs to. With
        ``append_rest``, a cutoff at or past ``k`` cuts the appended passages and stays a cutoff (None)."""
        if k >= self.k:
            return None if self.append_rest else self
        return pt.inspect.transformer_apply_attributes(self, k=k, append_rest=False)

    def __repr__(self):  # the derived one would print the whole network
        decode = '' if isinstance(self, IndepPR) else f', decode={self.decode!r}'
        rest = ', append_rest=True' if self.append_rest else ''
        return (f'{type(self).__name__}(k={self.k!r}, num_candidates={self.num_candidates!r}{decode}, '
                f'beta={self.beta!r}, seed={self.seed!r}{rest})')


class IndepPR(JPR):
    """The IndepPR baseline: the top ``k`` of a single decoding step, scored independently of each other."""
    schematic = {'label': 'IndepPR'}

    def __init__(self, model, *, k: int = 10, num_candidates: int = 20, beta: float = 1.0, seed: int = 0,
                 device: Optional[str] = None, state_cache: Optional[Union[str, Path]] = None,
                 append_rest: bool = False, verbose: bool = False):
        """Args as :class:`JPR`, decoding fixed to ``'independent'``."""
        super().__init__(model, k=k, num_candidates=num_candidates, decode='independent', beta=beta, seed=seed,
                         device=device, state_cache=state_cache, append_rest=append_rest, verbose=verbose)
