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


# iter_staging is setReduceConfig for any layout: a conv bias grad over a channels-last-
# strided grad (ViT's patch embedding, [16, 768, 14, 14]) splits where the contiguous one
# does not, as its real H100 snapshot shows (19267584 and 24 bytes); a full reduction of a
# transposed input is the contiguous one's (TensorIterator coalesces it).
def test_the_general_reduce_config_matches_the_h100():
    from vramroom.trace.reduce import full_reduce_staging, iter_staging

    cl = [150528, 1, 10752, 768]  # [N, C, H, W] strides of a permuted [N, HW, C] grad
    assert iter_staging([16, 768, 14, 14], cl, [0, 2, 3], 0, 132, 2048) == (19267584, 24)
    assert iter_staging([16, 768, 14, 14], [150528, 196, 14, 1], [0, 2, 3], 0, 132,
                        2048) is None
    # Adafactor's norm of T5's 32128 x 512 embedding (hf_t5_small_train_adafactor)
    assert full_reduce_staging(32128 * 512, 132) == (2112, 4)
    assert iter_staging([512, 32128], [1, 512], [0, 1], 0, 132, 2048) == (2112, 4)
    # ho_gather_scatter_einsum's mean: 313 blocks' partials and a semaphore
    assert full_reduce_staging(5008 * 512, 132) == (1252, 4)


# Embedding backward: every measured call (scripts/trace_corpus/embbwd: H100, PyTorch 2.11,
# int64 indices, 1024 to 262144 of them, vocabularies 2 to 128256, widths 64 to 1024, fp32,
# bf16 and fp16, padding_idx or not, values spread or few; EmbeddingBag's, sum and mean),
# its events against the rule's.
def _embedding_measured():
    import glob
    import json
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    pattern = os.path.join(here, "..", "..", "scripts", "trace_corpus", "embbwd", "h100-run2*.json")
    for path in sorted(glob.glob(pattern)):
        for e in json.load(open(path))["entries"]:
            if e["idx"] == "int64" and not e["freq"]:
                yield e


def test_embedding_backward_events_match_every_h100_measurement():
    from vramroom.trace.hidden import embedding_tokens

    elem = {"float32": 4, "bfloat16": 2, "float16": 2}
    seen = 0
    for e in _embedding_measured():
        toks = embedding_tokens(e["n"], e["V"], e["D"], elem[e["dtype"]], bag="mode" in e)
        if toks is None:  # the output alone
            assert e["events"] == [["o", e["V"] * e["D"] * elem[e["dtype"]]]], e
        else:
            assert [t for t in e["events"] if t[0] != "o"] == [t for t in toks if t[0] != "o"], (
                e["n"], e["V"], e["D"], e["dtype"])
        seen += 1
    if seen == 0:
        import pytest

        pytest.skip("scripts/trace_corpus/embbwd is not in this tree (a source checkout has it)")
    assert seen >= 800, seen


# sort, topk and cumsum: every measured call (scripts/trace_corpus/ops: H100, PyTorch 2.11,
# device run 26) against vramroom.trace.sorting's rules, token for token.
def _ops_measured():
    import json
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    p = os.path.join(here, "..", "..", "scripts", "trace_corpus", "ops", "ops-h100-run26.json")
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return json.load(f)


def test_sort_topk_cumsum_multinomial_index_put_events_match_every_h100_measurement():
    from vramroom.trace import sorting

    doc = _ops_measured()
    if doc is None:
        import pytest

        pytest.skip("scripts/trace_corpus/ops is not in this tree (a source checkout has it)")
    size = {"float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "bool": 1}
    seen = 0
    for e in doc["entries"]:
        shape = [e.get("rows"), e.get("cols")]
        if e["op"] == "sort":
            dim = e["dim"] % 2
            toks, why = sorting.sort_tokens(shape, dim, size[e["dtype"]], dim == 1)
        elif e["op"] == "topk":
            toks, why = sorting.topk_tokens(shape, 1, e["k"], e["sorted"], size[e["dtype"]],
                                            doc["sms"])
        elif e["op"] == "cumsum":
            n = e["rows"] * e["cols"]
            out = 8 if e["dtype"] in ("bool", "int64") else 4
            toks = sorting.cumsum_tokens(n, e["cols"] if e["dim"] == -1 else e["rows"],
                                         size[e["dtype"]], out, e["dtype"] == "bool")
            toks, why = toks or [["o", 0]], None
        elif e["op"] == "index_put_acc":
            toks, why = sorting.index_put_acc_tokens(e["n"], e["V"], 0), None
        elif e["op"] == "multinomial":
            toks = sorting.multinomial_tokens(e["rows"], e["cols"], e["samples"], e["replacement"],
                                              size[e["dtype"]], doc["sms"])
            why = None
        else:
            continue
        assert toks is not None, (e, why)
        want = [[k, 0] if k == "o" else [k, v] for k, v in e["events"]]
        assert toks == want, e
        seen += 1
    assert seen >= 460, seen


def test_sort_refuses_what_was_not_measured():
    from vramroom.trace import sorting

    toks, why = sorting.sort_tokens([5000, 8], 0, 4, False)
    assert toks is None and "innermost" in why
    toks, why = sorting.topk_tokens([1, 100000], 1, 5000, True, 4, 132)
    assert toks is None and "sorted topk" in why
    # unsorted, the same topk is modelled
    assert sorting.topk_tokens([1, 100000], 1, 5000, False, 4, 132)[0] is not None
