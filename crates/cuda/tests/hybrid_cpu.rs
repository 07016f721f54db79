//! The hybrid (partial offload) backend with a second `CpuBackend` standing in for the GPU:
//! the placement, the move-once-and-stay rule and the crossing counts, checked in CI without
//! a GPU. `tests/hybrid_gpu.rs` runs the same checks on the real card.

mod hybrid_checks;

use std::sync::Arc;

use backend::cpu::CpuBackend;
use backend::{Backend, KvType};
use cuda::hybrid::{Device, Hybrid, Placement};
use hybrid_checks::*;
use model::{LoadOptions, ModelOn};

fn fake_gpu() -> CpuBackend {
    CpuBackend::new(2).unwrap()
}

#[test]
fn conformance_with_nothing_and_everything_offloaded() {
    check_conformance(fake_gpu);
}

#[test]
fn every_model_and_split_matches_the_cpu_with_one_crossing_per_boundary() {
    // Both halves are the same CPU code, so agreement is exact up to thread scheduling.
    check_all_models(fake_gpu, 1e-5);
}

#[test]
fn states_and_weights_land_on_their_layers_device() {
    let file = open(&fixture("qwen35", "model-f32.gguf"));
    let p = Placement::from_ngl(4, 3); // layers 2, 3 + output
    let b = Hybrid::new(fake_gpu(), fake_gpu(), p);
    for (name, want) in [
        ("blk.0.attn_qkv.weight", Device::Cpu),
        ("blk.1.attn_q.weight", Device::Cpu),
        ("blk.2.ssm_a", Device::Gpu),
        ("blk.3.attn_k.weight", Device::Gpu),
        ("output_norm.weight", Device::Gpu),
        ("token_embd.weight", Device::Cpu),
    ] {
        let w = b.load_weight(&file, name).unwrap();
        assert_eq!(w.device(Device::Gpu), want, "{name}");
    }
    let shape = backend::RecurrentShape {
        d_conv: 4,
        conv_channels: 8,
        n_k_heads: 1,
        n_v_heads: 1,
        d_k: 4,
        d_v: 4,
    };
    for (layer, want) in [
        (Some(0), Device::Cpu),
        (Some(2), Device::Gpu),
        (None, Device::Gpu),
    ] {
        b.set_layer(layer);
        assert_eq!(
            b.new_kv_cache(8, 1, 4, 4, KvType::F32).unwrap().device(),
            want
        );
        assert_eq!(b.new_recurrent_state(&shape).unwrap().device(), want);
    }
    // The layer is per thread: another thread that named none gets the output device.
    b.set_layer(Some(0));
    std::thread::scope(|s| {
        s.spawn(|| {
            let c = b.new_kv_cache(8, 1, 4, 4, KvType::F32).unwrap();
            assert_eq!(c.device(), Device::Gpu);
        });
    });
    b.set_layer(None);
}

#[test]
fn qwen35_snapshot_restore_across_devices() {
    // Recurrent states on both devices are snapshotted and restored together.
    let file = open(&fixture("qwen35", "model-f32.gguf"));
    let opts = LoadOptions {
        n_threads: 2,
        ubatch_size: 512,
    };
    let b = Hybrid::new(fake_gpu(), fake_gpu(), Placement::from_ngl(4, 3));
    let m = ModelOn::load_on(b, Arc::clone(&file), &opts).unwrap();
    let r = reference("qwen35");
    let mut s = m.new_state(64, KvType::F32).unwrap();
    m.forward(&mut s, &r.prompt_ids, false).unwrap();
    s.snapshot();
    let at = s.len();
    let first = m.forward(&mut s, &[r.greedy_ids[0]], false).unwrap();
    m.forward(&mut s, &[r.greedy_ids[1]], false).unwrap();
    s.truncate(at).unwrap();
    let again = m.forward(&mut s, &[r.greedy_ids[0]], false).unwrap();
    assert_eq!(first, again);
}
