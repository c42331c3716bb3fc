//! Without a driver or a device every entry point returns a typed error and nothing panics.
//! On a GPU machine these checks skip (the other branch is tested in gpu.rs).

use vramroom_cuda::{device_count, unavailable_reason, CudaDevice, CudaError};

#[test]
fn no_gpu_gives_typed_errors() {
    let Some(why) = unavailable_reason() else {
        eprintln!("SKIP: a GPU is present; gpu.rs covers it");
        return;
    };
    eprintln!("no GPU: {why}");
    assert_eq!(device_count(), 0);
    for ordinal in [0, 1, -1] {
        match CudaDevice::new(ordinal) {
            Err(CudaError::NoDriver(_) | CudaError::NoDevice(_)) => {}
            Err(e) => panic!("unexpected error kind: {e}"),
            Ok(_) => panic!("a device opened with no GPU"),
        }
    }
    // Repeated calls give the same answer (the failed load is cached, not retried into a panic).
    assert!(CudaDevice::new(0).is_err());
    assert!(vramroom_cuda::cuda_allocator(0, Default::default()).is_err());
    assert!(!vramroom_cuda::nvml_present());
    // The compute side too: opening a Gpu is a typed error, whatever else is missing.
    match vramroom_cuda::Gpu::new(0) {
        Err(CudaError::NoDriver(_) | CudaError::NoDevice(_)) => {}
        Err(e) => panic!("unexpected error kind: {e}"),
        Ok(_) => panic!("a Gpu opened with no GPU"),
    }
    assert_eq!(vramroom_cuda::nvml::oom_process_lines("0000:00:00.0"), "");
}
