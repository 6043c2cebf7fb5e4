//! Programs with a way of their own to run a command: `git` (aliases, `-c`, `rebase -x`,
//! `grep -O`, transports), `sed` (`e`), `tar` (`--to-command`, `-I`, checkpoints), `make`
//! (`--eval`), `rsync` (`-e`, `--rsync-path`) and `ssh` (`-o ProxyCommand`, a remote command).

use super::interpreters::names_input;
use super::judge::{Context, Reader, is_run_environment};
use super::lex::{Input, MARK, Word, quote, segments, words_text};
use super::{Concern, RunTimeArgs, Unreadable};

/// git subcommands whose arguments can make it run a command.
const RUNS_COMMANDS: &[&str] = &[
    "config",
    "submodule",
    "rebase",
    "difftool",
    "mergetool",
    "filter-branch",
    "bisect",
    "grep",
    "clone",
    "fetch",
    "pull",
    "push",
    "ls-remote",
    "archive",
    "remote",
    "init",
];

/// Whether `name` (an option as written, before any `=`) is `full` or an abbreviation of it at
/// least `min` characters long, as git, tar and getopt_long accept them.
fn abbreviates(name: &str, full: &str, min: usize) -> bool {
    name.starts_with("--") && name.len() >= min && full.starts_with(name)
}

/// The command texts of `git rebase -x`/`--exec` (and abbreviations, `-xTEXT`),
/// `difftool`/`mergetool --extcmd`, `filter-branch --*-filter`.
fn git_command_texts(args: &[Word]) -> Vec<String> {
    let mut texts = Vec::new();
    let mut k = 0;
    while let Some(word) = args.get(k) {
        let text = word.text.as_str();
        k += 1;
        let (name, attached) = match text.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(value.to_string())),
            _ => (text, None),
        };
        let long = name.starts_with("--")
            && (abbreviates(name, "--exec", 4)
                || abbreviates(name, "--extcmd", 4)
                || name.ends_with("-filter"));
        if long {
            match attached {
                Some(value) => texts.push(value),
                None => {
                    texts.extend(args.get(k).map(|w| w.text.clone()));
                    k += 1;
                }
            }
            continue;
        }
        let Some(cluster) = text.strip_prefix('-').filter(|c| !c.starts_with('-')) else {
            continue;
        };
        for (at, c) in cluster.char_indices() {
            let rest = &cluster[at + 1..];
            if c == 'x' {
                if rest.is_empty() {
                    texts.extend(args.get(k).map(|w| w.text.clone()));
                    k += 1;
                } else {
                    texts.push(rest.to_string());
                }
                break;
            }
            if "sXCS".contains(c) {
                break;
            }
        }
    }
    texts
}

/// The pager of `git grep -O[PAGER]`/`--open-files-in-pager[=PAGER]`, when one is given.
fn git_grep_pager(args: &[Word]) -> Option<String> {
    for word in args {
        let text = word.text.as_str();
        if text == "--" {
            break;
        }
        if let Some((name, value)) = text.split_once('=')
            && abbreviates(name, "--open-files-in-pager", 4)
        {
            return Some(value.to_string());
        }
        let Some(cluster) = text.strip_prefix('-').filter(|c| !c.starts_with('-')) else {
            continue;
        };
        for (at, c) in cluster.char_indices() {
            if c == 'O' {
                let pager = &cluster[at + 1..];
                return (!pager.is_empty()).then(|| pager.to_string());
            }
            if "efABCm".contains(c) {
                break;
            }
        }
    }
    None
}

impl Reader {
    /// `git [GLOBAL OPTIONS] SUBCOMMAND …`: judged without its global options; configuration
    /// from the command line counts; aliases given with `-c` are followed.
    pub(super) fn git(
        &mut self,
        at: usize,
        args: &[Word],
        cx: Context<'_>,
    ) -> Result<(), Unreadable> {
        let mut aliases: Vec<(String, String)> = Vec::new();
        let mut i = 0;
        while let Some(word) = args.get(i) {
            let text = word.text.as_str();
            if word.split || word.dynamic() {
                // An expansion among the global options may be any option, `-c` included.
                self.concern(at, Concern::Expansion);
                return Ok(());
            }
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
        if sub.dynamic() {
            self.concern(at, Concern::Expansion);
            return Ok(());
        }
        let via = format!("git {}", sub.text);
        if let Some((_, alias)) = aliases.iter().find(|(name, _)| *name == sub.text) {
            return match alias.strip_prefix('!') {
                Some(shell) => {
                    let mut text = shell.to_string();
                    for word in sub_args {
                        text.push(' ');
                        text.push_str(&quote(&word.text));
                    }
                    self.line(at, &text, "a git alias", cx)
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
        if sub_args.iter().any(|w| w.split) && RUNS_COMMANDS.contains(&sub.text.as_str()) {
            self.concern(at, Concern::Expansion);
        }
        if sub_args
            .iter()
            .any(|w| w.text.starts_with("ext::") || w.text.starts_with("fd::"))
        {
            // The `ext::` transport runs its command.
            self.concern(at, Concern::GitConfig);
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
                    self.line(at, &words_text(&command), &via, cx)?;
                }
                Ok(())
            }
            "rebase" | "difftool" | "mergetool" | "filter-branch" => {
                for text in git_command_texts(sub_args) {
                    self.line(at, &text, &via, cx)?;
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
            "rm" => {
                // `git rm` deletes files from the working tree like rm; only `--cached` (the
                // index alone) and a dry run do not.
                let keeps = sub_args.iter().any(|w| {
                    matches!(w.text.as_str(), "--cached" | "--dry-run")
                        || (w.text.starts_with('-')
                            && !w.text.starts_with("--")
                            && w.text.contains('n'))
                });
                if !keeps {
                    let files = sub_args
                        .iter()
                        .filter(|w| !w.text.starts_with('-'))
                        .map(|w| w.text.clone())
                        .collect();
                    self.deletes(at, "git rm", files);
                }
                Ok(())
            }
            "grep" => {
                if let Some(pager) = git_grep_pager(sub_args) {
                    // The pager runs with the matching files' names appended.
                    let run_time = RunTimeArgs {
                        appended: true,
                        placeholder: None,
                    };
                    let cx = Context {
                        run_time: Some(&run_time),
                        ..cx.inner("git grep -O")
                    };
                    if pager.contains(MARK) {
                        self.concern(at, Concern::Expansion);
                    } else {
                        for segment in segments(&pager, self.typed)? {
                            self.command(&segment.words, cx)?;
                        }
                    }
                }
                Ok(())
            }
            sub => {
                let runs_program = sub_args.iter().any(|w| {
                    let name = w.text.split_once('=').map_or(w.text.as_str(), |(n, _)| n);
                    ["--upload-pack", "--receive-pack", "--exec", "--template"]
                        .iter()
                        .any(|o| abbreviates(name, o, 4))
                        || (w.text == "-u" && matches!(sub, "clone" | "ls-remote"))
                        || (matches!(sub, "clone" | "init" | "submodule")
                            && (abbreviates(name, "--config", 4)
                                || (w.text.starts_with("-c") && !w.text.starts_with("--"))))
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
            self.line(at, shell, "a git alias", cx)?;
        }
        Ok(())
    }

    /// `sed SCRIPT` / `-e SCRIPT`: the `e` command and the `e` flag of `s` run a command;
    /// a script from a file is not read (like a script file), one from input or an
    /// expansion is unseen.
    pub(super) fn sed(&mut self, at: usize, args: &[Word]) {
        let mut scripts = Vec::new();
        let mut from_file = false;
        let mut i = 0;
        while let Some(word) = args.get(i) {
            let text = word.text.as_str();
            i += 1;
            if word.split {
                self.concern(at, Concern::Expansion);
                return;
            }
            if let Some(script) = text.strip_prefix("--expression=") {
                scripts.push(script.to_string());
            } else if text.starts_with("--file=") {
                from_file = true;
            } else if matches!(text, "-e" | "--expression") {
                scripts.extend(args.get(i).map(|w| w.text.clone()));
                i += 1;
            } else if matches!(text, "-f" | "--file") {
                from_file = true;
                i += 1;
            } else if matches!(text, "-l" | "--line-length") {
                i += 1;
            } else if text == "--" {
                break;
            } else if let Some(cluster) = text
                .strip_prefix('-')
                .filter(|c| !c.starts_with('-') && !c.is_empty())
            {
                if let Some(at_e) = cluster.find(['e', 'f']) {
                    let rest = &cluster[at_e + 1..];
                    let value = if rest.is_empty() {
                        i += 1;
                        args.get(i - 1).map(|w| w.text.clone()).unwrap_or_default()
                    } else {
                        rest.to_string()
                    };
                    if cluster.as_bytes()[at_e] == b'e' {
                        scripts.push(value);
                    } else {
                        from_file = true;
                    }
                }
            } else if !text.starts_with("--") && scripts.is_empty() && !from_file {
                scripts.push(text.to_string());
            }
        }
        if scripts.iter().any(|script| sed_runs_commands(script)) {
            self.concern(at, Concern::RunsCommand("sed's e command".into()));
        }
    }

    /// `tar`: `--to-command`, `-I`/`--use-compress-program`, `--checkpoint-action=exec=`
    /// and `--rsh-command` run their command (read as a line, fed the archive's data);
    /// `-F`/`--info-script` a script file; `--remove-files` deletes like rm; `--transform`
    /// into a `.git` path counts as a path in `.git`.
    pub(super) fn tar(
        &mut self,
        at: usize,
        args: &[Word],
        cx: Context<'_>,
    ) -> Result<(), Unreadable> {
        let pipe = Input::Pipe;
        let mut commands = Vec::new();
        let mut i = 0;
        while let Some(word) = args.get(i) {
            let text = word.text.as_str();
            i += 1;
            if word.split {
                self.concern(at, Concern::Expansion);
            }
            if text == "--" {
                break;
            }
            if text.starts_with("--") {
                let (name, attached) = match text.split_once('=') {
                    Some((name, value)) => (name, Some(value.to_string())),
                    None => (text, None),
                };
                let value = |i: &mut usize| {
                    attached.clone().or_else(|| {
                        *i += 1;
                        args.get(*i - 1).map(|w| w.text.clone())
                    })
                };
                if abbreviates(name, "--to-command", 6)
                    || abbreviates(name, "--use-compress-program", 5)
                    || abbreviates(name, "--rsh-command", 5)
                {
                    commands.extend(value(&mut i));
                } else if abbreviates(name, "--checkpoint-action", 13) {
                    let action = value(&mut i).unwrap_or_default();
                    if let Some(command) = action.strip_prefix("exec=") {
                        commands.push(command.to_string());
                    }
                } else if abbreviates(name, "--info-script", 6)
                    || abbreviates(name, "--new-volume-script", 6)
                {
                    self.concern(at, Concern::ShellInput);
                } else if abbreviates(name, "--remove-files", 8) {
                    self.deletes(at, "tar --remove-files", Vec::new());
                } else if abbreviates(name, "--transform", 5) || abbreviates(name, "--xform", 4) {
                    let expression = value(&mut i).unwrap_or_default();
                    if expression.to_ascii_lowercase().contains(".git") {
                        self.concern(at, Concern::GitDirectory);
                    }
                }
                continue;
            }
            // Old-style letters (`tar xzf a.tgz`) or a short cluster (`-xzf`).
            let cluster = match text.strip_prefix('-') {
                Some(cluster) => cluster,
                None if i == 1 => text,
                None => continue,
            };
            if let Some((before, rest)) = cluster.split_once('I') {
                let old_style = !text.starts_with('-');
                if old_style || rest.is_empty() {
                    // Old-style letters take their values from the next words, in order.
                    let skip = if old_style {
                        before
                            .chars()
                            .filter(|c| "fbCHKLNTVXgF".contains(*c))
                            .count()
                    } else {
                        0
                    };
                    commands.extend(args.get(i + skip).map(|w| w.text.clone()));
                } else {
                    commands.push(rest.to_string());
                }
            }
            if cluster.contains('F') {
                self.concern(at, Concern::ShellInput);
            }
        }
        for command in commands {
            let cx = Context {
                input: Some(&pipe),
                ..cx.inner("tar")
            };
            self.seen[at].transparent = false;
            self.line(at, &command, "tar", cx)?;
        }
        Ok(())
    }

    /// `make`: it runs what its Makefile says, a script file the rules do not read; text given
    /// as a Makefile (`--eval`, `-f -` from input) and variables whose value expands (`x:=$(shell …)`)
    /// or that choose the shell or compiler are unseen commands.
    pub(super) fn make(&mut self, at: usize, args: &[Word], cx: Context<'_>) {
        let mut i = 0;
        while let Some(word) = args.get(i) {
            let text = word.text.as_str();
            i += 1;
            if word.split {
                self.concern(at, Concern::Expansion);
            }
            let name = text.split_once('=').map_or(text, |(n, _)| n);
            if text == "-E"
                || text.starts_with("--eval")
                || (text.starts_with("-E") && text.len() > 2)
            {
                self.concern(at, Concern::RunsCommand("make --eval".into()));
            } else if matches!(text, "-f" | "--file" | "--makefile") {
                let file = args.get(i).map_or("", |w| w.text.as_str());
                if names_input(file) && cx.input.is_some() {
                    self.concern(at, Concern::ShellInput);
                }
                i += 1;
            } else if !text.starts_with('-') && text.contains('=') {
                let variable = name.trim_end_matches([':', '+', '?', '!']);
                let value = text.split_once('=').map_or("", |(_, v)| v);
                if value.contains('$') || text.contains(":=") || text.contains("!=") {
                    self.concern(at, Concern::RunsCommand("a make variable".into()));
                }
                if is_run_environment(variable)
                    || matches!(variable, "MAKE" | "MAKESHELL" | ".SHELLFLAGS")
                {
                    self.concern(at, Concern::RunEnvironment(variable.to_string()));
                }
            }
        }
    }

    /// `rsync`: `-e`/`--rsh` is a command line (read as one); `--rsync-path` runs on the other
    /// side, perhaps this host; `--delete` and `--remove-source-files` delete like rm.
    pub(super) fn rsync(
        &mut self,
        at: usize,
        args: &[Word],
        cx: Context<'_>,
    ) -> Result<(), Unreadable> {
        let mut i = 0;
        while let Some(word) = args.get(i) {
            let text = word.text.as_str();
            i += 1;
            if text.starts_with("--delete") || text == "--remove-source-files" {
                self.deletes(at, "rsync --delete", Vec::new());
            }
            if text.starts_with("--rsync-path") {
                self.concern(at, Concern::RunsCommand("rsync --rsync-path".into()));
            }
            let shell = if let Some(value) = text.strip_prefix("--rsh=") {
                Some(value.to_string())
            } else if text == "--rsh" || text == "-e" {
                i += 1;
                args.get(i - 1).map(|w| w.text.clone())
            } else if let Some(cluster) = text.strip_prefix('-').filter(|c| !c.starts_with('-')) {
                cluster.split_once('e').map(|(_, rest)| {
                    if rest.is_empty() {
                        i += 1;
                        args.get(i - 1).map(|w| w.text.clone()).unwrap_or_default()
                    } else {
                        rest.to_string()
                    }
                })
            } else {
                None
            };
            if let Some(shell) = shell {
                self.line(at, &shell, "rsync -e", cx.inner("rsync -e"))?;
            }
        }
        Ok(())
    }

    /// `ssh [OPTIONS] HOST [COMMAND…]`: the command is read as a line (the host may be this
    /// one); `-o ProxyCommand=`, `LocalCommand`, `KnownHostsCommand`, `Match exec`, a config
    /// file (`-F`) and `scp -S` run commands the words do not show.
    pub(super) fn ssh(
        &mut self,
        at: usize,
        base: &str,
        args: &[Word],
        cx: Context<'_>,
    ) -> Result<(), Unreadable> {
        const VALUED: &str = "BbcDEeFIiJLlmOopQRSWw";
        let mut i = 0;
        let mut host = None;
        while let Some(word) = args.get(i) {
            let text = word.text.as_str();
            i += 1;
            if word.split {
                self.concern(at, Concern::Expansion);
            }
            if text == "--" {
                host = host.or(Some(i));
                break;
            }
            let Some(cluster) = text.strip_prefix('-').filter(|c| !c.is_empty()) else {
                host = Some(i);
                break;
            };
            for (k, c) in cluster.char_indices() {
                if !VALUED.contains(c) {
                    continue;
                }
                let rest = &cluster[k + 1..];
                let value = if rest.is_empty() {
                    i += 1;
                    args.get(i - 1).map(|w| w.text.clone()).unwrap_or_default()
                } else {
                    rest.to_string()
                };
                let key = value
                    .split(['=', ' ', '\t'])
                    .next()
                    .unwrap_or_default()
                    .to_ascii_lowercase();
                let runs = match c {
                    'o' => matches!(
                        key.as_str(),
                        "proxycommand"
                            | "localcommand"
                            | "permitlocalcommand"
                            | "knownhostscommand"
                            | "match"
                            | "include"
                            | "remotecommand"
                    ),
                    'F' => true,
                    'S' => base == "scp",
                    _ => false,
                };
                if runs {
                    self.concern(at, Concern::RunsCommand(format!("{base} -{c} {value}")));
                }
                break;
            }
        }
        if base == "ssh"
            && let Some(host) = host
            && host < args.len()
        {
            self.seen[at].transparent = false;
            self.line(at, &words_text(&args[host..]), "ssh", cx)?;
        }
        Ok(())
    }
}

/// Whether a sed script has an `e` command or an `s` command with the `e` flag. Commands it does
/// not know count as running one.
pub(super) fn sed_runs_commands(script: &str) -> bool {
    if script.contains(MARK) {
        return true;
    }
    let chars: Vec<char> = script.chars().collect();
    let mut i = 0;
    let to_line_end = |i: &mut usize| {
        while *i < chars.len() && chars[*i] != '\n' {
            *i += 1;
        }
    };
    // Skips a delimited part (`/re/`, `s`'s two parts) starting after its delimiter.
    let delimited = |i: &mut usize, delimiter: char| {
        while *i < chars.len() && chars[*i] != delimiter {
            if chars[*i] == '\\' {
                *i += 1;
            }
            *i += 1;
        }
        *i += 1;
    };
    while i < chars.len() {
        let c = chars[i];
        i += 1;
        match c {
            ' ' | '\t' | '\n' | ';' | '{' | '}' | '!' | ',' | '$' | '~' => {}
            '0'..='9' => {}
            '/' => delimited(&mut i, '/'),
            '\\' => {
                let delimiter = chars.get(i).copied().unwrap_or('/');
                i += 1;
                delimited(&mut i, delimiter);
            }
            '#' | ':' | 'a' | 'i' | 'c' | 'r' | 'R' | 'w' | 'W' | 'b' | 't' | 'T' => {
                to_line_end(&mut i);
            }
            'e' => return true,
            's' | 'y' => {
                let delimiter = chars.get(i).copied().unwrap_or('/');
                i += 1;
                delimited(&mut i, delimiter);
                delimited(&mut i, delimiter);
                if c == 's' {
                    while i < chars.len() && !matches!(chars[i], ';' | '\n' | '}') {
                        match chars[i] {
                            'e' => return true,
                            'w' => to_line_end(&mut i),
                            _ => i += 1,
                        }
                    }
                }
            }
            '=' | 'd' | 'D' | 'g' | 'G' | 'h' | 'H' | 'n' | 'N' | 'p' | 'P' | 'x' | 'z' | 'F'
            | 'l' | 'L' | 'q' | 'Q' | 'I' | 'M' => {}
            _ => return true,
        }
    }
    false
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
