//! How the tests and the bench start the simulator: the `switchyard sim` server on a port of
//! its own, which it prints as `listening on ADDR`. The e2e harness and the bench each start
//! processes with their own launcher (async and panicking in tests, blocking and returning
//! errors in the bench); both build the simulator's command line from here.

/// `switchyard` arguments that start the simulator on a loopback port it picks.
pub const SIM_ARGS: [&str; 3] = ["sim", "--listen", "127.0.0.1:0"];
