//! The memory planner against numbers worked out by hand: fixture models (KV and state sizes
//! from their config.json), the real shapes of shared/BENCHMARKING.md (file sizes and rooflines
//! measured with llama.cpp), and the Qwen3.5-27B-on-a-16-GB-V100 what-if.

use model::plan::{plan, plan_placement, Device, GpuSpec, ModelMemory, PlanOptions};
use model::synth::{FileType, Shape};
use model::KvType;

fn fixture(arch: &str, file: &str) -> String {
    format!(
        "{}/../../tests/data/fixtures/{arch}/{file}",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// KV bytes per token and recurrent state per sequence from a fixture's config.json, by hand.
fn by_hand(arch: &str, kv_bytes_per_elem: f64) -> (u64, u64) {
    let text = std::fs::read_to_string(fixture(arch, "config.json")).unwrap();
    let c: serde_json::Value = serde_json::from_str(&text).unwrap();
    let c = c.get("text_config").unwrap_or(&c);
    let u = |k: &str| c[k].as_u64().unwrap();
    let n_layer = u("num_hidden_layers");
    let head_dim = c["head_dim"]
        .as_u64()
        .unwrap_or(u("hidden_size") / u("num_attention_heads"));
    let linear: Vec<bool> = match c["layer_types"].as_array() {
        Some(t) => t.iter().map(|x| x == "linear_attention").collect(),
        None => vec![false; n_layer as usize],
    };
    let n_attn = linear.iter().filter(|&&l| !l).count() as u64;
    let n_lin = n_layer - n_attn;
    let kv =
        n_attn as f64 * u("num_key_value_heads") as f64 * head_dim as f64 * 2.0 * kv_bytes_per_elem;
    let state = if n_lin > 0 {
        let (nk, nv) = (u("linear_num_key_heads"), u("linear_num_value_heads"));
        let (dk, dv) = (u("linear_key_head_dim"), u("linear_value_head_dim"));
        let channels = 2 * nk * dk + nv * dv;
        n_lin * 4 * ((u("linear_conv_kernel_dim") - 1) * channels + nv * dk * dv)
    } else {
        0
    };
    (kv as u64, state)
}

#[test]
fn fixture_models_kv_state_and_weights() {
    for arch in ["llama", "qwen2", "qwen3", "qwen35"] {
        for file in ["model-f32.gguf", "model-q8_0.gguf"] {
            let g = gguf::GgufFile::open(fixture(arch, file)).unwrap();
            let m = ModelMemory::from_gguf(&g).unwrap();
            for (kv, per_elem) in [(KvType::F16, 2.0), (KvType::Q8_0, 34.0 / 32.0)] {
                let (kv_by_hand, state_by_hand) = by_hand(arch, per_elem);
                let mut o = PlanOptions::for_model(&m);
                o.cache_type_k = kv;
                o.cache_type_v = kv;
                o.n_ctx = 1000;
                o.n_parallel = 2;
                let p = plan(&m, None, &o);
                assert_eq!(p.kv_bytes_per_token, kv_by_hand, "{arch} {file} {kv}");
                assert_eq!(p.state_bytes_per_seq, state_by_hand, "{arch} {file}");
                assert_eq!(p.ledger.kv_cache, 1000 * kv_by_hand);
                assert_eq!(p.ledger.recurrent_state, 2 * state_by_hand);
            }
            // Every tensor byte lands in exactly one ledger line.
            let file_bytes: u64 = g.tensors().iter().map(|t| t.n_bytes).sum();
            let p = plan(&m, None, &PlanOptions::for_model(&m));
            let l = &p.ledger;
            assert_eq!(
                l.layer_weights + l.output_head + l.token_embedding + l.mtp_weights,
                file_bytes
            );
            let embd = g.tensor("token_embd.weight").unwrap().n_bytes;
            assert_eq!(l.token_embedding, embd, "{arch} {file}");
            // Read per token: everything but the embedding table, plus one sequence's state.
            assert_eq!(p.bytes_per_token, file_bytes - embd + p.state_bytes_per_seq);
            assert_eq!(p.layers_on_gpu, 0);
            assert!((p.ceiling_tok_s - 50e9 / p.bytes_per_token as f64).abs() < 1e-6);
        }
    }
}

#[test]
fn real_shape_file_sizes_match_the_measured_files() {
    // shared/BENCHMARKING.md: llama.cpp files of these shapes; our ledger within 1 %.
    for (shape, ftype, file_gb) in [
        (Shape::qwen2_5_32b(), FileType::Q4KM, 19.85),
        (Shape::qwen2_5_32b(), FileType::IQ4XS, 17.41),
        (Shape::qwen3_5_27b(), FileType::Q4KM, 16.29),
        (Shape::qwen3_5_27b(), FileType::IQ4XS, 14.38),
        (Shape::qwen2_5_1_5b(), FileType::Q4KM, 1.11),
        (Shape::qwen2_5_1_5b(), FileType::Q4_0, 1.00),
    ] {
        let m = ModelMemory::from_shape(&shape, ftype);
        let p = plan(&m, None, &PlanOptions::for_model(&m));
        let l = &p.ledger;
        let total = (l.layer_weights + l.output_head + l.token_embedding) as f64 / 1e9;
        assert!(
            (total / file_gb - 1.0).abs() < 0.01,
            "{} {}: {total:.3} GB vs {file_gb}",
            shape.name,
            ftype.name()
        );
    }
}

#[test]
fn real_shape_rooflines_match_benchmarking() {
    // "Roofline = 4259 GB/s ÷ (file's tensor bytes − token-embedding table): 219 tok/s for the
    // 32B Q4_K_M, 273 for the 27B Q4_K_M, 311 for the 27B IQ4_XS" (weights only, depth 0).
    let h200 = GpuSpec {
        bandwidth_gbs: 4259.0,
        ..GpuSpec::from_table("h200").unwrap()
    };
    for (shape, ftype, roofline) in [
        (Shape::qwen2_5_32b(), FileType::Q4KM, 219.0),
        (Shape::qwen3_5_27b(), FileType::Q4KM, 273.0),
        (Shape::qwen3_5_27b(), FileType::IQ4XS, 311.0),
    ] {
        let m = ModelMemory::from_shape(&shape, ftype);
        let p = plan(&m, Some(&h200), &PlanOptions::for_model(&m));
        assert!(p.fits && p.layers_on_gpu == p.layers_total);
        let weights_read = p.bytes_per_token - p.state_bytes_per_seq;
        let tok_s = 4259e9 / weights_read as f64;
        assert!(
            (tok_s / roofline - 1.0).abs() < 0.01,
            "{} {}: {tok_s:.1} vs {roofline}",
            shape.name,
            ftype.name()
        );
        // The ceiling also reads the recurrent state (150 MiB for the 27B), never more than 2 %.
        assert!(p.ceiling_tok_s <= tok_s * (1.0 + 1e-12) && p.ceiling_tok_s > 0.98 * tok_s);
    }
}

fn v100() -> GpuSpec {
    GpuSpec::from_table("v100-16gb").unwrap()
}

fn opts(m: &ModelMemory, n_ctx: usize, kv: KvType) -> PlanOptions {
    PlanOptions {
        n_ctx,
        cache_type_k: kv,
        cache_type_v: kv,
        ..PlanOptions::for_model(m)
    }
}

#[test]
fn qwen35_27b_on_a_16_gb_v100() {
    let gpu = v100();
    let q4km = ModelMemory::from_shape(&Shape::qwen3_5_27b(), FileType::Q4KM);

    // Q4_K_M does not fit, neither at 4K f16 nor at 2K q8_0: it runs partly on the CPU.
    for (ctx, kv) in [(4096, KvType::F16), (2048, KvType::Q8_0)] {
        let p = plan(&q4km, Some(&gpu), &opts(&q4km, ctx, kv));
        assert!(!p.fits, "Q4_K_M fits at {ctx} {kv}?");
        assert!(p.short_by_bytes > 0);
        assert!(p.layers_on_gpu < p.layers_total);
        assert!(p.layers.iter().any(|l| l.device == Device::Host));
        assert!(p.host_bytes_per_token > 0);
        assert!(p.expected_tok_s < p.ceiling_tok_s);
        assert!(p.gpu_bytes_placed <= gpu.usable_bytes);
    }

    let p = plan(&q4km, Some(&gpu), &opts(&q4km, 4096, KvType::F16));
    let sg = p.suggestions.as_ref().unwrap();
    let quant = |name: &str| sg.quants.iter().find(|q| q.file_type == name).unwrap();
    assert!(!quant("Q4_K_M").fits);
    assert_eq!(quant("Q4_K_M").max_ctx_q8_0, None);
    // IQ4_XS and Q4_0 fit with a 2K–4K context and q8_0 KV (and at 4K f16).
    for name in ["IQ4_XS", "Q4_0"] {
        let q = quant(name);
        assert!(q.fits, "{name} at 4K f16");
        assert!(q.max_ctx_q8_0.unwrap() >= 4096, "{name}");
        assert!((q.expected_tok_s - q.ceiling_tok_s).abs() < 1e-9);
    }
    for (name, fits) in [
        ("Q8_0", false),
        ("Q6_K", false),
        ("Q5_K_M", false),
        ("Q3_K_S", true),
    ] {
        assert_eq!(quant(name).fits, fits, "{name}");
    }
    // The same answer from the file type itself.
    for ftype in [FileType::IQ4XS, FileType::Q4_0] {
        let m = ModelMemory::from_shape(&Shape::qwen3_5_27b(), ftype);
        for ctx in [2048, 4096] {
            let p = plan(&m, Some(&gpu), &opts(&m, ctx, KvType::Q8_0));
            assert!(p.fits, "{} at {ctx} q8_0", ftype.name());
            assert_eq!(p.layers_on_gpu, 65);
        }
    }

    // The ceiling is 900 GB/s ÷ bytes per token: ~15.7 GB for Q4_K_M (~57 tok/s), ~13.9 GB
    // for IQ4_XS (~65 tok/s).
    let iq4 = ModelMemory::from_shape(&Shape::qwen3_5_27b(), FileType::IQ4XS);
    let pi = plan(&iq4, Some(&gpu), &opts(&iq4, 4096, KvType::Q8_0));
    for p in [&p, &pi] {
        assert!((p.ceiling_tok_s - 900e9 / p.bytes_per_token as f64).abs() < 1e-9);
    }
    assert!((p.ceiling_tok_s - 57.2).abs() < 0.5, "{}", p.ceiling_tok_s);
    assert!(
        (pi.ceiling_tok_s - 64.9).abs() < 0.5,
        "{}",
        pi.ceiling_tok_s
    );
}

#[test]
fn partial_offload_speed_is_the_sum_of_both_reads() {
    let m = ModelMemory::from_shape(&Shape::qwen3_5_27b(), FileType::Q4KM);
    let gpu = GpuSpec::from_table("h200").unwrap();
    let mut o = PlanOptions::for_model(&m);
    // llama.cpp's -ngl 57: output head + the last 56 layers (8–63); 0–7 on the CPU.
    o.n_gpu_layers = Some(57);
    let p = plan(&m, Some(&gpu), &o);
    assert_eq!(p.layers_on_gpu, 57);
    let on_host: Vec<usize> = p
        .layers
        .iter()
        .filter(|l| l.device == Device::Host)
        .map(|l| l.index)
        .collect();
    assert_eq!(on_host, (0..8).collect::<Vec<_>>());
    let t = p.gpu_bytes_per_token as f64 / 4800e9 + p.host_bytes_per_token as f64 / 50e9;
    assert!((p.expected_tok_s - 1.0 / t).abs() < 1e-9);
    assert_eq!(
        p.gpu_bytes_per_token + p.host_bytes_per_token,
        p.bytes_per_token
    );
    // One layer in eight on the CPU costs several times the speed (measured: 5× on this host).
    assert!(p.ceiling_tok_s / p.expected_tok_s > 4.0);
}

#[test]
fn context_and_slots_scale_kv_and_state() {
    let m = ModelMemory::from_shape(&Shape::qwen3_5_27b(), FileType::IQ4XS);
    let gpu = GpuSpec::from_table("a100-80gb").unwrap();
    let mut o = opts(&m, 8192, KvType::Q8_0);
    o.n_parallel = 4;
    let p = plan_placement(&m, Some(&gpu), &o);
    assert_eq!(p.n_ctx_per_slot, 2048);
    assert_eq!(p.ledger.kv_cache, 8192 * 34816);
    assert_eq!(p.ledger.recurrent_state, 4 * 48 * 3_268_608);
    assert_eq!(
        p.gpu_bytes_full,
        p.ledger.compute.total()
            + p.ledger.runtime_overhead
            + p.ledger.output_head
            + p.ledger.layer_weights
            + p.ledger.kv_cache
            + p.ledger.recurrent_state
    );
    assert_eq!(p.bytes_per_token_full_ctx, p.bytes_per_token + 2048 * 34816);
    // Counting the embedding table in VRAM costs exactly its size.
    o.embeddings_on_gpu = true;
    let pe = plan_placement(&m, Some(&gpu), &o);
    assert_eq!(
        pe.gpu_bytes_full,
        p.gpu_bytes_full + p.ledger.token_embedding
    );
    assert_eq!(pe.bytes_per_token, p.bytes_per_token);
}

#[test]
fn nothing_fits_when_the_fixed_costs_do_not() {
    let m = ModelMemory::from_shape(&Shape::qwen2_5_32b(), FileType::Q4KM);
    let tiny = GpuSpec::custom(256 << 20, 500.0);
    let p = plan(&m, Some(&tiny), &PlanOptions::for_model(&m));
    assert!(!p.fits);
    assert_eq!(p.layers_on_gpu, 0);
    assert_eq!(p.gpu_bytes_placed, 0);
    assert_eq!(p.host_bytes_per_token, p.bytes_per_token);
    assert!(p.suggestions.unwrap().quants.iter().all(|q| !q.fits));
}

/// The llama fixture with some metadata replaced.
fn llama_with(overrides: &[(&str, gguf::Value)]) -> gguf::GgufFile {
    let src = gguf::GgufFile::open(fixture("llama", "model-f32.gguf")).unwrap();
    let mut w = gguf::GgufWriter::new();
    for (k, v) in src.metadata().iter() {
        w.set_metadata(k, v.clone());
    }
    for (k, v) in overrides {
        w.set_metadata(k, v.clone());
    }
    for t in src.tensors() {
        w.add_tensor(&t.name, &t.dims, t.ty).unwrap();
    }
    let mut bytes = Vec::new();
    w.write(&mut bytes, |i, _, out| {
        out.write_all(src.tensor_data(&src.tensors()[i]))
    })
    .unwrap();
    gguf::GgufFile::from_bytes(bytes).unwrap()
}

#[test]
fn absurd_hyperparameters_are_errors_and_huge_options_do_not_overflow() {
    use gguf::Value;
    for overrides in [
        vec![
            ("llama.attention.head_count", Value::U32(1 << 30)),
            ("llama.attention.head_count_kv", Value::U32(1 << 30)),
            ("llama.attention.key_length", Value::U32(1 << 20)),
            ("llama.attention.value_length", Value::U32(1 << 20)),
            ("llama.rope.dimension_count", Value::U32(64)),
        ],
        vec![("llama.vocab_size", Value::U64(1 << 40))],
        vec![("llama.block_count", Value::U32(1 << 20))],
    ] {
        let f = llama_with(&overrides);
        match ModelMemory::from_gguf(&f) {
            Err(model::ModelError::BadKey { .. } | model::ModelError::MissingKey(_)) => {}
            Err(e) => panic!("{overrides:?}: unexpected error {e}"),
            Ok(_) => panic!("{overrides:?} accepted"),
        }
    }
    // Unchanged metadata still plans; absurd options are clamped, not overflowed.
    let m = ModelMemory::from_gguf(&llama_with(&[])).unwrap();
    let mut o = PlanOptions::for_model(&m);
    o.n_ctx = usize::MAX;
    o.n_parallel = usize::MAX;
    o.n_ubatch = usize::MAX;
    let p = plan(&m, Some(&v100()), &o);
    assert_eq!(p.n_ctx, model::plan::MAX_CTX);
    assert!(!p.fits);
}
