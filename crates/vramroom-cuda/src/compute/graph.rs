//! CUDA graphs: capture the work queued on the device's stream once, replay it with one
//! launch.
//!
//! Design note: capture runs in relaxed mode on the device's own stream, so the captured work
//! is exactly the eager sequence of kernels, GEMMs and convolutions. Nothing the capture
//! records may allocate from the driver or touch the host: the tensor runtime warms up first
//! (so the caching allocator serves every block from its cache), routes the capture's
//! allocations to a private pool that outlives the graph's use of them, and refuses host
//! reads and writes while capturing ([`Gpu::read`] and [`Gpu::write`] check). This mirrors
//! `torch.cuda.graph` and its private memory pool.

use std::sync::atomic::Ordering;

use cudarc::driver::sys;

use super::Gpu;
use crate::driver::{check, CudaError};

/// An instantiated graph, replayable on the device's stream.
pub struct CudaGraph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    ctx: sys::CUcontext,
}

// SAFETY: graph handles may be used from any thread with the context current (`launch` and
// `drop` bind it).
unsafe impl Send for CudaGraph {}
// SAFETY: launching is a stream operation; the driver serialises it.
unsafe impl Sync for CudaGraph {}

impl Gpu {
    /// Start capturing the stream. Everything queued until [`Gpu::end_capture`] is recorded,
    /// not run.
    pub fn begin_capture(&self) -> Result<(), CudaError> {
        if self.capturing.swap(true, Ordering::SeqCst) {
            return Err(CudaError::Invalid(
                "a capture is already in progress".into(),
            ));
        }
        let r = (|| {
            self.bind()?;
            // Nothing recorded may wait on work queued before the capture.
            // SAFETY: our stream.
            check("cuStreamSynchronize", unsafe {
                sys::cuStreamSynchronize(self.raw_stream())
            })?;
            // SAFETY: our stream; relaxed mode lets other threads keep using the driver.
            check("cuStreamBeginCapture", unsafe {
                sys::cuStreamBeginCapture_v2(
                    self.raw_stream(),
                    sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
                )
            })
        })();
        if r.is_err() {
            self.capturing.store(false, Ordering::SeqCst);
        }
        r
    }

    /// Stop capturing and instantiate what was recorded.
    pub fn end_capture(&self) -> Result<CudaGraph, CudaError> {
        if !self.capturing.load(Ordering::SeqCst) {
            return Err(CudaError::Invalid("no capture in progress".into()));
        }
        self.bind()?;
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: our stream is capturing; out-pointer.
        let r = check("cuStreamEndCapture", unsafe {
            sys::cuStreamEndCapture(self.raw_stream(), &mut graph)
        });
        self.capturing.store(false, Ordering::SeqCst);
        r?;
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: graph is a complete captured graph; out-pointer.
        let r = check("cuGraphInstantiate", unsafe {
            sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0)
        });
        if let Err(e) = r {
            // SAFETY: created by the capture above.
            unsafe { sys::cuGraphDestroy(graph) };
            return Err(e);
        }
        Ok(CudaGraph {
            graph,
            exec,
            ctx: self.context_handle(),
        })
    }

    pub(crate) fn context_handle(&self) -> sys::CUcontext {
        self.ctx
    }
}

impl CudaGraph {
    /// Queue one replay on `gpu`'s stream (the graph's own device).
    pub fn launch(&self, gpu: &Gpu) -> Result<(), CudaError> {
        if gpu.context_handle() != self.ctx {
            return Err(CudaError::Invalid(
                "a CUDA graph replays on the device it was captured on".into(),
            ));
        }
        gpu.bind()?;
        // SAFETY: exec is live; the stream belongs to the same context.
        check("cuGraphLaunch", unsafe {
            sys::cuGraphLaunch(self.exec, gpu.raw_stream())
        })
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        let mut prev: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointer; then the graph's context is made current for the destroys,
        // which happen once, and the previous context is restored.
        unsafe {
            sys::cuCtxGetCurrent(&mut prev);
            sys::cuCtxSetCurrent(self.ctx);
            sys::cuGraphExecDestroy(self.exec);
            sys::cuGraphDestroy(self.graph);
            sys::cuCtxSetCurrent(prev);
        }
    }
}
