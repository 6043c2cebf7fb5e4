//! The write side of task output: one append-only log file per task, written through as output
//! arrives.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::fs::{File, OpenOptions};
use tokio::io::AsyncWriteExt;

use crate::disk_quota::UserDisk;

/// Longest task id accepted as a log file name.
pub const MAX_TASK_ID_LEN: usize = 128;

/// Checks that `task_id` can name a log file: 1 to 128 characters from `[A-Za-z0-9_-]`.
pub fn validate_task_id(task_id: &str) -> io::Result<()> {
    let plain = task_id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if task_id.is_empty() || task_id.len() > MAX_TASK_ID_LEN || !plain {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "task id must be 1 to {MAX_TASK_ID_LEN} characters from [A-Za-z0-9_-], got {:?}",
                truncate_for_message(task_id)
            ),
        ));
    }
    Ok(())
}

/// The log file of `task_id` under `dir` (`<dir>/<task_id>.log`), refusing unsafe ids.
pub fn log_path(dir: &Path, task_id: &str) -> io::Result<PathBuf> {
    validate_task_id(task_id)?;
    Ok(dir.join(format!("{task_id}.log")))
}

// An id is echoed in the error; a hostile multi-megabyte one must not be.
fn truncate_for_message(task_id: &str) -> &str {
    let mut end = task_id.len().min(MAX_TASK_ID_LEN + 1);
    while !task_id.is_char_boundary(end) {
        end -= 1;
    }
    &task_id[..end]
}

/// An open task log that output is appended to; memory use does not grow with the output.
#[derive(Debug)]
pub struct OutputSpool {
    file: File,
    path: PathBuf,
    total_bytes: u64,
    /// The session's user's disk account, each append charged to it.
    disk: Option<Arc<UserDisk>>,
    /// Appends the account refused so far.
    refusals: u64,
}

impl OutputSpool {
    /// Creates `<dir>/<task_id>.log`, creating `dir` if needed; an existing log is an error
    /// (`AlreadyExists`) rather than being overwritten.
    pub async fn create(dir: &Path, task_id: &str) -> io::Result<Self> {
        let path = log_path(dir, task_id)?;
        tokio::fs::create_dir_all(dir).await?;
        // create_new (O_EXCL) also refuses a symlink planted at the path.
        let file = OpenOptions::new()
            .append(true)
            .create_new(true)
            .open(&path)
            .await?;
        Ok(Self {
            file,
            path,
            total_bytes: 0,
            disk: None,
            refusals: 0,
        })
    }

    /// Opens the existing `<dir>/<task_id>.log` to append to it (a sub-agent's transcript goes
    /// on after a restart); a symlink at the path is refused.
    pub async fn reopen(dir: &Path, task_id: &str) -> io::Result<Self> {
        let path = log_path(dir, task_id)?;
        let file = OpenOptions::new()
            .append(true)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&path)
            .await?;
        let total_bytes = file.metadata().await?.len();
        Ok(Self {
            file,
            path,
            total_bytes,
            disk: None,
            refusals: 0,
        })
    }

    /// Charges every append from now on to `disk`; one the user's quota or the server's
    /// free-space reserve refuses fails with `QuotaExceeded` and writes nothing.
    pub fn charged_to(mut self, disk: Option<Arc<UserDisk>>) -> Self {
        self.disk = disk;
        self
    }

    /// Appends `bytes` and hands them to the operating system before returning, so a crash of
    /// this process loses at most an append still in progress.
    pub async fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        if let Some(disk) = &self.disk
            && let Err(err) = disk.charge_beside(bytes.len() as u64)
        {
            self.refusals += 1;
            return Err(io::Error::new(io::ErrorKind::QuotaExceeded, err));
        }
        // tokio's File stages at most one bounded chunk at a time, so a large `bytes` is not
        // copied whole; flush waits until the last chunk has been written.
        let written = async {
            self.file.write_all(bytes).await?;
            self.file.flush().await
        }
        .await;
        match written {
            Ok(()) => {
                self.total_bytes += bytes.len() as u64;
                Ok(())
            }
            Err(err) => {
                // Part of `bytes` may have landed; the file itself is the truth.
                if let Ok(meta) = self.file.metadata().await {
                    self.total_bytes = meta.len();
                }
                Err(err)
            }
        }
    }

    /// Asks the operating system to put everything appended so far on disk (for task ends).
    pub async fn sync(&mut self) -> io::Result<()> {
        self.file.sync_data().await
    }

    /// Bytes appended so far: the length of the log.
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    /// Appends the disk account refused so far (a caller logs the first only, so a task
    /// past the quota cannot fill the server's log instead).
    pub fn refusals(&self) -> u64 {
        self.refusals
    }

    /// Where the log lives.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn appends_are_on_disk_when_append_returns() {
        let dir = tempfile::tempdir().unwrap();
        let tasks = dir.path().join("data").join("tasks");
        let id = "0b5c6a9e-2f51-4c3e-9d1e-8a7b6c5d4e3f";
        let mut spool = OutputSpool::create(&tasks, id).await.unwrap();
        assert_eq!(spool.path(), tasks.join(format!("{id}.log")));
        assert_eq!(spool.total_bytes(), 0);
        assert_eq!(std::fs::read(spool.path()).unwrap(), b"");

        spool.append(b"first line\n").await.unwrap();
        assert_eq!(std::fs::read(spool.path()).unwrap(), b"first line\n");
        spool.append(b"").await.unwrap();
        spool.append("second \u{e9}\n".as_bytes()).await.unwrap();
        assert_eq!(spool.total_bytes(), 11 + 10);
        assert_eq!(
            std::fs::read_to_string(spool.path()).unwrap(),
            "first line\nsecond \u{e9}\n"
        );
        spool.sync().await.unwrap();
    }

    #[derive(Debug)]
    struct PlentyFree;

    impl crate::disk_quota::FreeSpace for PlentyFree {
        fn available(&self) -> io::Result<u64> {
            Ok(u64::MAX)
        }
    }

    #[tokio::test]
    async fn output_past_the_users_disk_quota_is_refused_and_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let workspace = dir.path().join("workspace");
        std::fs::create_dir(&workspace).unwrap();
        let quotas = crate::disk_quota::DiskQuotas::new(1, 0, Arc::new(PlentyFree)).unwrap();
        let disk = quotas.user(Some("alice"), &workspace);
        let mut spool = OutputSpool::create(&dir.path().join("tasks"), "t1")
            .await
            .unwrap()
            .charged_to(Some(disk));
        spool.append(&[b'a'; 512 * 1024]).await.unwrap();
        for _ in 0..3 {
            let err = spool.append(&[b'b'; 600 * 1024]).await.unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::QuotaExceeded, "{err}");
        }
        assert_eq!(spool.refusals(), 3);
        assert_eq!(spool.total_bytes(), 512 * 1024);
        assert_eq!(std::fs::metadata(spool.path()).unwrap().len(), 512 * 1024);
    }

    #[tokio::test]
    async fn large_appends_arrive_whole_and_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = OutputSpool::create(dir.path(), "big").await.unwrap();
        let block: Vec<u8> = (0..5 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
        spool.append(&block).await.unwrap();
        spool.append(b"tail").await.unwrap();
        assert_eq!(spool.total_bytes(), block.len() as u64 + 4);
        let on_disk = std::fs::read(spool.path()).unwrap();
        assert_eq!(on_disk.len() as u64, spool.total_bytes());
        assert_eq!(&on_disk[..block.len()], &block[..]);
        assert_eq!(&on_disk[block.len()..], b"tail");
    }

    #[tokio::test]
    async fn refuses_ids_that_are_not_plain_words() {
        let dir = tempfile::tempdir().unwrap();
        let long = "a".repeat(MAX_TASK_ID_LEN + 1);
        for bad in [
            "",
            "../escape",
            "a/b",
            "a.b",
            "a b",
            "a\0b",
            "\u{e9}t\u{e9}",
            &long,
        ] {
            let err = OutputSpool::create(dir.path(), bad).await.unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
            assert!(err.to_string().contains("[A-Za-z0-9_-]"), "{err}");
        }
        assert!(log_path(dir.path(), &"a".repeat(MAX_TASK_ID_LEN)).is_ok());
        assert!(log_path(dir.path(), "Task_1-x").is_ok());
        // Nothing was created for the refused ids.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[tokio::test]
    async fn an_existing_log_is_not_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t1.log");
        std::fs::write(&path, b"keep me").unwrap();
        let err = OutputSpool::create(dir.path(), "t1").await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&path).unwrap(), b"keep me");
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_symlink_at_the_log_path_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, b"precious").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join("t2.log")).unwrap();
        let err = OutputSpool::create(dir.path(), "t2").await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&target).unwrap(), b"precious");
    }
}
