//! The embedded store (to be written).
