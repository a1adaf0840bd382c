import pytest

from servesim.comm.sizes import parse_bytes
from servesim.errors import ServesimError


@pytest.mark.parametrize("text, expected", [("4096", 4096), ("16MiB", 16 * 2**20), ("1.5 GB", 1.5e9), ("64k", 64000)])
def test_sizes_people_type(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "MiB", "16 parsecs", "-4", "0"])
def test_bad_sizes_are_rejected(text):
    with pytest.raises(ServesimError):
        parse_bytes(text)
