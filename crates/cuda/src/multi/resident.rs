//! The multi-card backend's tensors, weights, KV caches and recurrent states: each is one
//! card's own object, tagged with the card's index.
//!
//! An activation moves between cards *and stays* (so the residual stream crosses once per
//! boundary), while ops take their inputs by shared reference: a tensor sits in a `RefCell`
//! that the backend swaps from one card to the next. A fresh `zeros` tensor, or one uploaded
//! from the host, is not placed until its first op and materializes on that op's card.

use std::cell::{Ref, RefCell};

use backend::{Backend, BackendError};

/// Where an activation currently is.
pub enum Resident<B: Backend> {
    On(usize, B::Tensor),
    /// A zero tensor `[rows, cols]` not allocated anywhere yet.
    Zeros {
        rows: usize,
        cols: usize,
    },
    /// Host data `[rows, cols]` not uploaded anywhere yet.
    Host {
        data: Vec<f32>,
        rows: usize,
        cols: usize,
    },
}

/// An f32 activation `[rows, cols]` of the multi-card backend.
pub struct MultiTensor<B: Backend>(pub(crate) RefCell<Resident<B>>);

impl<B: Backend> MultiTensor<B> {
    pub(crate) fn new(r: Resident<B>) -> Self {
        MultiTensor(RefCell::new(r))
    }

    /// The card the tensor is on; `None` while unplaced.
    pub fn card(&self) -> Option<usize> {
        match &*self.0.borrow() {
            Resident::On(d, _) => Some(*d),
            _ => None,
        }
    }

    /// The tensor on card `d` (after placement).
    pub(crate) fn on(&self, d: usize) -> Result<Ref<'_, B::Tensor>, BackendError> {
        Ref::filter_map(self.0.borrow(), |r| match r {
            Resident::On(c, t) if *c == d => Some(t),
            _ => None,
        })
        .map_err(|_| misplaced(d))
    }

    pub(crate) fn on_mut(&mut self, d: usize) -> Result<&mut B::Tensor, BackendError> {
        match self.0.get_mut() {
            Resident::On(c, t) if *c == d => Ok(t),
            _ => Err(misplaced(d)),
        }
    }
}

/// An internal error: an op found an operand that placement should have moved.
fn misplaced(d: usize) -> BackendError {
    BackendError::Device(format!("multi: operand is not on card {d} after placement"))
}

/// A weight loaded on one card, or on a few (the tied embedding/output table; global tensors
/// every layer reads), in card order.
pub struct MultiWeight<B: Backend> {
    pub(crate) copies: Vec<(usize, B::Weight)>,
}

impl<B: Backend> MultiWeight<B> {
    /// The cards holding a copy.
    pub fn cards(&self) -> Vec<usize> {
        self.copies.iter().map(|(d, _)| *d).collect()
    }

    /// Where an op reading this weight runs: the card `prefer` if it holds a copy, else the
    /// last card that does (the output side: a tied table multiplies on the output card).
    pub fn card_for(&self, prefer: Option<usize>) -> usize {
        match prefer {
            Some(p) if self.copies.iter().any(|(d, _)| *d == p) => p,
            _ => self.copies.last().map_or(0, |(d, _)| *d),
        }
    }

    /// The card of the first copy (the embedding lookup's).
    pub fn first_card(&self) -> usize {
        self.copies.first().map_or(0, |(d, _)| *d)
    }

    pub(crate) fn on(&self, d: usize) -> Result<&B::Weight, BackendError> {
        self.copies
            .iter()
            .find(|(c, _)| *c == d)
            .map(|(_, w)| w)
            .ok_or_else(|| misplaced(d))
    }
}

/// One attention layer's KV cache of one sequence, on its layer's card.
pub struct MultiKvCache<B: Backend> {
    pub(crate) card: usize,
    pub(crate) cache: B::KvCache,
}

impl<B: Backend> MultiKvCache<B> {
    pub fn card(&self) -> usize {
        self.card
    }
}

/// One Gated DeltaNet layer's recurrent state of one sequence, on its layer's card.
pub struct MultiRecurrentState<B: Backend> {
    pub(crate) card: usize,
    pub(crate) state: B::RecurrentState,
}

impl<B: Backend> MultiRecurrentState<B> {
    pub fn card(&self) -> usize {
        self.card
    }
}

// Not derived: a derive would demand `B: Clone` of the backend itself.
impl<B: Backend> Clone for MultiRecurrentState<B> {
    fn clone(&self) -> Self {
        MultiRecurrentState {
            card: self.card,
            state: self.state.clone(),
        }
    }

    /// Restores a snapshot into the live buffers when both are on one card (a backend may
    /// copy in place, keeping addresses that recorded steps use).
    fn clone_from(&mut self, src: &Self) {
        if self.card == src.card {
            self.state.clone_from(&src.state);
        } else {
            *self = src.clone();
        }
    }
}

/// The one card all `items` are on (`None` for an empty list); an error if they disagree.
pub(crate) fn common_card<T>(
    op: &'static str,
    items: &[&mut T],
    card: impl Fn(&T) -> usize,
) -> Result<Option<usize>, BackendError> {
    let mut found = None;
    for it in items {
        let d = card(it);
        if found.is_some_and(|f| f != d) {
            return Err(BackendError::Device(format!(
                "multi {op}: the sequences' states of one layer are on different cards"
            )));
        }
        found = Some(d);
    }
    Ok(found)
}

/// The card-`d` halves of the KV caches (all checked to be there by `common_card`).
pub(crate) fn caches_on<'a, B: Backend>(
    items: &'a mut [&mut MultiKvCache<B>],
    d: usize,
) -> Result<Vec<&'a mut B::KvCache>, BackendError> {
    items
        .iter_mut()
        .map(|c| {
            if c.card == d {
                Ok(&mut c.cache)
            } else {
                Err(misplaced(d))
            }
        })
        .collect()
}

pub(crate) fn states_on<'a, B: Backend>(
    items: &'a mut [&mut MultiRecurrentState<B>],
    d: usize,
) -> Result<Vec<&'a mut B::RecurrentState>, BackendError> {
    items
        .iter_mut()
        .map(|s| {
            if s.card == d {
                Ok(&mut s.state)
            } else {
                Err(misplaced(d))
            }
        })
        .collect()
}
