//! Chat templates (`tokenizer.chat_template`, Jinja) rendered with minijinja the way Hugging
//! Face transformers renders them with Jinja2 (chat_template_utils.py
//! `_compile_jinja_template` / `render_jinja_template`):
//!
//! - `trim_blocks` and `lstrip_blocks` on, a single trailing newline of the template dropped,
//!   no HTML escaping, `break`/`continue` allowed;
//! - globals `raise_exception(msg)` and `strftime_now(fmt)`; filter `tojson` as Python's
//!   `json.dumps(x, ensure_ascii=False, indent=…, separators=…, sort_keys=…)`;
//! - Python string/dict methods (`.strip()`, `.split()`, `.items()`, `.get()` …) through
//!   minijinja-contrib's pycompat, and Python's text forms when values are printed
//!   (`None`, `True`, `['a']`), see [`python_format`];
//! - context: `messages`, `tools` (None when not given), `documents` (None),
//!   `add_generation_prompt`, `bos_token` / `eos_token`, then the caller's extra variables.
//!
//! `tests/chat_templates.rs` checks every template in tests/data/templates against
//! renderings that Jinja2 produced (scripts/gen_template_expected.py).

mod python_format;

use chrono::NaiveDateTime;
use minijinja::value::{Kwargs, Value};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State};

use python_format::JsonDumps;

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("chat template does not parse: {0}")]
    Syntax(String),
    /// The template failed while rendering: `raise_exception(...)` (a conversation the
    /// template rejects), an undefined attribute, a type error.
    #[error("chat template rejected the conversation: {0}")]
    Render(String),
    #[error("tokenizer metadata: {0}")]
    Metadata(String),
}

const TEMPLATE_NAME: &str = "chat_template";

/// Instruction budget of one render. A template comes from a model file, so a hostile one
/// (`range(10**6)` nested twice) must fail instead of hanging a server. Qwen3.5's template
/// spends ~85 units per message (17k for 201 messages), so this covers ~50k messages.
const RENDER_FUEL: u64 = 5_000_000;

/// A compiled chat template plus the special-token texts it is rendered with.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

fn to_json(v: &Value) -> Result<serde_json::Value, Error> {
    serde_json::to_value(v).map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson_filter(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_owned()),
            None => {
                let n = i64::try_from(v)?;
                Some(" ".repeat(n.max(0) as usize))
            }
        },
    };
    let mut dumps = JsonDumps::new(indent);
    if let Some(b) = kwargs.get::<Option<bool>>("ensure_ascii")? {
        dumps.ensure_ascii = b;
    }
    if let Some(b) = kwargs.get::<Option<bool>>("sort_keys")? {
        dumps.sort_keys = b;
    }
    if let Some(seps) = kwargs.get::<Option<Vec<String>>>("separators")? {
        if seps.len() != 2 {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "separators must be a pair",
            ));
        }
        dumps.item_separator = seps[0].clone();
        dumps.key_separator = seps[1].clone();
    }
    kwargs.assert_all_used()?;
    Ok(Value::from_safe_string(dumps.dumps(&to_json(value)?)))
}

/// Python `str(x)`: what Jinja2 prints for `{{ x }}` and returns for `x|string`.
fn python_str(value: &Value) -> Result<String, Error> {
    if value.is_undefined() {
        return Ok(String::new());
    }
    if let Some(s) = value.as_str() {
        return Ok(s.to_owned());
    }
    Ok(python_format::str_of(&to_json(value)?))
}

/// Jinja2 `trim(value, chars=None)`: `str(value).strip(chars)`, so a list is trimmed as its
/// Python repr.
fn trim_filter(value: &Value, chars: Option<String>) -> Result<Value, Error> {
    let text = python_str(value)?;
    let trimmed = match chars {
        Some(chars) => text.trim_matches(|c| chars.contains(c)),
        None => text.trim(),
    };
    Ok(Value::from(trimmed))
}

/// Jinja2 `join(value, d="", attribute=None)`: items (or their `attribute`) as `str()`.
fn join_filter(value: &Value, d: Option<String>, kwargs: Kwargs) -> Result<Value, Error> {
    let sep = match d {
        Some(d) => d,
        None => kwargs.get::<Option<String>>("d")?.unwrap_or_default(),
    };
    let attribute: Option<String> = kwargs.get("attribute")?;
    kwargs.assert_all_used()?;
    let mut parts = Vec::new();
    for item in value.try_iter()? {
        let item = match &attribute {
            Some(attr) => item.get_attr(attr)?,
            None => item,
        };
        parts.push(python_str(&item)?);
    }
    Ok(Value::from(parts.join(&sep)))
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

impl ChatTemplate {
    pub fn new(source: &str) -> Result<ChatTemplate, TemplateError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_fuel(Some(RENDER_FUEL));
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(|out, _state: &State, value| {
            let text = python_str(value)?;
            out.write_str(&text)
                .map_err(|e| Error::new(ErrorKind::WriteFailure, e.to_string()))
        });
        env.add_filter("tojson", tojson_filter);
        env.add_filter("string", |v: &Value| python_str(v).map(Value::from));
        env.add_filter("trim", trim_filter);
        env.add_filter("join", join_filter);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(TEMPLATE_NAME, rewrite_generation_tags(source))
            .map_err(|e| TemplateError::Syntax(format!("{e:#}")))?;
        let mut t = ChatTemplate {
            env,
            source: source.to_owned(),
            bos_token: None,
            eos_token: None,
        };
        t.set_now(None);
        Ok(t)
    }

    /// The template of a GGUF (`tokenizer.chat_template`), rendered with the texts of the
    /// file's BOS and EOS tokens. `Ok(None)` when the file has no template.
    pub fn from_gguf(meta: &gguf::Metadata) -> Result<Option<ChatTemplate>, TemplateError> {
        let Some(source) = meta.get_str("tokenizer.chat_template") else {
            return Ok(None);
        };
        let tokens = meta.get_str_array("tokenizer.ggml.tokens");
        let text_of = |key: &str| -> Option<String> {
            let id = meta.get_u64(key)? as usize;
            tokens.and_then(|t| t.get(id)).cloned()
        };
        let bos = text_of("tokenizer.ggml.bos_token_id");
        let eos = text_of("tokenizer.ggml.eos_token_id");
        Ok(Some(
            ChatTemplate::new(source)?.with_special_tokens(bos.as_deref(), eos.as_deref()),
        ))
    }

    /// Sets `bos_token` / `eos_token` for the template (`None`: left undefined, as
    /// transformers does for a tokenizer without that token).
    pub fn with_special_tokens(mut self, bos: Option<&str>, eos: Option<&str>) -> ChatTemplate {
        self.bos_token = bos.map(str::to_owned);
        self.eos_token = eos.map(str::to_owned);
        self
    }

    /// Pins the clock `strftime_now` reads (local time otherwise), for reproducible output.
    pub fn with_now(mut self, now: NaiveDateTime) -> ChatTemplate {
        self.set_now(Some(now));
        self
    }

    fn set_now(&mut self, fixed: Option<NaiveDateTime>) {
        self.env.add_function(
            "strftime_now",
            move |format: String| -> Result<String, Error> {
                let now = fixed.unwrap_or_else(|| chrono::Local::now().naive_local());
                let items: Vec<chrono::format::Item> =
                    chrono::format::StrftimeItems::new(&format).collect();
                if items.contains(&chrono::format::Item::Error) {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        format!("bad strftime format {format:?}"),
                    ));
                }
                Ok(now.format_with_items(items.into_iter()).to_string())
            },
        );
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// Renders a conversation (OpenAI-style message objects: `role`, `content`,
    /// `tool_calls`, `tool_call_id`, `reasoning_content` …). `tools` are function
    /// definitions (`{"type": "function", "function": {...}}`); `extra` adds or overrides
    /// template variables (`enable_thinking`, `date_string` …).
    pub fn render(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, TemplateError> {
        let mut ctx = serde_json::Map::new();
        ctx.insert(
            "messages".into(),
            serde_json::Value::Array(messages.to_vec()),
        );
        ctx.insert(
            "tools".into(),
            tools.map_or(serde_json::Value::Null, |t| {
                serde_json::Value::Array(t.to_vec())
            }),
        );
        ctx.insert("documents".into(), serde_json::Value::Null);
        ctx.insert(
            "add_generation_prompt".into(),
            serde_json::Value::Bool(add_generation_prompt),
        );
        if let Some(b) = &self.bos_token {
            ctx.insert("bos_token".into(), serde_json::Value::String(b.clone()));
        }
        if let Some(e) = &self.eos_token {
            ctx.insert("eos_token".into(), serde_json::Value::String(e.clone()));
        }
        for (k, v) in extra {
            ctx.insert(k.clone(), v.clone());
        }
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| TemplateError::Syntax(e.to_string()))?;
        template
            .render(Value::from_serialize(&ctx))
            .map_err(|e| TemplateError::Render(render_error_message(&e)))
    }
}

/// OpenAI chat messages as templates expect them: OpenAI sends `tool_calls[].function.arguments`
/// as a JSON string, while templates written for transformers iterate it as a mapping
/// (`arguments|items`, `arguments|tojson`). Arguments that parse as a JSON object are
/// replaced by that object (llama.cpp's server does the same); anything else is kept.
pub fn openai_messages_for_template(messages: &[serde_json::Value]) -> Vec<serde_json::Value> {
    let mut out = messages.to_vec();
    for msg in &mut out {
        let Some(calls) = msg.get_mut("tool_calls").and_then(|c| c.as_array_mut()) else {
            continue;
        };
        for call in calls {
            let Some(args) = call.pointer_mut("/function/arguments") else {
                continue;
            };
            if let Some(text) = args.as_str() {
                if let Ok(obj @ serde_json::Value::Object(_)) = serde_json::from_str(text) {
                    *args = obj;
                }
            }
        }
    }
    out
}

/// transformers' `{% generation %}…{% endgeneration %}` (its AssistantTracker extension)
/// renders the body unchanged; minijinja does not know the tag, so it becomes
/// `{% if true %}…{% endif %}`, keeping the whitespace-control markers.
fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(open) = rest.find("{%") {
        out.push_str(&rest[..open]);
        let tag = &rest[open..];
        let Some(close) = tag.find("%}") else {
            break;
        };
        let inner = &tag[2..close];
        let (lead, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, trail) = match body.strip_suffix(['-', '+']) {
            Some(b) => (b, &body[b.len()..]),
            None => (body, ""),
        };
        let replacement = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => out.push_str(&format!("{{%{lead} {r} {trail}%}}")),
            None => out.push_str(&tag[..close + 2]),
        }
        rest = &tag[close + 2..];
    }
    out.push_str(rest);
    out
}

/// The error and its causes on one line (minijinja's Display omits the chain).
fn render_error_message(e: &Error) -> String {
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(src: &str, messages: serde_json::Value) -> Result<String, TemplateError> {
        let msgs = messages.as_array().unwrap().clone();
        ChatTemplate::new(src)?.render(&msgs, None, false, &serde_json::Map::new())
    }

    #[test]
    fn python_printing_and_methods() {
        let out = render(
            "{{ messages[0].x }}|{{ messages[0].y }}|{{ messages[0].z }}|{{ messages[0].c.strip() }}|{{ messages[0].c.split(',')[1] }}|{{ messages[0].z|string }}",
            json!([{"x": null, "y": true, "z": [1, "a"], "c": "  a,b "}]),
        )
        .unwrap();
        assert_eq!(out, "None|True|[1, 'a']|a,b|b |[1, 'a']");
    }

    #[test]
    fn tojson_is_json_dumps() {
        let out = render(
            "{{ messages[0]|tojson }}\n{{ messages[0]|tojson(indent=2) }}",
            json!([{"b": "<é>", "a": [1, 2.0]}]),
        )
        .unwrap();
        assert_eq!(out, "{\"b\": \"<é>\", \"a\": [1, 2.0]}\n{\n  \"b\": \"<é>\",\n  \"a\": [\n    1,\n    2.0\n  ]\n}");
    }

    #[test]
    fn join_uses_python_str() {
        // Jinja2: "1-True-None-a", "xy", "a, b".
        let out = render(
            "{{ messages[0].v|join('-') }}|{{ 'xy'|join }}|{{ messages[0].o|join(', ', attribute='n') }}",
            json!([{"v": [1, true, null, "a"], "o": [{"n": "a"}, {"n": "b"}]}]),
        )
        .unwrap();
        assert_eq!(out, "1-True-None-a|xy|a, b");
    }

    #[test]
    fn raise_exception_is_an_error() {
        let err = render("{{ raise_exception('nope') }}", json!([])).unwrap_err();
        assert!(
            matches!(err, TemplateError::Render(ref m) if m.contains("nope")),
            "{err}"
        );
    }

    #[test]
    fn strftime_now_can_be_pinned() {
        let now =
            NaiveDateTime::parse_from_str("2024-07-26 10:00:00", "%Y-%m-%d %H:%M:%S").unwrap();
        let t = ChatTemplate::new("{{ strftime_now('%d %b %Y') }}")
            .unwrap()
            .with_now(now);
        assert_eq!(
            t.render(&[], None, false, &serde_json::Map::new()).unwrap(),
            "26 Jul 2024"
        );
    }

    #[test]
    fn generation_tag_renders_its_body() {
        // Expected output from Jinja2 with transformers' AssistantTracker extension.
        let src = "{%- for m in messages %}\n  {%- if m.role == 'assistant' %}\n    {%- generation %}\n{{ m.content }}\n    {%- endgeneration %}\n  {%- else %}\n[{{ m.content }}]\n  {% endif %}\n{%- endfor %}\n{% generation %}X{% endgeneration %}";
        let out = render(
            src,
            json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]),
        )
        .unwrap();
        assert_eq!(out, "[hi]\nyoX");
    }

    #[test]
    fn runaway_template_runs_out_of_fuel() {
        let src =
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
        assert!(matches!(
            render(src, json!([])),
            Err(TemplateError::Render(_))
        ));
    }

    #[test]
    fn openai_arguments_become_objects() {
        let msgs = vec![json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1, \"y\": [true]}"}},
            {"id": "b", "type": "function", "function": {"name": "g", "arguments": "not json"}},
            {"id": "c", "type": "function", "function": {"name": "h", "arguments": "[1]"}}
        ]})];
        let out = openai_messages_for_template(&msgs);
        assert_eq!(
            out[0]["tool_calls"][0]["function"]["arguments"],
            json!({"x": 1, "y": [true]})
        );
        assert_eq!(
            out[0]["tool_calls"][1]["function"]["arguments"],
            json!("not json")
        );
        assert_eq!(
            out[0]["tool_calls"][2]["function"]["arguments"],
            json!("[1]")
        );
        // Key order of the parsed object is kept (Python dicts and tojson keep it too).
        let order: Vec<&String> = out[0]["tool_calls"][0]["function"]["arguments"]
            .as_object()
            .unwrap()
            .keys()
            .collect();
        assert_eq!(order, ["x", "y"]);
    }

    #[test]
    fn shareable_across_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<ChatTemplate>();
        send_sync::<crate::Tokenizer>();
        fn send<T: Send>() {}
        send::<crate::StreamDecoder>();
    }

    #[test]
    fn trim_and_lstrip_blocks() {
        let out = render("  {% if true %}\nA\n  {% endif %}\nB\n", json!([])).unwrap();
        assert_eq!(out, "A\nB");
    }
}
