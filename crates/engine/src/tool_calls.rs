//! Tool-call parsing (in progress).
