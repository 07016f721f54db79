//! On-disk block layouts of the ggml quantization formats.
//!
//! Each struct is byte-for-byte ggml's `block_*` (ggml/src/ggml-common.h). Every field is a
//! byte array, so every block has alignment 1 and any byte slice of the right length can be
//! viewed as a slice of blocks without copying (weights are read in place from the mmap).
//! Half-precision scales are stored as little-endian IEEE f16 bits: read them with [`f16_le`].

use bytemuck::{Pod, Zeroable};

/// Elements per block of the 32-wide formats.
pub const QK4_0: usize = 32;
pub const QK4_1: usize = 32;
pub const QK5_0: usize = 32;
pub const QK5_1: usize = 32;
pub const QK8_0: usize = 32;
pub const QK8_1: usize = 32;
pub const QK4_NL: usize = 32;
/// Elements per K-quant super-block.
pub const QK_K: usize = 256;
/// Packed 6-bit scale bytes of Q4_K / Q5_K (8 scales + 8 mins, 6 bits each).
pub const K_SCALE_SIZE: usize = 12;

/// Reads a little-endian f16 stored as two bytes, as f32.
#[inline(always)]
pub fn f16_le(b: [u8; 2]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes(b)).to_f32()
}

/// Stores an f32 as little-endian f16 bits (round to nearest even, as ggml's
/// `GGML_FP32_TO_FP16`).
#[inline(always)]
pub fn to_f16_le(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_bits().to_le_bytes()
}

/// x = d * q, q in [-8, 7]; low nibbles hold elements 0..16, high nibbles 16..32.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ4_0 {
    pub d: [u8; 2],
    pub qs: [u8; QK4_0 / 2],
}

/// x = d * q + m, q in [0, 15].
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ4_1 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qs: [u8; QK4_1 / 2],
}

/// x = d * q, q in [-16, 15]; the 5th bits live in `qh` (bit j for element j).
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ5_0 {
    pub d: [u8; 2],
    pub qh: [u8; 4],
    pub qs: [u8; QK5_0 / 2],
}

/// x = d * q + m, q in [0, 31].
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ5_1 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qh: [u8; 4],
    pub qs: [u8; QK5_1 / 2],
}

/// x = d * q, q in [-127, 127].
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ8_0 {
    pub d: [u8; 2],
    pub qs: [i8; QK8_0],
}

/// Activation format for Q4_1 / Q5_1 dots: x = d * q, with s = d * sum(q).
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ8_1 {
    pub d: [u8; 2],
    pub s: [u8; 2],
    pub qs: [i8; QK8_1],
}

/// 2-bit K-quant: 16 sub-blocks of 16, 4-bit scale and 4-bit min per sub-block.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ2K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: [u8; 2],
    pub dmin: [u8; 2],
}

/// 3-bit K-quant: low 2 bits in `qs`, high bit in `hmask`, 16 6-bit scales packed in 12 bytes.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: [u8; 2],
}

/// 4-bit K-quant: 8 sub-blocks of 32 with 6-bit scales and mins.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ4K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; K_SCALE_SIZE],
    pub qs: [u8; QK_K / 2],
}

/// 5-bit K-quant: as Q4_K plus one high bit per element in `qh`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ5K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; K_SCALE_SIZE],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}

/// 6-bit K-quant: 16 sub-blocks of 16 with signed 8-bit scales.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: [u8; 2],
}

/// Activation format for the K-quant dots: f32 scale, 256 int8, and sums of each 16.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ8K {
    pub d: [u8; 4],
    pub qs: [i8; QK_K],
    pub bsums: [[u8; 2]; QK_K / 16],
}

/// Non-linear 4-bit: x = d * KVALUES_IQ4NL[q].
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockIQ4NL {
    pub d: [u8; 2],
    pub qs: [u8; QK4_NL / 2],
}

/// Non-linear 4-bit with 8 sub-blocks of 32 and 6-bit sub-block scales
/// (low 4 bits in `scales_l`, high 2 bits in `scales_h`).
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockIQ4XS {
    pub d: [u8; 2],
    pub scales_h: [u8; 2],
    pub scales_l: [u8; QK_K / 64],
    pub qs: [u8; QK_K / 2],
}

/// The IQ4_NL / IQ4_XS code book (ggml-common.h `kvalues_iq4nl`).
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, size_of};

    #[test]
    fn sizes_match_ggml() {
        assert_eq!(size_of::<BlockQ4_0>(), 18);
        assert_eq!(size_of::<BlockQ4_1>(), 20);
        assert_eq!(size_of::<BlockQ5_0>(), 22);
        assert_eq!(size_of::<BlockQ5_1>(), 24);
        assert_eq!(size_of::<BlockQ8_0>(), 34);
        assert_eq!(size_of::<BlockQ8_1>(), 36);
        assert_eq!(size_of::<BlockQ2K>(), 84);
        assert_eq!(size_of::<BlockQ3K>(), 110);
        assert_eq!(size_of::<BlockQ4K>(), 144);
        assert_eq!(size_of::<BlockQ5K>(), 176);
        assert_eq!(size_of::<BlockQ6K>(), 210);
        assert_eq!(size_of::<BlockQ8K>(), 292);
        assert_eq!(size_of::<BlockIQ4NL>(), 18);
        assert_eq!(size_of::<BlockIQ4XS>(), 136);
        assert_eq!(align_of::<BlockQ8K>(), 1);
        assert_eq!(align_of::<BlockQ6K>(), 1);
    }
}
