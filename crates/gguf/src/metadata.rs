//! Insertion-ordered metadata (key → typed value) with typed accessors.

use std::collections::HashMap;

use crate::value::{Array, Value};

/// GGUF metadata: keys in file order, looked up by hash.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    pub fn new() -> Metadata {
        Metadata::default()
    }

    /// Sets `key`; a key already present keeps its position and gets the new value.
    /// Returns the previous value.
    pub fn insert(&mut self, key: &str, value: Value) -> Option<Value> {
        match self.index.get(key) {
            Some(&i) => Some(std::mem::replace(&mut self.entries[i].1, value)),
            None => {
                self.index.insert(key.to_owned(), self.entries.len());
                self.entries.push((key.to_owned(), value));
                None
            }
        }
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// Entries in file (insertion) order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        match self.get(key)? {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// Any integer type whose value fits in u32.
    pub fn get_u32(&self, key: &str) -> Option<u32> {
        self.get(key)?.as_integer()?.try_into().ok()
    }

    /// Any integer type whose value fits in u64.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_integer()?.try_into().ok()
    }

    /// Any integer type whose value fits in i64.
    pub fn get_i64(&self, key: &str) -> Option<i64> {
        self.get(key)?.as_integer()?.try_into().ok()
    }

    /// F32, or F64 narrowed to f32.
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        match *self.get(key)? {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        match *self.get(key)? {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn get_array(&self, key: &str) -> Option<&Array> {
        match self.get(key)? {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    pub fn get_str_array(&self, key: &str) -> Option<&[String]> {
        match self.get_array(key)? {
            Array::String(v) => Some(v),
            _ => None,
        }
    }

    pub fn get_f32_array(&self, key: &str) -> Option<&[f32]> {
        match self.get_array(key)? {
            Array::F32(v) => Some(v),
            _ => None,
        }
    }

    pub fn get_i32_array(&self, key: &str) -> Option<&[i32]> {
        match self.get_array(key)? {
            Array::I32(v) => Some(v),
            _ => None,
        }
    }

    /// Any integer array (or a single integer, as one element) converted to u32; `None` if
    /// any element does not fit.
    pub fn get_u32_vec(&self, key: &str) -> Option<Vec<u32>> {
        match self.get(key)? {
            Value::Array(a) => a
                .to_integers()?
                .into_iter()
                .map(|x| u32::try_from(x).ok())
                .collect(),
            v => Some(vec![u32::try_from(v.as_integer()?).ok()?]),
        }
    }
}
