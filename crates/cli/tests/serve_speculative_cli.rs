//! `redline serve --md`: flag combinations that cannot work are refused before anything is
//! loaded (with what to do), and a served model drafted by itself answers like the plain
//! server, reports `draft_n` / `draft_n_accepted` and logs acceptance per request (CPU).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

fn redline(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_redline"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn md_with_mtp_and_bad_draft_limits_are_refused_before_loading() {
    // A model path that does not exist: the refusal must come before any load.
    let missing = "/nonexistent/model.gguf";
    let stories = format!("{ROOT}/models/stories260K.gguf");
    for cmd in ["run", "serve", "verify-bench"] {
        let mut args = vec![cmd, "-m", missing, "--md", &stories, "--mtp"];
        if cmd == "run" {
            args.extend(["-p", "a"]);
        }
        let out = redline(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{cmd}");
        assert!(
            err.contains("--mtp and --md") && err.contains("give one of them"),
            "{cmd}: {err}"
        );
        assert!(!err.contains("nonexistent"), "{cmd} loaded first: {err}");
    }
    let cases: [(&[&str], &str); 4] = [
        (&["--md", "/nonexistent/draft.gguf"], "no such file"),
        (&["--md", &stories, "--draft-max", "0"], "--draft-max 0"),
        (
            &["--md", &stories, "--draft-min", "5", "--draft-max", "2"],
            "--draft-min 5 is above --draft-max 2",
        ),
        (
            &["--md", &stories, "--draft-p-min", "1.5"],
            "not a probability",
        ),
    ];
    for (extra, want) in cases {
        let mut args = vec!["serve", "-m", missing, "--port", "18099"];
        args.extend_from_slice(extra);
        let out = redline(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(err.contains(want), "{extra:?}: {err}");
    }
    // serve --mtp on a model without an MTP layer: refused at planning, before serving.
    let port = free_port().to_string();
    let out = redline(&["serve", "-m", &stories, "--mtp", "--port", &port]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("multi-token-prediction"), "{err}");
    // run --md without -p (chat mode) is refused before loading.
    let out = redline(&["run", "-m", missing, "--md", &stories]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("needs a prompt"), "{err}");
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One HTTP/1.1 request (`Connection: close`); (status, body). Non-streamed bodies only.
fn http(port: u16, method: &str, path: &str, body: Option<&Value>) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    let body = body.map(Value::to_string).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let (head, rest) = raw.split_once("\r\n\r\n")?;
    Some((head.split(' ').nth(1)?.parse().ok()?, rest.to_string()))
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(extra: &[&str]) -> (Server, u16) {
    let port = free_port();
    let stories = format!("{ROOT}/models/stories260K.gguf");
    let p = port.to_string();
    let mut args = vec![
        "serve",
        "-m",
        &stories,
        "--port",
        &p,
        "--device",
        "cpu",
        "--parallel",
        "2",
    ];
    args.extend_from_slice(extra);
    let child = Command::new(env!("CARGO_BIN_EXE_redline"))
        .args(&args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let server = Server(child);
    let t0 = Instant::now();
    loop {
        if let Some((200, _)) = http(port, "GET", "/health", None) {
            return (server, port);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "server did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn serve_with_a_self_draft_answers_like_plain_and_logs_acceptance() {
    let stories = format!("{ROOT}/models/stories260K.gguf");
    let req = json!({"prompt": "Once upon a time", "max_tokens": 48, "temperature": 0});
    let ask = |port| {
        let (status, body) = http(port, "POST", "/v1/completions", Some(&req)).unwrap();
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<Value>(&body).unwrap()
    };
    let (plain, port) = serve(&[]);
    let want = ask(port);
    drop(plain);
    let (mut spec, port) = serve(&["--md", &stories, "--draft-max", "4", "--draft-p-min", "0"]);
    let got = ask(port);
    assert_eq!(got["choices"][0]["text"], want["choices"][0]["text"]);
    let t = &got["timings"];
    assert!(t["draft_n"].as_u64().unwrap() > 20, "{t}");
    assert_eq!(t["draft_n_accepted"], t["draft_n"]);
    let _ = spec.0.kill();
    let mut log = String::new();
    spec.0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    spec.0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    assert!(log.contains("speculative decoding per slot"), "{log}");
    let line = log
        .lines()
        .find(|l| l.contains("POST /v1/completions 200"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(
        line.contains("spec=") && line.contains("(100.0%)"),
        "{line}"
    );
}
