//! OpenAI-compatible HTTP server over the engine's slot scheduler.
//!
//! Routes talk to inference only through [`InferenceService`]; [`ModelService`] implements
//! it over a loaded model. [`serve`] binds, serves until SIGTERM/ctrl-c, then drains.

pub mod app;
pub mod error;
pub mod generation;
pub mod model_service;
pub mod openai;
pub mod routes;
pub mod service;
pub mod shutdown;
pub mod text_stream;
pub mod validate;

pub use app::{router, AppState, ServerConfig};
pub use engine::speculative::SlotDrafter;
pub use error::ApiError;
pub use model_service::{DraftOptions, ModelService, ModelServiceOptions};
pub use service::{InferenceService, ModelInfo};
pub use shutdown::serve;

#[cfg(test)]
mod fake_service;
#[cfg(test)]
mod http_tests;
