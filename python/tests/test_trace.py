"""vramroom.trace: PyTorch programs traced on fake CUDA, on a CPU-only machine.

Needs a CUDA build of PyTorch 2.11 (no GPU); skipped when torch is absent. Each test runs its
trace in a fresh interpreter (the tracer patches torch.cuda for the trace and PyTorch's CUDA
hooks for the process) and reads a JSON summary back.
"""

import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="vramroom.trace tests need PyTorch (CPU-only machine is fine)")
if not hasattr(torch, "_subclasses") or not torch.__version__.startswith("2.11"):
    pytest.skip("vramroom.trace supports PyTorch 2.11.x; this is %s" % getattr(torch, "__version__", "?"),
                allow_module_level=True)
if torch.version.cuda is None:
    pytest.skip("vramroom.trace needs a CUDA build of PyTorch (no GPU needed)", allow_module_level=True)

MIB = 1 << 20
CUBLAS = 32 * MIB  # Hopper's cuBLAS handle workspace (cuda_hidden.json, sm90)
LT = 1 * MIB


def _binary():
    env = os.environ.get("VRAMROOM_BIN")
    if env and os.path.exists(env):
        return env
    for p in (Path(sys.executable).parent / "vramroom",
              Path(__file__).resolve().parents[2] / "target" / "release" / "vramroom"):
        if p.exists():
            return str(p)
    return shutil.which("vramroom")


def _env():
    e = dict(os.environ)
    e.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    import vramroom

    e["PYTHONPATH"] = os.pathsep.join(
        [str(Path(vramroom.__file__).resolve().parents[1])] + [p for p in [e.get("PYTHONPATH")] if p])
    b = _binary()
    if b:
        e["VRAMROOM_BIN"] = b
    return e


def run_traced(body, tmp_path, gpu="h100"):
    """Runs `body` (Python, with torch imported) under vramroom.trace in a fresh interpreter;
    returns the events (action, size, stream) and the Trace's summary."""
    src = textwrap.dedent("""
        import json, pickle, sys, torch
        import vramroom.trace as vt
        with vt.trace(gpu=%r) as t:
        %s
        t.snapshot(%r)
        json.dump({"events": [[e[0], e[2], e[3]] for e in t.events],
                   "peak": t.peak_allocated, "warnings": t.warnings,
                   "hidden": t.hidden_stats,
                   "frames": [[list(f) for f in e[4][:3]] for e in t.events]},
                  open(%r, "w"))
        # A failure's message then says whether the program died before or after its trace
        print("traced program: trace written", flush=True)
    """) % (gpu, textwrap.indent(textwrap.dedent(body), "    "), str(tmp_path / "snap.pickle"),
            str(tmp_path / "out.json"))
    script = tmp_path / "traced.py"
    script.write_text(src)
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=_env(),
                       timeout=600)
    if p.returncode != 0:
        raise AssertionError("traced program failed:\n%s\n%s" % (p.stdout, p.stderr))
    return json.loads((tmp_path / "out.json").read_text())


def allocs(events):
    return [(e[1], e[2]) for e in events if e[0] == "alloc"]


def alloc_free(out):
    """The trace's allocations and free requests as ("alloc" | "free_", size), in order."""
    return [(a[:5], s) for a, s, _ in out["events"] if a in ("alloc", "free_requested")]


MLP = """
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).cuda()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randn(2, 8, device="cuda")
"""


def test_mlp_train_step_allocates_what_cuda_would(tmp_path):
    out = run_traced(MLP + """
    loss = m(x).sum()
    loss.backward()
    opt.step()
    """, tmp_path)
    ev = out["events"]
    sizes = [s for s, _ in allocs(ev)]
    # .cuda(): each parameter once, in order (w1 16x8, b1 16, w2 4x16, b2 4 floats), then x.
    assert sizes[:5] == [512, 64, 256, 16, 64]
    # Forward: addmm's output, then the first matmul's cuBLAS workspace and (bias: cuBLASLt)
    # its workspace; relu's output; the second addmm; the sum.
    assert sizes[5:11] == [2 * 16 * 4, CUBLAS, LT, 2 * 16 * 4, 2 * 4 * 4, 4]
    # Backward runs on autograd's device thread: its own cuBLAS handle, once.
    assert sizes.count(CUBLAS) == 2 and sizes.count(LT) == 1
    # Every parameter gets a gradient of its own size.
    for p in (512, 64, 256, 16):
        assert sizes.count(p) >= 2, (p, sizes)
    # Frees come in request/complete pairs on the default stream.
    req = [e for e in ev if e[0] == "free_requested"]
    comp = [e for e in ev if e[0] == "free_completed"]
    assert len(req) == len(comp) and all(e[2] == 0 for e in ev)
    # The user's lines are in the frames.
    assert any("traced.py" in f[0] for fr in out["frames"] for f in fr)


def test_addmm_takes_cublaslt_only_where_pytorch_allows_it(tmp_path):
    # isInputCompliesAddmmCudaLt in PyTorch 2.11: no size-1 dimension in mat2. A head with
    # one output feature (device run 44's hg_rnn3_forecast) goes to plain cuBLAS, without the
    # 1 MiB Lt workspace; a one-row batch through a wider Linear takes it (device runs 28 and
    # 45: hq_mobilenet_v2_infer_fp16_batches' batch-1 classifier, hk_mlp_bs1_online_regression),
    # once.
    out = run_traced("""
    x1 = torch.randn(2, 8, device="cuda")
    head = torch.nn.Linear(8, 1).cuda()
    y = head(x1)
    row = torch.nn.Linear(8, 16).cuda()
    z = row(torch.randn(1, 8, device="cuda"))
    w = row(x1)
    """, tmp_path)
    sizes = [s for s, _ in allocs(out["events"])]
    assert sizes.count(CUBLAS) == 1 and sizes.count(LT) == 1, sizes
    # the Lt workspace comes right after the one-row call's output
    assert sizes[-3:] == [1 * 16 * 4, LT, 2 * 16 * 4], sizes


def test_forward_only_holds_less_than_training(tmp_path):
    fwd = run_traced(MLP + """
    with torch.no_grad():
        y = m(x)
    """, tmp_path)
    train = run_traced(MLP + """
    m(x).sum().backward()
    opt.step()
    """, tmp_path)
    assert fwd["peak"] < train["peak"]
    assert [s for s, _ in allocs(fwd["events"])].count(CUBLAS) == 1


def test_snapshot_replays_in_the_cli(tmp_path):
    b = _binary()
    if not b:
        pytest.skip("no vramroom binary (VRAMROOM_BIN, the package's, or PATH)")
    out = run_traced(MLP + """
    for _ in range(2):
        m(x).sum().backward()
        opt.step()
        opt.zero_grad()
    """, tmp_path)
    snap = pickle.load(open(tmp_path / "snap.pickle", "rb"))
    assert set(snap) >= {"segments", "device_traces", "allocator_settings"}
    assert snap["device_traces"][0][0]["action"] == "alloc"
    p = subprocess.run([b, "replay", "--json", str(tmp_path / "snap.pickle")],
                       capture_output=True, text=True, check=True)
    (row,) = json.loads(p.stdout)
    assert row["num_ooms"] == 0
    assert row["peak_allocated_bytes"] == out["peak"]
    assert row["peak_reserved_bytes"] >= row["peak_allocated_bytes"]


def test_unmodellable_ops_are_named(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text("import torch\nx = torch.randn(10, device='cuda')\nprint(torch.nonzero(x > 0))\n")
    p = subprocess.run([sys.executable, "-m", "vramroom.trace", "--", str(script)],
                       capture_output=True, text=True, env=_env(), timeout=600)
    assert p.returncode == 2
    assert "aten.nonzero" in p.stderr and "data-dependent" in p.stderr
    assert "at %s:3" % script in p.stderr, p.stderr  # where the user called it
    # one_hot without num_classes reads max() back inside its composite: refused too
    script.write_text("import torch\nx = torch.randint(0, 5, (10,), device='cuda')\n"
                      "torch.nn.functional.one_hot(x)\n")
    p = subprocess.run([sys.executable, "-m", "vramroom.trace", "--", str(script)],
                       capture_output=True, text=True, env=_env(), timeout=600)
    assert p.returncode == 2 and "aten.one_hot" in p.stderr and "num_classes" in p.stderr
    script.write_text("import torch\nf = torch.compile(lambda x: x * 2)\nf(torch.randn(3, device='cuda'))\n")
    p = subprocess.run([sys.executable, "-m", "vramroom.trace", "--", str(script)],
                       capture_output=True, text=True, env=_env(), timeout=600)
    assert p.returncode == 2 and "torch.compile" in p.stderr
    # an op with no fake kernel on CUDA tensors: named, not a "no NVIDIA driver" traceback
    # from the real kernel fake mode would fall back to (TransformerEncoder's fast path)
    script.write_text(
        "import torch\nenc = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(\n"
        "    32, 2, 64, batch_first=True), 2).cuda().eval()\n"
        "m = torch.zeros(2, 8, dtype=torch.bool, device='cuda')\n"
        "with torch.no_grad():\n    enc(torch.randn(2, 8, 32, device='cuda'), src_key_padding_mask=m)\n")
    p = subprocess.run([sys.executable, "-m", "vramroom.trace", "--", str(script)],
                       capture_output=True, text=True, env=_env(), timeout=600)
    assert p.returncode == 2 and "_nested_tensor_from_mask_left_aligned" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr, p.stderr


def test_an_unmeasured_fft_size_is_refused_by_name_and_the_rnn_module_comes_back():
    import torch
    import torch.nn.modules.rnn as rnn
    import torch.nn.utils.rnn as rnn_utils

    import vramroom
    from vramroom.trace.capture import UnsupportedOp

    vf, uvf, flatten = rnn._VF, rnn_utils._VF, rnn.RNNBase.flatten_parameters
    with pytest.raises(UnsupportedOp) as e:
        with vramroom.trace(gpu="h100"):
            torch.fft.rfft(torch.randn(4, 12345, device="cuda"))
    msg = str(e.value)
    assert "_fft_r2c" in msg and "12345-point float32" in msg and "measure_fft.py" in msg, msg
    assert rnn._VF is vf and rnn_utils._VF is uvf and rnn.RNNBase.flatten_parameters is flatten
    # off the trace, and on the CPU inside one, an LSTM runs as before
    assert torch.nn.LSTM(4, 4)(torch.randn(2, 3, 4))[0].shape == (2, 3, 4)
    with vramroom.trace(gpu="h100"):
        assert torch.nn.LSTM(4, 4)(torch.randn(2, 3, 4))[0].shape == (2, 3, 4)


def test_ffts_allocate_what_cufft_does(tmp_path):
    # device run 45 measured these calls (fft/runs/fft-h100-run45.json): a C2R clones its
    # input before its work area (n = 500: 4 bytes a point and signal, all freed, the work
    # area first); stft's overlapping frames at batch 8 do not collapse into one batch dim,
    # so _exec_fft copies them first; an R2C of 2^15 points takes 128 KiB at batch 1
    out = run_traced("""
    x = torch.randn(2, 251, dtype=torch.complex64, device="cuda")
    y = torch.fft.irfft(x, n=500)
    sig = torch.randn(8, 16000, device="cuda")
    frames = sig.unfold(-1, 512, 128)
    s = torch.fft.rfft(frames)
    r = torch.fft.rfft(torch.randn(1, 32768, device="cuda"))
    """, tmp_path)
    af = alloc_free(out)
    i = af.index(("alloc", 2 * 500 * 4))
    assert af[i:i + 5] == [("alloc", 4000), ("alloc", 2 * 251 * 8), ("alloc", 4000),
                           ("free_", 4000), ("free_", 2 * 251 * 8)], af[i:i + 5]
    n_frames = (16000 - 512) // 128 + 1
    j = af.index(("alloc", 8 * n_frames * 257 * 8))
    assert af[j + 1:j + 3] == [("alloc", 8 * n_frames * 512 * 4),
                               ("free_", 8 * n_frames * 512 * 4)], af[j:j + 3]
    k = af.index(("alloc", 16385 * 8))
    assert af[k + 1:k + 3] == [("alloc", 131072), ("free_", 131072)], af[k:k + 3]


def test_istfts_own_window_check_is_presumed_passed_and_other_equals_refused(tmp_path):
    # istft asks is_scalar_tensor_true(window envelope too small), an equal() of two 0-dim
    # bools: a fake flag has no value, so the check is presumed passed, with a warning;
    # torch.equal of data stays refused
    out = run_traced("""
    w = torch.hann_window(512, device="cuda")
    s = torch.stft(torch.randn(2, 16384, device="cuda"), 512, 128, window=w,
                   return_complex=True)
    y = torch.istft(s, 512, 128, window=w)
    assert y.shape == (2, 16384)
    a = torch.randn(3, device="cuda")
    try:
        torch.equal(a, a + 1)
        raise SystemExit("torch.equal of fake data answered")
    except Exception as e:
        assert "aten.equal" in str(e), e
    """, tmp_path)
    assert any("istft" in w for w in out["warnings"]), out["warnings"]


def test_an_lstm_flattens_its_weights_into_one_block_and_its_grads_share_one(tmp_path):
    # LSTM(8, 16, 2 layers): per layer 4 gates x 16 x (input + 16) weights and two biases
    # a gate; .cuda() makes each parameter, then cuDNN's flat buffer (zeros), and the
    # parameters' own blocks go as they are re-pointed at it. Each backward writes one flat
    # gradient buffer that all the .grad tensors lie in; zero_grad frees it whole.
    # LSTM(64, 128, 2 layers) at 16 x 50: a shape device run 41 measured (rnn_events_sm90.json)
    out = run_traced("""
    m = torch.nn.LSTM(64, 128, num_layers=2, batch_first=True).cuda()
    assert len({p.untyped_storage()._cdata for p in m.parameters()}) == 1
    x = torch.randn(16, 50, 64, device="cuda")
    seen = []
    for _ in range(3):
        y, (h, c) = m(x)
        y.sum().backward()
        st = {p.grad.untyped_storage()._cdata for p in m.parameters()}
        assert len(st) == 1
        seen.append(torch.cuda.memory_allocated())
        m.zero_grad()
    assert seen[0] == seen[1] == seen[2], seen
    """, tmp_path)
    flat = 4 * (4 * 128 * (64 + 128) + 2 * 4 * 128 + 4 * 128 * (128 + 128) + 2 * 4 * 128)
    af = alloc_free(out)
    sizes = [s for a, s in af if a == "alloc"]
    assert flat in sizes
    first = sizes.index(flat)
    # the eight parameters first, then the flat block, then their frees
    assert [a for a, _ in af[first + 1:first + 9]] == ["free_"] * 8
    assert sizes.count(flat) == 1 + 3  # the weights' block and each backward's gradients
    # the forward as the GPU ran it (device run 41): the input's sequence-major copy, output,
    # h_n, c_n, the workspace, the reserve space; the workspace and the copy freed
    af = alloc_free(out)
    i = af.index(("alloc", 26632576)) - 4
    fwd = af[i:i + 8]
    assert fwd == [("alloc", 204800), ("alloc", 409600), ("alloc", 16384), ("alloc", 16384),
                   ("alloc", 26632576), ("alloc", 4505856), ("free_", 26632576),
                   ("free_", 204800)], fwd


def test_an_unflattened_lstm_under_no_grad_frees_its_reserve_before_its_weights_copy(tmp_path):
    # bfloat16 weights are not flattened, so each call copies them into a new buffer; in
    # training mode under no_grad, _cudnn_rnn's reserve and that copy are dropped as
    # RNN.cpp's std::tuple goes, first to last (device run 44's hg_lstm_bf16_tagger)
    out = run_traced("""
    m = torch.nn.LSTM(256, 1024).cuda().to(torch.bfloat16)
    with torch.no_grad():
        y, _ = m(torch.randn(200, 64, 256, device="cuda", dtype=torch.bfloat16))
    """, tmp_path)
    af = alloc_free(out)
    wbuf = 2 * (4 * 1024 * (256 + 1024) + 2 * 4 * 1024)
    i = max(k for k, e in enumerate(af) if e == ("alloc", wbuf))
    made = [s for a, s in af[i + 1:] if a == "alloc"]
    ws, reserve = made[0], made[1]
    frees = [s for a, s in af[i + 1:] if a == "free_"]
    assert frees[:3] == [ws, reserve, wbuf], (made, frees)


def test_an_rnn_shape_cudnn_was_not_measured_for_is_refused_by_name():
    import torch

    import vramroom
    from vramroom.trace.capture import UnsupportedOp

    with pytest.raises(UnsupportedOp) as e:
        with vramroom.trace(gpu="h100"):
            torch.nn.GRU(8, 16).cuda()(torch.randn(4, 2, 8, device="cuda"))
    assert "GRU(input 8, hidden 16, 1 layers) at batch 2 x 4 steps" in str(e.value)
    assert "not measured" in str(e.value) and "measure_rnn.py" in str(e.value)
    assert "segments.py" in str(e.value)


def test_an_rnn_shape_only_cudnns_segments_cover_traces_with_cudnns_sizes(tmp_path):
    # GRU(256, 128) was never measured op by op (rnn_events_sm90.json lacks it); device run
    # 43's segments cover it. At batch 16 x 50 steps device run 42 asked cuDNN itself
    # (query_ws.py, exact on all 725 of run 41's measurements): a training workspace of
    # 18,448,768 bytes (the backward's too), a reserve of 2,457,856, an inference one of
    # 16,384,384
    out = run_traced("""
    m = torch.nn.GRU(256, 128, batch_first=True).cuda()
    x = torch.randn(16, 50, 256, device="cuda")
    m(x)[0].sum().backward()
    m.eval()
    with torch.no_grad():
        m(x)
    """, tmp_path)
    sizes = [s for a, s in alloc_free(out) if a == "alloc"]
    assert sizes.count(18448768) == 3, sizes  # the forward's, and backward data's and weights'
    assert 2457856 in sizes and sizes.count(16384384) == 1


def test_ctc_loss_runs_pytorchs_own_kernels_step_by_step(tmp_path):
    # F.ctc_loss on padded int64 targets (PyTorch's own kernels, LossCTC.cu), batch 4,
    # 20 steps, 6 classes, targets of 3 to 5: the forward makes the target lengths, the input
    # lengths and the batch offsets (int64 [4]), log_alpha [4, 20, 2 x 5 + 1] and the loss;
    # the three go as input lengths, target lengths, offsets (device run 41's hp_crnn_ctc
    # snapshot's addresses). The backward: the three again, log_beta, the gradient [20, 4,
    # 6], then log_beta and the three
    out = run_traced("""
    lp = torch.randn(20, 4, 6, device="cuda", requires_grad=True)
    tg = torch.randint(1, 6, (4, 5), device="cuda")
    il = torch.full((4,), 20, dtype=torch.long)
    tl = torch.tensor([5, 3, 4, 5])
    loss = torch.nn.functional.ctc_loss(lp.log_softmax(2), tg, il, tl)
    loss.backward()
    """, tmp_path)
    af = alloc_free(out)
    alpha = 4 * 20 * 11 * 4
    i = af.index(("alloc", alpha))
    assert af[i - 3:i + 5] == [("alloc", 32)] * 3 + [("alloc", alpha), ("alloc", 16)] + \
        [("free_", 32)] * 3, af[i - 3:i + 5]
    j = af.index(("alloc", alpha), i + 1)
    grad = 20 * 4 * 6 * 4
    assert af[j - 3:j + 6] == [("alloc", 32)] * 3 + [("alloc", alpha), ("alloc", grad),
                                                     ("free_", alpha)] + [("free_", 32)] * 3
    assert not out["warnings"] or all("CTC" not in w for w in out["warnings"])


def test_max_pool_backward_copies_a_permuted_gradient(tmp_path):
    # CUDA's max_pool2d backward takes grad_output contiguous (in the input's memory format)
    # after grad_input, freed as it returns: a gradient coming back through a permute, as in
    # device run 41's CRNN (2 MiB there), is copied (as is sum()'s expanded one); a dense
    # one is not
    out = run_traced("""
    x = torch.randn(2, 8, 4, 16, device="cuda", requires_grad=True)
    y = torch.nn.functional.max_pool2d(x, (4, 1))            # [2, 8, 1, 16]
    y.squeeze(2).permute(2, 0, 1).contiguous().sum().backward()
    z = torch.nn.functional.max_pool2d(x, (4, 1))
    w = torch.randn(2, 8, 1, 16, device="cuda")
    (z * w).sum().backward()  # z's gradient is w times the sum's: dense
    """, tmp_path)
    af = alloc_free(out)
    gin, gout = 2 * 8 * 4 * 16 * 4, 2 * 8 * 16 * 4  # grad_input; grad_output (and y)
    copied = [("alloc", gin), ("alloc", gout), ("free_", gout)]
    at = [i for i in range(len(af) - 2) if af[i:i + 3] == copied]
    assert len(at) == 1, af  # the first backward only
    assert af.count(("alloc", gin)) == 3, af  # x and the two grad_inputs


def test_ctc_loss_on_cudnns_path_or_unknown_lengths_is_refused_by_name():
    import torch

    import vramroom
    from vramroom.trace.capture import UnsupportedOp

    lp = dict(device="cuda")
    with pytest.raises(UnsupportedOp) as e:  # int32 concatenated targets on the host: cuDNN
        with vramroom.trace(gpu="h100"):
            torch.nn.functional.ctc_loss(torch.randn(20, 2, 6, **lp).log_softmax(2),
                                         torch.tensor([1, 2, 3, 1, 2], dtype=torch.int32),
                                         [20, 20], [3, 2])
    assert "cuDNN's CTC loss" in str(e.value)
    assert torch.ctc_loss.__module__ != "vramroom.trace.ctc"  # put back
    with pytest.raises(UnsupportedOp) as e:  # concatenated targets, lengths drawn on the GPU
        with vramroom.trace(gpu="h100"):
            tl = torch.randint(1, 4, (2,), **lp)
            torch.nn.functional.ctc_loss(torch.randn(20, 2, 6, **lp).log_softmax(2),
                                         torch.randint(1, 6, (5,), **lp), [20, 20], tl)
    assert "concatenated" in str(e.value)


def test_packed_sequences_and_bf16_cells_trace(tmp_path):
    # pack_padded_sequence on the lengths' host values: the packed data is sum(lengths)
    # rows (the lengths measure_rnn.py drew for its packed LSTM at batch 4); GRUCell runs
    # PyTorch's fused cell, which has no meta kernel
    out = run_traced("""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
    m = torch.nn.LSTM(64, 128, batch_first=True).cuda()
    x = torch.randn(4, 50, 64, device="cuda", requires_grad=True)
    lengths = torch.tensor([16, 50, 30, 49])
    p = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    assert p.data.shape == (145, 64) and p.batch_sizes.tolist()[:17] == [4] * 16 + [3]
    y, _ = m(p)
    out, lens = pad_packed_sequence(y, batch_first=True)
    assert out.shape == (4, 50, 128) and lens.shape == (4,)
    out.sum().backward()
    assert x.grad.shape == x.shape
    c = torch.nn.GRUCell(4, 6).cuda()
    c(torch.randn(5, 4, device="cuda")).sum().backward()
    """, tmp_path)
    # the packed forward as device run 41 measured it: output, h_n, c_n, workspace, reserve
    sizes = [s for a, s in alloc_free(out) if a == "alloc"]
    i = sizes.index(74240)
    assert sizes[i:i + 5] == [74240, 2048, 2048, 9091328, 371456], sizes[i:i + 5]


def test_bad_input_exits_2(tmp_path):
    p = subprocess.run([sys.executable, "-m", "vramroom.trace", "--gpu", "v100", "--", "x.py"],
                       capture_output=True, text=True, env=_env(), timeout=600)
    assert p.returncode == 2 and "unknown --gpu" in p.stderr
    p = subprocess.run([sys.executable, "-m", "vramroom.trace", "--", str(tmp_path / "none.py")],
                       capture_output=True, text=True, env=_env(), timeout=600)
    assert p.returncode == 2 and "no such script" in p.stderr


def test_a_program_that_allocates_nothing_is_a_zero_report(tmp_path):
    # nothing to replay: peaks of zero under every config, not an error
    script = tmp_path / "empty.py"
    script.write_text("import torch\nx = torch.tensor([], device='cuda')\n")
    p = subprocess.run([sys.executable, "-m", "vramroom.trace", "--json", "--what-if",
                        "expandable_segments:True", "--", str(script)],
                       capture_output=True, text=True, env=_env(), timeout=600)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["events"] == 0 and len(r["configs"]) == 2
    assert all(c["peak_reserved_bytes"] == 0 and not c["oom"] for c in r["configs"])


def test_other_pytorch_versions_are_refused(monkeypatch):
    from vramroom.trace import TraceError, check_torch

    monkeypatch.setattr(torch, "__version__", "2.9.1+cu128")
    with pytest.raises(TraceError, match=r"2\.11\.x only.*2\.9\.1"):
        check_torch()


def test_autograds_device_thread_lets_go_of_the_last_backward_before_the_program_ends(tmp_path):
    # The device thread drops a finished graph task after waking backward()'s caller, and
    # that drop takes the GIL (the task's dispatch modes); at interpreter shutdown it ended
    # the process with "terminate called" (4 of 170 traced tests under two xdist workers).
    # The trace's exit waits for the drop: a second drain finds the thread idle at once.
    script = tmp_path / "p.py"
    script.write_text(textwrap.dedent("""
        import time, torch
        import vramroom.trace as vt
        from vramroom.trace import engine
        with vt.trace(gpu="h100"):
            x = torch.randn(64, 64, device="cuda", requires_grad=True)
            (x @ x).relu().sum().backward()
        assert len(engine._ENGINE_BARRIER) == 1, engine._ENGINE_BARRIER
        t0 = time.perf_counter()
        assert engine.drain() is True
        print("drained in %.3f s" % (time.perf_counter() - t0))
    """))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=_env(),
                       timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "drained in" in p.stdout, p.stdout


def test_data_dependent_sizes_come_from_the_values_the_trace_knows(tmp_path):
    # nonzero, masked_select, x[mask], unique: sized by masks and values the trace follows
    # (an arange's, a uniform fill's, randint's bounds), the data beside a mask unknown
    out = run_traced("""
    labels = torch.randint(0, 4, (8,), device="cuda")
    li = (labels.long() >= 0).nonzero()          # DeBERTa-v2's loss: every label kept
    assert tuple(li.shape) == (8, 1), li.shape
    assert (labels < 4).nonzero().shape[0] == 8 and (labels == 7).nonzero().shape[0] == 0
    x = torch.randn(1000, 64, device="cuda")
    pos = torch.arange(1000, device="cuda")
    assert tuple(x[pos % 4 == 0].shape) == (250, 64)
    assert tuple(x[:, 0].masked_select(pos < 100).shape) == (100,)
    assert tuple(torch.unique(pos % 10, return_counts=True)[1].shape) == (10,)
    assert tuple(torch.ones(3000000, dtype=torch.bool, device="cuda").nonzero().shape) == \
        (3000000, 1)
    labels[0] = 5                                 # a write forgets the bounds
    try:
        (labels < 4).nonzero()
        raise SystemExit("an unknown mask was sized")
    except Exception as e:
        assert "data-dependent" in str(e), e
    """, tmp_path)
    sizes = [s for a, s, _ in out["events"] if a == "alloc"]
    assert 8 * 1 * 8 in [s for s in sizes], sizes          # li: 8 x 1 int64 (64 bytes)
    assert 3000000 * 8 in sizes and 250 * 64 * 4 in sizes and 100 * 4 in sizes


def test_known_values_are_forgotten_when_their_storage_dies():
    # values.py keys what it knows by storage address; a stale entry answered for a new
    # storage at a reused address (Wav2Vec2's LayerDrop draw read an old shadow's value,
    # and traces of one program skipped different layers)
    import gc

    from torch._subclasses.fake_tensor import FakeTensorMode

    from vramroom.trace.values import Values

    vals = Values()
    with FakeTensorMode():
        t = torch.ones(4)
        u = torch.ones(3)
    vals.presume(t, 1)
    vals.presume(u, 2)
    k = vals.key(t)
    assert vals.known(t) == 1 and k in vals.v
    del t
    gc.collect()
    assert k not in vals.v and vals.known(u) == 2


def test_each_backward_returns_after_the_device_thread_dropped_its_graph(tmp_path):
    # torch.func per-sample gradients: the device thread's drop of each finished graph task
    # raced backward()'s caller for the GIL, so concurrent traces of one program gave
    # different event orders (three of three here, and ht_func_per_sample_grads four of four
    # beside two other traces), where the GPU frees before the caller goes on. With each
    # backward waiting for the drop (engine.py), three concurrent traces give one sequence.
    script = tmp_path / "p.py"
    script.write_text(textwrap.dedent("""
        import hashlib, torch, torch.nn as nn, torch.nn.functional as F
        from torch.func import functional_call, grad, vmap
        import vramroom.trace as vt
        with vt.trace(gpu="h100") as t:
            model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Flatten(),
                                  nn.Linear(8 * 16 * 16, 10)).cuda()
            params = {k: v.detach() for k, v in model.named_parameters()}
            def loss_one(p, x, y):
                out = functional_call(model, p, (x.unsqueeze(0),))
                return F.cross_entropy(out, y.unsqueeze(0))
            per_sample = vmap(grad(loss_one), in_dims=(None, 0, 0))
            for step in range(4):
                x = torch.randn(32, 1, 16, 16, device="cuda")
                y = torch.randint(0, 10, (32,), device="cuda")
                g = per_sample(params, x, y)
                params = {k: params[k] - 0.1 * g[k].sum(0) for k in params}
        seq = repr([(e[0], e[2]) for e in t.events]).encode()
        print(hashlib.md5(seq).hexdigest(), len(t.events))
    """))
    procs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=_env()) for _ in range(3)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, out + err
        outs.append(out.strip().splitlines()[-1])
    assert len(set(outs)) == 1, outs


def test_side_stream_and_record_stream(tmp_path):
    out = run_traced("""
    x = torch.randn(256, 256, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = x * 2            # allocated on the side stream
    torch.cuda.current_stream().wait_stream(s)
    y.record_stream(torch.cuda.current_stream())
    z = y + 1
    del y                    # free requested now; the main stream may still be reading it
    w = torch.empty(1000, device="cuda")            # main stream: y's block still pending
    with torch.cuda.stream(s):
        v = torch.empty(2000, device="cuda")        # the block's own stream: now completed
    torch.cuda.synchronize()
    """, tmp_path)
    ev = out["events"]
    side = [e for e in ev if e[0] == "alloc" and e[2] != 0]
    assert side[0][1] == 256 * 256 * 4
    sid = side[0][2]
    i = next(k for k, e in enumerate(ev) if e[0] == "free_requested" and e[2] == sid)
    j = next(k for k, e in enumerate(ev) if e[0] == "free_completed" and e[2] == sid)
    # Deferred (record_stream): not completed by the main stream's allocation, but just
    # before the next allocation on its own stream.
    assert i < j
    assert [e[1] for e in ev[i:j] if e[0] == "alloc"] == [4000]
    assert ev[j + 1][0] == "alloc" and ev[j + 1][1] == 8000 and ev[j + 1][2] == sid


def test_cuda_api_answers_from_the_trace(tmp_path):
    out = run_traced("""
    assert torch.cuda.is_available() and torch.cuda.device_count() == 1
    assert torch.cuda.get_device_name() == "NVIDIA H100 80GB HBM3"
    assert torch.cuda.get_device_capability() == (9, 0)
    a = torch.empty(1024, device="cuda")
    assert torch.cuda.memory_allocated() == 4096
    del a
    assert torch.cuda.memory_allocated() == 0
    assert torch.cuda.max_memory_allocated() == 4096
    torch.cuda.empty_cache()
    b = torch.zeros(3, device="cuda")
    assert b.sum().item() == 0          # a known value: answered exactly
    assert bool((torch.ones(2, device="cuda") & ~torch.full((2,), True, device="cuda")).max() == 0)
    print(torch.randn(3, device="cuda").sum().item())   # unknown: a placeholder, warned
    """, tmp_path)
    assert out["events"][0][:2] == ["alloc", 4096]
    assert sum(n for w, n in out["warnings"].items() if "item()" in w) == 1


def test_empty_cache_is_replayed(tmp_path):
    b = _binary()
    if not b:
        pytest.skip("no vramroom binary (VRAMROOM_BIN, the package's, or PATH)")
    peaks = []
    for ec in ("", "torch.cuda.empty_cache()"):
        run_traced("""
        a = torch.empty(2**28, device="cuda")
        del a
        %s
        b = torch.empty(2**28 + 2**20, device="cuda")
        """ % ec, tmp_path)
        p = subprocess.run([b, "replay", "--json", str(tmp_path / "snap.pickle")],
                           capture_output=True, text=True, check=True)
        peaks.append(json.loads(p.stdout)[0]["peak_reserved_bytes"])
    # Without empty_cache the 1 GiB segment stays cached beside the new one.
    assert peaks[0] == peaks[1] + 2**30


def test_the_package_is_the_call(tmp_path):
    """`with vramroom.trace(gpu=...) as t:` as the README writes it, beside vramroom.trace.trace."""
    src = textwrap.dedent("""
        import json, torch, vramroom
        with vramroom.trace(gpu="h100") as t:
            x = torch.zeros(1024, 1024, device="cuda")
        json.dump({"peak": t.peak_allocated, "module": callable(vramroom.trace)}, open(%r, "w"))
    """) % str(tmp_path / "out.json")
    (tmp_path / "p.py").write_text(src)
    p = subprocess.run([sys.executable, str(tmp_path / "p.py")], capture_output=True, text=True,
                       env=_env(), timeout=600)
    assert p.returncode == 0, p.stderr
    out = json.loads((tmp_path / "out.json").read_text())
    assert out == {"peak": 4 * MIB, "module": True}


def test_transformers_takes_its_cuda_path_not_its_tracing_one(tmp_path):
    # transformers treats a FakeTensor as graph tracing and then always builds the 4-d
    # causal mask (masking_utils.sdpa_mask); a CUDA run with an all-ones mask skips it and
    # passes is_causal to SDPA. The trace must follow the CUDA run.
    pytest.importorskip("transformers", reason="needs transformers")
    out = run_traced("""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import import_utils
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    m = LlamaForCausalLM(cfg).cuda()
    ids = torch.randint(0, 128, (2, 32), device="cuda")
    assert not import_utils.is_fake_tensor(ids)
    m(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.sum().backward()
    """, tmp_path)
    # (the all-ones check and the bool cast are the CUDA run's too; the mask's builders
    # run only when the mask is built)
    masks = [fr for fr in out["frames"]
             if any(f[2] in ("and_mask", "or_mask") or f[2].endswith("_mask_function") for f in fr)]
    assert not masks, masks[:3]
    from transformers.utils import import_utils

    assert import_utils.is_fake_tensor.__name__ == "is_fake_tensor"


def test_generate_presumes_a_prompt_without_pad_tokens(tmp_path):
    # generate() with a pad token and no attention_mask infers the mask from the prompt's
    # tokens (ones where the prompt has no pad token). Unknown, every mask check after it
    # would read False and the fake run would build the 4-d masks a real run skips.
    pytest.importorskip("transformers", reason="needs transformers")
    out = run_traced("""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    m = Qwen2ForCausalLM(cfg).cuda().eval()
    with torch.no_grad():
        m.generate(torch.randint(1, 128, (2, 8), device="cuda"), max_new_tokens=4,
                   do_sample=False, pad_token_id=0)
    """, tmp_path)
    assert any("attention mask it infers" in w for w in out["warnings"]), out["warnings"]
    masks = [fr for fr in out["frames"]
             if any(f[2] in ("and_mask", "or_mask") or f[2].endswith("_mask_function") for f in fr)]
    assert not masks, masks[:3]


def test_inference_mode_runs_the_kernels_no_grad_runs(tmp_path):
    # Under inference_mode autograd's keys are off and composite ops (conv2d, linear) reach
    # the tracer whole; their parts are the CUDA kernels, with their workspaces.
    body = """
    c = torch.nn.Conv2d(3, 8, 3).cuda()
    l = torch.nn.Linear(8, 4).cuda()
    x = torch.randn(2, 3, 16, 16, device="cuda")
    with torch.%s():
        z = l(c(x).mean((2, 3)))
    """
    ng = run_traced(body % "no_grad", tmp_path)
    im = run_traced(body % "inference_mode", tmp_path)
    assert allocs(im["events"]) == allocs(ng["events"])
    assert [s for s, _ in allocs(im["events"])].count(CUBLAS) == 1


def test_host_tensors_move_to_cuda_under_inference_mode(tmp_path):
    # Under inference_mode Tensor.to reaches the tracer whole; fake mode's constant
    # propagation would run it for real on a small CPU tensor (transformers' cache does
    # torch.tensor([], device=...)), which needs a GPU. It allocates what no_grad does.
    body = """
    with torch.%s():
        a = torch.tensor([1.0, 2.0], device="cuda")
        b = torch.tensor([], dtype=torch.bfloat16, device=torch.device("cuda", 0))
        c = torch.arange(4).to("cuda", torch.float16)
        d = torch.ones(1024, 256).to(device="cuda")
    """
    ng = run_traced(body % "no_grad", tmp_path)
    im = run_traced(body % "inference_mode", tmp_path)
    assert allocs(im["events"]) == allocs(ng["events"])
    assert [s for s, _ in allocs(im["events"])].count(1024 * 256 * 4) == 1


def test_layer_norm_copies_a_non_contiguous_input_as_cuda_does(tmp_path):
    # layer_norm_cuda runs on input.expect_contiguous(): a transposed input is copied before
    # the output (and freed when the op returns); a contiguous one is not.
    out = run_traced("""
    ln = torch.nn.LayerNorm(64).cuda()
    x = torch.randn(32, 8, 64, device="cuda")
    a = ln(x)
    b = ln(x.transpose(0, 1))
    """, tmp_path)
    sizes = [s for s, _ in allocs(out["events"])]
    n = 32 * 8 * 64 * 4
    # x, then a (output, mean, rstd), then b: the copy, the output, mean, rstd
    i = sizes.index(n, sizes.index(n) + 1)  # a's output
    assert sizes[i + 3:i + 5] == [n, n], sizes


def test_small_cpu_tensors_keep_their_values(tmp_path):
    # A model whose shape comes from CPU tensor arithmetic (torchvision's RegNet computes its
    # block widths with torch.arange/round/tolist): the values are the host's, not placeholders.
    out = run_traced("""
    widths = (torch.arange(4) * 16 + 32).tolist()
    assert widths == [32, 48, 64, 80], widths
    idx = torch.randperm(10).tolist()
    assert sorted(idx) == list(range(10)), idx
    layers = [torch.nn.Linear(w, w).cuda() for w in widths]
    """, tmp_path)
    sizes = [s for s, _ in allocs(out["events"])]
    for w in (32, 48, 64, 80):
        assert w * w * 4 in sizes, (w, sizes)
    assert not out["warnings"], out["warnings"]


def test_sdpa_with_a_learned_dense_mask_takes_the_memory_efficient_kernel(tmp_path):
    # A mask that needs grad: cuDNN refuses it (check_attn_mask_shape), flash takes no mask,
    # the memory-efficient kernel computes its grad (PyTorch 2.11's sdp_utils). T5's learned
    # bias runs math for another reason: it is not dense in its last dim (the next test).
    out = run_traced("""
    import torch.nn.functional as F
    q = torch.randn(2, 4, 64, 32, device="cuda", requires_grad=True)
    bias = torch.zeros(1, 4, 64, 64, device="cuda", requires_grad=True)
    F.scaled_dot_product_attention(q, q, q, attn_mask=bias).sum().backward()
    with torch.no_grad():
        F.scaled_dot_product_attention(q, q, q, attn_mask=bias)
    """, tmp_path)
    assert out["hidden"]["sdpa"] == {"efficient": 2}, out["hidden"]


def test_sdpa_with_a_mask_not_dense_in_its_last_dim_takes_the_math_path(tmp_path):
    # T5's position bias is [T, S, H] permuted (stride(-1) == H): no fused kernel on CUDA
    # takes such a mask, so the H100 ran T5's self-attention on math, and its
    # cross-attention (a dense zeros bias) on cuDNN (hn_t5_beam_generate, device run 27).
    out = run_traced("""
    import torch.nn.functional as F
    q = torch.randn(2, 4, 64, 32, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        bias = torch.zeros(64, 64, 4, device="cuda", dtype=torch.bfloat16).permute(2, 0, 1)
        F.scaled_dot_product_attention(q, q, q, attn_mask=bias[None])
        F.scaled_dot_product_attention(q, q, q, attn_mask=bias[None].contiguous())
    """, tmp_path)
    assert out["hidden"]["sdpa"] == {"math": 1, "cudnn": 1}, out["hidden"]


def test_dropout_allocates_its_mask_first_and_linear_adds_its_bias_in_place(tmp_path):
    # native_dropout's CUDA kernel allocates the bool mask before the output; at::linear on a
    # non-contiguous 3-d input with a bias runs matmul then add_ (in place) on the GPU, an
    # out-of-place add only for tensor subclasses such as fake tensors.
    out = run_traced("""
    x = torch.randn(64, 32, 128, device="cuda", requires_grad=True)
    y = torch.nn.functional.dropout(x, 0.1, training=True)
    lin = torch.nn.Linear(128, 256).cuda()
    z = lin(x.transpose(0, 1))
    """, tmp_path)
    sizes = [s for s, _ in allocs(out["events"])]
    n = 64 * 32 * 128
    i = sizes.index(n * 4)  # x
    assert sizes[i + 1:i + 3] == [n, n * 4], sizes  # mask (bool), then the output
    # the linear: its copy of the transposed input, then one output; no second output
    assert sizes.count(64 * 32 * 256 * 4) == 1, sizes


def test_isin_a_mask_sum_and_a_decode_step_allocate_what_cuda_does(tmp_path):
    # Device run 26's beam search (real H100 snapshot, PyTorch 2.11): isin over the
    # vocabulary makes the cross product's bools and the any's result after its output,
    # freed later-first; sum() of a bool mask converts it to int64 after the 8-byte result;
    # cuDNN attention with one query row takes no workspace (prefill: 256 bytes).
    out = run_traced("""
    v = torch.arange(32000, device="cuda")
    hit = torch.isin(v, torch.tensor([2], device="cuda"))
    mask = torch.ones(16, 256, dtype=torch.bool, device="cuda")
    full = mask.sum() == mask.numel()
    q = torch.randn(4, 8, 1, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(4, 8, 300, 64, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        o = torch.nn.functional.scaled_dot_product_attention(q, k, k)
    """, tmp_path)
    ev = alloc_free(out)
    i = ev.index(("alloc", 8))  # the isin's test tensor
    assert ev[i + 1:i + 6] == [("alloc", 32000), ("alloc", 32000), ("alloc", 32000),
                               ("free_", 32000), ("free_", 32000)]
    j = ev.index(("alloc", 4096))  # the mask
    assert ev[j + 1:j + 4] == [("alloc", 8), ("alloc", 32768), ("free_", 32768)]
    assert out["hidden"]["sdpa"] == {"cudnn": 1}
    assert ("alloc", 256) not in ev[ev.index(("alloc", 4 * 8 * 300 * 64 * 2)):]


def test_beam_search_runs_to_max_new_tokens(tmp_path):
    # generate() stops on token values a fake run does not have. Presumed as a run with
    # min_new_tokens goes: no EOS, and the early-stop heuristic unmet while no beam has
    # finished; each step's log-softmax is allocated once a step.
    pytest.importorskip("transformers", reason="needs transformers")
    body = """
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    m = LlamaForCausalLM(cfg).cuda().eval()
    ids = torch.randint(0, 128, (1, 16), device="cuda")
    with torch.no_grad():
        m.generate(ids, attention_mask=torch.ones_like(ids), num_beams=2, max_new_tokens=%d,
                   pad_token_id=0, eos_token_id=2)
    """
    steps = []
    for n in (3, 7):
        out = run_traced(body % n, tmp_path)
        steps.append(sum(1 for (a, _, _), fr in zip(out["events"], out["frames"])
                         if a == "alloc" and fr and fr[0][2] == "log_softmax"))
        assert any(w.startswith("generate(): beam search's early-stop heuristic") for w in out["warnings"])
        assert any(w.startswith("generate(): a fake sequence's EOS check") for w in out["warnings"])
    assert steps == [3, 7]


def test_embedding_copies_indices_it_cannot_flatten(tmp_path):
    # lm_large_vocab_ce's real H100 snapshot: a sliced batch of token ids (inputs[:, :-1]) is
    # copied by the forward's reshape(-1), before the output and freed after it, and by the
    # backward's contiguous(), first and freed last; a contiguous batch is not copied.
    out = run_traced("""
    emb = torch.nn.Embedding(1000, 64).cuda()
    tok = torch.randint(0, 1000, (4, 257), device="cuda")
    emb(tok[:, :-1]).sum().backward()
    marker = torch.empty(12345, dtype=torch.uint8, device="cuda")
    emb(tok[:, 1:].contiguous()).sum().backward()
    """, tmp_path)
    ev = alloc_free(out)
    idx, h, gw = 4 * 256 * 8, 4 * 256 * 64 * 4, 1000 * 64 * 4
    cut = ev.index(("alloc", 12345))
    first = ev.index(("alloc", 4 * 257 * 8)) + 1
    assert ev[first:first + 3] == [("alloc", idx), ("alloc", h), ("free_", idx)]
    b = ev.index(("alloc", gw), first)  # the weight's gradient
    # before it the indices' copy, then the grad's (sum()'s expanded grad is not
    # contiguous: grad_.contiguous()), both freed after it
    assert ev[b - 2:b] == [("alloc", idx), ("alloc", h)], ev[b - 3:b + 1]
    assert ("free_", idx) in ev[b + 1:cut] and ("free_", h) in ev[b + 1:cut]
    assert ev[:cut].count(("alloc", idx)) == 2  # forward's and backward's copies
    assert ev[cut:].count(("alloc", idx)) == 1  # the program's own contiguous()


def test_clip_grad_norm_takes_the_foreach_norm_cuda_takes(tmp_path):
    # clip_grad_norm_ picks torch._foreach_norm for plain CUDA tensors; on the GPU its fast
    # path zeroes fp32 partial sums for every tensor x the most 65536-element chunks any has,
    # before the norms, freed after them (GPT-2's real snapshot: 52 x 589 x 4 = 122512 bytes).
    out = run_traced("""
    m = torch.nn.Sequential(torch.nn.Linear(1000, 1000), torch.nn.Linear(1000, 10)).cuda()
    m(torch.randn(4, 1000, device="cuda")).sum().backward()
    marker = torch.empty(12345, dtype=torch.uint8, device="cuda")
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    """, tmp_path)
    ev = alloc_free(out)
    i = ev.index(("alloc", 12345))
    buf = 4 * 16 * 4  # 4 tensors, the weight's 1e6 elements in 16 chunks
    assert ev[i + 1:i + 7] == [("alloc", buf)] + [("alloc", 4)] * 4 + [("free_", buf)]


def test_linear_under_autocast_adds_its_bias_in_place(tmp_path):
    # ViT's attention under bf16 autocast (real H100 snapshot): F.linear on a transposed
    # 3-d input is the cast input, the folded copy, one matmul output with the bias added in
    # place; no second output, and an empty operand calls no cuBLAS.
    out = run_traced("""
    lin = torch.nn.Linear(64, 192).cuda()
    x = torch.randn(16, 10, 64, device="cuda").transpose(0, 1)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        marker = torch.empty(12345, dtype=torch.uint8, device="cuda")
        y = lin(x)
    """, tmp_path)
    ev = alloc_free(out)
    i = ev.index(("alloc", 12345))
    n = 16 * 10
    got = [e for e in ev[i + 1:] if e[1] < CUBLAS]
    # the cast cache (bias, weight: the last argument first), the input's cast and folded
    # copy, the output; the input's cast freed; leaving autocast empties the cache
    assert got[:6] == [("alloc", 192 * 2), ("alloc", 192 * 64 * 2), ("alloc", n * 64 * 2),
                       ("alloc", n * 64 * 2), ("alloc", n * 192 * 2), ("free_", n * 64 * 2)], got
    assert all(a == "free_" for a, _ in got[6:]), got


def test_padding_masks_and_a_transposed_cross_entropy_allocate_what_cuda_does(tmp_path):
    # hf_bert_custom_loss's real H100 snapshot: padding_mask[batch_idx, kv_idx] copies both
    # broadcast index tensors (B x S int64) before its output, freed later-first; SDPA turns
    # a bool mask into a float one with where(mask, 0.0, scalar -inf) (4 + 4 bytes, no
    # logical_not); log_softmax copies a transposed input after its output.
    out = run_traced("""
    B, S = 32, 128
    pad = torch.ones(B, S, dtype=torch.bool, device="cuda")
    bi = torch.arange(B, device="cuda")[:, None, None, None]
    ki = torch.arange(S, device="cuda")[None, None, None, :]
    m1 = torch.empty(11111, dtype=torch.uint8, device="cuda")
    mask = pad[bi, ki]
    m2 = torch.empty(22222, dtype=torch.uint8, device="cuda")
    q = torch.randn(B, 8, S, 64, device="cuda")
    full = mask.expand(B, 1, S, S)
    m3 = torch.empty(33333, dtype=torch.uint8, device="cuda")
    with torch.no_grad():
        o = torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=full)
    sim = torch.randn(32, 32, device="cuda")
    m4 = torch.empty(44444, dtype=torch.uint8, device="cuda")
    lp = torch.log_softmax(sim.T, -1)
    """, tmp_path)
    ev = alloc_free(out)

    def after(marker, n):
        i = ev.index(("alloc", marker))
        return ev[i + 1:i + 1 + n]

    idx = 32 * 128 * 8
    assert after(11111, 5) == [("alloc", idx), ("alloc", idx), ("alloc", 32 * 128),
                               ("free_", idx), ("free_", idx)]
    assert after(33333, 3) == [("alloc", 4), ("alloc", 4), ("alloc", 32 * 128 * 128 * 4)]
    assert after(44444, 3) == [("alloc", 4096), ("alloc", 4096), ("free_", 4096)]


def test_group_norm_and_a_sliced_grad_allocate_what_cuda_does(tmp_path):
    # ho_unet_decoder_sgd's real H100 snapshot: GroupNorm's forward keeps N x C scale and
    # shift (fp32) after its outputs; its backward ds, db, then c2, c3 (N x G) and c1 (N x C),
    # freed c3, c2, c1, db, ds; interpolate's backward copies a grad that cat's backward
    # sliced (after grad_input), and so does cuDNN's transposed-conv backward (first).
    out = run_traced("""
    N, C, G = 8, 32, 8
    gn = torch.nn.GroupNorm(G, C).cuda()
    x = torch.randn(N, C, 16, 16, device="cuda", requires_grad=True)
    m1 = torch.empty(11111, dtype=torch.uint8, device="cuda")
    y = gn(x)
    m2 = torch.empty(22222, dtype=torch.uint8, device="cuda")
    y.sum().backward()
    up = torch.nn.functional.interpolate(x, scale_factor=2, mode="bilinear")
    other = torch.randn(N, 4, 32, 32, device="cuda")
    m3 = torch.empty(33333, dtype=torch.uint8, device="cuda")
    torch.cat([up, other], 1).sum().backward()
    """, tmp_path)
    ev = alloc_free(out)

    def after(marker):
        return ev[ev.index(("alloc", marker)) + 1:]

    nc, ng = 8 * 32 * 4, 8 * 8 * 4
    assert after(11111)[:7] == [("alloc", 8 * 32 * 256 * 4), ("alloc", ng), ("alloc", ng),
                                ("alloc", nc), ("alloc", nc), ("free_", nc), ("free_", nc)]
    bwd = after(22222)
    i = bwd.index(("alloc", 128))  # dgamma, then dbeta
    assert bwd[i:i + 12] == [("alloc", 128), ("alloc", 128), ("alloc", nc), ("alloc", nc),
                             ("alloc", ng), ("alloc", ng), ("alloc", nc), ("free_", ng),
                             ("free_", ng), ("free_", nc), ("free_", nc), ("free_", nc)]
    up_bwd = after(33333)
    gi, go = 8 * 32 * 16 * 16 * 4, 8 * 32 * 32 * 32 * 4
    j = up_bwd.index(("alloc", gi))
    assert up_bwd[j + 1:j + 3] == [("alloc", go), ("free_", go)]


def test_an_indexing_backward_sorts_in_place_as_cuda_does(tmp_path):
    # ho_gather_scatter_einsum's and hs_gnn_index_train's real H100 snapshots: x[idx]'s
    # backward is _index_put_impl_(zeros, idx, grad, accumulate=True, unsafe=True) in place,
    # no bounds checks and no second output: 8n index buffers, cub's scratch, and a
    # contiguous copy of a grad that cat's backward sliced.
    out = run_traced("""
    x = torch.randn(5000, 64, device="cuda", requires_grad=True)
    idx = torch.randint(0, 5000, (3000,), device="cuda")
    other = torch.randn(3000, 64, device="cuda")
    m1 = torch.empty(11111, dtype=torch.uint8, device="cuda")
    torch.cat([x[idx], other], 1).sum().backward()
    """, tmp_path)
    ev = alloc_free(out)
    ev = ev[ev.index(("alloc", 11111)) + 1:]
    k, v, z = 8 * 3000, 3000 * 64 * 4, 5000 * 64 * 4
    i = ev.index(("alloc", z))  # index_backward's zeros, the only output
    # more than cub's single tile (2304 int64 pairs): both alternate buffers, two passes'
    # bins (13 bits), 511, one tile's lookback; up to 2304 one byte (2048 in
    # hq_mixtral_moe_fp32_bf16's real backward, 1000 in device run 26's)
    scratch = 2 * 24064 + 2048 * 2 + 511 + 1024 * 1
    from vramroom.trace.sorting import index_put_acc_tokens

    for n, want in ((1000, 1), (2048, 1), (2304, 1), (2305, 2 * 18688 + 2048 * 2 + 511 + 1024)):
        assert ["t", want] in index_put_acc_tokens(n, 5000, checked=False), n
    assert ev[i + 1:i + 9] == [("alloc", k), ("alloc", k), ("free_", k), ("alloc", v),
                               ("alloc", k), ("alloc", k), ("alloc", k), ("alloc", scratch)]
    assert ("alloc", 8) not in ev[i:i + 9] and ev.count(("alloc", z)) == 1


def test_a_reduced_loss_keeps_the_block_its_meta_function_sized(tmp_path):
    # adam_capturable's real H100 snapshot: smooth_l1_loss (and mse_loss) reduced to a scalar
    # keep a block the size of the whole input (the meta function sizes the result for the
    # broadcast input, then resizes it to 0-dim); the elementwise loss is a second such
    # block, freed with the mean's staging (2M elements: 256 blocks' partials and a semaphore).
    out = run_traced("""
    x = torch.randn(1024, 2048, device="cuda")
    y = torch.randn(1024, 2048, device="cuda")
    m1 = torch.empty(11111, dtype=torch.uint8, device="cuda")
    loss = torch.nn.functional.smooth_l1_loss(x, y)
    m2 = torch.empty(22222, dtype=torch.uint8, device="cuda")
    del loss
    m3 = torch.empty(33333, dtype=torch.uint8, device="cuda")
    """, tmp_path)
    ev = alloc_free(out)
    n = 1024 * 2048 * 4
    i = ev.index(("alloc", 11111))
    assert ev[i + 1:i + 8] == [("alloc", n), ("alloc", n), ("alloc", 1024), ("alloc", 4),
                               ("free_", 4), ("free_", 1024), ("free_", n)]
    j, k = ev.index(("alloc", 22222)), ev.index(("alloc", 33333))
    assert ev[j + 1:k] == [("free_", n)]  # the scalar's block goes with the scalar


def test_bce_with_logits_allocates_what_its_cuda_composite_does(tmp_path):
    # ho_recsys_embbag_amp's real H100 snapshot: log_sigmoid(input) and the (1 - target)
    # loss, input-sized, then the 4-byte mean; the two freed later-first.
    out = run_traced("""
    x = torch.randn(2048, 1, device="cuda")
    y = torch.rand(2048, 1, device="cuda")
    m1 = torch.empty(11111, dtype=torch.uint8, device="cuda")
    loss = torch.nn.functional.binary_cross_entropy_with_logits(x, y)
    """, tmp_path)
    ev = alloc_free(out)
    i = ev.index(("alloc", 11111))
    assert ev[i + 1:i + 6] == [("alloc", 8192), ("alloc", 8192), ("alloc", 4),
                               ("free_", 8192), ("free_", 8192)]


def test_a_permuted_attention_grad_is_copied_and_lt_is_per_thread(tmp_path):
    # ckpt_transformer_blocks' real H100 snapshot: the memory-efficient attention backward
    # copies a grad_out that is not [B, T, H, D]-contiguous (MultiheadAttention's permute)
    # before the gradients, freed after its scratch; a checkpointed forward recomputed on
    # autograd's device thread takes that thread's own 1 MiB cuBLASLt workspace.
    out = run_traced("""
    from torch.utils.checkpoint import checkpoint
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True).cuda()
    x = torch.randn(8, 32, 64, device="cuda", requires_grad=True)
    m1 = torch.empty(11111, dtype=torch.uint8, device="cuda")
    checkpoint(layer, x, use_reentrant=False).sum().backward()
    """, tmp_path)
    ev = alloc_free(out)
    assert ev.count(("alloc", LT)) == 2, ev
    bwd = ev[ev.index(("alloc", 11111)):]
    g = 8 * 32 * 64 * 4  # grad_out, q, k, v: [B, H, T, D] fp32
    i = next(j for j in range(len(bwd) - 4) if bwd[j:j + 4] == [("alloc", g)] * 4)
    assert ("free_", g) in bwd[i + 4:]


def test_values_computed_from_arange_are_known(tmp_path):
    # transformers' packed-sequence check on position ids made by arange (training with
    # use_cache=False, hf_gpt2_grad_ckpt): `(diff(pos) != 1).cumsum(-1)[:, -1] == 0`, all
    # True, so no 4-d mask is built; the GPU knows it, and so must the trace.
    out = run_traced("""
    pos = torch.arange(0, 16, device="cuda").unsqueeze(0).expand(4, -1)
    d = torch.diff(pos, prepend=pos[:, :1] - 1, dim=-1)
    assert bool(((d != 1).cumsum(-1)[:, -1] == 0).all())
    x = torch.zeros(4, device="cuda")
    x[1] = 3
    assert x.tolist() == [0.0, 3.0, 0.0, 0.0], x.tolist()
    assert x.sum().item() == 3.0
    """, tmp_path)
    assert not out["warnings"], out["warnings"]


def test_math_attention_adds_its_mask_in_place_and_softmax_keeps_cudas_temporaries(tmp_path):
    # hx_t5_train_bf16's real H100 snapshot, per attention: the scores, the mask added into
    # them in place (no second [B, H, T, S] block), _safe_softmax's output, then its isneginf
    # bools, their all() per row and a 4-byte zero, freed later-first; in the backward,
    # softmax's `grad * output` transient after grad_input. The bias is laid out as T5's,
    # [.., T, S, H] permuted, which keeps the fused kernels off.
    out = run_traced("""
    import torch.nn.functional as F
    q = torch.randn(2, 4, 64, 32, device="cuda", requires_grad=True)
    learned = torch.zeros(2, 64, 64, 4, device="cuda", requires_grad=True)
    bias = learned.permute(0, 3, 1, 2)
    m1 = torch.empty(11111, dtype=torch.uint8, device="cuda")
    o = F.scaled_dot_product_attention(q, q, q, attn_mask=bias)
    m2 = torch.empty(22222, dtype=torch.uint8, device="cuda")
    o.sum().backward()
    """, tmp_path)
    assert out["hidden"]["sdpa"] == {"math": 1}, out["hidden"]
    ev = alloc_free(out)
    s = 2 * 4 * 64 * 64
    fwd = ev[ev.index(("alloc", 11111)):ev.index(("alloc", 22222))]
    assert [a for a in fwd if a[0] == "alloc"].count(("alloc", s * 4)) == 2, fwd  # scores, softmax
    i = fwd.index(("alloc", s))
    assert fwd[i:i + 6] == [("alloc", s), ("alloc", 2 * 4 * 64), ("alloc", 4),
                            ("free_", 4), ("free_", 2 * 4 * 64), ("free_", s)], fwd
    bwd = ev[ev.index(("alloc", 22222)):]
    j = next(k for k in range(len(bwd) - 2)
             if bwd[k:k + 3] == [("alloc", s * 4), ("alloc", s * 4), ("free_", s * 4)])
    assert j is not None


def test_a_norm_stages_and_an_embedding_backward_copies_a_permuted_grad(tmp_path):
    # hf_t5_small_train_adafactor's real H100 snapshot: Adafactor's p.norm(2) of the 32128 x
    # 512 embedding splits across 528 blocks (2112 bytes of partials, 4 of semaphores);
    # hx_t5_train_bf16's: the position bias' embedding backward copies its permuted grad
    # first and frees it after everything else it made.
    out = run_traced("""
    x = torch.randn(32128, 512, device="cuda")
    n = x.norm(2)
    emb = torch.nn.Embedding(32, 4).cuda()
    idx = torch.randint(0, 32, (128, 128), device="cuda")
    y = emb(idx)
    m1 = torch.empty(11111, dtype=torch.uint8, device="cuda")
    y.permute(2, 0, 1).unsqueeze(0).sum().backward()
    """, tmp_path)
    ev = alloc_free(out)
    i = ev.index(("alloc", 32128 * 512 * 4))
    assert ev[i + 1:i + 6] == [("alloc", 4), ("alloc", 2112), ("alloc", 4), ("free_", 4),
                               ("free_", 2112)], ev[i:i + 8]
    bwd = ev[ev.index(("alloc", 11111)):]
    g = 128 * 128 * 4 * 4
    j = bwd.index(("alloc", g))  # the expanded grad's contiguous copy
    assert bwd[j + 1] == ("alloc", 128 * 128 * 8), bwd[j:j + 3]  # the sort's first buffer
    copy_free = bwd.index(("free_", g), j)
    assert ("free_", 128 * 128 * 8) not in bwd[copy_free:], bwd[j:]


def test_bce_with_logits_backward_works_in_place_and_a_bag_copies_its_sliced_grad(tmp_path):
    # ho_recsys_embbag_amp's real H100 snapshot: the loss's backward makes one input-sized
    # block (sigmoid, then sub_ and mul_ and div_ in place: autograd's path for plain
    # tensors), and each EmbeddingBag's backward copies its slice of the cat's grad first,
    # freed after the sort's buffers.
    out = run_traced("""
    bag = torch.nn.EmbeddingBag(5000, 64, mode="mean").cuda()
    ids = torch.randint(0, 5000, (2048, 20), device="cuda")
    x = torch.randn(2048, 13, device="cuda", requires_grad=True)
    feats = torch.cat([bag(ids), x], dim=1)
    logit = feats.sum(1, keepdim=True)
    y = torch.rand(2048, 1, device="cuda")
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, y)
    m1 = torch.empty(11111, dtype=torch.uint8, device="cuda")
    loss.backward()
    """, tmp_path)
    ev = alloc_free(out)
    bwd = ev[ev.index(("alloc", 11111)):]
    assert bwd.count(("alloc", 2048 * 4)) == 1, bwd
    g = 2048 * 64 * 4
    i = bwd.index(("alloc", g))
    assert bwd[i + 1] == ("alloc", 2048 * 20 * 8), bwd[i:i + 3]
    assert bwd[i:bwd.index(("free_", g), i)].count(("free_", 2048 * 20 * 8)) == 5, bwd[i:]


def test_inference_mode_composites_allocate_their_parts_every_call(tmp_path):
    # ho_tv_swin_infer's real H100 snapshot, under inference_mode: every LayerNorm makes
    # native_layer_norm's mean and rstd (fake mode's cache must not skip them from the second
    # call on), an eval dropout returns its input (no copy), and a roll over two dims makes
    # one tensor per dim, the first freed after the second.
    out = run_traced("""
    ln = torch.nn.LayerNorm(96).cuda().half()
    x = torch.randn(32, 56, 56, 96, device="cuda", dtype=torch.float16)
    with torch.inference_mode():
        for _ in range(3):
            y = ln(x)
        z = torch.nn.functional.dropout(y, 0.1, training=False)
        m1 = torch.empty(11111, dtype=torch.uint8, device="cuda")
        r = torch.roll(y, shifts=(-3, -3), dims=(1, 2))
    """, tmp_path)
    ev = alloc_free(out)
    n = 32 * 56 * 56
    assert [a for a in ev if a[0] == "alloc"].count(("alloc", n * 4)) == 6, ev  # mean, rstd x 3
    i = ev.index(("alloc", 11111))
    assert ev[i - 1][0] == "free_", ev[i - 4:i + 1]  # no dropout copy before the marker
    assert ev[i + 1:i + 4] == [("alloc", n * 96 * 2), ("alloc", n * 96 * 2),
                               ("free_", n * 96 * 2)], ev[i:i + 5]


def test_a_conv_bias_grad_over_a_permuted_grad_stages_its_sum(tmp_path):
    # tv_vit_b16's patch embedding in its real H100 snapshot: the bias grad sums a grad laid
    # out channels-last ([N, HW, C] transposed back), which splits across CTAs: 19267584 +
    # 24 bytes after it.
    out = run_traced("""
    conv = torch.nn.Conv2d(3, 768, 16, 16).cuda()
    x = torch.randn(16, 3, 224, 224, device="cuda")
    y = conv(x).reshape(16, 768, 196).permute(0, 2, 1)
    w = torch.randn(768, 768, device="cuda")
    m1 = torch.empty(11111, dtype=torch.uint8, device="cuda")
    (y @ w).sum().backward()
    """, tmp_path)
    ev = alloc_free(out)
    bwd = ev[ev.index(("alloc", 11111)):]
    i = bwd.index(("alloc", 768 * 4))
    assert bwd[i + 1:i + 5] == [("alloc", 19267584), ("alloc", 24), ("free_", 24),
                                ("free_", 19267584)], bwd[i:i + 6]


def test_deepcopy_memory_summary_and_dump_snapshot_work_under_the_trace(tmp_path):
    # nn.TransformerDecoder deep-copies its layer (LayerNorm's ones and zeros are small
    # tensors whose values the trace keeps); torch.cuda.memory_summary, memory._snapshot and
    # _dump_snapshot answer from the trace.
    dump = tmp_path / "dump.pickle"
    out = run_traced("""
    dec = torch.nn.TransformerDecoder(
        torch.nn.TransformerDecoderLayer(64, 4, 128, batch_first=True), 2).cuda()
    assert dec.layers[1].norm1.weight.device.type == "cuda"
    s = torch.cuda.memory_summary()
    assert "Allocated memory" in s, s
    assert "segments" in torch.cuda.memory._snapshot()
    torch.cuda.memory._dump_snapshot(%r)
    """ % str(dump), tmp_path)
    assert dump.stat().st_size > 0
    assert not out["warnings"], out["warnings"]


def test_numpy_of_a_fake_host_tensor_answers_instead_of_failing(tmp_path):
    # an eval loop's metrics: pred.cpu().numpy() gets zeros of the right shape (counted in
    # the warnings, as .item()'s placeholders are); known values come back as they are
    out = run_traced("""
    pred = torch.randn(32, 4, device="cuda").argmax(-1)
    arr = pred.cpu().numpy()
    assert arr.shape == (32,) and arr.dtype.name == "int64", (arr.shape, arr.dtype)
    assert list(torch.arange(5).numpy()) == [0, 1, 2, 3, 4]
    assert list(torch.arange(3, device="cuda").cpu().numpy()) == [0, 1, 2]
    """, tmp_path)
    assert out["warnings"] == {"t.numpy() of a fake cpu tensor answered zeros": 1}, out["warnings"]


def test_checkpoints_are_not_written_and_loaders_load_in_process(tmp_path):
    # A training script's torch.save must not replace the user's file with one that has no
    # data: nothing is written, and a torch.load of that path in the same run gets the saved
    # tensors back, copied as loading would. DataLoader workers (forked under fake mode)
    # load in the main process.
    ck = tmp_path / "ck.pt"
    ck.write_bytes(b"the user's checkpoint")
    out = run_traced("""
    from torch.utils.data import DataLoader, TensorDataset
    dl = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=16, num_workers=2)
    m = torch.nn.Linear(8, 8).cuda()
    for (x,) in dl:
        m(x.cuda()).sum().backward()
    torch.save(m.state_dict(), %r)
    m1 = torch.empty(11111, dtype=torch.uint8, device="cuda")
    sd = torch.load(%r, map_location="cuda")
    m.load_state_dict(sd)
    torch.save(m, %r)
    m2 = torch.load(%r, weights_only=False)
    assert m2 is not m and m2.weight.device.type == "cuda"
    """ % (str(ck), str(ck), str(ck), str(ck)), tmp_path)
    assert ck.read_bytes() == b"the user's checkpoint"
    ev = alloc_free(out)
    after = ev[ev.index(("alloc", 11111)):]
    assert ("alloc", 8 * 8 * 4) in after and ("alloc", 8 * 4) in after, after
    assert out["warnings"].get("DataLoader(num_workers > 0) loaded in the main process") == 1


def test_save_pretrained_of_a_fake_model_writes_nothing(tmp_path):
    pytest.importorskip("transformers")
    out_dir = tmp_path / "model_out"
    out = run_traced("""
    import transformers
    m = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=64, n_head=2)).cuda()
    m.save_pretrained(%r)
    """ % str(out_dir), tmp_path)
    assert not out_dir.exists()
    assert out["warnings"] == {
        "save_pretrained() of a fake model not written (a fake run has no data)": 1}


def test_distribution_validation_is_presumed_to_pass(tmp_path):
    # torch.distributions validates arguments and samples (`torch._is_all_true` of a support
    # check): a fake value cannot be checked, and an unknown bool answers False, which would
    # raise where the GPU run goes on; the check is presumed to pass, counted in the warnings
    out = run_traced("""
    from torch.distributions import Normal
    mu = torch.zeros(64, 8, device="cuda", requires_grad=True)
    d = Normal(mu, torch.ones_like(mu))
    d.log_prob(d.rsample()).sum().backward()
    """, tmp_path)
    assert out["warnings"].get(
        "a validity check (torch._is_all_true) of fake data presumed True", 0) >= 1, out["warnings"]


def test_unmodelled_solver_scratch_is_named_and_sparse_is_refused(tmp_path):
    out = run_traced("""
    u, s, vh = torch.linalg.svd(torch.randn(64, 64, device="cuda"))
    m = torch.randn(100, device="cuda").median()
    try:
        torch.sparse_coo_tensor(torch.tensor([[0, 1]], device="cuda"), torch.ones(2, device="cuda"), (3,))
        raise AssertionError("a sparse CUDA tensor was not refused")
    except Exception as e:
        assert "sparse" in str(e), e
    """, tmp_path)
    w = " ".join(out["warnings"])
    assert "cuSOLVER" in w and "median" in w, out["warnings"]


def test_a_conv_workspace_that_does_not_fit_runs_another_plan(tmp_path):
    # tv_resnet18_infer_nograd (batch 64, three batches) on the H100 with its memory capped
    # at 765,041,049 bytes (0.95 of its peak reserved): the stem conv's workspace does not
    # fit in the second batch; cuDNN runs another plan and the program finishes, with peak
    # allocated 535,011,328 and peak reserved 725,614,592 bytes (device run 13b's capacity
    # sweep, scripts/trace_corpus/real/results.jsonl). At 644,245,094 it runs out anyway.
    b = _binary()
    if not b:
        pytest.skip("no vramroom binary (VRAMROOM_BIN, the package's, or PATH)")
    pytest.importorskip("torchvision")
    run_traced("""
    import torchvision
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).cuda().eval()
    with torch.no_grad():
        for step in range(3):
            x = torch.randn(64, 3, 224, 224, device="cuda")
            preds = model(x).softmax(dim=1).argmax(dim=1)
    """, tmp_path)
    snap = pickle.load(open(tmp_path / "snap.pickle", "rb"))
    tags = {e["user_metadata"] for e in snap["device_traces"][0] if e["user_metadata"]}
    assert tags and all(t.startswith("vramroom.cudnn_conv_workspace:") for t in tags), tags

    def at(cap):
        p = subprocess.run([b, "replay", "--json", str(tmp_path / "snap.pickle"),
                            "--capacity", str(cap)], capture_output=True, text=True, check=True)
        return json.loads(p.stdout)[0]

    r = at(765041049)
    assert r["oom"] is None and r["workspace_fallbacks"] == 1, r
    assert (r["peak_allocated_bytes"], r["peak_reserved_bytes"]) == (535011328, 725614592)
    assert at(644245094)["oom"] is not None
    free = at(80 << 30)
    assert free["workspace_fallbacks"] == 0 and free["num_ooms"] == 0


def test_a_bf16_channels_last_conv_and_batch_norm_are_laid_out_as_on_the_gpu(tmp_path):
    # hx_resnet50_channels_last_bf16's real snapshot (device run 24, H100): cuDNN gives a
    # channels_last bf16 conv a channels_last output, so batch norm runs its channels-last
    # kernels: after the output, mean and invstd, 4 x 64 x 128 floats of staging and 2 ints
    # of semaphores for [32, 64, 112, 112] (semaphores freed first); in backward sum_dy and
    # sum_dy_xmu, the weight and bias grads, 2 x 64 x 128 floats and 2 ints, then grad_input.
    out = run_traced("""
    conv = torch.nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False).cuda()
    bn = torch.nn.BatchNorm2d(64).cuda()
    conv, bn = conv.to(memory_format=torch.channels_last), bn
    x = torch.randn(32, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = conv(x)
        assert y.is_contiguous(memory_format=torch.channels_last), y.stride()
        z = bn(y)
    (z.float() ** 2).sum().backward()  # a grad laid out as z (channels_last)
    """, tmp_path)
    seq = alloc_free(out)
    big = 32 * 64 * 112 * 112 * 2
    i = seq.index(("alloc", big), seq.index(("alloc", big)) + 1)  # batch norm's output
    assert seq[i + 1:i + 7] == [("alloc", 256), ("alloc", 256), ("alloc", 131072),
                                ("alloc", 8), ("free_", 8), ("free_", 131072)], seq[i:i + 8]
    j = seq.index(("alloc", 65536))  # the backward reduce's staging
    assert seq[j - 4:j] == [("alloc", 256)] * 4, seq[j - 4:j + 4]
    assert seq[j + 1:j + 4] == [("alloc", 8), ("free_", 8), ("free_", 65536)]
    assert seq[j + 4] == ("alloc", big), seq[j + 4]  # grad_input, last


def test_grouped_mm_takes_cutlass_in_bf16_on_hopper_and_its_fallback_otherwise(tmp_path):
    # at::_grouped_mm (transformers' MoE experts): bf16 on sm90 runs the CUTLASS kernel, whose
    # argument buffer (4 groups: 24 * 4 + 36 * 4 = 240 bytes) and workspace come after
    # the output and go when it returns, no cuBLAS handle; fp32 runs the fallback (a cuBLAS
    # mm per group), which fake mode's meta kernel refuses (it checks bf16 alone).
    body = """
    x = torch.randn(64, 32, device="cuda", dtype=DT)
    w = torch.randn(4, 32, 40, device="cuda", dtype=DT)
    offs = torch.tensor([16, 32, 48, 64], device="cuda", dtype=torch.int32)
    y = torch.nn.functional.grouped_mm(x, w, offs=offs)
    assert y.shape == (64, 40) and y.stride() == (40, 1), y.stride()
    """
    bf = run_traced(body.replace("DT", "torch.bfloat16"), tmp_path)
    tail = alloc_free(bf)[-5:]
    ws = 4 * 128 * 132  # four TMA descriptors per SM (hq_mixtral_moe_fp32_bf16's real run)
    assert tail == [("alloc", 64 * 40 * 2), ("alloc", 240), ("alloc", ws), ("free_", ws),
                    ("free_", 240)], tail
    assert bf["hidden"]["cublas_handles"] == 0
    fp = run_traced(body.replace("DT", "torch.float32"), tmp_path)
    assert alloc_free(fp)[-2:] == [("alloc", 64 * 40 * 4), ("alloc", CUBLAS)], alloc_free(fp)
    # off Hopper bf16 takes the fallback too
    a100 = run_traced(body.replace("DT", "torch.bfloat16"), tmp_path,
                      gpu="a100")
    assert a100["hidden"]["cublas_handles"] == 1


def test_backward_scatters_into_fresh_zeros_in_place(tmp_path):
    # topk's backward (value_selecting_reduction_backward) scatters the gradient into zeros:
    # in place on CUDA, out of place for a tensor subclass; hq_mixtral_moe_fp32_bf16's real
    # router backward has one [tokens, experts] block for it, then softmax's grad_input and
    # its grad * output
    out = run_traced("""
    logits = torch.randn(1024, 8, device="cuda", requires_grad=True)
    v, i = torch.topk(torch.softmax(logits, dim=-1), 2, dim=-1)
    marker = torch.empty(12345, dtype=torch.uint8, device="cuda")
    v.sum().backward()
    """, tmp_path)
    ev = alloc_free(out)
    bwd = ev[ev.index(("alloc", 12345)) + 1:]
    assert [e for e in bwd if e == ("alloc", 32768)] == [("alloc", 32768)] * 3, bwd


def test_a_finiteness_check_passes_and_all_stages_its_bools(tmp_path):
    # bart's fp16 layers clamp only when `isfinite(h).all()` fails: on the GPU it passes (no
    # clamp's copy); all() over 294,912 bools splits across blocks: 36 bytes of partials and
    # a 4-byte semaphore after its 1-byte result (hq_bart_beam_fp16's real run)
    out = run_traced("""
    h = torch.randn(6, 128, 384, device="cuda", dtype=torch.float16)
    marker = torch.empty(12345, dtype=torch.uint8, device="cuda")
    if not torch.isfinite(h).all():
        h = torch.clamp(h, -1000, 1000)
    """, tmp_path)
    ev = alloc_free(out)
    after = ev[ev.index(("alloc", 12345)) + 1:]
    # isfinite is (h == h) * (h.abs() != inf) on CUDA too: its bools, then all()
    j = after.index(("alloc", 1))
    assert after[j:j + 3] == [("alloc", 1), ("alloc", 36), ("alloc", 4)], after
    assert ("alloc", 589824) not in after[j:]  # no clamp
    assert any("finiteness" in w for w in out["warnings"]), out["warnings"]


def test_cudnn_decode_splits_long_keys_into_a_workspace():
    # device run 28's grid (ops-h100-run28.json), H100, bf16, one query row
    from vramroom.trace.sdpa import cudnn_decode_workspace as ws

    assert ws(1, 8, 8, 512, 128) == 0  # short keys: no split
    assert ws(1, 8, 8, 2048, 128) == 66688  # 16 splits
    assert ws(4, 16, 1, 4096, 128) == 32 * 4 * 16 * 128 * 4 + 32 * 4 * 16 * 8 + 128  # GQA
    assert ws(1, 12, 12, 640, 128) == 25216  # 4 splits, the statistics 256-aligned
    assert ws(16, 8, 8, 4096, 128) == 0  # 128 sequences x heads: enough CTAs, no split


def test_fused_sgd_and_torch_func_run_under_the_trace(tmp_path):
    # _fused_sgd_ has no meta kernel: its CUDA kernel (multi_tensor_apply, in place)
    # allocates nothing, so the step costs the momentum buffers its Python side makes
    # (empty_like of each gradient, first step only). torch.func.grad refuses to run while
    # saved-tensor hooks are installed: the trace's own step aside inside it.
    out = run_traced("""
    m = torch.nn.Linear(64, 32).cuda()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, fused=True)
    for _ in range(2):
        m(torch.randn(8, 64, device="cuda")).sum().backward()
        opt.step()
    from torch.func import functional_call, grad
    g = grad(lambda p, x: functional_call(m, p, (x,)).sum())(
        dict(m.named_parameters()), torch.randn(4, 64, device="cuda"))
    assert g["weight"].shape == (32, 64)
    """, tmp_path)
    sizes = [s for a, s in alloc_free(out) if a == "alloc"]
    # weight, bias; per step: input, output, grads (first step), momentum buffers (first)
    assert sizes.count(32 * 64 * 4) >= 3 and sizes.count(32 * 4) >= 3, sizes


def test_grid_sample_with_aligned_corners_runs_cudnns_sampler(tmp_path):
    # bilinear, zeros padding, align_corners=True on a 4-d input: cuDNN's spatial transformer
    # (cudnn_grid_sampler, no meta kernel): the grid's contiguous copy before the output
    # (resized from empty: contiguous); backward: grid copy, grad_input, grad_grid
    out = run_traced("""
    x = torch.randn(2, 3, 16, 16, device="cuda", requires_grad=True)
    g = torch.rand(2, 2, 8, 8, device="cuda").permute(0, 2, 3, 1)  # [2, 8, 8, 2], not contiguous
    m = torch.empty(12345, dtype=torch.uint8, device="cuda")
    y = torch.nn.functional.grid_sample(x, g, align_corners=True)
    assert y.shape == (2, 3, 8, 8)
    y.sum().backward()
    """, tmp_path)
    ev = alloc_free(out)
    fwd = ev[ev.index(("alloc", 12345)) + 1:]
    grid = 2 * 8 * 8 * 2 * 4
    assert fwd[:3] == [("alloc", grid), ("alloc", 2 * 3 * 8 * 8 * 4), ("free_", grid)], fwd
    assert ("alloc", 2 * 3 * 16 * 16 * 4) in fwd[3:], fwd


def test_lazy_modules_materialize_where_pytorch_does(tmp_path):
    # nn.LazyLinear & co.: nothing allocated at construction or .cuda(); at the first forward
    # the weight, then the bias, on the device and in the dtype .cuda().half() asked for,
    # then the forward's own output. After the trace, a lazy module is made as before.
    out = run_traced("""
    m = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(10)).cuda().half()
    marker = torch.empty(12345, dtype=torch.uint8, device="cuda")
    y = m(torch.randn(4, 3, 8, device="cuda", dtype=torch.half))
    assert type(m[1]).__name__ == "Linear" and m[1].weight.dtype == torch.half
    assert m[1].weight.device.type == "cuda" and m[1].weight.shape == (10, 24)
    y.float().sum().backward()
    torch.optim.SGD(m.parameters(), lr=0.1).step()
    """, tmp_path)
    ev = alloc_free(out)
    assert ev[0] == ("alloc", 12345), ev  # nothing before the first forward
    assert ev[1:5] == [("alloc", 4 * 24 * 2), ("alloc", 10 * 24 * 2), ("alloc", 10 * 2),
                       ("alloc", 4 * 10 * 2)], ev
    import torch

    assert type(torch.nn.LazyLinear(3).weight).__name__ == "UninitializedParameter"


def test_multihead_attention_fast_path_allocates_the_cuda_kernels_parts(tmp_path):
    # nn.MultiheadAttention in eval without grad calls aten._native_multi_head_attention,
    # whose fake kernel makes the output alone; attention.cu allocates the [B, T, 3D]
    # projection and the attention output (SDPA branch, need_weights False), or the packed
    # q/k/v and the [B, H, T, T] scores (math branch, need_weights True) (native_mha.py)
    body = """
    m = torch.nn.MultiheadAttention(256, 4, batch_first=True).cuda().eval()
    x = torch.randn(8, 100, 256, device="cuda")
    marker = torch.empty(12345, dtype=torch.uint8, device="cuda")
    with torch.inference_mode():
        y, w = m(x, x, x, need_weights=NW)
    assert y.shape == (8, 100, 256)
    """
    act, qkv, scores = 8 * 100 * 256 * 4, 8 * 100 * 768 * 4, 8 * 4 * 100 * 100 * 4
    sdp = run_traced(body.replace("NW", "False"), tmp_path)
    ev = alloc_free(sdp)
    ev = ev[ev.index(("alloc", 12345)) + 1:]
    big = [e for e in ev if e[1] >= act]
    # fp32: the memory-efficient kernel; the output projection, then the attention output
    # and the projection die in reverse
    assert big == [("alloc", qkv), ("alloc", CUBLAS), ("alloc", LT), ("alloc", act),
                   ("alloc", act), ("free_", act), ("free_", qkv)], big
    math = run_traced(body.replace("NW", "True"), tmp_path)
    ev = alloc_free(math)
    ev = ev[ev.index(("alloc", 12345)) + 1:]
    big = [e for e in ev if e[1] >= act // 3 and e[1] not in (CUBLAS, LT)]
    assert big == [("alloc", qkv), ("alloc", qkv), ("free_", qkv), ("alloc", scores),
                   ("alloc", act), ("alloc", act), ("free_", act), ("alloc", scores // 4),
                   ("free_", scores), ("free_", qkv)], big


def test_transformer_encoder_layer_fast_path_runs_its_cuda_parts(tmp_path):
    # nn.TransformerEncoderLayer in eval without grad calls aten._transformer_encoder_layer_fwd,
    # which has no fake kernel (refused before): transformer.cpp's parts in their order,
    # post-norm: the attention's SDPA branch, norm 1 (its mean and rstd freed, then the
    # attention output), the feed-forward (_addmm_activation, addmm, the hidden freed), norm 2,
    # then the feed-forward's output and the first norm's (the residual kept for it)
    out = run_traced("""
    enc = torch.nn.TransformerEncoderLayer(256, 4, batch_first=True).cuda().eval()
    x = torch.randn(8, 100, 256, device="cuda")
    marker = torch.empty(12345, dtype=torch.uint8, device="cuda")
    with torch.no_grad():
        y = enc(x)
    assert y.shape == (8, 100, 256)
    """, tmp_path)
    ev = alloc_free(out)
    ev = ev[ev.index(("alloc", 12345)) + 1:]
    act, qkv, ff, stat = 8 * 100 * 256 * 4, 8 * 100 * 768 * 4, 8 * 100 * 2048 * 4, 8 * 100 * 4
    a, f = "alloc", "free_"
    norm = [(a, act), (a, stat), (a, stat), (f, stat), (f, stat), (f, act)]
    assert ev[:len(norm) * 2 + 11] == [
        (a, qkv), (a, CUBLAS), (a, LT), (a, act), (a, act), (f, act), (f, qkv)] + norm + [
        (a, ff), (a, act), (f, ff)] + norm + [(f, act)], ev


def test_an_indexing_backward_over_two_index_tensors_builds_its_linear_index(tmp_path):
    # logp[arange(B), y]'s backward (a hand-written NLL, CLIP's text pooling) accumulates over
    # two index tensors: per index its remainder and remainder x stride (8n each, the
    # remainder freed), the second product added into the first and freed; int32 indices
    # are made int64 first, freed once the linear index is made; then the sort as for one
    # (Indexing.cu's computeLinearIndex and index_put_with_sort_kernel)
    body = """
    logp = torch.randn(64, 1000, device="cuda", requires_grad=True)
    y = torch.randint(0, 1000, (64,), device="cuda", dtype=DT)
    rows = torch.arange(64, device="cuda", dtype=DT)
    m1 = torch.empty(11111, dtype=torch.uint8, device="cuda")
    (-logp[rows, y]).sum().backward()
    """
    k, z = 8 * 64, 64 * 1000 * 4
    for dt, longs in (("torch.int64", []), ("torch.int32", [("alloc", 4 * 64 * 2)] * 2)):
        out = run_traced(body.replace("DT", dt), tmp_path)
        ev = alloc_free(out)
        ev = ev[ev.index(("alloc", 11111)) + 1:]
        ev = ev[ev.index(("alloc", z)) + 1:]  # index_backward's zeros
        a, f = "alloc", "free_"
        longs = [(a, 8 * 64)] * len(longs)
        want = longs + [(a, k), (a, k), (f, k), (a, k), (a, k), (f, k), (f, k)] + \
            [(f, 8 * 64)] * len(longs) + [(a, k), (a, k), (a, k), (a, 1), (f, 1), (f, k),
                                          (f, k), (f, k), (f, k)]
        assert ev[:len(want)] == want, (dt, ev[:len(want) + 2])
        assert not [w for w in out["warnings"] if "index_put_" in w], out["warnings"]


def test_cudnn_benchmark_is_refused_with_the_way_to_trace_it():
    # cudnn.benchmark's algorithm search takes trial workspaces from the caching allocator,
    # sized from what it has free: device run 29's ResNet-18 peaked at 3.8x benchmark=False's
    # prediction, so a conv under benchmark=True is refused (naming the setting and the way
    # out), and the same conv under benchmark=False is traced
    import torch

    import vramroom
    from vramroom.trace.capture import UnsupportedOp

    torch.backends.cudnn.benchmark = True
    try:
        with pytest.raises(UnsupportedOp) as e:
            with vramroom.trace(gpu="h100"):
                torch.nn.Conv2d(3, 8, 3).cuda()(torch.randn(2, 3, 16, 16, device="cuda"))
    finally:
        torch.backends.cudnn.benchmark = False
    msg = str(e.value)
    assert "aten.convolution" in msg and "cudnn.benchmark=True is not modelled" in msg and \
        "cudnn.benchmark = False" in msg, msg
    with vramroom.trace(gpu="h100") as t:
        torch.nn.Conv2d(3, 8, 3).cuda()(torch.randn(2, 3, 16, 16, device="cuda"))
    assert t.peak_allocated > 0


def test_multihead_attention_fast_path_with_a_padding_mask_takes_masked_softmax(tmp_path):
    # a bool key padding mask: nn's canonical float mask, then in the kernel's math branch its
    # bool copy and masked_softmax's output (at 100 keys the persistent kernel: nothing else),
    # the copy freed, then the scores; at 1100 keys the fallback softmax(masked_fill(...))
    # replaces the first output (SoftMax.cu's masked_softmax_cuda)
    body = """
    m = torch.nn.MultiheadAttention(64, 2, batch_first=True).cuda().eval()
    x = torch.randn(2, NKEYS, 64, device="cuda")
    pad = torch.zeros(2, NKEYS, dtype=torch.bool, device="cuda")
    marker = torch.empty(12345, dtype=torch.uint8, device="cuda")
    with torch.no_grad():
        y, w = m(x, x, x, key_padding_mask=pad)
    assert w.shape == (2, NKEYS, NKEYS)
    """
    a, f = "alloc", "free_"
    for T in (100, 1100):
        out = run_traced(body.replace("NKEYS", str(T)), tmp_path)
        ev = alloc_free(out)
        ev = ev[ev.index((a, 12345)) + 1:]
        scores = 2 * 2 * T * T * 4
        i = ev.index((a, scores))
        soft = [(a, 2 * T), (a, scores)]
        if T > 1024:
            soft += [(a, scores), (a, scores), (f, scores), (f, scores)]
        assert ev[i + 1:i + 1 + len(soft) + 2] == soft + [(f, 2 * T), (f, scores)], (T, ev[i:i + 10])
        assert not [k for k in out["warnings"] if "masked" in k], out["warnings"]


def test_cumprod_allocates_as_cumsum_does(tmp_path):
    # a diffusion schedule's cumprod(1 - betas): impl_func_cum_ops and scan_dim, cumsum's code
    # with another operator; a bool input is converted to int64 first, for both
    out = run_traced("""
    betas = torch.linspace(1e-4, 0.02, 1000, device="cuda")
    mask = torch.ones(5000, dtype=torch.bool, device="cuda")
    m1 = torch.empty(11111, dtype=torch.uint8, device="cuda")
    a = torch.cumsum(1 - betas, 0)
    c = torch.cumsum(mask, 0)
    m2 = torch.empty(22222, dtype=torch.uint8, device="cuda")
    b = torch.cumprod(1 - betas, 0)
    d = torch.cumprod(mask, 0)
    m3 = torch.empty(33333, dtype=torch.uint8, device="cuda")
    """, tmp_path)
    cumsum, cumprod = _windows(alloc_free(out), (11111, 22222, 33333))
    assert cumsum == cumprod and len(cumsum) > 4, (cumsum, cumprod)


def _windows(ev, marks):
    at = [ev.index(("alloc", m)) for m in marks]
    return [ev[at[i] + 1:at[i + 1]] for i in range(len(at) - 1)]


def _check_measured_ops(name):
    """ops/check_ops.py over a measured ops/measure.py set: (its JSON summary, its output)."""
    here = Path(__file__).resolve().parents[2] / "scripts" / "trace_corpus" / "ops"
    measured = here / name
    if not measured.exists():
        pytest.skip("scripts/trace_corpus/ops is not in this tree (a source checkout has it)")
    p = subprocess.run([sys.executable, str(here / "check_ops.py"), str(measured), "--json"],
                       capture_output=True, text=True, env=_env(), timeout=600)
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stdout[-4000:] + p.stderr[-2000:]


def test_every_reduction_of_device_run_30_allocates_as_the_h100_did():
    # ops/measure.py --set run30 on an H100 (ops-h100-run30.json, 784 calls: var/std and
    # their _mean twins, argmax/argmin, max/min over a dim and of everything, aminmax,
    # amax/amin, logsumexp, norms, sums and means; four dtypes; 14 shapes, dims and
    # layouts), each traced again here and compared allocation for allocation
    summary, log = _check_measured_ops("ops-h100-run30.json")
    assert summary == {"calls": 784, "differ": 0}, log


def test_data_dependent_ops_of_device_run_47_allocate_as_the_h100_did():
    # ops/measure.py --set run47 on an H100 (ops-h100-run47.json: nonzero, masked_select,
    # x[mask], unique, unique_consecutive, repeat_interleave and bincount on inputs of known
    # count), traced again and compared allocation for allocation; the 20 over the tracer's
    # known-value limit (aranges of 6M and 10M elements) are refused, as they must be
    summary, log = _check_measured_ops("ops-h100-run47.json")
    assert summary == {"calls": 119, "differ": 0, "over_limit": 20}, log


def test_composites_and_copies_of_device_run_31_allocate_as_the_h100_did():
    # ops/composites.py on an H100 (composites-h100-run31.json, 17 calls: cdist's C++
    # composite and its own kernel, isinf, an integer logsumexp, int32 indexing, host-GPU
    # copies into another layout or dtype and back, a custom backward's sum, repeat and
    # masked_fill), traced again and compared allocation for allocation
    here = Path(__file__).resolve().parents[2] / "scripts" / "trace_corpus" / "ops"
    measured = here / "composites-h100-run31.json"
    if not measured.exists():
        pytest.skip("scripts/trace_corpus/ops is not in this tree (a source checkout has it)")
    p = subprocess.run([sys.executable, str(here / "composites.py"), "--check", str(measured)],
                       capture_output=True, text=True, env=_env(), timeout=600, cwd=str(here))
    assert p.returncode == 0 and "17 of 17 calls" in p.stdout, p.stdout[-4000:] + p.stderr[-2000:]


def test_var_std_argmax_and_max_over_a_dim_stage_their_wider_partials(tmp_path):
    # Reduce.cuh's staging holds one partial result per output, CTA and lane: a float for
    # sum, Welford's (mean, m2, n, nf) for var/std (16 bytes; 32 for doubles), a (value,
    # int64 index) pair for argmax and max over a dim (16 bytes); the same block shape, so
    # the same semaphores (ReduceMomentKernel.cu, ReduceArgMaxKernel.cu, ReduceMinMaxKernel.cu)
    out = run_traced("""
    x = torch.randn(2048, 4096, device="cuda")
    xd = x.double()
    m1 = torch.empty(11111, dtype=torch.uint8, device="cuda")
    a = x.sum(0)
    m2 = torch.empty(22222, dtype=torch.uint8, device="cuda")
    b = x.var(0)
    m3 = torch.empty(33333, dtype=torch.uint8, device="cuda")
    c = xd.std(0)
    m4 = torch.empty(44444, dtype=torch.uint8, device="cuda")
    d = x.max(0)
    m5 = torch.empty(55555, dtype=torch.uint8, device="cuda")
    e = x.sum()
    m6 = torch.empty(66666, dtype=torch.uint8, device="cuda")
    f = x.argmax()
    m7 = torch.empty(77777, dtype=torch.uint8, device="cuda")
    """, tmp_path)
    ev = alloc_free(out)
    w = _windows(ev, (11111, 22222, 33333, 44444, 55555, 66666, 77777))
    staged = [[s for k, s in part if k == "alloc"] for part in w]
    # [output(s)..., buffer, semaphores]
    assert staged[1][1:] == [staged[0][1] * 4, staged[0][2]], staged[:2]
    assert staged[2][1:] == [staged[0][1] * 8, staged[0][2]], staged[2]
    assert staged[3][2:] == [staged[0][1] * 4, staged[0][2]], staged[3]
    assert staged[5][1:] == [staged[4][1] * 4, staged[4][2]], staged[4:6]


def test_argmax_without_a_dim_reduces_a_flat_copy_of_an_input_that_is_no_flat_view(tmp_path):
    # argmax_argmin_impl reduces self.reshape(-1): a copy, after the 8-byte output, freed
    # when the op returns (after the staging), when the input does not flatten as a view
    out = run_traced("""
    x = torch.randn(4096, 2048, device="cuda")
    m1 = torch.empty(11111, dtype=torch.uint8, device="cuda")
    a = x.argmax()
    m2 = torch.empty(22222, dtype=torch.uint8, device="cuda")
    b = x.t().argmax()
    m3 = torch.empty(33333, dtype=torch.uint8, device="cuda")
    """, tmp_path)
    ev = alloc_free(out)
    flat, copied = _windows(ev, (11111, 22222, 33333))
    n = 4096 * 2048 * 4
    assert ("alloc", n) not in flat
    assert copied[:2] == [("alloc", 8), ("alloc", n)], copied
    assert copied[2:5] == flat[1:4] and copied[-1] == ("free_", n), (flat, copied)


def test_logsumexp_allocates_the_temporaries_of_its_cuda_composite(tmp_path):
    # logsumexp_out_impl: amax (kept dims), its abs() and == inf bools, exp(x - maxes) the
    # size of x, the result summed out of it; all but the result freed before it returns
    out = run_traced("""
    x = torch.randn(8, 1000, 4096, device="cuda")
    m1 = torch.empty(11111, dtype=torch.uint8, device="cuda")
    y = x.logsumexp(-1)
    m2 = torch.empty(22222, dtype=torch.uint8, device="cuda")
    """, tmp_path)
    (w,) = _windows(alloc_free(out), (11111, 22222))
    assert w == [("alloc", 32000), ("alloc", 32000), ("alloc", 8000), ("free_", 8000),
                 ("free_", 32000), ("alloc", 131072000), ("alloc", 32000),
                 ("free_", 131072000), ("free_", 32000)], w


def test_an_explicit_composite_allocates_its_parts_as_the_gpu_runs_them(tmp_path):
    # cdist (p=2, more than 25 rows) is _euclidean_dist's C++ composite on CUDA: pow and sum
    # of each side, ones_like, mul(-2), two cats, a matmul (cuBLAS's workspace on its
    # first call), clamp_min_ and sqrt_ in place; isinf is abs() == inf. A fake kernel makes
    # the output alone.
    out = run_traced("""
    a = torch.rand(512, 256, device="cuda")
    b = torch.rand(1024, 256, device="cuda")
    m1 = torch.empty(11111, dtype=torch.uint8, device="cuda")
    d = torch.cdist(a, b)
    m2 = torch.empty(22222, dtype=torch.uint8, device="cuda")
    i = torch.isinf(a)
    m3 = torch.empty(33333, dtype=torch.uint8, device="cuda")
    """, tmp_path)
    cd, inf = _windows(alloc_free(out), (11111, 22222, 33333))
    sizes = [s for k, s in cd if k == "alloc"]
    assert sizes == [512 * 256 * 4, 512 * 4, 512 * 4, 1024 * 256 * 4, 1024 * 4, 1024 * 4,
                     512 * 256 * 4, 512 * 258 * 4, 1024 * 258 * 4, 512 * 1024 * 4,
                     CUBLAS], sizes
    assert cd[-2:] == [("free_", 1024 * 258 * 4), ("free_", 512 * 258 * 4)], cd
    assert inf == [("alloc", 512 * 256 * 4), ("alloc", 512 * 256), ("free_", 512 * 256 * 4)]


def test_a_host_copy_into_another_layout_goes_through_a_contiguous_gpu_block(tmp_path):
    # copy_kernel_cuda: a host-GPU copy that is not one contiguous run of one dtype goes
    # through contiguous temporaries; blocking, the conversion is the host's and the GPU
    # side is a contiguous block when the destination is not contiguous (device run 29:
    # ResNet-50's .to(device, memory_format=torch.channels_last), one per 4-d weight)
    out = run_traced("""
    w = torch.randn(64, 3, 7, 7)
    m1 = torch.empty(11111, dtype=torch.uint8, device="cuda")
    a = w.to("cuda", memory_format=torch.channels_last)
    m2 = torch.empty(22222, dtype=torch.uint8, device="cuda")
    b = w.to("cuda")
    m3 = torch.empty(33333, dtype=torch.uint8, device="cuda")
    c = w.to("cuda", dtype=torch.half, non_blocking=True)
    m4 = torch.empty(44444, dtype=torch.uint8, device="cuda")
    """, tmp_path)
    cl, plain, nb = _windows(alloc_free(out), (11111, 22222, 33333, 44444))
    n = 64 * 3 * 7 * 7
    assert cl == [("alloc", n * 4), ("alloc", n * 4), ("free_", n * 4)], cl
    assert plain == [("alloc", n * 4)], plain
    # converted on the GPU: the float source lands in a contiguous float block first
    assert nb == [("alloc", n * 2), ("alloc", n * 4), ("free_", n * 4)], nb


def test_int32_index_tensors_are_converted_to_int64_at_the_broadcast_shape(tmp_path):
    # make_info converts an int32 index tensor to int64 first; with index tensors of other
    # strides each non-contiguous one is then copied (hy_gpt2_seq_logprob_index3's real
    # H100 run: logp[rows, cols, int32 labels], three 8-byte B x T blocks)
    out = run_traced("""
    logp = torch.randn(8, 192, 1000, device="cuda")
    labels = torch.randint(0, 1000, (8, 192), device="cuda", dtype=torch.int32)
    rows = torch.arange(8, device="cuda")[:, None]
    cols = torch.arange(192, device="cuda")[None, :]
    m1 = torch.empty(11111, dtype=torch.uint8, device="cuda")
    g = logp[rows, cols, labels]
    m2 = torch.empty(22222, dtype=torch.uint8, device="cuda")
    """, tmp_path)
    (w,) = _windows(alloc_free(out), (11111, 22222))
    n = 8 * 192
    assert [s for k, s in w if k == "alloc"] == [n * 8, n * 8, n * 8, n * 4], w


def test_the_memory_efficient_kernel_pads_a_mask_it_cannot_read_in_place(tmp_path):
    # preprocess_mask: a mask with strides that are not multiples of 8 elements is padded to
    # the next multiple of 8 in its last dim by at::pad before the memory-efficient kernel
    # (device run 37: nn.Transformer's [B x H, 63, 63] decoder mask); an aligned one is not
    out = run_traced("""
    q = torch.randn(4, 8, 63, 32, device="cuda", requires_grad=True)
    odd = torch.zeros(4, 8, 63, 63, device="cuda")
    even = torch.zeros(4, 8, 63, 64, device="cuda")
    kv = torch.randn(4, 8, 64, 32, device="cuda", requires_grad=True)
    m1 = torch.empty(11111, dtype=torch.uint8, device="cuda")
    a = torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=odd)
    m2 = torch.empty(22222, dtype=torch.uint8, device="cuda")
    b = torch.nn.functional.scaled_dot_product_attention(q, kv, kv, attn_mask=even)
    m3 = torch.empty(33333, dtype=torch.uint8, device="cuda")
    """, tmp_path)
    padded, aligned = _windows(alloc_free(out), (11111, 22222, 33333))
    assert ("alloc", 4 * 8 * 63 * 64 * 4) == padded[0], padded
    assert ("alloc", 4 * 8 * 63 * 64 * 4) not in aligned, aligned


def test_amax_stages_as_max_and_a_column_reduction_as_sum(tmp_path):
    # amax/amin run the max/min values kernels through Reduce.cuh like max() and sum(dim):
    # the same staging buffer and semaphores when a reduction splits across blocks
    out = run_traced("""
    x = torch.randn(4096, 4096, device="cuda")
    m1 = torch.empty(11111, dtype=torch.uint8, device="cuda")
    a = x.max()
    m2 = torch.empty(22222, dtype=torch.uint8, device="cuda")
    b = x.amax()
    m3 = torch.empty(33333, dtype=torch.uint8, device="cuda")
    c = x.sum(dim=0)
    m4 = torch.empty(44444, dtype=torch.uint8, device="cuda")
    d = x.amin(dim=0)
    m5 = torch.empty(55555, dtype=torch.uint8, device="cuda")
    """, tmp_path)
    part = _windows(alloc_free(out), (11111, 22222, 33333, 44444, 55555))
    assert part[0] == part[1] and len(part[0]) == 5, part[:2]
    assert part[2] == part[3] and len(part[2]) == 5, part[2:]


def test_conv_copies_and_layouts_follow_device_run_39(tmp_path):
    # Allocation sequences of device run 39's real H100 snapshots, traced again:
    # - a WGAN-GP's gradient penalty: the conv's grad is an expanded scalar; the input pass
    #   makes grad_input, then copies the grad (256 bytes), freed at once
    #   (cudnn_convolution_backward_input);
    # - ShuffleNetV2's 1x1 conv on a chunk of channels: _convolution copies the input first
    #   (475136), freed after the workspace; the backward copies it again before both passes
    #   and frees it after them (convolution_backward's input.contiguous());
    # - the depthwise kernel makes grad_weight (8352) before grad_input;
    # - layer norm's backward gives a contiguous grad_input behind a permute (swin_t);
    # - an accumulating index over 169 rows sorts in one byte-pass: 3583 bytes of scratch
    out = run_traced("""
    crit = torch.nn.Conv2d(256, 1, 4).cuda().requires_grad_(False)
    h = torch.randn(64, 256, 4, 4, device="cuda", requires_grad=True)
    pw = torch.nn.Conv2d(232, 232, 1, bias=False).cuda()
    dw = torch.nn.Conv2d(232, 232, 3, padding=1, groups=232, bias=False).cuda()
    x = torch.randn(32, 464, 4, 4, device="cuda", requires_grad=True)
    ln = torch.nn.LayerNorm(768).cuda()
    u = torch.randn(8, 768, 7, 7, device="cuda", requires_grad=True)
    table = torch.zeros(169, 24, device="cuda", requires_grad=True)
    idx = torch.randint(0, 169, (2401,), device="cuda")
    m1 = torch.empty(11111, dtype=torch.uint8, device="cuda")
    (g,) = torch.autograd.grad(crit(h).sum(), h)
    m2 = torch.empty(22222, dtype=torch.uint8, device="cuda")
    a, b = x.chunk(2, dim=1)
    y = pw(b)
    m3 = torch.empty(33333, dtype=torch.uint8, device="cuda")
    y.backward(torch.ones_like(y))
    m4 = torch.empty(44444, dtype=torch.uint8, device="cuda")
    z = dw(x[:, :232].contiguous())
    m5 = torch.empty(55555, dtype=torch.uint8, device="cuda")
    z.backward(torch.ones_like(z))
    m6 = torch.empty(66666, dtype=torch.uint8, device="cuda")
    ln(u.permute(0, 2, 3, 1)).float().sum().backward()
    m7 = torch.empty(77777, dtype=torch.uint8, device="cuda")
    table[idx].sum().backward()
    m8 = torch.empty(88888, dtype=torch.uint8, device="cuda")
    gi = torch.ops.aten.native_layer_norm_backward(
        torch.ones(8, 768, 7, 7, device="cuda").permute(0, 2, 3, 1),
        torch.randn(8, 7, 7, 768, device="cuda"), [768], torch.zeros(8, 7, 7, 1, device="cuda"),
        torch.ones(8, 7, 7, 1, device="cuda"), ln.weight, ln.bias, [True, False, False])[0]
    assert gi.is_contiguous(), gi.stride()
    c1 = torch.nn.Conv1d(256, 256, 3, stride=2, padding=1).cuda()
    s = torch.randn(8, 256, 3000, device="cuda", requires_grad=True)
    r = torch.randn(8, 1500, 256, device="cuda")
    dw7 = torch.nn.Conv2d(96, 96, 7, padding=3, groups=96).cuda().bfloat16()
    nhwc = torch.randn(16, 40, 40, 96, device="cuda", dtype=torch.bfloat16).permute(0, 3, 1, 2)
    m9 = torch.empty(99999, dtype=torch.uint8, device="cuda")
    (torch.nn.functional.gelu(c1(s)).permute(0, 2, 1) * r).sum().backward()
    m10 = torch.empty(10101, dtype=torch.uint8, device="cuda")
    y7 = dw7(nhwc)
    m11 = torch.empty(11011, dtype=torch.uint8, device="cuda")
    """, tmp_path)
    ev = alloc_free(out)
    pen, fwd, bwd, _, dwb, _, index, _, whisper, convnext = _windows(
        ev, (11111, 22222, 33333, 44444, 55555, 66666, 77777, 88888, 99999, 10101, 11011))
    # Whisper's second conv, its grad permuted back from [batch, time, channels] (device run
    # 39's real snapshot): gelu's grad, its copy by .to() (channels_last suggested against
    # the input's contiguous), then grad_input
    a = [v for k, v in whisper if k == "alloc"]
    i = a.index(24576000)
    assert a[i - 2:i + 1] == [12288000, 12288000, 24576000], a
    # ConvNeXt's bf16 depthwise conv on NHWC data runs on cuDNN, with no input copy
    assert [v for k, v in convnext if k == "alloc"].count(16 * 96 * 40 * 40 * 2) == 1, convnext
    i = pen.index(("alloc", 1048576))
    assert pen[i + 1:i + 3] == [("alloc", 256), ("free_", 256)], pen
    assert fwd[:2] == [("alloc", 475136), ("alloc", 475136)] and \
        fwd[-1] == ("free_", 475136), fwd
    # the real snapshot's: the input's copy, grad_input, its workspace, grad_weight, its
    # workspace, the copy freed
    i = bwd.index(("alloc", 215296)) - 4
    assert bwd[i:i + 8] == [("alloc", 475136), ("alloc", 475136), ("alloc", 950288),
                            ("free_", 950288), ("alloc", 215296), ("alloc", 6889472),
                            ("free_", 6889472), ("free_", 475136)], bwd
    # (after the ones_like grad)
    assert [s for a, s in dwb if a == "alloc"][1:3] == [8352, 475136], dwb
    assert ("alloc", 3583) in index and ("alloc", 42495) not in index, index


def test_a_random_host_value_that_decides_control_flow_is_reported(tmp_path):
    # Wav2Vec2's LayerDrop (device run 40): `torch.rand([]) < p` on the host is the trace's own
    # draw, so the layers it skips need not be the GPU run's; the trace says so
    out = run_traced("""
    x = torch.randn(4, 8, device="cuda")
    if torch.rand([]) < 0.5:
        x = x * 2
    """, tmp_path)
    assert any("random host value" in w for w in out["warnings"]), out["warnings"]
    # drawing alone (a shuffle, data) is no branch: no warning
    quiet = run_traced("""
    idx = torch.randperm(4).tolist()
    x = torch.randn(4, 8)[idx[:2]].cuda()
    """, tmp_path)
    assert not quiet["warnings"], quiet["warnings"]


def test_a_decomposition_run_for_real_scatters_out_of_place(tmp_path):
    # torch.func's per-sample gradients run nll_loss_backward's Python decomposition op by
    # op on the GPU too: zeros_like, then an out-of-place scatter (a second block), then the
    # zeros freed (device run 40: ht_func_per_sample_grads' real snapshot)
    out = run_traced("""
    from torch.func import grad, vmap
    w = torch.randn(10, 20, device="cuda")
    x = torch.randn(64, 20, device="cuda")
    y = torch.randint(0, 10, (64,), device="cuda")

    def loss(w, x, y):
        return torch.nn.functional.cross_entropy((x @ w.t()).unsqueeze(0), y.unsqueeze(0))

    m1 = torch.empty(11111, dtype=torch.uint8, device="cuda")
    g = vmap(grad(loss), in_dims=(None, 0, 0))(w, x, y)
    m2 = torch.empty(22222, dtype=torch.uint8, device="cuda")
    """, tmp_path)
    (ev,) = _windows(alloc_free(out), (11111, 22222))
    k = 64 * 10 * 4
    assert any(ev[i:i + 3] == [("alloc", k), ("alloc", k), ("free_", k)]
               for i in range(len(ev))), ev
