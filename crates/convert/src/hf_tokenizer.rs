//! Hugging Face tokenizer.json / tokenizer_config.json -> GGUF `tokenizer.*` metadata, as
//! llama.cpp's converter writes it for byte-level BPE models (`tokenizer.ggml.model = gpt2`).

use std::path::Path;

use gguf::{Array, Value};
use serde_json::Value as Json;

use crate::error::ConvertError;

/// llama.cpp's token types (`enum llama_token_type`): normal, control, user-defined, unused.
const TOKEN_NORMAL: i32 = 1;
const TOKEN_CONTROL: i32 = 3;
const TOKEN_USER_DEFINED: i32 = 4;
const TOKEN_UNUSED: i32 = 5;

fn read_json(path: &Path) -> Result<Json, ConvertError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConvertError::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| ConvertError::Input(format!("{}: {e}", path.display())))
}

/// `tokenizer.*` key/values for a model directory. `n_vocab` is the model's vocabulary size
/// (rows of the embedding): ids with no token become `[PAD{id}]` (unused), as in llama.cpp.
/// `pre` names the pre-tokenizer (llama.cpp identifies it by hashing; we take it per arch).
pub fn tokenizer_metadata(
    dir: &Path,
    n_vocab: usize,
    pre: &str,
) -> Result<Vec<(String, Value)>, ConvertError> {
    let tok = read_json(&dir.join("tokenizer.json"))?;
    let cfg_path = dir.join("tokenizer_config.json");
    let cfg = if cfg_path.exists() {
        read_json(&cfg_path)?
    } else {
        Json::Null
    };
    let bad =
        |w: &str| ConvertError::Input(format!("{}: {w}", dir.join("tokenizer.json").display()));
    let model = tok.get("model").ok_or_else(|| bad("no model"))?;
    if model.get("type").and_then(|t| t.as_str()) != Some("BPE") {
        return Err(bad("only BPE tokenizers are supported"));
    }
    let vocab = model
        .get("vocab")
        .and_then(|v| v.as_object())
        .ok_or_else(|| bad("no model.vocab"))?;
    let mut tokens: Vec<Option<String>> = vec![None; n_vocab];
    let mut types = vec![TOKEN_NORMAL; n_vocab];
    let mut put = |id: u64, s: &str| -> Result<(), ConvertError> {
        let slot = tokens.get_mut(id as usize).ok_or_else(|| {
            bad(&format!(
                "token id {id} is outside the vocabulary of {n_vocab}"
            ))
        })?;
        *slot = Some(s.to_owned());
        Ok(())
    };
    for (s, id) in vocab {
        put(
            id.as_u64()
                .ok_or_else(|| bad("vocab id is not an integer"))?,
            s,
        )?;
    }
    let mut specials: Vec<(String, u32)> = Vec::new();
    for t in tok
        .get("added_tokens")
        .and_then(|a| a.as_array())
        .into_iter()
        .flatten()
    {
        let (Some(id), Some(content)) = (
            t.get("id").and_then(|i| i.as_u64()),
            t.get("content").and_then(|c| c.as_str()),
        ) else {
            return Err(bad("added token without id / content"));
        };
        put(id, content)?;
        let special = t.get("special").and_then(|s| s.as_bool()).unwrap_or(false);
        types[id as usize] = if special {
            TOKEN_CONTROL
        } else {
            TOKEN_USER_DEFINED
        };
        specials.push((content.to_owned(), id as u32));
    }
    let tokens: Vec<String> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            t.unwrap_or_else(|| {
                types[i] = TOKEN_UNUSED;
                format!("[PAD{i}]")
            })
        })
        .collect();
    let merges: Vec<String> = model
        .get("merges")
        .and_then(|m| m.as_array())
        .ok_or_else(|| bad("no model.merges"))?
        .iter()
        .map(|m| match m {
            Json::String(s) => Some(s.clone()),
            Json::Array(p) if p.len() == 2 => {
                Some(format!("{} {}", p[0].as_str()?, p[1].as_str()?))
            }
            _ => None,
        })
        .collect::<Option<_>>()
        .ok_or_else(|| bad("merges are neither \"a b\" strings nor [a, b] pairs"))?;

    // tokenizer_config.json names special tokens by content (a string or {"content": ..}).
    let id_of = |key: &str| -> Option<u32> {
        let v = cfg.get(key)?;
        let content = v.as_str().or_else(|| v.get("content")?.as_str())?;
        specials
            .iter()
            .find(|(c, _)| c == content)
            .map(|&(_, id)| id)
            .or_else(|| vocab.get(content)?.as_u64().map(|i| i as u32))
    };
    let mut md: Vec<(String, Value)> = vec![
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String(pre.into())),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(Array::String(tokens)),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(Array::I32(types)),
        ),
        (
            "tokenizer.ggml.merges".into(),
            Value::Array(Array::String(merges)),
        ),
    ];
    if let Some(id) = id_of("bos_token") {
        md.push(("tokenizer.ggml.bos_token_id".into(), Value::U32(id)));
    }
    if let Some(id) = id_of("eos_token") {
        md.push(("tokenizer.ggml.eos_token_id".into(), Value::U32(id)));
    }
    if let Some(id) = id_of("pad_token") {
        md.push(("tokenizer.ggml.padding_token_id".into(), Value::U32(id)));
    }
    if let Some(b) = cfg.get("add_bos_token").and_then(|b| b.as_bool()) {
        md.push(("tokenizer.ggml.add_bos_token".into(), Value::Bool(b)));
    }
    if let Some(t) = cfg.get("chat_template").and_then(|t| t.as_str()) {
        md.push(("tokenizer.chat_template".into(), Value::String(t.into())));
    } else if let Ok(t) = std::fs::read_to_string(dir.join("chat_template.jinja")) {
        md.push(("tokenizer.chat_template".into(), Value::String(t)));
    }
    Ok(md)
}
