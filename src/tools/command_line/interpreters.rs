//! Shells, interpreters and REPLs: which of their options give code, which run a script, and
//! when what they run is code the rules cannot read (`python3 -c`, `perl -e`, `… | sh`, a REPL
//! started with a terminal).

use super::judge::{Context, Reader};
use super::lex::{Input, MARK, Word};
use super::{Concern, Unreadable};

/// Shells whose `-c TEXT` is a command line.
pub(super) const SHELLS: &[&str] = &[
    "sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "posh", "yash", "rbash", "fish", "tcsh",
    "csh",
];

/// Programs that, given a terminal, run commands typed into them: REPLs, debuggers, database
/// shells, editors and pagers with a `!command`.
const TERMINAL_PROGRAMS: &[&str] = &[
    "irb", "pry", "ipython", "ipython3", "bpython", "ptpython", "ghci", "jshell", "iex", "erl",
    "julia", "R", "sqlite3", "psql", "mysql", "mariadb", "gdb", "lldb", "pdb", "tclsh", "wish",
    "guile", "racket", "sbcl", "ocaml", "scala", "deno", "bc", "vi", "vim", "nvim", "view", "ex",
    "ed", "emacs", "nano", "less", "more", "most", "man", "ftp", "sftp", "telnet", "nc", "tmux",
    "screen", "script", "expect",
];

/// An interpreter's options: which give code, which take a value, which run a named script,
/// which make it read commands interactively.
pub(super) struct Interpreter {
    code: &'static str,
    long_code: &'static [&'static str],
    valued: &'static str,
    attached: &'static str,
    long_valued: &'static [&'static str],
    script: &'static str,
    version: &'static str,
    interactive: &'static str,
    /// Modules that, run as a script (`python3 -m pdb`), read commands from their input.
    repl_modules: &'static [&'static str],
    /// Whether code may reach the system (run a program, delete a file); `None`: always.
    reaches_system: Option<fn(&str) -> bool>,
}

const NOTHING: Interpreter = Interpreter {
    code: "",
    long_code: &[],
    valued: "",
    attached: "",
    long_valued: &[],
    script: "",
    version: "",
    interactive: "",
    repl_modules: &[],
    reaches_system: None,
};
const PYTHON: Interpreter = Interpreter {
    code: "c",
    valued: "WX",
    long_valued: &["check-hash-based-pycs"],
    script: "m",
    version: "Vh",
    interactive: "i",
    repl_modules: &[
        "pdb", "code", "asyncio", "IPython", "idlelib", "ptpython", "bpython", "ipdb", "pudb",
    ],
    reaches_system: Some(python_reaches_system),
    ..NOTHING
};
const PERL: Interpreter = Interpreter {
    code: "eE",
    valued: "I",
    attached: "il0CDxFMm",
    version: "vVh",
    interactive: "d",
    ..NOTHING
};
const NODE: Interpreter = Interpreter {
    code: "ep",
    long_code: &["eval", "print"],
    valued: "rC",
    long_valued: &[
        "require",
        "import",
        "loader",
        "input-type",
        "conditions",
        "title",
    ],
    version: "vh",
    interactive: "i",
    reaches_system: Some(node_reaches_system),
    ..NOTHING
};
const RUBY: Interpreter = Interpreter {
    code: "e",
    valued: "ICEr",
    attached: "FKTWx0",
    version: "vh",
    ..NOTHING
};
const PHP: Interpreter = Interpreter {
    code: "rBREF",
    valued: "cdz",
    script: "f",
    version: "vhim",
    interactive: "a",
    ..NOTHING
};
const LUA: Interpreter = Interpreter {
    code: "e",
    valued: "l",
    version: "v",
    interactive: "i",
    ..NOTHING
};
const EVAL_ONLY: Interpreter = Interpreter {
    code: "ep",
    long_code: &["eval", "print"],
    version: "vh",
    ..NOTHING
};

/// The interpreter a program's base name is, versioned names included (`python3.12`,
/// `perl5.36.0`, `ruby3.2`, `node20`, `lua5.4`, `php8.1`).
pub(super) fn interpreter(base: &str) -> Option<&'static Interpreter> {
    let versioned = |name: &str| {
        base.strip_prefix(name).is_some_and(|version| {
            version
                .trim_start_matches(['-', '_'])
                .chars()
                .all(|c| c.is_ascii_digit() || c == '.')
        })
    };
    let table: &[(&str, &Interpreter)] = &[
        ("python", &PYTHON),
        ("pypy", &PYTHON),
        ("perl", &PERL),
        ("nodejs", &NODE),
        ("node", &NODE),
        ("ruby", &RUBY),
        ("php", &PHP),
        ("luajit", &LUA),
        ("lua", &LUA),
        ("bun", &EVAL_ONLY),
        ("osascript", &EVAL_ONLY),
        ("Rscript", &EVAL_ONLY),
    ];
    table
        .iter()
        .find(|(name, _)| versioned(name))
        .map(|(_, spec)| *spec)
}

/// What an interpreter's words make it run.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Runs {
    /// This code, from its command line.
    Code(String),
    /// Code from its input (a pipe, a here-document, a person typing); `interactive`: it reads
    /// it a line at a time (`-i`, a debugger, a REPL module).
    Input { interactive: bool },
    /// Code the words do not show: a script named by a variable or a substitution.
    Hidden,
    /// A script file or module: its content is not judged.
    Script,
    /// Nothing (`--version`).
    Nothing,
}

/// Whether a script operand is the interpreter's own input.
pub(super) fn names_input(path: &str) -> bool {
    path == "-"
        || path.starts_with("/dev/")
        || path.starts_with("/proc/")
        || path.starts_with("/dev/fd/")
}

fn script(word: &Word, interactive: bool) -> Runs {
    if names_input(&word.text) {
        Runs::Input { interactive }
    } else if word.dynamic() {
        Runs::Hidden
    } else if interactive {
        Runs::Input { interactive }
    } else {
        Runs::Script
    }
}

pub(super) fn interpreter_runs(spec: &Interpreter, args: &[Word]) -> Runs {
    let mut interactive = false;
    let mut i = 0;
    while let Some(word) = args.get(i) {
        let text = word.text.as_str();
        i += 1;
        if word.split {
            // An unquoted expansion may be any option, `-c CODE` included.
            return Runs::Hidden;
        }
        if text == "--" {
            return match args.get(i) {
                Some(word) => script(word, interactive),
                None => Runs::Input { interactive },
            };
        }
        if text == "-" {
            return Runs::Input { interactive };
        }
        if let Some(long) = text.strip_prefix("--") {
            let (name, value) = match long.split_once('=') {
                Some((name, value)) => (name, Some(value.to_string())),
                None => (long, None),
            };
            if spec.long_code.contains(&name) {
                return Runs::Code(
                    value
                        .unwrap_or_else(|| args.get(i).map(|w| w.text.clone()).unwrap_or_default()),
                );
            }
            if name == "interactive" {
                interactive = true;
                continue;
            }
            if matches!(name, "version" | "help") {
                return Runs::Nothing;
            }
            if spec.long_valued.contains(&name) && value.is_none() {
                i += 1;
            }
            continue;
        }
        let Some(cluster) = text.strip_prefix('-') else {
            return script(word, interactive);
        };
        if cluster.len() == 1 && spec.version.contains(cluster) {
            return Runs::Nothing;
        }
        for (at, c) in cluster.char_indices() {
            let rest = &cluster[at + c.len_utf8()..];
            let value = || match rest {
                "" => args.get(i).map(|w| w.text.clone()).unwrap_or_default(),
                rest => rest.to_string(),
            };
            if spec.code.contains(c) {
                return Runs::Code(value());
            }
            if spec.script.contains(c) {
                let module = value();
                let repl = spec.repl_modules.contains(&module.as_str());
                return if repl || interactive || module.contains(MARK) {
                    Runs::Input { interactive: true }
                } else {
                    Runs::Script
                };
            }
            if spec.interactive.contains(c) {
                interactive = true;
                if spec.attached.contains(c) {
                    break;
                }
                continue;
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
    Runs::Input { interactive }
}

/// Python names through which code reaches the system or names a function by a string; any
/// identifier holding one of the `PYTHON_PARTS` counts too. Python code that uses none of them
/// can compute and print, not run a program or delete a file.
const PYTHON_NAMES: &[&str] = &[
    "os",
    "nt",
    "shutil",
    "pathlib",
    "Path",
    "exec",
    "eval",
    "compile",
    "globals",
    "locals",
    "vars",
    "builtins",
    "modules",
    "code",
    "codeop",
    "pdb",
    "bdb",
    "breakpoint",
    "help",
    "pydoc",
    "runpy",
    "pty",
    "multiprocessing",
    "concurrent",
    "asyncio",
    "inspect",
    "gc",
    "operator",
    "webbrowser",
    "platform",
    "pip",
    "setuptools",
    "distutils",
    "venv",
    "ensurepip",
    "site",
    "shelve",
    "dill",
    "yaml",
    "imp",
    "zipimport",
    "rename",
    "replace",
    "truncate",
    "kill",
    "signal",
    "load_extension",
    "tempfile",
    "glob",
    "sys",
    "io",
    "open",
];
const PYTHON_PARTS: &[&str] = &[
    "subprocess",
    "popen",
    "spawn",
    "exec",
    "system",
    "remove",
    "unlink",
    "rmdir",
    "rmtree",
    "ctypes",
    "posix",
    "import_",
    "_import",
    "getattr",
    "attrgetter",
    "methodcaller",
    "__",
    "pickle",
    "marshal",
    "fork",
    "ioctl",
    "fcntl",
    "termios",
    "importlib",
];
/// Names everyday one-liners use that stay harmless on their own (`sys.argv`, `open(f)`):
/// `sys` and `io` reach other modules only through names listed above (`sys.modules`).
const PYTHON_HARMLESS: &[&str] = &["sys", "io", "open", "glob", "tempfile", "replace"];

/// Whether Python `code` may run a program or delete a file.
pub(super) fn python_reaches_system(code: &str) -> bool {
    reaches(code, |name| {
        (PYTHON_NAMES.contains(&name) && !PYTHON_HARMLESS.contains(&name))
            || PYTHON_PARTS.iter().any(|part| name.contains(part))
    })
}

/// JavaScript names through which code reaches the system or evaluates a string.
const NODE_NAMES: &[&str] = &[
    "fs",
    "child_process",
    "process",
    "eval",
    "Function",
    "constructor",
    "globalThis",
    "global",
    "module",
    "import",
    "Deno",
    "Bun",
    "vm",
    "worker_threads",
    "cluster",
    "inspector",
    "wasi",
    "dlopen",
    "binding",
    "rm",
    "rmSync",
    "repl",
    "Reflect",
    "Proxy",
    "setTimeout",
    "setInterval",
    "prototype",
    "__proto__",
];
const NODE_PARTS: &[&str] = &[
    "exec",
    "spawn",
    "fork",
    "unlink",
    "rmdir",
    "remove",
    "child_process",
    "fs/",
];

/// Whether JavaScript `code` may run a program or delete a file.
pub(super) fn node_reaches_system(code: &str) -> bool {
    reaches(code, |name| {
        NODE_NAMES.contains(&name) || NODE_PARTS.iter().any(|part| name.contains(part))
    })
}

/// Whether `code` has text the rules cannot see (an expansion, a non-ASCII character that an
/// interpreter may read as a letter) or an identifier `flagged` says reaches the system.
fn reaches(code: &str, flagged: impl Fn(&str) -> bool) -> bool {
    if code.contains(MARK) || !code.is_ascii() {
        return true;
    }
    code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '$'))
        .filter(|name| !name.is_empty())
        .any(flagged)
}

impl Reader {
    /// An interpreter's command: its code, its input, or a prompt it opens.
    pub(super) fn interpreter(
        &mut self,
        at: usize,
        spec: &Interpreter,
        args: &[Word],
        cx: Context<'_>,
    ) {
        let reaches = |code: &str| spec.reaches_system.is_none_or(|check| check(code));
        match interpreter_runs(spec, args) {
            Runs::Code(code) if reaches(&code) => self.concern(at, Concern::InlineCode),
            Runs::Hidden => self.concern(at, Concern::InlineCode),
            Runs::Input { interactive } => match cx.input {
                Some(Input::Text(code)) if !interactive && !reaches(code) => {}
                Some(_) => self.concern(at, Concern::InlineCode),
                None if interactive || self.terminal => self.concern(at, Concern::Interactive),
                None => {}
            },
            Runs::Code(_) | Runs::Script | Runs::Nothing => {}
        }
    }

    /// A program that runs what is typed at its terminal.
    pub(super) fn terminal_program(&mut self, at: usize, base: &str) -> bool {
        if TERMINAL_PROGRAMS.contains(&base) {
            if self.terminal {
                self.concern(at, Concern::Interactive);
            }
            return true;
        }
        false
    }

    /// `sh|bash|… [OPTIONS] -c TEXT`: the text as a line. A script file counts as shell input,
    /// and so does a shell reading a pipe; a here-document is read as its lines.
    pub(super) fn shell(
        &mut self,
        at: usize,
        base: &str,
        args: &[Word],
        cx: Context<'_>,
    ) -> Result<(), Unreadable> {
        let mut command_mode = false;
        let mut from_input = false;
        let mut interactive = false;
        let mut i = 0;
        while let Some(word) = args.get(i) {
            let text = word.text.as_str();
            if word.split {
                self.concern(at, Concern::Expansion);
                return Ok(());
            }
            if text == "--" || text == "-" {
                i += 1;
                break;
            }
            if text.starts_with("--") {
                if matches!(text, "--rcfile" | "--init-file") {
                    self.concern(at, Concern::ShellInput);
                    i += 1;
                }
                if text == "--interactive" {
                    interactive = true;
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
                    's' => from_input = true,
                    'i' => interactive = true,
                    _ => {}
                }
            }
        }
        let operand = args.get(i);
        if !command_mode {
            match operand {
                // A script file runs as `./script` would: its content is not judged.
                Some(script) if !from_input && !names_input(&script.text) => {
                    if script.dynamic() {
                        self.concern(at, Concern::Expansion);
                    }
                }
                None if cx.appended() => self.concern(at, Concern::CommandFromInput),
                _ => match cx.input {
                    Some(Input::Text(body)) => {
                        self.seen[at].transparent = true;
                        let inner = Context { input: None, ..cx };
                        self.line(at, body, "a here-document", inner)?;
                    }
                    Some(_) => self.concern(at, Concern::ShellInput),
                    None if interactive || self.terminal => {
                        self.concern(at, Concern::Interactive);
                    }
                    None => {}
                },
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
        self.line(at, &text.text, &via, cx)
    }

    /// `awk 'PROGRAM'`: the program runs commands with `system`, pipes, or gawk's `@f()`
    /// indirect calls and `@load`; one from input, or an extension loaded with `-l`, is code
    /// the words do not show.
    pub(super) fn awk(&mut self, at: usize, args: &[Word], cx: Context<'_>) {
        let mut i = 0;
        let mut program = None;
        let mut hidden = false;
        while let Some(word) = args.get(i) {
            let text = word.text.as_str();
            i += 1;
            hidden |= word.split;
            match text {
                "-f" | "--file" | "-E" | "--exec" | "-i" | "--include" => {
                    let file = args.get(i).map_or("", |w| w.text.as_str());
                    hidden |= names_input(file) && cx.input.is_some() || file.contains(MARK);
                    i += 1;
                    program = program.or(Some(""));
                }
                "-l" | "--load" => {
                    hidden = true;
                    i += 1;
                }
                "-F" | "-v" | "--assign" | "--field-separator" => i += 1,
                "-e" | "--source" => {
                    program = args.get(i).map(|w| w.text.as_str());
                    i += 1;
                }
                "--" => {
                    program = program.or(args.get(i).map(|w| w.text.as_str()));
                    break;
                }
                _ if text.starts_with("-l") || text.starts_with("--load=") => hidden = true,
                _ if text.starts_with('-') && text.len() > 1 => {}
                text => {
                    program = program.or(Some(text));
                    if program == Some(text) {
                        break;
                    }
                }
            }
        }
        let runs = program
            .is_some_and(|p| p.contains(MARK) || p.contains(['|', '@']) || p.contains("system"));
        if hidden || runs {
            self.concern(at, Concern::InlineCode);
        }
    }
}
