//! Moving an activation from one card to the next, and ordering the cards' queues.
//!
//! [`CardLink`] is what the multi-card backend needs from a backend beyond `Backend`:
//!
//! - `CpuBackend` (a stand-in card in tests): download + upload, everything synchronous.
//! - `CudaBackend`: the copy is queued on the *receiving* card's stream after an event wait on
//!   the sending stream (so it reads finished data), and the sending stream then waits for the
//!   copy (so the source block is not reused or freed before it is read). Same CUDA context
//!   (two logical cards on one GPU, or cards sharing a context): `cuMemcpyDtoDAsync`. Two GPUs:
//!   `cuMemcpyPeerAsync`, which goes over NVLink/PCIe peer-to-peer when
//!   [`enable_peer_access`] succeeded (`cuDeviceCanAccessPeer`) and through host memory
//!   otherwise (the driver stages it). Inside a recorded decode step the copy is recorded into
//!   the receiving card's graph (addresses repeat every step), and no event is waited on
//!   (a capturing stream cannot wait on work outside its capture): the multi backend orders
//!   the cards' graph launches instead (`end_step`).

use std::sync::Arc;

use backend::cpu::CpuBackend;
use backend::{Backend, BackendError, StepMode};
use cudarc::driver::sys::{self, CUevent_flags};
use cudarc::driver::{result, CudaStream, DevicePtr};

use crate::backend::{dev_err, CudaBackend};

/// A backend whose tensors the multi-card backend can move between instances.
pub trait CardLink: Backend {
    /// A copy of `src` (a tensor of `self`) as a tensor of `dst`. `step`: the receiving card's
    /// mode inside a recorded decode step (`None` outside one): in `Replay` only the
    /// destination is allocated (the recorded graph holds the copy); in `Capture` the copy is
    /// recorded without cross-queue waits.
    fn copy_to(
        &self,
        src: &Self::Tensor,
        dst: &Self,
        step: Option<StepMode>,
    ) -> Result<Self::Tensor, BackendError>;

    /// Whether copies from `self` to `dst` may be recorded into `dst`'s decode-step graph.
    fn can_record_copies_to(&self, _dst: &Self) -> bool {
        true
    }

    /// Makes `dst`'s queue wait for everything queued on `self` so far.
    fn order_before(&self, _dst: &Self) -> Result<(), BackendError> {
        Ok(())
    }

    /// Blocks until everything queued on `self` has run.
    fn finish(&self) -> Result<(), BackendError> {
        Ok(())
    }

    /// Whether `self` and `other` share one device context (logical cards of one GPU).
    fn shares_context_with(&self, _other: &Self) -> bool {
        true
    }

    /// Makes this card's context the calling thread's current one (raw driver calls of the
    /// backend, e.g. step-arena allocations, go to the current context).
    fn make_current(&self) {}
}

impl CardLink for CpuBackend {
    fn copy_to(
        &self,
        src: &Self::Tensor,
        dst: &Self,
        _step: Option<StepMode>,
    ) -> Result<Self::Tensor, BackendError> {
        let (rows, cols) = self.shape(src);
        dst.upload(&self.download(src), rows, cols)
    }
}

fn event_on(stream: &Arc<CudaStream>) -> Result<cudarc::driver::CudaEvent, BackendError> {
    stream
        .record_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
        .map_err(dev_err)
}

fn same_context(a: &CudaBackend, b: &CudaBackend) -> bool {
    a.device().context().cu_ctx() == b.device().context().cu_ctx()
}

/// Lets `a` and `b` (different GPUs) read each other's memory directly when the driver says
/// they can (`cuDeviceCanAccessPeer` both ways). Returns whether peer access is on. On one
/// context there is nothing to enable (true).
pub fn enable_peer_access(a: &CudaBackend, b: &CudaBackend) -> bool {
    if same_context(a, b) {
        return true;
    }
    let ordinal = |x: &CudaBackend| x.device().info().ordinal as i32;
    let enable = |from: &CudaBackend, to: &CudaBackend| -> bool {
        // SAFETY: plain driver queries/calls on valid device ordinals and live contexts; the
        // calling thread's current context is set to `from`'s first.
        unsafe {
            let (Ok(d_from), Ok(d_to)) = (
                result::device::get(ordinal(from)),
                result::device::get(ordinal(to)),
            ) else {
                return false;
            };
            let mut can = 0i32;
            if sys::cuDeviceCanAccessPeer(&mut can, d_from, d_to) != sys::CUresult::CUDA_SUCCESS
                || can == 0
            {
                return false;
            }
            if from.device().context().bind_to_thread().is_err() {
                return false;
            }
            let r = sys::cuCtxEnablePeerAccess(to.device().context().cu_ctx(), 0);
            r == sys::CUresult::CUDA_SUCCESS
                || r == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
        }
    };
    enable(a, b) && enable(b, a)
}

impl CardLink for CudaBackend {
    fn copy_to(
        &self,
        src: &Self::Tensor,
        dst: &Self,
        step: Option<StepMode>,
    ) -> Result<Self::Tensor, BackendError> {
        let (rows, cols) = (src.rows(), src.cols());
        // From the receiving card's step arena inside a step (stable addresses for graphs).
        let out = dst.zeros(rows, cols);
        if step == Some(StepMode::Replay) {
            return Ok(out);
        }
        let n_bytes = rows * cols * 4;
        if n_bytes == 0 {
            return Ok(out);
        }
        let (s_stream, d_stream) = (self.device().stream(), dst.device().stream());
        let recording = step == Some(StepMode::Capture);
        if !recording {
            d_stream.wait(&event_on(s_stream)?).map_err(dev_err)?;
        }
        let src_ptr = src.data.device_ptr(s_stream).0;
        let dst_ptr = out.data.device_ptr(d_stream).0;
        dst.device().context().bind_to_thread().map_err(dev_err)?;
        // SAFETY: both buffers hold at least rows × cols f32 (tensors own ≥ their length);
        // the source's producers are ordered before the copy (event above, or the graph
        // launch order of a recorded step) and the source outlives it (the wait below).
        // Event tracking is off on our contexts, so the pointers' guards record nothing.
        unsafe {
            if same_context(self, dst) {
                result::memcpy_dtod_async(dst_ptr, src_ptr, n_bytes, d_stream.cu_stream())
            } else {
                result::memcpy_peer_async(
                    dst.device().context().cu_ctx(),
                    dst_ptr,
                    self.device().context().cu_ctx(),
                    src_ptr,
                    n_bytes,
                    d_stream.cu_stream(),
                )
            }
        }
        .map_err(dev_err)?;
        if !recording {
            s_stream.wait(&event_on(d_stream)?).map_err(dev_err)?;
        }
        Ok(out)
    }

    /// One context (logical cards of one GPU): yes, verified on the H200. Two GPUs: peer
    /// access is enabled when the driver allows it, but recording steps across them stays off
    /// unless `REDLINE_MULTI_GRAPHS=1` until a device window with several GPUs has verified it
    /// (none was lent yet); their steps run eagerly with event-ordered peer copies.
    fn can_record_copies_to(&self, dst: &Self) -> bool {
        if same_context(self, dst) {
            return true;
        }
        let peer = enable_peer_access(self, dst);
        peer && std::env::var("REDLINE_MULTI_GRAPHS").as_deref() == Ok("1")
    }

    fn order_before(&self, dst: &Self) -> Result<(), BackendError> {
        dst.device()
            .stream()
            .wait(&event_on(self.device().stream())?)
            .map_err(dev_err)
    }

    fn finish(&self) -> Result<(), BackendError> {
        self.device().synchronize().map_err(dev_err)
    }

    fn shares_context_with(&self, other: &Self) -> bool {
        same_context(self, other)
    }

    fn make_current(&self) {
        // A failure here means a lost device: the op that follows reports it.
        let _ = self.device().context().bind_to_thread();
    }
}
