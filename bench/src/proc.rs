//! Starting and stopping the `switchyard` processes under test (and the bench's own
//! pass-through), and running the `switchyard` CLI against a control plane.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

use crate::error::Result;

/// The `switchyard` binary next to ours (`target/release/switchyard`).
pub fn default_switchyard() -> Result<PathBuf> {
    Ok(std::env::current_exe()
        .map_err(|e| format!("cannot find our own path: {e}"))?
        .with_file_name("switchyard"))
}

/// A child process that is killed when dropped, so every exit path of the bench (errors
/// included) leaves nothing running.
pub struct Proc {
    child: Child,
    pub addr: SocketAddr,
}

impl Proc {
    /// Starts `bin ARGS` and waits for its `listening on ADDR` line on stdout; stderr goes
    /// to `log`.
    pub fn start(bin: &Path, args: &[&str], envs: &[(&str, &str)], log: &Path) -> Result<Proc> {
        let log_file =
            File::create(log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
        let mut cmd = Command::new(bin);
        cmd.args(args)
            // Each server's own default log filter: what a user runs.
            .env_remove("RUST_LOG")
            .env_remove("SWITCHYARD_JOIN_TOKEN")
            .env_remove("SWITCHYARD_ADMIN_TOKEN")
            .env_remove("SWITCHYARD_CONTROL")
            .envs(envs.iter().copied())
            // The pass-through exits when its stdin closes, i.e. when we are gone.
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log_file);
        let mut child =
            cmd.spawn().map_err(|e| format!("cannot start {} {args:?}: {e}", bin.display()))?;
        let Some(stdout) = child.stdout.take() else {
            let _ = child.kill();
            return Err("child has no stdout".into());
        };
        let (tx, rx) = mpsc::channel();
        // Keeps draining stdout after the address line so the child never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let addr = line
                    .split_once("listening on ")
                    .and_then(|(_, a)| a.trim().parse::<SocketAddr>().ok());
                if let (Some(addr), Some(tx)) = (addr, tx.take()) {
                    let _ = tx.send(addr);
                }
            }
        });
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(addr) => Ok(Proc { child, addr }),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(format!(
                    "{} {args:?} did not print `listening on ADDR` within 30 s; see {}",
                    bin.display(),
                    log.display()
                ))
            }
        }
    }

    /// Starts the simulator (`bin sim`, as every test and benchmark starts it) with its log
    /// in `log`.
    pub fn start_sim(bin: &Path, log: &Path) -> Result<Proc> {
        Proc::start(bin, &switchyard_test_support::sim::SIM_ARGS, &[], log)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs an admin command of the CLI and parses its `--json` output.
pub fn cli(bin: &Path, control: &str, token: &str, args: &[&str]) -> Result<Value> {
    cli_with(bin, control, token, &[], args)
}

/// [`cli`] with more environment (e.g. `SWITCHYARD_CONTROL_CA`).
pub fn cli_with(
    bin: &Path,
    control: &str,
    token: &str,
    envs: &[(&str, &str)],
    args: &[&str],
) -> Result<Value> {
    let out = Command::new(bin)
        .args(args)
        .arg("--json")
        .env("SWITCHYARD_CONTROL", control)
        .env("SWITCHYARD_ADMIN_TOKEN", token)
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run switchyard {args:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "switchyard {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("switchyard {args:?} printed no JSON ({e})"))
}
