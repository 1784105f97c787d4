"""The searches an index offers, declared once: each is a method built from its transformer class, whose signature
and docstring are that class's arguments, shared by the local, sharded and Ray indexes. The classes are imported
when a method is first looked up (MaxSim's imports torch, which the core install does without)."""
import importlib
import inspect
from typing import Sequence


def search_method(name: str, cls: type, summary: str, positional: Sequence[str] = ()):
    """A method of an index returning ``cls(index, **arguments)``; ``help()`` shows ``cls``'s arguments (all but
    ``index``) with their defaults and descriptions.

    Args:
        name: The method's name.
        cls: The transformer class, whose first argument after ``self`` is the index.
        summary: The method's first docstring line.
        positional: Arguments that may also be given by position, in order.
    """
    init = inspect.signature(cls.__init__)
    self_parameter, _, *arguments = init.parameters.values()
    arguments = [p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD) if p.name in positional else p
                 for p in arguments]

    def method(self, *args, **kwargs):
        if len(args) > len(positional):
            raise TypeError(f'{method.__name__}() takes at most {len(positional)} positional arguments '
                            f'({", ".join(positional) or "none"}), got {len(args)}')
        return cls(self, **dict(zip(positional, args)), **kwargs)

    method.__name__ = method.__qualname__ = name
    method.__signature__ = init.replace(parameters=[self_parameter, *arguments], return_annotation=cls)
    method.__doc__ = f'{summary} (a :class:`~{cls.__module__}.{cls.__name__}`).\n\n{_without_index(cls)}'
    return method


def _without_index(cls: type) -> str:
    """``cls.__init__``'s docstring without the entry of its ``index`` argument."""
    lines, kept, skipping = inspect.cleandoc(cls.__init__.__doc__ or '').splitlines(), [], None
    for line in lines:
        indent = len(line) - len(line.lstrip())
        if line.lstrip().startswith('index:'):
            skipping = indent
            continue
        if skipping is not None and line.strip() and indent > skipping:
            continue
        skipping = None
        kept.append(line)
    return '\n'.join(kept)


class LazySearchMethod:
    """A :func:`search_method` whose class (``module:name``) is imported when the method is first looked up."""

    def __init__(self, name: str, cls: str, summary: str, positional: Sequence[str] = ()):
        self.name, self.cls, self.summary, self.positional = name, cls, summary, positional
        self.method = None

    def __get__(self, obj, owner=None):
        module, name = self.cls.split(':')
        method = self.method
        if method is None:
            try:
                method = self.method = search_method(self.name, getattr(importlib.import_module(module), name),
                                                     self.summary, self.positional)
            except ModuleNotFoundError:  # an extra is missing: the call names it
                def method(index, *args, **kwargs):
                    importlib.import_module(module)
                method.__name__ = self.name
        return method if obj is None else method.__get__(obj, owner)


class Searches:
    """The search methods of an index (mixed into :class:`~.core.SearchableIndex` and :class:`~.distributed.RayIndex`).
    """
    retriever = LazySearchMethod('retriever', 'pyterrier_multiquery.index.maxsim:MaxSimRetriever',
                                 'Exact MaxSim retrieval of ``query_embs`` over every document')
    ann_retriever = LazySearchMethod('ann_retriever', 'pyterrier_multiquery.index.ann_retriever:ApproxMaxSimRetriever',
                                     'Approximate MaxSim retrieval of ``query_embs``: exact MaxSim over ANN candidates')
    #: :meth:`retriever` under the name the experiments and notebooks use.
    maxsim_retriever = retriever
    scorer = LazySearchMethod('scorer', 'pyterrier_multiquery.index.maxsim:MaxSimScorer',
                              'Exact MaxSim re-scoring of a result frame with ``query_embs``')
    mean_retriever = LazySearchMethod('mean_retriever', 'pyterrier_multiquery.index.mean:MeanRetriever',
                                      "Retrieval by the mean of the query vectors and of each document's vectors")
    multiquery_retriever = LazySearchMethod('multiquery_retriever',
                                            'pyterrier_multiquery.index.multiquery:MultiQueryRetriever',
                                            'Each query vector searches on its own; their lists are merged',
                                            positional=('merge',))
