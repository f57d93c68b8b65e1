import pytest

from shoal.perf.sweep import parse_concurrency, parse_concurrency_range

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


@pytest.mark.parametrize(
    ("text", "levels"),
    [
        ("4", (4,)),  # end defaults to start
        ("1:4", (1, 2, 3, 4)),  # step defaults to 1
        ("1:8:2", (1, 3, 5, 7)),  # as perf_analyzer: 8 is not on a step
        ("2:8:2", (2, 4, 6, 8)),
        ("16:16:4", (16,)),
    ],
)
def test_perf_analyzer_concurrency_ranges(text, levels):
    assert parse_concurrency_range(text) == levels


@pytest.mark.parametrize("text", ["", "0", "8:4", "1:2:0", "1:2:3:4", "1::2", "a:b"])
def test_bad_perf_analyzer_ranges_are_refused(text):
    with pytest.raises(ValueError):
        parse_concurrency_range(text)
