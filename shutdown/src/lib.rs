//! SIGTERM (what Kubernetes and most supervisors send) and SIGINT (Ctrl-C), shared by the
//! node and the control plane. Registered when a server starts, so a signal that comes
//! before it runs is not lost; and a process that handles SIGTERM also stops as PID 1 of a
//! container, where the signal's default action does nothing.
#![forbid(unsafe_code)]

use tokio::signal::unix::{Signal, SignalKind, signal};
use tracing::{info, warn};

/// The two signals, or none (a server driven by its caller's own shutdown future).
pub struct ShutdownSignals(Option<(Signal, Signal)>);

impl ShutdownSignals {
    pub fn register() -> std::io::Result<Self> {
        Ok(Self(Some((signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?))))
    }

    pub fn none() -> Self {
        Self(None)
    }

    /// Resolves on the first signal (never, for `none`). A second signal exits the process
    /// at once with the shell's code for it (143, 130): someone who presses Ctrl-C twice
    /// does not want to wait for the drain.
    pub async fn recv(self) {
        let Some((mut term, mut int)) = self.0 else { return std::future::pending().await };
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        info!(signal = name, "shutting down; a second signal stops at once");
        tokio::spawn(async move {
            let code = tokio::select! {
                _ = term.recv() => 143,
                _ = int.recv() => 130,
            };
            warn!("second signal: stopping without finishing the drain");
            std::process::exit(code);
        });
    }
}
