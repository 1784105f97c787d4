"""Choosing the torch device and the CPU threads of torch and FAISS."""
from contextlib import contextmanager
from typing import Iterator, Optional

from pyterrier_multiquery._extras import requires


def resolve_device(device: Optional[str] = None) -> str:
    """``device``, or CUDA when torch sees a GPU and the CPU otherwise (also when torch is not installed: the
    component that needs it then says which extra installs it)."""
    if device is not None:
        return device
    try:
        import torch
    except ModuleNotFoundError:
        return 'cpu'
    return 'cuda' if torch.cuda.is_available() else 'cpu'


def fits_on_device(nbytes: int, device: str) -> bool:
    """Whether stored vectors of ``nbytes`` stay resident on ``device`` between searches: on a GPU whose free memory
    is at least twice their size (the other half left to the searches' working memory), never on the CPU, which
    reads them from the memory-mapped file as the page cache allows."""
    if not device.startswith('cuda'):
        return False
    with requires('dense'):
        import torch
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    return 2 * nbytes <= free


@contextmanager
def cpu_threads(threads: Optional[int], *, with_faiss: bool = False) -> Iterator[int]:
    """Runs the block with torch, and FAISS's OpenMP with ``with_faiss``, on ``threads`` CPU threads; both get back
    the counts they had when the block ends.

    Args:
        threads: The thread count; None takes torch's current count (``torch.get_num_threads()``: the physical
            cores, or ``OMP_NUM_THREADS`` where set), which FAISS then gets too.
        with_faiss: Whether FAISS searches or builds in the block (FAISS is imported and set only then).

    Yields:
        The thread count in force.
    """
    with requires('dense'):
        import torch
    torch_before = torch.get_num_threads()
    count = threads or torch_before
    faiss, faiss_before = None, None
    if with_faiss:
        with requires('dense'):
            import faiss
        faiss_before = faiss.omp_get_max_threads()
        faiss.omp_set_num_threads(count)
    torch.set_num_threads(count)
    try:
        yield count
    finally:
        torch.set_num_threads(torch_before)
        if faiss is not None:
            faiss.omp_set_num_threads(faiss_before)


def check_threads(threads: Optional[int]) -> Optional[int]:
    """``threads``, checked: None or a positive integer."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be None (torch's current count) or a positive integer, got {threads!r}")
    return threads
