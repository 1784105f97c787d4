"""The errors the index raises when its files cannot be trusted or change under a search, and the one retry a search
makes when a rebuild replaced its index."""
import functools


class CorruptIndexError(ValueError):
    """Raised when the files of a MultiVectorIndex do not agree with each other or with ``pt_meta.json``."""


class ShardUnavailableError(RuntimeError):
    """Raised when the Ray actor holding a shard died more often during one search than it may be retried."""


class IndexReplacedError(CorruptIndexError):
    """Raised when another build replaced the index while a search read it (nothing is corrupt: search again)."""


def retried_if_replaced(transform):
    """A retriever's ``transform`` that, where a concurrent rebuild replaced the index while it searched, searches
    once more on the new build (the index reopens it) before letting :class:`IndexReplacedError` through."""
    @functools.wraps(transform)
    def searched(self, inp):
        try:
            return transform(self, inp)
        except IndexReplacedError:
            return transform(self, inp)
    return searched
