//! Validation: good requests become the right spec; each bad field gets a 400 naming it.

use serde_json::json;

use super::*;
use crate::openai::request::{ChatCompletionRequest, CompletionRequest, Prompt};

fn chat(body: Value) -> Result<ChatInput, ApiError> {
    let req: ChatCompletionRequest =
        serde_json::from_value(body).map_err(|e| ApiError::invalid(e.to_string()))?;
    chat_input(&req, &SamplingParams::default(), 1000)
}

fn param_of(e: ApiError) -> Option<String> {
    match e {
        ApiError::InvalidRequest { param, .. } => param,
        other => panic!("expected a 400, got {other:?}"),
    }
}

#[test]
fn full_chat_request_is_read() {
    let input = chat(json!({
        "model": "whatever", "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "42"}
        ],
        "temperature": 0.5, "top_p": 0.9, "top_k": 5000, "min_p": 0.1, "seed": -1,
        "max_completion_tokens": 12, "stop": "END", "presence_penalty": 1.0,
        "logit_bias": {"7": -100, " 9": 5.5}, "logprobs": true, "top_logprobs": 3,
        "stream": true, "stream_options": {"include_usage": true},
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "some_future_field": {"ignored": true}
    }))
    .unwrap();
    let s = &input.spec;
    assert_eq!(
        (
            s.sampling.temperature,
            s.sampling.top_p,
            s.sampling.top_k,
            s.sampling.min_p
        ),
        (0.5, 0.9, 1000, 0.1)
    );
    assert_eq!(s.sampling.seed, Some(u64::MAX));
    let mut bias = s.sampling.logit_bias.clone();
    bias.sort_by_key(|b| b.0);
    assert_eq!(bias, vec![(7, -100.0), (9, 5.5)]);
    assert_eq!(
        (s.max_tokens, s.logprobs, s.stream, s.include_usage),
        (Some(12), Some(3), true, true)
    );
    assert_eq!(s.stop, vec!["END".to_string()]);
    assert_eq!(
        s.format,
        OutputFormat::JsonSchema(json!({"type": "object"}))
    );
    assert_eq!(
        input.messages[0],
        json!({"role": "system", "content": "Be brief."})
    );
    assert_eq!(input.messages[1]["content"], "Hi there");
    assert_eq!(
        input.messages[2]["tool_calls"][0]["function"]["arguments"],
        json!({"a": 1})
    );
    assert_eq!(input.messages[3]["tool_call_id"], "c1");
    assert_eq!(input.tool_choice, ToolChoice::Function("f".into()));
    assert_eq!(input.tools.unwrap()[0]["function"]["name"], "f");
}

#[test]
fn defaults_apply_when_fields_are_absent() {
    let input = chat(json!({"messages": [{"role": "user", "content": "x"}]})).unwrap();
    assert_eq!(input.spec.sampling, SamplingParams::default());
    assert_eq!(
        (
            input.spec.max_tokens,
            input.spec.logprobs,
            input.spec.stream
        ),
        (None, None, false)
    );
    assert_eq!(input.tool_choice, ToolChoice::Auto);
}

#[test]
fn bad_fields_get_a_400_naming_them() {
    let m = json!([{"role": "user", "content": "x"}]);
    let cases = [
        (json!({"messages": m, "temperature": 3}), "temperature"),
        (json!({"messages": m, "temperature": -0.1}), "temperature"),
        (json!({"messages": m, "top_p": 1.5}), "top_p"),
        (json!({"messages": m, "top_k": -1}), "top_k"),
        (json!({"messages": m, "min_p": 2}), "min_p"),
        (
            json!({"messages": m, "presence_penalty": 2.5}),
            "presence_penalty",
        ),
        (
            json!({"messages": m, "frequency_penalty": -3}),
            "frequency_penalty",
        ),
        (json!({"messages": m, "max_tokens": 0}), "max_tokens"),
        (
            json!({"messages": m, "max_completion_tokens": -5}),
            "max_completion_tokens",
        ),
        (json!({"messages": m, "n": 2}), "n"),
        (
            json!({"messages": m, "stop": ["a", "b", "c", "d", "e"]}),
            "stop",
        ),
        (
            json!({"messages": m, "logit_bias": {"abc": 1}}),
            "logit_bias",
        ),
        (
            json!({"messages": m, "logit_bias": {"1000": 1}}),
            "logit_bias",
        ),
        (
            json!({"messages": m, "logit_bias": {"1": 101}}),
            "logit_bias",
        ),
        (json!({"messages": m, "top_logprobs": 2}), "top_logprobs"),
        (
            json!({"messages": m, "logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (
            json!({"messages": m, "tool_choice": "required"}),
            "tool_choice",
        ),
        (
            json!({"messages": m, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}),
            "tool_choice",
        ),
        (
            json!({"messages": m, "tools": [{"type": "code", "function": {"name": "f"}}]}),
            "tools[0].type",
        ),
        (
            json!({"messages": m, "response_format": {"type": "json_schema", "json_schema": {"schema": 5}}}),
            "response_format",
        ),
        (json!({"messages": []}), "messages"),
        (
            json!({"messages": [{"role": "wizard", "content": "x"}]}),
            "messages[0].role",
        ),
        (
            json!({"messages": [{"role": "user"}]}),
            "messages[0].content",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            "messages[0].content",
        ),
    ];
    for (body, param) in cases {
        let e = chat(body.clone()).expect_err(&body.to_string());
        assert_eq!(e.status().as_u16(), 400, "{body}");
        assert_eq!(param_of(e).as_deref(), Some(param), "{body}");
    }
}

#[test]
fn wrong_types_are_serde_errors_not_panics() {
    for body in [
        json!({"messages": "hi"}),
        json!({"messages": [{"role": 1, "content": "x"}]}),
        json!({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}),
        json!({"messages": [{"role": "user", "content": "x"}], "stop": 5}),
        json!({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}}),
        json!({}),
    ] {
        assert!(
            serde_json::from_value::<ChatCompletionRequest>(body.clone()).is_err(),
            "{body}"
        );
    }
}

#[test]
fn completion_prompts_of_every_shape_parse() {
    let p = |v: Value| {
        serde_json::from_value::<CompletionRequest>(json!({"prompt": v})).map(|r| r.prompt)
    };
    assert_eq!(p(json!("a")).unwrap(), Prompt::Text("a".into()));
    assert_eq!(p(json!(["a"])).unwrap(), Prompt::Texts(vec!["a".into()]));
    assert_eq!(p(json!([1, 2])).unwrap(), Prompt::Tokens(vec![1, 2]));
    assert_eq!(
        p(json!([[1], [2]])).unwrap(),
        Prompt::TokenLists(vec![vec![1], vec![2]])
    );
    assert!(p(json!({"x": 1})).is_err());
}

#[test]
fn max_tokens_is_checked_against_the_context() {
    assert_eq!(resolve_max_tokens(None, 10, 64).unwrap(), 54);
    assert_eq!(resolve_max_tokens(Some(54), 10, 64).unwrap(), 54);
    for (m, p) in [(Some(55), 10), (None, 64), (None, 100)] {
        let e = resolve_max_tokens(m, p, 64).unwrap_err();
        assert_eq!(e.body()["error"]["code"], "context_length_exceeded");
    }
    assert_eq!(
        resolve_max_tokens(None, 0, 64)
            .unwrap_err()
            .status()
            .as_u16(),
        400
    );
}

/// A cheap deterministic fuzz: random JSON values (and mutations of a valid body) thrown at
/// the request types and validation must give Ok or a 4xx, never a panic.
#[test]
fn random_bodies_never_panic() {
    let mut state = 0x9e3779b97f4a7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    fn random_value(next: &mut dyn FnMut() -> u64, depth: u32) -> Value {
        let keys = [
            "messages",
            "role",
            "content",
            "temperature",
            "top_p",
            "top_k",
            "stop",
            "max_tokens",
            "logit_bias",
            "logprobs",
            "top_logprobs",
            "tools",
            "tool_choice",
            "function",
            "name",
            "type",
            "response_format",
            "json_schema",
            "schema",
            "n",
            "seed",
            "stream",
            "stream_options",
            "prompt",
            "text",
            "arguments",
            "tool_calls",
        ];
        match next() % if depth > 3 { 5 } else { 7 } {
            0 => Value::Null,
            1 => json!(next().is_multiple_of(2)),
            2 => json!((next() % 2000) as f64 / 7.0 - 100.0),
            3 => json!((next() as i64) >> (next() % 64)),
            4 => json!(
                [
                    "user",
                    "system",
                    "assistant",
                    "tool",
                    "function",
                    "text",
                    "auto",
                    "none",
                    "required",
                    "json_object",
                    "",
                    "\u{0}\u{ffff}"
                ][(next() % 12) as usize]
            ),
            5 => Value::Array(
                (0..next() % 4)
                    .map(|_| random_value(next, depth + 1))
                    .collect(),
            ),
            _ => Value::Object(
                (0..next() % 5)
                    .map(|_| {
                        (
                            keys[(next() % keys.len() as u64) as usize].to_string(),
                            random_value(next, depth + 1),
                        )
                    })
                    .collect(),
            ),
        }
    }
    for _ in 0..20000 {
        let body = random_value(&mut next, 0);
        if let Ok(req) = serde_json::from_value::<ChatCompletionRequest>(body.clone()) {
            if let Err(e) = chat_input(&req, &SamplingParams::default(), 100) {
                assert!(e.status().is_client_error(), "{body}: {e:?}");
            }
        }
        if let Ok(req) = serde_json::from_value::<CompletionRequest>(body) {
            let _ = sampling_spec(&req.sampling, &SamplingParams::default(), 100);
        }
    }
}
