//! Placeholder: filled in below.
use super::DotFn;
use gguf::GgmlType;

/// # Safety
/// The CPU must support this module's instruction set.
pub(super) unsafe fn kernel(_ty: GgmlType) -> Option<DotFn> {
    None
}
