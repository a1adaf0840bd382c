"""Derive ``servesim/comm/comm_measurements.npz`` from aiconfigurator-core and Vidur's network CSVs.

    .venv/bin/python tools/derive_comm_table.py [--vidur ../shared/data/vidur]

Needs the training extra (aiconfigurator-core). The engines' custom all-reduce rows of groups the engine would
never run its kernel on are left out (``servesim/comm/selection.py``): servers without NVLink, where the engines
disable it beyond two GPUs and servesim never selects it; vLLM groups spanning the compute trays of an NVL72
rack (vLLM keeps the kernel to one host); groups of 16 GPUs (both engines' kernels take 2 to 8). servesim cannot
be asked for those, so they neither train nor score the model. A new table needs new forests: run
``tools/fit_comm_forests.py`` next.
"""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np

from servesim.comm.measurements import TABLE_FILE, table_from_frame
from servesim.comm.selection import custom_ar_supported
from servesim.comm.systems import MEASURED_SYSTEMS
from servesim.comm.topology import group_topology
from servesim.data.comm import read_comm_measurements

_DEFAULT_VIDUR = Path(__file__).resolve().parents[2] / "shared" / "data" / "vidur"


def engine_runs_custom_kernel(system: str, engine: str, group_size: int, nodes: int) -> bool:
    topo = group_topology(MEASURED_SYSTEMS[system].interconnect, group_size, nodes)
    return custom_ar_supported(topo, engine)


@click.command()
@click.option("--vidur", "vidur_dir", type=click.Path(file_okay=False, path_type=Path), default=_DEFAULT_VIDUR,
              show_default=True, help="Vidur data folder (with network/).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              default=Path(__file__).resolve().parents[1] / "servesim" / "comm" / TABLE_FILE, show_default=True)
def main(vidur_dir: Path, out: Path) -> None:
    frame = read_comm_measurements(vidur_dir=vidur_dir if vidur_dir.exists() else None)
    configurations = frame[["system", "engine", "group_size", "nodes"]].drop_duplicates()
    runs = {tuple(key): key[1] == "" or engine_runs_custom_kernel(*key)
            for key in configurations.itertuples(index=False)}
    keep = [runs[key] for key in zip(frame["system"], frame["engine"], frame["group_size"], frame["nodes"])]
    click.echo(f"left out {len(frame) - sum(keep)} custom all-reduce rows of groups the engine does not run it on")
    frame = frame[keep].sort_values(["system", "op", "implementation", "engine", "version", "group_size", "nodes",
                                     "message_bytes"])
    np.savez_compressed(out, **table_from_frame(frame))
    click.echo(f"wrote {len(frame)} rows of {frame['system'].nunique()} systems to {out}")


if __name__ == "__main__":
    main()
