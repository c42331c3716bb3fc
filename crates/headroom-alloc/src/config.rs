//! `PYTORCH_CUDA_ALLOC_CONF` / `PYTORCH_ALLOC_CONF`: the allocator's configuration.

/// Which allocator implementation PyTorch would use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Backend {
    #[default]
    Native,
    CudaMallocAsync,
}

/// Every key PyTorch 2.11 accepts, with PyTorch's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct AllocatorConfig {
    /// Bytes; `u64::MAX` = unlimited (reported as -1).
    pub max_split_size: u64,
    /// Bytes; defaults to `large_segment_size`.
    pub max_non_split_rounding_size: u64,
    /// Bytes; 20 MiB by default.
    pub large_segment_size: u64,
    /// In (0, 1); 0 = off.
    pub garbage_collection_threshold: f64,
    /// Divisions per power-of-two interval, index i = [2^i MiB, 2^(i+1) MiB); 0 = off.
    pub roundup_power2_divisions: [u64; 16],
    pub expandable_segments: bool,
    pub pinned_use_background_threads: bool,
    pub backend: Backend,
    pub release_lock_on_cudamalloc: bool,
    pub pinned_use_cuda_host_register: bool,
    pub pinned_num_register_threads: u64,
    pub pinned_reserve_segment_size_mb: u64,
    pub graph_capture_record_stream_reuse: bool,
    /// In [0, 1]; 1 = no limit.
    pub per_process_memory_fraction: f64,
    /// The last string parsed, as the snapshot's `PYTORCH_CUDA_ALLOC_CONF` reports it.
    pub last_conf: String,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            max_split_size: u64::MAX,
            max_non_split_rounding_size: 20 << 20,
            large_segment_size: 20 << 20,
            garbage_collection_threshold: 0.0,
            roundup_power2_divisions: [0; 16],
            expandable_segments: false,
            pinned_use_background_threads: false,
            backend: Backend::Native,
            release_lock_on_cudamalloc: false,
            pinned_use_cuda_host_register: false,
            pinned_num_register_threads: 1,
            pinned_reserve_segment_size_mb: 0,
            graph_capture_record_stream_reuse: false,
            per_process_memory_fraction: 1.0,
            last_conf: String::new(),
        }
    }
}
