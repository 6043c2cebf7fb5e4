//! `agentd-sandbox sandbox-exec SPEC PROGRAM [ARGS…]`: the sandbox launcher on its own, the same
//! code as `agentd sandbox-exec`. agentd prefers it when it lies beside the server binary: a
//! small executable starts in a fraction of the time the whole server's takes (fewer pages to
//! map and relocate), and it runs in front of every command.

fn main() {
    let mut argv = std::env::args_os().skip(1);
    match argv.next() {
        Some(sub) if sub == agentd::sandbox::launcher::SUBCOMMAND => {
            agentd::sandbox::launcher::main(argv.collect())
        }
        _ => {
            eprintln!("usage: agentd-sandbox sandbox-exec SPEC PROGRAM [ARGS...] | --probe");
            std::process::exit(agentd::sandbox::launcher::LAUNCH_FAILED);
        }
    }
}
