"""The measured systems' interconnect figures agree with the GPU catalogue where it has the GPU."""

import pytest

from servesim.comm.measurements import load_table
from servesim.comm.systems import MEASURED_SYSTEMS
from servesim.comm.topology import Interconnect
from servesim.errors import ServesimError
from servesim.hardware import get_gpu


@pytest.mark.parametrize("name", [n for n, s in MEASURED_SYSTEMS.items() if not n.startswith("vidur_")])
def test_interconnect_matches_catalogue(name):
    system = MEASURED_SYSTEMS[name]
    try:
        gpu = get_gpu(system.gpu)
    except ServesimError:
        pytest.skip(f"{system.gpu} is not in the catalogue yet")
    assert gpu.nvlink_unidir_bandwidth_gbps == pytest.approx(system.interconnect.nvlink_unidir_bandwidth_gbps, rel=0.05)
    assert gpu.nvswitch == system.interconnect.nvswitch
    assert gpu.architecture == system.interconnect.architecture
    assert Interconnect.from_gpu(gpu).gpus_per_host == system.interconnect.gpus_per_host


def test_every_shipped_system_is_described():
    assert set(load_table().systems) <= set(MEASURED_SYSTEMS)
