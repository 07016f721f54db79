//! The hybrid backend's tensors, weights, KV caches and recurrent states: each is the CPU's or
//! the GPU's own object, tagged with where it lives.
//!
//! An activation tensor can move: ops take their inputs by shared reference, yet an input on
//! the wrong device must be brought over *and stay there* (so the residual stream crosses
//! once per boundary, not once per op that reads it). So a tensor sits in a `RefCell` that
//! the backend swaps from one device to the other. Tensors are `Send`, never `Sync`, so the
//! cell is enough. A fresh `zeros` tensor is not placed until its first op: it materializes
//! on that op's device for free.

use std::cell::{Ref, RefCell};

use backend::{Backend, BackendError};

use super::placement::Device;

/// Where an activation currently is.
pub enum Resident<C: Backend, G: Backend> {
    Cpu(C::Tensor),
    Gpu(G::Tensor),
    /// A zero tensor `[rows, cols]` not yet allocated anywhere.
    Zeros {
        rows: usize,
        cols: usize,
    },
}

/// An f32 activation `[rows, cols]` of the hybrid backend.
pub struct HybridTensor<C: Backend, G: Backend>(pub(crate) RefCell<Resident<C, G>>);

impl<C: Backend, G: Backend> HybridTensor<C, G> {
    pub(crate) fn new(r: Resident<C, G>) -> Self {
        HybridTensor(RefCell::new(r))
    }

    /// The device the tensor is on; `None` while it is an unplaced zero tensor.
    pub fn device(&self) -> Option<Device> {
        match &*self.0.borrow() {
            Resident::Cpu(_) => Some(Device::Cpu),
            Resident::Gpu(_) => Some(Device::Gpu),
            Resident::Zeros { .. } => None,
        }
    }

    pub(crate) fn cpu(&self) -> Result<Ref<'_, C::Tensor>, BackendError> {
        Ref::filter_map(self.0.borrow(), |r| match r {
            Resident::Cpu(t) => Some(t),
            _ => None,
        })
        .map_err(|_| misplaced(Device::Cpu))
    }

    pub(crate) fn gpu(&self) -> Result<Ref<'_, G::Tensor>, BackendError> {
        Ref::filter_map(self.0.borrow(), |r| match r {
            Resident::Gpu(t) => Some(t),
            _ => None,
        })
        .map_err(|_| misplaced(Device::Gpu))
    }

    pub(crate) fn cpu_mut(&mut self) -> Result<&mut C::Tensor, BackendError> {
        match self.0.get_mut() {
            Resident::Cpu(t) => Ok(t),
            _ => Err(misplaced(Device::Cpu)),
        }
    }

    pub(crate) fn gpu_mut(&mut self) -> Result<&mut G::Tensor, BackendError> {
        match self.0.get_mut() {
            Resident::Gpu(t) => Ok(t),
            _ => Err(misplaced(Device::Gpu)),
        }
    }
}

/// An internal error: an op found an operand that `place` should have moved.
fn misplaced(want: Device) -> BackendError {
    BackendError::Device(format!(
        "hybrid: operand is not on the {want:?} after placement"
    ))
}

/// A weight loaded on the CPU, the GPU, or both (the tied embedding/output table).
pub enum HybridWeight<C: Backend, G: Backend> {
    Cpu(C::Weight),
    Gpu(G::Weight),
    Both { cpu: C::Weight, gpu: G::Weight },
}

impl<C: Backend, G: Backend> HybridWeight<C, G> {
    /// Where an op that reads this weight runs. The GPU copy of a weight on both devices is
    /// for the logits matmul; the embedding lookup asks with `prefer = Device::Cpu`.
    pub fn device(&self, prefer: Device) -> Device {
        match self {
            HybridWeight::Cpu(_) => Device::Cpu,
            HybridWeight::Gpu(_) => Device::Gpu,
            HybridWeight::Both { .. } => prefer,
        }
    }

    pub(crate) fn cpu(&self) -> Result<&C::Weight, BackendError> {
        match self {
            HybridWeight::Cpu(w) | HybridWeight::Both { cpu: w, .. } => Ok(w),
            HybridWeight::Gpu(_) => Err(misplaced(Device::Cpu)),
        }
    }

    pub(crate) fn gpu(&self) -> Result<&G::Weight, BackendError> {
        match self {
            HybridWeight::Gpu(w) | HybridWeight::Both { gpu: w, .. } => Ok(w),
            HybridWeight::Cpu(_) => Err(misplaced(Device::Gpu)),
        }
    }
}

/// One attention layer's KV cache of one sequence, on its layer's device.
pub enum HybridKvCache<C: Backend, G: Backend> {
    Cpu(C::KvCache),
    Gpu(G::KvCache),
}

impl<C: Backend, G: Backend> HybridKvCache<C, G> {
    pub fn device(&self) -> Device {
        match self {
            HybridKvCache::Cpu(_) => Device::Cpu,
            HybridKvCache::Gpu(_) => Device::Gpu,
        }
    }
}

/// One Gated DeltaNet layer's recurrent state of one sequence, on its layer's device.
pub enum HybridRecurrentState<C: Backend, G: Backend> {
    Cpu(C::RecurrentState),
    Gpu(G::RecurrentState),
}

impl<C: Backend, G: Backend> HybridRecurrentState<C, G> {
    pub fn device(&self) -> Device {
        match self {
            HybridRecurrentState::Cpu(_) => Device::Cpu,
            HybridRecurrentState::Gpu(_) => Device::Gpu,
        }
    }
}

// Not derived: a derive would demand `C: Clone, G: Clone` of the backends themselves.
impl<C: Backend, G: Backend> Clone for HybridRecurrentState<C, G> {
    fn clone(&self) -> Self {
        match self {
            HybridRecurrentState::Cpu(s) => HybridRecurrentState::Cpu(s.clone()),
            HybridRecurrentState::Gpu(s) => HybridRecurrentState::Gpu(s.clone()),
        }
    }
}

/// The one device all `items` are on (`None` for an empty list); an error if they disagree
/// (the caches or states of one layer were created on different devices).
pub(crate) fn common_device<T>(
    op: &'static str,
    items: &[&mut T],
    device: impl Fn(&T) -> Device,
) -> Result<Option<Device>, BackendError> {
    let mut found = None;
    for it in items {
        let d = device(it);
        if found.is_some_and(|f| f != d) {
            return Err(BackendError::Device(format!(
                "hybrid {op}: the sequences' states of one layer are on different devices"
            )));
        }
        found = Some(d);
    }
    Ok(found)
}

/// The CPU halves of `items` (all checked to be on the CPU).
pub(crate) fn cpu_caches<'a, C: Backend, G: Backend>(
    items: &'a mut [&mut HybridKvCache<C, G>],
) -> Result<Vec<&'a mut C::KvCache>, BackendError> {
    items
        .iter_mut()
        .map(|c| match &mut **c {
            HybridKvCache::Cpu(c) => Ok(c),
            HybridKvCache::Gpu(_) => Err(misplaced(Device::Cpu)),
        })
        .collect()
}

pub(crate) fn gpu_caches<'a, C: Backend, G: Backend>(
    items: &'a mut [&mut HybridKvCache<C, G>],
) -> Result<Vec<&'a mut G::KvCache>, BackendError> {
    items
        .iter_mut()
        .map(|c| match &mut **c {
            HybridKvCache::Gpu(c) => Ok(c),
            HybridKvCache::Cpu(_) => Err(misplaced(Device::Gpu)),
        })
        .collect()
}

pub(crate) fn cpu_states<'a, C: Backend, G: Backend>(
    items: &'a mut [&mut HybridRecurrentState<C, G>],
) -> Result<Vec<&'a mut C::RecurrentState>, BackendError> {
    items
        .iter_mut()
        .map(|s| match &mut **s {
            HybridRecurrentState::Cpu(s) => Ok(s),
            HybridRecurrentState::Gpu(_) => Err(misplaced(Device::Cpu)),
        })
        .collect()
}

pub(crate) fn gpu_states<'a, C: Backend, G: Backend>(
    items: &'a mut [&mut HybridRecurrentState<C, G>],
) -> Result<Vec<&'a mut G::RecurrentState>, BackendError> {
    items
        .iter_mut()
        .map(|s| match &mut **s {
            HybridRecurrentState::Gpu(s) => Ok(s),
            HybridRecurrentState::Cpu(_) => Err(misplaced(Device::Gpu)),
        })
        .collect()
}
