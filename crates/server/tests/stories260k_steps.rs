//! The server over the real bundled model, checked against the model itself:
//! a long prompt prefilled in chunks beside a running stream changes neither output, and
//! `logprobs` / `top_logprobs` are the full-vocabulary log-softmax of the raw logits.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use engine::Tokenizer;
use http_body_util::BodyExt;
use model::{KvType, LoadOptions, Model};
use serde_json::{json, Value};
use server::{AppState, ModelService, ModelServiceOptions, ServerConfig};
use tower::ServiceExt;

fn data(rel: &str) -> String {
    format!("{}/../../{rel}", env!("CARGO_MANIFEST_DIR"))
}

fn load() -> Model {
    Model::load(
        data("models/stories260K.gguf").as_ref(),
        &LoadOptions::default(),
    )
    .unwrap()
}

fn app(n_slots: usize, prefill_chunk: usize) -> axum::Router {
    let opts = ModelServiceOptions {
        id: "stories260K".into(),
        n_slots,
        n_ctx_per_slot: 320,
        kv_type: KvType::F32,
        max_queue: 16,
        prefill_chunk,
        chat_template: None,
    };
    let service = ModelService::new(Arc::new(load()), opts).unwrap();
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

fn completion(prompt: &str, max_tokens: usize) -> Value {
    json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_prompt_beside_a_running_stream_equals_sequential_runs() {
    let short = "Once upon a time";
    let long = "Lily and Ben went to the park to play with the big red ball. ".repeat(12);
    // Sequential: one slot, one request at a time, the whole prompt in one step.
    let alone = app(1, 512);
    let (s1, b1) = post(&alone, "/v1/completions", completion(&long, 24)).await;
    assert_eq!(s1, StatusCode::OK, "{b1}");
    let n_long = b1["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(n_long > 100, "{n_long} prompt tokens");

    // Together: the long prompt joins while the short one streams, 5 prompt tokens a step.
    let together = app(2, 5);
    let mut stream_req = completion(short, 300);
    stream_req["stream"] = json!(true);
    let req = Request::builder()
        .method("POST")
        .uri("/v1/completions")
        .header("content-type", "application/json")
        .body(Body::from(stream_req.to_string()))
        .unwrap();
    let resp = together.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let mut sse = Vec::new();
    // Wait for the first generated text, so the long prompt arrives mid-stream.
    while !String::from_utf8_lossy(&sse).contains("\"text\"") {
        let frame = body.frame().await.unwrap().unwrap();
        sse.extend_from_slice(frame.data_ref().unwrap());
    }
    let (s2, b2) = post(&together, "/v1/completions", completion(&long, 24)).await;
    assert_eq!(s2, StatusCode::OK, "{b2}");
    assert_eq!(b2["choices"][0]["text"], b1["choices"][0]["text"]);
    // The short request was still streaming when the long one (prefill + 24 tokens) ended.
    let (_, _, metrics) = get(&together, "/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("redline_slots_busy") && l.ends_with(" 1")),
        "{metrics}"
    );
    sse.extend_from_slice(&body.collect().await.unwrap().to_bytes());
    let text: String = String::from_utf8_lossy(&sse)
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_string))
        .collect();
    let (s3, a1) = post(&alone, "/v1/completions", completion(short, 300)).await;
    assert_eq!(s3, StatusCode::OK, "{a1}");
    assert_eq!(text, a1["choices"][0]["text"].as_str().unwrap());
}

async fn get(app: &axum::Router, path: &str) -> (StatusCode, (), String) {
    let req = Request::builder().uri(path).body(Body::empty()).unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, (), String::from_utf8_lossy(&bytes).into_owned())
}

/// log-softmax in f64 over the whole vocabulary.
fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let z: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    logits.iter().map(|&l| l as f64 - max - z.ln()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_are_the_log_softmax_of_the_raw_logits() {
    let prompt = "Once upon a time, there was a";
    let n = 12;
    // top_k 2 and min_p filter the sampler's candidates; greedy picks the same token, and
    // the reported numbers must still come from the unfiltered distribution (top 5 > top_k).
    let req = json!({"prompt": prompt, "max_tokens": n, "temperature": 0, "top_k": 2,
        "min_p": 0.3, "logprobs": 5});
    let app = app(1, 4);
    let (status, body) = post(&app, "/v1/completions", req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let lp = &body["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    let chosen = lp["token_logprobs"].as_array().unwrap();
    let tops = lp["top_logprobs"].as_array().unwrap();
    assert_eq!((tokens.len(), chosen.len(), tops.len()), (n, n, n));

    // The same steps run directly on the model.
    let model = load();
    let tok = Tokenizer::from_gguf(model.gguf().metadata()).unwrap();
    let mut state = model.new_state(320, KvType::F32).unwrap();
    let mut ids = tok.encode(prompt, true, true).unwrap();
    assert_eq!(body["usage"]["prompt_tokens"], ids.len());
    let mut feed = ids.clone();
    for i in 0..n {
        let logits = model.forward(&mut state, &feed, false).unwrap();
        let lsm = log_softmax(&logits);
        let mut order: Vec<usize> = (0..lsm.len()).collect();
        order.sort_by(|&a, &b| lsm[b].total_cmp(&lsm[a]).then(a.cmp(&b)));
        let best = order[0] as u32;
        let piece = String::from_utf8_lossy(&tok.piece(best, false)).into_owned();
        assert_eq!(tokens[i], piece, "step {i}");
        let got = chosen[i].as_f64().unwrap();
        assert!(
            (got - lsm[best as usize]).abs() < 1e-4,
            "step {i}: {got} vs {}",
            lsm[best as usize]
        );
        // The five best, by value (the map is keyed by piece text).
        let mut got_top: Vec<f64> = tops[i]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_f64().unwrap())
            .collect();
        got_top.sort_by(|a, b| b.total_cmp(a));
        let want: Vec<f64> = order[..5].iter().map(|&j| lsm[j]).collect();
        assert_eq!(got_top.len(), 5, "step {i}: {:?}", tops[i]);
        for (g, w) in got_top.iter().zip(&want) {
            assert!(
                (g - w).abs() < 1e-4,
                "step {i}: top {got_top:?} vs {want:?}"
            );
        }
        for &j in &order[..5] {
            let p = String::from_utf8_lossy(&tok.piece(j as u32, false)).into_owned();
            assert!(
                tops[i].get(&p).is_some(),
                "step {i}: {p:?} missing from {:?}",
                tops[i]
            );
        }
        ids.push(best);
        feed = vec![best];
    }
}
