//! The servers under test as child processes: started on 127.0.0.1 port 0, found through the
//! `listening address=` line they log, measured through /proc, stopped with SIGTERM.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

use crate::Settings;

/// How long a server may take to say it listens (a debug build migrating PostgreSQL is slow).
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a server may take to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// Log lines kept to explain a server that failed.
const LOG_TAIL: usize = 40;
/// The file `read_file` reads: 12 bytes, in the workspace root.
pub const READ_FILE: &str = "load.txt";

/// CPU time and resident memory of a process at one moment.
#[derive(Debug, Clone, Copy)]
pub struct Usage {
    /// User plus system time of all its threads so far.
    pub cpu: Duration,
    /// Resident set size in bytes.
    pub rss: u64,
}

/// A running server; killed if dropped without [`ServerProcess::stop`].
pub struct ServerProcess {
    /// `floor` or `agentd`, for messages.
    pub label: &'static str,
    child: Child,
    pid: u32,
    addr: SocketAddr,
    /// The last lines the server logged; the reader task holds the other end until stderr ends.
    log: Arc<Mutex<VecDeque<String>>>,
    /// agentd's data directory and workspace, removed when the server is gone.
    _dir: Option<tempfile::TempDir>,
}

impl ServerProcess {
    /// agentd's data directory (none for the floor).
    pub fn data_dir(&self) -> Option<std::path::PathBuf> {
        self._dir.as_ref().map(|dir| dir.path().join("data"))
    }

    /// The floor: this same binary, run with the hidden floor argument.
    pub async fn floor() -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("cannot find this program's path")?;
        let mut command = Command::new(exe);
        command.arg(crate::FLOOR_ARG);
        Self::spawn("floor", command, None).await
    }

    /// agentd on a fresh data directory and workspace (with [`READ_FILE`] in it), SQLite unless
    /// a database URL was given, talking to `model` (base URL and model id) when one is given.
    pub async fn agentd(settings: &Settings, model: Option<(&str, &str)>) -> anyhow::Result<Self> {
        Self::agentd_configured(settings, model, "").await
    }

    /// [`ServerProcess::agentd`] with `config` (TOML) added to its configuration file.
    pub async fn agentd_configured(
        settings: &Settings,
        model: Option<(&str, &str)>,
        config: &str,
    ) -> anyhow::Result<Self> {
        Self::agentd_bound(settings, model, config, "127.0.0.1:0").await
    }

    /// [`ServerProcess::agentd_configured`] listening on `bind` (a cluster node, whose address
    /// the others must know before it starts).
    pub async fn agentd_bound(
        settings: &Settings,
        model: Option<(&str, &str)>,
        config: &str,
        bind: &str,
    ) -> anyhow::Result<Self> {
        let dir = match &settings.scratch {
            Some(scratch) => tempfile::tempdir_in(scratch),
            None => tempfile::tempdir(),
        }
        .context("cannot create a temporary directory")?;
        let workspace = dir.path().join("workspace");
        std::fs::create_dir_all(&workspace)?;
        std::fs::write(workspace.join(READ_FILE), b"hello, load\n")?;
        let mut command = Command::new(&settings.agentd);
        command
            .arg("serve")
            .current_dir(dir.path())
            // Settings of the caller's environment would make runs differ from machine to machine.
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", dir.path())
            .env("AGENTD_BIND", bind)
            .env("AGENTD_DATA_DIR", dir.path().join("data"))
            .env("AGENTD_WORKSPACE", &workspace)
            .env("AGENTD_LOG", "info");
        if let Some(url) = &settings.database {
            command.env("DATABASE_URL", url);
        }
        // One client opens thousands of sessions: the per-user quotas would stop the load,
        // not measure it.
        let mut toml = format!(
            "{config}\n[server]\nmax_sessions_per_user = 0\nsession_creates_per_minute = 0\n"
        );
        if let Some(secs) = settings.idle_unload_secs {
            toml.push_str(&format!("idle_unload_secs = {secs}\n"));
        }
        let file = dir.path().join("agentd.toml");
        std::fs::write(&file, toml)?;
        command.env("AGENTD_CONFIG", file);
        if let Some((base_url, model)) = model {
            command
                .env("AGENTD_LLM_BASE_URL", base_url)
                .env("AGENTD_LLM_MODEL", model);
        }
        Self::spawn("agentd", command, Some(dir)).await
    }

    async fn spawn(
        label: &'static str,
        mut command: Command,
        dir: Option<tempfile::TempDir>,
    ) -> anyhow::Result<Self> {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command
            .spawn()
            .with_context(|| format!("cannot start {label}"))?;
        let pid = child.id().context("the child has no pid")?;
        let stderr = child.stderr.take().context("stderr is piped")?;
        let log = Arc::new(Mutex::new(VecDeque::with_capacity(LOG_TAIL)));
        let (found, address) = oneshot::channel::<SocketAddr>();
        let tail = Arc::clone(&log);
        // Keeps reading after the address is found, so that the server never blocks on a full
        // pipe while it logs.
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            let mut found = Some(found);
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(addr) = listening_address(&line)
                    && let Some(found) = found.take()
                {
                    let _ = found.send(addr);
                }
                let mut tail = tail.lock().unwrap_or_else(|poison| poison.into_inner());
                if tail.len() == LOG_TAIL {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
        });
        let mut server = Self {
            label,
            child,
            pid,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            log,
            _dir: dir,
        };
        match tokio::time::timeout(START_TIMEOUT, address).await {
            Ok(Ok(addr)) => {
                server.addr = addr;
                Ok(server)
            }
            Ok(Err(_)) => {
                let status = server.child.wait().await?;
                Err(anyhow!(
                    "{label} exited ({status}) before listening:\n{}",
                    server.log_tail()
                ))
            }
            Err(_) => Err(anyhow!(
                "{label} did not listen within {START_TIMEOUT:?}:\n{}",
                server.log_tail()
            )),
        }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its CPU time and resident memory now.
    pub fn usage(&self) -> anyhow::Result<Usage> {
        Ok(Usage {
            cpu: cpu_time(self.pid)?,
            rss: rss_bytes(self.pid)?,
        })
    }

    /// Its resident memory now.
    pub fn rss(&self) -> anyhow::Result<u64> {
        rss_bytes(self.pid)
    }

    /// Its resident anonymous memory now: the heap and stacks, without the pages of its
    /// program text, which the kernel may drop and read again at will.
    pub fn anon(&self) -> anyhow::Result<u64> {
        status_bytes(self.pid, "RssAnon:")
    }

    /// What it logged last, one line each.
    fn log_tail(&self) -> String {
        let tail = self.log.lock().unwrap_or_else(|poison| poison.into_inner());
        tail.iter()
            .map(|line| format!("  {line}"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// SIGKILL, at once: a node that dies.
    pub async fn kill(mut self) -> anyhow::Result<()> {
        self.child.kill().await.context("cannot kill")?;
        Ok(())
    }

    /// [`ServerProcess::stop`], handing back agentd's directory to look at what it left.
    pub async fn stop_keeping_dir(mut self) -> anyhow::Result<Option<tempfile::TempDir>> {
        let dir = self._dir.take();
        self.stop().await?;
        Ok(dir)
    }

    /// SIGTERM, then waits; a server that does not exit in time is killed and reported.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        let pid = i32::try_from(self.pid)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
            .context("pid out of range")?;
        rustix::process::kill_process(pid, rustix::process::Signal::TERM)
            .with_context(|| format!("cannot signal {}", self.label))?;
        match tokio::time::timeout(STOP_TIMEOUT, self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                if !status.success() {
                    bail!(
                        "{} exited with {status} after SIGTERM:\n{}",
                        self.label,
                        self.log_tail()
                    );
                }
                Ok(())
            }
            Err(_) => {
                let _ = self.child.kill().await;
                bail!("{} did not stop within {STOP_TIMEOUT:?}", self.label)
            }
        }
    }

    /// Fails with the server's last log lines when it is no longer running.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("{} exited ({status}):\n{}", self.label, self.log_tail());
        }
        Ok(())
    }
}

/// The address in a `listening address=127.0.0.1:PORT` log line.
fn listening_address(line: &str) -> Option<SocketAddr> {
    if !line.contains("listening") {
        return None;
    }
    let (_, rest) = line.split_once("address=")?;
    rest.split_whitespace().next()?.parse().ok()
}

/// utime + stime of every thread of `pid`, from /proc/<pid>/stat.
fn cpu_time(pid: u32) -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("cannot read /proc/{pid}/stat"))?;
    // The command name in parentheses may hold spaces; the fields after it do not.
    let (_, fields) = stat.rsplit_once(')').context("malformed /proc stat")?;
    let fields: Vec<&str> = fields.split_whitespace().collect();
    // After the name come field 3 (state) onwards; utime and stime are fields 14 and 15.
    let ticks = |index: usize| -> anyhow::Result<u64> {
        fields
            .get(index)
            .context("short /proc stat")?
            .parse::<u64>()
            .context("malformed /proc stat")
    };
    let total = ticks(14 - 3)? + ticks(15 - 3)?;
    Ok(Duration::from_secs_f64(total as f64 / clock_ticks()))
}

/// Clock ticks per second, the unit of /proc's CPU times.
fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions; it only reads a system constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// VmRSS of `pid` in bytes, from /proc/<pid>/status.
fn rss_bytes(pid: u32) -> anyhow::Result<u64> {
    status_bytes(pid, "VmRSS:")
}

/// A `kB` figure of `pid`'s /proc/<pid>/status, in bytes.
fn status_bytes(pid: u32, field: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("cannot read /proc/{pid}/status"))?;
    let line = status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .with_context(|| format!("no {field} in /proc status"))?;
    let kib: u64 = line
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .with_context(|| format!("malformed {field}"))?;
    Ok(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_address_in_a_log_line() {
        let line = "2025-01-01T00:00:00.000000Z  INFO agentd: listening address=127.0.0.1:41234";
        assert_eq!(
            listening_address(line),
            Some("127.0.0.1:41234".parse().unwrap())
        );
        assert_eq!(listening_address("INFO agentd: stopped"), None);
    }
}
