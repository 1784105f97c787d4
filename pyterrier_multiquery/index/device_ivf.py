"""The IVF candidate stage searched in torch on the search's device: for a GPU whose FAISS build has no GPU code.

FAISS's GPU indexes need a FAISS built for the card; where there is none, the IVF stage would stay on the CPU while
the rest of the search runs on the GPU. :class:`DeviceIVF` takes the centroids and the lists of the FAISS IVF index
(built and cached as any other, :func:`~.ann.load_or_build`) and searches them in torch. The stored vectors are
copied to the device once, in list order, so that a probed list is one contiguous slice (16 bits on a GPU, float32
elsewhere). A search scores each query vector against every centroid and probes its ``nprobe`` best lists. It then
gathers their members into one padded tile of query vectors and scores them with one batched product, keeping the
``k`` best. The members are scored from the stored vectors, not from the FAISS codes, so the hits are those of
FAISS's IVF-Flat search at the same ``nprobe``, whatever the FAISS storage (up to ties, and on a GPU up to the 16-bit
rounding). On a GPU the members are float16 where every stored vector's norm is below
:data:`~.grouped.FLOAT16_LIMIT`, else bfloat16 (as the exact search's groups, :func:`~.grouped.group_dtype`), and
each query vector is scaled to unit norm for the product (its ranking of the members is the same) and its scores
scaled back, so that no product leaves the 16-bit range.

Memory: the device holds the centroids and one 16-bit copy of the shard's stored vectors (2 bytes a dimension a
vector), plus a working tile of at most :data:`TILE_BYTES`.
"""
from typing import Tuple

import numpy as np

from pyterrier_multiquery._extras import requires
from pyterrier_multiquery.index.errors import CorruptIndexError
from pyterrier_multiquery.index.grouped import group_dtype

with requires('dense'):
    import torch

#: Largest tile of gathered list members (query vectors x members x dim) a search scores at once.
TILE_BYTES = 256 << 20
#: Stored vectors copied to the device at once.
COPY_ROWS = 1 << 20


def stored_dtype(device: str, max_norm: float) -> 'torch.dtype':
    """The format of the list members on ``device``, for stored vectors of norms at most ``max_norm``: 16 bits on a
    GPU (half the memory, tensor cores; :func:`~.grouped.group_dtype`), float32 elsewhere (a CPU multiplies 16-bit
    formats slowly)."""
    return group_dtype(max_norm) if str(device).startswith('cuda') else torch.float32


class DeviceIVF:
    """The lists of a FAISS IVF index, searched in torch on one device.

    Attributes:
        sizes: ``(nlist,)`` members of each list.
        order: ``(vectors,)`` the stored vector of each position of the list-ordered copy.
    """

    def __init__(self, ann, vectors: np.ndarray, device: str, max_norm: float):
        """
        Args:
            ann: A FAISS IVF index (any storage) over ``vectors``, in their order.
            vectors: ``(vectors, dim)`` the stored vectors (a memory map may be given: it is read in list order).
            device: Where the lists are kept and searched.
            max_norm: The largest norm of the stored vectors (it sets their 16-bit format on a GPU).

        Raises:
            CorruptIndexError: If the IVF lists do not hold each stored vector exactly once.
        """
        with requires('dense'):
            import faiss
        ivf = faiss.extract_index_ivf(ann)
        self.device = device
        self.nlist = ivf.nlist
        self.centroids = torch.from_numpy(ivf.quantizer.reconstruct_n(0, ivf.nlist)).to(device)
        self.sizes = np.array([ivf.invlists.list_size(i) for i in range(ivf.nlist)], dtype=np.int64)
        self.order = np.concatenate([np.zeros(0, dtype=np.int64)] + [
            faiss.rev_swig_ptr(ivf.invlists.get_ids(i), int(size)).astype(np.int64)
            for i, size in enumerate(self.sizes) if size])
        if len(self.order) != len(vectors) or \
                not np.array_equal(np.bincount(self.order, minlength=len(vectors)), np.ones(len(vectors))):
            raise CorruptIndexError(f'the IVF lists hold {len(self.order):,} entries, not each of the '
                                    f'{len(vectors):,} stored vectors once: its FAISS file is not of these vectors')
        self.members = torch.empty((len(vectors), vectors.shape[1]), dtype=stored_dtype(device, max_norm),
                                   device=device)
        for start in range(0, len(vectors), COPY_ROWS):
            rows = self.order[start:start + COPY_ROWS]
            self.members[start:start + len(rows)] = torch.from_numpy(
                np.ascontiguousarray(vectors[rows], dtype=np.float32)).to(device)
        self._starts = torch.from_numpy(np.cumsum(self.sizes) - self.sizes).to(device)
        self._sizes = torch.from_numpy(self.sizes).to(device)
        self._order = torch.from_numpy(self.order).to(device)

    def search(self, vectors: np.ndarray, k: int, nprobe: int) -> Tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest stored vectors of each query vector among the members of its ``nprobe`` nearest lists.

        Args:
            vectors: ``(n, dim)`` float32 query vectors.
            k: Stored vectors found per query vector.
            nprobe: Lists probed per query vector (at most all of them).

        Returns:
            ``(n, k)`` float32 inner products, best first (-inf where fewer than ``k`` were found) and the stored
            vectors' positions in the index (-1 there), as FAISS's ``search`` gives them.
        """
        queries = torch.from_numpy(np.ascontiguousarray(vectors, dtype=np.float32)).to(self.device)
        probes = (queries @ self.centroids.T).topk(min(nprobe, self.nlist), dim=1).indices
        norms = queries.norm(dim=1, keepdim=True)
        units = queries / torch.where(norms > 0, norms, 1)  # each vector's ranking as its own, in the 16-bit range
        ends = self._sizes[probes].cumsum(dim=1)
        width = int(ends[:, -1].max()) if len(queries) else 0
        step = max(1, TILE_BYTES // max(1, width * self.members.shape[1] * self.members.element_size()))
        found = torch.full((len(queries), k), -torch.inf, device=self.device)
        hits = torch.full((len(queries), k), -1, dtype=torch.int64, device=self.device)
        for start in range(0, len(queries), step):  # the tiles' results stay on the device: one copy back
            rows = slice(start, start + step)
            scores, positions = self._members_scored(units[rows], probes[rows], ends[rows])
            best = scores.topk(min(k, scores.shape[1]), dim=1)
            kept = torch.isfinite(best.values)  # else padding: -inf, no hit (whatever the norm, 0 included)
            found[rows, :best.values.shape[1]] = torch.where(kept, best.values * norms[rows], -torch.inf)
            hits[rows, :best.values.shape[1]] = torch.where(kept, self._order[positions.gather(1, best.indices)], -1)
        return found.cpu().numpy(), hits.cpu().numpy()

    def _members_scored(self, queries, probes, ends) -> Tuple['torch.Tensor', 'torch.Tensor']:
        """The inner products of each query vector with the members of its probed lists, padded with -inf to the
        most members a vector of the tile probes, and the members' positions in the list-ordered copy."""
        width = int(ends[:, -1].max())
        slot = torch.arange(width, device=self.device).expand(len(queries), width)
        probe = torch.searchsorted(ends, slot.contiguous(), right=True).clamp_(max=probes.shape[1] - 1)
        before = (ends - self._sizes[probes]).gather(1, probe)
        valid = slot < ends[:, -1:]
        positions = torch.where(valid, self._starts[probes].gather(1, probe) + slot - before, 0)
        products = torch.bmm(self.members[positions], queries.to(self.members.dtype)[:, :, None])[:, :, 0]
        return products.float().masked_fill_(~valid, -torch.inf), positions
