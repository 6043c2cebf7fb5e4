//! The environment every process a session starts gets (commands, background tasks, hooks,
//! plugins, MCP stdio servers, git for worktrees): built once at start-up from a short list
//! of harmless names, what `[sandbox] env_pass` passes and what `env_set` sets. Nothing else
//! of the server's own environment is inherited, and no variable the configuration names as
//! holding a secret can be passed.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};

/// Names every process gets from the server's environment, when set there (besides `LC_*`).
const BASE_NAMES: [&str; 7] = ["PATH", "HOME", "USER", "LANG", "TERM", "TZ", "TMPDIR"];

/// Settings that keep child output plain text without pagers or colour codes.
const PLAIN_OUTPUT: [(&str, &str); 4] = [
    ("NO_COLOR", "1"),
    ("TERM", "dumb"),
    ("PAGER", "cat"),
    ("GIT_PAGER", "cat"),
];

/// Variables the server reads secrets from itself, whatever the configuration names.
pub const SERVER_SECRET_NAMES: [&str; 4] = [
    "AGENTD_LLM_API_KEY",
    "AGENTD_AUTH_TOKEN",
    "AGENTD_CLUSTER_SECRET",
    "DATABASE_URL",
];

/// The variables the configuration says hold secrets: every `*_env` it names, the server's
/// own secret variables and every `OTEL_*HEADERS` (where an exporter's key goes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretNames {
    /// Upper-cased, as environment names are compared here.
    names: BTreeSet<String>,
}

impl Default for SecretNames {
    fn default() -> Self {
        Self::new(std::iter::empty::<&str>())
    }
}

impl SecretNames {
    /// `names` (from the configuration) and [`SERVER_SECRET_NAMES`].
    pub fn new(names: impl IntoIterator<Item = impl AsRef<str>>) -> Self {
        let names = names
            .into_iter()
            .map(|name| name.as_ref().to_ascii_uppercase())
            .chain(SERVER_SECRET_NAMES.iter().map(|name| (*name).to_string()))
            .filter(|name| !name.is_empty())
            .collect();
        Self { names }
    }

    /// Whether `name` holds a secret the configuration or the server knows of.
    pub fn contains(&self, name: &str) -> bool {
        let upper = name.to_ascii_uppercase();
        self.names.contains(&upper) || (upper.starts_with("OTEL_") && upper.ends_with("HEADERS"))
    }
}

/// Whether a variable's name looks like it holds a credential; a second line of defence for
/// `env_pass`, behind the names the configuration itself declares secret.
pub fn looks_like_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    ["KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL"]
        .iter()
        .any(|word| upper.contains(word))
        || upper.starts_with("AGENTD_")
        || upper.starts_with("OPENAI_")
}

/// Why `[sandbox] env_pass` / `env_set` cannot be used as written, if they cannot: a name that
/// is empty or holds `=` or NUL, or one that holds a secret (declared or by its look).
pub fn configuration_problem(
    pass: &[String],
    set: &BTreeMap<String, String>,
    secrets: &SecretNames,
) -> Option<String> {
    let named = pass
        .iter()
        .map(|name| ("env_pass", name))
        .chain(set.keys().map(|name| ("env_set", name)));
    for (key, name) in named {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Some(format!(
                "sandbox.{key}: {name:?} is not an environment variable name"
            ));
        }
        if secrets.contains(name) {
            return Some(format!(
                "sandbox.{key}: {name:?} holds a secret the configuration names (an *_env \
                 key, OTEL_*HEADERS or the server's own); commands never get it"
            ));
        }
        if key == "env_pass" && looks_like_secret(name) {
            return Some(format!(
                "sandbox.env_pass: {name:?} looks like a secret (KEY, TOKEN, SECRET, \
                 PASSWORD, CREDENTIAL, AGENTD_*, OPENAI_*); commands never get it from the \
                 server's environment. Set a value meant for commands with env_set instead"
            ));
        }
    }
    for value in set.values() {
        if value.contains('\0') {
            return Some("sandbox.env_set: a value holds a NUL byte".into());
        }
    }
    None
}

/// The variables a process starts with, built once; cheap to share behind an `Arc`.
#[derive(Clone, PartialEq, Eq)]
pub struct CommandEnv {
    vars: Vec<(OsString, OsString)>,
}

impl std::fmt::Debug for CommandEnv {
    /// Names only: an `env_set` value may be something the operator would not print.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.vars.iter().map(|(name, _)| name))
            .finish()
    }
}

impl Default for CommandEnv {
    /// [`CommandEnv::minimal`].
    fn default() -> Self {
        Self::minimal()
    }
}

impl CommandEnv {
    /// The environment built from `source` (the server's own, at start-up): the base names and
    /// `LC_*`, the `pass` names that are no secret, the plain-output settings, then `set`.
    pub fn build(
        source: impl IntoIterator<Item = (OsString, OsString)>,
        pass: &[String],
        set: &BTreeMap<String, String>,
        secrets: &SecretNames,
    ) -> Self {
        let passed = |name: &str| {
            let base = BASE_NAMES.contains(&name) || name.starts_with("LC_");
            let asked = pass.iter().any(|p| p == name) && !looks_like_secret(name);
            (base || asked) && !secrets.contains(name)
        };
        let mut vars: BTreeMap<OsString, OsString> = source
            .into_iter()
            .filter(|(name, _)| name.to_str().is_some_and(passed))
            .collect();
        for (name, value) in PLAIN_OUTPUT {
            vars.insert(name.into(), value.into());
        }
        for (name, value) in set {
            if !secrets.contains(name) {
                vars.insert(name.into(), value.into());
            }
        }
        Self {
            vars: vars.into_iter().collect(),
        }
    }

    /// The base names and plain-output settings from the server's environment, with nothing
    /// passed or set: what a workspace made outside a configured server (a test, a tool used
    /// alone) gives its processes.
    pub fn minimal() -> Self {
        Self::build(
            std::env::vars_os(),
            &[],
            &BTreeMap::new(),
            &SecretNames::default(),
        )
    }

    /// Every variable, sorted by name.
    pub fn vars(&self) -> &[(OsString, OsString)] {
        &self.vars
    }

    /// The value of `name`, if the environment holds it.
    pub fn get(&self, name: &str) -> Option<&OsStr> {
        self.vars
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, value)| value.as_os_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server environment holding secrets under innocuous names.
    fn server_env() -> Vec<(OsString, OsString)> {
        [
            ("PATH", "/usr/bin:/bin"),
            ("HOME", "/home/agentd"),
            ("USER", "agentd"),
            ("LANG", "C.UTF-8"),
            ("LC_ALL", "C.UTF-8"),
            ("TZ", "UTC"),
            ("TERM", "xterm-256color"),
            ("ZETA_PROVIDER_CRED", "zeta-secret"),
            ("MCP_REMOTE_BEARER", "bearer-secret"),
            ("HOOK_SIGNING_WORD", "hook-secret"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-honeycomb-team=otel-secret"),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "otel-secret"),
            ("AGENTD_AUTH_TOKEN", "auth-secret"),
            ("AGENTD_CLUSTER_SECRET", "cluster-secret"),
            ("DATABASE_URL", "postgres://u:db-secret@h/d"),
            ("GITHUB_TOKEN", "gh-secret"),
            ("FOO_VISIBLE", "harmless"),
            ("BAR_PASSED", "passed"),
        ]
        .map(|(k, v)| (OsString::from(k), OsString::from(v)))
        .to_vec()
    }

    fn configured_secrets() -> SecretNames {
        SecretNames::new([
            "ZETA_PROVIDER_CRED",
            "mcp_remote_bearer",
            "HOOK_SIGNING_WORD",
        ])
    }

    fn names(env: &CommandEnv) -> Vec<&str> {
        env.vars()
            .iter()
            .map(|(name, _)| name.to_str().unwrap())
            .collect()
    }

    #[test]
    fn only_the_base_names_and_plain_output_settings_are_built_by_default() {
        let env = CommandEnv::build(server_env(), &[], &BTreeMap::new(), &configured_secrets());
        assert_eq!(
            names(&env),
            [
                "GIT_PAGER",
                "HOME",
                "LANG",
                "LC_ALL",
                "NO_COLOR",
                "PAGER",
                "PATH",
                "TERM",
                "TZ",
                "USER"
            ]
        );
        assert_eq!(env.get("TERM"), Some(OsStr::new("dumb")));
        for (_, value) in env.vars() {
            let value = value.to_string_lossy();
            assert!(!value.contains("secret"), "{value}");
            assert_ne!(value, "harmless");
        }
    }

    #[test]
    fn env_pass_passes_a_named_variable_and_env_set_sets_one_but_never_a_secret() {
        let pass = [
            "BAR_PASSED",
            // Not reachable however it is named: validation refuses these, and so does the
            // build, should a configuration made in code skip validation.
            "ZETA_PROVIDER_CRED",
            "OTEL_EXPORTER_OTLP_HEADERS",
            "DATABASE_URL",
            "GITHUB_TOKEN",
        ]
        .map(String::from);
        let set = BTreeMap::from([
            ("SET_BY_CONFIG".to_string(), "yes".to_string()),
            ("PAGER".to_string(), "less".to_string()),
            ("HOOK_SIGNING_WORD".to_string(), "overridden".to_string()),
        ]);
        let env = CommandEnv::build(server_env(), &pass, &set, &configured_secrets());
        assert_eq!(env.get("BAR_PASSED"), Some(OsStr::new("passed")));
        assert_eq!(env.get("SET_BY_CONFIG"), Some(OsStr::new("yes")));
        assert_eq!(env.get("PAGER"), Some(OsStr::new("less")));
        for name in [
            "ZETA_PROVIDER_CRED",
            "OTEL_EXPORTER_OTLP_HEADERS",
            "DATABASE_URL",
            "GITHUB_TOKEN",
            "HOOK_SIGNING_WORD",
            "FOO_VISIBLE",
        ] {
            assert_eq!(env.get(name), None, "{name}");
        }
    }

    #[test]
    fn a_secret_named_in_env_pass_or_env_set_is_a_configuration_problem() {
        let secrets = configured_secrets();
        let none = BTreeMap::new();
        let pass = |name: &str| configuration_problem(&[name.to_string()], &none, &secrets);
        for name in [
            "zeta_provider_cred",
            "MCP_REMOTE_BEARER",
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_EXPORTER_OTLP_LOGS_HEADERS",
            "AGENTD_AUTH_TOKEN",
            "AGENTD_CLUSTER_SECRET",
            "DATABASE_URL",
        ] {
            let problem = pass(name).unwrap_or_else(|| panic!("{name} accepted"));
            assert!(problem.contains("holds a secret"), "{problem}");
        }
        let problem = pass("GITHUB_TOKEN").unwrap();
        assert!(problem.contains("looks like a secret"), "{problem}");
        assert!(pass("A=B").is_some());
        assert!(pass("").is_some());
        assert_eq!(pass("BAR_PASSED"), None);

        let set = BTreeMap::from([("HOOK_SIGNING_WORD".to_string(), "x".to_string())]);
        let problem = configuration_problem(&[], &set, &secrets).unwrap();
        assert!(problem.starts_with("sandbox.env_set:"), "{problem}");
        let set = BTreeMap::from([("NPM_CONFIG_TOKEN".to_string(), "for-commands".to_string())]);
        assert_eq!(configuration_problem(&[], &set, &secrets), None);
    }
}
