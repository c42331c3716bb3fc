//! Every `vramroom ...` command in the README, against this very clap definition: those of
//! its code blocks and those of its prose (inline code), so a renamed flag or a dropped value
//! fails here, not in a reader's shell.
//!
//! Design note: the README holds three kinds of `vramroom` text.
//! - Commands, which parse: each is run here when it needs no GPU and finishes in seconds
//!   (in-process, through `dispatch`, with the reader's own files such as `base.pickle`
//!   stood in for by files of the checkout, [`STAND_INS`]); every other one is named in
//!   [`NOT_RUN`] with the reason. None is passed over silently: a command that is neither
//!   fails the test, and so does a [`NOT_RUN`] entry the README no longer has.
//! - References in the prose (`vramroom replay`, `vramroom http --predict`): a command and
//!   some of its flags, the operands left to the reader. They must parse but for those.
//! - Synopses (`vramroom diff BASE NEW [--top N]`, the Commands table): placeholders and
//!   brackets, which no parser takes; each flag they name must be one the subcommand has.

use std::path::{Path, PathBuf};

use clap::error::ErrorKind;
use clap::CommandFactory;

use super::*;

/// The README's commands that are not run here, each with the reason.
const NOT_RUN: &[(&str, &str)] = &[
    (
        "vramroom loadtest",
        "the default load test: about 30 s on two cores (tests/loadtest.rs runs short ones)",
    ),
    ("vramroom loadtest --device cuda", "needs a GPU"),
    (
        "vramroom loadtest --model fixtures/hf/gpt2-tiny --mode generate --prompt uniform:8..64 --new 16 -c 4 -z 10s",
        "a 10 s load test (tests/loadtest.rs runs short ones)",
    ),
    (
        "vramroom serve",
        "a server, up until Ctrl-C (tests/serve_cli.rs starts and stops one)",
    ),
    (
        "vramroom serve --model fixtures/hf/llama-tiny --new 16 --capacity 256MiB",
        "a server, up until Ctrl-C (tests/serve_cli.rs starts and stops one)",
    ),
    (
        "vramroom trace --gpu h100 --capacity 24GiB --what-if expandable_segments:True -- python train.py --batch 16",
        "runs the reader's train.py under PyTorch (python/tests/test_trace*.py run the tracer)",
    ),
    ("vramroom bench models", "needs a GPU"),
    (
        "vramroom bench http",
        "a benchmark: three rounds of 3 s each, and wrk or oha beside it",
    ),
];

/// The reader's own files that the README's examples name, and the checkout's files the
/// test runs them on (BASE and NEW the same file: the examples' thresholds then hold).
const STAND_INS: &[(&str, &str)] = &[
    (
        "baseline.pickle",
        "fixtures/snapshots/graph_release__default.pickle",
    ),
    (
        "base.pickle",
        "fixtures/snapshots/graph_release__default.pickle",
    ),
    (
        "new.pickle",
        "fixtures/snapshots/graph_release__default.pickle",
    ),
    (
        "base/results.json",
        "scripts/corpus-results/2026-12-03-h200-c/bert/gentle/results.json",
    ),
    (
        "new/results.json",
        "scripts/corpus-results/2026-12-03-h200-c/bert/gentle/results.json",
    ),
];

/// `vramroom ARGS` from the words of a shell line: `vramroom ...` as it is, and
/// `cargo run ... -p vramroom -- ARGS` as `vramroom ARGS`; `None` for anything else.
fn vramroom_args(words: Vec<String>) -> Option<Vec<String>> {
    if words.first().is_some_and(|w| w == "vramroom") {
        return Some(words);
    }
    if words.first().is_some_and(|w| w == "cargo")
        && words.windows(2).any(|w| w[0] == "-p" && w[1] == "vramroom")
    {
        let i = words.iter().position(|w| w == "--")?;
        return Some(
            std::iter::once("vramroom".to_string())
                .chain(words[i + 1..].iter().cloned())
                .collect(),
        );
    }
    None
}

/// The argument vectors of the `vramroom` commands in `md`'s fenced code blocks: lines
/// that start with `vramroom ` (or `$ vramroom `), and `cargo run ... -p vramroom -- ARGS`;
/// continuation lines joined, a shell comment and anything after a pipe, `&&`, `;` or a
/// redirection dropped.
fn block_commands(md: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut in_block = false;
    let mut pending = String::new();
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            pending.clear();
            continue;
        }
        if !in_block {
            continue;
        }
        let t = line.trim();
        if let Some(head) = t.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        let full = std::mem::take(&mut pending) + t;
        let full = full.strip_prefix("$ ").unwrap_or(&full);
        out.extend(vramroom_args(shell_words(full)));
    }
    out
}

/// The inline code spans of `md`'s prose (outside fenced blocks), as a reader sees them: a
/// span may run over a line break (read as a space), and a table cell's `\|` is `|`.
fn inline_spans(md: &str) -> Vec<String> {
    let mut prose = String::new();
    let mut in_block = false;
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            // A block ends a paragraph, and so any span.
            prose.push_str("\n\n");
            continue;
        }
        if !in_block {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    let chars: Vec<char> = prose.chars().collect();
    let mut spans = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            i += 1;
            continue;
        }
        // A run of n backticks opens a span that the next run of exactly n closes
        // (CommonMark); a span does not cross a blank line.
        let n = chars[i..].iter().take_while(|&&c| c == '`').count();
        let start = i + n;
        let mut j = start;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '\n' && chars.get(j + 1) == Some(&'\n') {
                break;
            }
            if chars[j] == '`' {
                let m = chars[j..].iter().take_while(|&&c| c == '`').count();
                if m == n {
                    close = Some(j);
                    break;
                }
                j += m;
            } else {
                j += 1;
            }
        }
        match close {
            Some(end) => {
                let s: String = chars[start..end].iter().collect();
                spans.push(s.replace('\n', " ").replace("\\|", "|").trim().to_string());
                i = end + n;
            }
            None => i = start,
        }
    }
    spans
}

/// Whether an inline span is a synopsis: placeholders (`SNAPSHOT`, `URL`, `N`), brackets or
/// ellipses, which only a reader fills in.
fn is_synopsis(span: &str) -> bool {
    span.split_whitespace().skip(1).any(|w| {
        let bare = w.trim_matches(|c| matches!(c, '[' | ']' | '.' | '…'));
        w.contains('[')
            || w.contains("...")
            || w.contains('…')
            || (!bare.is_empty()
                && bare.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                && !bare.starts_with('-'))
    })
}

/// The `vramroom` commands of `md`'s prose, as (the span, its words); a span that only
/// names the program or a module (`vramroom`, `vramroom.probe`) is none.
fn inline_commands(md: &str) -> Vec<(String, Vec<String>)> {
    inline_spans(md)
        .into_iter()
        .filter_map(|span| {
            // A synopsis is words, not shell: its `|` is an alternative, not a pipe.
            let words = if is_synopsis(&span) {
                span.split_whitespace().map(String::from).collect()
            } else {
                shell_words(&span)
            };
            let args = vramroom_args(words)?;
            (args.len() >= 2).then_some((span, args))
        })
        .collect()
}

/// Every flag a synopsis names is one its subcommand has (`-c/--concurrency` is two names of
/// one flag); the subcommand path is whole.
fn check_synopsis(words: &[String]) -> Result<(), String> {
    let mut cmd = Cli::command();
    cmd.build();
    let mut cmd = &cmd;
    let mut rest = &words[1..];
    while let Some(sub) = rest.first().and_then(|w| cmd.find_subcommand(w)) {
        cmd = sub;
        rest = &rest[1..];
    }
    if cmd.get_name() == "vramroom" || cmd.has_subcommands() {
        return Err(format!("no such command: {}", words.join(" ")));
    }
    let has = |flag: &str| {
        cmd.get_arguments().any(|a| {
            if let Some(long) = flag.strip_prefix("--") {
                a.get_long_and_visible_aliases()
                    .is_some_and(|l| l.contains(&long))
                    || a.get_all_aliases().is_some_and(|l| l.contains(&long))
            } else {
                let mut c = flag[1..].chars();
                match (c.next(), c.next()) {
                    (Some(s), None) => a
                        .get_short_and_visible_aliases()
                        .is_some_and(|l| l.contains(&s)),
                    _ => false,
                }
            }
        })
    };
    for w in rest {
        let w = w.trim_matches(|c| matches!(c, '[' | ']' | '.' | '…' | ','));
        // A flag is a dash or two and a letter; `-10%` is a value.
        let is_flag = w
            .trim_start_matches('-')
            .starts_with(|c: char| c.is_ascii_alphabetic());
        if !w.starts_with('-') || !is_flag {
            continue;
        }
        for flag in w.split('/') {
            let flag = flag.split('=').next().unwrap_or(flag);
            if !flag.starts_with('-') || !has(flag) {
                return Err(format!(
                    "`{}` has no flag {flag}",
                    words[..words.len() - rest.len()].join(" ")
                ));
            }
        }
    }
    Ok(())
}

/// Words as sh splits them, for the README's simple commands: quotes, and the end of the
/// command at an unquoted `#` (a comment), `|`, `&`, `;` or `>`.
fn shell_words(s: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut has = false;
    let mut quote: Option<char> = None;
    for c in s.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => cur.push(c),
            None => match c {
                '\'' | '"' => {
                    quote = Some(c);
                    has = true;
                }
                '#' if !has => break,
                '|' | '&' | ';' | '>' => break,
                c if c.is_whitespace() => {
                    if has {
                        words.push(std::mem::take(&mut cur));
                        has = false;
                    }
                }
                c => {
                    cur.push(c);
                    has = true;
                }
            },
        }
    }
    if has {
        words.push(cur);
    }
    words
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn readme() -> String {
    std::fs::read_to_string(root().join("README.md")).expect("README.md")
}

/// The command with the reader's files replaced by their stand-ins and the README's paths
/// (relative to the checkout) made absolute: the test's working directory is the crate's,
/// and changing it would race the other tests. `None` when a path it names is not here.
fn runnable(args: &[String], root: &Path) -> Option<Vec<String>> {
    let quick = matches!(
        args.get(1).map(String::as_str),
        Some("predict" | "replay" | "summary" | "diff")
    );
    if !quick {
        return None;
    }
    let mut out = vec![args[0].clone(), args[1].clone()];
    for a in &args[2..] {
        let a = STAND_INS
            .iter()
            .find(|(name, _)| name == a)
            .map_or(a.as_str(), |(_, file)| file);
        let path_like = a.contains('/') || a.ends_with(".pickle") || a.ends_with(".json");
        if path_like && !a.starts_with('-') {
            let p = root.join(a);
            if !p.exists() {
                return None;
            }
            out.push(p.display().to_string());
        } else {
            out.push(a.to_string());
        }
    }
    Some(out)
}

#[test]
fn shell_words_split_as_sh_does() {
    assert_eq!(
        shell_words("vramroom diff a b --threshold 'p99<+10%'    # exit 99"),
        ["vramroom", "diff", "a", "b", "--threshold", "p99<+10%"]
    );
    assert_eq!(
        shell_words("vramroom replay x | head"),
        ["vramroom", "replay", "x"]
    );
    let md = "text\n```sh\nvramroom replay a \\\n  --json\ncargo run --release -p vramroom -- loadtest\necho no\n```\nvramroom not-in-a-block\n";
    assert_eq!(
        block_commands(md),
        [
            vec!["vramroom", "replay", "a", "--json"],
            vec!["vramroom", "loadtest"]
        ]
    );
}

#[test]
fn inline_commands_are_read_as_a_reader_sees_them() {
    let md = "Run `vramroom replay\nsnap.pickle` or ``vramroom diff a b``; `vramroom.probe` and \
              `vramroom` are names.\n```sh\n`vramroom in-a-block`\n```\n| `vramroom bench http [--peer wrk\\|oha]` |\n\
              an open ` tick\n\nthen `vramroom predict`\n";
    let got: Vec<String> = inline_commands(md).into_iter().map(|(s, _)| s).collect();
    assert_eq!(
        got,
        [
            "vramroom replay snap.pickle",
            "vramroom diff a b",
            "vramroom bench http [--peer wrk|oha]",
            "vramroom predict",
        ]
    );
    assert!(is_synopsis("vramroom diff BASE NEW"));
    assert!(is_synopsis("vramroom predict --model fixtures/hf/..."));
    assert!(!is_synopsis("vramroom loadtest --device cuda"));
    let w = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
    assert_eq!(
        check_synopsis(&w("vramroom bench http [-c/--concurrency 64]")),
        Ok(())
    );
    assert_eq!(check_synopsis(&w("vramroom predict [--prompt N]")), Ok(()));
    assert!(check_synopsis(&w("vramroom diff BASE NEW [--tops N]"))
        .unwrap_err()
        .contains("--tops"));
    assert!(check_synopsis(&w("vramroom bench [--json]")).is_err());
    assert!(check_synopsis(&w("vramroom nope [--json]")).is_err());
}

/// The Commands table's rows, as (the row's command words, the flags-and-values spans of its
/// description): `| `vramroom diff BASE NEW ...` | ... `--top` ... |`.
fn table_rows(md: &str) -> Vec<(Vec<String>, Vec<String>)> {
    md.lines()
        .filter(|l| l.starts_with("| `vramroom "))
        .filter_map(|l| {
            let (head, desc) = l[2..].split_once(" | ")?;
            let words: Vec<String> = head
                .trim_matches('`')
                .split_whitespace()
                .take_while(|w| w.chars().all(|c| c.is_ascii_lowercase()))
                .map(String::from)
                .collect();
            let spans = inline_spans(desc)
                .into_iter()
                .filter(|s| s.starts_with('-'))
                .collect();
            Some((words, spans))
        })
        .collect()
}

#[test]
fn the_commands_table_names_only_flags_its_commands_have() {
    let rows = table_rows(&readme());
    assert!(rows.len() >= 12, "only {} rows", rows.len());
    let mut bad = Vec::new();
    for (cmd, spans) in &rows {
        for span in spans {
            // Another command's flag, said as such: "serve's `--max-batch N`".
            if cmd[1] == "predict" && span.starts_with("--max-batch") {
                continue;
            }
            let mut words = cmd.clone();
            words.extend(span.split_whitespace().map(String::from));
            if let Err(e) = check_synopsis(&words) {
                bad.push(format!("`{}` row, `{span}`: {e}", cmd.join(" ")));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn every_readme_command_parses() {
    let md = readme();
    let block = block_commands(&md);
    assert!(block.len() >= 8, "only {} commands found", block.len());
    let mut bad: Vec<String> = block
        .iter()
        .filter_map(|c| {
            Cli::try_parse_from(c)
                .err()
                .map(|e| format!("{}\n  {}", c.join(" "), e.kind()))
        })
        .collect();
    let inline = inline_commands(&md);
    assert!(inline.len() >= 20, "only {} inline commands", inline.len());
    let (mut synopses, mut references) = (0, 0);
    for (span, args) in &inline {
        if is_synopsis(span) {
            synopses += 1;
            if let Err(e) = check_synopsis(args) {
                bad.push(format!("`{span}`\n  {e}"));
            }
            continue;
        }
        match Cli::try_parse_from(args) {
            Ok(_) => {}
            // A reference: the command and its flags, the operands left to the reader.
            Err(e) if e.kind() == ErrorKind::MissingRequiredArgument => references += 1,
            Err(e) => bad.push(format!("`{span}`\n  {}", e.kind())),
        }
    }
    assert!(
        bad.is_empty(),
        "README commands clap rejects:\n{}",
        bad.join("\n")
    );
    assert!(synopses >= 10 && references >= 3, "{synopses} {references}");
}

#[test]
fn the_readme_commands_that_need_no_gpu_run() {
    let root = root();
    let md = readme();
    let mut commands: Vec<Vec<String>> = block_commands(&md);
    commands.extend(
        inline_commands(&md)
            .into_iter()
            .filter(|(span, args)| !is_synopsis(span) && Cli::try_parse_from(args).is_ok())
            .map(|(_, args)| args),
    );
    commands.sort();
    commands.dedup();
    let (mut ran, mut unaccounted) = (0, Vec::new());
    for c in &commands {
        let line = c.join(" ");
        if let Some((_, why)) = NOT_RUN.iter().find(|(cmd, _)| *cmd == line) {
            eprintln!("not run: {line}: {why}");
            continue;
        }
        let Some(args) = runnable(c, &root) else {
            // The recorded traces live beside the checkout (../shared), not in it.
            if c.iter().any(|a| a.starts_with("../shared/")) && !root.join("../shared").exists() {
                eprintln!("not run: {line}: ../shared is not beside the checkout");
            } else {
                unaccounted.push(line);
            }
            continue;
        };
        let cli = Cli::try_parse_from(&args).expect("parses");
        match dispatch(cli.command) {
            Ok(code) => assert_eq!(code, ExitCode::SUCCESS, "{line}"),
            Err(UserError(e)) => panic!("{line}: {e:#}"),
        }
        ran += 1;
    }
    assert!(
        unaccounted.is_empty(),
        "README commands neither run here nor listed in NOT_RUN with a reason:\n{}",
        unaccounted.join("\n")
    );
    // The list holds only what the README still says.
    let stale: Vec<&str> = NOT_RUN
        .iter()
        .map(|(cmd, _)| *cmd)
        .filter(|cmd| !commands.iter().any(|c| c.join(" ") == *cmd))
        .collect();
    assert!(
        stale.is_empty(),
        "NOT_RUN lists commands the README no longer has: {stale:?}"
    );
    // The predict and diff examples at least, whatever else is at hand.
    assert!(ran >= 8, "only {ran} README commands ran");
}
