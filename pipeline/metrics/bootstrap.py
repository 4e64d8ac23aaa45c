"""The bootstrap replicates' sums, in numpy (docs/explanation/intervals.md; docs/explanation/measured-facts.md).

DuckDB sums the parts per task (metrics/sql/metrics_prepare.sql); this module turns the per-task sums of each cohort
into per-replicate sums, exactly as metrics/sql/hash.sql defines the draws:
    key_b = lb32(lb32(seed) XOR b),  h(b, i) = lb32(key_b XOR lb32(i))
multinomial: replicate b draws task h(b, i) mod m for each slot i < m; poisson: task i gets the Poisson(1)
inverse CDF of h(b, i). lb32 works on 32-bit words, so uint32 numpy arithmetic (wrapping products) is the same
function as the SQL's UBIGINT one with its explicit `& 0xFFFFFFFF`.

A replicate's sum is (weights per task) @ (sums per task), a float64 matrix product, and exact: every column
is split into limbs small enough that each partial sum is an integer below 2^53 (the weights of a replicate
add up to at most `weight_bound`), and the limbs are recombined in SQL as HUGEINT (metrics/sql/bootstrap_sums.sql), the
type DuckDB's own sum had. The same bits for any BLAS, thread count or summation order.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

import numpy as np
from threadpoolctl import threadpool_limits

from pipeline.core.arrow import pa

Method = Literal["multinomial", "poisson"]

# ceil(2^32 * F(k)), F the Poisson(1) CDF, k = 0..11: the table of metrics/sql/hash.sql's pexec_poisson1.
POISSON1 = np.array(
    [1580030169, 3160060338, 3950075422, 4213413784, 4279248374, 4292415292,
     4294609778, 4294923277, 4294962464, 4294966818, 4294967253, 4294967293],
    dtype=np.uint32,
)  # fmt: skip
_EXACT_BITS = 53  # float64 holds every integer below 2^53
_CHUNK = 1 << 22  # draws per block: (replicates in a block) x (tasks) stays near this
_MAX_THREADS = 8  # blocks computed at once (each holds a few blocks' worth of draws)
_HASH_ROWS = 16  # replicates hashed at once (16 x 46,474 tasks: 3 MB of words)


LIMBS = pa.schema(
    [("cohort", pa.int64()), ("b", pa.int64()), ("part", pa.dictionary(pa.int32(), pa.string())),
     ("shift", pa.int32()), ("total", pa.int64())]
)  # fmt: skip


def lb32(x: np.ndarray, scratch: np.ndarray | None = None) -> np.ndarray:
    """The lowbias32 mixer of metrics/sql/hash.sql on uint32 words, in place (returns x). `scratch`, an array of
    x's shape, holds the shifts (else each is a new array)."""
    for shift, factor in ((16, 0x7FEB352D), (15, 0x846CA68B), (16, None)):
        x ^= np.right_shift(x, np.uint32(shift), out=scratch)
        if factor is not None:
            x *= np.uint32(factor)
    return x


def draws(keys: np.ndarray, mixed: np.ndarray) -> np.ndarray:
    """h(b, i) = lb32(key_b XOR lb32(i)) for the replicate keys x the mixed task numbers, a few rows at a time:
    each pass over the block stays in cache (three times faster than whole-block passes and their temporaries)."""
    out = np.empty((len(keys), len(mixed)), dtype=np.uint32)
    scratch = np.empty((_HASH_ROWS, len(mixed)), dtype=np.uint32)
    for r in range(0, len(keys), _HASH_ROWS):
        rows = out[r : r + _HASH_ROWS]
        np.bitwise_xor(keys[r : r + _HASH_ROWS, None], mixed[None, :], out=rows)
        lb32(rows, scratch[: len(rows)])
    return out


def replicate_keys(seed: int, B: int) -> np.ndarray:
    """key_b = lb32(lb32(seed) XOR b), b < B (metrics/sql/hash.sql pexec_rep_key)."""
    mixed_seed = lb32(np.array([seed], dtype=np.uint32))[0]
    return lb32(np.arange(B, dtype=np.uint32) ^ mixed_seed)


def poisson1(h: np.ndarray) -> np.ndarray:
    """Poisson(1) weights of draws h as float64 (metrics/sql/hash.sql pexec_poisson1): three comparisons cover 98% of
    the draws, the table's tail is looked up only where it is reached."""
    w: np.ndarray = (h >= POISSON1[0]).astype(np.float64)
    w += h >= POISSON1[1]
    w += h >= POISSON1[2]
    tail = np.flatnonzero(h >= POISSON1[3])
    w.flat[tail] += np.searchsorted(POISSON1[3:], h.flat[tail], side="right")
    return w


def weight_bound(method: Method, m: int) -> int:
    """The largest sum of one replicate's weights over m tasks: m draws, or at most 12 per task."""
    return m if method == "multinomial" else 12 * m


@dataclass(frozen=True)
class Limbs:
    """Integer columns split into limbs: column `source[j]` = sum over its limbs of values * 2^shift."""

    values: np.ndarray  # float64, tasks x limbs, every entry an integer of at most `bits` bits (+ sign)
    source: list[int]  # the column each limb belongs to
    shift: list[int]
    zero: list[int]  # the columns that are 0 for every task: no limb, 0 in every replicate


def split_limbs(sums: np.ndarray, bits: int) -> Limbs:
    """Each int64 column of `sums` as limbs of `bits` bits (the top limb signed), as few as it needs: none when it
    is all 0 (a run without writes, say, has several such columns, and each limb costs a product per replicate)."""
    mask = np.int64((1 << bits) - 1)
    cols, source, shift, zero = [], [], [], []
    for j in range(sums.shape[1]):
        col = sums[:, j]
        if not col.any():
            zero.append(j)
            continue
        top = int(np.abs(col).max(initial=0))
        n_limbs = -(-(top.bit_length() + 1) // bits)
        for limb in range(n_limbs):
            part = col >> np.int64(bits * limb)
            cols.append(part if limb == n_limbs - 1 else part & mask)
            source.append(j)
            shift.append(bits * limb)
    values = np.stack(cols, axis=1).astype(np.float64) if cols else np.zeros((sums.shape[0], 0))
    return Limbs(np.ascontiguousarray(values), source, shift, zero)


def wide_schema(columns: Sequence[str]) -> pa.Schema:
    """Replicate sums one row per (cohort, b), a BIGINT column per sum: where every sum fits in 64 bits."""
    return pa.schema([("cohort", pa.int64()), ("b", pa.int64()), *((c, pa.int64()) for c in columns)])


def replicate_sums(
    cohorts: Sequence[np.ndarray],
    columns: Sequence[str],
    seed: int,
    B: int,
    method: Method,
    first: int = 0,
    wide: bool = False,
) -> Iterator[pa.RecordBatch]:
    """Per-(cohort, replicate) sums of each cohort's per-task sums (int64, tasks in task_id order x `columns`), as
    record batches of limbs (cohort, b, part, shift, total): column `part` of replicate b of cohort c is the sum
    of total * 2^shift over its rows (metrics/sql/bootstrap_sums.sql adds them up). `wide`: a cohort whose sums all
    fit in 64 bits comes as batches of wide_schema(columns) instead (split them with replicate_tables). The cohorts
    are numbered from `first`; a cohort's draws depend on its own tasks only, so any run of cohorts gives each the
    same sums."""
    if not cohorts:
        return
    keys = replicate_keys(seed, B)
    max_m = max(len(s) for s in cohorts)
    bits = _EXACT_BITS - weight_bound(method, max_m).bit_length()
    mixed = lb32(np.arange(max_m, dtype=np.uint32))
    per_block = max(1, min(B, _CHUNK // max(max_m, 1)))
    # A replicate's sum of a column is at most (its weights' sum) x (the column's largest magnitude), and so is each
    # limb's term of it, up to the factor 2 a signed top limb adds: far under 2^63 here, in float64 or not.
    fits = [wide and float(_magnitudes(s).max(initial=0)) * weight_bound(method, len(s)) < 2.0**58 for s in cohorts]

    def block(b0: int, limbs: list[Limbs]) -> list[pa.RecordBatch]:
        h = draws(keys[b0 : b0 + per_block], mixed)
        shared = poisson1(h) if method == "poisson" else None
        batches = []
        for c, (sums, limb) in enumerate(zip(cohorts, limbs, strict=True)):
            m = len(sums)
            if m:
                w = shared[:, :m] if shared is not None else _multinomial_counts(h[:, :m], m)
                totals = w @ limb.values  # replicates in the block x limbs, exact integers
                made = _wide_batch if fits[c] else _limb_batch
                batches.append(made(first + c, b0, totals, limb, columns))
        return batches

    # numpy releases the GIL in the hashing, counting and products, so blocks of replicates run on threads;
    # map keeps their order. The products are small: several BLAS threads per block would only contend.
    with threadpool_limits(limits=1, user_api="blas"), ThreadPoolExecutor(_threads()) as pool:
        limbs = list(pool.map(lambda sums: split_limbs(sums, bits), cohorts))  # on the threads too
        for batches in pool.map(lambda b0: block(b0, limbs), range(0, B, per_block)):
            yield from batches


def _threads() -> int:
    return max(1, min(len(os.sched_getaffinity(0)), _MAX_THREADS))


def _multinomial_counts(h: np.ndarray, m: int) -> np.ndarray:
    """How often each task is drawn in each replicate: row b counts h(b, i) mod m over the m slots i."""
    # One row at a time, into buffers reused from row to row: the row and its bins stay in cache (whole-block passes
    # took twice as long, most of it in their temporaries). h mod m as h - (h // m) * m: numpy's floor division by
    # a scalar is twice as fast as its remainder here. bincount would convert a row to intp by itself, slower.
    divisor = np.uint32(m)
    slot = np.empty(m, dtype=np.uint32)
    drawn = np.empty(m, dtype=np.intp)
    counts = np.empty(h.shape, dtype=np.float64)
    for row, out in zip(h, counts, strict=True):
        np.floor_divide(row, divisor, out=slot)
        slot *= divisor
        np.subtract(row, slot, out=slot)
        drawn[:] = slot
        out[:] = np.bincount(drawn, minlength=m)
    return counts


def replicate_tables(batches: Iterable[pa.RecordBatch], columns: Sequence[str]) -> tuple[pa.Table, pa.Table]:
    """Batches of replicate sums, wide and as limbs, as the two relations metrics/sql/bootstrap_sums.sql reads:
    rep_wide (wide_schema(columns)) and rep_limbs (LIMBS)."""
    schema = wide_schema(columns)
    wide: list[pa.RecordBatch] = []
    limbs: list[pa.RecordBatch] = []
    for batch in batches:
        (wide if batch.schema.equals(schema) else limbs).append(batch)
    return pa.Table.from_batches(wide, schema), pa.Table.from_batches(limbs, LIMBS)


def _wide_batch(cohort: int, b0: int, totals: np.ndarray, limb: Limbs, columns: Sequence[str]) -> pa.RecordBatch:
    """The limbs' totals put together in int64 (replicate_sums checked they fit): one row per replicate."""
    n_rep = len(totals)
    out = np.zeros((len(columns), n_rep), dtype=np.int64)  # a column without limbs is 0 (Limbs.zero)
    for k, (j, shift) in enumerate(zip(limb.source, limb.shift, strict=True)):
        out[j] += totals[:, k].astype(np.int64) << np.int64(shift)
    return pa.record_batch(
        [pa.array(np.full(n_rep, cohort, dtype=np.int64)), pa.array(np.arange(b0, b0 + n_rep, dtype=np.int64)),
         *(pa.array(col) for col in out)],
        schema=wide_schema(columns),
    )  # fmt: skip


def _limb_batch(cohort: int, b0: int, totals: np.ndarray, limb: Limbs, columns: Sequence[str]) -> pa.RecordBatch:
    if limb.zero:  # a row of 0 for each column that has no limb, so that every column has its sum
        totals = np.hstack([totals, np.zeros((len(totals), len(limb.zero)))])
    n_rep, n_limbs = totals.shape
    source = np.tile(np.asarray(limb.source + limb.zero, dtype=np.int32), n_rep)
    shift = limb.shift + [0] * len(limb.zero)
    return pa.record_batch(
        [
            pa.array(np.full(n_rep * n_limbs, cohort, dtype=np.int64)),
            pa.array(np.repeat(np.arange(b0, b0 + n_rep, dtype=np.int64), n_limbs)),
            pa.DictionaryArray.from_arrays(source, pa.array(list(columns), pa.string())),
            pa.array(np.tile(np.asarray(shift, dtype=np.int32), n_rep)),
            pa.array(np.asarray(totals).ravel().astype(np.int64)),
        ],
        schema=LIMBS,
    )


@dataclass(frozen=True)
class Moments:
    """What the small-sample interval needs of a ratio sum(y_i) / sum(x_i) over tasks i
    (pipeline.core.intervals.Cluster): exact integers, whatever their size."""

    den_total: int  # sum x_i
    den_tasks: int  # #{x_i > 0}
    num_total: int  # sum y_i
    yy: int
    xy: int
    xx: int

    def __add__(self, other: Moments) -> Moments:
        """The moments over the tasks of both (disjoint sets of tasks): every sum adds up."""
        return Moments(
            self.den_total + other.den_total,
            self.den_tasks + other.den_tasks,
            self.num_total + other.num_total,
            self.yy + other.yy,
            self.xy + other.xy,
            self.xx + other.xx,
        )


def moments(y: np.ndarray, x: np.ndarray) -> Moments:
    """The exact integer moments of per-task sums y (numerator) and x (denominator), int64 arrays."""
    return Moments(_sum(x), int(np.count_nonzero(x > 0)), _sum(y), _dot(y, y), _dot(x, y), _dot(x, x))


# int64 where no partial sum can overflow (bounds in float64: its rounding is far inside the factor-2 margin),
# else exactly by limbs (the auc part's squares, in units of 2^-40, do not fit in 64 bits).
def _sum(a: np.ndarray) -> int:
    if float(_magnitudes(a).sum()) < 2.0**62:
        return int(a.sum())
    return sum(a.tolist())


def _magnitudes(a: np.ndarray) -> np.ndarray:
    return np.abs(a.astype(np.float64))  # in int64, abs(-2^63) wraps to -2^63


_DOT_BITS = 21  # limbs of 21 bits: a product of two is below 2^42, 2^20 of them add up below 2^62
_DOT_ROWS = 1 << 20


def _dot(a: np.ndarray, b: np.ndarray) -> int:
    if float(_magnitudes(a).max(initial=0)) * float(_magnitudes(b).sum()) < 2.0**62:
        return int(np.dot(a, b))
    total = 0
    for r0 in range(0, len(a), _DOT_ROWS):
        a_limbs, b_limbs = _limbs21(a[r0 : r0 + _DOT_ROWS]), _limbs21(b[r0 : r0 + _DOT_ROWS])
        for i, a_limb in enumerate(a_limbs):
            for j, b_limb in enumerate(b_limbs):
                total += int(np.dot(a_limb, b_limb)) << (_DOT_BITS * (i + j))
    return total


def _limbs21(a: np.ndarray) -> list[np.ndarray]:
    """int64 a as three limbs of 21 bits, a = sum limb_k * 2^(21 k): two unsigned, the top one signed."""
    mask = np.int64((1 << _DOT_BITS) - 1)
    return [a & mask, (a >> np.int64(_DOT_BITS)) & mask, a >> np.int64(2 * _DOT_BITS)]


# --- the mergeable Poisson bootstrap ("poisson-merged") -------------------------------------------------------
# Task i's weight in replicate b is keyed by the task itself, not by its place among the cohort's tasks:
#     h = lb32(lb32(key_b XOR lo) XOR hi),  (hi, lo) = the 64-bit task key (metrics/sql/hash.sql pexec_task_key: the
# first 8 bytes of md5(task_id), little-endian), w = Poisson(1) inverse CDF of h.
# So a replicate's sum is a sum over rollouts of w(b, task) * part: any subset of the rollouts (a scoring
# shard) gives partial sums, and adding the partials of disjoint subsets gives the sums of their union exactly.


CohortKey = TypeVar("CohortKey")  # what names a cohort: its number, or its values of the cohort columns


@dataclass(frozen=True)
class PoissonPartial(Generic[CohortKey]):
    """Partial sums of the mergeable Poisson bootstrap over a subset of rollouts: per cohort key, an object array
    of exact integers, row 0 the plain sums (the point estimate's), row 1 + b replicate b; one column per
    `columns`."""

    seed: int
    B: int
    columns: tuple[str, ...]
    sums: dict[CohortKey, np.ndarray]


def poisson_partial(
    cohort_keys: Sequence[CohortKey],
    cohort: np.ndarray,
    task_key: np.ndarray,
    sums: np.ndarray,
    columns: Sequence[str],
    seed: int,
    B: int,
) -> PoissonPartial[CohortKey]:
    """The partial sums of rows (cohort number into `cohort_keys`, 64-bit task key, int64 sums of `columns`):
    a row is one rollout's parts, or any number of one task's rollouts already summed; a task may appear in
    any number of rows, of any subset."""
    keys = replicate_keys(seed, B)
    out: dict[CohortKey, np.ndarray] = {}
    with threadpool_limits(limits=1, user_api="blas"):
        for code, key in enumerate(cohort_keys):
            rows = np.flatnonzero(cohort == code)
            if len(rows):
                out[key] = _poisson_rows(keys, task_key[rows], sums[rows])
    return PoissonPartial(seed, B, tuple(columns), out)


def _poisson_rows(keys: np.ndarray, task_key: np.ndarray, sums: np.ndarray) -> np.ndarray:
    B, n_cols = len(keys), sums.shape[1]
    total = np.zeros((B + 1, n_cols), dtype=object)
    total[0] = [int(v) for v in _exact_column_sums(sums)]
    per_rows = 1 << 16
    for r0 in range(0, len(sums), per_rows):
        block_sums = sums[r0 : r0 + per_rows]
        lo = (task_key[r0 : r0 + per_rows] & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        hi = (task_key[r0 : r0 + per_rows] >> np.uint64(32)).astype(np.uint32)
        limb = split_limbs(block_sums, _EXACT_BITS - weight_bound("poisson", len(block_sums)).bit_length())
        per_block = max(1, min(B, _CHUNK // len(block_sums)))
        for b0 in range(0, B, per_block):
            h = lb32(keys[b0 : b0 + per_block, None] ^ lo[None, :])
            h ^= hi[None, :]
            totals = poisson1(lb32(h)) @ limb.values
            exact = totals.astype(np.int64).astype(object)
            for j, (col, shift) in enumerate(zip(limb.source, limb.shift, strict=True)):
                total[1 + b0 : 1 + b0 + len(h), col] += exact[:, j] * (1 << shift)
    return total


def _exact_column_sums(sums: np.ndarray) -> list[int]:
    return [_sum(sums[:, j]) for j in range(sums.shape[1])]


def partial_tables(partial: PoissonPartial[int], plain: bool = False) -> tuple[pa.Table, pa.Table]:
    """The replicates of partial sums as the two relations of metrics/sql/bootstrap_sums.sql (replicate_tables):
    a cohort whose sums all fit in int64 as they are, another as limbs, each exact total as hi * 2^32 + lo; cohort
    keys being the cohort numbers of task_sums. `plain`: the plain sums too, as b = -1 (the point estimates'
    sums, when no task_sums table holds them)."""
    batches = []
    first = -1 if plain else 0
    for cohort, total in partial.sums.items():
        reps = total if plain else total[1:]  # row 0: the plain sums
        n_rep, n_cols = reps.shape
        try:
            words = reps.astype(np.int64)
        except OverflowError:  # a sum past int64 (the auc part of a huge cohort): split as Python ints
            mask = (1 << 32) - 1
            flat = reps.ravel().tolist()
            values = np.array([[v >> 32, v & mask] for v in flat], dtype=np.int64).reshape(n_rep, 2 * n_cols)
            limb = Limbs(np.empty((0, 2 * n_cols)), [j for j in range(n_cols) for _ in (0, 1)], [32, 0] * n_cols, [])
            batches.append(_limb_batch(cohort, first, values, limb, partial.columns))
            continue
        plain_limb = Limbs(np.empty((0, n_cols)), list(range(n_cols)), [0] * n_cols, [])
        batches.append(_wide_batch(cohort, first, words, plain_limb, partial.columns))
    return replicate_tables(batches, partial.columns)


def merge(parts: Sequence[PoissonPartial[CohortKey]]) -> PoissonPartial[CohortKey]:
    """The partial sums of the union of the parts' rollouts (disjoint subsets of one run), exact."""
    first = parts[0]
    out: dict[CohortKey, np.ndarray] = {}
    for p in parts:
        if (p.seed, p.B, p.columns) != (first.seed, first.B, first.columns):
            raise ValueError("partial sums of different bootstraps (seed, B or columns differ) cannot be merged")
        for key, s in p.sums.items():
            out[key] = out[key] + s if key in out else s.copy()
    return PoissonPartial(first.seed, first.B, first.columns, out)
