//! `CudaBackend` against the backend conformance suite (every op vs f64 host code). Needs a GPU:
//! `cargo test -p cuda --release --test backend_conformance -- --ignored`. Without one, only
//! the clean-error check runs.

use backend::conformance;
use cuda::backend::{CudaBackend, StagedFusions};
use cuda::CudaOptions;

#[test]
fn no_device_is_a_clean_error() {
    if cuda::device_count().unwrap_or(0) > 0 {
        return;
    }
    let e = CudaBackend::new(&CudaOptions::default())
        .err()
        .expect("no GPU here, yet the backend opened");
    assert!(!e.to_string().is_empty());
}

fn gpu() -> CudaBackend {
    CudaBackend::new(&CudaOptions::default()).expect("a CUDA device (this test is --ignored)")
}

/// Asserts two paths' outputs are the same bits (same arithmetic in the same order).
fn assert_same_bits(what: &str, one: &[f32], each: &[f32]) {
    let differ = one
        .iter()
        .zip(each)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    let worst = one
        .iter()
        .zip(each)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert_eq!(
        (one.len(), differ),
        (each.len(), 0),
        "{what}: {differ} of {} values differ (max |diff| {worst:e})",
        one.len()
    );
}

#[test]
#[ignore = "needs a CUDA device"]
fn conformance_matmul_and_embed() {
    conformance::matmul_and_embed(&gpu()).unwrap();
}

#[test]
#[ignore = "needs a CUDA device"]
fn conformance_norms_and_activations() {
    conformance::norms_and_activations(&gpu()).unwrap();
}

#[test]
#[ignore = "needs a CUDA device"]
fn conformance_download_cols() {
    conformance::download_cols(&gpu()).unwrap();
}

#[test]
#[ignore = "needs a CUDA device"]
fn conformance_argmax_cols() {
    conformance::argmax_cols(&gpu()).unwrap();
}

#[test]
#[ignore = "needs a CUDA device"]
fn conformance_top_k_cols() {
    conformance::top_k_cols(&gpu()).unwrap();
}

#[test]
#[ignore = "needs a CUDA device"]
fn conformance_rope() {
    conformance::rope(&gpu()).unwrap();
}

#[test]
#[ignore = "needs a CUDA device"]
fn conformance_attention() {
    conformance::attention(&gpu()).unwrap();
}

/// The attention chain fused into one launch (norms, RoPE, K/V store, split decode, the
/// gate; the merge where the context needs splits) and as separate ops, both against the naive
/// host code, and the same bits.
#[test]
#[ignore = "needs a CUDA device"]
fn conformance_attention_block_fused_and_not() {
    let b = gpu();
    assert!(b.fused(), "fused paths on by default");
    let one = conformance::attention_block_outputs(&b).unwrap();
    let fused = b.fused_attention_calls();
    // 2 layer kinds x the 40 steps of one sequence alone; prompts and the steps of both
    // sequences together take the separate ops
    assert_eq!(fused, 80, "decode calls that took the fused launch");
    b.set_fused(false);
    let each = conformance::attention_block_outputs(&b).unwrap();
    assert_eq!(
        b.fused_attention_calls(),
        fused,
        "fused off: the separate ops"
    );
    assert_same_bits("fused vs separate ops", &one, &each);
}

/// The fused attention chain writing the q8_1 copy of its output for the o-projection (the
/// staged `attn_q8`) and the same chain with the projection's own quantize launch: the same
/// bits in the outputs and the products, both against host code.
#[test]
#[ignore = "needs a CUDA device"]
fn conformance_attention_q8_staged_and_not() {
    let b = gpu();
    b.set_staged(StagedFusions::default());
    let each = conformance::attention_block_with_products(&b).unwrap();
    assert_eq!(b.attn_q8_calls(), 0);
    b.set_staged(StagedFusions {
        attn_q8: true,
        ..StagedFusions::default()
    });
    let one = conformance::attention_block_with_products(&b).unwrap();
    // every call that took the fused chain (see conformance_attention_block_fused_and_not)
    assert_eq!(
        b.attn_q8_calls(),
        80,
        "fused calls that wrote the q8_1 copy"
    );
    assert_same_bits("outputs, staged vs separate quantize", &one.0, &each.0);
    assert_same_bits("products, staged vs separate quantize", &one.1, &each.1);
}

/// The query / key preparation of attention blocks the one-row chain does not take (prompts,
/// both sequences' steps together) in one launch (`mo_attn_prep_rows`, the staged `attn_rows`)
/// and as the separate copies, norms and RoPE: both against host code, and the same bits in
/// the outputs and the products after them.
#[test]
#[ignore = "needs a CUDA device"]
fn conformance_attention_rows_staged_and_not() {
    let b = gpu();
    b.set_staged(StagedFusions::default());
    let each = conformance::attention_block_with_products(&b).unwrap();
    assert_eq!(b.attn_rows_calls(), 0);
    b.set_staged(StagedFusions {
        attn_rows: true,
        ..StagedFusions::default()
    });
    let rows = conformance::attention_block_with_products(&b).unwrap();
    // 2 layer kinds x (2 prompt calls + the 40 steps of both sequences together)
    assert_eq!(
        b.attn_rows_calls(),
        84,
        "calls whose preparation took one launch"
    );
    assert_same_bits("outputs, one launch vs separate ops", &rows.0, &each.0);
    assert_same_bits("products, one launch vs separate ops", &rows.1, &each.1);
}

/// Gated DeltaNet's conv1d, silu, L2 norm and split in one launch (decode rows) and as
/// separate ops: both against the naive host code, and the same bits.
#[test]
#[ignore = "needs a CUDA device"]
fn conformance_conv1d_qkv_fused_and_not() {
    let b = gpu();
    // the one-row fusion alone (the multi-row one, on by default, has its own test below)
    b.set_staged(StagedFusions {
        conv_rows: false,
        ..StagedFusions::from_env()
    });
    let one = conformance::conv1d_qkv_outputs(&b).unwrap();
    // the 6 decode steps (both sequences together, then one alone); the prompt call is separate
    assert_eq!(
        b.fused_conv1d_qkv_calls(),
        6,
        "calls that took the one launch"
    );
    b.set_fused(false);
    let each = conformance::conv1d_qkv_outputs(&b).unwrap();
    assert_eq!(b.fused_conv1d_qkv_calls(), 6, "fused off: the separate ops");
    assert_same_bits("fused vs separate ops", &one, &each);
}

/// Gated DeltaNet's in-projections and conv chain (`in_proj_conv1d_qkv`): the f32 gate
/// products riding in the conv's launch (`mo_conv1d_qkv_gates`: blocks of 256 threads, eight
/// norm groups of 32 a conv block) and in a launch of their own, both against the naive host
/// code, and the same bits.
#[test]
#[ignore = "needs a CUDA device"]
fn conformance_in_proj_conv1d_qkv_gates_and_not() {
    let b = gpu();
    cuda::backend::set_conv_gates(Some(true));
    let ride = conformance::in_proj_conv1d_qkv(&b);
    // the decode steps of one row (sequence 0 alone: 3); two rows outside a recorded step
    // take no f32-rows launch, so the conv launches alone
    let calls = b.conv_gates_calls();
    cuda::backend::set_conv_gates(Some(false));
    let own = conformance::in_proj_conv1d_qkv(&b);
    let calls_off = b.conv_gates_calls() - calls;
    cuda::backend::set_conv_gates(None);
    let (ride, own) = (ride.unwrap(), own.unwrap());
    assert_eq!(
        (calls, calls_off),
        (3, 0),
        "calls whose gates rode in the conv"
    );
    assert_same_bits("gates in the conv's launch vs their own", &ride, &own);
}

/// The conv chain for several rows of a sequence in one launch (`mo_conv1d_qkv_rows`,
/// `StagedFusions::conv_rows`): the prompt call (5 and 3 rows of two sequences) takes it too,
/// against the naive host code and bit for bit the separate ops.
#[test]
#[ignore = "needs a CUDA device"]
fn conformance_conv1d_qkv_rows_staged_and_not() {
    let b = gpu();
    b.set_staged(StagedFusions {
        conv_rows: true,
        ..StagedFusions::default()
    });
    let rows = conformance::conv1d_qkv_outputs(&b).unwrap();
    assert_eq!(
        b.fused_conv1d_qkv_calls(),
        7,
        "calls that took one launch: the prompt call and the 6 decode steps"
    );
    b.set_staged(StagedFusions::default());
    b.set_fused(false);
    let each = conformance::conv1d_qkv_outputs(&b).unwrap();
    assert_eq!(b.fused_conv1d_qkv_calls(), 7, "fused off: the separate ops");
    assert_same_bits("one launch per call vs separate ops", &rows, &each);
}

/// The staged fusions of a Gated DeltaNet layer's tail (`StagedFusions`: the gates inside
/// `dn_recurrent`, the gated norm writing the out-projection's q8_1 copy, `dn_recurrent` under
/// PDL) and the separate launches: both against the naive host code, and the same bits.
#[test]
#[ignore = "needs a CUDA device"]
fn conformance_delta_tail_staged_and_not() {
    let b = gpu();
    b.set_staged(StagedFusions::default());
    let each = conformance::delta_tail_outputs(&b).unwrap();
    assert_eq!((b.fused_gates_calls(), b.norm_q8_calls()), (0, 0));
    b.set_staged(StagedFusions::ALL);
    let one = conformance::delta_tail_outputs(&b).unwrap();
    // the 4 decode calls (the prompt call has a chunked run: separate gates); the norm for
    // every call of at most 8 rows
    assert_eq!(
        (b.fused_gates_calls(), b.norm_q8_calls()),
        (4, 4),
        "calls that took the staged paths"
    );
    assert_same_bits("staged vs separate launches", &one, &each);
}

#[test]
#[ignore = "needs a CUDA device"]
fn conformance_delta_net() {
    conformance::delta_net(&gpu()).unwrap();
}

#[test]
#[ignore = "needs a CUDA device"]
fn conformance_run_all() {
    conformance::run_all(&gpu()).unwrap();
}
