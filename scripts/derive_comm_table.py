"""Derive ``servesim/comm/comm_measurements.npz`` from aiconfigurator-core and Vidur's network CSVs.

    .venv/bin/python scripts/derive_comm_table.py [--vidur ../shared/data/vidur]

Needs the training extra (aiconfigurator-core). The engines' custom all-reduce rows of servers without NVLink are
left out: servesim never selects that kernel there (see ``servesim/comm/selection.py``), and on more than two PCIe
GPUs the engines disable it.
"""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np

from servesim.comm.measurements import TABLE_FILE, table_from_frame
from servesim.comm.systems import MEASURED_SYSTEMS
from servesim.data.comm import read_comm_measurements

_DEFAULT_VIDUR = Path(__file__).resolve().parents[2] / "shared" / "data" / "vidur"


@click.command()
@click.option("--vidur", "vidur_dir", type=click.Path(file_okay=False, path_type=Path), default=_DEFAULT_VIDUR,
              show_default=True, help="Vidur data folder (with network/).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              default=Path(__file__).resolve().parents[1] / "servesim" / "comm" / TABLE_FILE, show_default=True)
def main(vidur_dir: Path, out: Path) -> None:
    frame = read_comm_measurements(vidur_dir=vidur_dir if vidur_dir.exists() else None)
    without_nvlink = {name for name, s in MEASURED_SYSTEMS.items() if s.interconnect.nvlink_unidir_bandwidth_gbps == 0}
    frame = frame[~(frame["system"].isin(without_nvlink) & (frame["implementation"] != "nccl"))]
    frame = frame.sort_values(["system", "op", "implementation", "engine", "group_size", "nodes", "message_bytes"])
    np.savez_compressed(out, **table_from_frame(frame))
    click.echo(f"wrote {len(frame)} rows of {frame['system'].nunique()} systems to {out}")


if __name__ == "__main__":
    main()
