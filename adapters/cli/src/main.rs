//! `plexsphere-leader status --dsn <DSN> [--key CLASSID:OBJID] [--format text|json]`: who leads
//! an election, from the server's views. See the `plexsphere_leader_cli` library for the exit codes.

use std::process::ExitCode;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let code = plexsphere_leader_cli::run(
        std::env::args_os(),
        &mut std::io::stdout(),
        &mut std::io::stderr(),
    )
    .await;
    ExitCode::from(code)
}
