//! Every command in the README's shell blocks still works, so the README cannot rot.
//!
//! The ```` ```sh ```` and ```` ```bash ```` blocks are read line by line (a trailing `\` continues
//! a line). A `gpuscale …` or `cargo run --release -- …` command is run against the binary this
//! test builds, from the repository root, and must exit 0; `--out <dir>` is pointed at a temporary
//! folder. Commands that cannot run here say so with a trailing comment starting `# needs`
//! (`# needs a cluster`) and are the only ones skipped. `cargo bench --bench <name>` and
//! `cargo test --test <name>` must name a bench or test that exists, and every repository path a
//! command mentions (`examples/…`, `charts/…`, `scripts/…`, …) must exist, skipped or not.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One README command, with what the test makes of it.
#[derive(Debug, PartialEq)]
struct Line {
    /// 1-based README line where the command starts.
    at: usize,
    /// The command without its trailing comment.
    command: String,
    /// The trailing comment, if any.
    comment: Option<String>,
}

/// The commands of the shell blocks of `markdown`.
fn shell_commands(markdown: &str) -> Vec<Line> {
    let mut out = Vec::new();
    let (mut fenced, mut shell) = (false, false);
    let mut pending: Option<(usize, String)> = None;
    for (i, raw) in markdown.lines().enumerate() {
        let trimmed = raw.trim();
        if let Some(info) = trimmed.strip_prefix("```") {
            shell = !fenced && matches!(info.trim(), "sh" | "bash" | "shell");
            fenced = !fenced;
            continue;
        }
        if !shell {
            continue;
        }
        let (start, mut text) = pending.take().unwrap_or((i + 1, String::new()));
        if let Some(head) = trimmed.strip_suffix('\\') {
            text.push_str(head.trim_end());
            text.push(' ');
            pending = Some((start, text));
            continue;
        }
        text.push_str(trimmed);
        let text = text.trim().to_string();
        if text.is_empty() || text.starts_with('#') {
            continue;
        }
        let (command, comment) = split_comment(&text);
        out.push(Line { at: start, command, comment });
    }
    assert!(pending.is_none() && !fenced, "README: a code block or a continued line is not closed");
    out
}

/// Splits `cmd   # comment` at the first ` #` outside quotes.
fn split_comment(text: &str) -> (String, Option<String>) {
    let mut quote = None;
    let bytes: Vec<char> = text.chars().collect();
    for (i, &c) in bytes.iter().enumerate() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '#') if i > 0 && bytes[i - 1].is_whitespace() => {
                let cmd: String = bytes[..i].iter().collect();
                let comment: String = bytes[i + 1..].iter().collect();
                return (cmd.trim().to_string(), Some(comment.trim().to_string()));
            }
            _ => {}
        }
    }
    (text.trim().to_string(), None)
}

/// Splits a command into words, with single and double quotes; shell syntax the test does not run
/// (pipes, redirections, substitutions, several commands) is an error.
fn words(command: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote = None;
    for c in command.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, '|' | '>' | '<' | ';' | '&' | '$' | '`' | '*') => {
                return Err(format!("shell syntax {c:?} in {command:?}: README commands must be plain"));
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if quote.is_some() {
        return Err(format!("unclosed quote in {command:?}"));
    }
    if in_word {
        out.push(word);
    }
    Ok(out)
}

/// What the test does with a command.
#[derive(Debug, PartialEq)]
enum Action {
    /// Run the binary with these arguments.
    Gpuscale(Vec<String>),
    /// `cargo bench --bench <name>` / `cargo test --test <name>`: the target must exist.
    CargoTarget(PathBuf),
    /// Anything else (helm, kubectl, scripts): only its paths are checked.
    Other,
}

fn action(words: &[String]) -> Action {
    let w: Vec<&str> = words.iter().map(String::as_str).collect();
    match w.as_slice() {
        ["gpuscale", rest @ ..] => Action::Gpuscale(rest.iter().map(|s| s.to_string()).collect()),
        ["cargo", "run", ..] => {
            let dashes = w.iter().position(|x| *x == "--").expect("`cargo run … -- <args>`");
            Action::Gpuscale(w[dashes + 1..].iter().map(|s| s.to_string()).collect())
        }
        ["cargo", sub @ ("bench" | "test"), ..] => {
            let (flag, dir) = if *sub == "bench" { ("--bench", "benches") } else { ("--test", "tests") };
            match w.iter().position(|x| *x == flag) {
                Some(i) => Action::CargoTarget(Path::new(dir).join(format!("{}.rs", w[i + 1]))),
                None => Action::Other,
            }
        }
        _ => Action::Other,
    }
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Repository paths a command names: words (or `--flag=value` values) under a top-level folder
/// of the repository.
fn repo_paths(words: &[String]) -> Vec<String> {
    const ROOTS: [&str; 7] = ["examples/", "charts/", "scripts/", "tests/", "benches/", "docs/", "src/"];
    words
        .iter()
        .map(|w| w.rsplit('=').next().unwrap_or(w))
        .filter(|w| ROOTS.iter().any(|r| w.starts_with(r)))
        .map(str::to_string)
        .collect()
}

/// Runs the binary with `args` from the repository root; `Err` with its output unless it exits 0
/// within `limit`.
fn run(args: &[String], out_dir: &Path, limit: Duration) -> Result<(), String> {
    let mut args = args.to_vec();
    for i in 0..args.len() {
        if args[i] == "--out" && i + 1 < args.len() {
            args[i + 1] = out_dir.to_string_lossy().into_owned();
        }
    }
    let stdout = tempfile::tempfile().expect("temp file");
    let stderr = tempfile::tempfile().expect("temp file");
    // As on a fresh machine: no kubeconfig, so `plan` plans the embedded example.
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuscale"))
        .args(&args)
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .current_dir(repo())
        .stdin(Stdio::null())
        .stdout(stdout.try_clone().expect("clone"))
        .stderr(stderr.try_clone().expect("clone"))
        .spawn()
        .map_err(|e| format!("cannot start gpuscale: {e}"))?;
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for gpuscale") {
            break Some(status);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let read = |mut f: std::fs::File| {
        use std::io::{Read, Seek};
        let mut s = String::new();
        f.seek(std::io::SeekFrom::Start(0)).expect("seek");
        f.read_to_string(&mut s).expect("read");
        s
    };
    let (stdout, stderr) = (read(stdout), read(stderr));
    match status {
        Some(s) if s.success() => Ok(()),
        Some(s) => Err(format!("exit {s}\n--- stderr\n{stderr}\n--- stdout\n{stdout}")),
        None => Err(format!("still running after {limit:?}\n--- stderr\n{stderr}")),
    }
}

#[test]
fn every_offline_command_in_the_readme_runs_and_exits_0() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let commands = shell_commands(&readme);
    let mut ran = 0;
    let mut failures = Vec::new();
    for line in &commands {
        let where_ = format!("README.md:{}: {}", line.at, line.command);
        // Other tools' commands may use the shell (`kubectl … > snapshot.json`); only gpuscale's
        // are run, and they must be plain.
        let loose: Vec<String> = line.command.split_whitespace().map(str::to_string).collect();
        for p in repo_paths(&loose) {
            if !repo().join(&p).exists() {
                failures.push(format!("{where_}: {p} does not exist"));
            }
        }
        let skipped = line.comment.as_deref().is_some_and(|c| c.starts_with("needs "));
        match action(&loose) {
            Action::Gpuscale(_) if skipped => {
                eprintln!("skipped ({}): {where_}", line.comment.as_deref().unwrap())
            }
            Action::Gpuscale(_) => {
                let args = match words(&line.command).map(|w| action(&w)) {
                    Ok(Action::Gpuscale(args)) => args,
                    Ok(other) => unreachable!("{other:?}"),
                    Err(e) => {
                        failures.push(format!("{where_}: {e}"));
                        continue;
                    }
                };
                let out = tempfile::tempdir().expect("temp dir");
                let started = Instant::now();
                match run(&args, out.path(), Duration::from_secs(1200)) {
                    Ok(()) => eprintln!("ok in {:.1?}: {where_}", started.elapsed()),
                    Err(e) => failures.push(format!("{where_}: {e}")),
                }
                ran += 1;
            }
            Action::CargoTarget(path) => {
                // Cargo's target layouts: `tests/<name>.rs` or `tests/<name>/main.rs`.
                let dir_form = path.with_extension("").join("main.rs");
                if !repo().join(&path).is_file() && !repo().join(dir_form).is_file() {
                    failures.push(format!("{where_}: {} does not exist", path.display()));
                }
            }
            Action::Other => {}
        }
    }
    assert!(failures.is_empty(), "README commands that fail:\n{}", failures.join("\n\n"));
    // The README's quick start, results and install sections all have runnable commands; fewer
    // would mean the parser lost them.
    assert!(ran >= 5, "only {ran} README commands ran: {commands:#?}");
}

#[test]
fn the_reader_finds_commands_markers_and_continuations() {
    let md = "text\n```sh\ngpuscale plan --snapshot a.json \\\n    --providers b.yaml   # needs a cluster\n\
              # a comment line\ncargo run --release -- plan -o json\n```\n```\ngpuscale not-a-shell-block\n```\n\
              ```bash\ncargo bench --bench plan_scale\nhelm install x charts/gpuscale\n```\n";
    let lines = shell_commands(md);
    assert_eq!(
        lines,
        [
            Line {
                at: 3,
                command: "gpuscale plan --snapshot a.json --providers b.yaml".into(),
                comment: Some("needs a cluster".into())
            },
            Line { at: 6, command: "cargo run --release -- plan -o json".into(), comment: None },
            Line { at: 12, command: "cargo bench --bench plan_scale".into(), comment: None },
            Line { at: 13, command: "helm install x charts/gpuscale".into(), comment: None },
        ]
    );
    let w = |s: &str| words(s).unwrap();
    assert_eq!(
        action(&w(&lines[1].command)),
        Action::Gpuscale(vec!["plan".into(), "-o".into(), "json".into()])
    );
    assert_eq!(action(&w(&lines[2].command)), Action::CargoTarget("benches/plan_scale.rs".into()));
    assert_eq!(repo_paths(&w(&lines[3].command)), ["charts/gpuscale"]);
    assert_eq!(w("a 'b c' \"d\""), ["a", "b c", "d"]);
    assert!(words("gpuscale plan | head").is_err());
    assert!(words("gpuscale plan > x").is_err());
}

#[test]
fn a_wrong_command_fails() {
    let out = tempfile::tempdir().unwrap();
    let args = |s: &str| words(s).unwrap();
    assert!(run(&args("plan"), out.path(), Duration::from_secs(120)).is_ok());
    let err = run(&args("plan --no-such-flag"), out.path(), Duration::from_secs(120)).unwrap_err();
    assert!(err.contains("--no-such-flag"), "{err}");
    let err = run(
        &args("plan --snapshot examples/nope.json --providers examples/providers/simulated.yaml"),
        out.path(),
        Duration::from_secs(120),
    )
    .unwrap_err();
    assert!(err.contains("nope.json"), "{err}");
}
