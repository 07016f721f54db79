//! The HTTP layer end to end (router, validation, SSE, errors, auth, limits) over the
//! real scheduler and a byte-level fake model.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::app::{router, AppState, ServerConfig};
use crate::fake_service::{FakeService, SCRIPT};

fn app_with(config: ServerConfig, service: Option<Arc<FakeService>>) -> Router {
    let state = AppState::new(config);
    if let Some(s) = service {
        state.set_service(s);
    }
    router(state)
}

fn app() -> Router {
    app_with(
        greedy_config(),
        Some(FakeService::new(2, 256, 8, Duration::ZERO)),
    )
}

fn greedy_config() -> ServerConfig {
    let mut c = ServerConfig::default();
    c.defaults.temperature = 0.0;
    c
}

async fn send(
    app: &Router,
    method: &str,
    path: &str,
    body: Option<Value>,
    key: Option<&str>,
) -> (StatusCode, axum::http::HeaderMap, String) {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json");
    if let Some(k) = key {
        req = req.header("authorization", format!("Bearer {k}"));
    }
    let req = req
        .body(body.map_or(Body::empty(), |b| Body::from(b.to_string())))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

async fn post(app: &Router, path: &str, body: Value) -> (StatusCode, Value) {
    let (status, _, text) = send(app, "POST", path, Some(body), None).await;
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// The `data:` payloads of an SSE body.
fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
        .map(str::to_string)
        .collect()
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

/// What the fake model generates greedily after a prompt of `prompt_len` tokens.
fn script_after(prompt_len: usize, n: usize) -> String {
    (prompt_len..prompt_len + n)
        .map(|i| SCRIPT[i % SCRIPT.len()] as char)
        .collect()
}

#[tokio::test]
async fn chat_completion_whole() {
    let app = app();
    let (status, body) = post(
        &app,
        "/v1/chat/completions",
        json!({"model": "x", "messages": user("hi"), "max_tokens": 10}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // "user: hi\nassistant: " is 20 bytes.
    assert_eq!(
        body["choices"][0]["message"]["content"],
        script_after(20, 10)
    );
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "fake-bytes");
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30, "prompt_tokens_details": {"cached_tokens": 0}})
    );
}

#[tokio::test]
async fn chat_stream_matches_whole_and_ends_with_usage_and_done() {
    let app = app();
    let req = json!({"messages": user("hi"), "max_tokens": 12, "stream": true, "stream_options": {"include_usage": true}});
    let (status, headers, body) = send(&app, "POST", "/v1/chat/completions", Some(req), None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let data = sse_data(&body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, script_after(20, 12));
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["completion_tokens"], 12);
    assert!(chunks[..chunks.len() - 1]
        .iter()
        .all(|c| c["usage"].is_null()));
}

#[tokio::test]
async fn stop_sequences_cut_the_text_in_both_modes() {
    let app = app();
    // After the 20-byte prompt the script reads "little robot sang. ..."
    let (_, body) = post(
        &app,
        "/v1/chat/completions",
        json!({"messages": user("hi"), "stop": ["xyz", "robot"], "max_tokens": 40}),
    )
    .await;
    assert_eq!(body["choices"][0]["message"]["content"], "little ");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    let req = json!({"messages": user("hi"), "stop": "robot", "max_tokens": 40, "stream": true});
    let (_, _, sse) = send(&app, "POST", "/v1/chat/completions", Some(req), None).await;
    let text: String = sse_data(&sse)
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(text, "little ");
}

#[tokio::test]
async fn end_of_generation_finishes_with_stop() {
    let app = app();
    // The fake favours EOS once a sequence reaches 200 tokens.
    let (_, body) = post(
        &app,
        "/v1/completions",
        json!({"prompt": "x".repeat(195), "max_tokens": 50}),
    )
    .await;
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert_eq!(body["choices"][0]["text"].as_str().unwrap().len(), 5);
}

#[tokio::test]
async fn completions_whole_stream_and_logprobs() {
    let app = app();
    let (status, body) = post(
        &app,
        "/v1/completions",
        json!({"prompt": "abc", "max_tokens": 5, "logprobs": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["choices"][0]["text"], script_after(3, 5));
    assert_eq!(
        body["choices"][0]["logprobs"]["tokens"]
            .as_array()
            .unwrap()
            .len(),
        5
    );
    assert_eq!(
        body["choices"][0]["logprobs"]["text_offset"],
        json!([0, 1, 2, 3, 4])
    );
    let lp = body["choices"][0]["logprobs"]["token_logprobs"][0]
        .as_f64()
        .unwrap();
    assert!(lp < 0.0 && lp > -0.1, "{lp}");
    // Default max_tokens is 16, and token-id prompts work.
    let (_, body) = post(&app, "/v1/completions", json!({"prompt": [97, 98, 99]})).await;
    assert_eq!(body["usage"]["completion_tokens"], 16);
    let (_, _, sse) = send(
        &app,
        "POST",
        "/v1/completions",
        Some(json!({"prompt": "abc", "max_tokens": 5, "stream": true})),
        None,
    )
    .await;
    let data = sse_data(&sse);
    let text: String = data
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(text, script_after(3, 5));
    assert_eq!(data.last().unwrap(), "[DONE]");
}

#[tokio::test]
async fn chat_logprobs_have_openai_shape() {
    let app = app();
    let (_, body) = post(
        &app,
        "/v1/chat/completions",
        json!({"messages": user("hi"), "max_tokens": 3, "logprobs": true, "top_logprobs": 2}),
    )
    .await;
    let content = body["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    assert_eq!(content.len(), 3);
    assert_eq!(content[0]["token"], script_after(20, 1));
    assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 2);
    assert_eq!(content[0]["top_logprobs"][0]["token"], content[0]["token"]);
}

#[tokio::test]
async fn json_response_format_and_forced_tool_calls_use_the_constraint() {
    let app = app();
    let (_, body) = post(
        &app,
        "/v1/chat/completions",
        json!({"messages": user("hi"), "response_format": {"type": "json_object"}}),
    )
    .await;
    let content = body["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(content).unwrap(),
        json!({"a": 1})
    );
    assert_eq!(body["choices"][0]["finish_reason"], "stop");

    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let (_, body) = post(
        &app,
        "/v1/chat/completions",
        json!({"messages": user("weather?"), "tools": tools, "tool_choice": "required"}),
    )
    .await;
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{body}");
    assert!(choice["message"]["content"].is_null());
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris"}));

    let req = json!({"messages": user("weather?"), "tools": tools, "tool_choice": "required", "stream": true});
    let (_, _, sse) = send(&app, "POST", "/v1/chat/completions", Some(req), None).await;
    let chunks: Vec<Value> = sse_data(&sse)
        .iter()
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect();
    let call = chunks
        .iter()
        .find_map(|c| c["choices"][0]["delta"]["tool_calls"].get(0).cloned())
        .expect("a tool call delta");
    assert_eq!(
        (call["index"].clone(), call["function"]["name"].clone()),
        (json!(0), json!("get_weather"))
    );
    assert!(chunks
        .iter()
        .any(|c| c["choices"][0]["finish_reason"] == "tool_calls"));
}

#[tokio::test]
async fn errors_are_openai_shaped_with_the_right_status() {
    let app = app_with(
        greedy_config(),
        Some(FakeService::new(1, 64, 8, Duration::ZERO)),
    );
    let cases = [
        (
            json!({"messages": user("hi"), "temperature": 9}),
            400,
            Some("temperature"),
        ),
        (json!({"messages": "nope"}), 400, None),
        (
            json!({"messages": user("hi"), "max_tokens": 1000}),
            400,
            None,
        ),
        (json!({"messages": user(&"x".repeat(100))}), 400, None),
    ];
    for (req, status, param) in cases {
        let (s, body) = post(&app, "/v1/chat/completions", req.clone()).await;
        assert_eq!(s.as_u16(), status, "{req}: {body}");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
        assert!(!body["error"]["message"].as_str().unwrap().is_empty());
        if let Some(p) = param {
            assert_eq!(body["error"]["param"], p);
        }
    }
    let (_, body) = post(
        &app,
        "/v1/chat/completions",
        json!({"messages": user("hi"), "max_tokens": 1000}),
    )
    .await;
    assert_eq!(body["error"]["code"], "context_length_exceeded");
    let (s, _, text) = send(&app, "POST", "/v1/chat/completions", None, None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{text}");
    let (s, _, text) = send(&app, "GET", "/v1/nothing", None, None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(text.contains("\"error\""));
    let (s, body) = post(&app, "/v1/completions", json!({"prompt": [1, 99999]})).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{body}");
    let (s, body) = post(&app, "/v1/completions", json!({"prompt": ["a", "b"]})).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{body}");
}

#[tokio::test]
async fn oversized_bodies_get_413() {
    let config = ServerConfig {
        max_body_bytes: 1000,
        ..greedy_config()
    };
    let app = app_with(config, Some(FakeService::new(1, 64, 8, Duration::ZERO)));
    let (s, body) = post(
        &app,
        "/v1/chat/completions",
        json!({"messages": user(&"x".repeat(2000))}),
    )
    .await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(body["error"]["type"], "invalid_request_error");
}

#[tokio::test]
async fn api_key_guards_every_route_but_health() {
    let config = ServerConfig {
        api_key: Some("sekrit".into()),
        ..greedy_config()
    };
    let app = app_with(config, Some(FakeService::new(1, 64, 8, Duration::ZERO)));
    for (method, path) in [
        ("GET", "/v1/models"),
        ("GET", "/metrics"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/tokenize"),
    ] {
        let (s, _, body) = send(&app, method, path, Some(json!({})), None).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{path}");
        assert!(body.contains("invalid_api_key"));
        let (s, _, _) = send(&app, method, path, Some(json!({})), Some("wrong")).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{path}");
    }
    assert_eq!(
        send(&app, "GET", "/v1/models", None, Some("sekrit"))
            .await
            .0,
        StatusCode::OK
    );
    assert_eq!(
        send(&app, "GET", "/health", None, None).await.0,
        StatusCode::OK
    );
    assert_eq!(send(&app, "GET", "/", None, None).await.0, StatusCode::OK);
}

#[tokio::test]
async fn health_is_503_until_the_model_is_loaded() {
    let state = AppState::new(greedy_config());
    let app = router(state.clone());
    let (s, h, _) = send(&app, "GET", "/health", None, None).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert!(h.contains_key("retry-after"));
    assert_eq!(
        post(
            &app,
            "/v1/chat/completions",
            json!({"messages": user("hi")})
        )
        .await
        .0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    state.set_service(FakeService::new(1, 64, 8, Duration::ZERO));
    assert_eq!(
        send(&app, "GET", "/health", None, None).await.0,
        StatusCode::OK
    );
    state.begin_shutdown();
    assert_eq!(
        send(&app, "GET", "/health", None, None).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
}

#[tokio::test]
async fn full_queue_answers_503_with_retry_after() {
    let app = app_with(
        greedy_config(),
        Some(FakeService::new(1, 256, 1, Duration::from_millis(5))),
    );
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            send(
                &app,
                "POST",
                "/v1/completions",
                Some(json!({"prompt": "a", "max_tokens": 30})),
                None,
            )
            .await
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        let (s, h, body) = t.await.unwrap();
        if s == StatusCode::SERVICE_UNAVAILABLE {
            assert_eq!(h["retry-after"], "1");
            assert!(body.contains("server_overloaded"), "{body}");
        }
        statuses.push(s.as_u16());
    }
    assert!(
        statuses.contains(&200) && statuses.contains(&503),
        "{statuses:?}"
    );
}

#[tokio::test]
async fn models_tokenize_detokenize_metrics() {
    let app = app();
    let (_, _, models) = send(&app, "GET", "/v1/models", None, None).await;
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["id"], "fake-bytes");
    let (_, body) = post(&app, "/tokenize", json!({"content": "hi"})).await;
    assert_eq!(body["tokens"], json!([104, 105]));
    let (_, body) = post(
        &app,
        "/tokenize",
        json!({"content": "h", "with_pieces": true}),
    )
    .await;
    assert_eq!(body["tokens"], json!([{"id": 104, "piece": "h"}]));
    let (_, body) = post(&app, "/detokenize", json!({"tokens": [104, 105]})).await;
    assert_eq!(body["content"], "hi");
    assert_eq!(
        post(&app, "/detokenize", json!({"tokens": [-1]})).await.0,
        StatusCode::BAD_REQUEST
    );
    post(
        &app,
        "/v1/completions",
        json!({"prompt": "abc", "max_tokens": 4}),
    )
    .await;
    let (_, h, text) = send(&app, "GET", "/metrics", None, None).await;
    assert!(h["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    for name in [
        "redline_requests_total 1",
        "redline_generated_tokens_total 4",
        "redline_prompt_tokens_total 3",
        "redline_queue_depth 0",
        "redline_slots_busy",
        "redline_kv_cache_usage_ratio",
        "redline_decode_tokens_per_second",
        "redline_prefill_tokens_per_second",
        "redline_time_to_first_token_seconds_count 1",
        "redline_http_requests_total{route=\"/v1/completions\",status=\"200\"} 1",
    ] {
        assert!(text.contains(name), "{name} missing from\n{text}");
    }
}

#[tokio::test]
async fn a_dropped_stream_frees_its_slot() {
    let service = FakeService::new(1, 4096, 8, Duration::from_millis(2));
    let app = app_with(greedy_config(), Some(service.clone()));
    let req = Request::builder()
        .method("POST")
        .uri("/v1/completions")
        .header("content-type", "application/json")
        .body(Body::from(
            json!({"prompt": "a", "max_tokens": 3000, "stream": true, "ignore_eos": true})
                .to_string(),
        ))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let mut body = resp.into_body();
    // Read a few events, then hang up.
    for _ in 0..3 {
        body.frame().await.unwrap().unwrap();
    }
    drop(body);
    let t0 = std::time::Instant::now();
    while crate::service::InferenceService::stats(&*service).requests_cancelled == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the slot was not freed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The single slot serves the next request at once.
    let (s, _) = post(
        &app,
        "/v1/completions",
        json!({"prompt": "b", "max_tokens": 2}),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
}

#[tokio::test]
async fn with_tools_offered_plain_content_still_streams() {
    let app = app();
    let tools =
        json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
    let req = json!({"messages": user("hi"), "tools": tools, "max_tokens": 12, "stream": true});
    let (_, _, sse) = send(&app, "POST", "/v1/chat/completions", Some(req), None).await;
    let chunks: Vec<Value> = sse_data(&sse)
        .iter()
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect();
    let pieces: Vec<&str> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .filter(|s| !s.is_empty())
        .collect();
    assert!(pieces.len() > 5, "content was held back: {pieces:?}");
    assert_eq!(pieces.concat(), script_after(20, 12));
    assert!(chunks
        .iter()
        .any(|c| c["choices"][0]["finish_reason"] == "length"));
}

#[tokio::test]
async fn a_hermes_tool_call_after_streamed_text_is_parsed() {
    // The 20-byte prompt "user: hi\nassistant: " is followed by the reply, then EOS.
    const REPLY: &str =
        "Let me look.<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>";
    const SCRIPT: &str = concat!(
        "....................",
        "Let me look.<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>"
    );
    let service = FakeService::with_script(
        1,
        256,
        4,
        Duration::ZERO,
        SCRIPT.as_bytes(),
        20 + REPLY.len(),
    );
    let app = app_with(greedy_config(), Some(service));
    let tools =
        json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
    let (_, whole) = post(
        &app,
        "/v1/chat/completions",
        json!({"messages": user("hi"), "tools": tools}),
    )
    .await;
    assert_eq!(
        whole["choices"][0]["finish_reason"], "tool_calls",
        "{whole}"
    );
    assert_eq!(whole["choices"][0]["message"]["content"], "Let me look.");
    assert_eq!(
        whole["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
        "{\"x\":1}"
    );

    let req = json!({"messages": user("hi"), "tools": tools, "stream": true});
    let (_, _, sse) = send(&app, "POST", "/v1/chat/completions", Some(req), None).await;
    let chunks: Vec<Value> = sse_data(&sse)
        .iter()
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect();
    let content: Vec<&str> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .filter(|s| !s.is_empty())
        .collect();
    assert!(
        content.len() > 3,
        "the text before the call was not streamed: {content:?}"
    );
    assert_eq!(content.concat(), "Let me look.");
    let call = chunks
        .iter()
        .find_map(|c| c["choices"][0]["delta"]["tool_calls"].get(0).cloned())
        .expect("a tool call");
    assert_eq!(call["function"]["name"], "f");
    assert!(chunks
        .iter()
        .any(|c| c["choices"][0]["finish_reason"] == "tool_calls"));
}

#[tokio::test]
async fn qwen35_xml_call_after_reasoning_goes_to_reasoning_content_and_typed_arguments() {
    // Qwen3.5 style: a think block, then an XML call; `zip` is declared a string, so
    // "01234" must stay a string while `days` (undeclared type) is read as JSON.
    const REPLY: &str = "<think>\nNeed the weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=zip>\n01234\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n</function>\n</tool_call>";
    // with_script keeps the bytes for the service's lifetime.
    let script: &'static str = format!("{}{REPLY}", ".".repeat(20)).leak();
    let service = FakeService::with_script(
        1,
        512,
        4,
        Duration::ZERO,
        script.as_bytes(),
        20 + REPLY.len(),
    );
    let app = app_with(greedy_config(), Some(service));
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"zip": {"type": "string"}, "days": {}, "metric": {"type": "boolean"}}}}}]);
    let (_, whole) = post(
        &app,
        "/v1/chat/completions",
        json!({"messages": user("hi"), "tools": tools}),
    )
    .await;
    let choice = &whole["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{whole}");
    assert_eq!(choice["message"]["reasoning_content"], "Need the weather.");
    assert_eq!(choice["message"]["content"], Value::Null);
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"zip": "01234", "days": 3, "metric": true}));
    let id = call["id"].as_str().unwrap();
    assert!(
        id.starts_with(&format!("call_{}_", whole["id"].as_str().unwrap())),
        "{id}"
    );

    let req = json!({"messages": user("hi"), "tools": tools, "stream": true});
    let (_, _, sse) = send(&app, "POST", "/v1/chat/completions", Some(req), None).await;
    let chunks: Vec<Value> = sse_data(&sse)
        .iter()
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect();
    let field = |name: &str| -> String {
        chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"][name].as_str())
            .collect()
    };
    assert_eq!(field("reasoning_content").trim_end(), "Need the weather.");
    assert_eq!(field("content"), "");
    let call = chunks
        .iter()
        .find_map(|c| c["choices"][0]["delta"]["tool_calls"].get(0).cloned())
        .expect("a tool call");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"zip": "01234", "days": 3, "metric": true}));
}

mod reasoning;
