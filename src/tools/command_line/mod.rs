//! What a command line runs, as the command rules see it: the line split into its commands and
//! each command seen through what runs another command (`env`, `sudo`, `xargs`, `find -exec`,
//! `sh -c`, `eval`, git aliases, `tar --to-command`, …), so that a rule about `rm` also meets
//! `env rm`, `/bin/rm` and `sh -c 'rm x'`.
//!
//! Command rules are a way to be asked, not a boundary: the sandbox is what a command cannot
//! pass. This reading tries to be precise both ways — to see the forms that run a program, and
//! to leave alone what cannot (a redirection's target, a `$VAR` given as an argument).
//!
//! [`read`] gives every command a line runs as a [`Seen`]: its argv with the program by its base
//! name, and the [`Concern`]s that words alone cannot settle (a glob or a variable in the
//! program's name, code given to an interpreter, a file sourced, git configuration from the
//! command line). A line the reading cannot follow (`case`, quoting that does not close) is
//! [`Unreadable`]. Judging is [`super::approval`]'s.
//!
//! The parts: [`lex`] splits the text into commands of words; [`judge`] reads each command and
//! follows what it runs; [`wrappers`] knows the programs that run a command given after their
//! options; [`interpreters`] the shells and interpreters; [`programs`] the tools with a way to
//! run a command of their own (`git`, `sed`, `tar`, `make`, `rsync`, `ssh`).

use std::fmt;

mod interpreters;
mod judge;
mod lex;
mod programs;
#[cfg(test)]
mod tests;
mod wrappers;

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
    /// A glob character or brace expansion in the program's name or in a wrapper's words: the
    /// shell picks the program from file names (`/usr/bin/r? x`, `{rm,x}`).
    Glob,
    /// A variable or a substitution's output names the program, or gives words to a command
    /// that runs others (`$CMD x`, `sudo $X`, `sh -c "$X"`).
    Expansion,
    /// A wrapper's option the reading does not know, so where its command starts is unknown.
    UnknownOption(String),
    /// The program's name comes from input (`xargs` with no command of its own, `-exec {} ;`).
    CommandFromInput,
    /// Shell code from a file or from input: `source`, `.`, `sh FILE`, `… | sh`, `su` without
    /// `-c`.
    ShellInput,
    /// git configuration from the command line or written (`-c`, `--config-env`, `git config
    /// KEY VALUE`, `--upload-pack`, `clone -c`, an `ext::` URL): configuration can make git run
    /// any program.
    GitConfig,
    /// An interpreter given code on its command line or on its input (`python3 -c` that can
    /// reach the system, `perl -e`, `node -e`, `awk` calling `system`).
    InlineCode,
    /// An interpreter, shell or REPL started with a terminal (or `-i`): it runs whatever is
    /// typed into it next, which the rules read only as shell lines.
    Interactive,
    /// A program's option runs a command the words do not show (`sed e`, `make --eval`,
    /// `ssh -o ProxyCommand=…`, `rsync --rsync-path`); it names the form.
    RunsCommand(String),
    /// A command that deletes files; its `Seen` is the `rm` it counts as.
    Deletes,
    /// A variable that chooses the program or what it loads (`PATH`, `LD_PRELOAD`, `GIT_*`),
    /// or a builtin that does (`hash -p`, `enable -f`).
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
        let command = seen.argv.join(" ").replace(lex::MARK, "$…");
        match self {
            Self::Glob => format!(
                "a glob in the program's name lets the shell pick the program from file names: \
                 {command}"
            ),
            Self::Expansion => format!(
                "a variable or a substitution chooses the program or the words of a command \
                 that runs others: {command}"
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
            Self::Interactive => format!(
                "an interpreter or shell started with a terminal runs what is typed into it, \
                 which the rules cannot follow: {command}"
            ),
            Self::RunsCommand(form) => {
                format!("{form} runs a command the words do not show: {command}")
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
    read_with_terminal(text, source, false)
}

/// Reads `text` into the commands it runs, for a process given a terminal (`exec_command` with
/// `tty`) when `terminal` is set: an interpreter or shell started that way runs what is typed
/// next.
pub fn read_with_terminal(
    text: &str,
    source: Source,
    terminal: bool,
) -> Result<Reading, Unreadable> {
    let typed = source == Source::Typed;
    if typed {
        // Ctrl-C and Ctrl-D on their own interrupt or end input; they type no command.
        if text.chars().all(|c| matches!(c, '\u{3}' | '\u{4}')) {
            return Ok(Reading::default());
        }
        check_typed(text)?;
    }
    judge::read_line(text, typed, terminal)
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

/// Directories whose programs are the ones rules name.
const SYSTEM_DIRS: &[&str] = &[
    "/bin",
    "/sbin",
    "/usr/bin",
    "/usr/sbin",
    "/usr/local/bin",
    "/usr/local/sbin",
];

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
