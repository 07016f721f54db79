//! Speculative decoding per slot through the real HTTP server (a TCP socket, `server::serve`),
//! on the CPU: greedy output with speculation equals output without it — stories260K drafted
//! by itself (every draft kept) and the hybrid Qwen3.5 fixture (Gated DeltaNet layers: the
//! recurrent state rolls back) drafted by its Q8_0 copy (some drafts rejected) — for several
//! concurrent requests whose verify passes share steps with each other and with prompt
//! chunks; logprobs, stop strings and streaming give the same answers; sampled requests run
//! and report their acceptance.

use std::sync::Arc;
use std::time::Duration;

use model::{KvType, LoadOptions, Model};
use serde_json::{json, Value};
use server::{
    AppState, DraftOptions, ModelService, ModelServiceOptions, ServerConfig, SlotDrafter,
};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn data(rel: &str) -> String {
    format!("{}/../../{rel}", env!("CARGO_MANIFEST_DIR"))
}

fn load(rel: &str) -> Arc<Model> {
    Arc::new(Model::load(data(rel).as_ref(), &LoadOptions::default()).unwrap())
}

/// A server on an ephemeral port; dropping `stop` shuts it down.
struct Running {
    addr: std::net::SocketAddr,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start(service: ModelService) -> Running {
    let state = AppState::new(ServerConfig::default());
    state.set_service(Arc::new(service));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server::serve(
        listener,
        state,
        async move {
            let _ = rx.await;
        },
        Duration::from_secs(1),
    ));
    Running { addr, _stop: tx }
}

fn service(
    target: &str,
    draft: Option<(&str, usize)>,
    n_slots: usize,
    prefill_chunk: usize,
) -> ModelService {
    let opts = ModelServiceOptions {
        id: "m".into(),
        n_slots,
        n_ctx_per_slot: 256,
        kv_type: KvType::F32,
        max_queue: 16,
        prefill_chunk,
        chat_template: None,
    };
    let draft = draft.map(|(path, draft_max)| DraftOptions {
        drafter: SlotDrafter::Model(load(path)),
        kv_type: KvType::F32,
        spec: engine::speculative::SpecOptions {
            draft_max,
            draft_min: 0,
            p_min: 0.0,
        },
    });
    ModelService::with_drafter(load(target), draft, opts).unwrap()
}

/// One HTTP/1.1 POST over a fresh connection; the body, de-chunked.
async fn post_raw(addr: std::net::SocketAddr, path: &str, body: &Value) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let body = body.to_string();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let raw = String::from_utf8(raw).unwrap();
    let (head, rest) = raw.split_once("\r\n\r\n").unwrap();
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    if !chunked {
        return (status, rest.to_string());
    }
    let mut out = String::new();
    let mut rest = rest;
    loop {
        let (size, tail) = rest.split_once("\r\n").unwrap();
        let n = usize::from_str_radix(size.trim(), 16).unwrap();
        if n == 0 {
            break;
        }
        out.push_str(&tail[..n]);
        rest = &tail[n + 2..];
    }
    (status, out)
}

async fn post(addr: std::net::SocketAddr, path: &str, body: Value) -> Value {
    let (status, text) = post_raw(addr, path, &body).await;
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

/// The same requests sent to a server at once (so their steps are batched together).
async fn all_at_once(addr: std::net::SocketAddr, bodies: &[Value]) -> Vec<Value> {
    let tasks: Vec<_> = bodies
        .iter()
        .map(|b| tokio::spawn(post(addr, "/v1/completions", b.clone())))
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// (drafted, accepted) summed over responses.
fn acceptance(bodies: &[Value]) -> (u64, u64) {
    bodies.iter().fold((0, 0), |(d, a), b| {
        (
            d + b["timings"]["draft_n"]
                .as_u64()
                .expect("draft_n in timings"),
            a + b["timings"]["draft_n_accepted"].as_u64().unwrap(),
        )
    })
}

fn texts(bodies: &[Value]) -> Vec<(String, String)> {
    bodies
        .iter()
        .map(|b| {
            (
                b["choices"][0]["text"].as_str().unwrap().to_string(),
                b["choices"][0]["finish_reason"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        })
        .collect()
}

const STORIES: &str = "models/stories260K.gguf";

fn story_requests() -> Vec<Value> {
    [
        "Once upon a time",
        "The little dog",
        "Lily and Tom went to the park. They",
        "One day, a big",
    ]
    .iter()
    .enumerate()
    .map(|(i, p)| json!({"prompt": p, "max_tokens": 30 + 7 * i, "temperature": 0}))
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stories_drafted_by_itself_equals_plain_greedy_over_http() {
    let plain = start(service(STORIES, None, 3, 4)).await;
    let spec = start(service(STORIES, Some((STORIES, 4)), 3, 4)).await;
    let reqs = story_requests();
    let want = all_at_once(plain.addr, &reqs).await;
    let got = all_at_once(spec.addr, &reqs).await;
    assert_eq!(texts(&got), texts(&want));
    assert!(want[0]["timings"].get("draft_n").is_none());
    let (drafted, accepted) = acceptance(&got);
    assert!(drafted > 40, "{drafted}");
    assert_eq!(
        accepted, drafted,
        "a model drafting for itself is always right"
    );

    // Log-probabilities of every token (each from its own verify row), stop strings and
    // streaming: the same answers as without speculation.
    let lp =
        json!({"prompt": "Once upon a time", "max_tokens": 20, "temperature": 0, "logprobs": 3});
    let (a, b) = (
        post(plain.addr, "/v1/completions", lp.clone()).await,
        post(spec.addr, "/v1/completions", lp).await,
    );
    let (la, lb) = (&a["choices"][0]["logprobs"], &b["choices"][0]["logprobs"]);
    assert_eq!(la["tokens"], lb["tokens"]);
    let close = |x: &Value, y: &Value| (x.as_f64().unwrap() - y.as_f64().unwrap()).abs() < 1e-4;
    for (x, y) in la["token_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .zip(lb["token_logprobs"].as_array().unwrap())
    {
        assert!(close(x, y), "{x} vs {y}");
    }
    for (x, y) in la["top_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .zip(lb["top_logprobs"].as_array().unwrap())
    {
        let (x, y) = (x.as_object().unwrap(), y.as_object().unwrap());
        assert_eq!(x.keys().collect::<Vec<_>>(), y.keys().collect::<Vec<_>>());
        assert!(x.iter().all(|(k, v)| close(v, &y[k])));
    }

    let stop =
        json!({"prompt": "Once upon a time", "max_tokens": 60, "temperature": 0, "stop": ["."]});
    let (a, b) = (
        post(plain.addr, "/v1/completions", stop.clone()).await,
        post(spec.addr, "/v1/completions", stop).await,
    );
    assert_eq!(texts(&[b]), texts(std::slice::from_ref(&a)));
    assert_eq!(a["choices"][0]["finish_reason"], "stop");

    let stream =
        json!({"prompt": "The little dog", "max_tokens": 37, "temperature": 0, "stream": true});
    let (_, sse) = post_raw(spec.addr, "/v1/completions", &stream).await;
    let streamed: String = sse
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| {
            let v: Value = serde_json::from_str(d).unwrap();
            v["choices"][0]["text"].as_str().unwrap_or("").to_string()
        })
        .collect();
    assert_eq!(streamed, texts(&want[1..2])[0].0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_fixture_drafted_by_its_q8_copy_equals_plain_greedy_over_http() {
    let target = "tests/data/fixtures/qwen35/model-f32.gguf";
    let draft = "tests/data/fixtures/qwen35/model-q8_0.gguf";
    let plain = start(service(target, None, 2, 5)).await;
    let spec = start(service(target, Some((draft, 5)), 2, 5)).await;
    let reqs: Vec<Value> = ["Hello world", "a b c d e f", "The quick brown fox"]
        .iter()
        .map(|p| json!({"prompt": p, "max_tokens": 40, "temperature": 0, "ignore_eos": true}))
        .collect();
    let want = all_at_once(plain.addr, &reqs).await;
    let got = all_at_once(spec.addr, &reqs).await;
    assert_eq!(texts(&got), texts(&want));
    let (drafted, accepted) = acceptance(&got);
    assert!(drafted > 0 && accepted < drafted, "{accepted}/{drafted}");
    assert!(accepted > 0, "{accepted}/{drafted}");
    // A second round on the same server (slots reused, prefixes restored from snapshots).
    let again = all_at_once(spec.addr, &reqs).await;
    assert_eq!(texts(&again), texts(&want));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampled_requests_with_a_seed_repeat_and_report_acceptance() {
    let spec = start(service(STORIES, Some(("models/stories260K.gguf", 4)), 2, 8)).await;
    let req = json!({"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0.8,
        "top_k": 40, "seed": 11});
    let a = post(spec.addr, "/v1/completions", req.clone()).await;
    let b = post(spec.addr, "/v1/completions", req).await;
    assert_eq!(texts(std::slice::from_ref(&a)), texts(&[b]));
    assert_eq!(a["usage"]["completion_tokens"], 40);
    let (drafted, accepted) = acceptance(&[a]);
    // The drafter is the target: p == q, so every draft is kept.
    assert!(drafted > 0);
    assert_eq!(accepted, drafted);
}

/// The Qwen3.5 fixture plus one MTP block (`blk.4`: a copy of attention layer 3 and
/// seeded-random `nextn.*` tensors), written with the GGUF writer. Random MTP weights give
/// (near) zero acceptance: this checks the plumbing, not the drafts' quality.
fn mtp_fixture() -> std::path::PathBuf {
    use gguf::{GgmlType, GgufFile, GgufWriter, Value};
    let src = GgufFile::open(data("tests/data/fixtures/qwen35/model-f32.gguf")).unwrap();
    let out = std::env::temp_dir().join(format!("redline-serve-mtp-{}.gguf", std::process::id()));
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata().iter() {
        let v = match k {
            "qwen35.block_count" => Value::U32(5),
            _ => v.clone(),
        };
        w.set_metadata(k, v);
    }
    w.set_metadata("qwen35.nextn_predict_layers", Value::U32(1));
    let e = 256u64;
    // (name, dims, data) of every tensor, in order.
    let mut tensors: Vec<(String, Vec<u64>, Vec<u8>)> = src
        .tensors()
        .iter()
        .map(|t| (t.name.clone(), t.dims.clone(), src.tensor_data(t).to_vec()))
        .collect();
    for t in src
        .tensors()
        .iter()
        .filter(|t| t.name.starts_with("blk.3."))
    {
        let name = t.name.replacen("blk.3.", "blk.4.", 1);
        tensors.push((name, t.dims.clone(), src.tensor_data(t).to_vec()));
    }
    let mut seed = 0x5eed_u64;
    let mut rand = |n: u64, scale: f32, offset: f32| -> Vec<u8> {
        (0..n)
            .flat_map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = (seed >> 40) as f32 / (1u64 << 24) as f32;
                (offset + scale * (2.0 * u - 1.0)).to_le_bytes()
            })
            .collect()
    };
    tensors.push((
        "blk.4.nextn.eh_proj.weight".into(),
        vec![2 * e, e],
        rand(2 * e * e, 0.08, 0.0),
    ));
    for n in ["enorm", "hnorm", "shared_head_norm"] {
        tensors.push((
            format!("blk.4.nextn.{n}.weight"),
            vec![e],
            rand(e, 0.1, 1.0),
        ));
    }
    for (name, dims, _) in &tensors {
        w.add_tensor(name, dims, GgmlType::F32).unwrap();
    }
    let file = std::fs::File::create(&out).unwrap();
    w.write(std::io::BufWriter::new(file), |i, _, out| {
        std::io::Write::write_all(out, &tensors[i].2)
    })
    .unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtp_drafting_equals_plain_greedy_over_http() {
    let path = mtp_fixture();
    let target = Arc::new(Model::load(&path, &LoadOptions::default()).unwrap());
    assert!(target.load_mtp().unwrap(), "the fixture has an MTP block");
    let opts = |n_slots| ModelServiceOptions {
        id: "m".into(),
        n_slots,
        n_ctx_per_slot: 256,
        kv_type: KvType::F32,
        max_queue: 16,
        prefill_chunk: 5,
        chat_template: None,
    };
    let plain = start(ModelService::new(target.clone(), opts(2)).unwrap()).await;
    let draft = DraftOptions {
        drafter: SlotDrafter::Mtp,
        kv_type: KvType::F32,
        spec: engine::speculative::SpecOptions {
            draft_max: 3,
            draft_min: 0,
            p_min: 0.0,
        },
    };
    let spec = start(ModelService::with_drafter(target, Some(draft), opts(2)).unwrap()).await;
    let _ = std::fs::remove_file(&path);
    let reqs: Vec<Value> = ["Hello world", "a b c d e f", "The quick brown fox"]
        .iter()
        .map(|p| json!({"prompt": p, "max_tokens": 40, "temperature": 0, "ignore_eos": true}))
        .collect();
    let want = all_at_once(plain.addr, &reqs).await;
    let got = all_at_once(spec.addr, &reqs).await;
    assert_eq!(texts(&got), texts(&want));
    let (drafted, _) = acceptance(&got);
    assert!(drafted > 0);
    // Slots reused at their checkpoints (the MTP hidden state kept with each) still agree.
    let again = all_at_once(spec.addr, &reqs).await;
    assert_eq!(texts(&again), texts(&want));
    // A sampled request runs (rejection sampling against the MTP's distribution).
    let sampled = json!({"prompt": "Hello world", "max_tokens": 30, "temperature": 1.0, "seed": 3});
    let b = post(spec.addr, "/v1/completions", sampled).await;
    assert_eq!(b["usage"]["completion_tokens"], 30);
}

/// The slot drafter's MTP drafts equal the one-sequence drafter's (`MtpSpec`, checked against
/// an offline MTP pass in crates/convert/tests/mtp_speculative.rs) step for step, for two
/// slots batched together with different prompts and partial accepts.
#[test]
fn slot_mtp_drafts_equal_the_single_sequence_drafter() {
    use engine::scheduler::BatchModel;
    use engine::speculative::{MtpSpec, SpecBatch, SpecModel, SpecOptions};
    let path = mtp_fixture();
    let m = Arc::new(Model::load(&path, &LoadOptions::default()).unwrap());
    let _ = std::fs::remove_file(&path);
    assert!(m.load_mtp().unwrap());
    let n_vocab = m.config().n_vocab;
    let batch = SpecBatch::new(
        m.clone(),
        SlotDrafter::Mtp,
        KvType::F32,
        KvType::F32,
        n_vocab,
        SpecOptions::default(),
    )
    .unwrap();
    let prompts: [&[u32]; 2] = [&[1, 17, 99, 4, 250], &[3, 8, 40]];
    let mut slots: Vec<_> = prompts
        .iter()
        .map(|_| batch.new_state(128).unwrap())
        .collect();
    let mut refs: Vec<MtpSpec<'_, _>> = prompts
        .iter()
        .map(|_| MtpSpec::new(&m, m.new_state(128, KvType::F32).unwrap(), KvType::F32).unwrap())
        .collect();
    {
        let mut st: Vec<&mut _> = slots.iter_mut().collect();
        batch.forward_multi(&mut st, &prompts).unwrap();
    }
    for (r, p) in refs.iter_mut().zip(prompts) {
        r.prefill(p).unwrap();
    }
    let max_diff = |a: &[f32], b: &[f32]| {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max)
    };
    let mut last = [7u32, 9];
    for step in 0..6 {
        // 3 draft steps per slot, fed fixed tokens (the drafts' identity does not matter).
        let mut fed: Vec<Vec<u32>> = last.iter().map(|&t| vec![t]).collect();
        for j in 0..3 {
            let toks: Vec<u32> = fed.iter().map(|f| f[j]).collect();
            let got = {
                let mut st: Vec<&mut _> = slots.iter_mut().collect();
                batch.draft_step(&mut st, &toks).unwrap()
            };
            for (i, r) in refs.iter_mut().enumerate() {
                let want = r.draft_step(toks[i]).unwrap();
                let d = max_diff(&got[i * n_vocab..(i + 1) * n_vocab], &want);
                assert!(d < 1e-4, "step {step} draft {j} slot {i}: {d}");
                fed[i].push((toks[i] * 31 + 5 + j as u32) % n_vocab as u32);
            }
        }
        let verify: Vec<&[u32]> = fed.iter().map(|f| &f[..3]).collect();
        {
            let mut st: Vec<&mut _> = slots.iter_mut().collect();
            batch
                .forward_verify(&mut st, &verify, &[true, true])
                .unwrap();
        }
        // Keep 1, 2 or all 3 verify tokens, differently per slot.
        let keep = [1 + step % 3, 1 + (step + 1) % 3];
        for (i, r) in refs.iter_mut().enumerate() {
            r.verify(verify[i]).unwrap();
            r.accept(keep[i]).unwrap();
        }
        {
            let mut st: Vec<&mut _> = slots.iter_mut().collect();
            batch.settle(&mut st, &keep).unwrap();
        }
        for i in 0..2 {
            last[i] = (verify[i][keep[i] - 1] * 7 + 3) % n_vocab as u32;
            assert_eq!(batch.state_len(&slots[i]), refs[i].target_len());
        }
    }
}
