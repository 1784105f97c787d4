"""The index searched by Ray actors, each holding some of its shards memory-mapped, and a sharded index built by Ray
tasks, one shard each (the ``ray`` extra). See docs/distributed.md."""
import os
import time
from typing import Callable, List, Optional

import numpy as np
import pyterrier as pt

from pyterrier_multiquery._device import cpu_threads
from pyterrier_multiquery._extras import requires
from pyterrier_multiquery.index.errors import CorruptIndexError, ShardUnavailableError
from pyterrier_multiquery.index.searches import Searches
from pyterrier_multiquery.index.shardwise import ShardSearcher

with requires('ray'):
    import ray
with requires('dense'):
    import torch


class ShardActor:
    """What a Ray actor holds: the :class:`~.shardwise.ShardSearcher` of each of its shards, over the shard's
    memory-mapped files on the actor's node."""

    def __init__(self, shards: List[tuple]):
        """
        Args:
            shards: ``(kind, path, build_id, first)`` of each shard: its class (:class:`MultiVectorIndex`), its
                folder, its build id where the driver opened it, and the docid of its first document.

        Raises:
            CorruptIndexError: If a shard on this node is not the one the sharded index was built with.
        """
        self.searchers = []
        for kind, path, build_id, first in shards:
            shard = kind(path, verbose=False)
            if shard.payload()[0]['build_id'] != build_id:
                raise CorruptIndexError(f'shard {path!r} on the node {os.uname().nodename} is not the shard the '
                                        'sharded index was built with (its build id differs): copy it again')
            self.searchers.append(ShardSearcher(shard, first, build_id))

    def ready(self) -> int:
        """The actor's process id, once its shards are open."""
        return os.getpid()

    def call(self, method: str, arguments: tuple, shard_args: Optional[list], threads: int) -> list:
        """``ShardSearcher.<method>(*args, **kwargs)`` of each of the actor's shards, ``arguments`` being ``(args,
        kwargs)`` (as :meth:`~.shardwise.LocalShards.map`), torch and FAISS on ``threads`` CPU threads."""
        args, kwargs = arguments
        with cpu_threads(threads, with_faiss=True):
            return [self.searched(searcher, method, () if shard_args is None else (shard_args[i],), args, kwargs)
                    for i, searcher in enumerate(self.searchers)]

    def searched(self, searcher: ShardSearcher, method: str, shard_args: tuple, args: tuple, kwargs: dict):
        """One shard's part of :meth:`call`."""
        return getattr(searcher, method)(*shard_args, *args, **kwargs)


class RayIndex(Searches):
    """A :class:`MultiVectorIndex` or :class:`ShardedMultiVectorIndex` searched by Ray actors.

    Each actor holds a group of consecutive shards, memory-mapped on its node; a query batch fans out to all of
    them and each returns its shards' top candidates with exact scores, which this process merges. Every retriever
    of the index is offered (``retriever``, exact or approximate, ``scorer``, ``mean_retriever``,
    ``multiquery_retriever``): they run the same code per shard as in one process (:mod:`~.shardwise`), so their
    rankings and scores are the one-process index's exactly.

    An actor that dies during a call is restarted by Ray, and its part of the batch is sent again, up to ``retries``
    times; past that, :class:`ShardUnavailableError` names its shards. A search never returns a partial ranking.
    """

    def __init__(self, index, *, num_actors: Optional[int] = None, address: Optional[str] = None, num_cpus: float = 1,
                 retries: int = 2, actor_class: type = ShardActor):
        """
        Args:
            index: The :class:`MultiVectorIndex` or :class:`ShardedMultiVectorIndex`. This process opens it (to check
                it and read where each shard's documents start); the actors open their shards at the same paths on
                their nodes (shared storage, or copies).
            num_actors: Actors, each holding a group of consecutive shards (default: one per shard).
            address: The Ray cluster to join (``'auto'``, ``'ray://host:10001'``); None starts a local Ray instance.
                Either way, a Ray already initialised in this process is used as it is.
            num_cpus: CPUs Ray reserves for each actor (fractions allowed). The actors compute on as many threads
                as the retriever would in this process (its ``threads``, by default torch's count here), since
                the CPU's matrix products round by how they split the work: so the scores are the same bit for bit.
            retries: How often an actor's part of a batch is sent again after the actor died.
            actor_class: What each actor is: :class:`ShardActor` or a subclass of it (one that logs, or injects
                faults).

        Raises:
            ValueError: If ``num_actors`` is not between 1 and the number of shards.
            TypeError: If ``actor_class`` is not :class:`ShardActor` or a subclass (before Ray is started).
            CorruptIndexError: If a shard on this node is damaged or was rebuilt after the sharded index was built
                (named).
            FileNotFoundError: If the index or a shard is missing on this node (named).
            ray.exceptions.ActorDiedError: If an actor cannot open its shards on its node: Ray passes the actor's
                error (a CorruptIndexError or FileNotFoundError naming the shard) as the message, not the exception.
        """
        shards = index.shards()
        num_actors = len(shards) if num_actors is None else num_actors
        if isinstance(num_actors, bool) or not isinstance(num_actors, int) or not 1 <= num_actors <= len(shards):
            raise ValueError(f'num_actors must be an integer from 1 to the {len(shards)} shards of the index, '
                             f'got {num_actors!r}')
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f'retries must be a non-negative integer, got {retries!r}')
        self.index = index
        self.path = index.path
        self.retries = retries
        if not (isinstance(actor_class, type) and issubclass(actor_class, ShardActor)):
            raise TypeError(f'actor_class must be ShardActor or a subclass of it, got {actor_class!r}')
        if not ray.is_initialized():
            ray.init(address=address)
        self.actor = ray.remote(actor_class).options(num_cpus=num_cpus, max_restarts=-1)
        self._start(shards, num_actors)

    def _start(self, shards: list, num_actors: int) -> None:
        """Starts ``num_actors`` actors over the index's ``shards`` (consecutive groups of them)."""
        self.meta = self.index.payload()[0]
        self.num_actors = num_actors
        self.shard_paths = [shard.path for shard in shards]
        self.counts = [len(shard) for shard in shards]
        self.firsts = [int(first) for first in np.cumsum([0] + self.counts[:-1])]
        self.groups = [group.tolist() for group in np.array_split(np.arange(len(shards)), num_actors)]
        self.actors = [self.actor.remote([(type(shards[i]), str(shards[i].path), shards[i].payload()[0]['build_id'],
                                           self.firsts[i]) for i in group]) for group in self.groups]
        self.pids = ray.get([a.ready.remote() for a in self.actors])
        self.docnos = _RemoteDocnos(self)

    def add_documents(self, inp) -> 'RayIndex':
        """Adds documents to the index (its own :meth:`~.sharded.ShardedMultiVectorIndex.add_documents`: a new
        shard, or a single index written again) and starts the actors again over the updated shards (as many as
        before, at most one a shard); searches after it see the new documents, rankings as a fresh build's."""
        self.index.add_documents(inp)
        return self._restarted()

    def remove_documents(self, docnos) -> 'RayIndex':
        """Removes documents by docno from the index (its own ``remove_documents``) and starts the actors again
        over the updated shards."""
        self.index.remove_documents(docnos)
        return self._restarted()

    def _restarted(self) -> 'RayIndex':
        shards = self.index.shards()
        self.close()
        self._start(shards, min(self.num_actors, len(shards)))
        return self

    def payload(self):
        """The index's ``(meta, vectors, offsets, docnos)`` in this process (as :meth:`MultiVectorIndex.payload`)."""
        return self.index.payload()

    def searchers(self) -> 'RayIndex':
        """The shards' searchers: the actors, through :meth:`map`."""
        return self

    def __len__(self):
        return self.meta['doc_count']

    def bytes_per_vector(self) -> int:
        """Bytes that one stored vector takes on disk."""
        return self.meta['dim'] * (4 if self.meta['dtype'] == 'float32' else 2)

    def map(self, method: str, *args, shard_args: Optional[list] = None, **kwargs) -> list:
        """``ShardSearcher.<method>(*args, **kwargs)`` of every shard, by the actors at once, in document order (as
        :meth:`~.shardwise.LocalShards.map`).

        Raises:
            ShardUnavailableError: If an actor died more than ``retries`` times during the call (its shards named).
        """
        arguments = ray.put((args, kwargs))  # stored once, read by each actor
        threads = torch.get_num_threads()  # the retriever's, set around its search

        def submit(a):
            own = None if shard_args is None else [shard_args[i] for i in self.groups[a]]
            return self.actors[a].call.remote(method, arguments, own, threads)

        pending = {submit(a): a for a in range(len(self.actors))}
        attempts = [1] * len(self.actors)
        results = [None] * len(self.actors)
        while pending:
            [done], _ = ray.wait(list(pending), num_returns=1)
            a = pending.pop(done)
            try:
                results[a] = ray.get(done)
            except ray.exceptions.RayActorError as e:
                if attempts[a] > self.retries:
                    raise ShardUnavailableError(
                        f'the Ray actor holding shard {self._shards_of(a)} died {attempts[a]} times during one '
                        f'{method} call (retries={self.retries}); no results are returned: {e}') from e
                self._await_restart(a)
                attempts[a] += 1
                pending[submit(a)] = a
        return [result for group in results for result in group]

    def _await_restart(self, a: int, timeout: float = 300) -> None:
        """Waits until Ray has restarted actor ``a`` (its process started again and its shards opened)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                ray.get(self.actors[a].ready.remote())
                return
            except ray.exceptions.ActorUnavailableError as e:  # restarting
                if time.monotonic() > deadline:
                    raise ShardUnavailableError(f'the Ray actor holding shard {self._shards_of(a)} did not restart '
                                                f'within {timeout:.0f} s: {e}') from e
                time.sleep(0.1)
            except ray.exceptions.RayActorError as e:  # ended for good
                raise ShardUnavailableError(f'the Ray actor holding shard {self._shards_of(a)} cannot be restarted: '
                                            f'{e}') from e

    def _shards_of(self, a: int) -> str:
        return ', '.join(f'{i} ({str(self.shard_paths[i])!r})' for i in self.groups[a])

    def close(self) -> None:
        """Ends the actors (the index cannot search afterwards)."""
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []

    def __repr__(self):
        return f'{self.index!r}.ray(num_actors={self.num_actors})'


class _RemoteDocnos:
    """The docnos of a :class:`RayIndex`: ``fwd[docids]``, each looked up by the actor holding its shard."""

    def __init__(self, index: RayIndex):
        self.index = index
        self.fwd = self

    def __getitem__(self, docids) -> np.ndarray:
        docids = np.asarray(docids, dtype=np.int64)
        shard = np.searchsorted(self.index.firsts, docids, side='right') - 1
        parts = self.index.map('docnos', shard_args=[docids[shard == i] - first
                                                     for i, first in enumerate(self.index.firsts)])
        out = np.empty(len(docids), dtype=object)
        for i, names in enumerate(parts):
            out[shard == i] = names
        return out.astype(str)


def run_tasks(function: Callable, arguments: List[tuple], names: List[str], *, num_cpus: float = 1,
              address: Optional[str] = None, verbose: bool = True) -> list:
    """Runs ``function(*args)`` for each of ``arguments`` as Ray tasks at once, all or nothing.

    At the first failure (or an interruption here) the other tasks are cancelled, and waited for until none runs,
    so that none writes anything afterwards; then the error is raised, with a note naming the task. The cancellation
    interrupts a task (a ``KeyboardInterrupt`` in it) rather than killing its worker: a killed worker could take a
    later call's task down with it (a ``WorkerCrashedError``), and an interrupted task's result is only ready once
    it has stopped.

    Args:
        function: A module-level function (Ray sends it to the nodes by reference).
        arguments: The arguments of each task.
        names: The name of each task, for the note and the progress bar.
        num_cpus: CPUs Ray reserves for each task.
        address: The Ray cluster to join, as :class:`RayIndex`.
        verbose: Whether to show a progress bar.

    Returns:
        The tasks' results, in order.
    """
    if not ray.is_initialized():
        ray.init(address=address)
    task = ray.remote(function).options(num_cpus=num_cpus, max_retries=0)
    refs = [task.remote(*args) for args in arguments]
    pending, results = dict(zip(refs, range(len(refs)))), {}
    progress = pt.tqdm(total=len(refs), desc='Ray tasks', unit='task', disable=not verbose)
    try:
        while pending:
            [done], _ = ray.wait(list(pending), num_returns=1)
            i = pending.pop(done)
            try:
                results[i] = ray.get(done)
            except ray.exceptions.RayTaskError as e:
                error = e.cause if e.cause is not None else e
                if hasattr(error, 'add_note'):  # Python 3.11 on
                    error.add_note(f'in the Ray task {names[i]}')
                raise error from None
            progress.update()
    except BaseException:
        for ref in pending:
            ray.cancel(ref)
        ray.wait(list(pending), num_returns=len(pending))
        raise
    finally:
        progress.close()
    return [results[i] for i in range(len(refs))]
