"""Synthetic associative recall: the vocabulary, the needle prompts and the exact-match scorer.

The single source of truth for the recall task, shared by ``scripts/train_recall_model.py`` (training
batches), :mod:`nvfp4compat.recall.evaluate` (torch over the project's paged kernels) and the vLLM
job. Pure Python at import time: :func:`make_needle_prompts` needs nothing else, and
:func:`make_training_batch` imports numpy when called. This module imports nothing from
``nvfp4compat`` so the trainer can load it by path on a host without the package's dependencies.

Format (token strings are those of the shipped ``tokenizer.json``)::

    <|endoftext|> [0-2 filler values] k0412 v0017 v2203 k3301 v0100 v0009 ... <q> k0412 -> v0017 v2203

- a *triple* ``key v1 v2`` stores a two-token value under a key; the context is a stream of triples
  whose keys are distinct and whose first values ``v1`` are distinct (while there are at most
  ``n_keys`` / ``n_values`` triples; beyond, only the needle's are guaranteed unique); ``v2`` is uniform;
- a *query* ``<q> key`` asks for the value of a key stored earlier; the answer is ``v1 v2`` and is
  right only if both tokens are (exact match, greedy); a chance hit has probability ``1/n_values**2``.
  ``v1`` is found by matching the key (thousands of positions back), ``v2`` by matching ``v1``: the
  first answer token comes out of the prefill, the second out of a decode step over the cache;
- training sequences interleave complete query blocks ``<q> key v1 v2`` with the triples (the loss
  is on ``v1`` and ``v2`` only); evaluation prompts are triples only, then one query at the end.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = [
    "DEPTHS",
    "SPECIAL_TOKENS",
    "NeedlePrompt",
    "TrainingBatch",
    "VocabLayout",
    "exact_match",
    "make_needle_prompts",
    "make_training_batch",
    "needle_index",
    "score",
]

# id 0: bos and eos (the Qwen convention), id 1: padding, id 2: the query marker.
SPECIAL_TOKENS = ("<|endoftext|>", "<|pad|>", "<q>")
DEPTHS = tuple(i / 10 for i in range(10))  # 0.0, 0.1, ..., 0.9
PREFIX_LEN = 1  # the bos token
QUERY_LEN = 2  # "<q> key"
_KEY_RE = re.compile(r"^k(\d+)$")
_VALUE_RE = re.compile(r"^v(\d+)$")


@dataclass(frozen=True)
class VocabLayout:
    """Token-id layout of the recall vocabulary.

    Ids: ``0`` ``<|endoftext|>`` (bos/eos), ``1`` ``<|pad|>``, ``2`` ``<q>``, then ``n_keys`` key tokens
    ``k0000..`` from ``key_base = 3``, then ``n_values`` value tokens ``v000..`` from
    ``value_base = 3 + n_keys`` (``v0000..``), then ``<|reserved_i|>`` up to ``vocab_size`` (a multiple of
    ``pad_to``, which keeps the embedding GEMM-friendly; the reserved ids never occur).
    """

    n_keys: int = 4096
    n_values: int = 4096
    pad_to: int = 64

    def __post_init__(self) -> None:
        if self.n_keys < 2 or self.n_values < 2:
            raise ValueError(
                f"VocabLayout needs at least 2 keys and 2 values, got n_keys={self.n_keys}, "
                f"n_values={self.n_values}"
            )
        if self.pad_to < 1:
            raise ValueError(f"VocabLayout.pad_to must be >= 1, got {self.pad_to}")

    @property
    def bos_id(self) -> int:
        return 0

    @property
    def pad_id(self) -> int:
        return 1

    @property
    def query_id(self) -> int:
        return 2

    @property
    def key_base(self) -> int:
        return len(SPECIAL_TOKENS)

    @property
    def value_base(self) -> int:
        return self.key_base + self.n_keys

    @property
    def n_used(self) -> int:
        """Ids ``[0, n_used)`` are specials, keys and values; the rest are reserved."""
        return self.value_base + self.n_values

    @property
    def vocab_size(self) -> int:
        return -(-self.n_used // self.pad_to) * self.pad_to

    def key_id(self, i: int) -> int:
        return self.key_base + i

    def value_id(self, j: int) -> int:
        return self.value_base + j

    def is_value_id(self, token_id: int) -> bool:
        return self.value_base <= token_id < self.n_used

    def key_width(self) -> int:
        return len(str(self.n_keys - 1))

    def value_width(self) -> int:
        return len(str(self.n_values - 1))

    def tokens(self) -> list[str]:
        """Every token string, in id order (``len == vocab_size``)."""
        kw, vw = max(4, self.key_width()), max(4, self.value_width())
        out = list(SPECIAL_TOKENS)
        out += [f"k{i:0{kw}d}" for i in range(self.n_keys)]
        out += [f"v{j:0{vw}d}" for j in range(self.n_values)]
        out += [f"<|reserved_{i}|>" for i in range(self.vocab_size - self.n_used)]
        return out

    def to_dict(self) -> dict[str, int]:
        return {
            "n_keys": self.n_keys,
            "n_values": self.n_values,
            "pad_to": self.pad_to,
            "vocab_size": self.vocab_size,
            "bos_id": self.bos_id,
            "pad_id": self.pad_id,
            "query_id": self.query_id,
            "key_base": self.key_base,
            "value_base": self.value_base,
        }

    @classmethod
    def from_vocab(cls, vocab: Mapping[str, int]) -> VocabLayout:
        """Recover the layout from a tokenizer vocabulary (``token -> id``) and check every id.

        Raises
        ------
        ValueError
            When the vocabulary is not one this module writes (names the first mismatching token).
        """
        n_keys = sum(1 for t in vocab if _KEY_RE.match(t))
        n_values = sum(1 for t in vocab if _VALUE_RE.match(t))
        n_used = len(SPECIAL_TOKENS) + n_keys + n_values
        pad_to = 1
        size = len(vocab)
        for p in (64, 32, 16, 8, 4, 2, 1):
            if size % p == 0 and size - n_used < p:
                pad_to = p
                break
        layout = cls(n_keys=n_keys, n_values=n_values, pad_to=pad_to)
        expected = layout.tokens()
        if layout.vocab_size != size:
            raise ValueError(
                f"tokenizer vocabulary has {size} entries but {n_keys} keys + {n_values} values + "
                f"{len(SPECIAL_TOKENS)} specials pad to {layout.vocab_size}; not a recall-task "
                "vocabulary (make one with scripts/train_recall_model.py)"
            )
        for i, tok in enumerate(expected):
            if vocab.get(tok) != i:
                raise ValueError(
                    f"tokenizer maps {tok!r} to {vocab.get(tok)}, the recall layout needs {i}; "
                    "not a recall-task vocabulary (make one with scripts/train_recall_model.py)"
                )
        return layout

    @classmethod
    def from_tokenizer_json(cls, path: Any) -> VocabLayout:
        """Read ``tokenizer.json`` (a ``tokenizers`` WordLevel model) and call :meth:`from_vocab`."""
        import json
        from pathlib import Path

        data = json.loads(Path(path).read_text())
        vocab = dict(data["model"]["vocab"])
        for added in data.get("added_tokens", []):
            vocab[added["content"]] = added["id"]
        return cls.from_vocab(vocab)


class NeedlePrompt(NamedTuple):
    """One evaluation prompt: ``(token_ids, answer_ids, meta)``.

    ``token_ids`` has exactly ``context_len`` ids and ends with ``<q> needle_key``; ``answer_ids`` are
    the two value ids to generate greedily; ``meta`` holds ``context_len``, ``depth``, ``index`` (the
    needle's number within its depth), ``needle_triple`` (its triple index), ``n_triples``,
    ``needle_pos`` (the position of the needle's key token), ``distance`` (query key position minus
    needle key position) and ``seed``.
    """

    token_ids: list[int]
    answer_ids: list[int]
    meta: dict[str, Any]


def n_context_triples(context_len: int) -> tuple[int, int]:
    """``(n_triples, n_filler)`` for a prompt of exactly ``context_len`` tokens.

    A prompt is ``bos``, ``n_filler`` (0-2) value tokens, ``n_triples`` triples and ``<q> key``:
    ``1 + n_filler + 3 * n_triples + 2 == context_len``.
    """
    body = context_len - PREFIX_LEN - QUERY_LEN
    if body < 3:
        raise ValueError(f"context_len {context_len} is too short: need at least 6 tokens")
    return body // 3, body % 3


def needle_index(depth: float, n_triples: int) -> int:
    """The triple index of the needle at ``depth``: ``round(depth * (n_triples - 1))``.

    Depth 0.0 is the first triple after the bos (and 0-2 filler) tokens, depth 1.0 would be the last
    triple before the query; a fraction ``~depth`` of the context's triples precede the needle.
    """
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must lie in [0, 1], got {depth}")
    return int(round(depth * (n_triples - 1)))


def make_needle_prompts(
    layout: VocabLayout,
    context_len: int,
    depths: Sequence[float] = DEPTHS,
    n_per_depth: int = 1,
    seed: int = 0,
) -> list[NeedlePrompt]:
    """Needle-retrieval prompts of exactly ``context_len`` tokens, seeded, pure Python.

    For each depth and each ``i < n_per_depth``: a context of ``n_triples`` triples (see
    :func:`n_context_triples`) with the needle triple at :func:`needle_index`, then ``<q> needle_key``.
    Filler keys differ from the needle key and filler ``v1`` from the needle's ``v1`` (distinct from
    each other too while ``n_triples`` fits in ``n_keys`` / ``n_values``; drawn with replacement
    beyond); every ``v2`` is uniform. Each prompt has
    its own ``random.Random`` seeded by ``(seed, context_len, depth, i)``, so a prompt does not change
    when other depths or counts are asked for.

    Returns
    -------
    list of NeedlePrompt
        ``len(depths) * n_per_depth`` prompts, depth-major.
    """
    n_triples, n_filler = n_context_triples(context_len)
    out: list[NeedlePrompt] = []
    for depth in depths:
        at = needle_index(depth, n_triples)
        for i in range(n_per_depth):
            tag = f"recall-needle:{seed}:{context_len}:{depth:.6f}:{i}"
            rng = random.Random(tag)
            keys = _draw_with_needle(rng, layout.n_keys, n_triples, at)
            firsts = _draw_with_needle(rng, layout.n_values, n_triples, at)
            ids = [layout.bos_id]
            ids += [layout.value_id(rng.randrange(layout.n_values)) for _ in range(n_filler)]
            answer: list[int] = []
            for t, (k, v) in enumerate(zip(keys, firsts, strict=True)):
                v1 = layout.value_id(v)
                v2 = layout.value_id(rng.randrange(layout.n_values))
                ids += [layout.key_id(k), v1, v2]
                if t == at:
                    answer = [v1, v2]
            needle_key = keys[at]
            needle_pos = PREFIX_LEN + n_filler + 3 * at
            ids += [layout.query_id, layout.key_id(needle_key)]
            if len(ids) != context_len:  # pragma: no cover - arithmetic guard
                raise AssertionError(f"prompt has {len(ids)} tokens, wanted {context_len}")
            meta = {
                "context_len": context_len,
                "depth": depth,
                "index": i,
                "needle_triple": at,
                "n_triples": n_triples,
                "needle_pos": needle_pos,
                "distance": context_len - 1 - needle_pos,
                "seed": seed,
            }
            out.append(NeedlePrompt(ids, answer, meta))
    return out


def _draw_with_needle(rng: random.Random, n: int, count: int, at: int) -> list[int]:
    """``count`` draws from ``range(n)``; entry ``at`` (the needle's) differs from every other entry,
    and the others are distinct too while ``count <= n`` (with replacement beyond)."""
    needle = rng.randrange(n)
    others = [x for x in range(n) if x != needle]
    if count - 1 <= len(others):
        picks = rng.sample(others, count - 1)
    else:
        picks = [rng.choice(others) for _ in range(count - 1)]
    picks.insert(at, needle)
    return picks


def exact_match(generated: Sequence[int], answer: Sequence[int]) -> bool:
    """True when the first ``len(answer)`` generated ids equal ``answer`` (both value tokens)."""
    return len(generated) >= len(answer) and list(generated[: len(answer)]) == list(answer)


def score(prompts: Sequence[NeedlePrompt], generated: Sequence[Sequence[int]]) -> dict[str, Any]:
    """Exact-match table of generations against their prompts.

    Returns
    -------
    dict
        ``table``: ``{context_len: {depth: hits}}``; ``counts``: ``{context_len: {depth: n}}``;
        ``recall``: ``{context_len: hits / n}`` over all depths; ``overall``: hits / n over everything;
        ``misses``: the ``meta`` of every miss plus the generated ids.
    """
    if len(prompts) != len(generated):
        raise ValueError(f"{len(prompts)} prompts but {len(generated)} generations")
    table: dict[int, dict[float, int]] = {}
    counts: dict[int, dict[float, int]] = {}
    misses: list[dict[str, Any]] = []
    for p, g in zip(prompts, generated, strict=True):
        L, d = p.meta["context_len"], p.meta["depth"]
        hit = exact_match(g, p.answer_ids)
        table.setdefault(L, {}).setdefault(d, 0)
        counts.setdefault(L, {}).setdefault(d, 0)
        table[L][d] += int(hit)
        counts[L][d] += 1
        if not hit:
            misses.append({**p.meta, "generated": list(g), "answer": list(p.answer_ids)})
    recall = {L: sum(table[L].values()) / sum(counts[L].values()) for L in table}
    total = sum(sum(c.values()) for c in counts.values())
    overall = sum(sum(t.values()) for t in table.values()) / total if total else float("nan")
    return {
        "table": table,
        "counts": counts,
        "recall": recall,
        "overall": overall,
        "misses": misses,
    }


class TrainingBatch(NamedTuple):
    """Dense-supervision training batch (numpy arrays).

    ``tokens`` ``[batch, seq_len]`` int64; ``sup_index`` ``[n_sup]`` int64 flat indices
    (``b * seq_len + t``) of the positions whose next token is an answer token, in pairs
    ``(query key -> v1, v1 -> v2)``, adjacent; ``sup_target`` ``[n_sup]`` int64 the answer ids;
    ``sup_distance`` ``[n_sup // 2]`` int64 the query-key-to-stored-key distance of each query.
    """

    tokens: Any
    sup_index: Any
    sup_target: Any
    sup_distance: Any


def make_training_batch(
    layout: VocabLayout,
    batch: int,
    seq_len: int,
    rng: Any,
    query_prob: float = 0.2,
    far_frac: float = 0.5,
) -> TrainingBatch:
    """Draw a training batch: triples interleaved with complete query blocks (numpy, vectorised).

    Each sequence: ``bos``, 0-2 filler values, then blocks; the first block is a triple, every later
    block is a query ``<q> key v1 v2`` with probability ``query_prob`` (else a triple ``key v1 v2``).
    Keys and ``v1`` are distinct across the triples (drawn with replacement only when the sequence
    holds more triples than there are keys / values); ``v2`` is uniform. A query asks for a key
    stored in an earlier triple whose key and ``v1`` both occur once among the triples: uniformly over the
    earlier triples with probability ``1 - far_frac``, else biased to the oldest ones (index
    ``floor(u**2 * n_before)``) so that long distances are well represented. A query block cut by the
    end of the sequence is not supervised.

    Parameters
    ----------
    rng : numpy.random.Generator
        The only source of randomness (seed it for repeatable batches).
    """
    import numpy as np

    if seq_len < 8:
        raise ValueError(f"seq_len must be >= 8, got {seq_len}")
    if not 0.0 <= query_prob < 1.0:
        raise ValueError(f"query_prob must lie in [0, 1), got {query_prob}")
    tokens = np.empty((batch, seq_len), dtype=np.int64)
    sup_index: list[Any] = []
    sup_target: list[Any] = []
    sup_distance: list[Any] = []
    for b in range(batch):
        n_filler = int(rng.integers(0, 3))
        start = PREFIX_LEN + n_filler
        body = seq_len - start
        n_blocks = body // 3 + 1
        is_query = rng.random(n_blocks) < query_prob
        is_query[0] = False
        sizes = 3 + is_query.astype(np.int64)
        begins = start + np.concatenate(([0], np.cumsum(sizes)[:-1]))
        keep = begins < seq_len
        is_query, sizes, begins = is_query[keep], sizes[keep], begins[keep]
        buf = np.empty(int(begins[-1] + sizes[-1]), dtype=np.int64)
        buf[0] = layout.bos_id
        buf[1:start] = layout.value_base + rng.integers(0, layout.n_values, n_filler)

        trip = ~is_query
        n_trip = int(trip.sum())
        keys = rng.choice(layout.n_keys, n_trip, replace=n_trip > layout.n_keys)
        vals = rng.integers(0, layout.n_values, (n_trip, 2))
        vals[:, 0] = rng.choice(layout.n_values, n_trip, replace=n_trip > layout.n_values)
        tb = begins[trip]
        buf[tb] = layout.key_base + keys
        buf[tb + 1] = layout.value_base + vals[:, 0]
        buf[tb + 2] = layout.value_base + vals[:, 1]

        qb = begins[is_query]
        if len(qb):
            if n_trip > layout.n_keys or n_trip > layout.n_values:
                kc = np.bincount(keys, minlength=layout.n_keys)
                vc = np.bincount(vals[:, 0], minlength=layout.n_values)
                unique = np.flatnonzero((kc[keys] == 1) & (vc[vals[:, 0]] == 1))
            else:
                unique = np.arange(n_trip)
            # number of triples (and of unique-key triples) before each query block
            n_before = np.cumsum(trip)[is_query]
            m = np.searchsorted(unique, n_before)
            u = rng.random(len(qb))
            far = rng.random(len(qb)) < far_frac
            u = np.where(far, u * u, u)
            pick = np.minimum((u * m).astype(np.int64), np.maximum(m - 1, 0))
            ok = m > 0
            target = unique[np.where(ok, pick, 0)] if len(unique) else np.zeros_like(pick)
            buf[qb] = layout.query_id
            buf[qb + 1] = layout.key_base + keys[target]
            buf[qb + 2] = layout.value_base + vals[target, 0]
            buf[qb + 3] = layout.value_base + vals[target, 1]
            ok &= qb + 3 < seq_len
            qs = qb[ok]
            flat = b * seq_len
            idx = np.stack([qs + 1, qs + 2], axis=1).reshape(-1)
            tgt = np.stack([buf[qs + 2], buf[qs + 3]], axis=1).reshape(-1)
            sup_index.append(flat + idx)
            sup_target.append(tgt)
            sup_distance.append(qs + 1 - tb[target[ok]])
        tokens[b] = buf[:seq_len]
    empty = np.zeros(0, dtype=np.int64)
    return TrainingBatch(
        tokens,
        np.concatenate(sup_index) if sup_index else empty,
        np.concatenate(sup_target) if sup_target else empty,
        np.concatenate(sup_distance) if sup_distance else empty,
    )
