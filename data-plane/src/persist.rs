//! Last-known-good config on the node's disk, so that a node restarted while no control
//! plane answers still serves.
//!
//! Two files in the data dir, both JSON lines:
//! - `config.base`: the whole config at one version — a first line `{"version":N}`, then one
//!   `["<resource>", <value>]` line per resource (the catalog, each key in the node's form);
//! - `config.log`: the changes applied since, one line per version:
//!   `{"version":N,"upserts":[["<resource>",<value>],…],"deletes":["<resource>",…]}`.
//!
//! A key change appends one line and syncs it: its cost on disk is the change's size, not
//! the fleet's (a million keys make a base of ~150 MB). A snapshot, or a log grown to half
//! the base's size, rewrites the base (written aside, synced, renamed into place) and
//! empties the log. A crash leaves either base whole; a log line cut short by a crash is
//! dropped on the next start, and lines the base already covers are skipped.
//! Injected faults are never written: a node restarted while its control plane is away
//! serves without a drill, whose end (its lease) it could not learn.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::value::RawValue;
use tracing::{debug, info, warn};

use crate::config::{CATALOG, Change, ConfigError, KEYS, NodeConfig, Persisted};
use crate::state::{NodeState, Unsaved};

const BASE: &str = "config.base";
const LOG: &str = "config.log";
/// The whole-config file of nodes before the base and log; read once, then replaced.
const LEGACY: &str = "config.json";
/// Resources handed to the config builder at a time while a base is read.
const LOAD_BATCH: usize = 1024;
/// The log is folded into a new base once it outgrows half the base, or this, if larger.
const MIN_COMPACTION_BYTES: u64 = 1 << 20;

/// The config read from the data dir, and where its files stand.
pub struct Loaded {
    pub config: NodeConfig,
    files: Files,
}

pub fn base_path(data_dir: &Path) -> PathBuf {
    data_dir.join(BASE)
}

pub fn log_path(data_dir: &Path) -> PathBuf {
    data_dir.join(LOG)
}

/// Reads the persisted config, if any. Missing files are not an error; unreadable ones are
/// reported and ignored (the node then waits for a control plane, as a new node would).
pub async fn load(data_dir: &Path) -> Option<Loaded> {
    let dir = data_dir.to_owned();
    // Reading a base of a million keys takes a second of CPU, and applying a catalog
    // resolves provider credentials (file reads): off the async threads.
    let loaded = tokio::task::spawn_blocking(move || read(&dir))
        .await
        .unwrap_or_else(|e| Err(e.to_string()));
    match loaded {
        Ok(loaded) => loaded,
        Err(e) => {
            warn!(dir = %data_dir.display(), error = %e, "ignoring unusable last-known-good config");
            None
        }
    }
}

/// Writes each published config, from the config `loaded` was read at on, until the
/// process ends. Bursts coalesce: a persister that fell behind writes each changed
/// resource once, at its newest value.
pub async fn run(data_dir: PathBuf, state: Arc<NodeState>, loaded: Option<Files>) {
    let mut files = loaded.unwrap_or_else(|| Files::empty(data_dir.clone()));
    if files.legacy {
        state.unsaved_all();
    }
    loop {
        let unsaved = state.next_unsaved().await;
        let version = unsaved.config.as_ref().map_or(0, |c| c.version);
        let mut taken = files;
        let (back, result) = match tokio::task::spawn_blocking(move || {
            let result = taken.save(&unsaved);
            (taken, result)
        })
        .await
        {
            Ok(done) => done,
            Err(e) => (Files::empty(data_dir.clone()), Err(std::io::Error::other(e))),
        };
        files = back;
        match result {
            Ok(()) => debug!(version, "persisted config"),
            Err(e) => {
                warn!(version, error = %e, "cannot persist config; the whole config is written at the next change");
                files.broken = true;
            }
        }
    }
}

impl Loaded {
    /// The files' state, for [`run`].
    pub fn into_parts(self) -> (NodeConfig, Files) {
        (self.config, self.files)
    }
}

/// The node's two files and how far they go.
pub struct Files {
    dir: PathBuf,
    base_bytes: u64,
    /// Bytes of whole lines in the log; a torn tail past it is cut before the next append.
    log_bytes: u64,
    log: Option<File>,
    /// The files do not hold the config in force (an older format, a failed write): the
    /// next save writes a new base.
    legacy: bool,
    broken: bool,
}

impl Files {
    fn empty(dir: PathBuf) -> Self {
        Self { dir, base_bytes: 0, log_bytes: 0, log: None, legacy: false, broken: true }
    }

    fn save(&mut self, unsaved: &Unsaved) -> std::io::Result<()> {
        let Some(config) = &unsaved.config else { return Ok(()) };
        let compact = self.log_bytes > MIN_COMPACTION_BYTES.max(self.base_bytes / 2);
        if unsaved.all || self.broken || self.legacy || compact {
            self.write_base(config)?;
            self.broken = false;
            self.legacy = false;
            return Ok(());
        }
        self.append(config, unsaved.names.iter().map(String::as_str))
    }

    /// A new base, then an empty log. A crash between the two leaves log lines at or below
    /// the base's version, which a start skips.
    fn write_base(&mut self, config: &NodeConfig) -> std::io::Result<()> {
        let tmp = self.dir.join(format!("{BASE}.tmp"));
        let mut out = BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
        writeln!(out, "{{\"version\":{}}}", config.version)?;
        let catalog = serde_json::to_vec(&*config.catalog).map_err(std::io::Error::other)?;
        let mut bytes = write_resource(&mut out, CATALOG, &catalog)?;
        for (id, key) in config.keys.iter() {
            let value = key.to_json().map_err(std::io::Error::other)?;
            bytes += write_resource(&mut out, &format!("{KEYS}{id}"), &value)?;
        }
        let file = out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        std::fs::rename(&tmp, self.dir.join(BASE))?;
        File::open(&self.dir)?.sync_all()?;
        self.base_bytes = bytes;
        let log = OpenOptions::new().create(true).append(true).open(self.dir.join(LOG))?;
        log.set_len(0)?;
        log.sync_all()?;
        self.log = Some(log);
        self.log_bytes = 0;
        match std::fs::remove_file(self.dir.join(LEGACY)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        info!(version = config.version, bytes, "wrote the last-known-good config in full");
        Ok(())
    }

    /// One log line with the newest value of each resource named (deleted when the config
    /// no longer has it), synced before the next change is taken.
    fn append<'a>(
        &mut self,
        config: &NodeConfig,
        names: impl Iterator<Item = &'a str>,
    ) -> std::io::Result<()> {
        let mut line = format!("{{\"version\":{},\"upserts\":[", config.version).into_bytes();
        let mut deletes = Vec::new();
        let mut first = true;
        for name in names.filter(|n| *n == CATALOG || n.starts_with(KEYS)) {
            match config.stored(name).map_err(std::io::Error::other)? {
                Some(value) => {
                    if !std::mem::take(&mut first) {
                        line.push(b',');
                    }
                    write_pair(&mut line, name, &value)?;
                }
                None => deletes.push(name),
            }
        }
        line.extend_from_slice(b"],\"deletes\":");
        serde_json::to_writer(&mut line, &deletes).map_err(std::io::Error::other)?;
        line.extend_from_slice(b"}\n");
        let log = match &mut self.log {
            Some(log) => log,
            None => {
                let log = OpenOptions::new().create(true).append(true).open(self.dir.join(LOG))?;
                // A line a crash cut short is cut off before anything follows it.
                log.set_len(self.log_bytes)?;
                self.log.insert(log)
            }
        };
        log.write_all(&line)?;
        log.sync_data()?;
        self.log_bytes += line.len() as u64;
        Ok(())
    }
}

fn write_pair(out: &mut Vec<u8>, name: &str, value: &[u8]) -> std::io::Result<()> {
    out.push(b'[');
    serde_json::to_writer(&mut *out, name).map_err(std::io::Error::other)?;
    out.push(b',');
    out.extend_from_slice(value);
    out.push(b']');
    Ok(())
}

fn write_resource(out: &mut impl Write, name: &str, value: &[u8]) -> std::io::Result<u64> {
    let mut line = Vec::with_capacity(name.len() + value.len() + 8);
    write_pair(&mut line, name, value)?;
    line.push(b'\n');
    out.write_all(&line)?;
    Ok(line.len() as u64)
}

#[derive(Deserialize)]
struct Header {
    version: i64,
}

#[derive(Deserialize)]
struct LogLine<'a> {
    version: i64,
    #[serde(borrow)]
    upserts: Vec<(String, &'a RawValue)>,
    deletes: Vec<String>,
}

fn read(dir: &Path) -> Result<Option<Loaded>, String> {
    let base = match File::open(dir.join(BASE)) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return read_legacy(dir),
        Err(e) => return Err(format!("{BASE}: {e}")),
    };
    let mut lines = BufReader::with_capacity(1 << 20, base);
    let mut line = Vec::new();
    let mut base_bytes = 0;
    if !read_line(&mut lines, &mut line).map_err(|e| format!("{BASE}: {e}"))? {
        return Err(format!("{BASE}: empty"));
    }
    let header: Header =
        serde_json::from_slice(&line).map_err(|e| format!("{BASE}, first line: {e}"))?;
    let mut snapshot = NodeConfig::default().begin_snapshot(header.version);
    let mut batch = Vec::with_capacity(LOAD_BATCH);
    let mut number = 1;
    while read_line(&mut lines, &mut line).map_err(|e| format!("{BASE}: {e}"))? {
        number += 1;
        base_bytes += line.len() as u64 + 1;
        let (name, value): (String, &RawValue) =
            serde_json::from_slice(&line).map_err(|e| format!("{BASE}, line {number}: {e}"))?;
        batch.push((name, value.get().as_bytes().to_vec()));
        if batch.len() == LOAD_BATCH {
            snapshot.add(std::mem::take(&mut batch)).map_err(|e| format!("{BASE}: {e}"))?;
        }
    }
    snapshot.add(batch).map_err(|e| format!("{BASE}: {e}"))?;
    let mut config = snapshot.finish();

    // The log's changes are folded into one (each resource's newest value, or its delete)
    // and applied once: line by line, each would copy the shards it touches, and a log
    // near its compaction point holds hundreds of thousands of lines.
    let mut log_bytes = 0;
    let mut version = config.version;
    let mut changed: BTreeMap<String, (usize, Option<Vec<u8>>)> = BTreeMap::new();
    match File::open(dir.join(LOG)) {
        Ok(file) => {
            let mut lines = BufReader::new(file);
            let mut number = 0;
            // Only whole lines count; the first that does not end or parse ends the log.
            while let Ok(true) = read_line(&mut lines, &mut line) {
                let Ok(change) = serde_json::from_slice::<LogLine<'_>>(&line) else { break };
                number += 1;
                if change.version > version {
                    version = change.version;
                    for (name, value) in change.upserts {
                        changed.insert(name, (number, Some(value.get().as_bytes().to_vec())));
                    }
                    for name in change.deletes {
                        changed.insert(name, (number, None));
                    }
                }
                log_bytes += line.len() as u64 + 1;
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("{LOG}: {e}")),
    }
    if version > config.version {
        let mut upserts = Vec::new();
        let mut deletes = Vec::new();
        let mut lines = BTreeMap::new();
        for (name, (number, value)) in changed {
            lines.insert(name.clone(), number);
            match value {
                Some(value) => upserts.push((name, value)),
                None => deletes.push(name),
            }
        }
        config = config.apply(Change::Update { version, upserts, deletes }).map_err(|e| {
            let ConfigError::Invalid { name, .. } = &e;
            match lines.get(name) {
                Some(number) => format!("{LOG}, line {number}: {e}"),
                None => format!("{LOG}: {e}"),
            }
        })?;
    }
    let files = Files {
        dir: dir.to_owned(),
        base_bytes,
        log_bytes,
        log: None,
        legacy: false,
        broken: false,
    };
    Ok(Some(Loaded { config, files }))
}

/// Reads one line without its `\n` into `line`; `false` at the end, and for a last line
/// with no `\n` (cut short by a crash).
fn read_line(input: &mut impl BufRead, line: &mut Vec<u8>) -> std::io::Result<bool> {
    line.clear();
    input.read_until(b'\n', line)?;
    if line.pop() != Some(b'\n') {
        return Ok(false);
    }
    Ok(true)
}

fn read_legacy(dir: &Path) -> Result<Option<Loaded>, String> {
    let bytes = match std::fs::read(dir.join(LEGACY)) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{LEGACY}: {e}")),
    };
    let persisted: Persisted =
        serde_json::from_slice(&bytes).map_err(|e| format!("{LEGACY}: {e}"))?;
    drop(bytes);
    let config = NodeConfig::default()
        .apply(persisted.into_change())
        .map_err(|e| format!("{LEGACY}: {e}"))?;
    let mut files = Files::empty(dir.to_owned());
    files.legacy = true;
    Ok(Some(Loaded { config, files }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Changed;
    use switchyard_catalog::keys::secret_digest;

    fn key_json(id: &str, secret: &str) -> Vec<u8> {
        crate::keys::record(id, secret, serde_json::json!({"failoverDefaults": {"models": ["a"]}}))
    }

    fn fault_json(name: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "name": name, "target": {"model": "m"}, "rate": 1.0,
            "kind": {"type": "status", "status": 503}, "expires_at_unix_ms": 0
        }))
        .unwrap()
    }

    fn snapshot(version: i64, keys: usize) -> NodeConfig {
        let mut resources: Vec<_> = (0..keys)
            .map(|i| (format!("keys/k{i}"), key_json(&format!("k{i}"), &format!("s{i}"))))
            .collect();
        resources.push(("faults/f".into(), fault_json("f")));
        NodeConfig::default().apply(Change::Snapshot { version, resources }).unwrap()
    }

    fn save(files: &mut Files, config: &NodeConfig, changed: Changed) {
        let mut unsaved = Unsaved { config: Some(Arc::new(config.clone())), ..Default::default() };
        match changed {
            Changed::All => unsaved.all = true,
            Changed::Resources(names) => unsaved.names.extend(names),
        }
        files.save(&unsaved).unwrap();
    }

    fn reload(dir: &Path) -> (NodeConfig, Files) {
        read(dir).unwrap().unwrap().into_parts()
    }

    #[test]
    fn a_base_and_its_log_read_back_as_the_config_in_force_without_faults() {
        let dir = tempfile::tempdir().unwrap();
        let mut files = Files::empty(dir.path().to_owned());
        let base = snapshot(5, 3);
        save(&mut files, &base, Changed::All);
        let next = base
            .apply(Change::Update {
                version: 6,
                upserts: vec![("keys/k1".into(), key_json("k1", "rotated"))],
                deletes: vec!["keys/k2".into()],
            })
            .unwrap();
        save(&mut files, &next, Changed::Resources(vec!["keys/k1".into(), "keys/k2".into()]));
        let (again, _) = reload(dir.path());
        assert_eq!(again.version, 6);
        assert_eq!(again.keys.len(), 2);
        assert!(again.keys_by_hash.contains_key(&secret_digest("rotated")));
        assert!(!again.keys_by_hash.contains_key(&secret_digest("s1")));
        assert!(!again.keys.contains_key("k2"));
        assert!(again.faults.is_empty(), "faults are not persisted");
        let k0 = again.keys.get("k0").unwrap();
        assert_eq!(k0.settings.failover_defaults.as_ref().unwrap().models, ["a"]);
    }

    #[test]
    fn a_key_change_appends_its_size_and_leaves_the_base_alone() {
        let dir = tempfile::tempdir().unwrap();
        let mut files = Files::empty(dir.path().to_owned());
        let mut config = snapshot(1, 2000);
        save(&mut files, &config, Changed::All);
        let base = std::fs::read(base_path(dir.path())).unwrap();
        for v in 2..12 {
            let id = format!("k{v}");
            config = config
                .apply(Change::Update {
                    version: v,
                    upserts: vec![(format!("keys/{id}"), key_json(&id, &format!("new{v}")))],
                    deletes: vec![],
                })
                .unwrap();
            save(&mut files, &config, Changed::Resources(vec![format!("keys/{id}")]));
        }
        assert_eq!(
            std::fs::read(base_path(dir.path())).unwrap(),
            base,
            "the base was not rewritten"
        );
        let log = std::fs::metadata(log_path(dir.path())).unwrap().len();
        assert!(log < 10 * 400, "ten changes of one key appended {log} bytes");
        assert!(base.len() > 2000 * 100);
        assert_eq!(reload(dir.path()).0.version, 11);
    }

    #[test]
    fn a_line_cut_short_is_dropped_and_overwritten_by_the_next_change() {
        let dir = tempfile::tempdir().unwrap();
        let mut files = Files::empty(dir.path().to_owned());
        let config = snapshot(1, 3);
        save(&mut files, &config, Changed::All);
        let next = config
            .apply(Change::Update { version: 2, upserts: vec![], deletes: vec!["keys/k0".into()] })
            .unwrap();
        save(&mut files, &next, Changed::Resources(vec!["keys/k0".into()]));
        let whole = std::fs::metadata(log_path(dir.path())).unwrap().len();
        // A crash in the middle of the next append.
        let mut log = OpenOptions::new().append(true).open(log_path(dir.path())).unwrap();
        log.write_all(b"{\"version\":3,\"upserts\":[[\"keys/k1\"").unwrap();
        drop(log);
        let (again, mut files) = reload(dir.path());
        assert_eq!((again.version, again.keys.len()), (2, 2));
        let last = again
            .apply(Change::Update { version: 4, upserts: vec![], deletes: vec!["keys/k1".into()] })
            .unwrap();
        save(&mut files, &last, Changed::Resources(vec!["keys/k1".into()]));
        let (again, _) = reload(dir.path());
        assert_eq!((again.version, again.keys.len()), (4, 1), "the torn line was cut, not read");
        assert!(std::fs::metadata(log_path(dir.path())).unwrap().len() > whole);
    }

    #[test]
    fn a_log_past_half_the_base_is_folded_into_a_new_base() {
        let dir = tempfile::tempdir().unwrap();
        let mut files = Files::empty(dir.path().to_owned());
        let mut config = snapshot(1, 10);
        save(&mut files, &config, Changed::All);
        // Past the 1 MiB floor: big upserts of one key, each a line.
        let mut v = 1;
        while files.log_bytes <= MIN_COMPACTION_BYTES {
            v += 1;
            let mut record: serde_json::Value =
                serde_json::from_slice(&key_json("k0", "s0")).unwrap();
            record["allowed_models"] = serde_json::json!(vec![format!("m{v}"); 4000]);
            config = config
                .apply(Change::Update {
                    version: v,
                    upserts: vec![("keys/k0".into(), serde_json::to_vec(&record).unwrap())],
                    deletes: vec![],
                })
                .unwrap();
            save(&mut files, &config, Changed::Resources(vec!["keys/k0".into()]));
        }
        save(&mut files, &config, Changed::Resources(vec!["keys/k0".into()]));
        assert_eq!(std::fs::metadata(log_path(dir.path())).unwrap().len(), 0, "the log was folded");
        let (again, _) = reload(dir.path());
        assert_eq!(again.version, v);
        assert_eq!(again.keys.get("k0").unwrap().settings.allowed_models[0], format!("m{v}"));
    }

    #[test]
    fn the_log_is_replayed_as_one_change_and_a_bad_record_is_named_by_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let mut files = Files::empty(dir.path().to_owned());
        save(&mut files, &snapshot(1, 3), Changed::All);
        let lines = [
            "{\"version\":2,\"upserts\":[],\"deletes\":[\"keys/k0\"]}\n".to_owned(),
            format!(
                "{{\"version\":3,\"upserts\":[[\"keys/k0\",{}]],\"deletes\":[\"keys/k1\"]}}\n",
                String::from_utf8(key_json("k0", "back")).unwrap()
            ),
        ];
        std::fs::write(log_path(dir.path()), lines.concat()).unwrap();
        let (config, _) = reload(dir.path());
        assert_eq!((config.version, config.keys.len()), (3, 2), "k0 back, k1 gone, k2 kept");
        assert!(config.keys_by_hash.contains_key(&secret_digest("back")));
        assert!(!config.keys.contains_key("k1"));

        let bad = "{\"version\":4,\"upserts\":[[\"keys/k2\",{\"id\":\"k2\"}]],\"deletes\":[]}\n";
        std::fs::write(log_path(dir.path()), [lines.concat(), bad.to_owned()].concat()).unwrap();
        let e = read(dir.path()).err().unwrap();
        assert!(e.contains("config.log, line 3") && e.contains("keys/k2"), "{e}");
    }

    #[test]
    fn a_legacy_file_is_read_and_replaced_by_a_base() {
        let dir = tempfile::tempdir().unwrap();
        let legacy = serde_json::json!({"version": 7, "resources": {
            "keys/k1": serde_json::from_slice::<serde_json::Value>(&key_json("k1", "s1")).unwrap()
        }});
        std::fs::write(dir.path().join(LEGACY), legacy.to_string()).unwrap();
        let (config, mut files) = reload(dir.path());
        assert_eq!(config.version, 7);
        assert!(config.keys_by_hash.contains_key(&secret_digest("s1")));
        assert!(files.legacy);
        save(&mut files, &config, Changed::Resources(vec![]));
        assert!(!dir.path().join(LEGACY).exists());
        let (again, _) = reload(dir.path());
        assert!(again.keys_by_hash.contains_key(&secret_digest("s1")));
    }

    #[test]
    fn an_unusable_base_is_an_error_naming_the_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(base_path(dir.path()), "{\"version\":3}\n[\"keys/k1\", {\"id\": 1}]\n")
            .unwrap();
        let e = read(dir.path()).err().unwrap();
        assert!(e.contains(BASE) && e.contains("keys/k1"), "{e}");
        std::fs::write(base_path(dir.path()), "{\"version\":3}\nnot json\n").unwrap();
        let e = read(dir.path()).err().unwrap();
        assert!(e.contains("line 2"), "{e}");
        assert!(read(tempfile::tempdir().unwrap().path()).unwrap().is_none(), "no files: nothing");
    }
}
