//! The OpenAI wire format: request and response bodies.

pub mod request;
pub mod response;
