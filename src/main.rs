//! The agentd binary: for now it reports what this version contains and exits.

use std::process::ExitCode;

fn main() -> ExitCode {
    println!(
        "agentd {}: the tool core is in place; the HTTP and WebSocket server arrives in a later version.",
        env!("CARGO_PKG_VERSION")
    );
    ExitCode::SUCCESS
}
