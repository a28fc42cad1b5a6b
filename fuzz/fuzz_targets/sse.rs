//! Fuzz target `sse`: the check is switchyard_fuzz_checks::sse::check, which the stable
//! replay test (fuzz-checks/tests/replay.rs) also runs on fuzz/corpus/sse/.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| switchyard_fuzz_checks::sse::check(data));
