//! Which device each layer, and so each weight tensor, KV cache and recurrent state, lives on.
//!
//! The `-ngl N` convention is llama.cpp's (src/llama-model.cpp `load_tensors`: `i_gpu_start =
//! max(n_layer + 1 - n_gpu_layers, 0)`, `dev_output = get_layer_buft_list(n_layer)`): the
//! model is `n_layer + 1` positions, the repeating layers `0..n_layer` followed by the output
//! layer (`output_norm` + `output`), and the GPU takes the **last** N positions. So `-ngl 1`
//! offloads only the output head, `-ngl n_layer` everything but layer 0, and `-ngl
//! n_layer + 1` (or more) the whole model. The input embedding (`token_embd`) always stays on
//! the CPU ("very little benefit to offloading the input layer"); when the output is tied to
//! it (no `output.weight`) and the output layer is on the GPU, the table is loaded on both
//! (llama.cpp's `TENSOR_DUPLICATED`): the CPU copy embeds (read in place from the mapping,
//! no extra memory), the GPU copy computes the logits.
//!
//! Taking layers from the end keeps the hidden state's path simple: embed on the CPU, the
//! first `n_layer - k` layers on the CPU, one crossing to the GPU, the rest there, logits
//! downloaded. Other splits (any range of GPU layers) are allowed and cost a crossing per
//! boundary.

use std::fmt;
use std::ops::Range;

use gguf::GgufFile;

/// A device of the hybrid backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    Cpu,
    Gpu,
}

/// Where a weight tensor is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightHome {
    Cpu,
    Gpu,
    /// The tied embedding/output table with the output layer on the GPU: embedded on the CPU,
    /// multiplied on the GPU.
    CpuAndGpu,
}

/// The layer → device map of one model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    n_layer: usize,
    gpu_layers: Range<usize>,
    output_on_gpu: bool,
}

impl Placement {
    /// `gpu_layers` (clamped to `0..n_layer`) on the GPU, the rest on the CPU; the output layer
    /// on the GPU iff `output_on_gpu`.
    pub fn new(n_layer: usize, gpu_layers: Range<usize>, output_on_gpu: bool) -> Placement {
        let start = gpu_layers.start.min(n_layer);
        let end = gpu_layers.end.clamp(start, n_layer);
        Placement {
            n_layer,
            gpu_layers: start..end,
            output_on_gpu,
        }
    }

    /// llama.cpp's `-ngl n_gpu_layers`: the last `n_gpu_layers` of the `n_layer + 1` positions
    /// (repeating layers, then the output layer) on the GPU. Values above `n_layer + 1`
    /// offload everything.
    pub fn from_ngl(n_layer: usize, n_gpu_layers: usize) -> Placement {
        let i_gpu_start = (n_layer + 1).saturating_sub(n_gpu_layers);
        Placement::new(n_layer, i_gpu_start..n_layer, n_gpu_layers >= 1)
    }

    /// [`Placement::from_ngl`] with `n_layer` read from the file ([`n_layer_of`]); `None` if
    /// the file does not say.
    pub fn from_ngl_gguf(file: &GgufFile, n_gpu_layers: usize) -> Option<Placement> {
        let n_layer = n_layer_of(file)?;
        Some(Placement::from_ngl(n_layer, n_gpu_layers))
    }

    /// Everything on the CPU.
    pub fn all_cpu(n_layer: usize) -> Placement {
        Placement::from_ngl(n_layer, 0)
    }

    /// Everything but the input embedding on the GPU.
    pub fn all_gpu(n_layer: usize) -> Placement {
        Placement::from_ngl(n_layer, n_layer + 1)
    }

    pub fn n_layer(&self) -> usize {
        self.n_layer
    }

    /// The repeating layers on the GPU.
    pub fn gpu_layers(&self) -> Range<usize> {
        self.gpu_layers.clone()
    }

    pub fn output_on_gpu(&self) -> bool {
        self.output_on_gpu
    }

    /// `(offloaded, total)` positions as llama.cpp logs "offloaded X/Y layers to GPU"
    /// (`total = n_layer + 1`, the output layer counted).
    pub fn offloaded(&self) -> (usize, usize) {
        (
            self.gpu_layers.len() + usize::from(self.output_on_gpu),
            self.n_layer + 1,
        )
    }

    /// The device of repeating layer `il`. Blocks past `n_layer` (e.g. a multi-token
    /// prediction head stored as extra blocks) go with the output layer.
    pub fn layer_device(&self, il: usize) -> Device {
        if il >= self.n_layer {
            self.output_device()
        } else if self.gpu_layers.contains(&il) {
            Device::Gpu
        } else {
            Device::Cpu
        }
    }

    /// The device of the output layer (`output_norm`, `output`, the logits).
    pub fn output_device(&self) -> Device {
        if self.output_on_gpu {
            Device::Gpu
        } else {
            Device::Cpu
        }
    }

    /// Where the weight `name` is loaded. `file_has_output`: the file has `output.weight`
    /// (otherwise the output is tied to `token_embd.weight`). `blk.N.*` follows layer N;
    /// `token_embd.*` stays on the CPU (also on the GPU when it is the tied output there);
    /// everything else (`output.weight`, `output_norm.weight`, …) goes with the output layer.
    pub fn weight_home(&self, name: &str, file_has_output: bool) -> WeightHome {
        let home = |d: Device| match d {
            Device::Cpu => WeightHome::Cpu,
            Device::Gpu => WeightHome::Gpu,
        };
        if let Some(il) = block_index(name) {
            return home(self.layer_device(il));
        }
        if name.starts_with("token_embd.") {
            return if name == "token_embd.weight" && !file_has_output && self.output_on_gpu {
                WeightHome::CpuAndGpu
            } else {
                WeightHome::Cpu
            };
        }
        home(self.output_device())
    }

    /// Hidden-state crossings one forward pass makes: the devices visited in order (the
    /// embedding on the CPU, each layer, the output layer) counted where they change. The
    /// logits download is not counted.
    pub fn boundaries(&self) -> usize {
        let path = std::iter::once(Device::Cpu)
            .chain((0..self.n_layer).map(|il| self.layer_device(il)))
            .chain(std::iter::once(self.output_device()));
        let mut n = 0;
        let mut prev = Device::Cpu;
        for d in path {
            if d != prev {
                n += 1;
            }
            prev = d;
        }
        n
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (x, y) = self.offloaded();
        write!(f, "{x}/{y} layers on the GPU")?;
        if !self.gpu_layers.is_empty() {
            write!(
                f,
                " (blk {}..{}{})",
                self.gpu_layers.start,
                self.gpu_layers.end,
                if self.output_on_gpu { " + output" } else { "" }
            )?;
        } else if self.output_on_gpu {
            write!(f, " (output)")?;
        }
        Ok(())
    }
}

/// `N` of a `blk.N.*` tensor name.
pub fn block_index(name: &str) -> Option<usize> {
    let rest = name.strip_prefix("blk.")?;
    let (n, _) = rest.split_once('.')?;
    n.parse().ok()
}

/// The file's main repeating-layer count (`model::ModelConfig::n_layer`):
/// `{arch}.block_count` less the multi-token-prediction blocks that llama.cpp counts in it
/// (`{arch}.nextn_predict_layers`).
pub fn n_layer_of(file: &GgufFile) -> Option<usize> {
    let arch = file.architecture()?;
    let meta = file.metadata();
    let blocks = usize::try_from(meta.get_u64(&format!("{arch}.block_count"))?).ok()?;
    let nextn = meta
        .get_u64(&format!("{arch}.nextn_predict_layers"))
        .map_or(Some(0), |n| usize::try_from(n).ok())?;
    blocks.checked_sub(nextn)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layers_on_gpu(p: &Placement) -> Vec<usize> {
        (0..p.n_layer())
            .filter(|&il| p.layer_device(il) == Device::Gpu)
            .collect()
    }

    #[test]
    fn ngl_takes_the_last_positions_output_first() {
        // 4 repeating layers + the output layer = 5 positions.
        let p = Placement::from_ngl(4, 0);
        assert_eq!(layers_on_gpu(&p), Vec::<usize>::new());
        assert_eq!(p.output_device(), Device::Cpu);
        assert_eq!(p.offloaded(), (0, 5));

        let p = Placement::from_ngl(4, 1);
        assert_eq!(layers_on_gpu(&p), Vec::<usize>::new());
        assert_eq!(p.output_device(), Device::Gpu);
        assert_eq!(p.offloaded(), (1, 5));

        let p = Placement::from_ngl(4, 3);
        assert_eq!(layers_on_gpu(&p), vec![2, 3]);
        assert_eq!(p.output_device(), Device::Gpu);
        assert_eq!(p.offloaded(), (3, 5));

        let p = Placement::from_ngl(4, 4);
        assert_eq!(layers_on_gpu(&p), vec![1, 2, 3]);
        assert_eq!(p.offloaded(), (4, 5));

        for ngl in [5, 6, 99, usize::MAX] {
            let p = Placement::from_ngl(4, ngl);
            assert_eq!(layers_on_gpu(&p), vec![0, 1, 2, 3], "ngl {ngl}");
            assert_eq!(p.output_device(), Device::Gpu);
            assert_eq!(p.offloaded(), (5, 5));
            assert_eq!(p, Placement::all_gpu(4));
        }
        assert_eq!(Placement::from_ngl(4, 0), Placement::all_cpu(4));
    }

    #[test]
    fn weights_follow_their_layer() {
        let p = Placement::from_ngl(4, 3); // blk 2, 3 + output
        assert_eq!(p.weight_home("blk.0.attn_q.weight", true), WeightHome::Cpu);
        assert_eq!(
            p.weight_home("blk.1.ffn_down.weight", true),
            WeightHome::Cpu
        );
        assert_eq!(
            p.weight_home("blk.2.attn_norm.weight", true),
            WeightHome::Gpu
        );
        assert_eq!(p.weight_home("blk.3.ssm_a", true), WeightHome::Gpu);
        assert_eq!(p.weight_home("output.weight", true), WeightHome::Gpu);
        assert_eq!(p.weight_home("output_norm.weight", true), WeightHome::Gpu);
        assert_eq!(p.weight_home("token_embd.weight", true), WeightHome::Cpu);
        // Tied output on the GPU: the table lives on both.
        assert_eq!(
            p.weight_home("token_embd.weight", false),
            WeightHome::CpuAndGpu
        );
        // Extra blocks (an MTP head) go with the output layer.
        assert_eq!(
            p.weight_home("blk.4.nextn.eh_proj.weight", true),
            WeightHome::Gpu
        );

        let p = Placement::from_ngl(4, 0);
        for name in [
            "blk.3.attn_q.weight",
            "output.weight",
            "output_norm.weight",
            "w0",
        ] {
            assert_eq!(p.weight_home(name, true), WeightHome::Cpu, "{name}");
        }
        assert_eq!(p.weight_home("token_embd.weight", false), WeightHome::Cpu);

        let p = Placement::all_gpu(4);
        assert_eq!(p.weight_home("blk.0.attn_q.weight", true), WeightHome::Gpu);
        assert_eq!(p.weight_home("token_embd.weight", true), WeightHome::Cpu);
        assert_eq!(p.weight_home("w0", true), WeightHome::Gpu);
    }

    #[test]
    fn block_names_parse_strictly() {
        assert_eq!(block_index("blk.12.attn_q.weight"), Some(12));
        assert_eq!(block_index("blk.x.attn_q.weight"), None);
        assert_eq!(block_index("blk.3"), None);
        assert_eq!(block_index("blk..w"), None);
        assert_eq!(block_index("output.weight"), None);
        assert_eq!(block_index("xblk.1.w"), None);
    }

    #[test]
    fn boundaries_count_device_changes_along_the_pass() {
        assert_eq!(Placement::from_ngl(4, 0).boundaries(), 0);
        for ngl in 1..=7 {
            // Embed on the CPU, then one move to the GPU (at some layer or the output).
            assert_eq!(Placement::from_ngl(4, ngl).boundaries(), 1, "ngl {ngl}");
        }
        // Middle layers on the GPU, output on the CPU: there and back.
        assert_eq!(Placement::new(6, 2..4, false).boundaries(), 2);
        // Middle layers and the output: there, back, there again.
        assert_eq!(Placement::new(6, 2..4, true).boundaries(), 3);
        // Ranges are clamped to the layers.
        let p = Placement::new(4, 2..10, false);
        assert_eq!(p.gpu_layers(), 2..4);
        assert_eq!(Placement::new(4, 7..9, false).gpu_layers(), 4..4);
    }

    #[test]
    fn n_layer_leaves_out_the_mtp_blocks() {
        let file = |keys: &[(&str, gguf::Value)]| {
            let mut w = gguf::GgufWriter::new();
            for (k, v) in keys {
                w.set_metadata(k, v.clone());
            }
            let mut bytes = Vec::new();
            w.write(&mut bytes, |_, _, _| Ok(())).unwrap();
            GgufFile::from_bytes(bytes).unwrap()
        };
        let arch = ("general.architecture", gguf::Value::String("qwen35".into()));
        let blocks = ("qwen35.block_count", gguf::Value::U32(5));
        let nextn = ("qwen35.nextn_predict_layers", gguf::Value::U32(1));
        assert_eq!(n_layer_of(&file(&[arch.clone(), blocks.clone()])), Some(5));
        let f = file(&[arch.clone(), blocks, nextn.clone()]);
        assert_eq!(n_layer_of(&f), Some(4));
        assert_eq!(
            Placement::from_ngl_gguf(&f, 2),
            Some(Placement::new(4, 3..4, true))
        );
        assert_eq!(n_layer_of(&file(std::slice::from_ref(&arch))), None);
        let too_many = ("qwen35.nextn_predict_layers", gguf::Value::U32(9));
        let blocks = ("qwen35.block_count", gguf::Value::U32(5));
        assert_eq!(n_layer_of(&file(&[arch, blocks, too_many])), None);
    }

    #[test]
    fn display_says_how_many_layers_are_offloaded() {
        assert_eq!(
            Placement::from_ngl(4, 3).to_string(),
            "3/5 layers on the GPU (blk 2..4 + output)"
        );
        assert_eq!(
            Placement::from_ngl(4, 1).to_string(),
            "1/5 layers on the GPU (output)"
        );
        assert_eq!(
            Placement::from_ngl(4, 0).to_string(),
            "0/5 layers on the GPU"
        );
    }
}
