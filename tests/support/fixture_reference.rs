//! Reading a fixture's `reference.json` (transformers float64 logits and greedy ids) and the
//! comparisons the model tests make against it. Shared by the CPU tests (crates/model/tests)
//! and the GPU tests (crates/cuda/tests) through `#[path]`; each caller defines
//! `fixture(arch, file) -> PathBuf`.

pub struct Reference {
    pub prompt_ids: Vec<u32>,
    pub logits: Vec<Vec<f64>>,
    pub greedy_ids: Vec<u32>,
}

pub fn reference(arch: &str) -> Reference {
    let text = std::fs::read_to_string(super::fixture(arch, "reference.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids = |k: &str| -> Vec<u32> {
        v[k].as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let logits = v["logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            row.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect();
    Reference {
        prompt_ids: ids("prompt_ids"),
        logits,
        greedy_ids: ids("greedy_ids"),
    }
}

pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

pub fn rel_l2(got: &[f32], want: &[f64]) -> f64 {
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(&a, &b)| (a as f64 - b).powi(2))
        .sum();
    let den: f64 = want.iter().map(|b| b * b).sum();
    (num / den).sqrt()
}
