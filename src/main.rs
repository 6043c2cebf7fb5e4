//! The agentd binary: parse the configuration, set up logging, bind, serve until a signal.

use std::io::Write as _;
use std::process::ExitCode;

use agentd::Server;
use agentd::config::{Cli, Command, Config};
use clap::Parser;
use tokio::net::TcpListener;

#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // The sandbox launcher runs in front of every command: no configuration, no logging.
    let mut argv = std::env::args_os().skip(1);
    if argv
        .next()
        .is_some_and(|a| a == agentd::sandbox::launcher::SUBCOMMAND)
    {
        agentd::sandbox::launcher::main(argv.collect());
    }
    // Tools run processes as this same user; a non-dumpable process keeps them from reading
    // its memory or /proc/<pid>/environ, where the secrets are.
    #[cfg(target_os = "linux")]
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
    let cli = Cli::parse();
    if let Some(Command::Exec(exec)) = cli.command {
        return exec_task(exec);
    }
    if let Some(Command::Acp(acp)) = cli.command {
        return acp_stdio(acp);
    }
    if let Some(Command::Export(export)) = cli.command {
        return transfer(
            &export.serve,
            export.user,
            Transfer::Export(export.session_id, export.checkpoints),
        );
    }
    if let Some(Command::Import(import)) = cli.command {
        return transfer(&import.serve, import.user, Transfer::Import(import.file));
    }
    let mut backup_file = None;
    let mut gc = false;
    let (args, serving) = match cli.command {
        Some(Command::Serve(args)) => (args, Some(true)),
        Some(Command::CheckConfig(args)) => (args, None),
        Some(Command::Migrate(args)) => (args, Some(false)),
        Some(Command::Gc(args)) => {
            gc = true;
            (args, Some(false))
        }
        Some(Command::Backup(backup)) => {
            backup_file = Some(backup.file);
            (backup.serve, Some(false))
        }
        Some(Command::Exec(_) | Command::Acp(_) | Command::Export(_) | Command::Import(_)) => {
            unreachable!("handled above")
        }
        None => (cli.serve, Some(true)),
    };
    let config = match Config::load(&args, &|name| std::env::var(name).ok()) {
        Ok(config) => config,
        Err(err) => return fail(&err),
    };
    let telemetry = match serving {
        Some(true) => match start_telemetry(&config) {
            Ok(telemetry) => telemetry,
            Err(err) => return fail(&err),
        },
        _ => None,
    };
    init_tracing_with("info", telemetry.as_ref());
    let warnings = config.warnings();
    let Some(serving) = serving else {
        for warning in &warnings {
            eprintln!("warning: {warning}");
        }
        print!("{}", config.to_effective_toml());
        return ExitCode::SUCCESS;
    };
    for warning in &warnings {
        tracing::warn!("{warning}");
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => return fail(&format!("cannot start the async runtime: {err}")),
    };
    if let Some(file) = backup_file {
        let url = config.server.database_url();
        return runtime.block_on(async {
            match agentd::store::sqlite::backup(&url, &file).await {
                Ok(bytes) => {
                    println!("wrote a copy of {} bytes to {}", bytes, file.display());
                    ExitCode::SUCCESS
                }
                Err(err) => fail(&err),
            }
        });
    }
    // gc and migrate change the store as a server would: not under a running one. (A backup
    // is a read, made while the server runs; `serve` holds the directory in `Server::start`.)
    let _data_dir = if gc || !serving {
        match agentd::data_dir::DataDirLock::acquire(&config.server.data_dir) {
            Ok(held) => Some(held),
            Err(err) => return fail(&err),
        }
    } else {
        None
    };
    if gc {
        return runtime.block_on(async {
            let store = match agentd::store::connect(&config.server.database_url()).await {
                Ok(store) => store,
                Err(err) => return fail(&err),
            };
            let swept = agentd::session::retention::sweep(
                store.as_ref(),
                &config.retention,
                time::OffsetDateTime::now_utc(),
                &std::collections::HashSet::new(),
                &|_| {},
            )
            .await;
            store.close().await;
            match swept {
                Ok(report) => {
                    println!("{report}");
                    ExitCode::SUCCESS
                }
                Err(err) => fail(&err),
            }
        });
    }
    if !serving {
        return runtime.block_on(async {
            let url = config.server.database_url();
            match agentd::store::connect(&url).await {
                Ok(store) => {
                    let backend = store.backend();
                    store.close().await;
                    println!("the {backend} database is up to date");
                    ExitCode::SUCCESS
                }
                Err(err) => fail(&err),
            }
        });
    }
    let code = runtime.block_on(async move {
        let bind = config.server.bind;
        let server = match Server::start(config).await {
            Ok(server) => server,
            Err(err) => return fail(&err),
        };
        let listener = match TcpListener::bind(bind).await {
            Ok(listener) => listener,
            Err(err) => return fail(&format!("cannot listen on {bind}: {err}")),
        };
        let shutdown = match shutdown_signal() {
            Ok(shutdown) => shutdown,
            Err(err) => return fail(&format!("cannot install signal handlers: {err}")),
        };
        let address = listener.local_addr().map_or(bind, |a| a);
        tracing::info!(%address, "listening");
        match server.serve(listener, shutdown).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                let _ = writeln!(std::io::stderr(), "agentd: {err}");
                ExitCode::FAILURE
            }
        }
    });
    drop(runtime);
    if let Some(telemetry) = telemetry {
        telemetry.shutdown();
    }
    code
}

/// What `agentd export` or `agentd import` was asked.
enum Transfer {
    Export(String, bool),
    Import(std::path::PathBuf),
}

/// `agentd export` / `agentd import`: the session moved through the store in-process, as the
/// REST routes do for a running server.
fn transfer(serve: &agentd::config::ServeArgs, user: Option<String>, what: Transfer) -> ExitCode {
    let (config, telemetry) = match quiet_start(serve) {
        Ok(started) => started,
        Err(code) => return code,
    };
    // The file is opened before the server starts, so a wrong path fails alone; it is read a
    // line at a time, as the REST route reads its body.
    let file = match &what {
        Transfer::Import(path) if path.as_os_str() != "-" => match std::fs::File::open(path) {
            Ok(file) => Some(file),
            Err(err) => return fail(&format!("cannot read {}: {err}", path.display())),
        },
        _ => None,
    };
    let when_held = "against a running server, use its REST API (GET \
                     /api/sessions/{id}/export, POST /api/sessions/import)";
    in_process(config, telemetry, false, when_held, |server| async move {
        let outcome = match what {
            Transfer::Export(id, checkpoints) => {
                server.export_session(user, &id, checkpoints).await
            }
            Transfer::Import(_) => match file {
                Some(file) => {
                    let body = tokio::io::BufReader::new(tokio::fs::File::from_std(file));
                    server.import_session(user, body).await
                }
                None => {
                    let body = tokio::io::BufReader::new(tokio::io::stdin());
                    server.import_session(user, body).await
                }
            },
        };
        server.stop().await;
        match outcome {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(err) => fail(&err),
        }
    })
}

/// Runs `run` on a server started in-process from `config` (for the commands that run one
/// piece of work and exit), then stops the runtime (`abandon`: without waiting for blocking
/// reads, such as of stdin) and sends what telemetry still holds. `when_held` is what to do
/// instead when another process (a running server) holds the data directory.
fn in_process<F, Fut>(
    config: Config,
    telemetry: Option<agentd::telemetry::Telemetry>,
    abandon: bool,
    when_held: &str,
    run: F,
) -> ExitCode
where
    F: FnOnce(Server) -> Fut,
    Fut: std::future::Future<Output = ExitCode>,
{
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => return fail(&format!("cannot start the async runtime: {err}")),
    };
    let code = runtime.block_on(async move {
        match Server::start(config).await {
            Ok(server) => run(server).await,
            Err(
                err @ agentd::StartupError::DataDir(agentd::data_dir::DataDirError::Held { .. }),
            ) => fail(&format!("{err}; {when_held}")),
            Err(err) => fail(&err),
        }
    });
    if abandon {
        runtime.shutdown_background();
    } else {
        drop(runtime);
    }
    if let Some(telemetry) = telemetry {
        telemetry.shutdown();
    }
    code
}

/// The configuration, telemetry and a log of warnings and worse on stderr, for the commands
/// whose stdout is their output (`exec`, `acp`).
fn quiet_start(
    serve: &agentd::config::ServeArgs,
) -> Result<(Config, Option<agentd::telemetry::Telemetry>), ExitCode> {
    let config = Config::load(serve, &|name| std::env::var(name).ok()).map_err(|err| fail(&err))?;
    let telemetry = start_telemetry(&config).map_err(|err| fail(&err))?;
    init_tracing_with("warn", telemetry.as_ref());
    Ok((config, telemetry))
}

/// Starts OpenTelemetry export when `[telemetry]` or the `OTEL_*` variables ask for it;
/// before any runtime, since the exporters send from threads of their own.
fn start_telemetry(
    config: &Config,
) -> Result<Option<agentd::telemetry::Telemetry>, agentd::telemetry::TelemetryError> {
    let settings = config.telemetry.settings();
    if !settings.wanted(&|name| std::env::var(name).ok()) {
        return Ok(None);
    }
    agentd::telemetry::Telemetry::start(&settings).map(Some)
}

/// The largest prompt `agentd exec` reads from stdin.
const MAX_PROMPT_BYTES: u64 = 16 * 1024 * 1024;

/// `agentd exec`: one task in-process; the exit code says how its turn ended.
fn exec_task(args: agentd::config::ExecArgs) -> ExitCode {
    let prompt = match args.prompt.as_deref() {
        Some(prompt) if prompt != "-" => prompt.to_string(),
        _ => {
            let read =
                agentd::capped_read::read_all(std::io::stdin(), MAX_PROMPT_BYTES, "the prompt")
                    .and_then(|bytes| String::from_utf8(bytes).map_err(std::io::Error::other));
            match read {
                Ok(text) => text,
                Err(err) => return fail(&format!("cannot read the prompt from stdin: {err}")),
            }
        }
    };
    if prompt.trim().is_empty() {
        return fail(&"exec needs a prompt (an argument, or text on stdin)");
    }
    let output_schema = match args
        .output_schema
        .as_deref()
        .map(agentd::server::exec::read_schema)
    {
        Some(Err(err)) => return fail(&err),
        Some(Ok(schema)) => Some(schema),
        None => None,
    };
    // Only warnings and worse on stderr unless asked: it carries the summary line.
    let (config, telemetry) = match quiet_start(&args.serve) {
        Ok(started) => started,
        Err(code) => return code,
    };
    let task = agentd::server::exec::ExecTask {
        prompt,
        json: args.json,
        model: args.model,
        output_schema,
        cwd: args.cwd,
        approve_all: args.approve == "all",
    };
    // exec has no client mode: a running server takes the task over REST instead.
    let when_held = "give this exec a --data-dir of its own, or run the task on the running \
                     server (POST /api/sessions, then POST /api/sessions/{id}/turns?wait=true)";
    in_process(config, telemetry, false, when_held, |server| async move {
        let mut stdout = std::io::stdout();
        ExitCode::from(server.exec(task, &mut stdout).await)
    })
}

/// `agentd acp`: the Agent Client Protocol on stdio. stdout carries only protocol lines: the
/// protocol keeps a copy of it, and fd 1 becomes stderr, so nothing else this process or its
/// children print can reach the client; fd 0 becomes /dev/null for the children likewise.
fn acp_stdio(args: agentd::config::AcpArgs) -> ExitCode {
    use std::os::fd::AsFd as _;
    if args.token_file.is_some() && args.url.is_none() {
        return fail(&"acp --token-file goes with --url (the agentd to bridge to)");
    }
    let token = match &args.token_file {
        None => None,
        Some(file) => match agentd::capped_read::read_file_to_string(file, 64 * 1024) {
            Ok(token) if !token.trim().is_empty() => Some(token.trim().to_string()),
            Ok(_) => return fail(&format!("the token file {} is empty", file.display())),
            Err(err) => {
                return fail(&format!(
                    "cannot read the token file {}: {err}",
                    file.display()
                ));
            }
        },
    };
    if args.user.is_some() && args.url.is_some() {
        return fail(
            &"acp --user is for in-process sessions; with --url the token says who you are",
        );
    }
    // Warnings and worse only, on stderr: editors show it as the agent's log.
    let (config, telemetry) = match quiet_start(&args.serve) {
        Ok(started) => started,
        Err(code) => return code,
    };
    let caller = if args.url.is_none() {
        match agentd::server::acp::acp_caller(&config.server.users, args.user) {
            Ok(caller) => Some(caller),
            Err(err) => return fail(&err),
        }
    } else {
        None
    };
    let protocol = (
        std::io::stdin().as_fd().try_clone_to_owned(),
        std::io::stdout().as_fd().try_clone_to_owned(),
        std::fs::File::open("/dev/null"),
    );
    let (Ok(input), Ok(output), Ok(null)) = protocol else {
        return fail(&"cannot take over stdin and stdout");
    };
    {
        use std::os::fd::AsRawFd as _;
        // SAFETY: dup2 on descriptors this process owns; it only replaces fds 0 and 1, whose
        // old files the protocol holds through the copies above.
        let redirected = unsafe { libc::dup2(null.as_raw_fd(), 0) >= 0 && libc::dup2(2, 1) >= 0 };
        if !redirected {
            return fail(&"cannot take over stdin and stdout");
        }
    }
    let input = tokio::fs::File::from_std(std::fs::File::from(input));
    let output = tokio::fs::File::from_std(std::fs::File::from(output));
    let Some(url) = args.url else {
        let caller = caller.unwrap_or_else(agentd::session::Caller::anonymous);
        let when_held = "use agentd acp --url ws://HOST:PORT/api/ws to reach the running server";
        return in_process(config, telemetry, true, when_held, |server| async move {
            ExitCode::from(server.acp(caller, input, output).await)
        });
    };
    // A bridge hosts nothing: the settings only say where the workspace is.
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => return fail(&format!("cannot start the async runtime: {err}")),
    };
    let workspace = config.server.workspace.clone();
    let code = runtime.block_on(agentd::server::acp::bridge(
        &url, token, &workspace, input, output,
    ));
    runtime.shutdown_background();
    if let Some(telemetry) = telemetry {
        telemetry.shutdown();
    }
    match code {
        Ok(code) => ExitCode::from(code),
        Err(err) => fail(&err),
    }
}

/// Start-up failures: one line on stderr, exit code 2.
fn fail(err: &dyn std::fmt::Display) -> ExitCode {
    let _ = writeln!(std::io::stderr(), "agentd: {err}");
    ExitCode::from(2)
}

/// `AGENTD_LOG` filters (default `default`); `AGENTD_LOG_FORMAT=json` switches to JSON lines.
/// With `telemetry`, the GenAI spans also go to the OpenTelemetry exporter, whatever the
/// log's filter.
fn init_tracing_with(default: &str, telemetry: Option<&agentd::telemetry::Telemetry>) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("AGENTD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let json = std::env::var("AGENTD_LOG_FORMAT").is_ok_and(|f| f.eq_ignore_ascii_case("json"));
    if let Some(telemetry) = telemetry {
        use tracing_subscriber::prelude::*;
        let log = tracing_subscriber::fmt::layer()
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .log_internal_errors(false)
            .with_writer(std::io::stderr);
        let traced = tracing_subscriber::registry().with(telemetry.layer());
        if json {
            traced.with(log.json().with_filter(filter)).init();
        } else {
            traced.with(log.with_filter(filter)).init();
        }
        return;
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // A log that cannot be written (a full disk under a redirected stderr) is dropped;
        // reporting that on stderr as well would panic in the middle of a request.
        .log_internal_errors(false)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Resolves on SIGINT or SIGTERM. The handlers are installed before this returns, so a signal
/// sent as soon as the server says it listens is never missed.
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        tracing::info!("shutdown requested");
    })
}
