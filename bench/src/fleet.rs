//! A simulator + control plane + node on loopback with one catalog, for the default run and
//! the `streams` and `translate` subcommands, and the node readiness poll they and `keys`
//! share.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::client::http;
use crate::error::Result;
use crate::proc::{Proc, cli_with};

/// Polls `/readyz` until it is 200 with `config_version >= min_version`, every `every`,
/// for at most `timeout`. Returns the version the node reported.
pub async fn wait_ready(
    addr: SocketAddr,
    min_version: i64,
    every: Duration,
    timeout: Duration,
) -> Result<i64> {
    let by = Instant::now() + timeout;
    loop {
        // A node that is still starting may refuse the connection: that is "not ready".
        if let Ok((200, ready)) = http(addr, "GET", "/readyz", None, None).await
            && let Some(v) = ready["config_version"].as_i64().filter(|v| *v >= min_version)
        {
            return Ok(v);
        }
        if Instant::now() > by {
            return Err(format!(
                "{addr}: /readyz not 200 with config_version >= {min_version} within {timeout:?}"
            ));
        }
        tokio::time::sleep(every).await;
    }
}

/// A simulator, a control plane on the embedded store with `catalog` applied and one key,
/// and a node that has applied both. Everything dies with the value.
pub struct Fleet {
    pub sim: Proc,
    pub cp: Proc,
    pub node: Proc,
    /// The key's secret.
    pub key: String,
    /// A second key with all four limits set too high to bind; `None` for a `switchyard`
    /// older than limits (a `chaos --baseline` build).
    pub limited_key: Option<String>,
    /// The control plane's URL and admin token, for CLI commands against it.
    pub control: String,
    pub token: String,
    /// The config version the first node was ready at.
    pub version: i64,
}

impl Fleet {
    pub async fn start(
        bin: &Path,
        dir: &Path,
        catalog: impl Fn(SocketAddr) -> String,
    ) -> Result<Fleet> {
        let store = format!("file://{}", dir.join("store").display());
        Self::start_on(bin, dir, &store, catalog, &[]).await
    }

    /// [`Fleet::start`] with the control plane on `store` (`file://…` or `etcd://…`) and
    /// `node_args` added to the node's command line.
    pub async fn start_on(
        bin: &Path,
        dir: &Path,
        store: &str,
        catalog: impl Fn(SocketAddr) -> String,
        node_args: &[&str],
    ) -> Result<Fleet> {
        Self::start_with(bin, dir, store, catalog, node_args, None).await
    }

    /// [`Fleet::start_on`], with TLS on the control plane's listener when `tls` is given:
    /// the node and the CLI reach it at `https://localhost:PORT`, trusting `tls.ca`.
    pub async fn start_with(
        bin: &Path,
        dir: &Path,
        store: &str,
        catalog: impl Fn(SocketAddr) -> String,
        node_args: &[&str],
        tls: Option<&FleetTls<'_>>,
    ) -> Result<Fleet> {
        let logs = |name: &str| dir.join(format!("{name}.log"));
        let sim = Proc::start_sim(bin, &logs("sim"))?;
        let token = format!("bench-admin-token-{}", std::process::id());
        let path = |p: &Path| p.display().to_string();
        let (cp_flags, ca) = match tls {
            Some(t) => (
                vec!["--tls-cert".to_owned(), path(t.cert), "--tls-key".to_owned(), path(t.key)],
                Some(path(t.ca)),
            ),
            None => (Vec::new(), None),
        };
        let cp_flags: Vec<&str> = cp_flags.iter().map(String::as_str).collect();
        let cp =
            start_control_with(bin, store, "127.0.0.1:0", &token, &logs("control"), &cp_flags)?;
        let control = match tls {
            Some(_) => format!("https://localhost:{}", cp.addr.port()),
            None => format!("http://{}", cp.addr),
        };
        let cli_env: Vec<(&str, &str)> =
            ca.as_deref().map(|ca| ("SWITCHYARD_CONTROL_CA", ca)).into_iter().collect();
        let cli = |bin: &Path, control: &str, token: &str, args: &[&str]| {
            cli_with(bin, control, token, &cli_env, args)
        };
        let mut node_args = node_args.to_vec();
        if let Some(ca) = &ca {
            node_args.extend(["--control-ca", ca.as_str()]);
        }
        let file = dir.join("catalog.yaml");
        std::fs::write(&file, catalog(sim.addr)).map_err(|e| format!("catalog: {e}"))?;
        let applied = cli(bin, &control, &token, &["apply", "-f", &file.display().to_string()])?;
        let created = cli(bin, &control, &token, &["keys", "create", "--name", "bench"])?;
        let key = created["key"].as_str().ok_or("keys create printed no key")?.to_owned();
        let limited = cli(bin, &control, &token, &["keys", "create", "--name", "bench-limited"])?;
        let limited_id = limited["id"].as_str().ok_or("keys create printed no id")?;
        let set = cli(
            bin,
            &control,
            &token,
            &[
                "keys",
                "set-limits",
                limited_id,
                "--rpm",
                "1000000000000",
                "--tpm",
                "1000000000000",
                "--tokens-per-day",
                "1000000000000",
                "--usd-per-day",
                "1000000000",
            ],
        )
        .ok();
        let limited_key = set.as_ref().and_then(|_| limited["key"].as_str().map(str::to_owned));
        let set_version = set.as_ref().and_then(|s| s["version"].as_i64());
        let version = [created["version"].as_i64(), applied["version"].as_i64(), set_version]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(0);
        let node = start_node(bin, dir, &control, "node", version, &[], &node_args).await?;
        Ok(Fleet { sim, cp, node, key, limited_key, control, token, version })
    }

    /// One more node on the same control plane, ready with the fleet's config.
    pub async fn add_node(&self, bin: &Path, dir: &Path, name: &str) -> Result<Proc> {
        start_node(bin, dir, &self.control, name, self.version, &[], &[]).await
    }

    /// [`Fleet::add_node`] with `envs` in the node's environment.
    pub async fn add_node_with_env(
        &self,
        bin: &Path,
        dir: &Path,
        name: &str,
        envs: &[(&str, &str)],
    ) -> Result<Proc> {
        start_node(bin, dir, &self.control, name, self.version, envs, &[]).await
    }

    /// Scripts one of the simulator's upstream models.
    pub async fn script(&self, model: &str, behaviour: serde_json::Value) -> Result<()> {
        let body = serde_json::json!({"model": model, "behaviour": behaviour}).to_string();
        let (status, v) = http(self.sim.addr, "POST", "/_sim/script", None, Some(body)).await?;
        if status >= 300 {
            return Err(format!("scripting the simulator's {model} failed: {status} {v}"));
        }
        Ok(())
    }
}

/// TLS on a fleet's control plane: its certificate and key, and the CA that signed them.
pub struct FleetTls<'a> {
    pub ca: &'a Path,
    pub cert: &'a Path,
    pub key: &'a Path,
}

/// A control plane on `store`, listening on `listen`. It keeps up to 100 million audit
/// entries (the default keeps 100,000): a storm benchmark counts every event it stored.
pub fn start_control(
    bin: &Path,
    store: &str,
    listen: &str,
    token: &str,
    log: &Path,
) -> Result<Proc> {
    start_control_with(bin, store, listen, token, log, &[])
}

/// [`start_control`] with more flags (`--tls-cert`, `--tls-key`).
pub fn start_control_with(
    bin: &Path,
    store: &str,
    listen: &str,
    token: &str,
    log: &Path,
    flags: &[&str],
) -> Result<Proc> {
    let mut args =
        vec!["control", "--store", store, "--listen", listen, "--audit-max-entries", "100000000"];
    args.extend_from_slice(flags);
    Proc::start(bin, &args, &[("SWITCHYARD_ADMIN_TOKEN", token)], log)
}

/// A node named `name` (its data and log under `dir`), once ready at `version`.
async fn start_node(
    bin: &Path,
    dir: &Path,
    control: &str,
    name: &str,
    version: i64,
    envs: &[(&str, &str)],
    extra_args: &[&str],
) -> Result<Proc> {
    let node_dir = dir.join(name).display().to_string();
    let mut args =
        vec!["node", "--control", control, "--listen", "127.0.0.1:0", "--data-dir", &node_dir];
    args.extend_from_slice(extra_args);
    let node = Proc::start(bin, &args, envs, &dir.join(format!("{name}.log")))?;
    wait_ready(node.addr, version, Duration::from_millis(50), Duration::from_secs(20)).await?;
    Ok(node)
}
