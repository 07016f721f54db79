//! `redline inspect FILE`: what is in a GGUF file — architecture, hyperparameters, tokenizer,
//! tensors, parameter count and bytes per type — as aligned tables or one JSON object.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use gguf::{Array, GgmlType, GgufError, GgufFile, Metadata, Value};
use serde_json::{json, Map, Value as Json};

#[derive(clap::Args)]
pub struct Args {
    /// The GGUF file to describe.
    pub file: PathBuf,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let file = GgufFile::open(&args.file).map_err(|e| {
        let hint = next_step(&e);
        anyhow::Error::new(e).context(format!(
            "cannot read {} as GGUF; {hint}",
            args.file.display()
        ))
    })?;
    let summary = Summary::new(&args.file, &file);
    let text = if args.json {
        serde_json::to_string_pretty(&summary.to_json(&file))? + "\n"
    } else {
        summary.to_text(&file)
    };
    // `redline inspect big.gguf | head` closes the pipe early: not an error.
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// What the user should do about an error opening the file.
fn next_step(e: &GgufError) -> &'static str {
    match e {
        GgufError::Io { error, .. } if error.kind() == std::io::ErrorKind::NotFound => {
            "check the path"
        }
        GgufError::Io { .. } => "check the file's permissions",
        GgufError::BadMagic { .. } => {
            "it is not a GGUF file (a safetensors or PyTorch checkpoint must first be converted \
             with llama.cpp's convert_hf_to_gguf.py)"
        }
        GgufError::Truncated { .. } | GgufError::TensorOutOfBounds { .. } => {
            "the file is incomplete: re-download or re-convert it"
        }
        GgufError::UnsupportedVersion(_) | GgufError::BigEndian { .. } => {
            "re-convert the model with a current llama.cpp"
        }
        _ => "the file is corrupt or was written by an incompatible tool: re-download or re-convert it",
    }
}

/// Per-type totals over the tensor table.
#[derive(Default)]
struct TypeTotals {
    n_tensors: usize,
    n_params: u64,
    n_bytes: u64,
}

struct Summary {
    path: String,
    file_size: u64,
    arch: Option<String>,
    n_params: u64,
    tensor_bytes: u64,
    by_type: BTreeMap<GgmlType, TypeTotals>,
}

impl Summary {
    fn new(path: &Path, file: &GgufFile) -> Summary {
        let mut by_type: BTreeMap<GgmlType, TypeTotals> = BTreeMap::new();
        for t in file.tensors() {
            let e = by_type.entry(t.ty).or_default();
            e.n_tensors += 1;
            e.n_params += t.n_elements();
            e.n_bytes += t.n_bytes;
        }
        Summary {
            path: path.display().to_string(),
            file_size: file.file_len(),
            arch: file.architecture().map(str::to_owned),
            n_params: by_type.values().map(|t| t.n_params).sum(),
            tensor_bytes: by_type.values().map(|t| t.n_bytes).sum(),
            by_type,
        }
    }

    fn bits_per_weight(&self) -> f64 {
        bits_per_weight(self.tensor_bytes, self.n_params)
    }

    /// `{arch}.` keys, with the prefix removed.
    fn hyperparameters<'a>(&self, meta: &'a Metadata) -> Vec<(&'a str, &'a Value)> {
        let Some(arch) = &self.arch else {
            return Vec::new();
        };
        let prefix = format!("{arch}.");
        meta.iter()
            .filter_map(|(k, v)| k.strip_prefix(prefix.as_str()).map(|s| (s, v)))
            .collect()
    }

    /// Keys that are neither general, architecture nor tokenizer keys.
    fn other_keys<'a>(&self, meta: &'a Metadata) -> Vec<(&'a str, &'a Value)> {
        let arch_prefix = self.arch.as_ref().map(|a| format!("{a}."));
        meta.iter()
            .filter(|(k, _)| {
                !k.starts_with("general.")
                    && !k.starts_with("tokenizer.")
                    && !arch_prefix
                        .as_ref()
                        .is_some_and(|p| k.starts_with(p.as_str()))
            })
            .collect()
    }

    fn to_json(&self, file: &GgufFile) -> Json {
        let meta = file.metadata();
        let section = |entries: Vec<(&str, &Value)>| -> Json {
            Json::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), value_json(v)))
                    .collect(),
            )
        };
        let general: Vec<(&str, &Value)> = meta
            .iter()
            .filter(|(k, _)| k.starts_with("general."))
            .collect();
        let by_type: Vec<Json> = self
            .by_type
            .iter()
            .map(|(ty, t)| {
                json!({
                    "type": ty.name(),
                    "n_tensors": t.n_tensors,
                    "n_params": t.n_params,
                    "n_bytes": t.n_bytes,
                    "bits_per_weight": bits_per_weight(t.n_bytes, t.n_params),
                })
            })
            .collect();
        let tensors: Vec<Json> = file
            .tensors()
            .iter()
            .map(|t| {
                json!({
                    "name": t.name,
                    "type": t.ty.name(),
                    "shape": t.dims,
                    "offset": t.offset,
                    "n_bytes": t.n_bytes,
                })
            })
            .collect();
        json!({
            "file": self.path,
            "file_size": self.file_size,
            "version": file.version(),
            "alignment": file.alignment(),
            "data_offset": file.data_offset(),
            "architecture": self.arch,
            "file_type": meta.get_u32("general.file_type").and_then(gguf::file_type_name),
            "general": section(general),
            "hyperparameters": section(self.hyperparameters(meta)),
            "tokenizer": Tokenizer::new(meta).to_json(),
            "other_metadata": section(self.other_keys(meta)),
            "n_metadata": meta.len(),
            "n_tensors": file.tensors().len(),
            "n_params": self.n_params,
            "tensor_bytes": self.tensor_bytes,
            "bits_per_weight": self.bits_per_weight(),
            "by_type": by_type,
            "tensors": tensors,
        })
    }

    fn to_text(&self, file: &GgufFile) -> String {
        let meta = file.metadata();
        let mut out = String::new();
        let mut kv = Table::new(&[false, false]);
        kv.row([
            "file".into(),
            format!(
                "{} ({}, GGUF v{}, alignment {})",
                self.path,
                bytes(self.file_size),
                file.version(),
                file.alignment()
            ),
        ]);
        kv.row([
            "architecture".into(),
            self.arch.clone().unwrap_or_else(|| "(none)".into()),
        ]);
        for (k, v) in meta.iter() {
            let Some(short) = k.strip_prefix("general.") else {
                continue;
            };
            match short {
                "architecture" | "alignment" => {}
                "file_type" => {
                    let id = meta.get_u32(k);
                    let name = id.and_then(gguf::file_type_name).unwrap_or("unknown");
                    kv.row(["file type".into(), format!("{name} ({})", value_text(v))]);
                }
                _ => match v {
                    Value::String(s) => kv.row([short.replace('_', " "), s.clone()]),
                    v => kv.row([short.replace('_', " "), value_text(v)]),
                },
            }
        }
        let params = if file.tensors().is_empty() {
            "none (no tensors: a vocabulary-only file)".to_owned()
        } else {
            format!(
                "{} params in {} tensors, {} of weights, {:.2} bits/weight",
                count(self.n_params),
                file.tensors().len(),
                bytes(self.tensor_bytes),
                self.bits_per_weight()
            )
        };
        kv.row(["parameters".into(), params]);
        out += &kv.render("");

        let hp = self.hyperparameters(meta);
        if !hp.is_empty() {
            out += &format!(
                "\nhyperparameters ({}.*)\n",
                self.arch.as_deref().unwrap_or("")
            );
            let mut t = Table::new(&[false, false]);
            for (k, v) in hp {
                t.row([k.to_owned(), value_text(v)]);
            }
            out += &t.render("  ");
        }

        out += "\ntokenizer\n";
        out += &Tokenizer::new(meta).to_table().render("  ");

        let other = self.other_keys(meta);
        if !other.is_empty() {
            out += "\nother metadata\n";
            let mut t = Table::new(&[false, false]);
            for (k, v) in other {
                t.row([k.to_owned(), value_text(v)]);
            }
            out += &t.render("  ");
        }

        if file.tensors().is_empty() {
            return out;
        }
        out += "\nweights by type\n";
        let mut t = Table::new(&[false, true, true, true, true]);
        t.row(["type", "tensors", "params", "bytes", "bits/weight"].map(String::from));
        for (ty, tt) in &self.by_type {
            t.row([
                ty.name().to_owned(),
                tt.n_tensors.to_string(),
                count(tt.n_params),
                bytes(tt.n_bytes),
                format!("{:.2}", bits_per_weight(tt.n_bytes, tt.n_params)),
            ]);
        }
        t.row([
            "total".into(),
            file.tensors().len().to_string(),
            count(self.n_params),
            bytes(self.tensor_bytes),
            format!("{:.2}", self.bits_per_weight()),
        ]);
        out += &t.render("  ");

        out += &format!("\ntensors ({})\n", file.tensors().len());
        let mut t = Table::new(&[false, false, false, true]);
        t.row(["name", "type", "shape (ne0 × ne1 …)", "bytes"].map(String::from));
        for ti in file.tensors() {
            let shape: Vec<String> = ti.dims.iter().map(u64::to_string).collect();
            t.row([
                ti.name.clone(),
                ti.ty.name().to_owned(),
                shape.join(" × "),
                bytes(ti.n_bytes),
            ]);
        }
        out += &t.render("  ");
        out
    }
}

/// The tokenizer keys (`tokenizer.ggml.*`, llama.cpp's names) in one place.
struct Tokenizer<'a> {
    meta: &'a Metadata,
    tokens: Option<&'a [String]>,
}

impl<'a> Tokenizer<'a> {
    fn new(meta: &'a Metadata) -> Tokenizer<'a> {
        Tokenizer {
            meta,
            tokens: meta.get_str_array("tokenizer.ggml.tokens"),
        }
    }

    fn str(&self, key: &str) -> Option<&'a str> {
        self.meta.get_str(&format!("tokenizer.ggml.{key}"))
    }

    /// A special token's id and piece (`bos`, `eos`, `eot`, `unknown`, `padding` …).
    fn special(&self, which: &str) -> Option<(u32, Option<&'a str>)> {
        let id = self
            .meta
            .get_u32(&format!("tokenizer.ggml.{which}_token_id"))?;
        let piece = self
            .tokens
            .and_then(|t| t.get(id as usize))
            .map(String::as_str);
        Some((id, piece))
    }

    fn n_merges(&self) -> Option<usize> {
        self.meta.get_array("tokenizer.ggml.merges").map(Array::len)
    }

    fn chat_template(&self) -> Option<&'a str> {
        self.meta.get_str("tokenizer.chat_template")
    }

    const SPECIALS: [&'static str; 6] = ["bos", "eos", "eot", "eom", "unknown", "padding"];

    fn to_json(&self) -> Json {
        let mut o = Map::new();
        o.insert("model".into(), json!(self.str("model")));
        o.insert("pre".into(), json!(self.str("pre")));
        o.insert("vocab_size".into(), json!(self.tokens.map(<[String]>::len)));
        o.insert("n_merges".into(), json!(self.n_merges()));
        for which in Self::SPECIALS {
            if let Some((id, piece)) = self.special(which) {
                o.insert(format!("{which}_token_id"), json!(id));
                o.insert(format!("{which}_token"), json!(piece));
            }
        }
        for flag in ["add_bos_token", "add_eos_token", "add_space_prefix"] {
            if let Some(b) = self.meta.get_bool(&format!("tokenizer.ggml.{flag}")) {
                o.insert(flag.into(), json!(b));
            }
        }
        o.insert(
            "has_chat_template".into(),
            json!(self.chat_template().is_some()),
        );
        Json::Object(o)
    }

    fn to_table(&self) -> Table {
        let mut t = Table::new(&[false, false]);
        let model = self.str("model").unwrap_or("(none)");
        match self.str("pre") {
            Some(pre) => t.row(["model".into(), format!("{model} (pre-tokenizer: {pre})")]),
            None => t.row(["model".into(), model.to_owned()]),
        }
        if let Some(tokens) = self.tokens {
            t.row(["vocab size".into(), tokens.len().to_string()]);
        }
        if let Some(n) = self.n_merges() {
            t.row(["merges".into(), n.to_string()]);
        }
        for which in Self::SPECIALS {
            if let Some((id, piece)) = self.special(which) {
                let piece = piece.map_or("(out of range)".to_owned(), |p| format!("{p:?}"));
                t.row([format!("{which} token"), format!("{id} {piece}")]);
            }
        }
        for flag in ["add_bos_token", "add_eos_token", "add_space_prefix"] {
            if let Some(b) = self.meta.get_bool(&format!("tokenizer.ggml.{flag}")) {
                t.row([flag.replace('_', " "), b.to_string()]);
            }
        }
        let tmpl = match self.chat_template() {
            Some(s) => format!("yes ({} chars)", s.chars().count()),
            None => "no".into(),
        };
        t.row(["chat template".into(), tmpl]);
        t
    }
}

fn bits_per_weight(n_bytes: u64, n_params: u64) -> f64 {
    if n_params == 0 {
        0.0
    } else {
        n_bytes as f64 * 8.0 / n_params as f64
    }
}

/// `1.2 GiB`, `512 B`.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// `27.3 B`, `1.44 M`, `260 K`, `999`.
fn count(n: u64) -> String {
    let (v, unit) = match n {
        0..1_000 => return n.to_string(),
        1_000..1_000_000 => (n as f64 / 1e3, "K"),
        1_000_000..1_000_000_000 => (n as f64 / 1e6, "M"),
        1_000_000_000..1_000_000_000_000 => (n as f64 / 1e9, "B"),
        _ => (n as f64 / 1e12, "T"),
    };
    let digits = if v < 10.0 {
        2
    } else if v < 100.0 {
        1
    } else {
        0
    };
    format!("{v:.digits$} {unit}")
}

/// Longest string or array shown whole in text output.
const MAX_TEXT_LEN: usize = 100;
const MAX_TEXT_ELEMS: usize = 8;
/// Longest array written element by element in JSON output.
const MAX_JSON_ELEMS: usize = 64;

fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) if s.chars().count() > MAX_TEXT_LEN => {
            let head: String = s.chars().take(60).collect();
            format!("{head:?}… ({} chars)", s.chars().count())
        }
        Value::String(s) => format!("{s:?}"),
        Value::Array(a) if a.len() > MAX_TEXT_ELEMS => {
            format!("[{} × {}]", a.len(), a.element_type().name())
        }
        Value::Array(a) => array_text(a),
        // Display gives the shortest form that reads back as the same f32 (1e-6, not 9.99e-7).
        Value::F32(x) => x.to_string(),
        Value::F64(x) => x.to_string(),
        v => scalar_json(v).to_string(),
    }
}

/// `[1, 2]`, `["a", "b"]`, `[[1, 2], ["x"]]`.
fn array_text(a: &Array) -> String {
    let elems: Vec<String> = match a {
        Array::Array(v) => v.iter().map(array_text).collect(),
        a => array_json(a).iter().map(Json::to_string).collect(),
    };
    format!("[{}]", elems.join(", "))
}

fn value_json(v: &Value) -> Json {
    match v {
        Value::Array(a) if a.len() > MAX_JSON_ELEMS => {
            json!({ "type": format!("array[{}]", a.element_type().name()), "len": a.len() })
        }
        Value::Array(a) => Json::Array(array_json(a)),
        v => scalar_json(v),
    }
}

fn scalar_json(v: &Value) -> Json {
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        Value::F32(x) => json!(x),
        Value::F64(x) => json!(x),
        Value::Bool(x) => json!(x),
        Value::String(s) => json!(s),
        Value::Array(a) => Json::Array(array_json(a)),
    }
}

fn array_json(a: &Array) -> Vec<Json> {
    fn all<T: Clone + Into<Json>>(v: &[T]) -> Vec<Json> {
        v.iter().cloned().map(Into::into).collect()
    }
    match a {
        Array::U8(v) => all(v),
        Array::I8(v) => all(v),
        Array::U16(v) => all(v),
        Array::I16(v) => all(v),
        Array::U32(v) => all(v),
        Array::I32(v) => all(v),
        Array::U64(v) => all(v),
        Array::I64(v) => all(v),
        Array::F32(v) => all(v),
        Array::F64(v) => all(v),
        Array::Bool(v) => all(v),
        Array::String(v) => all(v),
        Array::Array(v) => v.iter().map(|a| Json::Array(array_json(a))).collect(),
    }
}

/// Text table with columns padded to their widest cell; numeric columns right-aligned.
struct Table {
    right_align: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(right_align: &[bool]) -> Table {
        Table {
            right_align: right_align.to_vec(),
            rows: Vec::new(),
        }
    }

    fn row<const N: usize>(&mut self, cells: [String; N]) {
        self.rows.push(cells.to_vec());
    }

    fn render(&self, indent: &str) -> String {
        let n_cols = self.right_align.len();
        let mut widths = vec![0; n_cols];
        for r in &self.rows {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        let mut out = String::new();
        for r in &self.rows {
            let mut line = indent.to_owned();
            for (i, c) in r.iter().enumerate() {
                let pad = " ".repeat(widths[i] - c.chars().count());
                let last = i + 1 == r.len();
                match (self.right_align[i], last) {
                    (true, _) => line += &format!("{pad}{c}"),
                    (false, true) => line += c,
                    (false, false) => line += &format!("{c}{pad}"),
                }
                if !last {
                    line += "  ";
                }
            }
            out += line.trim_end();
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_units() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(1_288_490_189), "1.2 GiB");
        assert_eq!(count(999), "999");
        assert_eq!(count(292_800), "293 K");
        assert_eq!(count(1_443_072), "1.44 M");
        assert_eq!(count(27_300_000_000), "27.3 B");
    }

    #[test]
    fn table_aligns_columns() {
        let mut t = Table::new(&[false, true]);
        t.row(["a".into(), "1".into()]);
        t.row(["long".into(), "100".into()]);
        assert_eq!(t.render(""), "a       1\nlong  100\n");
    }
}
