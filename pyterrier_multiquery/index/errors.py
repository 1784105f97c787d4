"""The error the index raises when its files cannot be trusted."""


class CorruptIndexError(ValueError):
    """Raised when the files of a MultiVectorIndex do not agree with each other or with ``pt_meta.json``."""


class ShardUnavailableError(RuntimeError):
    """Raised when the Ray actor holding a shard died more often during one search than it may be retried."""
