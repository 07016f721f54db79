//! Parses a generated assistant reply into OpenAI's shape: text content, optional reasoning,
//! and tool calls (`{"id", "type": "function", "function": {"name", "arguments"}}` where
//! `arguments` is a JSON text).
//!
//! Formats, as the chat templates in tests/data/templates prompt the models to emit them:
//! - Qwen2.5 / Qwen3 / QwQ (Hermes style): `<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>`,
//!   one block per call.
//! - Qwen3.5 (Qwen3-Coder style): `<tool_call>\n<function=f>\n<parameter=p>\nvalue\n</parameter>\n</function>\n</tool_call>`;
//!   a value is the raw text for strings, JSON for objects/arrays, `|string` otherwise.
//! - Llama 3.1 / 3.2: the whole reply is `{"name": "f", "parameters": {...}}` (several
//!   separated by `;`), optionally after `<|python_tag|>`; built-in tools use
//!   `<|python_tag|>name.call(key="value", ...)`.
//!
//! Malformed output never panics and never loses text: anything that does not parse as a
//! call stays in the content.

use serde_json::{Map, Value};

/// Which tool-call syntax the model was prompted with (detected from the template source).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFamily {
    /// `<tool_call>` blocks holding JSON (Qwen2.5, Qwen3, QwQ) or `<function=…>` XML (Qwen3.5).
    Qwen,
    /// Llama 3.1 / 3.2 JSON calls, `<|python_tag|>` forms.
    Llama3,
}

impl ToolFamily {
    /// Guesses the family from a chat template's Jinja source.
    pub fn detect(template_source: &str) -> ToolFamily {
        let llama = [
            "<|python_tag|>",
            "<|eom_id|>",
            "ipython",
            "<|start_header_id|>",
        ];
        if !template_source.contains("<tool_call>")
            && llama.iter().any(|m| template_source.contains(m))
        {
            ToolFamily::Llama3
        } else {
            ToolFamily::Qwen
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// Unique within the reply ("call_<hash of the reply>_<index>"); a server may replace it.
    pub id: String,
    pub name: String,
    /// The arguments as JSON text (an object), as OpenAI's `function.arguments`.
    pub arguments: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParsedReply {
    /// Text outside tool calls and reasoning, trimmed; `None` if empty.
    pub content: Option<String>,
    /// Text of a `<think>…</think>` block (Qwen3 / QwQ / Qwen3.5), trimmed; `None` if absent.
    pub reasoning: Option<String>,
    pub tool_calls: Vec<ToolCall>,
}

/// Parses `text` (special tokens such as `<tool_call>` / `<|python_tag|>` decoded as text).
pub fn parse_tool_calls(family: ToolFamily, text: &str) -> ParsedReply {
    parse_tool_calls_with_tools(family, text, &[])
}

/// As [`parse_tool_calls`], with the request's `tools` (OpenAI shape) so that Qwen3.5 XML
/// parameter values declared `"type": "string"` stay strings even when they look like JSON
/// (`<parameter=zip>\n01234\n</parameter>` is the string "01234", not a number).
pub fn parse_tool_calls_with_tools(family: ToolFamily, text: &str, tools: &[Value]) -> ParsedReply {
    let (reasoning, answer) = split_reasoning(text);
    let mut calls = Vec::new();
    let content = match family {
        ToolFamily::Qwen => parse_tagged(answer, tools, &mut calls),
        ToolFamily::Llama3 => parse_llama3(answer, &mut calls),
    };
    let id_seed = fnv1a(text.as_bytes());
    let tool_calls = calls
        .into_iter()
        .enumerate()
        .map(|(i, (name, arguments))| ToolCall {
            id: format!("call_{id_seed:08x}_{i}"),
            name,
            arguments,
        })
        .collect();
    ParsedReply {
        content: non_empty(&content),
        reasoning: reasoning.and_then(non_empty),
        tool_calls,
    }
}

fn non_empty(s: &str) -> Option<String> {
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_string())
}

/// 32-bit FNV-1a: a short deterministic id seed.
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, &b| {
        (h ^ b as u32).wrapping_mul(0x0100_0193)
    })
}

/// Splits `<think>reasoning</think>answer`. The opening tag may be absent (templates that put
/// `<think>` in the prompt); without `</think>` everything is the answer.
fn split_reasoning(text: &str) -> (Option<&str>, &str) {
    match text.find("</think>") {
        Some(end) => {
            let before = &text[..end];
            let reasoning = match before.find("<think>") {
                Some(start) => &before[start + "<think>".len()..],
                None => before,
            };
            (Some(reasoning), &text[end + "</think>".len()..])
        }
        None => (None, text),
    }
}

/// `(name, arguments JSON text)` from a JSON call object, or None if it is not one.
fn call_from_json(v: &Value) -> Option<(String, String)> {
    let obj = v.as_object()?;
    // Some models nest the call: {"function": {"name": ..., "arguments": ...}}.
    if let Some(inner) = obj.get("function").filter(|f| f.is_object()) {
        if !obj.contains_key("name") {
            return call_from_json(inner);
        }
    }
    let name = obj.get("name")?.as_str()?.trim();
    if name.is_empty() {
        return None;
    }
    let args = obj.get("arguments").or_else(|| obj.get("parameters"));
    let arguments = match args {
        None | Some(Value::Null) => "{}".to_string(),
        // A JSON text already (some models quote the object); otherwise not arguments.
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(v @ Value::Object(_)) => v.to_string(),
            _ => return None,
        },
        Some(v @ Value::Object(_)) => v.to_string(),
        Some(_) => return None,
    };
    Some((name.to_string(), arguments))
}

/// `<tool_call>…</tool_call>` blocks; returns the remaining content.
fn parse_tagged(text: &str, tools: &[Value], calls: &mut Vec<(String, String)>) -> String {
    const OPEN: &str = "<tool_call>";
    const CLOSE: &str = "</tool_call>";
    let mut content = String::new();
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        content.push_str(&rest[..start]);
        let after = &rest[start + OPEN.len()..];
        // An unclosed block (cut off, or the model stopped at <|im_end|>) runs to the end.
        let (body, next) = match after.find(CLOSE) {
            Some(end) => (&after[..end], &after[end + CLOSE.len()..]),
            None => (after, ""),
        };
        let body_trim = body.trim();
        let parsed = if body_trim.starts_with("<function=") {
            parse_xml_call(body_trim, tools)
        } else {
            serde_json::from_str::<Value>(body_trim)
                .ok()
                .and_then(|v| call_from_json(&v))
        };
        match parsed {
            Some(call) => calls.push(call),
            None => content.push_str(&rest[start..rest.len() - next.len()]),
        }
        rest = next;
    }
    content.push_str(rest);
    content
}

/// `<function=name><parameter=p>value</parameter>…</function>` (Qwen3.5 / Qwen3-Coder).
fn parse_xml_call(body: &str, tools: &[Value]) -> Option<(String, String)> {
    let rest = body.strip_prefix("<function=")?;
    let name_end = rest.find('>')?;
    let name = rest[..name_end].trim();
    if name.is_empty() || name.contains('<') {
        return None;
    }
    let mut rest = &rest[name_end + 1..];
    let mut args = Map::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() || rest.starts_with("</function>") {
            break;
        }
        let r = rest.strip_prefix("<parameter=")?;
        let key_end = r.find('>')?;
        let key = r[..key_end].trim();
        let r = &r[key_end + 1..];
        // A value may itself contain '<' (code), so look for the closing tag; a missing one
        // (output cut off) ends the value at the next parameter or the end of the function.
        let (value, next) = match r.find("</parameter>") {
            Some(end) => (&r[..end], &r[end + "</parameter>".len()..]),
            None => {
                let end = [r.find("<parameter="), r.find("</function>")]
                    .into_iter()
                    .flatten()
                    .min()
                    .unwrap_or(r.len());
                (&r[..end], &r[end..])
            }
        };
        if key.is_empty() {
            return None;
        }
        let value = if declared_string(tools, name, key) {
            Value::String(strip_template_newlines(value).to_string())
        } else {
            xml_value(value)
        };
        args.insert(key.to_string(), value);
        rest = next;
    }
    Some((name.to_string(), Value::Object(args).to_string()))
}

fn strip_template_newlines(raw: &str) -> &str {
    let v = raw.strip_prefix('\n').unwrap_or(raw);
    v.strip_suffix('\n').unwrap_or(v)
}

/// Whether tool `name`'s parameter `key` is declared with type "string" (only) in `tools`.
fn declared_string(tools: &[Value], name: &str, key: &str) -> bool {
    tools.iter().any(|t| {
        let f = t.get("function").unwrap_or(t);
        f.get("name").and_then(Value::as_str) == Some(name)
            && f.pointer(&format!(
                "/parameters/properties/{}/type",
                key.replace('~', "~0").replace('/', "~1")
            ))
            .and_then(Value::as_str)
                == Some("string")
    })
}

/// The template writes `\n` + value + `\n`; strings raw, objects/arrays as JSON, other
/// scalars via Jinja's `string` filter. Without the tool's schema we take JSON when the
/// value parses as JSON (numbers, booleans, null, objects, arrays) and a string otherwise.
fn xml_value(raw: &str) -> Value {
    let v = strip_template_newlines(raw);
    match v.trim() {
        "True" => return Value::Bool(true),
        "False" => return Value::Bool(false),
        "None" => return Value::Null,
        _ => {}
    }
    match serde_json::from_str::<Value>(v.trim()) {
        Ok(j) if !j.is_string() => j,
        _ => Value::String(v.to_string()),
    }
}

/// Llama 3: the reply (after an optional `<|python_tag|>`) is one or more JSON calls
/// separated by `;`, or a built-in `name.call(k="v")`. Otherwise it is all content.
fn parse_llama3(text: &str, calls: &mut Vec<(String, String)>) -> String {
    let (prefix, body) = match text.find("<|python_tag|>") {
        Some(p) => (&text[..p], &text[p + "<|python_tag|>".len()..]),
        None => ("", text),
    };
    let body_trim = body.trim();
    if let Some(found) = llama3_json_calls(body_trim) {
        calls.extend(found);
        return prefix.to_string();
    }
    if !prefix.is_empty() || text.contains("<|python_tag|>") {
        if let Some(call) = builtin_call(body_trim) {
            calls.push(call);
            return prefix.to_string();
        }
    }
    text.to_string()
}

/// All of `s` as `call (; call)*`, or None.
fn llama3_json_calls(s: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut rest = s.trim();
    while !rest.is_empty() {
        if !rest.starts_with('{') {
            return None;
        }
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let v = stream.next()?.ok()?;
        out.push(call_from_json(&v)?);
        let after = rest[stream.byte_offset()..].trim_start();
        rest = match after.strip_prefix(';') {
            Some(r) => r.trim_start(),
            None if after.is_empty() => after,
            None => return None,
        };
    }
    (!out.is_empty()).then_some(out)
}

/// `brave_search.call(query="x", n=3)` → ("brave_search", {"query": "x", "n": 3}).
fn builtin_call(s: &str) -> Option<(String, String)> {
    let open = s.find(".call(")?;
    let name = &s[..open];
    if name.is_empty() || !name.chars().all(|c| c.is_alphanumeric() || c == '_') {
        return None;
    }
    let inner = s[open + ".call(".len()..].strip_suffix(')')?;
    let mut args = Map::new();
    let mut rest = inner.trim();
    while !rest.is_empty() {
        let eq = rest.find('=')?;
        let key = rest[..eq].trim();
        rest = rest[eq + 1..].trim_start();
        let (value, next) = if let Some(r) = rest.strip_prefix('"') {
            // A Python string literal with backslash escapes.
            let mut val = String::new();
            let mut chars = r.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => val.push(chars.next()?.1),
                    '"' => {
                        end = Some(i + 1);
                        break;
                    }
                    _ => val.push(c),
                }
            }
            (Value::String(val), &r[end?..])
        } else {
            let end = rest.find(',').unwrap_or(rest.len());
            let raw = rest[..end].trim();
            (
                serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_string())),
                &rest[end..],
            )
        };
        if key.is_empty() {
            return None;
        }
        args.insert(key.to_string(), value);
        rest = next.trim_start();
        rest = match rest.strip_prefix(',') {
            Some(r) => r.trim_start(),
            None if rest.is_empty() => rest,
            None => return None,
        };
    }
    Some((name.to_string(), Value::Object(args).to_string()))
}
