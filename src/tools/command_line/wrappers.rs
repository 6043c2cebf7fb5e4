//! Programs that run a command given after their options (`env`, `sudo`, `nice`, `timeout`,
//! `xargs`, `find -exec`, `watch`, `flock`, `su`, …): their options, to find where that command
//! starts, and the reading of each.

use super::judge::is_run_environment;
use super::judge::{Context, Reader};
use super::lex::{Word, env_split, words_text};
use super::{Concern, RunTimeArgs, Seen, Unreadable};

/// The options of a program that runs another, to find where that command starts.
#[derive(Default)]
pub(super) struct Options {
    /// Short options without a value.
    pub(super) flags: &'static str,
    /// Short options with a value, attached (`-n5`) or the next word.
    pub(super) valued: &'static str,
    /// Short options whose value, if any, is attached (`-i{}`).
    pub(super) attached: &'static str,
    /// Short options after which no command runs (`command -v`).
    pub(super) stops: &'static str,
    /// Long options without a value (or with an attached `=value`).
    pub(super) long_flags: &'static [&'static str],
    /// Long options with a value (`--signal=KILL` or `--signal KILL`).
    pub(super) long_valued: &'static [&'static str],
    /// Long options after which no command runs.
    pub(super) long_stops: &'static [&'static str],
    /// `-5` is an option with a value (`nice -5`).
    pub(super) numbers: bool,
}

/// The options read from the front of some words.
pub(super) struct Parsed {
    /// Words taken by the options, `--` included.
    pub(super) taken: usize,
    /// Each option's name (the letter, or the long name) and its value.
    pub(super) used: Vec<(String, Option<String>)>,
    /// An option after which no command runs was given.
    pub(super) stopped: bool,
}

impl Parsed {
    pub(super) fn value_of(&self, names: &[&str]) -> Option<&str> {
        self.used
            .iter()
            .find(|(name, _)| names.contains(&name.as_str()))
            .and_then(|(_, value)| value.as_deref())
    }

    pub(super) fn has(&self, names: &[&str]) -> bool {
        self.used
            .iter()
            .any(|(name, _)| names.contains(&name.as_str()))
    }
}

/// An option word a wrapper's spec does not know, as written.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct UnknownOption(pub(super) String);

/// Reads options from the front of `words` (each `-x` cluster, `--long[=value]`, up to `--` or
/// the first word that is no option); `Err` names an option `spec` does not know.
pub(super) fn parse_options(words: &[Word], spec: &Options) -> Result<Parsed, UnknownOption> {
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

pub(super) const NO_OPTIONS: Options = Options {
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
pub(super) const WRAPPERS: &[(&str, &Options, usize, bool)] = &[
    ("command", &COMMAND, 0, true),
    ("builtin", &NO_OPTIONS, 0, true),
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

impl Reader {
    /// Reads a wrapper's options; `None`, with the concern recorded, when one is unknown.
    pub(super) fn options(&mut self, at: usize, args: &[Word], spec: &Options) -> Option<Parsed> {
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
    pub(super) fn reads_input(&mut self, at: usize, cx: Context<'_>) {
        if cx.input.is_some() {
            self.concern(at, Concern::ShellInput);
        }
    }

    /// Records that the command at `at` deletes files like `rm OPERANDS`.
    pub(super) fn deletes(&mut self, at: usize, by: &str, operands: Vec<String>) {
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
    pub(super) fn inner(
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
        if args[..start].iter().any(|w| w.split) {
            self.concern(at, Concern::Expansion);
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
    pub(super) fn env(
        &mut self,
        at: usize,
        args: &[Word],
        cx: Context<'_>,
    ) -> Result<(), Unreadable> {
        let mut args = args;
        while args.first().is_some_and(|w| w.text == "-") {
            args = &args[1..];
        }
        let Some(parsed) = self.options(at, args, &ENV).filter(|p| !p.stopped) else {
            return Ok(());
        };
        if let Some(split) = parsed.value_of(&["S", "split-string"]) {
            let mut words = vec![Word::literal("env")];
            words.extend(env_split(split)?);
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
    pub(super) fn sudo(
        &mut self,
        at: usize,
        args: &[Word],
        cx: Context<'_>,
    ) -> Result<(), Unreadable> {
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
    pub(super) fn xargs(
        &mut self,
        at: usize,
        args: &[Word],
        cx: Context<'_>,
    ) -> Result<(), Unreadable> {
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
        if args[..parsed.taken].iter().any(|w| w.split) {
            self.concern(at, Concern::Expansion);
        }
        self.seen[at].transparent = true;
        let cx = Context {
            run_time: Some(&run_time),
            input: None,
            ..cx.inner("xargs")
        };
        self.command(command, cx)
    }

    /// `find START… EXPRESSION`: each `-exec`/`-execdir`/`-ok`/`-okdir` command, and
    /// `-delete` as `rm START…`.
    pub(super) fn find(
        &mut self,
        at: usize,
        args: &[Word],
        cx: Context<'_>,
    ) -> Result<(), Unreadable> {
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
        if args.iter().any(|w| w.split) {
            // An unquoted expansion may be an action, `-exec` or `-delete` included.
            self.concern(at, Concern::Expansion);
        }
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
                        input: None,
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

    /// `watch [OPTIONS] COMMAND…`: the words joined and run with `sh -c`, or as argv with `-x`.
    pub(super) fn watch(
        &mut self,
        at: usize,
        args: &[Word],
        cx: Context<'_>,
    ) -> Result<(), Unreadable> {
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
        self.line(at, &words_text(&args[parsed.taken..]), "watch", cx)
    }

    /// `flock [OPTIONS] FILE COMMAND…`, `flock [OPTIONS] FILE -c TEXT`.
    pub(super) fn flock(
        &mut self,
        at: usize,
        args: &[Word],
        cx: Context<'_>,
    ) -> Result<(), Unreadable> {
        let Some(parsed) = self.options(at, args, &FLOCK).filter(|p| !p.stopped) else {
            return Ok(());
        };
        if let Some(text) = parsed.value_of(&["c", "command"]) {
            self.seen[at].transparent = true;
            return self.line(at, text, "flock -c", cx);
        }
        let start = (parsed.taken + 1).min(args.len());
        if let Some(option) = args.get(start)
            && matches!(option.text.as_str(), "-c" | "--command")
        {
            if let Some(text) = args.get(start + 1) {
                self.seen[at].transparent = true;
                return self.line(at, &text.text, "flock -c", cx);
            }
            return Ok(());
        }
        self.inner(at, args, start, true, cx.inner("flock"))
    }

    /// `su`/`runuser … -c TEXT`: the text as a line; without `-c`, a shell reading its input.
    pub(super) fn su(
        &mut self,
        at: usize,
        args: &[Word],
        cx: Context<'_>,
    ) -> Result<(), Unreadable> {
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
            self.line(at, &text, "su -c", cx)?;
        }
        Ok(())
    }
}
