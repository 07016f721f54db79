//! `<think>` blocks of reasoning templates (no tools): whole responses and streams.

use std::time::Duration;

use axum::http::StatusCode;
use axum::Router;
use serde_json::{json, Value};

use super::{app_with, greedy_config, post, send, sse_data, user};
use crate::fake_service::FakeService;

/// Streams a chat request and returns the concatenated (reasoning_content, content).
async fn streamed_fields(app: &Router, mut req: Value) -> (String, String) {
    req["stream"] = json!(true);
    let (_, _, sse) = send(app, "POST", "/v1/chat/completions", Some(req), None).await;
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
    (field("reasoning_content"), field("content"))
}

#[tokio::test]
async fn reasoning_template_splits_think_without_tools_whole_and_streamed() {
    const REPLY: &str = "<think>\nThe user greets.\n</think>\n\nHello there!";
    // "user: hi\nassistant: " is 20 bytes; the byte model continues the script from there.
    let script: &'static str = format!("{}{REPLY}", ".".repeat(20)).leak();
    let service = FakeService::with_reasoning_script(script.as_bytes(), 20 + REPLY.len(), "");
    let app = app_with(greedy_config(), Some(service));
    let req = json!({"messages": user("hi")});
    let (status, whole) = post(&app, "/v1/chat/completions", req.clone()).await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    let message = &whole["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], "The user greets.", "{whole}");
    assert_eq!(message["content"], "Hello there!");
    assert_eq!(whole["choices"][0]["finish_reason"], "stop");
    let (reasoning, content) = streamed_fields(&app, req).await;
    assert_eq!(reasoning.trim_end(), "The user greets.");
    assert_eq!(content, "Hello there!");

    // Cut off inside the block: all of it is reasoning, whole and streamed.
    let cut = json!({"messages": user("hi"), "max_tokens": 13}); // "<think>\nThe u"
    let (_, whole) = post(&app, "/v1/chat/completions", cut.clone()).await;
    assert_eq!(whole["choices"][0]["message"]["reasoning_content"], "The u");
    assert_eq!(whole["choices"][0]["message"]["content"], "");
    assert_eq!(
        streamed_fields(&app, cut).await,
        ("The u".into(), String::new())
    );

    // Logprobs still come with every token of a split stream.
    let (_, _, sse) = send(
        &app,
        "POST",
        "/v1/chat/completions",
        Some(json!({"messages": user("hi"), "stream": true, "logprobs": true})),
        None,
    )
    .await;
    let n_logprobs: usize = sse_data(&sse)
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|c| {
            c["choices"][0]["logprobs"]["content"]
                .as_array()
                .map(Vec::len)
        })
        .sum();
    assert_eq!(n_logprobs, REPLY.len());

    // A JSON response_format is read as plain text (no reasoning split).
    let json_req = json!({"messages": user("hi"), "response_format": {"type": "json_object"}});
    let (_, whole) = post(&app, "/v1/chat/completions", json_req).await;
    assert!(
        whole["choices"][0]["message"]["reasoning_content"].is_null(),
        "{whole}"
    );
}

#[tokio::test]
async fn reasoning_block_opened_by_the_prompt_is_reasoning_content() {
    // The template wrote "<think>\n" after the assistant header (QwQ, DeepSeek-R1 style).
    const REPLY: &str = "Short thought.\n</think>\n\nHi!";
    let script: &'static str = format!("{}{REPLY}", ".".repeat(28)).leak();
    let service =
        FakeService::with_reasoning_script(script.as_bytes(), 28 + REPLY.len(), "<think>\n");
    let app = app_with(greedy_config(), Some(service));
    let req = json!({"messages": user("hi")});
    let (_, whole) = post(&app, "/v1/chat/completions", req.clone()).await;
    let message = &whole["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], "Short thought.", "{whole}");
    assert_eq!(message["content"], "Hi!");
    let (reasoning, content) = streamed_fields(&app, req).await;
    assert_eq!(reasoning.trim_end(), "Short thought.");
    assert_eq!(content, "Hi!");
}

#[tokio::test]
async fn templates_without_think_leave_the_text_alone() {
    const REPLY: &str = "<think>x</think>y";
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
    let (_, whole) = post(
        &app,
        "/v1/chat/completions",
        json!({"messages": user("hi")}),
    )
    .await;
    assert_eq!(whole["choices"][0]["message"]["content"], REPLY);
    assert!(whole["choices"][0]["message"]["reasoning_content"].is_null());
}
