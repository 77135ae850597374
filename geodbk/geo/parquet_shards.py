"""Read one rank's share of a parquet table (data-parallel training), streaming record
batches: whole row groups dealt out round-robin, or contiguous row ranges when the file has
fewer row groups than ranks."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

__all__ = ["read_parquet_shard"]


def read_parquet_shard(
    path: str | Path,
    *,
    columns: Sequence[str],
    rank: int,
    world_size: int,
    filters: Any = None,
    batch_size: int = 65536,
) -> dict[str, np.ndarray]:
    """Read this rank's rows of ``columns`` from a parquet file, streaming record batches.

    Row groups are dealt out round-robin (rank k reads groups k, k+W, ...); a file with fewer
    row groups than ranks is split into W contiguous row ranges instead. Only the requested
    columns of this rank's rows are kept, so no rank holds a copy of the full table.

    Parameters
    ----------
    path
        Parquet file.
    columns
        Columns to return (numpy arrays, in file order of rows).
    rank, world_size
        This rank and the number of ranks.
    filters
        Optional :class:`pyarrow.compute.Expression` applied batch by batch (e.g.
        ``pc.field("split") == "train"``); its columns are read too.
    batch_size
        Rows per record batch.
    """

    pf = pq.ParquetFile(path)
    n_groups = pf.num_row_groups
    dataset = ds.dataset(path, format="parquet")
    fragment = next(iter(dataset.get_fragments()))
    if n_groups >= world_size:
        groups = list(range(rank, n_groups, world_size))
        lo, hi = 0, None
    else:
        total = pf.metadata.num_rows
        bounds = np.linspace(0, total, world_size + 1).astype(np.int64)
        groups = list(range(n_groups))
        lo, hi = int(bounds[rank]), int(bounds[rank + 1])
    need = list(dict.fromkeys(list(columns)))
    chunks: dict[str, list[np.ndarray]] = {c: [] for c in columns}
    offset = 0
    if groups:
        sub = fragment.subset(row_group_ids=groups)
        # whole row groups: pyarrow filters while scanning and reads only the needed columns;
        # row ranges: rows must be counted before filtering, so filter after slicing
        by_groups = hi is None
        scanner = ds.Scanner.from_fragment(
            sub,
            schema=dataset.schema,
            columns=need if (filters is None or by_groups) else None,
            filter=filters if by_groups else None,
            batch_size=batch_size,
        )
        for batch in scanner.to_batches():
            start, stop = offset, offset + batch.num_rows
            offset = stop
            if hi is not None:
                a, b = max(lo, start), min(hi, stop)
                if a >= b:
                    if start >= hi:
                        break
                    continue
                batch = batch.slice(a - start, b - a)
            table = pa.Table.from_batches([batch])
            if filters is not None and not by_groups:
                table = table.filter(filters)
            for c in columns:
                chunks[c].append(table[c].to_numpy())
    return {
        c: (np.concatenate(v) if v else np.empty(0, dtype=np.float64)) for c, v in chunks.items()
    }
