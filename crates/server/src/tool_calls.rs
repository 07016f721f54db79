//! Finds tool calls in generated text and turns them into OpenAI's structure.
//!
//! Two template families:
//! - Qwen / Hermes: `<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>` (one block
//!   per call, see the Qwen2.5 chat template), or inside the block the XML form of the
//!   Qwen3.5 template: `<function=f>\n<parameter=a>\nvalue\n</parameter>\n</function>`;
//! - Llama 3.1+: `<|python_tag|>{"name": "f", "parameters": {...}}` or the bare JSON object
//!   (several separated by `;`), see Meta's llama3.1 prompt format.

use serde_json::Value;

use crate::openai::response::{FunctionCallOut, ToolCallOut};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Llama3,
}

impl ToolFormat {
    /// Guesses the family from the chat template source.
    pub fn detect(template: &str) -> ToolFormat {
        if template.contains("<|python_tag|>")
            || template.contains("<|eom_id|>")
            || template.contains("ipython")
        {
            ToolFormat::Llama3
        } else {
            ToolFormat::Hermes
        }
    }
}

/// Text content (outside tool calls, trimmed; `None` if empty) and the calls found.
#[derive(Debug, PartialEq)]
pub struct Parsed {
    pub content: Option<String>,
    pub calls: Vec<ToolCallOut>,
}

fn call_from_json(v: &Value, n: usize, id_seed: &str) -> Option<ToolCallOut> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v
        .get("arguments")
        .or_else(|| v.get("parameters"))
        .cloned()
        .unwrap_or(Value::Object(Default::default()));
    let arguments = match args {
        Value::String(s) => s, // already JSON text
        other => other.to_string(),
    };
    Some(ToolCallOut {
        index: None,
        id: format!("call_{id_seed}_{n}"),
        kind: "function",
        function: FunctionCallOut { name, arguments },
    })
}

/// `<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>...</function>` as
/// `{"name": NAME, "arguments": {KEY: VALUE}}`; values that parse as JSON are taken as JSON.
fn xml_call(body: &str) -> Option<Value> {
    let rest = body.strip_prefix("<function=")?;
    let (name, mut rest) = rest.split_once('>')?;
    let mut args = serde_json::Map::new();
    while let Some(start) = rest.find("<parameter=") {
        let after = &rest[start + "<parameter=".len()..];
        let (key, after) = after.split_once('>')?;
        let end = after.find("</parameter>")?;
        let raw = after[..end].strip_prefix('\n').unwrap_or(&after[..end]);
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        let value =
            serde_json::from_str::<Value>(raw).unwrap_or_else(|_| Value::String(raw.to_string()));
        args.insert(key.trim().to_string(), value);
        rest = &after[end + "</parameter>".len()..];
    }
    rest.contains("</function>")
        .then(|| serde_json::json!({"name": name.trim(), "arguments": args}))
}

/// Parses `text` in the given family. Text that does not parse as calls stays content.
pub fn parse(text: &str, format: ToolFormat, id_seed: &str) -> Parsed {
    let mut calls = Vec::new();
    let mut content = String::new();
    match format {
        ToolFormat::Hermes => {
            let mut rest = text;
            while let Some(start) = rest.find("<tool_call>") {
                content.push_str(&rest[..start]);
                let after = &rest[start + "<tool_call>".len()..];
                let (body, next) = match after.find("</tool_call>") {
                    Some(end) => (&after[..end], &after[end + "</tool_call>".len()..]),
                    None => (after, ""),
                };
                let body = body.trim();
                let value = if body.starts_with("<function=") {
                    xml_call(body)
                } else {
                    serde_json::from_str::<Value>(body).ok()
                };
                match value.and_then(|v| call_from_json(&v, calls.len(), id_seed)) {
                    Some(c) => calls.push(c),
                    None => content.push_str(&rest[start..rest.len() - next.len()]),
                }
                rest = next;
            }
            content.push_str(rest);
        }
        ToolFormat::Llama3 => {
            let body = text.trim();
            let body = body.strip_prefix("<|python_tag|>").unwrap_or(body).trim();
            let parsed: Option<Vec<ToolCallOut>> = body
                .split(';')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .enumerate()
                .map(|(n, s)| {
                    serde_json::from_str::<Value>(s)
                        .ok()
                        .and_then(|v| call_from_json(&v, n, id_seed))
                })
                .collect();
            match parsed {
                Some(c) if !c.is_empty() => calls = c,
                _ => content.push_str(text),
            }
        }
    }
    let content = content.trim();
    Parsed {
        content: (!content.is_empty()).then(|| content.to_string()),
        calls,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hermes_calls_are_parsed_and_text_kept() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        let p = parse(text, ToolFormat::Hermes, "x");
        assert_eq!(p.content.as_deref(), Some("Let me check."));
        assert_eq!(p.calls.len(), 2);
        assert_eq!(p.calls[0].function.name, "get_weather");
        let args: Value = serde_json::from_str(&p.calls[0].function.arguments).unwrap();
        assert_eq!(args["city"], "Paris");
        assert_eq!(p.calls[1].function.arguments, "{}");
        assert_ne!(p.calls[0].id, p.calls[1].id);
    }

    #[test]
    fn broken_hermes_block_stays_content() {
        let p = parse(
            "<tool_call>{not json</tool_call> ok",
            ToolFormat::Hermes,
            "x",
        );
        assert!(p.calls.is_empty());
        assert_eq!(
            p.content.as_deref(),
            Some("<tool_call>{not json</tool_call> ok")
        );
        assert_eq!(
            parse("plain", ToolFormat::Hermes, "x").content.as_deref(),
            Some("plain")
        );
    }

    #[test]
    fn llama3_calls_with_and_without_python_tag() {
        let p = parse(
            "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"a\": 1}}",
            ToolFormat::Llama3,
            "x",
        );
        assert_eq!((p.calls.len(), p.content), (1, None));
        assert_eq!(p.calls[0].function.arguments, "{\"a\":1}");
        let p = parse(
            "{\"name\": \"f\", \"parameters\": {}}; {\"name\": \"g\", \"parameters\": {}}",
            ToolFormat::Llama3,
            "x",
        );
        assert_eq!(
            p.calls
                .iter()
                .map(|c| c.function.name.as_str())
                .collect::<Vec<_>>(),
            ["f", "g"]
        );
        let p = parse("The answer is {braces}.", ToolFormat::Llama3, "x");
        assert!(p.calls.is_empty());
        assert_eq!(p.content.as_deref(), Some("The answer is {braces}."));
    }

    #[test]
    fn qwen35_xml_calls_are_parsed() {
        let text = "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
        let p = parse(text, ToolFormat::Hermes, "x");
        assert_eq!(p.content.as_deref(), Some("Checking."));
        assert_eq!(p.calls[0].function.name, "get_weather");
        let args: Value = serde_json::from_str(&p.calls[0].function.arguments).unwrap();
        assert_eq!(args, serde_json::json!({"city": "New York", "days": 3}));
        // Unterminated function block: left as text.
        assert!(parse("<tool_call><function=f>", ToolFormat::Hermes, "x")
            .calls
            .is_empty());
    }

    #[test]
    fn real_templates_are_detected_as_their_family() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/templates/");
        for (file, family) in [
            ("Qwen-Qwen2.5-7B-Instruct.jinja", ToolFormat::Hermes),
            ("Qwen-Qwen3-0.6B.jinja", ToolFormat::Hermes),
            ("Qwen3.5-4B.jinja", ToolFormat::Hermes),
            ("meta-llama-Llama-3.1-8B-Instruct.jinja", ToolFormat::Llama3),
            ("meta-llama-Llama-3.2-3B-Instruct.jinja", ToolFormat::Llama3),
        ] {
            let source = std::fs::read_to_string(format!("{dir}{file}")).unwrap();
            assert_eq!(ToolFormat::detect(&source), family, "{file}");
        }
    }

    #[test]
    fn family_detection() {
        assert_eq!(
            ToolFormat::detect("{{'<|python_tag|>'}}"),
            ToolFormat::Llama3
        );
        assert_eq!(ToolFormat::detect("<tool_call>"), ToolFormat::Hermes);
    }
}
