//! The kernel source compiles under NVRTC for the GPUs Vramroom targets. Needs only NVRTC,
//! not a GPU (`libnvrtc.so.13` on the loader path, or through `VRAMROOM_CUDA_LIB_DIRS`). The
//! tests are `#[ignore]`d with that reason, so a plain `cargo test` reports them as ignored;
//! `.ci/run` downloads NVRTC and runs them with `--include-ignored`. Asked to run without
//! NVRTC, they fail.

use vramroom_cuda::compute::nvrtc;

// One test per architecture, so the harness compiles them side by side (137 s in one test).
#[test]
#[ignore = "needs NVRTC (libnvrtc.so.13, no GPU): .ci/run runs it when it finds NVRTC"]
fn kernels_compile_for_ampere() {
    kernels_compile_for((8, 0));
}

#[test]
#[ignore = "needs NVRTC (libnvrtc.so.13, no GPU): .ci/run runs it when it finds NVRTC"]
fn kernels_compile_for_hopper() {
    kernels_compile_for((9, 0));
}

fn kernels_compile_for(arch: (i32, i32)) {
    if let Err(e) = nvrtc::version() {
        panic!("asked to run without NVRTC: {e}");
    }
    let bin = nvrtc::compile(nvrtc::SOURCE, arch)
        .unwrap_or_else(|e| panic!("sm_{}{}: {e}", arch.0, arch.1));
    assert!(bin.len() > 1000, "a CUBIN of {} bytes", bin.len());
    // Every kernel the host side launches is in the image under its C name.
    for name in [
        "k_fill",
        "k_binary",
        "k_reduce_block",
        "k_bn_eval_planes",
        "k_softmax_rows",
        "k_nll_bwd",
        "k_argmax",
        "k_attn_fwd",
        "k_attn_bwd_kv",
        "k_attn_rows",
        "k_flash_f32_d64",
        "k_flash_mma_d64",
        "k_flash_mma_d128",
    ] {
        assert!(
            bin.windows(name.len()).any(|w| w == name.as_bytes()),
            "{name} missing from the sm_{}{} image",
            arch.0,
            arch.1
        );
    }
}

#[test]
#[ignore = "needs NVRTC (libnvrtc.so.13, no GPU): .ci/run runs it when it finds NVRTC"]
fn a_compile_error_is_a_typed_error_with_the_log() {
    if nvrtc::version().is_err() {
        panic!("asked to run without NVRTC");
    }
    let e = nvrtc::compile(
        "extern \"C\" __global__ void k() { undefined_thing(); }",
        (9, 0),
    )
    .unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("undefined_thing"), "{msg}");
}
