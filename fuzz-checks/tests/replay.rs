//! Replays every checked-in fuzz input (fuzz/corpus/<target>/ and the regressions in
//! fuzz/artifacts/<target>/) through the check its target runs, on the stable toolchain in
//! the ordinary test suite (docs/fuzzing.md).

use std::path::{Path, PathBuf};

use switchyard_fuzz_checks::TARGETS;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut files: Vec<PathBuf> =
        entries.filter_map(Result::ok).map(|e| e.path()).filter(|p| p.is_file()).collect();
    files.sort();
    files
}

#[test]
fn every_corpus_input_and_regression_passes_its_targets_check() {
    let mut total = 0;
    for (target, check) in TARGETS {
        let corpus = inputs(&fuzz_dir().join("corpus").join(target));
        assert!(!corpus.is_empty(), "fuzz/corpus/{target} holds no inputs");
        let regressions = inputs(&fuzz_dir().join("artifacts").join(target));
        for file in corpus.iter().chain(&regressions) {
            let data = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let outcome = std::panic::catch_unwind(|| check(&data));
            assert!(outcome.is_ok(), "{target}: {} fails its check", file.display());
            total += 1;
        }
    }
    assert!(total > 0);
}
