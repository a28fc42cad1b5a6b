//! Fuzz target `catalog_yaml`: the check is switchyard_fuzz_checks::catalog::check, which the stable
//! replay test (fuzz-checks/tests/replay.rs) also runs on fuzz/corpus/catalog_yaml/.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| switchyard_fuzz_checks::catalog::check(data));
