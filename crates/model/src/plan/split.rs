//! Several GPUs in one host: which card holds which layer, and a ledger per card.
//!
//! Split modes are llama.cpp's (`--split-mode none|layer|row`, `--tensor-split`, `--main-gpu`,
//! common/arg.cpp):
//!
//! - **layer** (the default with several cards): each card holds whole layers. The `n_layer + 1`
//!   positions (the repeating layers, then the output layer: final norm + output head) are cut
//!   in proportion to each card's free memory, or to `--tensor-split 3,1`, exactly as
//!   llama.cpp's `load_tensors` does: with `splits` the normalized prefix sums of the
//!   proportions, position `il` goes to card `upper_bound(splits, il / (n_layer + 1))`. So the
//!   output layer is on the last card, and the hidden state crosses once per card boundary per
//!   forward pass. The token-embedding table sits on the first card (the CUDA backend embeds on
//!   the device); a tied output head is then loaded on the last card too. Each card has its own
//!   runtime context, compute buffers for its layers, the KV cache / recurrent state of its
//!   layers and a receive buffer for the incoming hidden state; the logits buffer and the
//!   speculation extras are on the last card. Decoding visits the cards one after the other, so
//!   a token takes the *sum* of the cards' read times: layer split adds memory, not speed.
//! - **tensor** (`row` is accepted as its llama.cpp name): every matrix is cut across the cards
//!   by rows/columns in the split's proportions (attention by heads, so the KV cache and the
//!   recurrent state split the same way; the output head by vocabulary rows); the token
//!   embedding sits on `--main-gpu`. Each card adds the all-reduce buffers (two all-reduces of
//!   `[n_ubatch, n_embd]` f32 per layer, in and out) and NCCL's own communicator memory. The
//!   cards read their shares at once, so a token takes the *slowest* card's read time plus the
//!   all-reduce latencies: this is what approaches N× one card's decode speed.
//! - **none**: one card, `--main-gpu`; the single-GPU planner ([`super::plan`]) applies.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use super::buffers::{self, compute_bytes};
use super::{plan_placement, GpuSpec, LayerKind, ModelMemory, Plan, PlanOptions};

/// Seconds one hidden-state crossing between cards adds to a decode step in layer mode: an
/// event wait and one small peer copy (`n_embd` f32 per row) on the receiving stream. An
/// estimate (PCIe/NVLink latency of a few µs plus the launch), to be checked against the
/// measured two-logical-device split in BENCHMARKS.md.
pub const CROSSING_SECONDS: f64 = 10e-6;

/// Seconds one small all-reduce adds to a decode step in tensor mode (NCCL ring/tree over
/// NVLink, a few KiB per rank: ~10-20 µs). An estimate; decode runs two per layer.
pub const ALLREDUCE_SECONDS: f64 = 15e-6;

/// Device memory NCCL's communicator takes per card (channel buffers, proxy state): an
/// estimate (it grows with the channel count and `NCCL_BUFFSIZE`, 4 MiB per channel per peer
/// by default).
pub const NCCL_COMM_BYTES: u64 = 256 << 20;

/// How one model is spread over several cards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SplitMode {
    /// One card (`--main-gpu`).
    None,
    /// Whole layers per card.
    Layer,
    /// Every matrix cut across the cards (tensor parallel, NCCL all-reduce).
    Tensor,
}

impl FromStr for SplitMode {
    type Err = String;

    /// `none`, `layer`, `tensor` (or llama.cpp's `row`).
    fn from_str(s: &str) -> Result<SplitMode, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "none" => Ok(SplitMode::None),
            "layer" => Ok(SplitMode::Layer),
            "tensor" | "row" => Ok(SplitMode::Tensor),
            _ => Err(format!("expected none, layer or tensor (row), got {s:?}")),
        }
    }
}

impl fmt::Display for SplitMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SplitMode::None => "none",
            SplitMode::Layer => "layer",
            SplitMode::Tensor => "tensor",
        })
    }
}

/// Parses `--tensor-split`: proportions separated by commas or slashes (`3,1`, `60/40`),
/// each finite and non-negative, not all zero.
pub fn parse_tensor_split(s: &str) -> Result<Vec<f64>, String> {
    let v: Vec<f64> = s
        .split([',', '/'])
        .map(|p| {
            p.trim()
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| format!("--tensor-split {s:?}: {p:?} is not a proportion >= 0"))
        })
        .collect::<Result<_, _>>()?;
    if v.iter().all(|&x| x == 0.0) {
        return Err(format!("--tensor-split {s:?}: every proportion is zero"));
    }
    Ok(v)
}

/// The proportions of each card: the tensor split when given (padded with zeros to
/// `n_cards`, as llama.cpp reads missing entries as 0), else the cards' free memory.
/// `None` when the split names more cards than there are, or gives nothing to any of them.
pub fn card_proportions(gpus: &[GpuSpec], tensor_split: Option<&[f64]>) -> Option<Vec<f64>> {
    let v: Vec<f64> = match tensor_split {
        Some(ts) => {
            if ts.len() > gpus.len() {
                return None;
            }
            (0..gpus.len())
                .map(|i| ts.get(i).copied().unwrap_or(0.0))
                .collect()
        }
        None => gpus
            .iter()
            .map(|g| g.usable_bytes.saturating_sub(g.runtime_overhead_bytes) as f64)
            .collect(),
    };
    let ok = v.iter().all(|x| x.is_finite() && *x >= 0.0) && v.iter().any(|&x| x > 0.0);
    ok.then_some(v)
}

/// The card of each of the `n_layer + 1` positions (the last is the output layer), by
/// llama.cpp's rule (src/llama-model.cpp `load_tensors`, `get_layer_buft_list` with every
/// layer offloaded): `splits` = prefix sums of `proportions` normalized to 1 (in f32, as
/// there), position `il` on card `upper_bound(splits, il / (n_layer + 1))`.
pub fn layer_cards(n_layer: usize, proportions: &[f64]) -> Vec<usize> {
    let n_pos = n_layer + 1;
    let n = proportions.len().max(1);
    let mut splits = Vec::with_capacity(n);
    let mut sum = 0.0f32;
    for &p in proportions {
        sum += p as f32;
        splits.push(sum);
    }
    if sum <= 0.0 {
        return vec![0; n_pos];
    }
    for s in &mut splits {
        *s /= sum;
    }
    (0..n_pos)
        .map(|il| {
            let x = il as f32 / n_pos as f32;
            splits.partition_point(|&s| s <= x).min(n - 1)
        })
        .collect()
}

/// What to split and how.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitRequest {
    pub mode: SplitMode,
    /// `--tensor-split` proportions, one per card; None: by free memory.
    pub tensor_split: Option<Vec<f64>>,
    /// `--main-gpu`: the card of `--split-mode none`, and of the token embedding in tensor mode.
    pub main_gpu: usize,
}

/// One card's share of the model and its ledger (bytes).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CardPlan {
    pub index: usize,
    pub gpu: GpuSpec,
    /// Repeating layers this card holds (layer mode: a consecutive range; tensor mode: all of
    /// them, each by `share`).
    pub layers: Vec<usize>,
    /// Fraction of every split matrix this card holds (1 for whole layers).
    pub share: f64,
    pub output_head: bool,
    pub token_embedding: bool,
    /// Weights: its layers (or its share of them), the head and the embedding table if here.
    pub weights: u64,
    pub kv_cache: u64,
    pub recurrent_state: u64,
    /// Activations (and attention tiles) of its layers, the logits on the output card.
    pub compute: u64,
    /// Receive buffer for the hidden state (layer mode) or all-reduce buffers plus NCCL's
    /// communicator (tensor mode).
    pub transfer: u64,
    /// Draft model, its cache and the verify buffers (on the output card).
    pub speculation: u64,
    pub runtime_overhead: u64,
    pub total: u64,
    /// `total <= gpu.usable_bytes`.
    pub fits: bool,
    pub short_by_bytes: u64,
    /// Positions on this card, the output layer counted ("offloaded X/Y layers to GPU i").
    pub positions: usize,
    /// Bytes this card reads per decode step of one sequence at depth 0.
    pub bytes_per_token: u64,
}

/// The plan of a model over several cards.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SplitPlan {
    pub mode: SplitMode,
    /// The whole-model ledger (every layer on the GPU side), at the plan's context; its
    /// placement fields (`fits`, `gpu_bytes_placed`, `short_by_bytes`, `layers_on_gpu`,
    /// `expected_tok_s`) are the split's.
    pub plan: Plan,
    pub cards: Vec<CardPlan>,
    /// Every card fits.
    pub fits: bool,
    /// Hidden-state crossings per forward pass (layer mode) or all-reduces per decode step
    /// (tensor mode).
    pub crossings: usize,
    /// Bytes moved between cards per decoded token (one sequence).
    pub transfer_bytes_per_token: u64,
    /// Predicted decode speed, one sequence at depth 0.
    pub expected_tok_s: f64,
    /// The same on one card of the set holding everything (the roofline of one card).
    pub one_card_tok_s: f64,
}

impl SplitPlan {
    /// `positions on card i` for each card, and the total (`n_layer + 1`, + MTP).
    pub fn offloaded(&self) -> (Vec<usize>, usize) {
        (
            self.cards.iter().map(|c| c.positions).collect(),
            self.plan.layers_total,
        )
    }
}

/// Plans `m` over `gpus` in `req.mode` (Layer or Tensor; None plans the main card alone,
/// as one card of a set). `None` when the proportions are unusable (see
/// [`card_proportions`]) or `main_gpu` is not a card.
pub fn plan_split(
    m: &ModelMemory,
    gpus: &[GpuSpec],
    opts: &PlanOptions,
    req: &SplitRequest,
) -> Option<SplitPlan> {
    if gpus.is_empty() || req.main_gpu >= gpus.len() {
        return None;
    }
    let props = match req.mode {
        SplitMode::None => {
            let mut v = vec![0.0; gpus.len()];
            v[req.main_gpu] = 1.0;
            v
        }
        _ => card_proportions(gpus, req.tensor_split.as_deref())?,
    };
    // The whole-model ledger on a card as large as the set.
    let combined = GpuSpec {
        name: format!("{} GPUs", gpus.len()),
        vram_bytes: gpus.iter().map(|g| g.vram_bytes).sum(),
        usable_bytes: gpus.iter().map(|g| g.usable_bytes).sum(),
        bandwidth_gbs: gpus[0].bandwidth_gbs,
        runtime_overhead_bytes: gpus[0].runtime_overhead_bytes,
    };
    let whole_opts = PlanOptions {
        n_gpu_layers: None,
        embeddings_on_gpu: true,
        ..opts.clone()
    };
    let mut plan = plan_placement(m, Some(&combined), &whole_opts);
    let cards = match req.mode {
        SplitMode::Tensor => tensor_cards(m, gpus, opts, &plan, &props, req.main_gpu),
        SplitMode::Layer | SplitMode::None => layer_cards_ledger(m, gpus, opts, &plan, &props),
    };
    let fits = cards.iter().all(|c| c.fits);
    let (crossings, transfer_bytes, expected) = match req.mode {
        SplitMode::Tensor => {
            let n_ar = if gpus.len() > 1 { 2 * m.n_layer } else { 0 };
            let t = cards
                .iter()
                .map(|c| c.bytes_per_token as f64 / (c.gpu.bandwidth_gbs * 1e9))
                .fold(0.0, f64::max)
                + n_ar as f64 * ALLREDUCE_SECONDS;
            // A ring all-reduce moves 2 (N-1)/N of the buffer per card.
            let n = gpus.len() as u64;
            let per_ar = 4 * m.n_embd as u64 * 2 * (n - 1) / n.max(1);
            (n_ar, n_ar as u64 * per_ar, inverse(t))
        }
        _ => {
            let used: Vec<&CardPlan> = cards.iter().filter(|c| c.positions > 0).collect();
            let crossings = used.len().saturating_sub(1);
            let t = used
                .iter()
                .map(|c| c.bytes_per_token as f64 / (c.gpu.bandwidth_gbs * 1e9))
                .sum::<f64>()
                + crossings as f64 * CROSSING_SECONDS;
            (
                crossings,
                crossings as u64 * 4 * m.n_embd as u64,
                inverse(t),
            )
        }
    };
    let one_card_tok_s = inverse(plan.bytes_per_token as f64 / (gpus[0].bandwidth_gbs * 1e9));
    let placed: u64 = cards.iter().map(|c| c.total).sum();
    plan.gpu = Some(combined);
    plan.fits = fits;
    plan.gpu_bytes_placed = placed;
    plan.gpu_bytes_full = placed;
    plan.short_by_bytes = cards.iter().map(|c| c.short_by_bytes).sum();
    plan.layers_on_gpu = plan.layers_total;
    plan.expected_tok_s = expected;
    plan.ceiling_tok_s = expected;
    Some(SplitPlan {
        mode: req.mode,
        plan,
        cards,
        fits,
        crossings,
        transfer_bytes_per_token: transfer_bytes,
        expected_tok_s: expected,
        one_card_tok_s,
    })
}

fn inverse(t: f64) -> f64 {
    if t > 0.0 {
        1.0 / t
    } else {
        f64::INFINITY
    }
}

/// Bytes of `token_embd.weight` (the table the first card embeds from, tied or not).
fn embedding_table_bytes(m: &ModelMemory) -> u64 {
    m.tensors
        .iter()
        .filter(|t| t.name == "token_embd.weight")
        .map(|t| t.n_bytes)
        .sum()
}

/// Fills in totals, fit and shortfall of a card.
fn finish(mut c: CardPlan) -> CardPlan {
    c.total = c.weights
        + c.kv_cache
        + c.recurrent_state
        + c.compute
        + c.transfer
        + c.speculation
        + c.runtime_overhead;
    c.fits = c.total <= c.gpu.usable_bytes;
    c.short_by_bytes = c.total.saturating_sub(c.gpu.usable_bytes);
    c
}

fn runtime_of(g: &GpuSpec, opts: &PlanOptions) -> u64 {
    opts.runtime_overhead_bytes
        .unwrap_or(g.runtime_overhead_bytes)
}

/// Layer mode: whole layers per card by llama.cpp's rule.
fn layer_cards_ledger(
    m: &ModelMemory,
    gpus: &[GpuSpec],
    opts: &PlanOptions,
    plan: &Plan,
    props: &[f64],
) -> Vec<CardPlan> {
    let cards_of = layer_cards(m.n_layer, props);
    let out_card = cards_of[m.n_layer];
    let n_ubatch = plan.n_ubatch;
    let cb = compute_bytes(m, n_ubatch);
    let receive = 4 * n_ubatch as u64 * m.n_embd as u64;
    let table = embedding_table_bytes(m);
    let head = plan.ledger.output_head;
    let state_per_layer = m
        .deltanet
        .as_ref()
        .map_or(0, buffers::recurrent_state_bytes_per_layer);
    let first_card = cards_of[0];
    let speculation = plan.ledger.speculation_total();
    let mut cards: Vec<CardPlan> = gpus
        .iter()
        .enumerate()
        .map(|(i, g)| CardPlan {
            index: i,
            gpu: g.clone(),
            layers: Vec::new(),
            share: 1.0,
            output_head: i == out_card,
            token_embedding: i == first_card,
            weights: 0,
            kv_cache: 0,
            recurrent_state: 0,
            compute: 0,
            transfer: 0,
            speculation: if i == out_card { speculation } else { 0 },
            runtime_overhead: 0,
            total: 0,
            fits: false,
            short_by_bytes: 0,
            positions: usize::from(i == out_card),
            bytes_per_token: 0,
        })
        .collect();
    for l in &plan.layers {
        // MTP blocks go with the output layer (llama.cpp counts them past n_layer).
        let card = if l.kind == LayerKind::Mtp {
            out_card
        } else {
            cards_of[l.index]
        };
        let c = &mut cards[card];
        if l.kind != LayerKind::Mtp {
            c.layers.push(l.index);
        }
        c.positions += 1;
        c.weights += l.weight_bytes;
        c.bytes_per_token += l.weight_bytes;
        match l.kind {
            LayerKind::Recurrent => {
                c.recurrent_state += l.cache_bytes;
                c.bytes_per_token += state_per_layer;
            }
            _ => c.kv_cache += l.cache_bytes,
        }
    }
    let tied = m.tied_embeddings();
    for c in &mut cards {
        if c.output_head {
            c.weights += head;
            c.bytes_per_token += head;
        }
        if c.token_embedding && !(tied && c.output_head) {
            // Untied: the table's own bytes (not in the head); tied: a second copy to embed
            // from when the head is on another card.
            c.weights += table;
        }
        let has_layers = c.positions > 0 || c.token_embedding;
        if has_layers {
            c.runtime_overhead = runtime_of(&c.gpu, opts);
            c.compute = cb.activations + cb.attention;
            if c.output_head {
                c.compute += cb.logits;
            }
            if c.index != first_card {
                c.transfer = receive;
            }
        }
    }
    cards.into_iter().map(finish).collect()
}

/// Tensor mode: every card holds its share of every matrix.
fn tensor_cards(
    m: &ModelMemory,
    gpus: &[GpuSpec],
    opts: &PlanOptions,
    plan: &Plan,
    props: &[f64],
    main_gpu: usize,
) -> Vec<CardPlan> {
    let sum: f64 = props.iter().sum();
    let n = gpus.len();
    let cb = compute_bytes(m, plan.n_ubatch);
    // Two all-reduces per layer over [n_ubatch, n_embd] f32: an input and an output buffer.
    let allreduce = 2 * 4 * plan.n_ubatch as u64 * m.n_embd as u64;
    let table = embedding_table_bytes(m);
    let tied = m.tied_embeddings();
    let l = &plan.ledger;
    let layers_w: u64 = plan
        .layers
        .iter()
        .filter(|x| x.kind != LayerKind::Mtp)
        .map(|x| x.weight_bytes)
        .sum();
    let mtp_w: u64 = plan
        .layers
        .iter()
        .filter(|x| x.kind == LayerKind::Mtp)
        .map(|x| x.weight_bytes + x.cache_bytes)
        .sum();
    let state_read = buffers::recurrent_state_bytes_per_seq(m);
    let share_of = |b: u64, s: f64| (b as f64 * s).ceil() as u64;
    gpus.iter()
        .enumerate()
        .map(|(i, g)| {
            let s = props[i] / sum;
            let holds = s > 0.0;
            let head = share_of(l.output_head, s);
            let mut weights = share_of(layers_w, s) + head + share_of(mtp_w, s);
            let embd = i == main_gpu;
            if embd && !(tied && holds) {
                weights += table;
            } else if embd && tied {
                // The full table to embed from beside this card's vocabulary rows.
                weights += table - share_of(table, s);
            }
            let compute = if holds || embd {
                cb.activations + cb.attention + share_of(cb.logits, s)
            } else {
                0
            };
            finish(CardPlan {
                index: i,
                gpu: g.clone(),
                layers: if holds {
                    (0..m.n_layer).collect()
                } else {
                    vec![]
                },
                share: s,
                output_head: holds,
                token_embedding: embd,
                weights,
                kv_cache: share_of(l.kv_cache, s),
                recurrent_state: share_of(l.recurrent_state, s),
                compute,
                transfer: if holds && n > 1 {
                    allreduce + NCCL_COMM_BYTES
                } else {
                    0
                },
                speculation: if embd { l.speculation_total() } else { 0 },
                runtime_overhead: if holds || embd {
                    runtime_of(g, opts)
                } else {
                    0
                },
                total: 0,
                fits: false,
                short_by_bytes: 0,
                positions: if holds { plan.layers_total } else { 0 },
                bytes_per_token: share_of(layers_w + l.output_head, s) + share_of(state_read, s),
            })
        })
        .collect()
}

/// The split plan `--fit` chose, and the context wanted when the chosen one is smaller.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitFit {
    pub plan: SplitPlan,
    pub reduced_from: Option<usize>,
}

/// `--fit` over several cards: the wanted context, halved down to the floor, until every
/// card fits (the single-card rule of [`super::fit`]; no CPU offload with several cards).
/// `Err` carries the plan at the wanted context when nothing fits.
pub fn fit_split(
    m: &ModelMemory,
    gpus: &[GpuSpec],
    req: &super::FitRequest,
    split: &SplitRequest,
) -> Option<Result<SplitFit, Box<SplitPlan>>> {
    let wanted = super::fit::wanted_ctx(m, req);
    let at = |n_ctx: usize| PlanOptions {
        n_ctx,
        n_gpu_layers: None,
        ..req.base.clone()
    };
    for ctx in super::fit::ctx_candidates(wanted, req.base.n_parallel) {
        let p = plan_split(m, gpus, &at(ctx), split)?;
        if p.fits {
            return Some(Ok(SplitFit {
                plan: p,
                reduced_from: (ctx < wanted).then_some(wanted),
            }));
        }
    }
    plan_split(m, gpus, &at(wanted), split).map(|p| Err(Box::new(p)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{FileType, Shape};

    fn req(mode: SplitMode, ts: Option<Vec<f64>>) -> SplitRequest {
        SplitRequest {
            mode,
            tensor_split: ts,
            main_gpu: 0,
        }
    }

    #[test]
    fn llama_cpp_layer_rule() {
        // 64 layers + output = 65 positions; 3:1 → splits [0.75, 1]: il/65 < 0.75 ⇔ il ≤ 48.
        let c = layer_cards(64, &[3.0, 1.0]);
        assert_eq!(c.len(), 65);
        assert_eq!(c.iter().filter(|&&d| d == 0).count(), 49);
        assert!(c[..49].iter().all(|&d| d == 0) && c[49..].iter().all(|&d| d == 1));
        // Even: 33 + 32 of 65, the output on the last card.
        let e = layer_cards(64, &[1.0, 1.0]);
        assert_eq!(e.iter().filter(|&&d| d == 0).count(), 33);
        assert_eq!(e[64], 1);
        // Four cards, 28 layers + output: 29 positions at 0.25, 0.5, 0.75.
        let f = layer_cards(28, &[1.0; 4]);
        let counts: Vec<usize> = (0..4)
            .map(|d| f.iter().filter(|&&x| x == d).count())
            .collect();
        assert_eq!(counts, vec![8, 7, 7, 7]);
        // A zero share gets nothing; monotone order always.
        let z = layer_cards(10, &[1.0, 0.0, 1.0]);
        assert!(!z.contains(&1));
        assert!(z.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(layer_cards(3, &[0.0, 1.0]), vec![1; 4]);
    }

    #[test]
    fn tensor_split_parsing() {
        assert_eq!(parse_tensor_split("3,1"), Ok(vec![3.0, 1.0]));
        assert_eq!(parse_tensor_split("60/40"), Ok(vec![60.0, 40.0]));
        assert!(parse_tensor_split("0,0").is_err());
        assert!(parse_tensor_split("1,-1").is_err());
        assert!(parse_tensor_split("a").is_err());
        assert_eq!("row".parse::<SplitMode>(), Ok(SplitMode::Tensor));
        assert_eq!("Layer".parse::<SplitMode>(), Ok(SplitMode::Layer));
        assert!("rows".parse::<SplitMode>().is_err());
        let v = GpuSpec::from_table("v100").unwrap();
        assert!(card_proportions(std::slice::from_ref(&v), Some(&[1.0, 1.0])).is_none());
        assert_eq!(
            card_proportions(&[v.clone(), v.clone()], Some(&[1.0])),
            Some(vec![1.0, 0.0])
        );
    }

    /// Qwen2.5-32B Q4_K_M (19.85 GB) does not fit one 16 GB V100 but fits two, layer split,
    /// at the default 4K context; every byte of the one-card ledger is on exactly one card
    /// (the per-card fixed costs on each).
    #[test]
    fn qwen32b_q4km_fits_two_v100s_not_one() {
        let m = ModelMemory::from_shape(&Shape::qwen2_5_32b(), FileType::Q4KM);
        let v100 = GpuSpec::from_table("v100-16gb").unwrap();
        let o = PlanOptions::for_model(&m);
        let one = crate::plan::plan(&m, Some(&v100), &o);
        assert!(!one.fits);
        let p = plan_split(
            &m,
            &[v100.clone(), v100.clone()],
            &o,
            &req(SplitMode::Layer, None),
        )
        .unwrap();
        assert!(
            p.fits,
            "{:?}",
            p.cards.iter().map(|c| c.total).collect::<Vec<_>>()
        );
        let [a, b] = [&p.cards[0], &p.cards[1]];
        assert_eq!((a.positions, b.positions), (33, 32));
        assert_eq!(a.layers, (0..33).collect::<Vec<_>>());
        assert_eq!(b.layers, (33..64).collect::<Vec<_>>());
        assert!(b.output_head && !a.output_head && a.token_embedding);
        let l = &one.ledger;
        assert_eq!(
            a.weights + b.weights,
            l.layer_weights + l.output_head + l.token_embedding
        );
        assert_eq!(a.kv_cache + b.kv_cache, l.kv_cache);
        assert_eq!(a.kv_cache, 33 * 4096 * 4096);
        let cb = compute_bytes(&m, 512);
        assert_eq!(a.compute, cb.activations + cb.attention);
        assert_eq!(b.compute, cb.total());
        assert_eq!((a.transfer, b.transfer), (0, 512 * 5120 * 4));
        assert_eq!(a.runtime_overhead, v100.runtime_overhead_bytes);
        for c in [a, b] {
            assert!(c.total <= v100.usable_bytes);
        }
        assert_eq!(p.crossings, 1);
        assert_eq!(p.transfer_bytes_per_token, 5120 * 4);
        // Layer split adds memory, not speed: the two halves are read one after the other.
        let t_one = 1.0 / p.one_card_tok_s;
        assert!((1.0 / p.expected_tok_s - t_one - CROSSING_SECONDS).abs() < 1e-9);
        assert_eq!(p.offloaded(), (vec![33, 32], 65));
    }

    #[test]
    fn tensor_split_3_1_gives_a_3_1_layer_split() {
        let m = ModelMemory::from_shape(&Shape::qwen2_5_32b(), FileType::Q4KM);
        let h = GpuSpec::from_table("h100").unwrap();
        let o = PlanOptions::for_model(&m);
        let p = plan_split(
            &m,
            &[h.clone(), h.clone()],
            &o,
            &req(SplitMode::Layer, Some(vec![3.0, 1.0])),
        )
        .unwrap();
        assert_eq!(p.offloaded(), (vec![49, 16], 65));
        assert_eq!(p.cards[0].layers.len(), 49);
        assert_eq!(p.cards[1].layers.len(), 15);
        // By free memory: a 32 GB and a 16 GB V100 split about 2:1.
        let v32 = GpuSpec::from_table("v100-32gb").unwrap();
        let v16 = GpuSpec::from_table("v100-16gb").unwrap();
        let q = plan_split(&m, &[v32, v16], &o, &req(SplitMode::Layer, None)).unwrap();
        let (pos, _) = q.offloaded();
        assert!(pos[0] == 44 || pos[0] == 43, "{pos:?}");
        assert!(q.fits);
    }

    #[test]
    fn tensor_mode_holds_a_share_of_every_matrix_and_the_allreduce_buffers() {
        let m = ModelMemory::from_shape(&Shape::qwen2_5_32b(), FileType::Q4KM);
        let v100 = GpuSpec::from_table("v100-16gb").unwrap();
        let o = PlanOptions::for_model(&m);
        let gpus = vec![v100.clone(); 4];
        let p = plan_split(&m, &gpus, &o, &req(SplitMode::Tensor, None)).unwrap();
        let l = &p.plan.ledger;
        assert!(p.fits);
        for c in &p.cards {
            assert_eq!(c.share, 0.25);
            assert_eq!(c.positions, 65);
            assert_eq!(c.kv_cache, l.kv_cache / 4);
            assert_eq!(
                c.transfer,
                2 * 4 * 512 * 5120 + NCCL_COMM_BYTES,
                "card {}",
                c.index
            );
            let w = (l.layer_weights as f64 / 4.0).ceil() as u64
                + (l.output_head as f64 / 4.0).ceil() as u64;
            let embd = if c.index == 0 { l.token_embedding } else { 0 };
            assert_eq!(c.weights, w + embd);
        }
        // Decode reads a quarter per card at once: close to 4× one card, less the all-reduces.
        assert!(p.expected_tok_s > 2.0 * p.one_card_tok_s);
        assert_eq!(p.crossings, 128);
        // Two of them, one V100 each: tensor mode on 2 cards fits as layer mode does.
        let p2 = plan_split(&m, &gpus[..2], &o, &req(SplitMode::Tensor, None)).unwrap();
        assert!(p2.fits);
    }

    #[test]
    fn none_is_the_main_card_alone_and_bad_requests_are_refused() {
        let m = ModelMemory::from_shape(&Shape::qwen2_5_1_5b(), FileType::Q4KM);
        let h = GpuSpec::from_table("h200").unwrap();
        let o = PlanOptions::for_model(&m);
        let mut r = req(SplitMode::None, None);
        r.main_gpu = 1;
        let p = plan_split(&m, &[h.clone(), h.clone()], &o, &r).unwrap();
        assert_eq!(p.offloaded(), (vec![0, 29], 29));
        assert_eq!(p.cards[0].total, 0);
        assert_eq!(p.crossings, 0);
        r.main_gpu = 2;
        assert!(plan_split(&m, &[h.clone(), h.clone()], &o, &r).is_none());
        let bad = req(SplitMode::Layer, Some(vec![1.0, 1.0, 1.0]));
        assert!(plan_split(&m, &[h.clone(), h], &o, &bad).is_none());
    }

    #[test]
    fn fit_split_reduces_the_context_until_both_cards_fit() {
        let m = ModelMemory::from_shape(&Shape::qwen2_5_32b(), FileType::Q4KM);
        let v100 = GpuSpec::from_table("v100-16gb").unwrap();
        let base = PlanOptions::for_model(&m);
        let fr = crate::plan::FitRequest {
            mode: crate::plan::FitMode::On,
            n_ctx: Some(131072),
            n_gpu_layers: None,
            base,
        };
        let gpus = [v100.clone(), v100];
        let SplitFit {
            plan: p,
            reduced_from: reduced,
        } = fit_split(&m, &gpus, &fr, &req(SplitMode::Layer, None))
            .unwrap()
            .unwrap();
        assert!(p.fits);
        // 128K of KV (32 GiB) cannot sit beside 18.5 GiB of weights on 2 × 15.8 GiB; 64K
        // (16 GiB) neither; 32K (8 GiB) does.
        assert_eq!(reduced, Some(131072));
        assert_eq!(p.plan.n_ctx, 32768);
        // Nothing fits on two 1 GiB cards: the plan at the wanted context says by how much.
        let tiny = GpuSpec::custom(1 << 30, 900.0);
        let e = fit_split(&m, &[tiny.clone(), tiny], &fr, &req(SplitMode::Layer, None))
            .unwrap()
            .unwrap_err();
        assert!(!e.fits && e.plan.short_by_bytes > 0);
    }
}
