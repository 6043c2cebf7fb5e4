//! Where checkpoints are kept on disk, so a session's undo outlives its actor (an idle unload,
//! a restart): file contents as content-addressed blobs (`blobs/ab/cdef…`, the SHA-256 of the
//! bytes) shared by every session and turn, and each session's manifests (`sessions/<id>/`),
//! one per checkpoint, naming each path's blob and metadata.
//!
//! Blobs are written once (a temporary file renamed into place) and never changed; a
//! manifest is replaced whole the same way. A blob no manifest names is garbage: the sweep
//! removes it once it is an hour old, so a checkpoint being taken meanwhile (which touches the
//! blobs it reuses) never loses one.

use std::collections::HashSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{Entry, Hash, Limits, Snapshot, Stamp};

/// The manifest format this version writes and reads.
const MANIFEST_VERSION: u32 = 1;
/// The largest manifest, or imported blob, read back: above what an export's line can carry.
const MAX_STORED_BYTES: u64 = 64 * 1024 * 1024;
/// A blob younger than this is never collected.
const GRACE: Duration = Duration::from_secs(3600);

/// The checkpoint directory under the data dir.
#[derive(Debug)]
pub struct CheckpointStore {
    root: PathBuf,
    limits: Limits,
}

/// One checkpoint as stored.
#[derive(Serialize, Deserialize)]
struct Manifest {
    version: u32,
    /// The turn (or revert) it was taken at the start of, or `settled`.
    name: String,
    /// When it was taken, in nanoseconds since the epoch: the order of a session's checkpoints.
    order: u64,
    /// `[path, blob, size, inode, mtime_ns, ctime_ns]`.
    files: Vec<(String, String, u64, u64, i64, i64)>,
    skipped: Vec<String>,
}

/// A session's checkpoints as an export carries them: the manifests, and the contents they
/// name by hex SHA-256.
pub type ExportedCheckpoints = (Vec<serde_json::Value>, Vec<(String, Vec<u8>)>);

/// What a garbage collection found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Collected {
    /// Blobs removed.
    pub blobs_removed: u64,
    /// Their bytes.
    pub bytes_removed: u64,
    /// Bytes of the blobs kept.
    pub bytes_kept: u64,
}

/// Why an export's checkpoints are refused; nothing of them was written.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointImportError {
    /// A manifest that does not read as one.
    #[error("a checkpoint is not one this server reads: {0}")]
    Unreadable(serde_json::Error),
    /// A manifest of another format version.
    #[error("checkpoint version {0} is not {MANIFEST_VERSION}")]
    Version(u32),
    /// A manifest naming contents by something that is not a SHA-256.
    #[error("{0:?} is no SHA-256")]
    NoHash(String),
    /// A manifest naming contents the export does not carry.
    #[error("checkpoint {0} names contents the export lacks")]
    Lacking(String),
    /// A manifest naming a path a checkpoint never holds: inside `.git`, absolute, or
    /// leading out with `..`.
    #[error("checkpoint {name} names the path {path:?}, which no checkpoint holds")]
    Path {
        /// The checkpoint.
        name: String,
        /// The path.
        path: String,
    },
    /// Contents whose bytes do not hash to their name.
    #[error("checkpoint contents {0} do not match their SHA-256")]
    Forged(String),
    /// The checkpoint directory refused a write.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl CheckpointStore {
    /// The store at `root`, created if missing.
    pub fn open(root: &Path, limits: Limits) -> std::io::Result<Self> {
        std::fs::create_dir_all(root.join("blobs"))?;
        std::fs::create_dir_all(root.join("sessions"))?;
        Ok(Self {
            root: root.to_path_buf(),
            limits,
        })
    }

    /// What a checkpoint copies at most.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn blob_path(&self, hash: &Hash) -> PathBuf {
        let hex = hex(hash);
        self.root.join("blobs").join(&hex[..2]).join(&hex[2..])
    }

    /// Stores `bytes` (once, whoever stores them again); answers their hash.
    pub(super) fn put(&self, bytes: &[u8]) -> std::io::Result<Hash> {
        self.put_charged(bytes, None)
    }

    /// [`CheckpointStore::put`], contents not stored yet charged to `disk` first (refused
    /// with `QuotaExceeded` when it has no room).
    pub(super) fn put_charged(
        &self,
        bytes: &[u8],
        disk: Option<&crate::disk_quota::UserDisk>,
    ) -> std::io::Result<Hash> {
        let hash: Hash = Sha256::digest(bytes).into();
        let path = self.blob_path(&hash);
        if path.exists() {
            // Fresh again, so a collection running now leaves it alone.
            let _ = std::fs::File::options()
                .append(true)
                .open(&path)
                .and_then(|file| file.set_modified(SystemTime::now()));
            return Ok(hash);
        }
        if let Some(disk) = disk {
            disk.charge_beside(bytes.len() as u64)
                .map_err(|err| std::io::Error::new(std::io::ErrorKind::QuotaExceeded, err))?;
        }
        let dir = path.parent().unwrap_or(&self.root);
        std::fs::create_dir_all(dir)?;
        write_atomically(dir, &path, bytes)?;
        Ok(hash)
    }

    /// The bytes stored under `hash`.
    pub(super) fn get(&self, hash: &Hash) -> std::io::Result<Vec<u8>> {
        crate::capped_read::read_file(
            &self.blob_path(hash),
            self.limits.max_file_bytes.max(MAX_STORED_BYTES),
        )
    }

    fn session_dir(&self, session_id: &str) -> PathBuf {
        self.root.join("sessions").join(file_name(session_id))
    }

    /// Stores `snapshot` as the session's checkpoint `name`, replacing one of that name.
    pub fn save(
        &self,
        session_id: &str,
        name: &str,
        order: u64,
        snapshot: &Snapshot,
    ) -> std::io::Result<()> {
        let manifest = Manifest {
            version: MANIFEST_VERSION,
            name: name.to_string(),
            order,
            files: snapshot
                .files
                .iter()
                .map(|(path, entry)| {
                    let stamp = entry.stamp;
                    (
                        path.clone(),
                        hex(&entry.hash),
                        stamp.size,
                        stamp.inode,
                        stamp.modified_ns,
                        stamp.changed_ns,
                    )
                })
                .collect(),
            skipped: snapshot.skipped.iter().cloned().collect(),
        };
        let dir = self.session_dir(session_id);
        std::fs::create_dir_all(&dir)?;
        let text = serde_json::to_vec(&manifest).map_err(std::io::Error::other)?;
        write_atomically(&dir, &dir.join(format!("{}.json", file_name(name))), &text)
    }

    /// The session's checkpoints, oldest first, with their names (unreadable ones left out).
    pub fn load(&self, session_id: &str) -> Vec<(String, Snapshot)> {
        let Ok(entries) = std::fs::read_dir(self.session_dir(session_id)) else {
            return Vec::new();
        };
        let mut found: Vec<(u64, String, Snapshot)> = entries
            .flatten()
            .filter(|entry| entry.path().extension().is_some_and(|ext| ext == "json"))
            .filter_map(|entry| {
                let manifest: Manifest = serde_json::from_slice(
                    &crate::capped_read::read_file(&entry.path(), MAX_STORED_BYTES).ok()?,
                )
                .ok()?;
                (manifest.version == MANIFEST_VERSION).then_some(())?;
                let mut snapshot = Snapshot::default();
                for (path, blob, size, inode, modified_ns, changed_ns) in manifest.files {
                    let entry = Entry {
                        hash: unhex(&blob)?,
                        stamp: Stamp {
                            size,
                            inode,
                            modified_ns,
                            changed_ns,
                        },
                    };
                    snapshot.files.insert(path, entry);
                }
                snapshot.skipped = manifest.skipped.into_iter().collect();
                Some((manifest.order, manifest.name, snapshot))
            })
            .collect();
        found.sort_by_key(|(order, _, _)| *order);
        found
            .into_iter()
            .map(|(_, name, snapshot)| (name, snapshot))
            .collect()
    }

    /// Drops the session's checkpoint `name` (its blobs go at the next collection).
    pub fn forget(&self, session_id: &str, name: &str) {
        let _ = std::fs::remove_file(
            self.session_dir(session_id)
                .join(format!("{}.json", file_name(name))),
        );
    }

    /// The session's checkpoints for an export: each manifest as stored, and the contents
    /// they name, each once, with its SHA-256 in hex.
    pub fn export_session(&self, session_id: &str) -> std::io::Result<ExportedCheckpoints> {
        let mut manifests = Vec::new();
        let mut named = std::collections::BTreeSet::new();
        let Ok(entries) = std::fs::read_dir(self.session_dir(session_id)) else {
            return Ok((Vec::new(), Vec::new()));
        };
        for entry in entries.flatten() {
            if entry.path().extension().is_none_or(|ext| ext != "json") {
                continue;
            }
            let Ok(manifest) = serde_json::from_slice::<Manifest>(&crate::capped_read::read_file(
                &entry.path(),
                MAX_STORED_BYTES,
            )?) else {
                continue;
            };
            named.extend(manifest.files.iter().map(|file| file.1.clone()));
            manifests.push(serde_json::to_value(&manifest).map_err(std::io::Error::other)?);
        }
        let mut blobs = Vec::new();
        for blob in named {
            let hash = unhex(&blob).ok_or_else(|| std::io::Error::other("a bad blob name"))?;
            blobs.push((blob, self.get(&hash)?));
        }
        Ok((manifests, blobs))
    }

    /// Gives session `session_id` the checkpoints of an export: `blobs` by their hex SHA-256,
    /// each checked against its bytes, and every blob a manifest names present (given or
    /// stored already). Nothing is written unless all of it is sound.
    pub fn import_session(
        &self,
        session_id: &str,
        manifests: &[serde_json::Value],
        blobs: &std::collections::HashMap<String, Vec<u8>>,
    ) -> Result<(), CheckpointImportError> {
        use CheckpointImportError as Refused;
        let mut read = Vec::new();
        for value in manifests {
            let manifest: Manifest =
                serde_json::from_value(value.clone()).map_err(Refused::Unreadable)?;
            if manifest.version != MANIFEST_VERSION {
                return Err(Refused::Version(manifest.version));
            }
            for file in &manifest.files {
                unhex(&file.1).ok_or_else(|| Refused::NoHash(file.1.clone()))?;
                // Only the export's own contents: a blob another user's files put in the
                // store must neither be confirmed by an import nor written by its revert.
                if !blobs.contains_key(&file.1) {
                    return Err(Refused::Lacking(manifest.name.clone()));
                }
                if !checkpointable(&file.0) {
                    return Err(Refused::Path {
                        name: manifest.name.clone(),
                        path: file.0.clone(),
                    });
                }
            }
            read.push(manifest);
        }
        for (name, bytes) in blobs {
            if hex(&Sha256::digest(bytes).into()) != *name {
                return Err(Refused::Forged(name.clone()));
            }
        }
        for bytes in blobs.values() {
            self.put(bytes)?;
        }
        let dir = self.session_dir(session_id);
        std::fs::create_dir_all(&dir)?;
        for manifest in read {
            let text = serde_json::to_vec(&manifest).map_err(std::io::Error::other)?;
            let path = dir.join(format!("{}.json", file_name(&manifest.name)));
            write_atomically(&dir, &path, &text)?;
        }
        Ok(())
    }

    /// Drops every checkpoint of a deleted session.
    pub fn forget_session(&self, session_id: &str) {
        let _ = std::fs::remove_dir_all(self.session_dir(session_id));
    }

    /// Removes the blobs no manifest names (an hour old at least); answers what it did.
    pub fn collect_garbage(&self) -> std::io::Result<Collected> {
        let mut named = HashSet::new();
        for session in std::fs::read_dir(self.root.join("sessions"))?.flatten() {
            let Ok(manifests) = std::fs::read_dir(session.path()) else {
                continue;
            };
            for manifest in manifests.flatten() {
                let Ok(text) = crate::capped_read::read_file(&manifest.path(), MAX_STORED_BYTES)
                else {
                    continue;
                };
                match serde_json::from_slice::<Manifest>(&text) {
                    Ok(manifest) => {
                        named.extend(manifest.files.into_iter().map(|file| file.1));
                    }
                    // A manifest this version cannot read still keeps what it might name.
                    Err(_) => return Ok(Collected::default()),
                }
            }
        }
        let mut collected = Collected::default();
        let now = SystemTime::now();
        for prefix in std::fs::read_dir(self.root.join("blobs"))?.flatten() {
            let Ok(blobs) = std::fs::read_dir(prefix.path()) else {
                continue;
            };
            let prefix_name = prefix.file_name().to_string_lossy().into_owned();
            for blob in blobs.flatten() {
                let Ok(metadata) = blob.metadata() else {
                    continue;
                };
                let name = format!("{prefix_name}{}", blob.file_name().to_string_lossy());
                let old = metadata
                    .modified()
                    .ok()
                    .and_then(|modified| now.duration_since(modified).ok())
                    .is_some_and(|age| age >= GRACE);
                if named.contains(&name) || !old {
                    collected.bytes_kept += metadata.len();
                } else if std::fs::remove_file(blob.path()).is_ok() {
                    collected.blobs_removed += 1;
                    collected.bytes_removed += metadata.len();
                }
            }
        }
        Ok(collected)
    }
}

/// Writes `bytes` to `path` through a temporary file in `dir` renamed into place, so a reader
/// sees the old file or the whole new one.
fn write_atomically(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let temporary = dir.join(format!(".tmp-{}", uuid::Uuid::new_v4().simple()));
    let written = std::fs::File::create_new(&temporary)
        .and_then(|mut file| file.write_all(bytes))
        .and_then(|()| std::fs::rename(&temporary, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

/// A name safe as one file name: itself when it is plain, else its hash.
fn file_name(name: &str) -> String {
    let plain = !name.is_empty()
        && name.len() <= 100
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if plain {
        name.to_string()
    } else {
        format!("h{}", &hex(&Sha256::digest(name.as_bytes()).into())[..32])
    }
}

fn hex(hash: &Hash) -> String {
    use std::fmt::Write as _;
    hash.iter()
        .fold(String::with_capacity(64), |mut out, byte| {
            let _ = write!(out, "{byte:02x}");
            out
        })
}

fn unhex(text: &str) -> Option<Hash> {
    if text.len() != 64 {
        return None;
    }
    let mut hash = [0u8; 32];
    for (i, byte) in hash.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(hash)
}

/// Whether a manifest's path is one a checkpoint can hold: relative, every part a plain
/// name, none of them `.git` (a snapshot leaves `.git/` out, and a revert writes with the
/// server's rights).
fn checkpointable(path: &str) -> bool {
    let path = Path::new(path);
    !path.as_os_str().is_empty()
        && path.components().all(|part| match part {
            std::path::Component::Normal(name) => name != ".git",
            _ => false,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_are_not_plain_become_hashes() {
        assert_eq!(file_name("turn_1-a"), "turn_1-a");
        let hashed = file_name("../../etc/passwd");
        assert!(hashed.starts_with('h') && hashed.len() == 33, "{hashed}");
        assert_ne!(file_name("a/b"), file_name("a/c"));
        let hash: Hash = Sha256::digest(b"x").into();
        assert_eq!(unhex(&hex(&hash)), Some(hash));
        assert_eq!(unhex("zz"), None);
    }

    #[test]
    fn blobs_are_shared_and_only_old_unnamed_ones_are_collected() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(dir.path(), Limits::default()).unwrap();
        let kept = store.put(b"named").unwrap();
        assert_eq!(store.put(b"named").unwrap(), kept);
        let young = store.put(b"young and unnamed").unwrap();
        let old = store.put(b"old and unnamed").unwrap();
        let an_hour_ago = SystemTime::now() - GRACE - Duration::from_secs(1);
        for hash in [&kept, &old] {
            std::fs::File::options()
                .append(true)
                .open(store.blob_path(hash))
                .unwrap()
                .set_modified(an_hour_ago)
                .unwrap();
        }
        let mut snapshot = Snapshot::default();
        snapshot.files.insert(
            "a.txt".into(),
            Entry {
                hash: kept,
                stamp: Stamp::default(),
            },
        );
        store.save("s1", "turn_1", 1, &snapshot).unwrap();
        let collected = store.collect_garbage().unwrap();
        assert_eq!(collected.blobs_removed, 1);
        assert!(store.get(&kept).is_ok());
        assert!(store.get(&young).is_ok());
        assert!(store.get(&old).is_err());
        assert_eq!(store.load("s1"), vec![("turn_1".to_string(), snapshot)]);
        store.forget_session("s1");
        assert!(store.load("s1").is_empty());
    }
}
