//! Flag values shared by the subcommands' parsers.

use crate::error::Result;

/// An integer flag value in `lo..=hi`.
pub fn bounded(v: &str, lo: usize, hi: usize, flag: &str) -> Result<usize> {
    v.parse()
        .ok()
        .filter(|n| (lo..=hi).contains(n))
        .ok_or_else(|| format!("{flag}: expected {lo}–{hi}, got {v:?}"))
}
