//! Fuzz target `webhook_url`: the check is switchyard_fuzz_checks::webhook_url::check, which the stable
//! replay test (fuzz-checks/tests/replay.rs) also runs on fuzz/corpus/webhook_url/.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| switchyard_fuzz_checks::webhook_url::check(data));
