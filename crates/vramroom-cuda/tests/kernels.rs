//! The kernel source compiles under NVRTC for the GPUs Vramroom targets. Needs only NVRTC,
//! not a GPU: runs wherever `libnvrtc.so.13` can be found (on the loader path, or through
//! `VRAMROOM_CUDA_LIB_DIRS`), and skips with the reason elsewhere.

use vramroom_cuda::compute::nvrtc;

#[test]
fn kernels_compile_for_ampere_and_hopper() {
    if let Err(e) = nvrtc::version() {
        eprintln!("SKIP kernels_compile_for_ampere_and_hopper: {e}");
        return;
    }
    for arch in [(8, 0), (9, 0)] {
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
}

#[test]
fn a_compile_error_is_a_typed_error_with_the_log() {
    if nvrtc::version().is_err() {
        eprintln!("SKIP a_compile_error_is_a_typed_error_with_the_log: no NVRTC");
        return;
    }
    let e = nvrtc::compile(
        "extern \"C\" __global__ void k() { undefined_thing(); }",
        (9, 0),
    )
    .unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("undefined_thing"), "{msg}");
}
