//! Fuzz target `request`: the check is switchyard_fuzz_checks::request::check, which the stable
//! replay test (fuzz-checks/tests/replay.rs) also runs on fuzz/corpus/request/.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| switchyard_fuzz_checks::request::check(data));
