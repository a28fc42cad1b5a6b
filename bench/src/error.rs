//! The bench's errors are messages for the person running it: each says what failed and
//! where, and `main` prints it and exits 1. Nothing matches on them, so a `String` is enough.

pub type Result<T> = std::result::Result<T, String>;
