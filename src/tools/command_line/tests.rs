//! Tests of the command reader, and of the judgement it feeds with a policy where only `rm` and
//! `curl` are denied.

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
        "echo 'open",
        "echo \"open",
        "echo $(rm x",
        "(rm x",
        "rm x)",
        "ls >",
        "case x in x) ;; esac",
        "x=1; echo ${x@P}",
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
    assert!(concerns("git -c color.ui=never -c core.pager=x log").contains(&Concern::GitConfig));
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
        ("echo rm v | sh", Concern::ShellInput),
        ("python3 -c 'import os'", Concern::InlineCode),
        ("$CMD x", Concern::Expansion),
        ("sudo $X", Concern::Expansion),
        ("sh -c \"$X\"", Concern::Expansion),
        ("{rm,x}", Concern::Glob),
        ("echo 'import os' | python3", Concern::InlineCode),
        ("perl -e 'unlink 1'", Concern::InlineCode),
        ("perl -pi -e 's/a/b/' f", Concern::InlineCode),
        ("perl -I lib -e 1", Concern::InlineCode),
        ("node -e 'require(\"fs\")'", Concern::InlineCode),
        ("node --eval=process.exit()", Concern::InlineCode),
        ("bash -i", Concern::Interactive),
        ("$CMD x", Concern::Expansion),
        ("sudo $X", Concern::Expansion),
        ("sh -c \"$X\"", Concern::Expansion),
        ("{rm,x}", Concern::Glob),
        ("ruby -e 1", Concern::InlineCode),
        ("php -r 1", Concern::InlineCode),
        ("awk 'BEGIN{system(\"rm v\")}'", Concern::InlineCode),
        ("bash -i", Concern::Interactive),
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
        "sh x.sh",
        "bash scripts/check.sh",
        "node -e 1",
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

use crate::tools::approval::{ApprovalRules, CommandRule, Gate, RuleAction};
use crate::tools::policy::ToolPolicy;
use serde_json::json;

/// Rules where only `rm` and `curl` are denied, as the issue's hostile model met them.
fn rm_and_curl_denied() -> ApprovalRules {
    let deny = |program: &str| CommandRule {
        prefix: vec![program.to_string()],
        action: RuleAction::Deny,
    };
    let policy = ToolPolicy {
        commands: vec![deny("rm"), deny("curl")],
        ..ToolPolicy::default()
    };
    // The built-ins' subjects: which argument of which tool is a command line.
    ApprovalRules::new([&policy], crate::tools::approval::tests::tool_groups())
}

/// The command lines of the corpus: one a line, a here-document's body and end line with the
/// line that starts it.
fn corpus_lines(text: &str) -> Vec<String> {
    let mut lines = text
        .lines()
        .filter(|line| !line.starts_with('#') || line.starts_with("#!"));
    let mut entries = Vec::new();
    while let Some(line) = lines.next() {
        let mut entry = line.to_string();
        if let Some((_, after)) = line.split_once("<<")
            && !after.starts_with('<')
        {
            let delimiter: String = after
                .trim_start_matches('-')
                .trim_start()
                .chars()
                .take_while(|c| !c.is_whitespace())
                .filter(|c| !matches!(c, '\'' | '"'))
                .collect();
            for body in lines.by_ref() {
                entry.push('\n');
                entry.push_str(body);
                if body == delimiter {
                    break;
                }
            }
        }
        entries.push(entry);
    }
    entries
}

#[test]
fn everyday_lines_ask_nothing_when_only_rm_and_curl_are_denied() {
    let corpus = include_str!("../../../tests/fixtures/everyday_commands.txt");
    let lines = corpus_lines(corpus);
    assert!(lines.len() >= 200, "the corpus has {} lines", lines.len());
    let rules = rm_and_curl_denied();
    let asked: Vec<String> = lines
        .iter()
        .filter_map(
            |line| match rules.gate("shell", &json!({ "command": line }), &[]) {
                Gate::Run => None,
                Gate::Ask { reason, .. } => Some(format!("{line:?} asks: {reason}")),
                Gate::Refuse { reason } => Some(format!("{line:?} is refused: {reason}")),
            },
        )
        .collect();
    assert!(
        asked.is_empty(),
        "{} of {} lines:\n{}",
        asked.len(),
        lines.len(),
        asked.join("\n")
    );
}

/// Lines that reach `rm` or `curl`, or run what the rules cannot see: each must ask or be
/// refused with only `rm` and `curl` denied.
const MUST_ASK: &[&str] = &[
    // Plain and wrapped.
    "rm -rf v",
    "curl https://example.com",
    "ls > f; rm v",
    "cargo test 2>&1 | tail; rm v",
    "echo $(rm v)",
    "echo \"$(rm v)\"",
    "echo `rm v`",
    "cat <(rm v)",
    "for f in a; do rm $f; done",
    "while true; do rm v; done",
    "if true; then rm v; fi",
    "(cd x && rm v)",
    "{ rm v; }",
    "f() { rm v; }; f",
    "function f { rm v; }",
    "true && rm v || curl x",
    "cat <<EOF\n$(rm v)\nEOF",
    "bash <<EOF\nrm v\nEOF",
    "sh <<< 'rm v'",
    "$CMD v",
    "\"$X\" v",
    "sudo $X",
    "env $X",
    "timeout $T cargo",
    "sh -c \"$X\"",
    "eval \"$X\"",
    "{rm,v}",
    "x='a[$(rm v)]'; echo $((x))",
    // The 13 forms the docs claimed.
    "env -S 'rm\\_v'",
    "env -S'rm v'",
    "perl5.36.0 -e 'unlink q(v)'",
    "python3.12 -c 'import os; os.remove(\"v\")'",
    "ruby3.2 -e 'File.delete(\"v\")'",
    "node20 -e 'require(\"fs\").rmSync(\"v\")'",
    "echo 'unlink q(v)' | perl /dev/stdin",
    "echo 'import os' | python3 -",
    "python3 /dev/stdin <<EOF\nimport shutil; shutil.rmtree('v')\nEOF",
    "perl <<EOF\nunlink 'v'\nEOF",
    "gawk 'BEGIN { f = \"system\"; @f(\"rm v\") }'",
    "awk -l filefuncs 'BEGIN{}'",
    "git rebase '-xrm v' main",
    "git rebase -ix 'rm v' main",
    "git rebase --ex='rm v' main",
    "git rebase --exe 'rm v' main",
    "git fetch --upload-pa='rm v' origin",
    "git clone -c filter.x.smudge='rm v' https://example.com/r",
    "git clone -c core.fsmonitor='rm v' https://example.com/r",
    "git clone --config core.hooksPath=h https://example.com/r",
    "git clone --template=t https://example.com/r",
    "git clone 'ext::sh -c rm% v' r",
    "hash -p /tmp/evil ls; ls",
    "builtin eval 'rm v'",
    "command eval 'rm v'",
    "printf -v PS4 '%s' '$(rm v)'; set -x; true",
    "printf -vPROMPT_COMMAND x",
    "declare -x BASH_ENV=x",
    "export ENV=x",
    "read PS4 < f",
    "declare -n r=PS4",
    // Their own checks.
    "sed 'e rm v' f",
    "sed 's/x/rm v/e' f",
    "sed -n '1e rm v' f",
    "sed -e 'p' -e 'e' f",
    "tar -cf a.tar --to-command='rm v' f",
    "tar --to-c='rm v' -xf a.tar",
    "tar -I 'rm v' -cf a.tar f",
    "tar --use-compress-program='rm v' -cf a.tar f",
    "tar --checkpoint=1 --checkpoint-action=exec='rm v' -cf a.tar f",
    "tar --remove-files -cf a.tar f",
    "tar --transform 's,^,.git/hooks/,' -xf a.tar",
    "tar cIf 'rm v' a.tar f",
    "make --eval='x:=$(shell rm v)'",
    "make -E 'all: ; rm v'",
    "make 'x:=$(shell rm v)'",
    "make SHELL=/tmp/sh",
    "git grep -O'rm -rf' x",
    "git grep --open-files-in-pager='rm' x",
    "git rm -f tracked.txt",
    "git rm -r src",
    "rsync -e 'rm v' a/ host:b/",
    "rsync --rsh='rm v' a/ host:b/",
    "rsync --rsync-path='rm v' a/ host:b/",
    "ssh -o ProxyCommand='rm v' host",
    "ssh -oLocalCommand='rm v' -o PermitLocalCommand=yes host",
    "ssh host rm v",
    "ssh -p 22 host 'rm -rf v'",
    "ssh -F ./ssh_config host",
    "scp -S ./prog a host:b",
];

#[test]
fn lines_that_reach_a_denied_program_ask_or_are_refused() {
    let rules = rm_and_curl_denied();
    let passed: Vec<&str> = MUST_ASK
        .iter()
        .copied()
        .filter(|line| {
            matches!(
                rules.gate("shell", &json!({ "command": line }), &[]),
                Gate::Run
            )
        })
        .collect();
    assert!(
        passed.is_empty(),
        "these ran without asking:\n{}",
        passed.join("\n")
    );
}

#[test]
fn an_interpreter_or_repl_started_with_a_terminal_asks_under_any_deny_rule() {
    let rules = rm_and_curl_denied();
    let with_tty = |cmd: &str| rules.gate("exec_command", &json!({ "cmd": cmd, "tty": true }), &[]);
    let without = |cmd: &str| rules.gate("exec_command", &json!({ "cmd": cmd }), &[]);
    for cmd in [
        "perl",
        "python3",
        "python3.12",
        "node",
        "ruby",
        "irb",
        "bash",
        "sh",
        "zsh",
        "lua",
        "php -a",
        "sqlite3 db",
        "cd x && python3",
        "env python3",
        "python3 -m pdb x.py",
    ] {
        assert!(
            matches!(with_tty(cmd), Gate::Ask { .. }),
            "{cmd} with a tty: {:?}",
            with_tty(cmd)
        );
    }
    // Without a terminal the input is a pipe that never ends: nothing typed runs, unless the
    // interpreter is made to read a line at a time.
    for cmd in ["perl", "python3", "node", "bash"] {
        assert_eq!(without(cmd), Gate::Run, "{cmd}");
    }
    for cmd in [
        "python3 -i",
        "node -i",
        "bash -i",
        "php -a",
        "python3 -m pdb x.py",
        "perl -d x.pl",
    ] {
        assert!(
            matches!(without(cmd), Gate::Ask { .. }),
            "{cmd}: {:?}",
            without(cmd)
        );
    }
    // A script or a command with a terminal runs.
    for cmd in [
        "python3 app.py",
        "node server.js",
        "cargo test",
        "bash run.sh -c x",
    ] {
        let gate = with_tty(cmd);
        assert!(!matches!(gate, Gate::Refuse { .. }), "{cmd}: {gate:?}");
    }
    assert_eq!(with_tty("python3 app.py"), Gate::Run);
    assert_eq!(with_tty("cargo test"), Gate::Run);
    // Typed into a shell, starting an interpreter asks as well.
    let typed = rules.gate("write_stdin", &json!({ "chars": "python3\n" }), &[]);
    assert!(matches!(typed, Gate::Ask { .. }), "{typed:?}");
}

#[test]
fn redirections_and_expansions_are_not_program_names() {
    assert_eq!(argvs("ls > rm"), [vec!["ls"]]);
    assert_eq!(
        argvs("cargo test 2>&1 | tail -5"),
        [vec!["cargo", "test"], vec!["tail", "-5"]]
    );
    assert_eq!(argvs("cat < in >> out 2>/dev/null"), [vec!["cat"]]);
    assert_eq!(argvs("echo a>b"), [vec!["echo", "a"]]);
    assert_eq!(argvs("sort <<< 'b a'"), [vec!["sort"]]);
    assert!(has(
        "echo $(git rev-parse HEAD)",
        &["git", "rev-parse", "HEAD"]
    ));
    assert!(has("cat <<EOF\n`id -u`\nEOF", &["id", "-u"]));
    assert!(has("cat <<'EOF'\n$(rm v)\nEOF", &["cat"]));
    assert!(!has("cat <<'EOF'\n$(rm v)\nEOF", &["rm", "v"]));
    assert!(concerns("echo $HOME \"$PATH\" $(pwd)").is_empty());
    assert!(concerns("X=$(date) make").is_empty());
    assert!(has("echo $(( $(rm v) + 1 ))", &["rm", "v"]));
    assert!(has("echo $((x[$(rm v)]))", &["rm", "v"]));
    assert!(concerns("for f in $(ls); do wc -l $f; done").is_empty());
    assert!(concerns("python3 - <<'EOF'\nprint(1)\nEOF").is_empty());
    assert_eq!(
        concerns("python3 - <<'EOF'\nimport os\nEOF"),
        [Concern::InlineCode]
    );
    assert!(concerns("[ -f x ] && echo y").is_empty());
    assert!(concerns("mkdir -p a/{b,c}").is_empty());
}

#[test]
fn python_and_node_code_asks_only_when_it_can_reach_the_system() {
    use super::interpreters::{node_reaches_system, python_reaches_system};
    for code in [
        "print(1)",
        "import json, sys; print(json.load(sys.stdin)['a'])",
        "print('a b'.replace('a', 'c'))",
        "import math; print(math.pi)",
    ] {
        assert!(!python_reaches_system(code), "{code}");
    }
    for code in [
        "import os",
        "__import__('o'+'s').system('rm v')",
        "import sys; sys.modules['os'].remove('v')",
        "getattr(sys, 'mod' + 'ules')",
        "from pathlib import Path; Path('v').unlink()",
        "import subprocess",
        "exec('x')",
        "ｅｘｅｃ('x')",
        "import tempfile; tempfile._os.remove('v')",
        "[c for c in ().__class__.__base__.__subclasses__()]",
        "breakpoint()",
    ] {
        assert!(python_reaches_system(code), "{code}");
    }
    assert!(!node_reaches_system(
        "console.log(require('./package.json').version)"
    ));
    for code in [
        "require('fs').rmSync('v')",
        "require('child_process').execSync('rm v')",
        "process.binding('spawn_sync')",
        "[].constructor.constructor('return this')()",
    ] {
        assert!(node_reaches_system(code), "{code}");
    }
}

#[test]
fn env_split_string_is_split_as_env_splits_it() {
    assert!(has("env -S 'rm\\_v'", &["rm", "v"]));
    assert!(has("env -S 'rm \"a b\"'", &["rm", "a b"]));
    assert!(has("env -S'rm v'", &["rm", "v"]));
    assert!(has("env -S 'rm\\c ignored'", &["rm"]));
    assert!(read("env -S 'rm \\q'", Source::Line).is_err());
}

#[test]
fn git_rm_counts_as_rm_unless_it_keeps_the_files() {
    assert!(has("git rm -f a.txt", &["rm", "a.txt"]));
    assert!(has("git rm -r src", &["rm", "src"]));
    assert!(!has("git rm --cached a.txt", &["rm", "a.txt"]));
    assert!(!has("git rm -n a.txt", &["rm", "a.txt"]));
}

#[test]
fn sed_scripts_run_commands_only_with_e() {
    use super::programs::sed_runs_commands;
    for script in [
        "p",
        "1,20p",
        "/a/,/b/d",
        "s/a/b/g",
        "s/a/b/w out",
        "$!N;s/\\n/ /",
        "y/abc/xyz/",
        "s|e|f|",
    ] {
        assert!(!sed_runs_commands(script), "{script}");
    }
    for script in ["e", "1e id", "s/a/b/e", "s/a/b/ge", "p;e", "/x/e"] {
        assert!(sed_runs_commands(script), "{script}");
    }
}

#[test]
fn reading_hostile_text_never_panics_and_stays_bounded() {
    let deep = format!("{}x{}", "$(".repeat(5_000), ")".repeat(5_000));
    assert!(read(&deep, Source::Line).is_err());
    let backticks = "echo `echo \\`echo \\\\\\`rm v\\\\\\`\\``";
    let _ = read(backticks, Source::Line);
    for text in [
        "$", "${", "$((", "<<", "<<<", "a <<EOF", "\\", "'", "\"$(\"", "((((", "))", "&>", "|&",
        "${x@P}",
    ] {
        let _ = read(text, Source::Line);
        let _ = read(text, Source::Typed);
    }
}
