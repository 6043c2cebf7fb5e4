//! Reading each command of a line: keywords and assignments skipped, the program found, and
//! what it runs followed through wrappers, shells, interpreters and the programs of
//! [`super::programs`].

use super::interpreters::{SHELLS, interpreter};
use super::lex::{Input, MARK, Word, segments, words_text};
use super::wrappers::WRAPPERS;
use super::{
    Concern, Reading, RunTimeArgs, Seen, Unreadable, base_name, is_local, names_git_directory,
};

/// Nesting deeper than this (`sh -c "env sh -c '…'"`) is not followed; the command then counts
/// as a concern.
const MAX_DEPTH: usize = 12;

/// Words that may start a command and are not its program.
const SKIPPED_KEYWORDS: &[&str] = &[
    "!", "if", "then", "else", "elif", "fi", "while", "until", "do", "done", "{", "}", "coproc",
];

/// Variables that choose the program that runs or what it loads.
const RUN_ENVIRONMENT: &[&str] = &[
    "PATH",
    "HOME",
    "ENV",
    "BASH_ENV",
    "ZDOTDIR",
    "SHELLOPTS",
    "BASHOPTS",
    "PS0",
    "PS1",
    "PS2",
    "PS3",
    "PS4",
    "PROMPT_COMMAND",
    "XDG_CONFIG_HOME",
    "XDG_CONFIG_DIRS",
    "EDITOR",
    "VISUAL",
    "PAGER",
    "MANPAGER",
    "LESSOPEN",
    "LESSCLOSE",
    "BROWSER",
    "SHELL",
    "SSH_ASKPASS",
    "SUDO_ASKPASS",
    "RSYNC_RSH",
    "TAR_OPTIONS",
    "MAKEFLAGS",
    "PERL5OPT",
    "PYTHONSTARTUP",
    "PYTHONHOME",
    "RUBYOPT",
    "NODE_OPTIONS",
    "RUSTC",
    "RUSTC_WRAPPER",
    "RUSTDOC",
    "CC",
    "CXX",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
];
/// Prefixes of such variables.
const RUN_ENVIRONMENT_PREFIXES: &[&str] = &[
    "LD_",
    "DYLD_",
    "GIT_",
    "BASH_FUNC_",
    "CARGO_",
    "NPM_CONFIG_",
    "npm_config_",
];
/// Names under those prefixes that choose no program: build and output settings.
const HARMLESS_ENVIRONMENT: &[&str] = &[
    "CARGO_TARGET_DIR",
    "CARGO_INCREMENTAL",
    "CARGO_TERM_COLOR",
    "CARGO_TERM_VERBOSE",
    "CARGO_TERM_QUIET",
    "CARGO_BUILD_JOBS",
    "CARGO_NET_OFFLINE",
    "GIT_TERMINAL_PROMPT",
    "GIT_AUTHOR_NAME",
    "GIT_AUTHOR_EMAIL",
    "GIT_AUTHOR_DATE",
    "GIT_COMMITTER_NAME",
    "GIT_COMMITTER_EMAIL",
    "GIT_COMMITTER_DATE",
    "GIT_OPTIONAL_LOCKS",
];

/// Whether assigning `name` may choose the program that runs or what it loads.
pub(super) fn is_run_environment(name: &str) -> bool {
    let name = name.split('[').next().unwrap_or(name);
    !HARMLESS_ENVIRONMENT.contains(&name)
        && (RUN_ENVIRONMENT.contains(&name)
            || RUN_ENVIRONMENT_PREFIXES.iter().any(|p| name.starts_with(p)))
}

/// Whether `name=value` chooses a program: a pager or editor set to `cat` or nothing does not.
fn assignment_chooses(name: &str, value: &str) -> bool {
    let pager = matches!(
        name,
        "PAGER" | "GIT_PAGER" | "MANPAGER" | "EDITOR" | "VISUAL" | "GIT_EDITOR"
    );
    is_run_environment(name) && !(pager && matches!(value, "" | "cat" | "true" | ":"))
}

/// Where a command stands: what ran it, what it gets at run time, how deep, and where its
/// input comes from.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Context<'a> {
    pub(super) via: Option<&'a str>,
    pub(super) run_time: Option<&'a RunTimeArgs>,
    pub(super) depth: usize,
    pub(super) input: Option<&'a Input>,
}

impl<'a> Context<'a> {
    /// The context of a command run by the one in `self`.
    pub(super) fn inner(self, via: &'a str) -> Self {
        Self {
            via: Some(via),
            depth: self.depth + 1,
            ..self
        }
    }

    /// Whether its arguments may come from input (`xargs`).
    pub(super) fn appended(self) -> bool {
        self.run_time.is_some_and(|r| r.appended)
    }

    /// Whether `word` may be replaced at run time (`{}`).
    pub(super) fn replaces(self, word: &str) -> bool {
        self.run_time.is_some_and(|r| r.replaces(word))
    }
}

/// The reading's state: every command seen so far.
pub(super) struct Reader {
    pub(super) seen: Vec<Seen>,
    pub(super) typed: bool,
    /// What the line starts can read a terminal (`exec_command` with `tty`, typed text).
    pub(super) terminal: bool,
}

/// Reads a whole line (see [`super::read_with_terminal`]).
pub(super) fn read_line(text: &str, typed: bool, terminal: bool) -> Result<Reading, Unreadable> {
    let segments = segments(text, typed)?;
    let mut reader = Reader {
        seen: Vec::new(),
        typed,
        terminal: terminal || typed,
    };
    for segment in &segments {
        let cx = Context {
            via: segment.substituted.then_some("a substitution"),
            input: segment.input.as_ref(),
            ..Context::default()
        };
        reader.command(&segment.words, cx)?;
    }
    Ok(Reading {
        commands: segments.len(),
        seen: reader.seen,
    })
}

impl Reader {
    /// Reads a command line nested in the command at `at` (`sh -c TEXT`, `eval`, a git
    /// alias) as the commands it runs; its first command reads the same input. Text known only
    /// at run time is a concern of the command at `at`.
    pub(super) fn line(
        &mut self,
        at: usize,
        text: &str,
        via: &str,
        cx: Context<'_>,
    ) -> Result<(), Unreadable> {
        if text.contains(MARK) {
            self.concern(at, Concern::Expansion);
            return Ok(());
        }
        let segments = segments(text, self.typed)?;
        for (k, segment) in segments.iter().enumerate() {
            let input = match segment.input.as_ref() {
                Some(input) => Some(input),
                None if k == 0 => cx.input,
                None => None,
            };
            let cx = Context {
                via: Some(via),
                run_time: None,
                depth: cx.depth + 1,
                input,
            };
            self.command(&segment.words, cx)?;
        }
        Ok(())
    }

    pub(super) fn push(&mut self, seen: Seen) -> usize {
        self.seen.push(seen);
        self.seen.len() - 1
    }

    pub(super) fn concern(&mut self, at: usize, concern: Concern) {
        if !self.seen[at].concerns.contains(&concern) {
            self.seen[at].concerns.push(concern);
        }
    }

    /// Reads one command's words: skips keywords and assignments, records the command, and
    /// follows what it runs.
    pub(super) fn command(&mut self, words: &[Word], cx: Context<'_>) -> Result<(), Unreadable> {
        let mut words = words;
        let mut environment = Vec::new();
        while let Some((first, rest)) = words.split_first() {
            if first.is_keyword("for") || first.is_keyword("select") {
                // `for NAME in WORDS`: a list of words; its commands follow `do`.
                return Ok(());
            }
            if first.is_keyword("case") || first.is_keyword("esac") {
                return Err(Unreadable("a case … esac the rules do not follow"));
            }
            if SKIPPED_KEYWORDS.iter().any(|k| first.is_keyword(k)) {
                words = rest;
            } else if first.is_keyword("function") {
                words = rest.get(1..).unwrap_or_default();
            } else if cx.run_time.is_none()
                && let Some(name) = first.assignment()
            {
                let value = first.text.split_once('=').map_or("", |(_, v)| v);
                if assignment_chooses(name, value) {
                    environment.push(Concern::RunEnvironment(name.to_string()));
                }
                if value.contains("$(") || value.contains('`') {
                    // Arithmetic (`$((x))`, `[[ x -eq 1 ]]`) would run a value's `$(…)`.
                    environment.push(Concern::Expansion);
                }
                words = rest;
            } else {
                break;
            }
        }
        let Some((program, args)) = words.split_first() else {
            if !environment.is_empty() {
                self.push(Seen {
                    via: cx.via.map(str::to_string),
                    concerns: environment,
                    ..Seen::default()
                });
            }
            return Ok(());
        };
        let base = base_name(&program.text).to_string();
        let mut argv = vec![base.clone()];
        argv.extend(args.iter().map(|w| w.text.clone()));
        let mut concerns = environment;
        if program.glob {
            concerns.push(Concern::Glob);
        }
        let expanded = program.dynamic();
        if expanded {
            concerns.push(Concern::Expansion);
        }
        if args.iter().any(|w| names_git_directory(&w.text)) {
            concerns.push(Concern::GitDirectory);
        }
        let from_input = cx.replaces(&program.text);
        if from_input {
            concerns.push(Concern::CommandFromInput);
        }
        let too_deep = cx.depth > MAX_DEPTH;
        if too_deep {
            concerns.push(Concern::TooDeep);
        }
        let at = self.push(Seen {
            argv,
            program: program.text.clone(),
            local: is_local(&program.text),
            via: cx.via.map(str::to_string),
            transparent: false,
            run_time_args: cx.run_time.cloned(),
            concerns,
        });
        if from_input || too_deep || expanded {
            return Ok(());
        }
        self.follow(at, &base, args, cx)
    }

    /// Follows what the command at `at` (program `base`, arguments `args`) runs.
    fn follow(
        &mut self,
        at: usize,
        base: &str,
        args: &[Word],
        cx: Context<'_>,
    ) -> Result<(), Unreadable> {
        if let Some(&(name, spec, positional, transparent)) =
            WRAPPERS.iter().find(|(name, ..)| *name == base)
        {
            let parsed = match self.options(at, args, spec) {
                Some(parsed) if !parsed.stopped => parsed,
                _ => return Ok(()),
            };
            let start = (parsed.taken + positional).min(args.len());
            if name == "chroot" && start == args.len() {
                self.reads_input(at, cx);
            }
            return self.inner(at, args, start, transparent, cx.inner(name));
        }
        if SHELLS.contains(&base) {
            return self.shell(at, base, args, cx);
        }
        if let Some(spec) = interpreter(base) {
            self.interpreter(at, spec, args, cx);
            return Ok(());
        }
        match base {
            "env" => self.env(at, args, cx),
            "sudo" => self.sudo(at, args, cx),
            "xargs" => self.xargs(at, args, cx),
            "find" => self.find(at, args, cx),
            "git" => self.git(at, args, cx),
            "busybox" | "toybox" => {
                if args.first().is_some_and(|w| !w.text.starts_with('-')) {
                    self.seen[at].transparent = true;
                    self.command(args, cx.inner(base))?;
                }
                Ok(())
            }
            "watch" => self.watch(at, args, cx),
            "flock" => self.flock(at, args, cx),
            "su" | "runuser" => self.su(at, args, cx),
            "eval" => {
                self.seen[at].transparent = true;
                if cx.appended() || args.iter().any(|w| cx.replaces(&w.text)) {
                    self.concern(at, Concern::CommandFromInput);
                }
                self.line(at, &words_text(args), "eval", cx)
            }
            "source" | "." => {
                self.concern(at, Concern::ShellInput);
                Ok(())
            }
            "alias" => {
                for (_, text) in args.iter().filter_map(|w| w.text.split_once('=')) {
                    self.seen[at].transparent = true;
                    self.line(at, text, "alias", cx)?;
                }
                Ok(())
            }
            "trap" => {
                let args = match args.first() {
                    Some(w) if w.text == "--" => &args[1..],
                    _ => args,
                };
                if let [action, _, ..] = args
                    && !action.text.starts_with('-')
                    && !action.text.chars().all(|c| c.is_ascii_digit())
                {
                    self.seen[at].transparent = true;
                    self.line(at, &action.text, "trap", cx)?;
                }
                Ok(())
            }
            "export" | "declare" | "typeset" | "local" | "readonly" => {
                let nameref = args
                    .iter()
                    .any(|w| w.text.starts_with('-') && w.text.contains('n'));
                for word in args.iter().filter(|w| !w.text.starts_with('-')) {
                    let Some((name, value)) = word.text.split_once('=') else {
                        if word.dynamic() {
                            self.concern(at, Concern::Expansion);
                        }
                        continue;
                    };
                    self.assigns(at, name.trim_end_matches('+'), value);
                    if nameref && is_run_environment(value) {
                        self.concern(at, Concern::RunEnvironment(value.to_string()));
                    }
                }
                Ok(())
            }
            "printf" => {
                let name = match args.first().map(|w| w.text.as_str()) {
                    Some("-v") => args.get(1).map(|w| w.text.as_str()),
                    Some(option) => option.strip_prefix("-v").filter(|n| !n.is_empty()),
                    None => None,
                };
                if let Some(name) = name {
                    self.assigns(at, name, "?");
                }
                Ok(())
            }
            "read" | "mapfile" | "readarray" => {
                let mut i = 0;
                while let Some(word) = args.get(i) {
                    let text = word.text.as_str();
                    i += 1;
                    match text {
                        "-a" | "-C" | "-O" | "-u" => {
                            if let Some(name) = args.get(i) {
                                self.assigns(at, &name.text, "?");
                            }
                            i += 1;
                        }
                        "-d" | "-i" | "-n" | "-N" | "-p" | "-t" | "-c" | "-s" => i += 1,
                        _ if text.starts_with('-') => {}
                        name => self.assigns(at, name, "?"),
                    }
                }
                Ok(())
            }
            "hash" | "enable" => {
                let option = if base == "hash" { 'p' } else { 'f' };
                if args
                    .iter()
                    .any(|w| w.text.starts_with('-') && w.text.contains(option))
                {
                    self.concern(at, Concern::RunEnvironment(format!("{base} -{option}")));
                }
                Ok(())
            }
            "unlink" | "shred" | "rmdir" => {
                self.deletes(at, base, args.iter().map(|w| w.text.clone()).collect());
                Ok(())
            }
            "rsync" => self.rsync(at, args, cx),
            "awk" | "gawk" | "mawk" | "nawk" | "busybox-awk" => {
                self.awk(at, args, cx);
                Ok(())
            }
            "sed" | "gsed" => {
                self.sed(at, args);
                Ok(())
            }
            "tar" | "gtar" | "bsdtar" => self.tar(at, args, cx),
            "make" | "gmake" | "bmake" => {
                self.make(at, args, cx);
                Ok(())
            }
            "ssh" | "scp" | "sftp" => self.ssh(at, base, args, cx),
            _ => {
                self.terminal_program(at, base);
                Ok(())
            }
        }
    }

    /// A variable assigned by a builtin (`export`, `printf -v`, `read`): one that chooses the
    /// program asks, and so does a name the words do not show.
    fn assigns(&mut self, at: usize, name: &str, value: &str) {
        if name.contains(MARK) {
            self.concern(at, Concern::Expansion);
        } else if assignment_chooses(name, value) {
            self.concern(at, Concern::RunEnvironment(name.to_string()));
        }
    }
}
