//! Fuzz target `gemini`: the check is switchyard_fuzz_checks::provider::gemini, which the stable
//! replay test (fuzz-checks/tests/replay.rs) also runs on fuzz/corpus/gemini/.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| switchyard_fuzz_checks::provider::gemini(data));
