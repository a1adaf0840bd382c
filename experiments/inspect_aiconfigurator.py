"""Print the inventory of aiconfigurator-core's kernel tables: per system/family/backend/version, the table,
its collection status, row count and whether servesim keeps it.

Run: python experiments/inspect_aiconfigurator.py [family ...]   (default: gemm attention moe)
"""

from __future__ import annotations

import sys

import pandas as pd
import pyarrow.parquet as pq

from servesim.data import aiconfigurator as aic

KEPT_TABLES = {"gemm_perf", "context_attention_perf", "generation_attention_perf", "moe_perf"}


def inventory(families: list[str]) -> pd.DataFrame:
    data_dir = aic.package_dir() / "systems" / "data"
    current = aic._current_versions()
    rows = []
    for system in aic.MEASURED_GPUS:
        for path in sorted(p for f in families for p in (data_dir / system / f).glob("*/*/*.parquet")):
            family, backend, version = path.parts[-4:-1]
            table = path.stem
            complete = aic._is_complete(path.parent, table)
            rows.append({
                "system": system, "family": family, "backend": backend, "version": version, "table": table,
                "complete": complete, "rows": pq.ParquetFile(path).metadata.num_rows,
                "kept": complete and table in KEPT_TABLES and current.get((system, backend)) == version,
            })
    return pd.DataFrame(rows)


if __name__ == "__main__":
    pd.set_option("display.width", 200)
    pd.set_option("display.max_rows", None)
    print(inventory(sys.argv[1:] or ["gemm", "attention", "moe"]).to_string(index=False))
