import pytest

from shoal.perf.sweep import parse_concurrency

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(
    ("text", "levels"),
    [
        ("8", (8,)),
        ("1,8,64", (1, 8, 64)),
        (" 1 , 8 ", (1, 8)),
        ("64,8,1", (64, 8, 1)),  # the order given is kept
        ("1,1,8", (1, 8)),  # repeats are dropped
        ("1:16", (1, 2, 4, 8, 16)),
        ("3:20", (3, 6, 12, 20)),  # the end is always measured
        ("4:4", (4,)),
        ("1,4:16,64", (1, 4, 8, 16, 64)),
    ],
)
def test_sweeps(text, levels):
    assert parse_concurrency(text) == levels


@pytest.mark.parametrize("text", ["", "0", "-1", "1,,8", "eight", "16:4", "1:x", "1.5"])
def test_bad_sweeps_are_refused(text):
    with pytest.raises(ValueError):
        parse_concurrency(text)
