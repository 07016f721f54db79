//! An independent JSON-schema checker for the subset the rollout tests use (the oracle the
//! constrained output is validated against). Unknown keywords panic, so a schema the
//! checker does not understand can never pass silently.

use serde_json::Value;

/// Err(path: reason) for the first violation.
pub fn check(schema: &Value, v: &Value, path: &str) -> Result<(), String> {
    let fail = |why: String| Err(format!("{path}: {why}; value {v}"));
    let s = match schema {
        Value::Bool(true) => return Ok(()),
        Value::Bool(false) => return fail("false schema".into()),
        Value::Object(s) => s,
        _ => panic!("not a schema: {schema}"),
    };
    for (k, want) in s {
        match k.as_str() {
            "type" => {
                let types: Vec<&str> = match want {
                    Value::String(t) => vec![t.as_str()],
                    Value::Array(ts) => ts.iter().map(|t| t.as_str().unwrap()).collect(),
                    _ => panic!("type: {want}"),
                };
                if !types.iter().any(|t| has_type(v, t)) {
                    return fail(format!("not of type {want}"));
                }
            }
            "enum" => {
                if !want.as_array().unwrap().iter().any(|e| json_eq(e, v)) {
                    return fail(format!("not in enum {want}"));
                }
            }
            "const" => {
                if !json_eq(want, v) {
                    return fail(format!("not const {want}"));
                }
            }
            "properties" | "required" | "additionalProperties" => {
                let Some(obj) = v.as_object() else { continue };
                let props = s.get("properties").and_then(Value::as_object);
                if k == "required" {
                    for r in want.as_array().unwrap() {
                        if !obj.contains_key(r.as_str().unwrap()) {
                            return fail(format!("missing required {r}"));
                        }
                    }
                } else if k == "properties" {
                    for (name, sub) in props.unwrap() {
                        if let Some(x) = obj.get(name) {
                            check(sub, x, &format!("{path}.{name}"))?;
                        }
                    }
                } else {
                    for (name, x) in obj {
                        if props.is_some_and(|p| p.contains_key(name)) {
                            continue;
                        }
                        check(want, x, &format!("{path}.{name}"))?;
                    }
                }
            }
            "items" => {
                if let Some(a) = v.as_array() {
                    for (i, x) in a.iter().enumerate() {
                        check(want, x, &format!("{path}[{i}]"))?;
                    }
                }
            }
            "minItems" | "maxItems" => {
                if let Some(a) = v.as_array() {
                    let n = want.as_u64().unwrap() as usize;
                    if (k == "minItems" && a.len() < n) || (k == "maxItems" && a.len() > n) {
                        return fail(format!("{k} {n}"));
                    }
                }
            }
            "minLength" | "maxLength" => {
                if let Some(t) = v.as_str() {
                    let n = want.as_u64().unwrap() as usize;
                    let len = t.chars().count();
                    if (k == "minLength" && len < n) || (k == "maxLength" && len > n) {
                        return fail(format!("{k} {n}"));
                    }
                }
            }
            "minimum" | "maximum" => {
                if let Some(x) = v.as_f64() {
                    let n = want.as_f64().unwrap();
                    if (k == "minimum" && x < n) || (k == "maximum" && x > n) {
                        return fail(format!("{k} {n}"));
                    }
                }
            }
            "anyOf" => {
                let arms = want.as_array().unwrap();
                if !arms.iter().any(|a| check(a, v, path).is_ok()) {
                    return fail("matches no anyOf arm".into());
                }
            }
            other => panic!("schema_check does not know keyword {other:?}"),
        }
    }
    Ok(())
}

fn has_type(v: &Value, t: &str) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        "number" => v.is_number(),
        // JSON Schema: an integer is any number with a zero fractional part.
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|x| x.fract() == 0.0),
        _ => panic!("unknown type {t}"),
    }
}

/// JSON equality with numbers compared by value (1 == 1.0).
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_eq(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, p)| y.get(k).is_some_and(|q| json_eq(p, q)))
        }
        _ => a == b,
    }
}
