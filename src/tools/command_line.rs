//! What a command line runs, as the command rules see it: the line split into its commands and
//! each command seen through what runs another command (`env`, `sudo`, `xargs`, `find -exec`,
//! `sh -c`, `eval`, git aliases, …), so that a rule about `rm` also meets `env rm`, `/bin/rm`
//! and `sh -c 'rm x'`.
//!
//! [`read`] gives every command a line runs as a [`Seen`]: its argv with the program by its base
//! name, and the [`Concern`]s that words alone cannot settle (a glob in the program's name, code
//! given to an interpreter, a file sourced, git configuration from the command line). A line the
//! reading cannot follow — substitutions, variables, redirections, subshells, quoting that does
//! not close — is [`Unreadable`]. Judging is [`super::approval`]'s.

use std::fmt;

/// Nesting deeper than this (`sh -c "env sh -c '…'"`) is not followed; the command then counts
/// as a concern.
const MAX_DEPTH: usize = 12;

/// Where a text to read comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A command line run with `sh -c` (`shell`, `exec_command`).
    Line,
    /// Characters typed into a running process (`write_stdin`): possibly an interactive shell,
    /// with history expansion, line editing and completion, and with lines that a later write
    /// may finish.
    Typed,
}

/// Why a line cannot be judged word by word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unreadable(pub &'static str);

impl fmt::Display for Unreadable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// What a line runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reading {
    /// How many commands the line itself has, before any is unwrapped (`a | b && c` has 3).
    pub commands: usize,
    /// Every command the line runs, wrappers and what they run alike.
    pub seen: Vec<Seen>,
}

/// One command a line runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    /// The program by its base name (`/usr/bin/rm` → `rm`) and its arguments. Empty for a line
    /// of assignments only (`PATH=.`).
    pub argv: Vec<String>,
    /// The program as written (`./rm`, `/usr/bin/rm`), for rules that name a path.
    pub program: String,
    /// The program was named by a path outside the system's program directories (`./ls`):
    /// it is not the program a rule names, so allow rules and grants by name do not match it.
    pub local: bool,
    /// The form that ran it, for the person deciding (`env`, `sh -c`, `find -delete`); `None`
    /// for a command of the line itself.
    pub via: Option<String>,
    /// It only runs what it wraps (`env`, `time`, `sh -c`), which is judged on its own: no
    /// tool-level ask applies to the wrapper itself, only a rule naming it.
    pub transparent: bool,
    /// Arguments given at run time: `xargs` appends some, and `find -exec` / `xargs -I`
    /// replace this placeholder in any word.
    pub run_time_args: Option<RunTimeArgs>,
    /// What words alone cannot settle about it.
    pub concerns: Vec<Concern>,
}

/// Arguments a command receives only when it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunTimeArgs {
    /// More arguments are appended after the written ones.
    pub appended: bool,
    /// Words holding this text are replaced (`{}`).
    pub placeholder: Option<String>,
}

impl RunTimeArgs {
    /// Whether `word` may be replaced at run time.
    pub fn replaces(&self, word: &str) -> bool {
        self.placeholder
            .as_deref()
            .is_some_and(|placeholder| word.contains(placeholder))
    }
}

/// Something about a command that its words cannot settle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Concern {
    /// A glob character in the program's name or in a wrapper's words: the shell picks the
    /// program from file names (`/usr/bin/r? x`).
    Glob,
    /// A wrapper's option the reading does not know, so where its command starts is unknown.
    UnknownOption(String),
    /// The program's name comes from input (`xargs` with no command of its own, `-exec {} ;`).
    CommandFromInput,
    /// Shell code from a file or from input: `source`, `.`, `sh FILE`, `… | sh`, `su` without
    /// `-c`.
    ShellInput,
    /// git configuration from the command line or written (`-c`, `--config-env`, `git config
    /// KEY VALUE`, `--upload-pack`): configuration can make git run any program.
    GitConfig,
    /// An interpreter given code on its command line or on its input (`python3 -c`,
    /// `perl -e`, `node -e`, `awk` calling `system`).
    InlineCode,
    /// A command that deletes files; its `Seen` is the `rm` it counts as.
    Deletes,
    /// A variable that chooses the program or what it loads (`PATH`, `LD_PRELOAD`, `GIT_*`).
    RunEnvironment(String),
    /// A path inside a `.git` directory among its arguments.
    GitDirectory,
    /// Nested deeper than the reading follows.
    TooDeep,
}

impl Concern {
    /// Whether only a rule about `rm` makes it ask (else any ask or deny rule does).
    pub fn is_about_deleting(&self) -> bool {
        matches!(self, Self::InlineCode | Self::Deletes)
    }

    /// Why it asks, for the person deciding.
    pub fn reason(&self, seen: &Seen) -> String {
        let command = seen.argv.join(" ");
        match self {
            Self::Glob => format!(
                "a glob in the program's name lets the shell pick the program from file names: \
                 {command}"
            ),
            Self::UnknownOption(option) => format!(
                "an option the rules cannot follow ({option}) hides which command runs: {command}"
            ),
            Self::CommandFromInput => {
                format!("the command comes from input at run time: {command}")
            }
            Self::ShellInput => {
                format!("shell code from a file or from input, unseen by the rules: {command}")
            }
            Self::GitConfig => format!(
                "git configuration given or written on the command line can make git run any \
                 program: {command}"
            ),
            Self::InlineCode => {
                format!("an interpreter given code can delete files without rm: {command}")
            }
            Self::Deletes => format!(
                "{} deletes files, so it counts as rm",
                seen.via.as_deref().unwrap_or("it")
            ),
            Self::RunEnvironment(name) => {
                format!("{name} chooses which program runs or what it loads: {command}")
            }
            Self::GitDirectory => format!(
                "a path inside a .git directory: a repository's configuration and hooks can make \
                 an allowed git command run anything: {command}"
            ),
            Self::TooDeep => format!("nested deeper than the rules follow: {command}"),
        }
    }
}

/// Reads `text` into the commands it runs.
pub fn read(text: &str, source: Source) -> Result<Reading, Unreadable> {
    let typed = source == Source::Typed;
    if typed {
        // Ctrl-C and Ctrl-D on their own interrupt or end input; they type no command.
        if text.chars().all(|c| matches!(c, '\u{3}' | '\u{4}')) {
            return Ok(Reading::default());
        }
        check_typed(text)?;
    }
    let segments = segments(text, typed)?;
    let mut reader = Reader {
        seen: Vec::new(),
        typed,
    };
    for segment in &segments {
        let cx = Context {
            piped: segment.piped,
            ..Context::default()
        };
        reader.command(&segment.words, cx)?;
    }
    Ok(Reading {
        commands: segments.len(),
        seen: reader.seen,
    })
}

/// Characters typed into a process are refused when a terminal or an interactive shell would
/// make of them something else than the words they show: editing and completion keys, escape
/// sequences, a line a later write finishes.
fn check_typed(text: &str) -> Result<(), Unreadable> {
    if text
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\r')
    {
        return Err(Unreadable(
            "control characters, escape sequences or tabs that a terminal or a shell's line \
             editor turns into other text",
        ));
    }
    if !text.trim().is_empty() && !text.ends_with(['\n', '\r']) {
        return Err(Unreadable(
            "a line without its newline, which a later write_stdin can finish",
        ));
    }
    Ok(())
}

/// One word after quote removal.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Word {
    text: String,
    /// An unquoted `*`, `?` or `[`: the shell may replace the word with file names.
    glob: bool,
    /// Bytes of `text` before the first quoted or escaped character.
    plain: usize,
}

impl Word {
    fn literal(text: &str) -> Self {
        Self {
            text: text.to_string(),
            glob: false,
            plain: text.len(),
        }
    }

    /// `NAME=value` with an unquoted, valid name.
    fn assignment(&self) -> Option<&str> {
        let (name, _) = self.text.split_once('=')?;
        let valid = !name.is_empty()
            && name.len() < self.plain
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        valid.then_some(name)
    }
}

/// A word being built by the lexer.
#[derive(Default)]
struct Building {
    text: String,
    glob: bool,
    plain: Option<usize>,
    started: bool,
}

impl Building {
    fn push(&mut self, c: char) {
        self.started = true;
        self.text.push(c);
    }

    fn push_quoted(&mut self, c: char) {
        self.quoted();
        self.text.push(c);
    }

    fn quoted(&mut self) {
        self.started = true;
        self.plain.get_or_insert(self.text.len());
    }

    fn finish(&mut self, into: &mut Vec<Word>) {
        if self.started {
            let text = std::mem::take(&mut self.text);
            into.push(Word {
                plain: self.plain.unwrap_or(text.len()),
                text,
                glob: self.glob,
            });
        }
        *self = Self::default();
    }
}

const SUBSTITUTION: Unreadable =
    Unreadable("a substitution or variable ($, `) whose value the rules cannot see");
const REDIRECTION: Unreadable = Unreadable("a redirection (<, >)");
const SUBSHELL: Unreadable = Unreadable("a subshell, group or brace expansion ((, ), {, })");
const OPEN_QUOTE: Unreadable = Unreadable("quoting that does not close");
const CONTROL: Unreadable = Unreadable("a control character");
const HISTORY: Unreadable = Unreadable("history expansion (!, ^) of an interactive shell");
const COMPOUND: Unreadable =
    Unreadable("a case, for, select, function or [[ … ]] the rules do not follow");

/// One command of a line: its words, and whether its input is piped from the one before.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Segment {
    words: Vec<Word>,
    piped: bool,
}

/// Splits `text` into commands of words at unquoted `|`, `||`, `|&`, `&&`, `;`, `&` and
/// newlines, the way `sh` would, or says why it cannot.
fn segments(text: &str, typed: bool) -> Result<Vec<Segment>, Unreadable> {
    let chars: Vec<char> = text.chars().collect();
    let mut segments = Vec::new();
    let mut words = Vec::new();
    let mut word = Building::default();
    let mut piped = false;
    let mut end_segment = |words: &mut Vec<Word>, word: &mut Building, pipe: bool| {
        word.finish(words);
        if !words.is_empty() {
            segments.push(Segment {
                words: std::mem::take(words),
                piped,
            });
        }
        piped = pipe;
    };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        match c {
            ' ' | '\t' => word.finish(&mut words),
            '\n' => end_segment(&mut words, &mut word, false),
            '\r' if typed => end_segment(&mut words, &mut word, false),
            '#' if !word.started => {
                while i + 1 < chars.len() && chars[i + 1] != '\n' {
                    i += 1;
                }
            }
            '\'' => {
                word.quoted();
                loop {
                    i += 1;
                    match chars.get(i) {
                        None => return Err(OPEN_QUOTE),
                        Some('\'') => break,
                        Some(&c) => word.push_quoted(c),
                    }
                }
            }
            '"' => {
                word.quoted();
                loop {
                    i += 1;
                    match chars.get(i) {
                        None => return Err(OPEN_QUOTE),
                        Some('"') => break,
                        Some('$' | '`') => return Err(SUBSTITUTION),
                        Some('!') if typed => return Err(HISTORY),
                        Some('\\') => match chars.get(i + 1) {
                            Some('\n') => i += 1,
                            Some(&e @ ('$' | '`' | '"' | '\\')) => {
                                word.push_quoted(e);
                                i += 1;
                            }
                            _ => word.push_quoted('\\'),
                        },
                        Some(&c) => word.push_quoted(c),
                    }
                }
            }
            '\\' => match next {
                Some('\n') => i += 1,
                Some(e) => {
                    word.push_quoted(e);
                    i += 1;
                }
                None => return Err(OPEN_QUOTE),
            },
            '$' | '`' => return Err(SUBSTITUTION),
            '<' | '>' => return Err(REDIRECTION),
            '(' | ')' | '}' => return Err(SUBSHELL),
            '{' if next == Some('}') => {
                word.push('{');
                word.push('}');
                i += 1;
            }
            '{' => return Err(SUBSHELL),
            '|' | '&' => {
                let pipe = c == '|' && next != Some('|');
                if matches!((c, next), ('|', Some('|' | '&')) | ('&', Some('&'))) {
                    i += 1;
                }
                end_segment(&mut words, &mut word, pipe);
            }
            ';' => {
                if matches!(next, Some(';' | '&')) {
                    return Err(COMPOUND);
                }
                end_segment(&mut words, &mut word, false);
            }
            '!' if typed => return Err(HISTORY),
            '^' if typed && !word.started && words.is_empty() => return Err(HISTORY),
            '*' | '?' | '[' => {
                word.glob = true;
                word.push(c);
            }
            c if c.is_control() => return Err(CONTROL),
            c => word.push(c),
        }
        i += 1;
    }
    end_segment(&mut words, &mut word, false);
    Ok(segments)
}

/// Words that may start a command and are not its program.
const SKIPPED_KEYWORDS: &[&str] = &[
    "!", "if", "then", "else", "elif", "fi", "while", "until", "do", "done",
];
/// Compound commands the reading does not follow.
const COMPOUND_KEYWORDS: &[&str] = &[
    "case", "esac", "for", "select", "function", "coproc", "[[", "]]", "in",
];

/// Directories whose programs are the ones rules name.
const SYSTEM_DIRS: &[&str] = &[
    "/bin",
    "/sbin",
    "/usr/bin",
    "/usr/sbin",
    "/usr/local/bin",
    "/usr/local/sbin",
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
    "PS1",
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
    "PERL5OPT",
    "PERL5LIB",
    "PERLLIB",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "RUBYOPT",
    "RUBYLIB",
    "NODE_OPTIONS",
    "NODE_PATH",
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

fn is_run_environment(name: &str) -> bool {
    RUN_ENVIRONMENT.contains(&name) || RUN_ENVIRONMENT_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The last component of a program path.
pub fn base_name(program: &str) -> &str {
    program.rsplit('/').next().unwrap_or(program)
}

/// Whether a program named `program` is found outside the system's program directories
/// (`./ls`, `/tmp/x/rm`); a bare name is found through `PATH`.
pub fn is_local(program: &str) -> bool {
    match program.rsplit_once('/') {
        None => false,
        Some((dir, _)) => !SYSTEM_DIRS.contains(&dir.trim_end_matches('/')),
    }
}

/// Whether `word` names a path inside, or is, a `.git` directory (also after `=` or `:`, and
/// as a glob that may match one).
fn names_git_directory(word: &str) -> bool {
    word.split(['/', '=', ':', '\\']).any(|part| {
        part.eq_ignore_ascii_case(".git")
            || (part.starts_with('.')
                && part.contains(['*', '?', '['])
                && glob_matches(part, ".git"))
    })
}

/// A small glob matcher: `*`, `?` and a `[…]` class standing for any one character. Linear in
/// the pattern's length for each character of `text`, whatever the pattern.
fn glob_matches(pattern: &str, text: &str) -> bool {
    enum Token {
        Any,
        One,
        Char(char),
    }
    let mut tokens = Vec::new();
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        tokens.push(match c {
            '*' => Token::Any,
            '?' => Token::One,
            '[' if pattern.contains(']') => {
                for c in chars.by_ref() {
                    if c == ']' {
                        break;
                    }
                }
                Token::One
            }
            c => Token::Char(c),
        });
    }
    // reachable[k]: the first k tokens can match the text read so far.
    let mut reachable = vec![false; tokens.len() + 1];
    reachable[0] = true;
    let close = |reachable: &mut Vec<bool>| {
        for k in 0..tokens.len() {
            if reachable[k] && matches!(tokens[k], Token::Any) {
                reachable[k + 1] = true;
            }
        }
    };
    close(&mut reachable);
    for t in text.chars() {
        let mut next = vec![false; tokens.len() + 1];
        for k in 0..tokens.len() {
            if reachable[k] {
                match tokens[k] {
                    Token::Any => next[k] = true,
                    Token::One => next[k + 1] = true,
                    Token::Char(c) if c.eq_ignore_ascii_case(&t) => next[k + 1] = true,
                    Token::Char(_) => {}
                }
            }
        }
        close(&mut next);
        reachable = next;
    }
    reachable[tokens.len()]
}

/// The options of a program that runs another, to find where that command starts.
#[derive(Default)]
struct Options {
    /// Short options without a value.
    flags: &'static str,
    /// Short options with a value, attached (`-n5`) or the next word.
    valued: &'static str,
    /// Short options whose value, if any, is attached (`-i{}`).
    attached: &'static str,
    /// Short options after which no command runs (`command -v`).
    stops: &'static str,
    /// Long options without a value (or with an attached `=value`).
    long_flags: &'static [&'static str],
    /// Long options with a value (`--signal=KILL` or `--signal KILL`).
    long_valued: &'static [&'static str],
    /// Long options after which no command runs.
    long_stops: &'static [&'static str],
    /// `-5` is an option with a value (`nice -5`).
    numbers: bool,
}

/// The options read from the front of some words.
struct Parsed {
    /// Words taken by the options, `--` included.
    taken: usize,
    /// Each option's name (the letter, or the long name) and its value.
    used: Vec<(String, Option<String>)>,
    /// An option after which no command runs was given.
    stopped: bool,
}

impl Parsed {
    fn value_of(&self, names: &[&str]) -> Option<&str> {
        self.used
            .iter()
            .find(|(name, _)| names.contains(&name.as_str()))
            .and_then(|(_, value)| value.as_deref())
    }

    fn has(&self, names: &[&str]) -> bool {
        self.used
            .iter()
            .any(|(name, _)| names.contains(&name.as_str()))
    }
}

/// An option word a wrapper's spec does not know, as written.
#[derive(Debug, PartialEq, Eq)]
struct UnknownOption(String);

/// Reads options from the front of `words` (each `-x` cluster, `--long[=value]`, up to `--` or
/// the first word that is no option); `Err` names an option `spec` does not know.
fn parse_options(words: &[Word], spec: &Options) -> Result<Parsed, UnknownOption> {
    let mut parsed = Parsed {
        taken: 0,
        used: Vec::new(),
        stopped: false,
    };
    while let Some(word) = words.get(parsed.taken) {
        let text = word.text.as_str();
        if text == "--" {
            parsed.taken += 1;
            break;
        }
        if let Some(long) = text.strip_prefix("--") {
            let (name, attached) = match long.split_once('=') {
                Some((name, value)) => (name, Some(value.to_string())),
                None => (long, None),
            };
            // An exact name first, else an unambiguous abbreviation, as getopt_long reads them.
            let lists = [spec.long_valued, spec.long_flags, spec.long_stops];
            let exact = lists
                .iter()
                .enumerate()
                .find_map(|(k, list)| list.iter().find(|l| **l == name).map(|l| (k, *l)));
            let found = exact.or_else(|| {
                let mut found = lists.iter().enumerate().flat_map(|(k, list)| {
                    list.iter()
                        .filter(|l| l.starts_with(name))
                        .map(move |l| (k, *l))
                });
                match (found.next(), found.next()) {
                    (Some(one), None) => Some(one),
                    _ => None,
                }
            });
            parsed.taken += 1;
            match found {
                Some((0, full)) => {
                    let value = match attached {
                        Some(value) => Some(value),
                        None => {
                            parsed.taken += 1;
                            words.get(parsed.taken - 1).map(|w| w.text.clone())
                        }
                    };
                    parsed.used.push((full.to_string(), value));
                }
                Some((1, full)) => parsed.used.push((full.to_string(), attached)),
                Some((_, full)) => {
                    parsed.used.push((full.to_string(), attached));
                    parsed.stopped = true;
                }
                None => return Err(UnknownOption(text.to_string())),
            }
            continue;
        }
        let Some(cluster) = text.strip_prefix('-').filter(|c| !c.is_empty()) else {
            break;
        };
        parsed.taken += 1;
        if spec.numbers && cluster.chars().all(|c| c.is_ascii_digit()) {
            parsed.used.push(("n".into(), Some(cluster.to_string())));
            continue;
        }
        for (at, c) in cluster.char_indices() {
            let rest = &cluster[at + c.len_utf8()..];
            if spec.flags.contains(c) {
                parsed.used.push((c.to_string(), None));
            } else if spec.stops.contains(c) {
                parsed.used.push((c.to_string(), None));
                parsed.stopped = true;
            } else if spec.valued.contains(c) {
                let value = if rest.is_empty() {
                    parsed.taken += 1;
                    words.get(parsed.taken - 1).map(|w| w.text.clone())
                } else {
                    Some(rest.to_string())
                };
                parsed.used.push((c.to_string(), value));
                break;
            } else if spec.attached.contains(c) {
                parsed
                    .used
                    .push((c.to_string(), (!rest.is_empty()).then(|| rest.to_string())));
                break;
            } else {
                return Err(UnknownOption(text.to_string()));
            }
        }
    }
    parsed.taken = parsed.taken.min(words.len());
    Ok(parsed)
}

const ENV: Options = Options {
    flags: "i0v",
    valued: "uCS",
    attached: "",
    stops: "",
    long_flags: &[
        "ignore-environment",
        "null",
        "debug",
        "list-signal-handling",
        "default-signal",
        "ignore-signal",
        "block-signal",
    ],
    long_valued: &["unset", "chdir", "split-string"],
    long_stops: &["help", "version"],
    numbers: false,
};

const COMMAND: Options = Options {
    flags: "p",
    stops: "vV",
    ..NO_OPTIONS
};

const EXEC: Options = Options {
    flags: "cl",
    valued: "a",
    ..NO_OPTIONS
};

const NICE: Options = Options {
    valued: "n",
    long_valued: &["adjustment"],
    long_stops: &["help", "version"],
    numbers: true,
    ..NO_OPTIONS
};

const IONICE: Options = Options {
    flags: "t",
    valued: "cn",
    stops: "pPuh",
    long_flags: &["ignore"],
    long_valued: &["class", "classdata"],
    long_stops: &["pid", "pgid", "uid", "help", "version"],
    ..NO_OPTIONS
};

const TIMEOUT: Options = Options {
    flags: "v",
    valued: "ks",
    long_flags: &["preserve-status", "foreground", "verbose"],
    long_valued: &["kill-after", "signal"],
    long_stops: &["help", "version"],
    ..NO_OPTIONS
};

const TIME: Options = Options {
    flags: "pvaq",
    valued: "fo",
    long_flags: &["portability", "verbose", "append", "quiet"],
    long_valued: &["format", "output"],
    long_stops: &["help", "version"],
    ..NO_OPTIONS
};

const STDBUF: Options = Options {
    valued: "ioe",
    long_valued: &["input", "output", "error"],
    long_stops: &["help", "version"],
    ..NO_OPTIONS
};

const NOHUP: Options = Options {
    long_stops: &["help", "version"],
    ..NO_OPTIONS
};

const SETSID: Options = Options {
    flags: "cfw",
    stops: "hV",
    long_flags: &["ctty", "fork", "wait"],
    long_stops: &["help", "version"],
    ..NO_OPTIONS
};

const SUDO: Options = Options {
    flags: "AbBEHiknNPSs",
    valued: "CDgprRtTUu",
    stops: "lveKV",
    long_flags: &[
        "askpass",
        "background",
        "bell",
        "preserve-env",
        "preserve-groups",
        "set-home",
        "login",
        "non-interactive",
        "reset-timestamp",
        "stdin",
        "shell",
    ],
    long_valued: &[
        "chdir",
        "close-from",
        "group",
        "prompt",
        "role",
        "type",
        "command-timeout",
        "other-user",
        "user",
        "chroot",
        "host",
    ],
    long_stops: &[
        "list",
        "validate",
        "edit",
        "remove-timestamp",
        "version",
        "help",
    ],
    ..NO_OPTIONS
};

const DOAS: Options = Options {
    flags: "ns",
    valued: "u",
    stops: "LC",
    ..NO_OPTIONS
};

const XARGS: Options = Options {
    flags: "0oprtx",
    valued: "adEILnPs",
    attached: "eil",
    stops: "",
    long_flags: &[
        "null",
        "open-tty",
        "interactive",
        "no-run-if-empty",
        "verbose",
        "exit",
        "eof",
        "replace",
        "max-lines",
    ],
    long_valued: &[
        "arg-file",
        "delimiter",
        "max-args",
        "max-procs",
        "max-chars",
        "process-slot-var",
    ],
    long_stops: &["show-limits", "help", "version"],
    numbers: false,
};

const CHROOT: Options = Options {
    long_flags: &["skip-chdir"],
    long_valued: &["userspec", "groups"],
    long_stops: &["help", "version"],
    ..NO_OPTIONS
};

const TASKSET: Options = Options {
    flags: "ac",
    stops: "phV",
    long_flags: &["all-tasks", "cpu-list"],
    long_stops: &["pid", "help", "version"],
    ..NO_OPTIONS
};

const UNBUFFER: Options = Options {
    flags: "p",
    ..NO_OPTIONS
};

const WATCH: Options = Options {
    flags: "bcCdegprtwx",
    valued: "nq",
    long_flags: &[
        "beep",
        "color",
        "no-color",
        "differences",
        "errexit",
        "chgexit",
        "exec",
        "precise",
        "no-title",
        "no-wrap",
        "no-rerun",
    ],
    long_valued: &["interval", "equexit"],
    long_stops: &["help", "version"],
    ..NO_OPTIONS
};

const FLOCK: Options = Options {
    flags: "sexunoF",
    valued: "Ewc",
    long_flags: &[
        "shared",
        "exclusive",
        "unlock",
        "nonblock",
        "nb",
        "close",
        "no-fork",
        "verbose",
    ],
    long_valued: &["conflict-exit-code", "timeout", "wait", "command"],
    long_stops: &["help", "version"],
    ..NO_OPTIONS
};

const NO_OPTIONS: Options = Options {
    flags: "",
    valued: "",
    attached: "",
    stops: "",
    long_flags: &[],
    long_valued: &[],
    long_stops: &[],
    numbers: false,
};

/// Programs that run the command after their options (and `positional` words), and whether
/// they do no more than that.
const WRAPPERS: &[(&str, &Options, usize, bool)] = &[
    ("command", &COMMAND, 0, true),
    ("exec", &EXEC, 0, true),
    ("nice", &NICE, 0, true),
    ("ionice", &IONICE, 0, true),
    ("timeout", &TIMEOUT, 1, true),
    ("time", &TIME, 0, true),
    ("stdbuf", &STDBUF, 0, true),
    ("nohup", &NOHUP, 0, true),
    ("setsid", &SETSID, 0, true),
    ("taskset", &TASKSET, 1, true),
    ("unbuffer", &UNBUFFER, 0, true),
    ("chroot", &CHROOT, 1, false),
    ("doas", &DOAS, 0, false),
];

/// Shells whose `-c TEXT` is a command line.
const SHELLS: &[&str] = &[
    "sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "posh", "yash", "rbash", "fish",
];

/// An interpreter's options: which give code, which take a value, which run a named script.
struct Interpreter {
    code: &'static str,
    long_code: &'static [&'static str],
    valued: &'static str,
    attached: &'static str,
    long_valued: &'static [&'static str],
    script: &'static str,
    version: &'static str,
}

const PYTHON: Interpreter = Interpreter {
    code: "c",
    long_code: &[],
    valued: "WX",
    attached: "",
    long_valued: &["check-hash-based-pycs"],
    script: "m",
    version: "Vh",
};
const PERL: Interpreter = Interpreter {
    code: "eE",
    long_code: &[],
    valued: "I",
    attached: "il0CdDxFMm",
    long_valued: &[],
    script: "",
    version: "vVh",
};
const NODE: Interpreter = Interpreter {
    code: "ep",
    long_code: &["eval", "print"],
    valued: "rC",
    attached: "",
    long_valued: &[
        "require",
        "import",
        "loader",
        "input-type",
        "conditions",
        "title",
    ],
    script: "",
    version: "vh",
};
const RUBY: Interpreter = Interpreter {
    code: "e",
    long_code: &[],
    valued: "ICEr",
    attached: "FKTWx0",
    long_valued: &[],
    script: "",
    version: "vh",
};
const PHP: Interpreter = Interpreter {
    code: "rBREF",
    long_code: &[],
    valued: "cdz",
    attached: "",
    long_valued: &[],
    script: "f",
    version: "vhim",
};
const LUA: Interpreter = Interpreter {
    code: "e",
    long_code: &[],
    valued: "l",
    attached: "",
    long_valued: &[],
    script: "",
    version: "v",
};
const EVAL_ONLY: Interpreter = Interpreter {
    code: "ep",
    long_code: &["eval", "print"],
    valued: "",
    attached: "",
    long_valued: &[],
    script: "",
    version: "vh",
};

fn interpreter(base: &str) -> Option<&'static Interpreter> {
    let python = base
        .strip_prefix("python")
        .or_else(|| base.strip_prefix("pypy"));
    if python.is_some_and(|v| v.chars().all(|c| c.is_ascii_digit() || c == '.')) {
        return Some(&PYTHON);
    }
    match base {
        "perl" => Some(&PERL),
        "node" | "nodejs" => Some(&NODE),
        "ruby" => Some(&RUBY),
        "php" => Some(&PHP),
        "lua" | "luajit" => Some(&LUA),
        "bun" | "osascript" | "Rscript" => Some(&EVAL_ONLY),
        _ => None,
    }
}

/// What an interpreter's words make it run.
#[derive(PartialEq, Eq)]
enum Runs {
    /// Code from its command line.
    Code,
    /// Code from its input: from the command before it in a pipe, or a person typing.
    Input,
    /// A script file or module: its content is not judged.
    Script,
    /// Nothing (`--version`).
    Nothing,
}

fn interpreter_runs(spec: &Interpreter, args: &[Word]) -> Runs {
    let mut i = 0;
    while let Some(word) = args.get(i) {
        let text = word.text.as_str();
        i += 1;
        if text == "--" {
            return if args.get(i).is_some_and(|w| w.text != "-") {
                Runs::Script
            } else {
                Runs::Input
            };
        }
        if text == "-" {
            return Runs::Input;
        }
        if let Some(long) = text.strip_prefix("--") {
            let name = long.split_once('=').map_or(long, |(name, _)| name);
            if spec.long_code.contains(&name) {
                return Runs::Code;
            }
            if matches!(name, "version" | "help") {
                return Runs::Nothing;
            }
            if spec.long_valued.contains(&name) && !long.contains('=') {
                i += 1;
            }
            continue;
        }
        let Some(cluster) = text.strip_prefix('-') else {
            return Runs::Script;
        };
        if cluster.len() == 1 && spec.version.contains(cluster) {
            return Runs::Nothing;
        }
        for (at, c) in cluster.char_indices() {
            let rest = &cluster[at + c.len_utf8()..];
            if spec.code.contains(c) {
                return Runs::Code;
            }
            if spec.script.contains(c) {
                return Runs::Script;
            }
            if spec.valued.contains(c) {
                if rest.is_empty() {
                    i += 1;
                }
                break;
            }
            if spec.attached.contains(c) {
                break;
            }
        }
    }
    Runs::Input
}

/// Where a command stands: what ran it, what it gets at run time, how deep, and whether its
/// input comes from a pipe.
#[derive(Debug, Clone, Copy, Default)]
struct Context<'a> {
    via: Option<&'a str>,
    run_time: Option<&'a RunTimeArgs>,
    depth: usize,
    piped: bool,
}

impl<'a> Context<'a> {
    /// The context of a command run by the one in `self`.
    fn inner(self, via: &'a str) -> Self {
        Self {
            via: Some(via),
            depth: self.depth + 1,
            ..self
        }
    }

    /// Whether its arguments may come from input (`xargs`).
    fn appended(self) -> bool {
        self.run_time.is_some_and(|r| r.appended)
    }

    /// Whether `word` may be replaced at run time (`{}`).
    fn replaces(self, word: &str) -> bool {
        self.run_time.is_some_and(|r| r.replaces(word))
    }
}

/// The reading's state: every command seen so far.
struct Reader {
    seen: Vec<Seen>,
    typed: bool,
}

impl Reader {
    /// Reads a command line nested in the command of `cx` (`sh -c TEXT`, `eval`, a git
    /// alias) as the commands it runs; its first command reads the same input.
    fn line(&mut self, text: &str, via: &str, cx: Context<'_>) -> Result<(), Unreadable> {
        for (k, segment) in segments(text, self.typed)?.into_iter().enumerate() {
            let cx = Context {
                via: Some(via),
                run_time: None,
                depth: cx.depth + 1,
                piped: segment.piped || (k == 0 && cx.piped),
            };
            self.command(&segment.words, cx)?;
        }
        Ok(())
    }

    fn push(&mut self, seen: Seen) -> usize {
        self.seen.push(seen);
        self.seen.len() - 1
    }

    fn concern(&mut self, at: usize, concern: Concern) {
        if !self.seen[at].concerns.contains(&concern) {
            self.seen[at].concerns.push(concern);
        }
    }

    /// Reads one command's words: skips keywords and assignments, records the command, and
    /// follows what it runs.
    fn command(&mut self, words: &[Word], cx: Context<'_>) -> Result<(), Unreadable> {
        let mut words = words;
        let mut environment = Vec::new();
        while let Some((first, rest)) = words.split_first() {
            if first.plain == first.text.len() && COMPOUND_KEYWORDS.contains(&first.text.as_str()) {
                return Err(COMPOUND);
            }
            if SKIPPED_KEYWORDS.contains(&first.text.as_str()) {
                words = rest;
            } else if cx.run_time.is_none()
                && let Some(name) = first.assignment()
            {
                if is_run_environment(name) {
                    environment.push(Concern::RunEnvironment(name.to_string()));
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
        if from_input || too_deep {
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
            match interpreter_runs(spec, args) {
                Runs::Code => self.concern(at, Concern::InlineCode),
                Runs::Input if cx.piped => self.concern(at, Concern::InlineCode),
                _ => {}
            }
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
                self.line(&words_text(args), "eval", cx)
            }
            "source" | "." => {
                self.concern(at, Concern::ShellInput);
                Ok(())
            }
            "alias" => {
                for (_, text) in args.iter().filter_map(|w| w.text.split_once('=')) {
                    self.seen[at].transparent = true;
                    self.line(text, "alias", cx)?;
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
                    self.line(&action.text, "trap", cx)?;
                }
                Ok(())
            }
            "export" | "declare" | "typeset" | "local" | "readonly" => {
                for (name, _) in args.iter().filter_map(|w| w.text.split_once('=')) {
                    if is_run_environment(name) {
                        self.concern(at, Concern::RunEnvironment(name.to_string()));
                    }
                }
                Ok(())
            }
            "unlink" | "shred" | "rmdir" => {
                self.deletes(at, base, args.iter().map(|w| w.text.clone()).collect());
                Ok(())
            }
            "rsync" => {
                if args
                    .iter()
                    .any(|w| w.text.starts_with("--delete") || w.text == "--remove-source-files")
                {
                    self.deletes(at, "rsync --delete", Vec::new());
                }
                Ok(())
            }
            "awk" | "gawk" | "mawk" | "nawk" => {
                if awk_program(args).is_some_and(awk_runs_commands) {
                    self.concern(at, Concern::InlineCode);
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Reads a wrapper's options; `None`, with the concern recorded, when one is unknown.
    fn options(&mut self, at: usize, args: &[Word], spec: &Options) -> Option<Parsed> {
        match parse_options(args, spec) {
            Ok(parsed) => Some(parsed),
            Err(UnknownOption(option)) => {
                self.concern(at, Concern::UnknownOption(option));
                None
            }
        }
    }

    /// Records that the command at `at` reads commands from its input, when that input is
    /// piped from another command (typed input is judged as `write_stdin`).
    fn reads_input(&mut self, at: usize, cx: Context<'_>) {
        if cx.piped {
            self.concern(at, Concern::ShellInput);
        }
    }

    /// Records that the command at `at` deletes files like `rm OPERANDS`.
    fn deletes(&mut self, at: usize, by: &str, operands: Vec<String>) {
        let mut argv = vec!["rm".to_string()];
        argv.extend(operands);
        let run_time_args = self.seen[at].run_time_args.clone();
        self.push(Seen {
            argv,
            program: "rm".into(),
            via: Some(by.to_string()),
            run_time_args,
            concerns: vec![Concern::Deletes],
            ..Seen::default()
        });
    }

    /// The command a wrapper runs, from `args[start..]`; its own words before that are checked
    /// for globs, which could shift where the command starts.
    fn inner(
        &mut self,
        at: usize,
        args: &[Word],
        start: usize,
        transparent: bool,
        cx: Context<'_>,
    ) -> Result<(), Unreadable> {
        if args[..start].iter().any(|w| w.glob) {
            self.concern(at, Concern::Glob);
        }
        let command = &args[start..];
        if command.is_empty() {
            if cx.appended() {
                self.concern(at, Concern::CommandFromInput);
            }
            return Ok(());
        }
        self.seen[at].transparent = transparent;
        self.command(command, cx)
    }

    /// `env [OPTIONS] [NAME=VALUE]… [COMMAND]`, with `-S` splitting its text into more words.
    fn env(&mut self, at: usize, args: &[Word], cx: Context<'_>) -> Result<(), Unreadable> {
        let mut args = args;
        while args.first().is_some_and(|w| w.text == "-") {
            args = &args[1..];
        }
        let Some(parsed) = self.options(at, args, &ENV).filter(|p| !p.stopped) else {
            return Ok(());
        };
        if let Some(split) = parsed.value_of(&["S", "split-string"]) {
            let mut split = segments(split, false)?;
            if split.len() > 1 {
                return Err(Unreadable("an env -S text with separators"));
            }
            let mut words = vec![Word::literal("env")];
            words.extend(split.pop().map(|s| s.words).unwrap_or_default());
            words.extend_from_slice(&args[parsed.taken..]);
            self.seen[at].transparent = true;
            return self.command(&words, cx.inner("env -S"));
        }
        let mut start = parsed.taken;
        while let Some((name, _)) = args.get(start).and_then(|w| w.text.split_once('=')) {
            if is_run_environment(name) {
                self.concern(at, Concern::RunEnvironment(name.to_string()));
            }
            start += 1;
        }
        self.inner(at, args, start, true, cx.inner("env"))
    }

    /// `sudo [OPTIONS] [NAME=VALUE]… [COMMAND]`: not transparent, it changes who runs it.
    fn sudo(&mut self, at: usize, args: &[Word], cx: Context<'_>) -> Result<(), Unreadable> {
        let Some(parsed) = self.options(at, args, &SUDO).filter(|p| !p.stopped) else {
            return Ok(());
        };
        let mut start = parsed.taken;
        while let Some(name) = args.get(start).and_then(Word::assignment) {
            if is_run_environment(name) {
                self.concern(at, Concern::RunEnvironment(name.to_string()));
            }
            start += 1;
        }
        if start == args.len() && parsed.has(&["s", "i", "shell", "login"]) {
            self.reads_input(at, cx);
        }
        self.inner(at, args, start, false, cx.inner("sudo"))
    }

    /// `xargs [OPTIONS] [COMMAND]`: the command (or `echo`), with arguments from input.
    fn xargs(&mut self, at: usize, args: &[Word], cx: Context<'_>) -> Result<(), Unreadable> {
        let Some(parsed) = self.options(at, args, &XARGS).filter(|p| !p.stopped) else {
            return Ok(());
        };
        let placeholder = parsed
            .used
            .iter()
            .find(|(name, _)| matches!(name.as_str(), "I" | "i" | "replace"))
            .map(|(_, value)| match value {
                Some(value) if !value.is_empty() => value.clone(),
                _ => "{}".to_string(),
            });
        let run_time = RunTimeArgs {
            appended: placeholder.is_none(),
            placeholder,
        };
        let echo = [Word::literal("echo")];
        let command = match &args[parsed.taken..] {
            [] => &echo[..],
            command => command,
        };
        if args[..parsed.taken].iter().any(|w| w.glob) {
            self.concern(at, Concern::Glob);
        }
        self.seen[at].transparent = true;
        let cx = Context {
            run_time: Some(&run_time),
            piped: false,
            ..cx.inner("xargs")
        };
        self.command(command, cx)
    }

    /// `find START… EXPRESSION`: each `-exec`/`-execdir`/`-ok`/`-okdir` command, and
    /// `-delete` as `rm START…`.
    fn find(&mut self, at: usize, args: &[Word], cx: Context<'_>) -> Result<(), Unreadable> {
        let starts: Vec<String> = args
            .iter()
            .skip_while(|w| matches!(w.text.as_str(), "-H" | "-L" | "-P"))
            .take_while(|w| {
                !w.text.starts_with('-') && !matches!(w.text.as_str(), "(" | "!" | ")" | ",")
            })
            .map(|w| w.text.clone())
            .collect();
        let run_time = RunTimeArgs {
            appended: false,
            placeholder: Some("{}".into()),
        };
        let mut i = 0;
        while i < args.len() {
            match args[i].text.as_str() {
                "-delete" => self.deletes(at, "find -delete", starts.clone()),
                action @ ("-exec" | "-execdir" | "-ok" | "-okdir") => {
                    let end = (i + 1..args.len())
                        .find(|&k| matches!(args[k].text.as_str(), ";" | "+"))
                        .unwrap_or(args.len());
                    let via = format!("find {action}");
                    let cx = Context {
                        run_time: Some(&run_time),
                        piped: false,
                        ..cx.inner(&via)
                    };
                    self.command(&args[i + 1..end], cx)?;
                    i = end;
                }
                _ => {}
            }
            i += 1;
        }
        Ok(())
    }

    /// `sh|bash|… [OPTIONS] -c TEXT`: the text as a line. A script file counts as shell input,
    /// and so does a shell reading a pipe.
    fn shell(
        &mut self,
        at: usize,
        base: &str,
        args: &[Word],
        cx: Context<'_>,
    ) -> Result<(), Unreadable> {
        let mut command_mode = false;
        let mut from_input = false;
        let mut i = 0;
        while let Some(word) = args.get(i) {
            let text = word.text.as_str();
            if text == "--" || text == "-" {
                i += 1;
                break;
            }
            if text.starts_with("--") {
                if matches!(text, "--rcfile" | "--init-file") {
                    self.concern(at, Concern::ShellInput);
                    i += 1;
                }
                i += 1;
                continue;
            }
            let Some(cluster) = text.strip_prefix(['-', '+']).filter(|c| !c.is_empty()) else {
                break;
            };
            i += 1;
            for c in cluster.chars() {
                match c {
                    'c' => command_mode = true,
                    'o' | 'O' => i += 1,
                    's' | 'i' => from_input = true,
                    _ => {}
                }
            }
        }
        let operand = args.get(i);
        if !command_mode {
            match operand {
                Some(_) if !from_input => self.concern(at, Concern::ShellInput),
                None if cx.appended() => self.concern(at, Concern::CommandFromInput),
                _ => self.reads_input(at, cx),
            }
            return Ok(());
        }
        let Some(text) = operand else {
            // `xargs sh -c`: the command line is the first argument from input.
            if cx.run_time.is_some() {
                self.concern(at, Concern::CommandFromInput);
            }
            return Ok(());
        };
        if cx.replaces(&text.text) {
            self.concern(at, Concern::CommandFromInput);
        }
        self.seen[at].transparent = true;
        let via = format!("{base} -c");
        self.line(&text.text, &via, cx)
    }

    /// `git [GLOBAL OPTIONS] SUBCOMMAND …`: judged without its global options; configuration
    /// from the command line counts; aliases given with `-c` are followed.
    fn git(&mut self, at: usize, args: &[Word], cx: Context<'_>) -> Result<(), Unreadable> {
        let mut aliases: Vec<(String, String)> = Vec::new();
        let mut i = 0;
        while let Some(word) = args.get(i) {
            let text = word.text.as_str();
            if !text.starts_with('-') {
                break;
            }
            i += 1;
            let (name, attached) = match text.split_once('=') {
                Some((name, value)) if name.starts_with("--") => (name, Some(value)),
                _ => (text, None),
            };
            let mut value = || -> Option<String> {
                match attached {
                    Some(value) => Some(value.to_string()),
                    None => {
                        i += 1;
                        args.get(i - 1).map(|w| w.text.clone())
                    }
                }
            };
            match name {
                "-c" => {
                    let setting = value().unwrap_or_default();
                    let (key, val) = setting.split_once('=').unwrap_or((&setting, ""));
                    if !is_harmless_git_key(key) {
                        self.concern(at, Concern::GitConfig);
                    }
                    if let Some(alias) = key.to_ascii_lowercase().strip_prefix("alias.") {
                        aliases.push((alias.to_string(), val.to_string()));
                    }
                }
                "--config-env" | "--git-dir" => {
                    self.concern(at, Concern::GitConfig);
                    let _ = value();
                }
                "--exec-path" if attached.is_some() => self.concern(at, Concern::GitConfig),
                "-C" | "--work-tree" | "--namespace" | "--super-prefix" | "--list-cmds"
                | "--attr-source" => {
                    let _ = value();
                }
                "-p"
                | "-P"
                | "--paginate"
                | "--no-pager"
                | "--bare"
                | "--no-replace-objects"
                | "--no-lazy-fetch"
                | "--no-optional-locks"
                | "--literal-pathspecs"
                | "--glob-pathspecs"
                | "--noglob-pathspecs"
                | "--icase-pathspecs"
                | "--no-advice"
                | "--exec-path"
                | "--html-path"
                | "--man-path"
                | "--info-path"
                | "--version"
                | "-v"
                | "--help"
                | "-h" => {}
                _ => {
                    self.concern(at, Concern::UnknownOption(text.to_string()));
                    return Ok(());
                }
            }
        }
        let rest = &args[i.min(args.len())..];
        let mut argv = vec!["git".to_string()];
        argv.extend(rest.iter().map(|w| w.text.clone()));
        self.seen[at].argv = argv;
        let Some((sub, sub_args)) = rest.split_first() else {
            return Ok(());
        };
        let via = format!("git {}", sub.text);
        if let Some((_, alias)) = aliases.iter().find(|(name, _)| *name == sub.text) {
            return match alias.strip_prefix('!') {
                Some(shell) => {
                    let mut text = shell.to_string();
                    for word in sub_args {
                        text.push(' ');
                        text.push_str(&quote(&word.text));
                    }
                    self.line(&text, "a git alias", cx)
                }
                None => {
                    let mut words = vec![Word::literal("git")];
                    for segment in segments(alias, false)? {
                        words.extend(segment.words);
                    }
                    words.extend_from_slice(sub_args);
                    self.command(&words, cx.inner("a git alias"))
                }
            };
        }
        match sub.text.as_str() {
            "config" => self.git_config(at, sub_args, cx),
            "submodule" => {
                if let Some(k) = sub_args.iter().position(|w| w.text == "foreach") {
                    let command: Vec<Word> = sub_args[k + 1..]
                        .iter()
                        .skip_while(|w| w.text == "--recursive")
                        .cloned()
                        .collect();
                    self.line(&words_text(&command), &via, cx)?;
                }
                Ok(())
            }
            "rebase" | "difftool" | "mergetool" | "filter-branch" => {
                let mut k = 0;
                while let Some(word) = sub_args.get(k) {
                    let text = word.text.as_str();
                    k += 1;
                    if let Some((name, value)) = text.split_once('=')
                        && (matches!(name, "--exec" | "--extcmd") || name.ends_with("-filter"))
                    {
                        self.line(value, &via, cx)?;
                    } else if matches!(text, "-x" | "--exec" | "--extcmd")
                        || (text.starts_with("--") && text.ends_with("-filter"))
                    {
                        if let Some(value) = sub_args.get(k) {
                            self.line(&value.text, &via, cx)?;
                        }
                        k += 1;
                    }
                }
                Ok(())
            }
            "bisect" => {
                if sub_args.first().is_some_and(|w| w.text == "run") && sub_args.len() > 1 {
                    self.command(&sub_args[1..], cx.inner("git bisect run"))?;
                }
                Ok(())
            }
            "clean" => {
                let dry_run = sub_args.iter().any(|w| {
                    w.text == "--dry-run"
                        || (w.text.starts_with('-')
                            && !w.text.starts_with("--")
                            && w.text.contains('n'))
                });
                if !dry_run {
                    self.deletes(at, "git clean", Vec::new());
                }
                Ok(())
            }
            sub => {
                let runs_program = sub_args.iter().any(|w| {
                    ["--upload-pack", "--receive-pack", "--exec"]
                        .iter()
                        .any(|o| w.text == *o || w.text.starts_with(&format!("{o}=")))
                        || (w.text == "-u" && matches!(sub, "clone" | "ls-remote"))
                });
                if runs_program {
                    self.concern(at, Concern::GitConfig);
                }
                Ok(())
            }
        }
    }

    /// `git config …`: writing a key counts as configuration; an alias's shell text is read.
    fn git_config(&mut self, at: usize, args: &[Word], cx: Context<'_>) -> Result<(), Unreadable> {
        let mut operands = Vec::new();
        let mut writes = false;
        let mut i = 0;
        while let Some(word) = args.get(i) {
            let text = word.text.as_str();
            i += 1;
            match text {
                "-f" | "--file" | "--blob" | "--type" | "--default" | "--comment" | "--value" => {
                    i += 1;
                }
                "--add" | "--replace-all" | "-e" | "--edit" | "--unset" | "--unset-all"
                | "--rename-section" | "--remove-section" => writes = true,
                _ if text.starts_with('-') => {}
                _ => operands.push(text),
            }
        }
        let (key, value) = match operands.as_slice() {
            ["set", key, value, ..] => (Some(*key), Some(*value)),
            [
                "get" | "list" | "get-regexp" | "get-urlmatch" | "get-color" | "get-colorbool",
                ..,
            ] => (None, None),
            ["edit" | "unset" | "rename-section" | "remove-section", ..] => {
                writes = true;
                (None, None)
            }
            [key, value, ..] => (Some(*key), Some(*value)),
            _ => (None, None),
        };
        if writes || key.is_some_and(|key| !is_harmless_git_key(key)) {
            self.concern(at, Concern::GitConfig);
        }
        if let (Some(key), Some(value)) = (key, value)
            && key.to_ascii_lowercase().starts_with("alias.")
            && let Some(shell) = value.strip_prefix('!')
        {
            self.line(shell, "a git alias", cx)?;
        }
        Ok(())
    }

    /// `watch [OPTIONS] COMMAND…`: the words joined and run with `sh -c`, or as argv with `-x`.
    fn watch(&mut self, at: usize, args: &[Word], cx: Context<'_>) -> Result<(), Unreadable> {
        let Some(parsed) = self.options(at, args, &WATCH).filter(|p| !p.stopped) else {
            return Ok(());
        };
        if parsed.taken >= args.len() {
            return Ok(());
        }
        if parsed.has(&["x", "exec"]) {
            return self.inner(at, args, parsed.taken, true, cx.inner("watch"));
        }
        self.seen[at].transparent = true;
        self.line(&words_text(&args[parsed.taken..]), "watch", cx)
    }

    /// `flock [OPTIONS] FILE COMMAND…`, `flock [OPTIONS] FILE -c TEXT`.
    fn flock(&mut self, at: usize, args: &[Word], cx: Context<'_>) -> Result<(), Unreadable> {
        let Some(parsed) = self.options(at, args, &FLOCK).filter(|p| !p.stopped) else {
            return Ok(());
        };
        if let Some(text) = parsed.value_of(&["c", "command"]) {
            self.seen[at].transparent = true;
            return self.line(text, "flock -c", cx);
        }
        let start = (parsed.taken + 1).min(args.len());
        if let Some(option) = args.get(start)
            && matches!(option.text.as_str(), "-c" | "--command")
        {
            if let Some(text) = args.get(start + 1) {
                self.seen[at].transparent = true;
                return self.line(&text.text, "flock -c", cx);
            }
            return Ok(());
        }
        self.inner(at, args, start, true, cx.inner("flock"))
    }

    /// `su`/`runuser … -c TEXT`: the text as a line; without `-c`, a shell reading its input.
    fn su(&mut self, at: usize, args: &[Word], cx: Context<'_>) -> Result<(), Unreadable> {
        let mut texts = Vec::new();
        let mut i = 0;
        while let Some(word) = args.get(i) {
            let text = word.text.as_str();
            i += 1;
            if let Some(value) = text
                .strip_prefix("--command=")
                .or_else(|| text.strip_prefix("--session-command="))
            {
                texts.push(value.to_string());
            } else if matches!(text, "-c" | "--command" | "--session-command") {
                if let Some(value) = args.get(i) {
                    texts.push(value.text.clone());
                }
                i += 1;
            }
        }
        if texts.is_empty() {
            self.reads_input(at, cx);
        }
        for text in texts {
            self.line(&text, "su -c", cx)?;
        }
        Ok(())
    }
}

/// git settings that run no program and choose none; any other may (`core.pager`,
/// `core.fsmonitor`, `diff.*.textconv`, `filter.*`, `credential.helper`, `include.path`, …), and
/// a list of those would never be complete.
fn is_harmless_git_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    matches!(
        key.as_str(),
        "user.name" | "user.email" | "init.defaultbranch" | "pull.rebase" | "push.default"
    ) || key.starts_with("color.")
        || key.starts_with("advice.")
}

/// The program text of an `awk` command line, unless it comes from a file (`-f`).
fn awk_program(args: &[Word]) -> Option<&str> {
    let mut i = 0;
    while let Some(word) = args.get(i) {
        let text = word.text.as_str();
        i += 1;
        match text {
            "-f" | "--file" => return None,
            "-F" | "-v" | "--assign" | "--field-separator" => i += 1,
            "-e" | "--source" | "--" => return args.get(i).map(|w| w.text.as_str()),
            _ if text.starts_with('-') => {}
            program => return Some(program),
        }
    }
    None
}

fn awk_runs_commands(program: &str) -> bool {
    program.contains("system") || program.contains('|')
}

/// Words joined back into a line, as `eval` and `watch` join them.
fn words_text(words: &[Word]) -> String {
    words
        .iter()
        .map(|w| w.text.as_str())
        .collect::<Vec<_>>()
        .join(" ")
}

/// `word` single-quoted for a shell.
fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argvs(line: &str) -> Vec<Vec<String>> {
        read(line, Source::Line)
            .unwrap_or_else(|why| panic!("{line}: {why}"))
            .seen
            .into_iter()
            .map(|s| s.argv)
            .collect()
    }

    fn has(line: &str, argv: &[&str]) -> bool {
        argvs(line)
            .iter()
            .any(|a| a.iter().map(String::as_str).eq(argv.iter().copied()))
    }

    fn concerns(line: &str) -> Vec<Concern> {
        read(line, Source::Line)
            .unwrap_or_else(|why| panic!("{line}: {why}"))
            .seen
            .into_iter()
            .flat_map(|s| s.concerns)
            .collect()
    }

    #[test]
    fn words_split_at_unquoted_separators_only() {
        assert_eq!(
            argvs("a 'b|c' \"d;e\" && f\\;g; h\ni | j"),
            [
                vec!["a", "b|c", "d;e"],
                vec!["f;g"],
                vec!["h"],
                vec!["i"],
                vec!["j"]
            ]
        );
        assert_eq!(read("a;b", Source::Line).map(|r| r.commands), Ok(2));
        assert_eq!(argvs("ls # rm x"), [vec!["ls"]]);
        assert_eq!(
            argvs("find . -exec rm {} \\;"),
            [
                vec!["find", ".", "-exec", "rm", "{}", ";"],
                vec!["rm", "{}"]
            ]
        );
    }

    #[test]
    fn what_words_cannot_show_is_unreadable() {
        for line in [
            "echo $(rm x)",
            "echo `id`",
            "echo \"$HOME\"",
            "cat < f",
            "ls 2>&1",
            "(rm x)",
            "{ rm x; }",
            "{rm,x}",
            "echo 'open",
            "for f in a; do rm f; done",
            "case x in x) ;; esac",
        ] {
            assert!(read(line, Source::Line).is_err(), "{line}");
        }
    }

    #[test]
    fn typed_text_must_be_whole_lines_without_editing_keys() {
        assert!(read("rm v\n", Source::Typed).is_ok());
        assert!(read("\u{3}", Source::Typed).is_ok());
        assert!(read("", Source::Typed).is_ok());
        for text in [
            "r",
            "rx\u{7f}m v\n",
            "unl\t v\n",
            "\u{1b}[A\n",
            "!!\n",
            "^a^b\n",
        ] {
            assert!(read(text, Source::Typed).is_err(), "{text:?}");
        }
    }

    #[test]
    fn wrappers_are_followed_to_the_command_they_run() {
        for line in [
            "command rm v",
            "command -p rm v",
            "env rm v",
            "env -i -u X A=1 rm v",
            "env -S 'rm v'",
            "exec -a x rm v",
            "nice rm v",
            "nice -n 5 rm v",
            "nice -5 rm v",
            "ionice -c 3 rm v",
            "timeout 5 rm v",
            "timeout -s KILL --kill=3 5 rm v",
            "time rm v",
            "time -p rm v",
            "stdbuf -oL rm v",
            "nohup rm v",
            "setsid -f rm v",
            "sudo rm v",
            "sudo -u root -E A=1 rm v",
            "doas -u root rm v",
            "xargs rm v",
            "xargs -a lst -n 1 -0 rm v",
            "/usr/bin/env /bin/rm v",
            "FOO=1 rm v",
            "if rm v",
            "! rm v",
            "busybox rm v",
            "watch -n 1 rm v",
            "flock /tmp/l rm v",
            "flock /tmp/l -c 'rm v'",
            "taskset 3 rm v",
            "sh -c 'rm v'",
            "bash -ec 'rm v'",
            "bash -o pipefail -c 'rm v'",
            "sh -c 'env sh -c \"rm v\"'",
            "eval rm v",
            "eval 'rm v'",
            "su -c 'rm v'",
            "alias ls='rm v'",
            "trap 'rm v' EXIT",
            "git -c alias.x='!rm v' x",
            "git config alias.x '!rm v'",
            "git submodule foreach rm v",
            "git rebase -x 'rm v' main",
            "git bisect run rm v",
        ] {
            assert!(has(line, &["rm", "v"]), "{line}: {:?}", argvs(line));
        }
        assert!(has("echo v | xargs rm", &["rm"]));
        assert!(has("echo v | xargs", &["echo"]));
        assert!(has("find . -delete", &["rm", "."]));
        assert!(!has("command -v rm", &["rm"]));
    }

    #[test]
    fn git_is_judged_without_its_global_options() {
        assert!(has(
            "git -C sub --no-pager push origin",
            &["git", "push", "origin"]
        ));
        assert!(concerns("git status").is_empty());
        for line in [
            "git -c core.pager=x log",
            "git --config-env=core.pager=X log",
            "git config core.fsmonitor x",
            "git config set core.hooksPath h",
            "git --git-dir=elsewhere status",
            "git fetch --upload-pack=x origin",
        ] {
            assert!(concerns(line).contains(&Concern::GitConfig), "{line}");
        }
        assert!(concerns("git config --get user.name").is_empty());
        assert!(concerns("git -c user.name=a -c user.email=b commit -m x").is_empty());
        assert!(concerns("git config user.email a@b").is_empty());
        assert!(
            concerns("git -c color.ui=never -c core.pager=x log").contains(&Concern::GitConfig)
        );
        assert!(concerns("git config user.name").is_empty());
        assert!(has("git -c alias.s=status s -b", &["git", "status", "-b"]));
    }

    #[test]
    fn concerns_name_what_words_cannot_settle() {
        let cases: &[(&str, Concern)] = &[
            ("/usr/bin/r? v", Concern::Glob),
            ("/usr/bin/r[m] v", Concern::Glob),
            ("env r* v", Concern::Glob),
            (
                "env --frobnicate rm v",
                Concern::UnknownOption("--frobnicate".into()),
            ),
            ("source x.sh", Concern::ShellInput),
            (". x.sh", Concern::ShellInput),
            ("sh x.sh", Concern::ShellInput),
            ("echo rm v | sh", Concern::ShellInput),
            ("python3 -c 'import os'", Concern::InlineCode),
            ("echo 'import os' | python3", Concern::InlineCode),
            ("perl -e 'unlink 1'", Concern::InlineCode),
            ("perl -pi -e 's/a/b/' f", Concern::InlineCode),
            ("perl -I lib -e 1", Concern::InlineCode),
            ("node -e 1", Concern::InlineCode),
            ("node --eval=1", Concern::InlineCode),
            ("ruby -e 1", Concern::InlineCode),
            ("php -r 1", Concern::InlineCode),
            ("awk 'BEGIN{system(\"rm v\")}'", Concern::InlineCode),
            ("unlink v", Concern::Deletes),
            ("shred -u v", Concern::Deletes),
            ("rsync -a --delete e/ t/", Concern::Deletes),
            ("git clean -fdx", Concern::Deletes),
            ("PATH=. ls", Concern::RunEnvironment("PATH".into())),
            (
                "env LD_PRELOAD=x.so ls",
                Concern::RunEnvironment("LD_PRELOAD".into()),
            ),
            ("export PATH=.", Concern::RunEnvironment("PATH".into())),
            ("PATH=.", Concern::RunEnvironment("PATH".into())),
            ("cp x .git/config", Concern::GitDirectory),
            ("cp x sub/.GIT/hooks/pre-commit", Concern::GitDirectory),
            ("cp x .gi?/config", Concern::GitDirectory),
            ("echo rm v | xargs sh -c", Concern::CommandFromInput),
            ("echo rm v | xargs env", Concern::CommandFromInput),
            ("find . -exec {} ;", Concern::CommandFromInput),
            ("xargs -I% sh -c %", Concern::CommandFromInput),
        ];
        for (line, concern) in cases {
            assert!(
                concerns(line).contains(concern),
                "{line}: {:?}",
                concerns(line)
            );
        }
        for line in [
            "python3 script.py",
            "python3 -m pytest",
            "python3 --version",
            "python3",
            "sh",
            "bash -i",
            "node app.js",
            "awk '{print $1}' f",
            "ls *.rs",
            "cargo test",
            "git status",
            "git clean -n",
            "command -v rm",
        ] {
            assert!(concerns(line).is_empty(), "{line}: {:?}", concerns(line));
        }
    }

    #[test]
    fn the_glob_matcher_is_small_and_fast() {
        assert!(glob_matches(".g?t", ".git"));
        assert!(glob_matches(".[g]i*", ".git"));
        assert!(glob_matches(".*", ".git"));
        assert!(!glob_matches(".g?", ".git"));
        assert!(!glob_matches(".x*", ".git"));
        let hostile = format!(".{}x", "*".repeat(50_000));
        assert!(!glob_matches(&hostile, ".git"));
        assert!(!names_git_directory(&hostile));
    }

    #[test]
    fn programs_named_by_a_path_are_local_unless_in_a_system_directory() {
        let seen = |line: &str| read(line, Source::Line).unwrap().seen.remove(0);
        assert!(!seen("/usr/bin/ls").local);
        assert!(!seen("ls").local);
        assert!(seen("./ls").local);
        assert!(seen("/tmp/x/ls").local);
        assert_eq!(seen("/usr/bin/ls -l").argv, ["ls", "-l"]);
        assert!(seen("env rm v").transparent);
        assert!(!seen("sudo rm v").transparent);
        let xargs = read("xargs -I{} rm {}", Source::Line).unwrap();
        let rm = &xargs.seen[1];
        assert!(
            rm.run_time_args
                .as_ref()
                .is_some_and(|r| r.replaces("{}") && !r.appended)
        );
    }
}
