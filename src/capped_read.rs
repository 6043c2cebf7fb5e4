//! Reads that stop one byte past a cap: every read of something a user, a model, a hook or a
//! peer controls goes through here (or through `fs_safe`'s limited reads), so no buffer is
//! ever sized from a file's length, a header or a stream's own say.
//!
//! The unbounded standard calls (`std::fs::read`, `read_to_end`, `wait_with_output`,
//! `reqwest::Response::text`, …) are refused by clippy's `disallowed_methods` list in
//! `clippy.toml`; the few places that read what the kernel writes (`/proc`) say so where
//! they allow it.

use std::io::{self, Read};
use std::path::Path;

use tokio::io::{AsyncRead, AsyncReadExt};

/// The most read of a file the kernel writes (`/proc`, cgroup files): their size is the
/// kernel's, but a cgroup's process list grows with what a session runs.
pub const KERNEL_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// A `/proc` or cgroup file as text, up to [`KERNEL_FILE_BYTES`].
pub fn read_kernel_file(path: impl AsRef<Path>) -> io::Result<String> {
    read_file_to_string(path.as_ref(), KERNEL_FILE_BYTES)
}

/// The error of a read that passed its cap: `io::ErrorKind::FileTooLarge`, naming the cap.
pub fn too_large(what: &str, cap: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::FileTooLarge,
        format!("{what} is larger than its limit of {cap} bytes"),
    )
}

/// All of `reader` if it holds at most `cap` bytes; an error of kind `FileTooLarge` once it
/// gives a byte more.
pub fn read_all(reader: impl Read, cap: u64, what: &str) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    // Reading through `take` is the whole point of this module: the cap bounds the buffer.
    #[allow(clippy::disallowed_methods)]
    reader.take(cap.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Err(too_large(what, cap));
    }
    Ok(bytes)
}

/// The whole file at `path` if it holds at most `cap` bytes (symlinks followed: for files
/// the operator names, not ones in a workspace, which go through `fs_safe`).
pub fn read_file(path: &Path, cap: u64) -> io::Result<Vec<u8>> {
    let file = std::fs::File::open(path)?;
    read_all(file, cap, &path.display().to_string())
}

/// [`read_file`] as UTF-8 text; text that is not UTF-8 is an `InvalidData` error.
pub fn read_file_to_string(path: &Path, cap: u64) -> io::Result<String> {
    String::from_utf8(read_file(path, cap)?).map_err(|err| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not UTF-8: {err}", path.display()),
        )
    })
}

/// The start of a stream and whether there was more: what [`read_prefix`] answers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prefix {
    /// At most the cap's bytes, from the start.
    pub bytes: Vec<u8>,
    /// Whether the stream held more than `bytes`.
    pub cut: bool,
}

/// Up to `cap` bytes of `reader`, then the rest read into a small scratch buffer and dropped
/// until the end, so a child writing to a pipe is never stopped by a full pipe while its
/// output costs at most `cap`. Bound the time with a timeout around it: an endless stream
/// never ends.
pub async fn read_prefix(mut reader: impl AsyncRead + Unpin, cap: usize) -> io::Result<Prefix> {
    let mut bytes = Vec::new();
    let mut scratch = [0u8; 8192];
    let mut cut = false;
    loop {
        let n = reader.read(&mut scratch).await?;
        if n == 0 {
            break;
        }
        let room = cap.saturating_sub(bytes.len());
        bytes.extend_from_slice(&scratch[..n.min(room)]);
        cut |= n > room;
    }
    Ok(Prefix { bytes, cut })
}

/// What a command printed, each stream up to its cap, and how it ended: `Command::output`
/// with a bound.
#[derive(Debug)]
pub struct Output {
    /// How it ended.
    pub status: std::process::ExitStatus,
    /// The start of its stdout.
    pub stdout: Prefix,
    /// The start of its stderr.
    pub stderr: Prefix,
}

/// Runs `command` to its end with stdin closed, keeping at most `cap` bytes of each of its
/// streams; dropped before the end (a timeout around it), the process is killed.
pub async fn output(command: &mut tokio::process::Command, cap: usize) -> io::Result<Output> {
    let mut child = command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let stdout = async move {
        match stdout {
            Some(stdout) => read_prefix(stdout, cap).await,
            None => Ok(Prefix::default()),
        }
    };
    let stderr = async move {
        match stderr {
            Some(stderr) => read_prefix(stderr, cap).await,
            None => Ok(Prefix::default()),
        }
    };
    let (stdout, stderr) = tokio::join!(stdout, stderr);
    Ok(Output {
        status: child.wait().await?,
        stdout: stdout?,
        stderr: stderr?,
    })
}

/// Up to `cap` bytes of an HTTP response's body; the rest is not read. A body that breaks
/// off reads as what arrived.
pub async fn response_prefix(mut response: reqwest::Response, cap: usize) -> Prefix {
    let mut bytes = Vec::new();
    let mut cut = false;
    while let Ok(Some(chunk)) = response.chunk().await {
        let room = cap.saturating_sub(bytes.len());
        bytes.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if chunk.len() > room {
            cut = true;
            break;
        }
    }
    Prefix { bytes, cut }
}

/// The whole of an HTTP response's body if it holds at most `cap` bytes; a larger one is a
/// `FileTooLarge` error and a broken one an error of its own.
pub async fn response_body(mut response: reqwest::Response, cap: usize) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(io::Error::other)? {
        if bytes.len() + chunk.len() > cap {
            return Err(too_large("the answer's body", cap as u64));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of 1 TiB that takes no disk: its size says nothing about what reading it costs.
    fn sparse_tebibyte(dir: &Path) -> std::path::PathBuf {
        let path = dir.join("huge");
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(1 << 40).unwrap();
        path
    }

    #[test]
    fn a_sparse_tebibyte_file_is_refused_after_cap_plus_one_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = sparse_tebibyte(dir.path());
        let err = read_file(&path, 1024).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::FileTooLarge, "{err}");
        assert!(err.to_string().contains("1024 bytes"), "{err}");
        std::fs::write(dir.path().join("small"), b"twelve bytes").unwrap();
        assert_eq!(
            read_file_to_string(&dir.path().join("small"), 12).unwrap(),
            "twelve bytes"
        );
        let err = read_file(&dir.path().join("small"), 11).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::FileTooLarge);
    }

    #[tokio::test]
    async fn an_endless_stream_costs_its_cap_and_is_read_to_its_end() {
        // 64 MiB of zeros through a pipe: the prefix holds the cap, the writer is never stuck.
        let (mut writer, reader) = tokio::io::duplex(4096);
        let written = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let block = vec![0u8; 1 << 20];
            for _ in 0..64 {
                writer.write_all(&block).await.unwrap();
            }
        });
        let prefix = read_prefix(reader, 1000).await.unwrap();
        written.await.unwrap();
        assert_eq!(prefix.bytes.len(), 1000);
        assert!(prefix.cut);
        let whole = read_prefix(&b"short"[..], 1000).await.unwrap();
        assert_eq!(
            whole,
            Prefix {
                bytes: b"short".to_vec(),
                cut: false
            }
        );
    }
}
