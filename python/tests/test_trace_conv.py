"""vramroom.trace's tables of what CUDA allocates unseen: hidden.py's measured conv events
(lookup by batch: exact, interpolated, scaled) and reduce.py's reduction staging. Pure
Python: the table logic needs no torch."""

from vramroom.trace.hidden import tokens_at

# forward: the output, then one workspace freed before the op returns
PTS = [(1, [["o", 100], ["t", 10], ["f", 0]]),
       (4, [["o", 400], ["t", 40], ["f", 0]]),
       (8, [["o", 800], ["t", 1000], ["t", 7], ["f", 1], ["f", 0]])]


def test_a_measured_batch_is_exact():
    assert tokens_at(PTS, 4) == PTS[1][1]


def test_between_two_batches_of_one_algorithm_sizes_are_on_the_line():
    assert tokens_at(PTS, 2) == [["o", 200], ["t", 20], ["f", 0]]


def test_where_the_algorithm_changes_the_nearer_batch_is_scaled():
    # 5 is nearer 4 (one workspace) than 8 (two): 4's events, scaled by 5/4
    assert tokens_at(PTS, 5) == [["o", 500], ["t", 50], ["f", 0]]
    # 7 is nearer 8
    assert tokens_at(PTS, 7) == [["o", 700], ["t", 875], ["t", 6], ["f", 1], ["f", 0]]


def test_past_the_largest_batch_the_largest_scales():
    assert tokens_at(PTS, 16) == [["o", 1600], ["t", 2000], ["t", 14], ["f", 1], ["f", 0]]


# Reduce.cuh's global staging: the buffers and semaphores real H100 snapshots show after a
# bias gradient's sum over M rows into N outputs (adam_capturable: M=1024; BERT: M=4096).
def test_reduction_staging_matches_the_h100_snapshots():
    from vramroom.trace.reduce import outer_staging

    assert outer_staging(1024, 2048, 4, 132, 2048) == (16777216, 64)
    assert outer_staging(1024, 8192, 4, 132, 2048) == (67108864, 256)
    assert outer_staging(4096, 512, 4, 132, 2048) == (16777216, 16)
    assert outer_staging(4096, 2048, 4, 132, 2048) == (67108864, 64)
    # few rows: the blocks reduce alone, nothing staged
    assert outer_staging(32, 2048, 4, 132, 2048) is None
