//! Tool-call parsing against the real chat templates: an assistant turn with tool calls is
//! rendered by the model's own template (the format the model is trained and prompted to
//! emit), and parsing that text must give back the same calls. Plus hand-written model
//! outputs and every truncation of them (no panic, no lost text).

use engine::tool_calls::{parse_tool_calls, parse_tool_calls_with_tools, ParsedReply, ToolFamily};
use engine::ChatTemplate;
use serde_json::{json, Value};

const TEMPLATES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/templates");

fn template_source(name: &str) -> String {
    std::fs::read_to_string(format!("{TEMPLATES}/{name}.jinja")).unwrap()
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"]}}})
}

fn calls() -> Vec<(String, Value)> {
    vec![
        (
            "get_weather".into(),
            json!({"city": "Paris <rive gauche>", "days": 3}),
        ),
        (
            "get_weather".into(),
            json!({"city": "Zürich", "opts": {"units": "C", "list": [1, 2]}, "flag": true}),
        ),
    ]
}

/// The assistant turn's text as the template renders it.
fn rendered_assistant_turn(
    name: &str,
    n_calls: usize,
    extra: &serde_json::Map<String, Value>,
) -> String {
    let tool_calls: Vec<Value> = calls()[..n_calls]
        .iter()
        .enumerate()
        .map(|(i, (n, a))| json!({"id": format!("c{i}"), "type": "function", "function": {"name": n, "arguments": a}}))
        .collect();
    let messages = vec![
        json!({"role": "user", "content": "weather?"}),
        json!({"role": "assistant", "content": "", "tool_calls": tool_calls}),
    ];
    let t = ChatTemplate::new(&template_source(name)).unwrap();
    let out = t
        .render(&messages, Some(&[weather_tool()]), false, extra)
        .unwrap();
    let (start_marker, ends): (&str, &[&str]) = if out.contains("<|im_start|>assistant\n") {
        ("<|im_start|>assistant\n", &["<|im_end|>"])
    } else {
        (
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
            &["<|eot_id|>", "<|eom_id|>"],
        )
    };
    let start = out.rfind(start_marker).unwrap() + start_marker.len();
    let turn = &out[start..];
    let end = ends
        .iter()
        .filter_map(|e| turn.find(e))
        .min()
        .unwrap_or(turn.len());
    turn[..end].to_string()
}

fn assert_calls(p: &ParsedReply, want: &[(String, Value)], text: &str) {
    assert_eq!(p.tool_calls.len(), want.len(), "{text:?} → {p:?}");
    for (got, (name, args)) in p.tool_calls.iter().zip(want) {
        assert_eq!(&got.name, name, "{text:?}");
        let got_args: Value = serde_json::from_str(&got.arguments).unwrap();
        assert_eq!(&got_args, args, "{text:?}");
    }
    let mut ids: Vec<&str> = p.tool_calls.iter().map(|c| c.id.as_str()).collect();
    ids.dedup();
    assert_eq!(ids.len(), want.len());
}

#[test]
fn qwen_family_templates_round_trip() {
    for name in [
        "Qwen-Qwen2.5-7B-Instruct",
        "Qwen-Qwen3-0.6B",
        "Qwen-QwQ-32B",
        "Qwen3.5-4B",
    ] {
        assert_eq!(
            ToolFamily::detect(&template_source(name)),
            ToolFamily::Qwen,
            "{name}"
        );
        for n in [1, 2] {
            let text = rendered_assistant_turn(name, n, &Default::default());
            eprintln!("{name}: {text:?}");
            let p = parse_tool_calls(ToolFamily::Qwen, &text);
            assert_calls(&p, &calls()[..n], &text);
            assert_eq!(p.content, None, "{name}: {text:?}");
        }
    }
}

#[test]
fn llama3_templates_round_trip() {
    for name in [
        "meta-llama-Llama-3.1-8B-Instruct",
        "meta-llama-Llama-3.2-3B-Instruct",
    ] {
        assert_eq!(
            ToolFamily::detect(&template_source(name)),
            ToolFamily::Llama3,
            "{name}"
        );
        // These templates render exactly one call per assistant turn.
        let text = rendered_assistant_turn(name, 1, &Default::default());
        eprintln!("{name}: {text:?}");
        let p = parse_tool_calls(ToolFamily::Llama3, &text);
        assert_calls(&p, &calls()[..1], &text);
        assert_eq!(p.content, None);
    }
}

#[test]
fn llama31_builtin_python_tag_call() {
    let text = "<|python_tag|>brave_search.call(query=\"rust \\\"gguf\\\" format\", count=3)";
    let p = parse_tool_calls(ToolFamily::Llama3, text);
    assert_calls(
        &p,
        &[(
            "brave_search".into(),
            json!({"query": "rust \"gguf\" format", "count": 3}),
        )],
        text,
    );
    let text = "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"a\": 1}}; {\"name\": \"g\", \"parameters\": {}}";
    let p = parse_tool_calls(ToolFamily::Llama3, text);
    assert_calls(
        &p,
        &[("f".into(), json!({"a": 1})), ("g".into(), json!({}))],
        text,
    );
}

#[test]
fn model_style_outputs() {
    // Qwen3 with reasoning, text before the call, arguments given as a JSON string.
    let text = "<think>\nThe user wants weather.\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Oslo\\\"}\"}\n</tool_call>";
    let p = parse_tool_calls(ToolFamily::Qwen, text);
    assert_eq!(p.reasoning.as_deref(), Some("The user wants weather."));
    assert_eq!(p.content.as_deref(), Some("Let me check."));
    assert_calls(&p, &[("get_weather".into(), json!({"city": "Oslo"}))], text);
    // Qwen3.5 XML with a multi-line string value containing markup, and Python-style scalars.
    let text = "<tool_call>\n<function=run>\n<parameter=code>\nif a < b:\n    print(\"</x>\")\n</parameter>\n<parameter=verbose>\nTrue\n</parameter>\n<parameter=n>\n-2.5\n</parameter>\n</function>\n</tool_call>";
    let p = parse_tool_calls(ToolFamily::Qwen, text);
    assert_calls(
        &p,
        &[(
            "run".into(),
            json!({"code": "if a < b:\n    print(\"</x>\")", "verbose": true, "n": -2.5}),
        )],
        text,
    );
    // An unclosed final block (generation stopped at <|im_end|>) still parses.
    let text = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n";
    assert_calls(
        &parse_tool_calls(ToolFamily::Qwen, text),
        &[("now".into(), json!({}))],
        text,
    );
    // Plain answers stay content.
    for family in [ToolFamily::Qwen, ToolFamily::Llama3] {
        let p = parse_tool_calls(family, "The answer is {braces} and 42.");
        assert!(p.tool_calls.is_empty());
        assert_eq!(p.content.as_deref(), Some("The answer is {braces} and 42."));
    }
}

#[test]
fn malformed_calls_stay_content() {
    let cases = [
        (ToolFamily::Qwen, "<tool_call>{not json</tool_call> ok"),
        (
            ToolFamily::Qwen,
            "<tool_call>{\"arguments\": {}}</tool_call>",
        ),
        (
            ToolFamily::Qwen,
            "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
        ),
        (
            ToolFamily::Qwen,
            "<tool_call><function=></function></tool_call>",
        ),
        (
            ToolFamily::Qwen,
            "<tool_call><function=f><oops></function></tool_call>",
        ),
        (
            ToolFamily::Llama3,
            "{\"name\": \"f\", \"parameters\": {}} and then some text",
        ),
        (ToolFamily::Llama3, "<|python_tag|>print(1)"),
    ];
    for (family, text) in cases {
        let p = parse_tool_calls(family, text);
        assert!(p.tool_calls.is_empty(), "{text:?} → {p:?}");
        let content = p.content.unwrap_or_default();
        // Nothing lost (up to the special marker and trimming).
        assert!(
            text.contains(content.trim_start_matches("<|python_tag|>")),
            "{text:?} → {content:?}"
        );
    }
}

#[test]
fn every_truncation_and_corruption_is_handled() {
    let mut texts: Vec<String> = Vec::new();
    for name in [
        "Qwen-Qwen2.5-7B-Instruct",
        "Qwen3.5-4B",
        "meta-llama-Llama-3.1-8B-Instruct",
    ] {
        texts.push(rendered_assistant_turn(name, 1, &Default::default()));
    }
    texts.push("<think>x</think><tool_call>\n<function=f>\n<parameter=a>\n1\n".into());
    texts.push("<|python_tag|>brave_search.call(query=\"a\\".into());
    for text in &texts {
        for (cut, _) in text.char_indices() {
            for family in [ToolFamily::Qwen, ToolFamily::Llama3] {
                let t = &text[..cut];
                let p = parse_tool_calls(family, t);
                for c in &p.tool_calls {
                    let args: Value = serde_json::from_str(&c.arguments).unwrap();
                    assert!(args.is_object(), "{t:?}");
                }
                // Swap two characters: still no panic.
                let mut chars: Vec<char> = text.chars().collect();
                if chars.len() > 2 {
                    let i = cut % (chars.len() - 1);
                    chars.swap(i, i + 1);
                    let _ = parse_tool_calls(family, &chars.into_iter().collect::<String>());
                }
            }
        }
    }
}

#[test]
fn declared_string_parameters_stay_strings() {
    let text = "<tool_call>\n<function=get_weather>\n<parameter=city>\n1234\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
    let p = parse_tool_calls_with_tools(ToolFamily::Qwen, text, &[weather_tool()]);
    assert_calls(
        &p,
        &[("get_weather".into(), json!({"city": "1234", "days": 3}))],
        text,
    );
    let p = parse_tool_calls(ToolFamily::Qwen, text);
    assert_calls(
        &p,
        &[("get_weather".into(), json!({"city": 1234, "days": 3}))],
        text,
    );
}
