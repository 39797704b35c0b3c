"""Grouping speaker embeddings into speakers: a whole recording at once, or one window at a time as a live session
hears it.

A recording is clustered as 3D-Speaker clusters it (`speakerlab/process/cluster.py`, Apache-2.0): spectral
clustering of the windows' cosine affinities, each row pruned to its nearest neighbours, the number of speakers
read from the Laplacian's largest eigengap; then clusters of very few windows join the nearest larger one, and
speakers whose centroids are alike are merged. A fixed similarity threshold does not carry from one recording to
another (two voices on one telephone line are more alike than two across a meeting room); the eigengap adapts.
Too few windows for an eigengap to mean anything are clustered agglomeratively (average linkage on cosine
distance, stopped at the similarity that opens a new speaker live).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

ONLINE_COSINE = 0.5
"""Windows at least this similar are one speaker: a live window joins the nearest such speaker, else it opens a
new one, and a recording's clusters stop merging below it."""
ONLINE_MIN_NEW_S = 1.0
"""A window of less speech than this never opens a speaker: it joins the nearest one."""
MERGE_COSINE = 0.875
"""Two live speakers whose centroids come to be this alike are one (3D-Speaker's threshold for merging clusters):
centroids average many windows, so they are more alike than single windows of different voices."""
MIN_CLUSTER = 3
"""A cluster of fewer windows (less speech than a sentence) joins the nearest larger one: a voice that says a
sentence is a speaker."""
SPECTRAL_MIN = 10
"""Fewer windows than this are clustered agglomeratively (3D-Speaker's `cluster_line`)."""
PRUNE_KEEP = 0.02
"""Each window keeps its affinities to this share of the windows, its nearest ones (3D-Speaker's `pval`), and at
least `PRUNE_MIN` of them."""
PRUNE_MIN = 6
MAX_SPEAKERS = 10
"""The most speakers the eigengap may find in one recording."""
RECORDING_MERGE_COSINE = 0.8
"""A recording's speakers whose centroids are at least this alike are one (3D-Speaker's `mer_cos`)."""
MAX_CLUSTERED = 3000
"""Clustering's memory grows with the square of the windows (its time faster): a longer recording clusters an
evenly spaced sample of this many, and each other window joins the nearest cluster."""


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-9)


def _agglomerative(x: np.ndarray) -> np.ndarray:
    from scipy.cluster.hierarchy import fcluster, linkage

    return fcluster(linkage(x, method="average", metric="cosine"), t=1 - ONLINE_COSINE, criterion="distance") - 1


def _spectral(x: np.ndarray) -> np.ndarray:
    import scipy.linalg
    from scipy.cluster.vq import kmeans2

    n = len(x)
    affinity = x @ x.T
    pruned = min(int((1 - PRUNE_KEEP) * n), n - PRUNE_MIN)
    if pruned > 0:
        np.put_along_axis(affinity, np.argsort(affinity, axis=1)[:, :pruned], 0.0, axis=1)
    affinity = (affinity + affinity.T) / 2
    np.fill_diagonal(affinity, 0.0)
    laplacian = np.diag(np.abs(affinity).sum(1)) - affinity
    values, vectors = scipy.linalg.eigh(laplacian, subset_by_index=[0, min(MAX_SPEAKERS, n - 1)])
    k = int(np.argmax(np.diff(values))) + 1
    if k == 1:
        return np.zeros(n, dtype=int)
    spectral = vectors[:, :k]
    best: tuple[float, np.ndarray] | None = None
    for seed in range(5):  # k-means from a few seeded starts, the tightest kept: the same answer every run
        centres, labels = kmeans2(spectral, k, seed=seed, minit="++")
        inertia = float(((spectral - centres[labels]) ** 2).sum())
        if best is None or inertia < best[0]:
            best = (inertia, labels)
    assert best is not None
    return best[1]


def _merge_alike(labels: np.ndarray, x: np.ndarray) -> np.ndarray:
    labels = labels.copy()
    while len(ids := np.unique(labels)) > 1:
        centres = _centres(labels, x, ids)
        similarity = np.triu(centres @ centres.T, 1)
        a, b = np.unravel_index(int(np.argmax(similarity)), similarity.shape)
        if similarity[a, b] < RECORDING_MERGE_COSINE:
            break
        labels[labels == ids[b]] = ids[a]
    return labels


def _recording(x: np.ndarray) -> np.ndarray:
    if len(x) < SPECTRAL_MIN:
        return _fold_small(_agglomerative(x), x)
    return _merge_alike(_fold_small(_spectral(x), x), x)


def _centres(labels: np.ndarray, x: np.ndarray, ids: np.ndarray) -> np.ndarray:
    return _unit(np.stack([x[labels == i].mean(0) for i in ids]))


def _fold_small(labels: np.ndarray, x: np.ndarray) -> np.ndarray:
    ids, sizes = np.unique(labels, return_counts=True)
    major = ids[sizes >= MIN_CLUSTER]
    if len(major) == 0:
        return np.zeros_like(labels)
    if len(major) == len(ids):
        return labels
    centres = _centres(labels, x, major)
    labels = labels.copy()
    for row in np.flatnonzero(~np.isin(labels, major)):
        labels[row] = major[int(np.argmax(centres @ x[row]))]
    return labels


def first_seen_order(labels: np.ndarray) -> np.ndarray:
    """Labels renumbered 0, 1, ... in the order they first appear."""
    order: dict[int, int] = {}
    return np.array([order.setdefault(int(v), len(order)) for v in labels], dtype=int)


def cluster(embeddings: np.ndarray) -> np.ndarray:
    """A speaker number per embedding (rows in time order), numbered in order of appearance."""
    x = _unit(np.asarray(embeddings, dtype=np.float64))
    if len(x) < 2:
        return np.zeros(len(x), dtype=int)
    if len(x) <= MAX_CLUSTERED:
        return first_seen_order(_recording(x))
    sample = np.linspace(0, len(x) - 1, MAX_CLUSTERED).round().astype(int)
    found = _recording(x[sample])
    ids = np.unique(found)
    return first_seen_order(ids[np.argmax(x @ _centres(found, x[sample], ids).T, axis=1)])


@dataclass
class OnlineClusters:
    """Speakers as a live session meets them: each window joins the nearest speaker, or opens a new one; two
    speakers whose centroids come to be `MERGE_COSINE` alike are merged (the later into the earlier)."""

    threshold: float = ONLINE_COSINE
    sums: dict[int, np.ndarray] = field(default_factory=dict)
    opened: int = 0

    def add(self, embedding: np.ndarray, seconds: float) -> int:
        """The speaker of one window (`seconds` of speech), which then refines that speaker's centroid."""
        x = _unit(np.asarray(embedding, dtype=np.float64))
        if self.sums:
            ids = list(self.sums)
            similarity = _unit(np.stack([self.sums[i] for i in ids])) @ x
            best = int(np.argmax(similarity))
            if similarity[best] >= self.threshold or seconds < ONLINE_MIN_NEW_S:
                self.sums[ids[best]] = self.sums[ids[best]] + x
                return ids[best]
        self.sums[self.opened] = x
        self.opened += 1
        return self.opened - 1

    def merge_close(self) -> dict[int, int]:
        """Merge speakers whose centroids are at least `MERGE_COSINE` alike; {merged: kept} for each merge."""
        merged: dict[int, int] = {}
        while len(self.sums) > 1:
            ids = sorted(self.sums)
            centres = _unit(np.stack([self.sums[i] for i in ids]))
            similarity = np.triu(centres @ centres.T, 1)
            a, b = np.unravel_index(int(np.argmax(similarity)), similarity.shape)
            if similarity[a, b] < MERGE_COSINE:
                break
            keep, gone = ids[int(a)], ids[int(b)]
            self.sums[keep] = self.sums[keep] + self.sums.pop(gone)
            merged = {k: keep if v == gone else v for k, v in merged.items()} | {gone: keep}
        return merged
