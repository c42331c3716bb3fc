// PyTorch's own C++ caching allocator behind four C functions, so that Vramroom's benchmark
// (crates/vramroom-cuda/examples/cuda_bench.rs) times both allocators with one harness, in one
// process. Built on the GPU machine by scripts/gpu-check.sh against the installed libtorch.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

extern "C" {
int hr_torch_init() {
  try {
    int n = c10::cuda::device_count();
    if (n <= 0) return 1;
    c10::cuda::set_device(0);
    c10::cuda::CUDACachingAllocator::init(n);
    return 0;
  } catch (...) {
    return 2;
  }
}
void* hr_torch_raw_alloc(size_t n) {
  try {
    return c10::cuda::CUDACachingAllocator::raw_alloc(n);
  } catch (...) {
    return nullptr;
  }
}
void hr_torch_raw_delete(void* p) {
  try {
    c10::cuda::CUDACachingAllocator::raw_delete(p);
  } catch (...) {
  }
}
void hr_torch_empty_cache() {
  try {
    c10::cuda::CUDACachingAllocator::emptyCache();
  } catch (...) {
  }
}
}
