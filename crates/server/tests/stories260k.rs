//! The server over the real bundled model: greedy completions equal llama.cpp's server
//! output for the same prompt (tests/data/stories260K.reference.jsonl), also when four
//! requests are decoded together in one batch, and a second chat turn reuses the cache.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use model::{KvType, LoadOptions, Model};
use serde_json::{json, Value};
use server::{AppState, ModelService, ModelServiceOptions, ServerConfig};
use tower::ServiceExt;

fn data(rel: &str) -> String {
    format!("{}/../../{rel}", env!("CARGO_MANIFEST_DIR"))
}

fn app(n_slots: usize) -> axum::Router {
    let model = Model::load(
        data("models/stories260K.gguf").as_ref(),
        &LoadOptions::default(),
    )
    .unwrap();
    let opts = ModelServiceOptions {
        id: "stories260K".into(),
        n_slots,
        n_ctx_per_slot: 256,
        kv_type: KvType::F32,
        max_queue: 16,
        prefill_chunk: 3,
        chat_template: None,
    };
    let service = ModelService::new(Arc::new(model), opts).unwrap();
    let state = AppState::new(ServerConfig::default());
    state.set_service(Arc::new(service));
    server::router(state)
}

async fn post(app: &axum::Router, path: &str, body: Value) -> (StatusCode, Value) {
    let req = Request::builder()
        .method("POST")
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

fn reference() -> (String, String, usize) {
    let line = std::fs::read_to_string(data("tests/data/stories260K.reference.jsonl")).unwrap();
    let r: Value = serde_json::from_str(line.lines().next().unwrap()).unwrap();
    (
        r["prompt"].as_str().unwrap().into(),
        r["content"].as_str().unwrap().into(),
        r["prompt_n"].as_u64().unwrap() as usize,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_completions_match_llama_cpp_alone_and_batched() {
    let (prompt, content, prompt_n) = reference();
    let app = app(4);
    let req = json!({"prompt": prompt, "max_tokens": 64, "temperature": 0});
    let (status, body) = post(&app, "/v1/completions", req.clone()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["choices"][0]["text"], content);
    assert_eq!(body["usage"]["prompt_tokens"], prompt_n);
    assert_eq!(body["usage"]["completion_tokens"], 64);

    let (_, tok) = post(
        &app,
        "/tokenize",
        json!({"content": prompt, "add_special": true}),
    )
    .await;
    assert_eq!(tok["tokens"].as_array().unwrap().len(), prompt_n);

    // Four at once: decoded in shared batches, each must still be the reference.
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let (app, req) = (app.clone(), req.clone());
            tokio::spawn(async move { post(&app, "/v1/completions", req).await })
        })
        .collect();
    for t in tasks {
        let (status, body) = t.await.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["choices"][0]["text"], content);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_chat_turn_reuses_the_cached_prefix() {
    let app = app(1);
    let turn1 = json!([{"role": "user", "content": "Tell me a story."}]);
    let (status, body) = post(
        &app,
        "/v1/chat/completions",
        json!({"messages": turn1, "max_tokens": 20, "temperature": 0}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let reply = body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let prompt1 = body["usage"]["prompt_tokens"].as_u64().unwrap();
    let turn2 = json!([
        {"role": "user", "content": "Tell me a story."},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "Another one."}
    ]);
    let (_, body) = post(
        &app,
        "/v1/chat/completions",
        json!({"messages": turn2, "max_tokens": 5, "temperature": 0}),
    )
    .await;
    let cached = body["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached >= prompt1,
        "cached {cached} of the first prompt's {prompt1} tokens"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_schema_output_is_valid_json_of_the_schema() {
    let app = app(2);
    let schema = json!({
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 10}, "age": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["name", "age"],
        "additionalProperties": false
    });
    for seed in 0..3 {
        let req = json!({
            "messages": [{"role": "user", "content": "Who?"}], "max_tokens": 120, "seed": seed, "temperature": 1.0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}
        });
        let (status, body) = post(&app, "/v1/chat/completions", req).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["choices"][0]["finish_reason"], "stop", "{body}");
        let text = body["choices"][0]["message"]["content"].as_str().unwrap();
        let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["name", "age"], "{text}");
        assert!(v["name"].as_str().unwrap().chars().count() <= 10);
        assert!((0..=99).contains(&v["age"].as_i64().unwrap()));
    }
    let bad = json!({"messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "no-such-type"}}}});
    assert_eq!(
        post(&app, "/v1/chat/completions", bad).await.0,
        StatusCode::BAD_REQUEST
    );
}

/// Random text (special-token look-alikes, odd Unicode, control bytes, bad escapes) through
/// every route that tokenizes or detokenizes: always a 200 or a 4xx, never a 5xx or a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_text_through_the_tokenizer_paths_never_fails_the_server() {
    let app = app(2);
    let pool = [
        "<s>",
        "</s>",
        "<unk>",
        "<|im_start|>",
        "<|im_end|>",
        "<0x0A>",
        "▁",
        " ",
        "\n",
        "\t",
        "\u{0}",
        "\u{7f}",
        "é",
        "☃",
        "🦀",
        "\u{fffd}",
        "\u{202e}",
        "Once",
        " upon",
        "{",
        "}",
        "\"",
        "\\",
        "{%",
        "{{",
        "}}",
        "%}",
        "ab",
    ];
    let mut state = 0x2545f4914f6cdd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for i in 0..60 {
        let n = (next() % 40) as usize;
        let text: String = (0..n)
            .map(|_| pool[(next() % pool.len() as u64) as usize])
            .collect();
        let ids: Vec<i64> = (0..(next() % 12))
            .map(|_| (next() % 700) as i64 - 50)
            .collect();
        let bodies = [
            (
                "/tokenize",
                json!({"content": text, "add_special": i % 2 == 0, "with_pieces": i % 3 == 0}),
            ),
            ("/detokenize", json!({"tokens": ids})),
            ("/v1/completions", json!({"prompt": text, "max_tokens": 1})),
            ("/v1/completions", json!({"prompt": ids, "max_tokens": 1})),
            (
                "/v1/chat/completions",
                json!({"messages": [{"role": "user", "content": text}], "max_tokens": 1}),
            ),
            (
                "/v1/chat/completions",
                json!({"messages": [{"role": "system", "content": text}, {"role": "user", "content": text}], "max_tokens": 2, "stop": [text.clone()]}),
            ),
        ];
        for (path, body) in bodies {
            let (status, reply) = post(&app, path, body.clone()).await;
            assert!(
                status.is_success() || status.is_client_error(),
                "{path} {body} -> {status} {reply}"
            );
        }
    }
    // Bodies that are not valid JSON text at all (lone surrogate escape, truncated, bytes).
    for raw in [
        &b"{\"content\": \"\\ud800\"}"[..],
        b"{\"content\": \"abc",
        b"\xff\xfe\x00",
        b"",
    ] {
        let req = Request::builder()
            .method("POST")
            .uri("/tokenize")
            .header("content-type", "application/json")
            .body(Body::from(raw.to_vec()))
            .unwrap();
        let status = app.clone().oneshot(req).await.unwrap().status();
        assert_eq!(status, StatusCode::BAD_REQUEST, "{raw:?}");
    }
}
