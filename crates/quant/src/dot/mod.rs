//! Dot products of one weight row with one activation row, for every weight format, with
//! the instruction-set path chosen once at run time.
//!
//! Design: each instruction set (scalar, AVX2+FMA, AVX-512, NEON) is a module that hands
//! out plain `fn` pointers ([`DotFn`]) per weight type; [`dot_kernel`] picks one once per
//! matvec, so the per-row cost of dispatch is one indirect call. A SIMD module only
//! covers the formats it speeds up; the rest fall back to the scalar reference.
//! Prefill also gets multi-token kernels ([`DotTileFn`], [`dot_tile_kernel`]) that unpack
//! each weight block once for up to [`MAX_TILE`] tokens.
//!
//! Files: `scalar.rs` (reference, every format), `avx2.rs` (single-row AVX2 kernels and
//! shared helpers), `avx2_tile.rs` (AVX2 Q4_K/Q6_K/Q4_0/Q8_0, 1..=4 tokens; with one token
//! they are also the single-row kernels), `avx512.rs` (AVX-512 single-row Q4_K/Q6_K/Q8_0
//! and, with VNNI, Q4_0), `avx512_tile.rs` (AVX-512 VNNI Q4_K/Q6_K, 1..=8 tokens),
//! `neon.rs` (aarch64).

pub mod scalar;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_tile;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_tile;
#[cfg(target_arch = "aarch64")]
mod neon;

use gguf::GgmlType;
use std::sync::OnceLock;

/// One weight row (`n / block_size` blocks) · one activation row (the paired format of
/// [`crate::vec_dot_type`]), `n` elements. Implementations check the slice lengths.
pub type DotFn = fn(w: &[u8], act: &[u8], n: usize) -> f32;

/// One weight row · `n_tok` (1..=[`MAX_TILE`]) activation rows stored back to back in
/// `acts`; writes `out[..n_tok]`. Implementations check the slice lengths.
pub type DotTileFn = fn(w: &[u8], acts: &[u8], n_tok: usize, n: usize, out: &mut [f32]);

/// Most tokens a [`DotTileFn`] takes per call.
pub const MAX_TILE: usize = 8;

/// An instruction-set path. Use [`Isa::available`] before forcing one in tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable reference code.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// x86-64 AVX-512 F/BW/VL (with VNNI when present) on top of AVX2.
    Avx512,
    /// aarch64 NEON (with the dot-product extension when present).
    Neon,
}

impl Isa {
    /// Every path, slowest first.
    pub const ALL: [Isa; 4] = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon];

    /// Whether this CPU can run the path.
    pub fn available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::is_x86_feature_detected!("avx2")
                    && std::is_x86_feature_detected!("fma")
                    && std::is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.available()
                    && std::is_x86_feature_detected!("avx512f")
                    && std::is_x86_feature_detected!("avx512bw")
                    && std::is_x86_feature_detected!("avx512vl")
            }
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The paths this CPU can run.
    pub fn all_available() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.available()).collect()
    }
}

/// The fastest path this CPU supports (detected once).
pub fn best_isa() -> Isa {
    static BEST: OnceLock<Isa> = OnceLock::new();
    *BEST.get_or_init(|| {
        [Isa::Avx512, Isa::Avx2, Isa::Neon]
            .into_iter()
            .find(|i| i.available())
            .unwrap_or(Isa::Scalar)
    })
}

/// Whether a dot product exists for weights of type `ty`.
pub fn supports(ty: GgmlType) -> bool {
    scalar_kernel(ty).is_some()
}

/// The scalar reference for `ty`, wrapped to check the slice lengths.
fn scalar_kernel(ty: GgmlType) -> Option<DotFn> {
    use GgmlType::*;
    macro_rules! checked {
        ($ty:expr, $f:path) => {
            |w: &[u8], a: &[u8], n: usize| {
                check_lengths($ty, w, a, n);
                $f(w, a, n)
            }
        };
    }
    Some(match ty {
        F32 => checked!(F32, scalar::dot_f32),
        F16 => checked!(F16, scalar::dot_f16),
        BF16 => checked!(BF16, scalar::dot_bf16),
        Q4_0 => checked!(Q4_0, scalar::dot_q4_0),
        Q4_1 => checked!(Q4_1, scalar::dot_q4_1),
        Q5_0 => checked!(Q5_0, scalar::dot_q5_0),
        Q5_1 => checked!(Q5_1, scalar::dot_q5_1),
        Q8_0 => checked!(Q8_0, scalar::dot_q8_0),
        Q2K => checked!(Q2K, scalar::dot_q2_k),
        Q3K => checked!(Q3K, scalar::dot_q3_k),
        Q4K => checked!(Q4K, scalar::dot_q4_k),
        Q5K => checked!(Q5K, scalar::dot_q5_k),
        Q6K => checked!(Q6K, scalar::dot_q6_k),
        IQ4NL => checked!(IQ4NL, scalar::dot_iq4_nl),
        IQ4XS => checked!(IQ4XS, scalar::dot_iq4_xs),
        _ => return None,
    })
}

/// The dot kernel for weight type `ty` on path `isa`, falling back to the scalar
/// reference for formats the path does not cover. `None` if `ty` has no dot at all.
///
/// Panics if `isa` is not available on this CPU (forcing a path is for tests).
pub fn dot_kernel(isa: Isa, ty: GgmlType) -> Option<DotFn> {
    assert!(isa.available(), "{isa:?} is not available on this CPU");
    let simd: Option<DotFn> = match isa {
        Isa::Scalar => None,
        // SAFETY: `isa.available()` checked AVX2+FMA+F16C (and AVX-512 F/BW/VL) above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2_tile::row_kernel(ty).or_else(|| avx2::kernel(ty)) },
        // SAFETY: `isa.available()` checked AVX-512 F/BW/VL on top of AVX2+FMA+F16C.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe {
            avx512::kernel(ty)
                .or_else(|| avx2_tile::row_kernel(ty))
                .or_else(|| avx2::kernel(ty))
        },
        // SAFETY: `isa.available()` checked NEON above.
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => unsafe { neon::kernel(ty) },
        #[allow(unreachable_patterns)]
        _ => None,
    };
    simd.or_else(|| scalar_kernel(ty))
}

/// The multi-token kernel for weight type `ty` on path `isa`, where one exists: it unpacks
/// each weight block once for up to [`MAX_TILE`] tokens (prefill). `None` means: call the
/// single-row kernel per token.
///
/// Panics if `isa` is not available on this CPU.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
pub fn dot_tile_kernel(isa: Isa, ty: GgmlType) -> Option<DotTileFn> {
    assert!(isa.available(), "{isa:?} is not available on this CPU");
    match isa {
        // SAFETY: `isa.available()` checked AVX2+FMA+F16C above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2_tile::tile_kernel(ty) },
        // SAFETY: as above, plus AVX-512 F/BW/VL, and VNNI checked here.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe {
            let vnni = std::is_x86_feature_detected!("avx512vnni");
            vnni.then(|| avx512_tile::tile_kernel(ty))
                .flatten()
                .or_else(|| avx2_tile::tile_kernel(ty))
        },
        _ => None,
    }
}

/// Expected byte lengths of a weight row and an activation row of `n` elements.
///
/// Panics if `n` is not a multiple of the block sizes.
pub fn row_lengths(ty: GgmlType, n: usize) -> (usize, usize) {
    assert!(
        n.is_multiple_of(ty.block_size()),
        "row of {n} elements is not a multiple of the {} block size {}",
        ty.name(),
        ty.block_size()
    );
    let w = n / ty.block_size() * ty.type_size();
    (w, crate::activation::activation_row_bytes(ty, n))
}

/// Panics unless `w` and `act` hold exactly one row of `n` elements each. The SIMD
/// kernels call this before reading through raw pointers.
#[inline]
pub(crate) fn check_lengths(ty: GgmlType, w: &[u8], act: &[u8], n: usize) {
    let (wl, al) = row_lengths(ty, n);
    assert!(
        w.len() == wl && act.len() == al,
        "{} dot of {n} elements: weight row {} bytes (want {wl}), activations {} (want {al})",
        ty.name(),
        w.len(),
        act.len()
    );
}

/// `Σ a[i] · b[i]` over f32 slices of any (equal) length on the fastest path of this CPU,
/// for callers outside the matrix kernels (attention scores). Panics on unequal lengths.
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    static KERNEL: OnceLock<DotFn> = OnceLock::new();
    assert_eq!(a.len(), b.len(), "f32 dot of unequal lengths");
    let k = KERNEL.get_or_init(|| dot_kernel(best_isa(), GgmlType::F32).expect("f32 dot"));
    k(bytemuck::cast_slice(a), bytemuck::cast_slice(b), a.len())
}

/// `dot(w_row, act)` for weight type `ty` on the fastest path of this CPU.
///
/// `w_row`: one weight row of `n` elements; `act`: the row quantized by
/// [`crate::quantize_activations`]`(ty, ..)`. Panics on wrong lengths or an unsupported type.
pub fn vec_dot(ty: GgmlType, w_row: &[u8], act: &[u8], n: usize) -> f32 {
    vec_dot_with(best_isa(), ty, w_row, act, n)
}

/// As [`vec_dot`] on a forced path (panics if the CPU lacks it).
pub fn vec_dot_with(isa: Isa, ty: GgmlType, w_row: &[u8], act: &[u8], n: usize) -> f32 {
    check_lengths(ty, w_row, act, n);
    let k = dot_kernel(isa, ty).unwrap_or_else(|| panic!("no dot product for {}", ty.name()));
    k(w_row, act, n)
}
