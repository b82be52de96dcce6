"""dlscale.memsize: the one reader of --max-memory, for infer and tune alike."""

from __future__ import annotations

import pytest

from dlscale.errors import UsageError
from dlscale.memsize import memory_spec, parse_memory, total_memory


@pytest.mark.parametrize("text, expected", [
    ("8000000000", 8_000_000_000), (8_000_000_000, 8_000_000_000), ("512K", 512 * 2**10), ("12000M", 12000 * 2**20),
    ("16G", 16 * 2**30), ("16GB", 16 * 2**30), ("16GiB", 16 * 2**30), ("16g", 16 * 2**30), ("1.5T", 3 * 2**39),
    (" 2G ", 2 * 2**30),
])
def test_amounts_are_bytes(text, expected):
    assert memory_spec(text) == expected == parse_memory(text, None)


def test_a_share_waits_for_its_total():
    assert memory_spec("70%") == "70%" and memory_spec("12.5 %") == "12.5%"
    assert parse_memory("70%", 1000) == 700 and parse_memory("50%", 80 * 2**30) == 40 * 2**30
    assert memory_spec(None) is None and parse_memory(None, 1000) is None
    with pytest.raises(UsageError, match="memory size is unknown"):
        parse_memory("70%", None)


@pytest.mark.parametrize("bad", ["lots", "", "16X", "nan", "inf", "-5", "0", "0%", "150%", "-10%", "0.5", True, "G"])
def test_nonsense_is_one_usage_line_naming_the_option(bad):
    with pytest.raises(UsageError) as e:
        memory_spec(bad, "--max-memory")
    assert str(e.value).startswith(f"--max-memory {bad!r}") and "\n" not in str(e.value)


def test_total_memory_is_the_machines():
    total = total_memory()
    assert total is None or total > 2**20
