//! Model shapes: the hyperparameters of real models, and the tensor table (names, dims) and
//! metadata llama.cpp's converter writes for them.
//!
//! Tensor names and dims follow llama.cpp's GGUF conventions (`gguf-py/gguf/constants.py`,
//! checked against the converted fixtures in tests/data/fixtures): dims are in ggml order,
//! `dims[0]` = input features (row length), `dims[1]` = output features.

/// Architecture, as written to `general.architecture`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    /// Qwen3.5 hybrid: gated full attention every `full_attention_interval` layers, Gated
    /// DeltaNet in the others.
    Qwen35,
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen35 => "qwen35",
        }
    }
}

/// Gated DeltaNet (linear attention) layer geometry of Qwen3.5.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaNetShape {
    /// Every this-many layers one is full attention (layers i with (i + 1) % n == 0).
    pub full_attention_interval: usize,
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    pub head_k_dim: usize,
    pub head_v_dim: usize,
    pub conv_kernel: usize,
}

impl DeltaNetShape {
    /// Channels of the fused q|k|v projection and of the causal conv: 2 key dims + value dim.
    pub fn conv_channels(&self) -> usize {
        2 * self.n_k_heads * self.head_k_dim + self.n_v_heads * self.head_v_dim
    }

    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.head_v_dim
    }
}

/// Everything that determines a model's tensor table and metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    /// Preset name (`qwen2.5-1.5b` …), also written to `general.name`.
    pub name: String,
    pub arch: Arch,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub rope_theta: f32,
    pub rms_eps: f32,
    /// Input embedding and output head share one tensor (no `output.weight`).
    pub tied_embeddings: bool,
    /// q/k/v projections have biases (Qwen2).
    pub qkv_bias: bool,
    /// Qwen3.5 only: DeltaNet layers, partial rotary dims and MRoPE sections.
    pub deltanet: Option<DeltaNetShape>,
    pub rope_dims: Option<usize>,
    pub rope_sections: Option<[u32; 4]>,
}

impl Shape {
    /// Qwen2.5-1.5B. The real checkpoint ties its embeddings; this preset writes a separate
    /// `output.weight`, as the llama.cpp files measured in shared/BENCHMARKING.md do (1.11 GB
    /// at Q4_K_M): decode reads the same bytes either way.
    pub fn qwen2_5_1_5b() -> Shape {
        Shape {
            name: "qwen2.5-1.5b".into(),
            arch: Arch::Qwen2,
            n_embd: 1536,
            n_ff: 8960,
            n_layer: 28,
            n_head: 12,
            n_head_kv: 2,
            head_dim: 128,
            n_vocab: 151936,
            n_ctx_train: 32768,
            rope_theta: 1_000_000.0,
            rms_eps: 1e-6,
            tied_embeddings: false,
            qkv_bias: true,
            deltanet: None,
            rope_dims: None,
            rope_sections: None,
        }
    }

    pub fn qwen2_5_32b() -> Shape {
        Shape {
            name: "qwen2.5-32b".into(),
            n_embd: 5120,
            n_ff: 27648,
            n_layer: 64,
            n_head: 40,
            n_head_kv: 8,
            n_vocab: 152064,
            rms_eps: 1e-5,
            ..Shape::qwen2_5_1_5b()
        }
    }

    pub fn llama3_8b() -> Shape {
        Shape {
            name: "llama3-8b".into(),
            arch: Arch::Llama,
            n_embd: 4096,
            n_ff: 14336,
            n_layer: 32,
            n_head: 32,
            n_head_kv: 8,
            head_dim: 128,
            n_vocab: 128256,
            n_ctx_train: 8192,
            rope_theta: 500_000.0,
            rms_eps: 1e-5,
            tied_embeddings: false,
            qkv_bias: false,
            deltanet: None,
            rope_dims: Some(128),
            rope_sections: None,
        }
    }

    /// Qwen3.5-27B: 64 layers, every 4th gated full attention (24 heads × 256, attn_q emits
    /// query and gate), the rest Gated DeltaNet (16 key / 48 value heads of 128).
    pub fn qwen3_5_27b() -> Shape {
        Shape {
            name: "qwen3.5-27b".into(),
            arch: Arch::Qwen35,
            n_embd: 5120,
            n_ff: 17408,
            n_layer: 64,
            n_head: 24,
            n_head_kv: 4,
            head_dim: 256,
            n_vocab: 248320,
            n_ctx_train: 262144,
            rope_theta: 10_000_000.0,
            rms_eps: 1e-6,
            tied_embeddings: false,
            qkv_bias: false,
            deltanet: Some(DeltaNetShape {
                full_attention_interval: 4,
                n_k_heads: 16,
                n_v_heads: 48,
                head_k_dim: 128,
                head_v_dim: 128,
                conv_kernel: 4,
            }),
            rope_dims: Some(64),
            rope_sections: Some([11, 11, 10, 0]),
        }
    }

    /// The presets `redline synth --shape` accepts.
    pub fn presets() -> Vec<Shape> {
        vec![
            Shape::qwen2_5_1_5b(),
            Shape::qwen2_5_32b(),
            Shape::qwen3_5_27b(),
            Shape::llama3_8b(),
        ]
    }

    pub fn preset(name: &str) -> Option<Shape> {
        Shape::presets()
            .into_iter()
            .find(|s| s.name.eq_ignore_ascii_case(name))
    }

    /// Whether layer `il` is a DeltaNet (recurrent) layer.
    pub fn is_recurrent(&self, il: usize) -> bool {
        match &self.deltanet {
            Some(d) => !(il + 1).is_multiple_of(d.full_attention_interval),
            None => false,
        }
    }

    /// Tensor table in the order written: token_embd, output_norm, output, then each layer.
    /// Each entry is (name, dims in ggml order).
    pub fn tensors(&self) -> Vec<(String, Vec<u64>)> {
        let mut t: Vec<(String, Vec<u64>)> = Vec::new();
        let mut add = |name: String, dims: &[usize]| {
            t.push((name, dims.iter().map(|&d| d as u64).collect()));
        };
        add("token_embd.weight".into(), &[self.n_embd, self.n_vocab]);
        add("output_norm.weight".into(), &[self.n_embd]);
        if !self.tied_embeddings {
            add("output.weight".into(), &[self.n_embd, self.n_vocab]);
        }
        let q_dim = self.n_head * self.head_dim;
        let kv_dim = self.n_head_kv * self.head_dim;
        for il in 0..self.n_layer {
            let p = |s: &str| format!("blk.{il}.{s}");
            add(p("attn_norm.weight"), &[self.n_embd]);
            if let (Some(d), true) = (&self.deltanet, self.is_recurrent(il)) {
                let ch = d.conv_channels();
                add(p("attn_qkv.weight"), &[self.n_embd, ch]);
                add(p("attn_gate.weight"), &[self.n_embd, d.value_dim()]);
                add(p("ssm_conv1d.weight"), &[d.conv_kernel, ch]);
                add(p("ssm_dt.bias"), &[d.n_v_heads]);
                add(p("ssm_a"), &[d.n_v_heads]);
                add(p("ssm_alpha.weight"), &[self.n_embd, d.n_v_heads]);
                add(p("ssm_beta.weight"), &[self.n_embd, d.n_v_heads]);
                add(p("ssm_norm.weight"), &[d.head_v_dim]);
                add(p("ssm_out.weight"), &[d.value_dim(), self.n_embd]);
            } else {
                // Qwen3.5's gated attention: attn_q emits query and gate, [n_embd, 2 * q_dim].
                let q_rows = if self.arch == Arch::Qwen35 {
                    2 * q_dim
                } else {
                    q_dim
                };
                add(p("attn_q.weight"), &[self.n_embd, q_rows]);
                add(p("attn_k.weight"), &[self.n_embd, kv_dim]);
                add(p("attn_v.weight"), &[self.n_embd, kv_dim]);
                if self.qkv_bias {
                    add(p("attn_q.bias"), &[q_dim]);
                    add(p("attn_k.bias"), &[kv_dim]);
                    add(p("attn_v.bias"), &[kv_dim]);
                }
                if self.arch == Arch::Qwen35 {
                    add(p("attn_q_norm.weight"), &[self.head_dim]);
                    add(p("attn_k_norm.weight"), &[self.head_dim]);
                }
                add(p("attn_output.weight"), &[q_dim, self.n_embd]);
            }
            // Qwen3.5 names the pre-FFN norm post_attention_norm; llama/qwen2 ffn_norm.
            if self.arch == Arch::Qwen35 {
                add(p("post_attention_norm.weight"), &[self.n_embd]);
            } else {
                add(p("ffn_norm.weight"), &[self.n_embd]);
            }
            add(p("ffn_gate.weight"), &[self.n_embd, self.n_ff]);
            add(p("ffn_up.weight"), &[self.n_embd, self.n_ff]);
            add(p("ffn_down.weight"), &[self.n_ff, self.n_embd]);
        }
        t
    }

    /// Parameter count (all tensor elements).
    pub fn n_params(&self) -> u64 {
        self.tensors()
            .iter()
            .map(|(_, d)| d.iter().product::<u64>())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_counts_match_the_model_names() {
        // Published totals: 1.54B, 32.8B, 8.03B; Qwen3.5-27B ~26.9B without the MTP layer.
        // 1.5B adds its untied output head (0.23B) here.
        let b = |s: Shape| s.n_params() as f64 / 1e9;
        assert!((b(Shape::qwen2_5_1_5b()) - 1.777).abs() < 0.01);
        assert!((b(Shape::qwen2_5_32b()) - 32.76).abs() < 0.05);
        assert!((b(Shape::llama3_8b()) - 8.03).abs() < 0.01);
        assert!((b(Shape::qwen3_5_27b()) - 26.9).abs() < 0.1);
    }

    #[test]
    fn qwen35_deltanet_tensor_shapes() {
        let s = Shape::qwen3_5_27b();
        let t: std::collections::HashMap<_, _> = s.tensors().into_iter().collect();
        let d = |n: &str| t.get(n).cloned().unwrap_or_else(|| panic!("{n} missing"));
        assert_eq!(d("blk.0.attn_qkv.weight"), vec![5120, 10240]);
        assert_eq!(d("blk.0.attn_gate.weight"), vec![5120, 6144]);
        assert_eq!(d("blk.0.ssm_out.weight"), vec![6144, 5120]);
        assert_eq!(d("blk.0.ssm_beta.weight"), vec![5120, 48]);
        assert_eq!(d("blk.0.ssm_alpha.weight"), vec![5120, 48]);
        assert_eq!(d("blk.0.ssm_conv1d.weight"), vec![4, 10240]);
        assert_eq!(d("blk.0.ssm_a"), vec![48]);
        assert_eq!(d("blk.0.ssm_dt.bias"), vec![48]);
        assert_eq!(d("blk.0.ssm_norm.weight"), vec![128]);
        assert_eq!(d("blk.3.attn_q.weight"), vec![5120, 12288]);
        assert_eq!(d("blk.3.attn_k.weight"), vec![5120, 1024]);
        assert_eq!(d("blk.3.attn_output.weight"), vec![6144, 5120]);
        assert_eq!(d("blk.3.attn_q_norm.weight"), vec![256]);
        assert!(!t.contains_key("blk.3.attn_qkv.weight"));
        assert!(!t.contains_key("blk.0.attn_q.weight"));
        let n_full = (0..64).filter(|&i| !s.is_recurrent(i)).count();
        assert_eq!(n_full, 16);
    }
}
