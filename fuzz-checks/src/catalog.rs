//! The catalog YAML loader of `switchyard apply -f` ([`file::parse`]).
//!
//! Invariants: a refused file's error names the file; an accepted catalog written back as
//! YAML ([`file::to_yaml`], what `switchyard get catalog` prints) loads again to the same
//! catalog.

use switchyard_catalog::file;

const FILE: &str = "fuzz.yaml";

pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let catalog = match file::parse(FILE, text) {
        Ok(catalog) => catalog,
        Err(e) => {
            let message = e.to_string();
            assert!(message.starts_with(FILE), "the error names the file: {message}");
            return;
        }
    };
    let yaml = match file::to_yaml(&catalog) {
        Ok(yaml) => yaml,
        Err(e) => panic!("an accepted catalog cannot be written as YAML: {e}"),
    };
    match file::parse(FILE, &yaml) {
        Ok(again) => assert_eq!(catalog, again, "written back and loaded again:\n{yaml}"),
        Err(e) => panic!("the catalog written back does not load ({e}):\n{yaml}"),
    }
}
