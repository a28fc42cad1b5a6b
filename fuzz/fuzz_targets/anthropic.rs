//! Fuzz target `anthropic`: the check is switchyard_fuzz_checks::provider::anthropic, which the stable
//! replay test (fuzz-checks/tests/replay.rs) also runs on fuzz/corpus/anthropic/.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| switchyard_fuzz_checks::provider::anthropic(data));
