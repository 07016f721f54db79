//! Python's text forms of template values, so that renderings match Jinja2 under
//! transformers byte for byte: `str()` / `repr()` (what Jinja2 prints for `{{ x }}` and
//! `x|string`) and `json.dumps` (transformers' `tojson` filter, `ensure_ascii=False`).
//!
//! Values arrive as `serde_json::Value` (with `preserve_order`, so dict order is insertion
//! order, as in Python).

use serde_json::Value;

/// Python `repr(float)`: the shortest string that round-trips, in exponent form when the
/// decimal exponent is below -4 or at least 16 (`1e-05`, `1e+16`, `0.0001`, `2.5`).
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".to_owned();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    // Rust's `{:e}` is the shortest round-trip form: "-1.2345e17", "1e-5", "0e0".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    if (-4..16).contains(&exp) {
        // Positional: digits with the point after (exp + 1) of them.
        let point = exp + 1;
        let body = if point <= 0 {
            format!("0.{}{}", "0".repeat((-point) as usize), digits)
        } else if point as usize >= digits.len() {
            format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
        } else {
            format!(
                "{}.{}",
                &digits[..point as usize],
                &digits[point as usize..]
            )
        };
        format!("{sign}{body}")
    } else {
        let mant = if digits.len() > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mant}e{esign}{:02}", exp.abs())
    }
}

fn number_repr(n: &serde_json::Number) -> String {
    if let Some(i) = n.as_i64() {
        i.to_string()
    } else if let Some(u) = n.as_u64() {
        u.to_string()
    } else {
        float_repr(n.as_f64().unwrap_or(f64::NAN))
    }
}

/// Python `repr(str)`: single quotes unless the text has a `'` and no `"`.
fn string_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python `repr()` of a JSON-like value (`None`, `True`, `['a', 1]`, `{'k': 2.5}`).
pub fn repr(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("None"),
        Value::Bool(true) => out.push_str("True"),
        Value::Bool(false) => out.push_str("False"),
        Value::Number(n) => out.push_str(&number_repr(n)),
        Value::String(s) => string_repr(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                repr(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                string_repr(k, out);
                out.push_str(": ");
                repr(item, out);
            }
            out.push('}');
        }
    }
}

/// Python `str()`: a string is itself, everything else its repr.
pub fn str_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => {
            let mut out = String::new();
            repr(other, &mut out);
            out
        }
    }
}

/// Options of Python's `json.dumps` that transformers' `tojson` exposes.
#[derive(Debug, Clone)]
pub struct JsonDumps {
    pub ensure_ascii: bool,
    /// `None`: one line. `Some(s)`: newline and `s` per level (`indent=4` is four spaces).
    pub indent: Option<String>,
    pub item_separator: String,
    pub key_separator: String,
    pub sort_keys: bool,
}

impl JsonDumps {
    /// transformers' defaults: `ensure_ascii=False`, separators `(", ", ": ")`, or
    /// `(",", ": ")` once an indent is given.
    pub fn new(indent: Option<String>) -> JsonDumps {
        let item_separator = if indent.is_some() { "," } else { ", " }.to_owned();
        JsonDumps {
            ensure_ascii: false,
            indent,
            item_separator,
            key_separator: ": ".to_owned(),
            sort_keys: false,
        }
    }

    pub fn dumps(&self, v: &Value) -> String {
        let mut out = String::new();
        self.write(v, 0, &mut out);
        out
    }

    fn newline(&self, level: usize, out: &mut String) {
        if let Some(ind) = &self.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    }

    fn write(&self, v: &Value, level: usize, out: &mut String) {
        match v {
            Value::Null => out.push_str("null"),
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Value::Number(n) => {
                let s = number_repr(n);
                // json.dumps spells non-finite floats as JavaScript does.
                out.push_str(match s.as_str() {
                    "nan" => "NaN",
                    "inf" => "Infinity",
                    "-inf" => "-Infinity",
                    _ => &s,
                });
            }
            Value::String(s) => self.write_string(s, out),
            Value::Array(items) => {
                if items.is_empty() {
                    out.push_str("[]");
                    return;
                }
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_separator);
                    }
                    self.newline(level + 1, out);
                    self.write(item, level + 1, out);
                }
                self.newline(level, out);
                out.push(']');
            }
            Value::Object(map) => {
                if map.is_empty() {
                    out.push_str("{}");
                    return;
                }
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (k, item)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_separator);
                    }
                    self.newline(level + 1, out);
                    self.write_string(k, out);
                    out.push_str(&self.key_separator);
                    self.write(item, level + 1, out);
                }
                self.newline(level, out);
                out.push('}');
            }
        }
    }

    /// Python json's string escaping: `"` `\` and control characters; with `ensure_ascii`
    /// also everything above U+007F as `\uXXXX` (surrogate pairs above U+FFFF).
    fn write_string(&self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c if self.ensure_ascii && (c as u32) > 0x7e => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn floats_like_python_repr() {
        let cases = [
            (2.5, "2.5"),
            (1.0, "1.0"),
            (-3.0, "-3.0"),
            (0.1, "0.1"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789012345.0, "123456789012345.0"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (0.00012, "0.00012"),
            (1.2345678901234568e17, "1.2345678901234568e+17"),
            (0.0, "0.0"),
            (1e100, "1e+100"),
        ];
        for (f, want) in cases {
            assert_eq!(float_repr(f), want, "{f}");
        }
    }

    #[test]
    fn repr_like_python() {
        let v = json!({"a": [1, 2.5, true, null], "it's": "x'y", "q": "say \"hi\"\n"});
        let mut s = String::new();
        repr(&v, &mut s);
        assert_eq!(
            s,
            r#"{'a': [1, 2.5, True, None], "it's": "x'y", 'q': 'say "hi"\n'}"#
        );
    }

    #[test]
    fn dumps_like_python_json() {
        let v = json!({"b": [1, {"x": []}], "a": "ü<&>\u{1}", "e": {}});
        assert_eq!(
            JsonDumps::new(None).dumps(&v),
            r#"{"b": [1, {"x": []}], "a": "ü<&>\u0001", "e": {}}"#
        );
        assert_eq!(
            JsonDumps::new(Some("  ".into())).dumps(&v),
            "{\n  \"b\": [\n    1,\n    {\n      \"x\": []\n    }\n  ],\n  \"a\": \"ü<&>\\u0001\",\n  \"e\": {}\n}"
        );
        let mut d = JsonDumps::new(None);
        d.ensure_ascii = true;
        d.sort_keys = true;
        assert_eq!(
            d.dumps(&json!({"z": "é😀", "a": 1})),
            r#"{"a": 1, "z": "\u00e9\ud83d\ude00"}"#
        );
    }
}
