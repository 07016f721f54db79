//! Every chat template in tests/data/templates × every conversation in cases.json, against
//! the renderings Jinja2 produced as transformers does (scripts/gen_template_expected.py):
//! byte-for-byte equal text, or an error where Jinja2 raised one.

use engine::ChatTemplate;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/templates");

#[test]
fn templates_match_jinja2_renderings() {
    let spec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{DIR}/cases.json")).unwrap())
            .unwrap();
    let now =
        chrono::NaiveDateTime::parse_from_str(spec["now"].as_str().unwrap(), "%Y-%m-%dT%H:%M:%S")
            .unwrap();
    let mut names: Vec<String> = std::fs::read_dir(DIR)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".jinja").map(str::to_owned)
        })
        .collect();
    names.sort();
    assert!(names.len() >= 9, "templates found: {names:?}");

    let mut failures = Vec::new();
    let mut n_checked = 0;
    for name in &names {
        let source = std::fs::read_to_string(format!("{DIR}/{name}.jinja")).unwrap();
        let special = &spec["special_tokens"][name];
        let template = ChatTemplate::new(&source)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .with_special_tokens(special["bos_token"].as_str(), special["eos_token"].as_str())
            .with_now(now);
        for case in spec["cases"].as_array().unwrap() {
            let case_name = case["name"].as_str().unwrap();
            let messages = case["messages"].as_array().unwrap();
            let tools = case
                .get("tools")
                .and_then(|t| t.as_array())
                .map(|t| t.as_slice());
            let extra = case
                .get("extra")
                .and_then(|e| e.as_object())
                .cloned()
                .unwrap_or_default();
            let agp = case["add_generation_prompt"].as_bool().unwrap();
            let got = template.render(messages, tools, agp, &extra);
            let base = format!("{DIR}/expected/{name}/{case_name}");
            n_checked += 1;
            match (std::fs::read(format!("{base}.txt")), got) {
                (Ok(want), Ok(got)) => {
                    if want != got.as_bytes() {
                        let want = String::from_utf8_lossy(&want);
                        let at = want
                            .chars()
                            .zip(got.chars())
                            .take_while(|(a, b)| a == b)
                            .count();
                        failures.push(format!(
                            "{name}/{case_name}: differs at char {at}\n--- want\n{want}\n--- got\n{got}\n"
                        ));
                    }
                }
                (Ok(_), Err(e)) => {
                    failures.push(format!("{name}/{case_name}: Jinja2 renders, we fail: {e}"))
                }
                (Err(_), Ok(got)) => {
                    let msg = std::fs::read_to_string(format!("{base}.error"))
                        .unwrap_or_else(|_| panic!("{base}: neither .txt nor .error"));
                    failures.push(format!(
                        "{name}/{case_name}: Jinja2 raised {msg:?}, we rendered:\n{got}"
                    ));
                }
                (Err(_), Err(_)) => {
                    assert!(
                        std::path::Path::new(&format!("{base}.error")).exists(),
                        "{base}.error missing"
                    );
                }
            }
        }
    }
    assert!(n_checked >= 150, "only {n_checked} renderings checked");
    assert!(
        failures.is_empty(),
        "{} of {n_checked} differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn template_from_fixture_gguf() {
    let file = gguf::GgufFile::open(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/data/fixtures/qwen2/model-f32.gguf"
    ))
    .unwrap();
    let t = ChatTemplate::from_gguf(file.metadata())
        .unwrap()
        .expect("fixture has a template");
    let msgs = vec![serde_json::json!({"role": "user", "content": "Hi"})];
    let out = t
        .render(&msgs, None, true, &serde_json::Map::new())
        .unwrap();
    assert!(out.contains("<|im_start|>user\nHi<|im_end|>\n"), "{out}");
    assert!(out.ends_with("<|im_start|>assistant\n"), "{out}");
}
