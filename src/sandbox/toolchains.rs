//! Toolchains installed under the server user's home (pyenv, rustup, nvm, `~/.local/bin`):
//! which directories a sandboxed command must read for the `PATH` entries there to run, without
//! ever granting the home itself or the places where credentials live.

use std::path::{Component, Path, PathBuf};

/// Directories directly under the home that hold credentials or keys, never granted whole.
const SECRET_DIRS: &[&str] = &[
    ".ssh",
    ".aws",
    ".gnupg",
    ".config",
    ".docker",
    ".kube",
    ".azure",
    ".password-store",
];
/// Files that, found at the top of a would-be grant, hold credentials: the grant then narrows
/// to the `PATH` entry itself.
const SECRET_FILES: &[&str] = &[
    ".npmrc",
    ".pypirc",
    ".netrc",
    ".git-credentials",
    "credentials",
    "credentials.toml",
    "auth.json",
];

/// One directory granted read-only for the toolchains on `PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolchainGrant {
    /// The directory.
    pub path: PathBuf,
    /// The `PATH` entry it serves.
    pub for_entry: PathBuf,
}

/// What a `PATH` entry under the home was refused, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedEntry {
    /// The entry.
    pub entry: PathBuf,
    /// Why it is not granted.
    pub reason: &'static str,
}

/// The grants that make `PATH`'s entries under `home` runnable, and the entries refused.
///
/// An entry in a tool's own directory (`~/.pyenv/shims`, `~/.nvm/versions/node/v20/bin`) grants
/// that whole directory (`~/.pyenv`), since shims and version managers read their siblings;
/// `~/.cargo/bin` grants itself and `~/.rustup` but not `~/.cargo`, which holds the registry
/// token; `~/.local/bin` grants itself and `~/.local/lib`. The home itself, and directories
/// that keep keys (`~/.ssh`, `~/.config`, …), are never granted.
pub fn toolchain_grants(
    path_var: &std::ffi::OsStr,
    home: &Path,
) -> (Vec<ToolchainGrant>, Vec<RefusedEntry>) {
    let mut grants: Vec<ToolchainGrant> = Vec::new();
    let mut refused = Vec::new();
    let home = home.canonicalize().unwrap_or_else(|_| home.to_path_buf());
    for entry in std::env::split_paths(path_var) {
        if !entry.is_absolute() {
            continue;
        }
        let resolved = entry.canonicalize().unwrap_or_else(|_| entry.clone());
        let Ok(relative) = resolved.strip_prefix(&home) else {
            continue;
        };
        let Some(Component::Normal(top)) = relative.components().next() else {
            refused.push(RefusedEntry {
                entry,
                reason: "the home directory itself is never granted",
            });
            continue;
        };
        let top_name = top.to_string_lossy();
        if SECRET_DIRS.contains(&top_name.as_ref()) {
            refused.push(RefusedEntry {
                entry,
                reason: "it lies in a directory that keeps credentials",
            });
            continue;
        }
        let top_dir = home.join(top);
        let mut wanted = match top_name.as_ref() {
            ".cargo" => vec![resolved.clone(), home.join(".rustup")],
            ".local" => vec![resolved.clone(), home.join(".local/lib")],
            _ if holds_secrets(&top_dir) => vec![resolved.clone()],
            _ => vec![top_dir],
        };
        wanted.retain(|dir| dir.is_dir());
        for path in wanted {
            if !grants.iter().any(|grant| path.starts_with(&grant.path)) {
                grants.retain(|grant| !grant.path.starts_with(&path));
                grants.push(ToolchainGrant {
                    path,
                    for_entry: entry.clone(),
                });
            }
        }
    }
    (grants, refused)
}

fn holds_secrets(dir: &Path) -> bool {
    SECRET_FILES.iter().any(|name| dir.join(name).exists())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path_of(entries: &[PathBuf]) -> std::ffi::OsString {
        std::env::join_paths(entries).unwrap()
    }

    #[test]
    fn version_managers_get_their_root_and_never_the_home_or_cargo_credentials() {
        let home = tempfile::tempdir().unwrap();
        let h = home.path().canonicalize().unwrap();
        for dir in [
            ".pyenv/shims",
            ".pyenv/versions/3.11.7/bin",
            ".cargo/bin",
            ".rustup/toolchains",
            ".local/bin",
            ".local/lib",
            ".nvm/versions/node/v20/bin",
            ".config/tool/bin",
            "bin",
        ] {
            std::fs::create_dir_all(h.join(dir)).unwrap();
        }
        std::fs::write(h.join(".cargo/credentials.toml"), "token = \"x\"").unwrap();
        let path = path_of(&[
            h.join(".pyenv/shims"),
            h.join(".pyenv/versions/3.11.7/bin"),
            h.join(".cargo/bin"),
            h.join(".local/bin"),
            h.join(".nvm/versions/node/v20/bin"),
            h.join(".config/tool/bin"),
            h.clone(),
            h.join("bin"),
            PathBuf::from("/usr/bin"),
            PathBuf::from("relative/bin"),
        ]);
        let (grants, refused) = toolchain_grants(&path, &h);
        let granted: Vec<PathBuf> = grants.iter().map(|g| g.path.clone()).collect();
        assert_eq!(
            granted,
            [
                h.join(".pyenv"),
                h.join(".cargo/bin"),
                h.join(".rustup"),
                h.join(".local/bin"),
                h.join(".local/lib"),
                h.join(".nvm"),
                h.join("bin"),
            ]
        );
        assert!(!granted.contains(&h.join(".cargo")));
        let refused: Vec<PathBuf> = refused.into_iter().map(|r| r.entry).collect();
        assert_eq!(refused, [h.join(".config/tool/bin"), h.clone()]);
    }

    #[test]
    fn a_tool_root_with_a_credential_file_narrows_to_the_entry() {
        let home = tempfile::tempdir().unwrap();
        let h = home.path().canonicalize().unwrap();
        std::fs::create_dir_all(h.join(".volta/bin")).unwrap();
        std::fs::write(h.join(".volta/.npmrc"), "//registry/:_authToken=x").unwrap();
        let (grants, _) = toolchain_grants(&path_of(&[h.join(".volta/bin")]), &h);
        assert_eq!(grants.len(), 1);
        assert_eq!(grants[0].path, h.join(".volta/bin"));
    }
}
