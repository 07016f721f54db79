//! Synthetic models: GGUF files with a real model's exact shape (tensor names, dims, metadata,
//! quant mix, full-size vocabulary) and random weights.
//!
//! Speed depends only on shapes and types, so these files let anyone benchmark a 32B model, or
//! see whether it fits, before downloading it. The weights are random (small, finite), so the
//! generated text is meaningless.
//!
//! ```no_run
//! use model::synth::{FileType, Shape, SynthPlan};
//! let plan = SynthPlan::new(Shape::qwen2_5_1_5b(), FileType::Q4KM);
//! let file = std::io::BufWriter::new(std::fs::File::create("/tmp/q.gguf").unwrap());
//! plan.write(file, 42, |_bytes| {}).unwrap();
//! ```

pub mod mix;
pub mod random_data;
pub mod shape;
pub mod vocab;

use std::io::Write;

use gguf::{GgmlType, GgufError, GgufWriter, Value};
use rand::rngs::SmallRng;
use rand::SeedableRng;

pub use mix::{plan_types, plan_types_default, plan_types_for_quantize, FileType};
pub use shape::{Arch, DeltaNetShape, Shape};

/// One tensor to write.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedTensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
}

impl PlannedTensor {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    pub fn n_bytes(&self) -> u64 {
        self.ty
            .bytes_for(self.n_elements())
            .expect("planned types divide their rows")
    }
}

/// A shape, a file type, and the tensor table they give.
#[derive(Debug, Clone)]
pub struct SynthPlan {
    pub shape: Shape,
    pub ftype: FileType,
    pub tensors: Vec<PlannedTensor>,
}

/// Bytes of one chunk of generated data handed to the writer.
const CHUNK_BYTES: usize = 4 << 20;

/// Writes preset `name` cut to its first `layers` layers, with at most `max_vocab` tokens, as
/// a `ftype` file at `path` (seed 7): the real layer shapes at a size GPU tests can afford.
/// `None` for an unknown preset.
pub fn write_cut(
    name: &str,
    layers: usize,
    max_vocab: usize,
    ftype: FileType,
    path: &std::path::Path,
) -> Option<Result<(), GgufError>> {
    let mut shape = Shape::preset(name)?;
    shape.n_layer = layers;
    shape.n_vocab = shape.n_vocab.min(max_vocab);
    let plan = SynthPlan::new(shape, ftype);
    let file = match std::fs::File::create(path) {
        Ok(f) => f,
        Err(error) => {
            return Some(Err(GgufError::Io {
                path: path.display().to_string(),
                error,
            }))
        }
    };
    Some(plan.write(std::io::BufWriter::new(file), 7, |_| {}))
}

impl SynthPlan {
    pub fn new(shape: Shape, ftype: FileType) -> SynthPlan {
        let table = shape.tensors();
        let types = plan_types(&table, ftype);
        let tensors = table
            .into_iter()
            .zip(types)
            .map(|((name, dims), ty)| PlannedTensor { name, dims, ty })
            .collect();
        SynthPlan {
            shape,
            ftype,
            tensors,
        }
    }

    /// Bytes of tensor data, each tensor padded to the default 32-byte alignment.
    pub fn data_bytes(&self) -> u64 {
        self.tensors
            .iter()
            .map(|t| t.n_bytes().next_multiple_of(gguf::DEFAULT_ALIGNMENT))
            .sum()
    }

    /// Parameter count.
    pub fn n_params(&self) -> u64 {
        self.tensors.iter().map(|t| t.n_elements()).sum()
    }

    /// The metadata llama.cpp's converter writes for this shape, plus a synthetic vocabulary.
    pub fn metadata(&self) -> Vec<(String, Value)> {
        let s = &self.shape;
        let a = s.arch.name();
        let k = |key: &str| format!("{a}.{key}");
        let u = |x: usize| Value::U32(x as u32);
        let mut m: Vec<(String, Value)> = vec![
            ("general.architecture".into(), Value::String(a.into())),
            ("general.type".into(), Value::String("model".into())),
            (
                "general.name".into(),
                Value::String(format!("{} (synthetic, random weights)", s.name)),
            ),
            (k("block_count"), u(s.n_layer)),
            (k("context_length"), u(s.n_ctx_train)),
            (k("embedding_length"), u(s.n_embd)),
            (k("feed_forward_length"), u(s.n_ff)),
            (k("attention.head_count"), u(s.n_head)),
            (k("attention.head_count_kv"), u(s.n_head_kv)),
            (k("rope.freq_base"), Value::F32(s.rope_theta)),
            (k("attention.layer_norm_rms_epsilon"), Value::F32(s.rms_eps)),
            (k("attention.key_length"), u(s.head_dim)),
            (k("attention.value_length"), u(s.head_dim)),
        ];
        if s.arch == Arch::Llama {
            m.push((k("vocab_size"), u(s.n_vocab)));
        }
        if let Some(r) = s.rope_dims {
            m.push((k("rope.dimension_count"), u(r)));
        }
        if let Some(sec) = s.rope_sections {
            m.push((
                k("rope.dimension_sections"),
                Value::Array(gguf::Array::I32(sec.iter().map(|&x| x as i32).collect())),
            ));
        }
        if let Some(d) = &s.deltanet {
            m.push((k("ssm.conv_kernel"), u(d.conv_kernel)));
            m.push((k("ssm.state_size"), u(d.head_k_dim)));
            m.push((k("ssm.group_count"), u(d.n_k_heads)));
            m.push((k("ssm.time_step_rank"), u(d.n_v_heads)));
            m.push((k("ssm.inner_size"), u(d.value_dim())));
            m.push((k("full_attention_interval"), u(d.full_attention_interval)));
            let recurrent = (0..s.n_layer).map(|i| s.is_recurrent(i)).collect();
            m.push((
                k("attention.recurrent_layers"),
                Value::Array(gguf::Array::Bool(recurrent)),
            ));
        }
        m.push((
            "general.file_type".into(),
            u(self.ftype.llama_ftype() as usize),
        ));
        m.push(("general.quantization_version".into(), Value::U32(2)));
        for (key, v) in vocab::tokenizer_metadata(s.arch, s.n_vocab) {
            m.push((key.to_owned(), v));
        }
        m
    }

    /// Writes the GGUF to `out`, streaming: at most a few MB of tensor data are in memory at
    /// once. `progress(n)` is called after each chunk with the bytes of tensor data just written.
    /// The same seed writes the same file.
    pub fn write<W: Write>(
        &self,
        out: W,
        seed: u64,
        mut progress: impl FnMut(u64),
    ) -> Result<(), GgufError> {
        let mut w = GgufWriter::new();
        for (key, value) in self.metadata() {
            w.set_metadata(&key, value);
        }
        for t in &self.tensors {
            w.add_tensor(&t.name, &t.dims, t.ty)?;
        }
        let mut buf = Vec::new();
        w.write(out, |i, info, sink| {
            // One RNG per tensor, so a tensor's data does not depend on the ones before it.
            let mut rng =
                SmallRng::seed_from_u64(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let init = random_data::float_init_for(&info.name);
            let block = info.ty.type_size();
            let chunk = (CHUNK_BYTES / block).max(1) * block;
            let mut left = info.n_bytes as usize;
            while left > 0 {
                let n = left.min(chunk);
                buf.resize(n, 0);
                random_data::fill_random(info.ty, &mut buf, init, &mut rng);
                sink.write_all(&buf)?;
                progress(n as u64);
                left -= n;
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny(arch: Arch) -> Shape {
        let base = match arch {
            Arch::Llama => Shape::llama3_8b(),
            Arch::Qwen2 => Shape::qwen2_5_1_5b(),
            Arch::Qwen35 => Shape::qwen3_5_27b(),
        };
        Shape {
            name: format!("tiny-{}", arch.name()),
            n_embd: 256,
            n_ff: 512,
            n_layer: 4,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
            n_vocab: 1024,
            rope_dims: base.rope_dims.map(|_| 16),
            deltanet: base.deltanet.map(|d| DeltaNetShape {
                n_k_heads: 2,
                n_v_heads: 4,
                head_k_dim: 32,
                head_v_dim: 32,
                ..d
            }),
            ..base
        }
    }

    #[test]
    fn written_file_reads_back_with_the_planned_table() {
        for arch in [Arch::Llama, Arch::Qwen2, Arch::Qwen35] {
            for ftype in [
                FileType::Q4KM,
                FileType::IQ4XS,
                FileType::Q4_0,
                FileType::Q8_0,
            ] {
                let plan = SynthPlan::new(tiny(arch), ftype);
                let mut bytes = Vec::new();
                let mut progressed = 0;
                plan.write(&mut bytes, 7, |n| progressed += n).unwrap();
                let f = gguf::GgufFile::from_bytes(bytes.clone()).unwrap();
                assert_eq!(f.architecture(), Some(arch.name()));
                assert_eq!(f.tensors().len(), plan.tensors.len());
                for (t, p) in f.tensors().iter().zip(&plan.tensors) {
                    assert_eq!((&t.name, &t.dims, t.ty), (&p.name, &p.dims, p.ty));
                }
                let data: u64 = plan.tensors.iter().map(|t| t.n_bytes()).sum();
                assert_eq!(progressed, data);
                assert_eq!(f.file_len(), f.data_offset() + plan.data_bytes());
                let m = f.metadata();
                assert_eq!(
                    m.get_str_array("tokenizer.ggml.tokens").unwrap().len(),
                    1024
                );
                assert_eq!(m.get_u32(&format!("{}.block_count", arch.name())), Some(4));
                // same seed, same bytes
                let mut again = Vec::new();
                plan.write(&mut again, 7, |_| {}).unwrap();
                assert!(again == bytes);
            }
        }
    }

    #[test]
    fn norms_are_one_and_scales_finite() {
        let plan = SynthPlan::new(tiny(Arch::Qwen2), FileType::Q4_0);
        let mut bytes = Vec::new();
        plan.write(&mut bytes, 1, |_| {}).unwrap();
        let f = gguf::GgufFile::from_bytes(bytes).unwrap();
        let norm = f.tensor("blk.0.attn_norm.weight").unwrap();
        assert!(f
            .tensor_data(norm)
            .chunks_exact(4)
            .all(|c| f32::from_le_bytes(c.try_into().unwrap()) == 1.0));
        let q = f.tensor("blk.0.ffn_up.weight").unwrap();
        assert_eq!(q.ty, GgmlType::Q4_0);
        for block in f.tensor_data(q).chunks_exact(18) {
            let d = half::f16::from_bits(u16::from_le_bytes([block[0], block[1]])).to_f32();
            assert!(d.is_finite() && d > 0.0 && d < 0.01);
        }
    }

    #[test]
    fn tiny_synthetic_models_load_and_give_finite_logits() {
        for arch in [Arch::Llama, Arch::Qwen2, Arch::Qwen35] {
            for ftype in [
                FileType::Q4KM,
                FileType::IQ4XS,
                FileType::Q4_0,
                FileType::Q8_0,
            ] {
                let plan = SynthPlan::new(tiny(arch), ftype);
                let mut bytes = Vec::new();
                plan.write(&mut bytes, 3, |_| {}).unwrap();
                let file = gguf::GgufFile::from_bytes(bytes).unwrap();
                let model = crate::Model::load_from_gguf(file, &crate::LoadOptions::default())
                    .unwrap_or_else(|e| panic!("{} {}: {e}", arch.name(), ftype.name()));
                let mut state = model.new_state(64, crate::KvType::F16).unwrap();
                let logits = model.forward(&mut state, &[1, 2, 3, 4, 5], false).unwrap();
                assert_eq!(logits.len(), 1024);
                assert!(
                    logits.iter().all(|x| x.is_finite()),
                    "{} {}: non-finite logits",
                    arch.name(),
                    ftype.name()
                );
                let next = model.forward(&mut state, &[6], false).unwrap();
                assert!(next.iter().all(|x| x.is_finite()));
            }
        }
    }
}
